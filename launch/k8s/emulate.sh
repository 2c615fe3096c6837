#!/usr/bin/env bash
# Emulates launch/k8s/meshfeed-job.yaml (an Indexed Job of N pods behind a headless
# Service) on one machine, without Kubernetes. Usage:
#
#   MESHFEED_BIN=target/release/meshfeed \
#       launch/k8s/emulate.sh -n 4 -- run --transport ucx --data DIR --batch-size 64
#
# Options (before `--`; everything after it goes to entrypoint.sh, i.e. to meshfeed):
#   -n N         number of pods = completions = WORLD_SIZE (1..254; required)
#   -p PORT      MASTER_PORT (default: $MASTER_PORT if set, else a free port)
#   -t SECONDS   deadline, like the Job's activeDeadlineSeconds: kill every pod and fail
#                when the job has not finished by then (default: none)
#   -o DIR       write pod i's stdout and stderr to DIR/meshfeed-<i>.out and .err instead
#                of the terminal (default: the terminal, each line prefixed `[meshfeed-<i>] `);
#                the pods that replace pod i append to the same files
#   -P SECONDS[:INDEX]
#                preempt: SECONDS after the pods started, SIGTERM every pod's main process
#                (or only pod INDEX's), as the kubelet does to the pods of a drained or
#                preempted node; pods still running -g seconds later get SIGKILL. Give -P
#                again for further preemptions, each SECONDS after the pods the previous
#                one stopped have all been replaced (default: no preemption)
#   -g SECONDS   the pods' terminationGracePeriodSeconds after a preemption (default: 30,
#                the manifest's)
#   -h           this help
# MESHFEED_JOB_TOKEN is taken from the environment if set, else random (never printed).
# MESHFEED_JOB_ID, the emulated Job's uid, is random for every run (as a new Job's is).
# MESHFEED_BIN is passed through to entrypoint.sh (default there: `meshfeed` on PATH).
# MESHFEED_STATE is passed through too: the manifest's state volume is, here, a directory
# every pod sees (MESHFEED_STATE=DIR/state.json); see entrypoint.sh.
#
# What each "pod" i (0 <= i < N) gets:
#   * its own mount and UTS namespaces (`unshare --mount --uts`): hostname `meshfeed-<i>`
#     (the Indexed Job's pod hostname) and a private /etc/hosts, bind-mounted over the
#     host's inside the pod's mount namespace only, that maps `meshfeed-<j>.meshfeed` and
#     `meshfeed-<j>` to 127.0.10.<j+1> for every pod j: what the headless Service's DNS
#     gives a real pod. Linux answers every 127.0.0.0/8 address on `lo`, so no address
#     needs configuring. The host's hostname and /etc/hosts are untouched.
#   * the Job's environment: JOB_COMPLETION_INDEX=i (RANK left unset, so entrypoint.sh
#     maps it), WORLD_SIZE=N, MASTER_ADDR=meshfeed-0.meshfeed, MASTER_PORT,
#     MESHFEED_JOB_TOKEN, MESHFEED_JOB_ID, UCX_TLS=tcp, UCX_NET_DEVICES=lo; the rest of the caller's
#     environment is passed through, less RANK/LOCAL_RANK and MPI launcher variables
#     (OMPI_*, PMIX_*, PMI_*), which would otherwise leak into every pod.
#   * the command `launch/k8s/entrypoint.sh ARGS...`.
#   * EMULATE_ATTEMPT: 0 for the first pod of index i, k for its k-th replacement. Not
#     something a real pod gets: tests use it to keep each attempt's output apart.
# Every pod checks, before starting the entrypoint, that its hostname is meshfeed-<i> and
# that `getent hosts meshfeed-<i>.meshfeed` gives its address.
#
# NOT emulated: network isolation. The pods share the host's network namespace: rank 0's
# rendezvous listens on the host's ports (MASTER_PORT must be free on the host), and UCX
# over TCP on `lo` reaches every pod whatever address it names. What this exercises is
# name resolution of the pod names, the index -> rank mapping and the environment
# contract, with real separate processes and real TCP.
#
# Like the Job's podFailurePolicy: a pod that exits 75 (meshfeed stopped cleanly by
# SIGTERM, its state saved) is replaced at once by a new pod of the same index (a new
# process with the same hostname, environment and arguments; rule `Ignore`, which counts
# no failure), and the replacement resumes from MESHFEED_STATE. As with the manifest's
# podReplacementPolicy Failed, a replacement starts only once the pod it replaces has
# ended; unlike on a cluster it starts at once, on the same machine, with the same
# address (a real one gets a new pod IP behind the same DNS name, seconds later, possibly
# on another node: hence the ReadWriteMany state volume). Any other non-zero exit
# fails the job at once (rule `FailJob`, and `backoffLimit: 0`); the other pods are then
# terminated (SIGTERM to each pod's process group, SIGKILL after 5 s).
# Exit status: 0 when every index's pod exited 0; 1 when a pod failed or the deadline passed;
# 2 for a bad command line or environment. Needs root (CAP_SYS_ADMIN for the namespaces,
# the bind mount and sethostname), util-linux (unshare, setsid), getent, bash >= 5.1.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
entrypoint=$here/entrypoint.sh
grace=5

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
die() { echo "emulate.sh: $*" >&2; exit 2; }

