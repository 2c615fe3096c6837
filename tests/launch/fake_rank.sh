#!/bin/sh
# A stand-in for the meshfeed binary, for tests/launch/check_k8s.py: run by
# launch/k8s/entrypoint.sh (MESHFEED_BIN) inside an emulated pod, it prints what the pod
# sees, one `key=value` per line, then behaves as its options say:
#   --fail-rank R   rank R waits for every other rank's `started-<rank>` marker, then exits 3
#   --markers DIR   write DIR/started-<rank> (holding its pid) at start, DIR/done-<rank> at the end
#   --sleep S       sleep S seconds before finishing
# Other arguments are ignored (and printed as args=...).
set -eu
echo "args=$*"
fail_rank='' markers='' nap=0
while [ $# -gt 0 ]; do
    case $1 in
        --fail-rank) fail_rank=$2; shift ;;
        --markers) markers=$2; shift ;;
        --sleep) nap=$2; shift ;;
    esac
    shift
done
echo "rank=$RANK"
echo "index=${JOB_COMPLETION_INDEX:-}"
echo "world_size=$WORLD_SIZE"
echo "hostname=$(hostname)"
echo "master_addr=$MASTER_ADDR"
echo "master_resolved=$(getent hosts "$MASTER_ADDR" | cut -d' ' -f1)"
echo "self_resolved=$(getent hosts "$(hostname).meshfeed" | cut -d' ' -f1)"
echo "master_port=$MASTER_PORT"
echo "token_sha=$(printf %s "$MESHFEED_JOB_TOKEN" | sha256sum | cut -c1-16)"
echo "ucx_tls=${UCX_TLS:-}"
[ -n "$markers" ] && echo $$ >"$markers/started-$RANK"
if [ "$RANK" = "$fail_rank" ]; then
    # Fail only once the others run, so that the launcher really has pods to kill.
    i=0
    while [ $i -lt 100 ]; do
        all=1 r=0
        while [ $r -lt "$WORLD_SIZE" ]; do
            [ $r = "$RANK" ] || [ -e "$markers/started-$r" ] || all=0
            r=$((r + 1))
        done
        [ $all = 1 ] && break
        sleep 0.1
        i=$((i + 1))
    done
    echo "rank $RANK: failing on purpose" >&2
    exit 3
fi
sleep "$nap"
[ -n "$markers" ] && echo $$ >"$markers/done-$RANK"
echo "finished"
