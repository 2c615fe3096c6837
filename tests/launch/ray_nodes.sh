#!/usr/bin/env bash
# A multi-node Ray cluster on one machine, for tests: each "node" is a network namespace
# on a bridge, with its own address, its own host name (mfray<id>-<i>, in every node's
# /etc/hosts) and its own mount namespace (a private /tmp/ray, so the nodes' session
# directories do not collide), running `ray start --block`: the first node is the head,
# the others join it, as on a real cluster. The nodes' environment (which Ray's workers
# inherit) sets UCX and Gloo to their eth0, as a cluster's administrator would.
#
#   bash tests/launch/ray_nodes.sh up N DIR     # N nodes (1..8), 2 CPUs each; state in DIR
#   bash tests/launch/ray_nodes.sh exec I DIR CMD...   # run CMD on node I (0: the head)
#   bash tests/launch/ray_nodes.sh down DIR     # stop everything in the nodes, remove them
#
# `up` prints the head's address (HOST:PORT) last. Node i has the address
# 10.78.<id>.<i+2> on interface eth0 (MESHFEED_RAY_ID, 0-9, default 8, keeps clusters on
# one machine apart). `exec` enters node I's network and mount namespaces: a Ray driver
# (`ray.init(address="auto")`) must run on a node, next to that node's raylet. `down`
# kills every process in the nodes' network namespaces (Ray's daemons and workers, and
# whatever they started; never by name), then removes the namespaces, veths and bridge.
# Needs root, iproute2, util-linux, and `ray` on PATH (the venv's). The nodes' network:
# launch/netns.sh, as every emulation's.
set -euo pipefail
# shellcheck source=launch/netns.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../launch/netns.sh"

id=${MESHFEED_RAY_ID:-8}
[[ $id =~ ^[0-9]$ ]] || { echo "ray_nodes: MESHFEED_RAY_ID must be 0-9" >&2; exit 2; }
subnet=10.78.$id
bridge=mfrb$id
ns() { echo "mfray$id-$1"; }
all_ns() { local i; for ((i = 0; i < $1; i++)); do ns "$i"; done; }
die() { echo "ray_nodes: $*" >&2; exit 1; }

up() {
    local n=$1 dir=$2 i
    [[ $n =~ ^[1-8]$ ]] || die "N must be 1..8"
    command -v ray >/dev/null || die "ray is not on PATH (the venv's bin)"
    mkdir -p "$dir" /tmp/ray
    echo "$n" >"$dir/nodes"
    {
        echo "127.0.0.1 localhost"
        for ((i = 0; i < n; i++)); do echo "$subnet.$((i + 2)) $(ns "$i")"; done
    } >"$dir/hosts"
    netns_bridge "$bridge" "$subnet.1/24"
    for ((i = 0; i < n; i++)); do
        local s
        s=$(ns "$i")
        netns_node "$bridge" "$s" "mfrv$id$i" "$subnet.$((i + 2))/24"
        mkdir -p "$dir/node$i/ray"
        local join=(--head --port=6379 --include-dashboard=false)
        ((i == 0)) || join=(--address="$subnet.2:6379")
        # The pid of `setsid` is that of `ray start` (each execs the next).
        # The nodes' own environment, as a cluster's administrator would set it: Ray's
        # workers (Ray Train's) inherit it, not the driver's. UCX over the node's link.
        RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 UCX_TLS=tcp UCX_NET_DEVICES=eth0 GLOO_SOCKET_IFNAME=eth0 \
            setsid nsenter --net="/run/netns/$s" unshare --mount --uts --propagation private sh -c \
            "mount --bind '$dir/node$i/ray' /tmp/ray && mount --bind '$dir/hosts' /etc/hosts && hostname $s &&
             exec ray start --block ${join[*]} \
             --node-ip-address=$subnet.$((i + 2)) --num-cpus=2 --disable-usage-stats" >"$dir/node$i/ray.out" 2>&1 </dev/null &
        echo $! >"$dir/node$i/pid"
        # Each node's runtime is up before the next starts (workers join a running head).
        for _ in $(seq 200); do
            grep -q "Ray runtime started" "$dir/node$i/ray.out" 2>/dev/null && break
            kill -0 "$(cat "$dir/node$i/pid")" 2>/dev/null || die "node $i did not start: $(tail -5 "$dir/node$i/ray.out")"
            sleep 0.3
        done
    done
    # Ready when the head sees every node alive.
    local alive=0
    for _ in $(seq 20); do
        alive=$(run_on 0 "$dir" python -c \
            'import ray; ray.init(address="auto", logging_level="ERROR"); print(sum(n["Alive"] for n in ray.nodes()))' \
            2>/dev/null | tail -1) || alive=0
        [[ $alive == "$n" ]] && break
        sleep 1
    done
    [[ $alive == "$n" ]] || die "$alive of $n Ray nodes came up; logs in $dir/node*/ray.out"
    echo "$subnet.2:6379"
}

run_on() {
    local i=$1 dir=$2
    shift 2
    local pid
    pid=$(cat "$dir/node$i/pid" 2>/dev/null) || die "no node $i in $dir"
    RAY_AUTH_MODE=disabled UCX_TLS=tcp UCX_NET_DEVICES=eth0 GLOO_SOCKET_IFNAME=eth0 \
        nsenter --target "$pid" --net --mount --uts --wd="$PWD" "$@"
}

down() {
    local dir=$1 n nodes
    n=$(cat "$dir/nodes" 2>/dev/null || echo 8)
    mapfile -t nodes < <(all_ns "$n")
    netns_kill "${nodes[@]}"
    netns_remove "$bridge" "${nodes[@]}"
    rm -rf "$dir"
}

case ${1:-} in
    up) up "${2:?N}" "${3:?DIR}" ;;
    exec) i=${2:?I} dir=${3:?DIR}; shift 3; run_on "$i" "$dir" "$@" ;;
    down) down "${2:?DIR}" ;;
    *) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 2 ;;
esac
