#!/usr/bin/env bash
# A real Slurm cluster on one machine, for tests and scaling studies: munge, slurmctld
# and one slurmd per "node", each node a network namespace with its own address on a
# bridge, and shared storage that every node mounts over the network, all from Debian's
# packages and without systemd.
#
#   bash slurm/cluster.sh up [--nodes N] [--cpus C] [--bandwidth RATE] [--delay TIME]
#                            [--storage-bandwidth RATE] [--storage-delay TIME]
#   bash slurm/cluster.sh paths               # STORAGE=... SHARED=...
#   bash slurm/cluster.sh drop-caches
#   bash slurm/cluster.sh storage-bytes      # bytes read from the shared storage so far
#   bash slurm/cluster.sh shape NODE RATE     # slow one node's link: a straggler
#   eval "$(bash slurm/cluster.sh env)"      # SLURM_CONF for srun, sbatch, sinfo
#   bash slurm/cluster.sh status
#   bash slurm/cluster.sh down
#
# `up` is idempotent (a cluster of the same size that is up is left as it is; another size
# is refused until `down`); `down` stops exactly the daemons `up` started (pid files,
# never by name) and removes the namespaces, the bridge and the cluster's directory.
# --bandwidth (tc rate, e.g. 1gbit) and --delay (e.g. 200us) shape every node's link, so
# that traffic between nodes is slower than inside one.
#
# Shared storage, as a parallel filesystem is on a real cluster: a "storage" namespace
# (10.77.0.2) serves the directory STORAGE over SSH, and every node mounts it with sshfs
# (FUSE: this kernel has no NFS) at SHARED, in its own mount namespace and over its own
# link (--storage-bandwidth, --storage-delay shape the storage's link), so a random small
# read costs a round trip while sequential reads stream. Write datasets under STORAGE
# (locally); jobs read them under SHARED. `drop-caches` empties the page cache between
# runs.
#
# Nodes are mfnode1..N at 10.77.0.11.. (slurmctld on the bridge, 10.77.0.1). Tasks get
# MESHFEED_HOST=<node> (the namespaces share one host name) and Open MPI's TCP interfaces
# limited to the bridge's subnet, through the cluster's TaskProlog.
# Needs root. The directory is $MESHFEED_CLUSTER_DIR (default /tmp/meshfeed-cluster);
# MESHFEED_CLUSTER_ID (0-9, default 0) keeps clusters on one machine apart (subnet
# 10.77.<id>, bridge, namespaces and ports); the addresses above are cluster 0's. The
# nodes' network: launch/netns.sh, as every emulation's.
set -euo pipefail
# shellcheck source=launch/netns.sh
source "$(dirname "${BASH_SOURCE[0]}")/../launch/netns.sh"

base=${MESHFEED_CLUSTER_DIR:-/tmp/meshfeed-cluster}
id=${MESHFEED_CLUSTER_ID:-0}
[[ $id =~ ^[0-9]$ ]] || { echo "cluster: MESHFEED_CLUSTER_ID must be 0-9" >&2; exit 1; }
subnet=10.77.$id
bridge=mfbr$id
pre=mf$id # namespaces $pre-node<i>, $pre-storage; veths ${pre}v<i>, ${pre}vs

die() { echo "cluster: $*" >&2; exit 1; }
say() { echo "cluster: $*" >&2; }

# A pid file's process is alive (zombies count as dead: PID 1 may reap them late).
alive() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && [[ $(ps -o stat= -p "$pid" 2>/dev/null) != Z* ]]
}

