#!/bin/sh
# Launcher entrypoint of meshfeed-mpijob.yaml (Kubeflow MPIJob, MPI transport). Usage:
#   mpijob-launcher.sh MPIRUN-ARGS... meshfeed run RUN-ARGS...
# i.e. mpirun's command line without `mpirun`, ending with the meshfeed command, e.g.
#   mpijob-launcher.sh -np 4 meshfeed run --data /data --batch-size 1024
#
# * MESHFEED_STATE (optional; the manifest sets /state/state.json, a volume the launcher
#   and every worker mount): makes the job restartable, as entrypoint.sh does for the
#   UCX manifests. The launcher appends `--checkpoint "$MESHFEED_STATE"` to the command line
#   (its last words go to `meshfeed run`: with `--checkpoint`, rank 0, on a worker, saves
#   the state there when the ranks are stopped by SIGTERM and at the end, and every rank
#   resumes from it when the file exists). The file's directory must exist here (the
#   volume's mount: a missing mount is an error, not a silent fresh start), the command
#   line must hold a `run` command and must not name --state, --resume-from or
#   --checkpoint itself.
# * Then `exec "${MPIRUN:-mpirun}" ARGS...`: mpirun replaces this shell, so its exit code
#   is the launcher's: 75 when the ranks stopped cleanly (a worker's ranks got SIGTERM:
#   see mpijob-worker.sh), and the launcher's restartPolicy OnFailure runs it again,
#   resuming.
# Errors: one line on stderr and exit 2 (meshfeed's code for a bad command line), before
# anything starts. POSIX sh.
set -eu

die() {
    echo "meshfeed mpijob launcher: $*" >&2
    exit 2
}

[ $# -gt 0 ] || die "usage: mpijob-launcher.sh MPIRUN-ARGS... meshfeed run RUN-ARGS..."
if [ -n "${MESHFEED_STATE:-}" ]; then
    has_run=
    for arg in "$@"; do
        case $arg in
            run) has_run=1 ;;
            --state | --state=* | --resume-from | --resume-from=* | --checkpoint | --checkpoint=*)
                die "MESHFEED_STATE is set: leave $arg out of the arguments (the launcher adds --checkpoint)" ;;
        esac
    done
    [ -n "$has_run" ] || die "MESHFEED_STATE is for \`meshfeed run\`: the arguments hold no \`run\` command"
    state_dir=$(dirname -- "$MESHFEED_STATE")
    [ -d "$state_dir" ] ||
        die "MESHFEED_STATE=$MESHFEED_STATE: directory $state_dir does not exist (is the state volume mounted?)"
    # meshfeed resumes from the file when it exists and writes the state there.
    set -- "$@" --checkpoint "$MESHFEED_STATE"
    if [ -e "$MESHFEED_STATE" ]; then
        echo "meshfeed mpijob launcher: resuming from $MESHFEED_STATE" >&2
    else
        echo "meshfeed mpijob launcher: starting afresh (no $MESHFEED_STATE yet)" >&2
    fi
fi
exec "${MPIRUN:-mpirun}" "$@"
