#!/usr/bin/env bash
# The network of emulated nodes on one machine, shared by every emulation (the Slurm
# nodes of slurm/cluster.sh, the Ray nodes of tests/launch/ray_nodes.sh, the MPIJob's pods
# of tests/emulation/mpijob.rs): a bridge on the host holding the subnet's first address,
# and one network namespace per node, joined to the bridge by a veth whose end inside the
# namespace is eth0, with the node's address. Each emulation keeps to its own subnet,
# bridge and names, so that several can be up at once. Needs root and iproute2.
#
# Sourced (`source launch/netns.sh`), it defines:
#
#   netns_bridge BRIDGE ADDR/PREFIX                  the bridge, with the host's address, up
#   netns_node BRIDGE NS VETH ADDR/PREFIX [GATEWAY]  namespace NS on the bridge: eth0 with
#                                                    ADDR, lo up, a default route via GATEWAY
#   netns_pids NS...                                 the processes in the namespaces
#   netns_kill NS...                                 SIGTERM, then SIGKILL, to every process
#                                                    in the namespaces, waiting up to 5 s each
#   netns_remove BRIDGE NS...                        the bridge's veths, the namespaces, the
#                                                    bridge
#
# Run (`bash launch/netns.sh bridge|node|pids|kill|remove ARGS...`), it does the same, for
# callers that are not shell scripts. Creating is idempotent (what exists is left as it
# is: a run that was killed can be set up again), removing what is not there is no error.

netns_bridge() { # BRIDGE ADDR/PREFIX
    local bridge=$1 addr=$2
    if ! ip link show "$bridge" >/dev/null 2>&1; then
        ip link add "$bridge" type bridge
        ip addr add "$addr" dev "$bridge"
        ip link set "$bridge" up
    fi
}

netns_node() { # BRIDGE NS VETH ADDR/PREFIX [GATEWAY]
    local bridge=$1 ns=$2 veth=$3 addr=$4 gateway=${5:-}
    ip netns list | grep -qx "$ns\( .*\)\?" || ip netns add "$ns"
    if ! ip link show "$veth" >/dev/null 2>&1; then
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" master "$bridge" up
        ip -n "$ns" addr add "$addr" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        if [[ -n $gateway ]]; then
            ip -n "$ns" route add default via "$gateway"
        fi
    fi
}

netns_pids() { # NS...
    local ns
    for ns in "$@"; do
        ip netns pids "$ns" 2>/dev/null || true
    done
}

netns_kill() { # NS...
    local sig pids _
    for sig in TERM KILL; do
        mapfile -t pids < <(netns_pids "$@")
        ((${#pids[@]})) || return 0
        kill -"$sig" "${pids[@]}" 2>/dev/null || true
        for _ in $(seq 50); do
            [[ -z $(netns_pids "$@") ]] && break
            sleep 0.1
        done
    done
}

netns_remove() { # BRIDGE NS...
    local bridge=$1 ns veth
    shift
    # The host ends of the veths on the bridge (`N: NAME@ifM: ...`).
    for veth in $(ip -o link show master "$bridge" 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }'); do
        ip link del "$veth" 2>/dev/null || true
    done
    for ns in "$@"; do
        ip netns del "$ns" 2>/dev/null || true
    done
    ip link del "$bridge" 2>/dev/null || true
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    set -euo pipefail
    command=${1:-}
    (($#)) && shift
    case $command in
        bridge) netns_bridge "${1:?BRIDGE}" "${2:?ADDR/PREFIX}" ;;
        node) netns_node "${1:?BRIDGE}" "${2:?NS}" "${3:?VETH}" "${4:?ADDR/PREFIX}" "${5:-}" ;;
        pids) netns_pids "$@" ;;
        kill) netns_kill "$@" ;;
        remove) netns_remove "${1:?BRIDGE}" "${@:2}" ;;
        *) sed -n '2,/^$/{/^$/d;s/^# \{0,1\}//;p}' "$0"; exit 2 ;;
    esac
fi