# Starts a daemon in the background, in network namespace $ns ("" for this one), writing
# its pid to $pidfile.
start() { # PIDFILE NS LOG CMD...
    local pidfile=$1 ns=$2 log=$3
    shift 3
    if [[ -n $ns ]]; then
        setsid nsenter --net="/run/netns/$ns" "$@" >>"$log" 2>&1 </dev/null &
    else
        setsid "$@" >>"$log" 2>&1 </dev/null &
    fi
    echo $! >"$pidfile"
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v srun >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    command -v ip >/dev/null || missing+=(iproute2)
    command -v tc >/dev/null || missing+=(iproute2)
    command -v nsenter >/dev/null || missing+=(util-linux)
    command -v sshfs >/dev/null || missing+=(sshfs)
    command -v sshd >/dev/null || missing+=(openssh-server)
    command -v ssh-keygen >/dev/null || missing+=(openssh-client)
    if ((${#missing[@]})); then
        say "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

write_config() { # NODES CPUS
    local n=$1 cpus=$2 i
    mkdir -p "$base"/{etc,state,log,run,tmp} "$base/munge"
    chmod 0700 "$base/munge"
    for i in $(seq 1 "$n"); do mkdir -p "$base/spool/mfnode$i" "$base/tmp/mfnode$i"; done
    cat >"$base/etc/task_prolog.sh" <<EOF
#!/bin/sh
# Lines "export NAME=VALUE" set the task's environment.
echo "export MESHFEED_HOST=\$SLURMD_NODENAME"
echo "export OMPI_MCA_btl_tcp_if_include=$subnet.0/24"
echo "export OMPI_MCA_oob_tcp_if_include=$subnet.0/24"
# The nodes share one kernel and host name: Open MPI's shared-memory transport (vader)
# between two ranks of one node crashed here (SIGSEGV in mca_btl_vader_poll_handle_frag,
# 2 ranks per node). TCP everywhere, as between real nodes.
echo "export OMPI_MCA_pml=ob1"
echo "export OMPI_MCA_btl=self,tcp"
EOF
    chmod 0755 "$base/etc/task_prolog.sh"
    # Open MPI 4.1 under srun --mpi=pmix with Slurm's default fences (the data exchange as a
    # ring, the barrier at MPI_Init's end as a tree): now and then a rank still waited for
    # the exchange while its peers had left MPI_Init, and their first message killed it
    # (SIGSEGV in mca_btl_tcp: a null callback for the PML's match tag) — 5 in 130 4-node
    # steps here under load. Both fences as rings: 0 in 130 (docs/launching.md).
    echo "PMIxCollFence=ring" >"$base/etc/mpi.conf"
    {
        cat <<EOF
ClusterName=meshfeed
SlurmctldHost=$(hostname)($subnet.1)
SlurmctldPort=$((16817 + 10 * id))
SlurmdPort=$((16818 + 10 * id))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$base/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$base/state
SlurmdSpoolDir=$base/spool/%n
SlurmctldPidFile=$base/run/slurmctld.pid
SlurmdPidFile=$base/run/slurmd-%n.pid
SlurmctldLogFile=$base/log/slurmctld.log
SlurmdLogFile=$base/log/slurmd-%n.log
TmpFS=$base/tmp/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=$base/etc/task_prolog.sh
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MailProg=/bin/true
KillWait=10
EOF
        for i in $(seq 1 "$n"); do
            echo "NodeName=mfnode$i NodeAddr=$subnet.$((10 + i)) CPUs=$cpus State=UNKNOWN"
        done
        echo "PartitionName=main Nodes=mfnode[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
    } >"$base/etc/slurm.conf"
}

# One namespace on the bridge: NS VETH ADDRESS RATE DELAY.
attach() {
    local ns=$1 veth=$2 addr=$3 rate=$4 delay=$5
    netns_node "$bridge" "$ns" "$veth" "$addr/24" "$subnet.1"
    [[ -n $rate || -n $delay ]] && shape_link "$ns" "$veth" "$rate" "$delay"
    return 0
}

# Shapes a namespace's link both ways: its egress (eth0) and its ingress (the bridge
# port). A delay needs netem; a rate alone uses tbf (kernels without sch_netem have it).
shape_link() { # NS VETH RATE DELAY
    local ns=$1 veth=$2 rate=$3 delay=$4
    local shape=(tbf rate "$rate" burst 256kb latency 100ms)
    [[ -n $delay ]] && shape=(netem delay "$delay" ${rate:+rate "$rate"})
    if ! ip netns exec "$ns" tc qdisc replace dev eth0 root "${shape[@]}" 2>/dev/null ||
        ! tc qdisc replace dev "$veth" root "${shape[@]}" 2>/dev/null; then
        die "this kernel cannot shape links with '${shape[*]}' (no sch_${shape[0]}): ${delay:+--delay needs netem; }--bandwidth alone uses tbf"
    fi
}

# `shape NODE RATE`: slows one node's link (a straggler), e.g. `shape mfnode2 16mbit`.
shape_node() {
    local node=${1:-} rate=${2:-}
    [[ $node =~ ^mfnode([1-9][0-9]*)$ && -n $rate ]] || die "usage: cluster.sh shape mfnode<i> RATE"
    local i=${BASH_REMATCH[1]}
    [[ -f $base/nodes && $i -le $(cat "$base/nodes") ]] || die "no node $node is up"
    shape_link "$pre-node$i" "${pre}v$i" "$rate" ""
}

network_up() { # NODES BANDWIDTH DELAY STORAGE_BANDWIDTH STORAGE_DELAY
    local n=$1 rate=$2 delay=$3 i
    netns_bridge "$bridge" "$subnet.1/24"
    for i in $(seq 1 "$n"); do
        attach "$pre-node$i" "${pre}v$i" "$subnet.$((10 + i))" "$rate" "$delay"
    done
    attach "$pre-storage" "${pre}vs" "$subnet.2" "$4" "$5"
}

# The storage server: sshd in the storage namespace, serving $base/storage by SFTP to the
# cluster's key.
storage_up() {
    mkdir -p "$base/ssh" "$base/storage" "$base/shared" /run/sshd
    chmod 0700 "$base/ssh"
    [[ -f $base/ssh/host_key ]] || ssh-keygen -q -t ed25519 -N "" -f "$base/ssh/host_key"
    [[ -f $base/ssh/client_key ]] || ssh-keygen -q -t ed25519 -N "" -f "$base/ssh/client_key"
    cp "$base/ssh/client_key.pub" "$base/ssh/authorized_keys"
    {
        echo "ListenAddress $subnet.2"
        echo "Port $((2222 + id))"
        echo "HostKey $base/ssh/host_key"
        echo "AuthorizedKeysFile $base/ssh/authorized_keys"
        echo "PermitRootLogin prohibit-password"
        echo "PasswordAuthentication no"
        echo "KbdInteractiveAuthentication no"
        echo "UsePAM no"
        echo "StrictModes no"
        echo "PidFile $base/run/sshd.pid"
        echo "Subsystem sftp internal-sftp"
    } >"$base/ssh/sshd_config"
    alive "$base/run/sshd.pid.own" ||
        start "$base/run/sshd.pid.own" "$pre-storage" "$base/log/sshd.out" /usr/sbin/sshd -D -e -f "$base/ssh/sshd_config"
}

# The command that starts node I's slurmd: in the node's own mount namespace, sshfs mounts
# the storage at $base/shared (its pid in run/sshfs-mfnodeI.pid.own), then slurmd.
# sshfs numbers inodes per mount (they differ between nodes, unlike NFS, Lustre and
# GPFS): meshfeed compares a file's inode only on the host that scanned it.
node_command() {
    local i=$1 shared=$base/shared
    local ssh_opts="IdentityFile=$base/ssh/client_key,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null"
    echo "sshfs -f -o $ssh_opts,port=$((2222 + id)),reconnect,ServerAliveInterval=5 root@$subnet.2:$base/storage $shared &"
    echo "echo \$! > $base/run/sshfs-mfnode$i.pid.own"
    echo "for _ in \$(seq 100); do mountpoint -q $shared && break; sleep 0.1; done"
    echo "mountpoint -q $shared || { echo 'mfnode$i: sshfs did not mount the storage'; exit 1; }"
    echo "exec slurmd -D -N mfnode$i -f $base/etc/slurm.conf"
}

up() {
    local n=2 cpus=8 rate="" delay="" srate="" sdelay=""
    while (($#)); do
        case $1 in
            --nodes) n=$2; shift ;;
            --cpus) cpus=$2; shift ;;
            --bandwidth) rate=$2; shift ;;
            --delay) delay=$2; shift ;;
            --storage-bandwidth) srate=$2; shift ;;
            --storage-delay) sdelay=$2; shift ;;
            *) die "unknown option $1" ;;
        esac
        shift
    done
    [[ $n =~ ^[1-9][0-9]*$ && $n -le 64 ]] || die "--nodes must be 1 to 64"
    [[ $(id -u) == 0 ]] || die "needs root (network namespaces, daemons as root)"
    if [[ -f $base/nodes ]]; then
        [[ $(cat "$base/nodes") == "$n" ]] || die "a cluster of $(cat "$base/nodes") nodes is up: run 'down' first"
    fi
    install_packages
    mkdir -p "$base"
    echo "$n" >"$base/nodes"
    write_config "$n" "$cpus"
    network_up "$n" "$rate" "$delay" "$srate" "$sdelay"
    storage_up
    if ! alive "$base/run/munged.pid"; then
        [[ -f $base/munge/munge.key ]] || { dd if=/dev/urandom of="$base/munge/munge.key" bs=1024 count=1 status=none; chmod 0400 "$base/munge/munge.key"; }
        start "$base/run/munged.pid" "" "$base/log/munged.out" munged -F --force --key-file="$base/munge/munge.key" \
            --socket="$base/munge/munge.socket" --pid-file="$base/run/munged.pid.own" \
            --log-file="$base/log/munged.log" --seed-file="$base/munge/munge.seed"
        for _ in $(seq 50); do [[ -S $base/munge/munge.socket ]] && break; sleep 0.1; done
        [[ -S $base/munge/munge.socket ]] || die "munged did not start: $(tail -3 "$base/log/munged.out" "$base/log/munged.log" 2>/dev/null)"
    fi
    export SLURM_CONF=$base/etc/slurm.conf
    alive "$base/run/slurmctld.pid.own" ||
        start "$base/run/slurmctld.pid.own" "" "$base/log/slurmctld.out" slurmctld -D -i -f "$SLURM_CONF"
    local i
    for i in $(seq 1 "$n"); do
        alive "$base/run/slurmd-mfnode$i.pid.own" ||
            start "$base/run/slurmd-mfnode$i.pid.own" "$pre-node$i" "$base/log/slurmd-mfnode$i.out" \
                unshare --mount --propagation private sh -c "$(node_command "$i")"
    done
    # Ready when every node is idle (or allocated: an earlier job still runs).
    local ready=0
    for _ in $(seq 150); do
        ready=$(sinfo -h -N -o '%T' 2>/dev/null | grep -cE '^(idle|mixed|allocated)$' || true)
        ((ready == n)) && break
        sleep 0.2
    done
    ((ready == n)) || die "$ready of $n nodes came up; logs in $base/log"
    say "up: $n nodes (mfnode1..$n), SLURM_CONF=$SLURM_CONF"
}