n='' port=${MASTER_PORT:-} deadline='' outdir='' preempts=() term_grace=30
while getopts ':n:p:t:o:P:g:h' opt; do
    case $opt in
        n) n=$OPTARG ;;
        p) port=$OPTARG ;;
        t) deadline=$OPTARG ;;
        o) outdir=$OPTARG ;;
        P) preempts+=("$OPTARG") ;;
        g) term_grace=$OPTARG ;;
        h) usage; exit 0 ;;
        :) die "option -$OPTARG needs a value (see -h)" ;;
        *) die "unknown option -$OPTARG (see -h)" ;;
    esac
done
shift $((OPTIND - 1)) # getopts consumed the `--`
[[ -n $n ]] || die "missing -n N (the number of pods; see -h)"
if ! [[ $n =~ ^[0-9]{1,3}$ ]] || ((10#$n < 1 || 10#$n > 254)); then die "-n must be 1..254, got '$n'"; fi
n=$((10#$n))
[[ -z $deadline || $deadline =~ ^[0-9]+$ ]] || die "-t must be a number of seconds, got '$deadline'"
for p in "${preempts[@]}"; do
    [[ $p =~ ^[0-9]+(\.[0-9]+)?(:[0-9]{1,3})?$ ]] || die "-P must be SECONDS or SECONDS:INDEX, got '$p'"
    if [[ $p == *:* ]] && ((10#${p#*:} >= n)); then die "-P $p: no pod ${p#*:} among $n"; fi
done
[[ $term_grace =~ ^[0-9]+$ ]] || die "-g must be a number of seconds, got '$term_grace'"
[[ $(id -u) == 0 ]] || die "needs root: each pod gets its own mount and UTS namespaces (unshare --mount --uts)"
for tool in unshare setsid getent mount hostname; do
    command -v "$tool" >/dev/null || die "'$tool' not found (util-linux, libc-bin, hostname)"
done
[[ -x $entrypoint ]] || die "$entrypoint is not executable"
if [[ -n $outdir ]]; then
    mkdir -p "$outdir" || die "cannot create $outdir"
fi

free_port() {
    # A port nothing listens on now (the rendezvous binds all addresses). Racy by nature,
    # as any picked port is; pass -p to choose one.
    if command -v python3 >/dev/null; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
        return
    fi
    local p
    for _ in $(seq 100); do
        p=$((20000 + RANDOM % 30000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
    done
    return 1
}
if [[ -z $port ]]; then
    port=$(free_port) || die "could not find a free port; pass -p PORT"
fi
if ! [[ $port =~ ^[0-9]{1,5}$ ]] || ((10#$port < 1 || 10#$port > 65535)); then die "bad MASTER_PORT '$port'"; fi
# Exported, not passed on a command line, where `ps` would show it.
export MESHFEED_JOB_TOKEN=${MESHFEED_JOB_TOKEN:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
# The Job's uid, which the manifest passes as MESHFEED_JOB_ID: new for every Job.
MESHFEED_JOB_ID=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export MESHFEED_JOB_ID

# The cluster's "DNS": one hosts file per pod, as each pod's /etc/hosts is its own.
work=$(mktemp -d "${TMPDIR:-/tmp}/meshfeed-emulate.XXXXXX")
{
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'
    for ((j = 0; j < n; j++)); do
        printf '127.0.10.%d\tmeshfeed-%d.meshfeed meshfeed-%d\n' $((j + 1)) "$j" "$j"
    done
} >"$work/hosts"
for ((i = 0; i < n; i++)); do cp "$work/hosts" "$work/hosts.$i"; done

# Runs inside the pod's namespaces as `bash -c "$pod_script" meshfeed-<i> ENTRYPOINT ARGS...`.
# shellcheck disable=SC2016
pod_script='
set -eu
hostname "$POD_HOSTNAME"
mount --bind "$POD_HOSTS" /etc/hosts
[ "$(hostname)" = "$POD_HOSTNAME" ] || { echo "emulate.sh: pod $POD_HOSTNAME: hostname is $(hostname)" >&2; exit 2; }
got=$(getent hosts "$POD_HOSTNAME.meshfeed" | cut -d" " -f1)
[ "$got" = "$POD_ADDR" ] || { echo "emulate.sh: pod $POD_HOSTNAME: $POD_HOSTNAME.meshfeed resolves to \"$got\", not $POD_ADDR" >&2; exit 2; }
unset POD_HOSTNAME POD_HOSTS POD_ADDR
exec "$@"
'

# Variables of the caller that must not reach the pods.
scrub=(-u RANK -u LOCAL_RANK)
while IFS= read -r var; do
    case $var in OMPI_* | PMIX_* | PMI_*) scrub+=(-u "$var") ;; esac
done < <(compgen -e)

# pod_of[i]: the running pod (its pid, which is also its process group) of index i;
# empty once that pod has ended (its group is killed then: nothing of it is left).
pod_of=() attempt=() sedpids=() watchdog=''
declare -A index_of=() gen_of=()
running_pods() {
    local i
    for i in "${!pod_of[@]}"; do [[ -n ${pod_of[i]} ]] && echo "${pod_of[i]}"; done
    return 0
}
kill_pods() {
    local sig=$1 pid
    for pid in $(running_pods); do kill "-$sig" -- "-$pid" 2>/dev/null || true; done
}
pods_alive() {
    # Is any process of the pods' groups still running? Not `kill -0`, which succeeds on
    # zombies: killed processes orphaned to an init that reaps slowly would look alive.
    local f line fields pid pids
    mapfile -t pids < <(running_pods)
    for f in /proc/[0-9]*/stat; do
        { read -r line <"$f"; } 2>/dev/null || continue
        read -ra fields <<<"${line##*) }" # state ppid pgrp ...
        [[ ${fields[0]} == Z ]] && continue
        for pid in "${pids[@]}"; do [[ ${fields[2]} == "$pid" ]] && return 0; done
    done
    return 1
}
timers() { # the background timers (sleeps) still armed
    local t
    for t in "$watchdog" "$preempt_timer" "$grace_timer"; do [[ -n $t ]] && echo "$t"; done
    return 0
}
stop_all() {
    # TERM every pod's process group, give them $grace seconds, then KILL what is left.
    kill_pods TERM
    local t
    for ((t = 0; t < grace * 10; t++)); do
        pods_alive || break
        sleep 0.1
    done
    kill_pods KILL
    # shellcheck disable=SC2046
    wait $(running_pods) 2>/dev/null || true
}
finish() {
    # Let the output prefixers drain (they end when the pods' ends of their pipes close).
    local pid
    for pid in "${sedpids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
cleanup() {
    local t
    for t in $(timers); do kill "$t" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "emulate.sh: interrupted: terminating the pods" >&2; stop_all; exit 130' INT
trap 'echo "emulate.sh: terminated: terminating the pods" >&2; stop_all; exit 143' TERM

gen=0 # pods started after the k-th preemption are of generation k
start_pod() {
    local i=$1 name=meshfeed-$1 ofd efd pid
    shift # the rest: the entrypoint's arguments
    if [[ -n $outdir ]]; then
        if ((attempt[i] == 0)); then
            exec {ofd}>"$outdir/$name.out" {efd}>"$outdir/$name.err"
        else
            exec {ofd}>>"$outdir/$name.out" {efd}>>"$outdir/$name.err"
        fi
    else
        exec {ofd}> >(sed -u "s/^/[$name] /")
        sedpids+=($!)
        exec {efd}> >(sed -u "s/^/[$name] /" >&2)
        sedpids+=($!)
    fi
    # setsid: each pod is its own process group (pgid = its pid, as a background job of
    # a shell without job control is no group leader, so setsid does not fork), so that
    # killing a pod kills whatever it started too; unshare execs too (no --fork). The
    # pod's pid is thus that of its main process (meshfeed, once the entrypoint execs).
    env "${scrub[@]}" \
        POD_HOSTNAME="$name" POD_HOSTS="$work/hosts.$i" POD_ADDR="127.0.10.$((i + 1))" \
        JOB_COMPLETION_INDEX="$i" WORLD_SIZE="$n" \
        MASTER_ADDR=meshfeed-0.meshfeed MASTER_PORT="$port" \
        UCX_TLS=tcp UCX_NET_DEVICES=lo EMULATE_ATTEMPT="${attempt[i]}" \
        setsid unshare --mount --uts --propagation private \
        bash -c "$pod_script" "$name" "$entrypoint" "$@" \
        </dev/null >&"$ofd" 2>&"$efd" {ofd}>&- {efd}>&- &
    pid=$!
    exec {ofd}>&- {efd}>&-
    pod_of[i]=$pid
    index_of[$pid]=$i
    gen_of[$pid]=$gen
}

preempt_timer='' grace_timer='' next_preempt=0 targets=() replaced=0
arm_preempt() {
    ((next_preempt < ${#preempts[@]})) || return 0
    sleep "${preempts[next_preempt]%%:*}" &
    preempt_timer=$!
}
preempt() {
    # As the kubelet stops a container: SIGTERM to its main process only; what it
    # started is killed with it when it ends, or at the end of the grace period.
    local spec=${preempts[next_preempt]} i what
    next_preempt=$((next_preempt + 1))
    gen=$((gen + 1))
    targets=()
    if [[ $spec == *:* ]]; then
        i=$((10#${spec#*:}))
        [[ -n ${pod_of[i]} ]] && targets=("${pod_of[i]}")
        what="pod meshfeed-$i"
    else
        for i in "${!pod_of[@]}"; do [[ -n ${pod_of[i]} ]] && targets+=("${pod_of[i]}"); done
        what="every pod"
    fi
    echo "emulate.sh: preemption $next_preempt: SIGTERM to $what (${#targets[@]} running)" >&2
    local pid
    for pid in "${targets[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    sleep "$term_grace" &
    grace_timer=$!
}
reaped() {
    # Has bash already collected pod $1's end? It does so by itself (and then drops it from
    # its job table, where `wait -n` looks) when the pod's main process was killed by a
    # signal, as soon as the next command runs; plain `wait PID` still gives its status.
    # Not one of our children any more, by /proc: then it was reaped.
    local line fields
    { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 0
    read -ra fields <<<"${line##*) }" # state ppid ...
    [[ ${fields[1]} != "$$" ]]
}
settled() {
    # Has every pod that ran when the last preemption came ended (and been replaced)?
    local i
    for i in "${!pod_of[@]}"; do
        [[ -n ${pod_of[i]} ]] && ((gen_of[${pod_of[i]}] < gen)) && return 1
    done
    return 0
}

for ((i = 0; i < n; i++)); do attempt[i]=0; done
for ((i = 0; i < n; i++)); do start_pod "$i" "$@"; done
echo "emulate.sh: started $n pod(s) (MASTER_ADDR=meshfeed-0.meshfeed MASTER_PORT=$port)" >&2

if [[ -n $deadline ]]; then
    sleep "$deadline" &
    watchdog=$!
fi
arm_preempt

remaining=$n failed=''
while ((remaining > 0)); do
    if ((gen > 0)) && [[ -z $preempt_timer ]] && settled; then
        # Every pod the last preemption stopped has been replaced (or has finished).
        if [[ -n $grace_timer ]]; then kill "$grace_timer" 2>/dev/null; grace_timer=''; fi
        arm_preempt
    fi
    mapfile -t running < <(running_pods)
    mapfile -t armed < <(timers)
    done_pid=''
    for pid in "${running[@]}"; do
        if reaped "$pid"; then
            done_pid=$pid
            break
        fi
    done
    set +e
    if [[ -n $done_pid ]]; then
        wait "$done_pid" # its saved status
    else
        wait -n -p done_pid "${running[@]}" "${armed[@]}"
    fi
    status=$?
    set -e
    [[ -n ${done_pid:-} ]] || continue
    if [[ $done_pid == "$watchdog" ]]; then
        watchdog=''
        failed="deadline of ${deadline}s exceeded with $remaining pod(s) still running"
        break
    fi
    if [[ $done_pid == "$preempt_timer" ]]; then
        preempt_timer=''
        preempt
        continue
    fi
    if [[ $done_pid == "$grace_timer" ]]; then
        # The grace period is over: the kubelet kills what is left of the stopped pods.
        grace_timer=''
        for pid in "${targets[@]}"; do
            if [[ ${pod_of[${index_of[$pid]}]} == "$pid" ]]; then
                echo "emulate.sh: pod meshfeed-${index_of[$pid]} outlived its grace period of ${term_grace}s: SIGKILL" >&2
                kill -KILL -- "-$pid" 2>/dev/null || true
            fi
        done
        continue
    fi
    i=${index_of[$done_pid]}
    # As when a container's main process ends: nothing it started outlives it.
    kill -KILL -- "-$done_pid" 2>/dev/null || true
    pod_of[i]=''
    if ((status == 75)); then
        # podFailurePolicy: exit 75 -> Ignore: the Job controller creates a new pod for
        # the index, counting no failure.
        attempt[i]=$((attempt[i] + 1))
        replaced=$((replaced + 1))
        echo "emulate.sh: pod meshfeed-$i exited 75 (stopped cleanly): replacing it (attempt ${attempt[i]})" >&2
        start_pod "$i" "$@"
    elif ((status != 0)); then
        failed="pod meshfeed-$i failed with exit status $status"
        break
    else
        remaining=$((remaining - 1))
    fi
done

if [[ -n $failed ]]; then
    echo "emulate.sh: job failed: $failed; terminating the pods still running" >&2
    stop_all
    finish
    exit 1
fi
finish
if ((next_preempt < ${#preempts[@]})); then
    echo "emulate.sh: the job ended before preemption $((next_preempt + 1)) (-P ${preempts[next_preempt]})" >&2
fi
if ((replaced > 0)); then
    echo "emulate.sh: job succeeded: $n pod(s) exited 0 ($replaced pod(s) replaced after exit 75)" >&2
else
    echo "emulate.sh: job succeeded: $n pod(s) exited 0" >&2
fi
