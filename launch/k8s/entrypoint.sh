#!/bin/sh
# Container entrypoint of a meshfeed rank outside mpirun (Kubernetes Indexed Job, or
# launch/k8s/emulate.sh). Usage: entrypoint.sh <meshfeed args>, e.g.
#   entrypoint.sh run --transport ucx --data /data --batch-size 1024
#
# * RANK: taken as is when set; otherwise the Indexed Job's JOB_COMPLETION_INDEX.
# * WORLD_SIZE, MASTER_ADDR, MASTER_PORT, MESHFEED_JOB_TOKEN must be set (and RANK a
#   number below WORLD_SIZE); otherwise a one-line error and exit 2, meshfeed's exit code
#   for a bad command line, before anything starts.
# * MESHFEED_JOB_ID (the Job's uid in the manifest) is optional and passes through as is:
#   rank 0 refuses ranks whose job id differs from its own.
# * MESHFEED_STATE (optional; the manifests set /state/state.json, on a volume every pod
#   shares): makes the job restartable. The arguments must be a `run` command; the
#   entrypoint appends `--checkpoint "$MESHFEED_STATE"`: rank 0 saves the loader's
#   position there when the job is stopped by SIGTERM (every rank then exits 75) and at
#   the end, and when that file exists the job resumes from it, so that a restarted pod
#   continues exactly where the stopped job left off. The file's directory must exist (the
#   volume's mount: a missing mount is an error, exit 2, not a silent fresh start), and
#   the arguments must not name --state, --resume-from or --checkpoint themselves.
#   Every rank reads the file; only rank 0 writes it (atomically: written beside it, then
#   renamed). One line on stderr says whether this rank starts afresh or resumes.
# * Then `exec "${MESHFEED_BIN:-meshfeed}" "$@"`: meshfeed replaces this shell, so it gets
#   the container's signals (SIGTERM on pod deletion) and its exit code is the pod's.
# POSIX sh: the image needs no bash. The token is never printed.
set -eu

die() {
    echo "meshfeed entrypoint: $*" >&2
    exit 2
}

is_uint() {
    case $1 in '' | *[!0-9]*) return 1 ;; esac
    return 0
}

if [ -z "${RANK:-}" ]; then
    [ -n "${JOB_COMPLETION_INDEX:-}" ] ||
        die "neither RANK nor JOB_COMPLETION_INDEX is set (run as an Indexed Job, or set RANK)"
    RANK=$JOB_COMPLETION_INDEX
fi
missing=
for var in WORLD_SIZE MASTER_ADDR MASTER_PORT MESHFEED_JOB_TOKEN; do
    eval "val=\${$var:-}"
    [ -n "$val" ] || missing="$missing $var"
done
[ -z "$missing" ] || die "required environment variable(s) not set:$missing"

is_uint "$RANK" || die "RANK must be a non-negative integer, got '$RANK'"
is_uint "$WORLD_SIZE" || die "WORLD_SIZE must be a positive integer, got '$WORLD_SIZE'"
if [ "${#RANK}" -gt 9 ] || [ "${#WORLD_SIZE}" -gt 9 ]; then
    die "RANK and WORLD_SIZE must have at most 9 digits"
fi
# Export them without leading zeros (010 is 10, not octal 8).
RANK=$(printf '%s' "$RANK" | sed 's/^0*//; s/^$/0/')
WORLD_SIZE=$(printf '%s' "$WORLD_SIZE" | sed 's/^0*//; s/^$/0/')
[ "$WORLD_SIZE" -ge 1 ] || die "WORLD_SIZE must be at least 1, got $WORLD_SIZE"
if [ "$RANK" -ge "$WORLD_SIZE" ]; then
    die "RANK $RANK is out of range for WORLD_SIZE $WORLD_SIZE (completions and WORLD_SIZE must agree)"
fi
if ! is_uint "$MASTER_PORT" || [ "${#MASTER_PORT}" -gt 5 ] || [ "$MASTER_PORT" -lt 1 ] || [ "$MASTER_PORT" -gt 65535 ]; then
    die "MASTER_PORT must be a TCP port (1-65535), got '$MASTER_PORT'"
fi

if [ -n "${MESHFEED_STATE:-}" ]; then
    [ "${1:-}" = run ] || die "MESHFEED_STATE is for \`meshfeed run\`; the arguments start with '${1:-}'"
    for arg in "$@"; do
        case $arg in
            --state | --state=* | --resume-from | --resume-from=* | --checkpoint | --checkpoint=*)
                die "MESHFEED_STATE is set: leave $arg out of the arguments (the entrypoint adds --checkpoint)" ;;
        esac
    done
    state_dir=$(dirname -- "$MESHFEED_STATE")
    [ -d "$state_dir" ] ||
        die "MESHFEED_STATE=$MESHFEED_STATE: directory $state_dir does not exist (is the state volume mounted?)"
    # meshfeed resumes from the file when it exists and writes the state there.
    set -- "$@" --checkpoint "$MESHFEED_STATE"
    if [ -e "$MESHFEED_STATE" ]; then
        echo "meshfeed entrypoint: rank $RANK resumes from $MESHFEED_STATE" >&2
    else
        echo "meshfeed entrypoint: rank $RANK starts afresh (no $MESHFEED_STATE yet)" >&2
    fi
fi

export RANK WORLD_SIZE MASTER_ADDR MASTER_PORT MESHFEED_JOB_TOKEN
exec "${MESHFEED_BIN:-meshfeed}" "$@"