down() {
    local f i
    if [[ -d $base/run ]]; then
        for f in "$base"/run/*.pid.own "$base/run/munged.pid"; do
            [[ -f $f ]] || continue
            alive "$f" && kill -TERM "$(cat "$f")" 2>/dev/null || true
        done
        for f in "$base"/run/*.pid.own "$base/run/munged.pid"; do
            [[ -f $f ]] || continue
            for _ in $(seq 50); do alive "$f" || break; sleep 0.1; done
            alive "$f" && kill -KILL "$(cat "$f")" 2>/dev/null || true
        done
    fi
    local n nodes=()
    n=$(cat "$base/nodes" 2>/dev/null || echo 0)
    for i in $(seq 1 "$n"); do nodes+=("$pre-node$i"); done
    netns_remove "$bridge" "${nodes[@]}" "$pre-storage"
    rm -rf "$base"
    say "down"
}

status() {
    [[ -f $base/nodes ]] || { echo "cluster: down"; return 1; }
    SLURM_CONF=$base/etc/slurm.conf sinfo -N -o '%N %T %c'
}

case ${1:-} in
    up) shift; up "$@" ;;
    down) down ;;
    status) status ;;
    env) echo "export SLURM_CONF=$base/etc/slurm.conf" ;;
    paths) echo "STORAGE=$base/storage SHARED=$base/shared" ;;
    shape) shift; shape_node "$@" ;;
    drop-caches) sync && echo 3 >/proc/sys/vm/drop_caches ;;
    # Bytes the storage node has sent over its link so far (what jobs read from the shared
    # storage, plus SFTP's framing): sample it before and after a run.
    storage-bytes) cat "/sys/class/net/${pre}vs/statistics/rx_bytes" ;;
    *) die "usage: cluster.sh up [--nodes N] [--cpus C] [--bandwidth RATE] [--delay TIME] [--storage-bandwidth RATE]
       [--storage-delay TIME] | down | status | env | paths | drop-caches | storage-bytes | shape NODE RATE" ;;
esac
