#!/usr/bin/env bash
# A real Slurm cluster on one machine, for tests and scaling studies: munge, slurmctld
# and one slurmd per "node", each node a network namespace with its own address on a
# bridge, all from Debian's packages and without systemd.
#
#   bash slurm/cluster.sh up [--nodes N] [--cpus C] [--bandwidth RATE] [--delay TIME]
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
# Nodes are mfnode1..N at 10.77.0.11.. (slurmctld on the bridge, 10.77.0.1). Tasks get
# MESHFEED_HOST=<node> (the namespaces share one host name) and Open MPI's TCP interfaces
# limited to the bridge's subnet, through the cluster's TaskProlog.
# Needs root. The directory is $MESHFEED_CLUSTER_DIR (default /tmp/meshfeed-cluster).
set -euo pipefail

base=${MESHFEED_CLUSTER_DIR:-/tmp/meshfeed-cluster}
subnet=10.77.0
bridge=mfbr0

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
EOF
    chmod 0755 "$base/etc/task_prolog.sh"
    {
        cat <<EOF
ClusterName=meshfeed
SlurmctldHost=$(hostname)($subnet.1)
SlurmctldPort=16817
SlurmdPort=16818
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

network_up() { # NODES BANDWIDTH DELAY
    local n=$1 rate=$2 delay=$3 i ns
    ip link show "$bridge" >/dev/null 2>&1 || {
        ip link add "$bridge" type bridge
        ip addr add "$subnet.1/24" dev "$bridge"
        ip link set "$bridge" up
    }
    for i in $(seq 1 "$n"); do
        ns=mf-node$i
        ip netns list | grep -qx "$ns\( .*\)\?" || ip netns add "$ns"
        if ! ip link show "mfv$i" >/dev/null 2>&1; then
            ip link add "mfv$i" type veth peer name eth0 netns "$ns"
            ip link set "mfv$i" master "$bridge" up
            ip -n "$ns" addr add "$subnet.$((10 + i))/24" dev eth0
            ip -n "$ns" link set eth0 up
            ip -n "$ns" link set lo up
            ip -n "$ns" route add default via "$subnet.1"
        fi
        if [[ -n $rate || -n $delay ]]; then
            # Both directions: the node's egress (eth0) and its ingress (the bridge port).
            local shape=(netem ${delay:+delay "$delay"} ${rate:+rate "$rate"})
            ip netns exec "$ns" tc qdisc replace dev eth0 root "${shape[@]}"
            tc qdisc replace dev "mfv$i" root "${shape[@]}"
        fi
    done
}

up() {
    local n=2 cpus=8 rate="" delay=""
    while (($#)); do
        case $1 in
            --nodes) n=$2; shift ;;
            --cpus) cpus=$2; shift ;;
            --bandwidth) rate=$2; shift ;;
            --delay) delay=$2; shift ;;
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
    network_up "$n" "$rate" "$delay"
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
            start "$base/run/slurmd-mfnode$i.pid.own" "mf-node$i" "$base/log/slurmd-mfnode$i.out" \
                slurmd -D -N "mfnode$i" -f "$SLURM_CONF"
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
    local f i ns
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
    local n
    n=$(cat "$base/nodes" 2>/dev/null || echo 0)
    for i in $(seq 1 "$n"); do
        ns=mf-node$i
        ip link del "mfv$i" 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    ip link del "$bridge" 2>/dev/null || true
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
    *) die "usage: cluster.sh up [--nodes N] [--cpus C] [--bandwidth RATE] [--delay TIME] | down | status | env" ;;
esac
