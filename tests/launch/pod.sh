#!/usr/bin/env bash
# One container of a Kubernetes pod, emulated on this machine for tests: the image's files
# over this machine's Debian (the image's release: its /usr stands for the base image and
# the image's packages), the pod's own network, host name, process tree and /tmp, the
# pod's volumes, run as the image's user. Usage:
#
#   pod.sh -r IMAGE_ROOT -d POD_DIR -n NETNS -h HOSTNAME -u UID:GID [-w WORKDIR]
#          [-e NAME=VALUE]... [-v HOST_PATH:POD_PATH[:ro]]... -- COMMAND ARGS...
#
#   -r  the image's files under a directory (tests/emulation/image.rs writes the runtime
#       stage's there): its etc/ and usr/local/ are laid over this machine's, its opt/ and
#       home/ replace them
#   -d  the pod's own directory (created): its etc/ (hosts, passwd, group, ... written by
#       the caller) goes over the image's, its home/ is the pod's writable /home, and
#       `pid` receives the host's pid of COMMAND (the container's main process, to which
#       the kubelet sends SIGTERM)
#   -n  the pod's network namespace (made by the caller, e.g. with launch/netns.sh)
#   -e  the container's environment, and nothing else (as a kubelet starts it, with
#       the image's PATH and the user's HOME when not given)
#   -v  a volume: a bind mount, read-only with :ro
# COMMAND runs as PID 1 of its own PID namespace, with its own /proc (a container sees
# only its own processes), chrooted into the assembled root, in WORKDIR (default /), as
# UID:GID with no supplementary groups. pod.sh itself execs into it: its exit status is
# the container's. Needs root, util-linux (unshare, nsenter, setpriv) and overlayfs.
set -euo pipefail

die() { echo "pod.sh: $*" >&2; exit 2; }

if [[ ${1:-} == --inside ]]; then
    shift
    dir=$1 image=$2 host=$3 user=$4 workdir=$5
    shift 5
    mapfile -d '' -t envs < "$dir/env"
    mapfile -d '' -t vols < "$dir/volumes"
    # This shell becomes the container's main process (exec below): its pid as the host
    # sees it, from the host's /proc before the pod's own is mounted.
    read -r stat </proc/self/stat
    echo "${stat%% *}" >"$dir/pid"
    r=$dir/root
    mkdir -p "$r"
    mount -t tmpfs -o mode=755 pod-root "$r"
    for d in usr etc var dev proc sys tmp run opt home; do mkdir -p "$r/$d"; done
    for l in bin sbin lib lib64; do [[ -L /$l ]] && ln -s "$(readlink "/$l")" "$r/$l"; done
    mount --rbind /usr "$r/usr"
    mount --rbind /var "$r/var"
    mount --rbind /dev "$r/dev"
    mount --rbind /sys "$r/sys"
    mount -t proc proc "$r/proc"
    mount -t tmpfs -o mode=1777 pod-tmp "$r/tmp"
    mount -t tmpfs -o mode=755 pod-run "$r/run"
    # /etc: the pod's files over the image's over this machine's; written to a layer of
    # the pod's own.
    lower=$dir/etc
    [[ -d $image/etc ]] && lower+=:$image/etc
    mkdir -p "$dir/etc" "$dir/.etc-upper" "$dir/.etc-work"
    mount -t overlay pod-etc -o "lowerdir=$lower:/etc,upperdir=$dir/.etc-upper,workdir=$dir/.etc-work" "$r/etc"
    if [[ -d $image/usr/local ]]; then
        mount -t overlay pod-usr-local -o "lowerdir=$image/usr/local:/usr/local" "$r/usr/local"
    fi
    [[ -d $image/opt ]] && mount --bind "$image/opt" "$r/opt"
    mkdir -p "$dir/home"
    mount --bind "$dir/home" "$r/home"
    for v in "${vols[@]}"; do
        IFS=: read -r src dst mode <<<"$v"
        mkdir -p "$r$dst"
        mount --bind "$src" "$r$dst"
        [[ $mode == ro ]] && mount -o remount,bind,ro "$r$dst"
    done
    hostname "$host"
    exec chroot "$r" setpriv --reuid "${user%:*}" --regid "${user#*:}" --clear-groups \
        env -i "${envs[@]}" sh -c 'cd "$0" && exec "$@"' "$workdir" "$@"
fi

image='' dir='' netns='' host='' user='' workdir=/ envs=() vols=()
while getopts ':r:d:n:h:u:w:e:v:' opt; do
    case $opt in
        r) image=$(realpath "$OPTARG") ;;
        d) dir=$OPTARG ;;
        n) netns=$OPTARG ;;
        h) host=$OPTARG ;;
        u) user=$OPTARG ;;
        w) workdir=$OPTARG ;;
        e) envs+=("$OPTARG") ;;
        v) vols+=("$OPTARG") ;;
        *) die "bad option -$OPTARG (see the header of $0)" ;;
    esac
done
shift $((OPTIND - 1))
[[ -n $image && -n $dir && -n $netns && -n $host && -n $user && $# -gt 0 ]] ||
    die "usage: pod.sh -r IMAGE_ROOT -d POD_DIR -n NETNS -h HOSTNAME -u UID:GID [-w DIR] [-e K=V]... [-v SRC:DST[:ro]]... -- COMMAND..."
[[ $user =~ ^[0-9]+:[0-9]+$ ]] || die "-u $user: numeric UID:GID"
[[ -e /run/netns/$netns ]] || die "no network namespace $netns"
mkdir -p "$dir"
dir=$(realpath "$dir")
: >"$dir/env"
: >"$dir/volumes"
((${#envs[@]} == 0)) || printf '%s\0' "${envs[@]}" >"$dir/env"
((${#vols[@]} == 0)) || printf '%s\0' "${vols[@]}" >"$dir/volumes"
exec nsenter --net="/run/netns/$netns" unshare --mount --uts --pid --fork --propagation private \
    "$(realpath "$0")" --inside "$dir" "$image" "$host" "$user" "$workdir" "$@"
