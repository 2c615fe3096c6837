#!/bin/sh
# Worker entrypoint of meshfeed-mpijob.yaml (Kubeflow MPIJob). Usage:
#   mpijob-worker.sh SSHD-COMMAND...        e.g.  mpijob-worker.sh /usr/sbin/sshd -De
#
# Runs the worker's sshd (through which the launcher's mpirun starts the ranks here) and
# passes a preemption on to the ranks. When the pod is deleted, preempted or its node
# drained, the kubelet sends SIGTERM to the container's main process only: to sshd, whose
# end would take the ranks down with it (the container's processes are killed when its
# main process ends), with no state saved. Instead, on SIGTERM (or SIGINT) this script
#   1. sends SIGTERM to every process of this container named `meshfeed` (the ranks):
#      they stop after the same step as the ranks on the other workers, rank 0 saves the
#      state, and every rank exits 75, so mpirun on the launcher exits 75 and the
#      launcher's restartPolicy runs it again, resuming;
#   2. waits for them to end, at most MESHFEED_STOP_GRACE seconds (default 50: keep it
#      below the pod's terminationGracePeriodSeconds);
#   3. then stops sshd (SIGTERM) and exits 0.
# When sshd ends by itself, this script exits with its status. POSIX sh; reads /proc,
# where a container sees its own processes only.
set -u

[ $# -gt 0 ] || { echo "usage: mpijob-worker.sh SSHD-COMMAND..." >&2; exit 2; }
grace=${MESHFEED_STOP_GRACE:-50}
case $grace in '' | *[!0-9]*) echo "mpijob-worker.sh: MESHFEED_STOP_GRACE must be a number of seconds" >&2; exit 2 ;; esac

# The pids of the running (not zombie) processes named meshfeed, one per line.
ranks() {
    for stat in /proc/[0-9]*/stat; do
        { read -r line <"$stat"; } 2>/dev/null || continue
        name=${line#*\(}
        name=${name%\)*}
        state=${line##*\) }
        state=${state%% *}
        [ "$name" = meshfeed ] && [ "$state" != Z ] && echo "${line%% *}"
    done
    return 0
}

stop() {
    trap '' TERM INT
    pids=$(ranks)
    if [ -n "$pids" ]; then
        echo "mpijob-worker.sh: SIGTERM: stopping the ranks here (pids $(echo $pids)), then sshd" >&2
        # shellcheck disable=SC2086
        kill -TERM $pids 2>/dev/null
        waited=0
        while [ -n "$(ranks)" ] && [ "$waited" -lt $((grace * 10)) ]; do
            sleep 0.1
            waited=$((waited + 1))
        done
        [ -z "$(ranks)" ] || echo "mpijob-worker.sh: ranks still running after ${grace}s" >&2
    fi
    if [ -n "$main" ]; then
        kill -TERM "$main" 2>/dev/null
        wait "$main" 2>/dev/null
    fi
    exit 0
}

# The trap comes first: a SIGTERM as soon as sshd (and through it a rank) has started must
# still stop the ranks. (sshd itself gets the default action: a child does not inherit a
# trap.)
main=
trap stop TERM INT
"$@" &
main=$!
wait "$main"
