#!/usr/bin/env bash
# meshfeed's benchmark suite (issue 10), in one command:
#
#   bash bench/run.sh                 # the full suite (~20 min on 2 cores)
#   bash bench/run.sh --smoke         # seconds: tiny data, npy, ranks 1 and 2, no PyTorch
#   bash bench/run.sh --cold [ARGS]   # cold storage (bench/cold.py: as root; ~2 h;
#                                     # --cold --smoke: seconds, what CI runs)
#   bash bench/run.sh --no-build ...  # either, with target/release/meshfeed as it is (CI
#                                     # builds the workspace once, before)
#
# It installs what it needs (launch/setup.sh; bench/.venv with torch, numpy, h5py, pyarrow
# unless --smoke or --no-torch), builds the release binary once, generates the datasets
# into bench/data (reused when present), then for every dataset, format and rank count
# runs `meshfeed bench` (meshfeed, the broadcast and random-access baselines, the read,
# exchange and memcpy limits) and bench/torch_loader.py (PyTorch DataLoader +
# DistributedSampler, best of 0, 1, 2 workers) under mpirun; the scaling runs (dataset
# size, window budget) and the overlap with a simulated step follow. Every measurement is
# a JSON line in OUT/results.jsonl; `meshfeed bench report` turns them into OUT/report.md
# (the table of ratios) and PNG/SVG plots in OUT.
#
# Options:
#   --smoke            the CI version (no ratios asserted; the PyTorch script is only compiled)
#   --out DIR          results directory [bench/results/<UTC timestamp>]
#   --sizes LIST       datasets: small (256 B), medium (16 KiB), imagenet (147 KiB), large (1 MiB)
#   --formats LIST     npy,hdf5,arrow
#   --ranks LIST       rank counts [1,2,4,... up to max(4, nproc)]
#   --repeats N        timed epochs per meshfeed measurement (best and median reported) [3]
#   --torch-epochs N   timed epochs per PyTorch worker count, after an untimed one [1]
#   --no-torch         skip the PyTorch baseline (and its 5 GB venv)
#   --no-scaling       skip the dataset-size, window-budget and overlap runs
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

smoke=0 torch=1 scaling=1 repeats=3 torch_epochs=1 out="" sizes="" formats="" ranks=""
# --no-build, anywhere: use the binary already built.
build=1 args=()
for a in "$@"; do if [[ $a == --no-build ]]; then build=0; else args+=("$a"); fi; done
set -- "${args[@]}"
build_cli() {
    ((build)) || return 0
    # The workspace's default members (the library and the command line), as the quickstart
    # builds them: after `cargo build --release --workspace` this compiles nothing, where
    # `-p meshfeed-cli` alone would unify dependencies' features differently and rebuild.
    cargo build --release 2>&1 | grep -E "^(error|warning: unused)|Finished" || true
}
if [[ "${1:-}" == "--cold" ]]; then
    # The cold-storage benchmark: throttled loop devices, memory cgroups, PyTorch's two
    # variants beside meshfeed's strategies (bench/cold.py --help). Its own options follow.
    shift
    cold_smoke=0
    for a in "$@"; do [[ $a == --smoke ]] && cold_smoke=1; done
    bash launch/setup.sh >/dev/null
    build_cli
    if ((!cold_smoke)) && [[ " $* " != *" --no-torch "* ]] &&
        ! bench/.venv/bin/python -c "import torch, numpy, h5py, pyarrow" 2>/dev/null &&
        ! .venv/bin/python -c "import torch, numpy, h5py, pyarrow" 2>/dev/null; then
        echo "[bench] setup: creating bench/.venv with torch (CPU use), numpy, h5py, pyarrow (~1 min, ~5 GB)" >&2
        python3 -m venv bench/.venv
        bench/.venv/bin/pip install -q --disable-pip-version-check torch numpy h5py pyarrow
    fi
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HDF5_USE_FILE_LOCKING=FALSE
    exec python3 bench/cold.py "$@"
fi
while (($#)); do
    case "$1" in
        --smoke) smoke=1 ;;
        --no-torch) torch=0 ;;
        --no-scaling) scaling=0 ;;
        --out) out=$2; shift ;;
        --sizes) sizes=$2; shift ;;
        --formats) formats=$2; shift ;;
        --ranks) ranks=$2; shift ;;
        --repeats) repeats=$2; shift ;;
        --torch-epochs) torch_epochs=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench/run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

# Datasets: name, fields, samples, window budget, global batch. Each is at least 8 window
# budgets per rank at 4 ranks (the window budget scales with the sample size so that the
# small samples stay within a PyTorch epoch of seconds); large samples use a batch of 64
# (64 MiB per step: a batch of 256 would not fit any window budget here).
declare -A FIELDS=([small]="x:u8:248 label:i64" [medium]="x:u8:16376 label:i64"
    [imagenet]="x:u8:3x224x224 label:i64" [large]="x:u8:1048568 label:i64" [tiny]="x:u8:1016 label:i64")
declare -A SAMPLES=([small]=131072 [medium]=16384 [imagenet]=3584 [large]=512 [tiny]=4096)
declare -A WINDOW=([small]=1M [medium]=8M [imagenet]=16M [large]=16M [tiny]=256K)
declare -A BATCH=([small]=4096 [medium]=1024 [imagenet]=256 [large]=64 [tiny]=64)

if ((smoke)); then
    torch=0
    repeats=1
    : "${sizes:=tiny}" "${formats:=npy}" "${ranks:=1,2}"
else
    : "${sizes:=small,medium,imagenet,large}" "${formats:=npy,hdf5,arrow}"
    if [[ -z "$ranks" ]]; then
        n=$(nproc) p=1 ranks=1
        while ((p * 2 <= (n > 4 ? n : 4))); do p=$((p * 2)); ranks+=",$p"; done
    fi
fi
IFS=, read -r -a sizes <<<"$sizes"
IFS=, read -r -a formats <<<"$formats"
IFS=, read -r -a ranks <<<"$ranks"
for s in "${sizes[@]}"; do
    [[ -n "${FIELDS[$s]:-}" ]] || { echo "bench/run.sh: unknown size '$s' (small, medium, imagenet, large, tiny)" >&2; exit 2; }
done
for f in "${formats[@]}"; do
    [[ "$f" =~ ^(npy|hdf5|arrow)$ ]] || { echo "bench/run.sh: unknown format '$f' (npy, hdf5, arrow)" >&2; exit 2; }
done
most=${ranks[-1]}
out=${out:-bench/results/$(date -u +%Y%m%dT%H%M%SZ)$( ((smoke)) && echo -smoke)}
mkdir -p "$out/logs"
results=$out/results.jsonl
start=$SECONDS
step() { printf "[bench %4ds] %s\n" $((SECONDS - start)) "$*" >&2; } # stderr: gen's stdout is its result

# --- install and build ---------------------------------------------------------------
step "setup: system packages (launch/setup.sh)"
bash launch/setup.sh >"$out/logs/setup.log" 2>&1 || { cat "$out/logs/setup.log"; exit 1; }
py=bench/.venv/bin/python
if ((torch)); then
    if ! "$py" -c "import torch, numpy, h5py, pyarrow" 2>/dev/null; then
        step "setup: creating bench/.venv with torch (CPU use), numpy, h5py, pyarrow (~1 min, ~5 GB)"
        python3 -m venv bench/.venv
        bench/.venv/bin/pip install -q --disable-pip-version-check torch numpy h5py pyarrow
    fi
fi
((build)) && step "build: cargo build --release"
build_cli
bin=$root/target/release/meshfeed
[[ -x "$bin" ]] || { echo "bench/run.sh: the build did not produce $bin" >&2; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HDF5_USE_FILE_LOCKING=FALSE
mpi=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1)

# --- data ------------------------------------------------------------------------------
# gen NAME FORMAT SAMPLES: bench/data/NAME-FORMAT[-SAMPLES], reused once complete.
gen() {
    local name=$1 fmt=$2 samples=$3 dir=bench/data/$1-$2
    [[ $samples != "${SAMPLES[$name]}" ]] && dir+=-$samples
    if [[ ! -e $dir/.complete ]]; then
        rm -rf "$dir"
        local fields=() f
        for f in ${FIELDS[$name]}; do fields+=(--field "$f"); done
        step "gen: $dir ($samples samples)"
        "$bin" gen --format "$fmt" --samples "$samples" --files 8 "${fields[@]}" --out "$dir" >"$out/logs/gen.log" 2>&1 ||
            { cat "$out/logs/gen.log"; exit 1; }
        touch "$dir/.complete"
    fi
    echo "$dir"
}

# --- measurements ----------------------------------------------------------------------
# rust NAME DIR P TAG WINDOW MODES [extra bench flags]
rust() {
    local name=$1 dir=$2 p=$3 tag=$4 window=$5 modes=$6 log; shift 6
    log=$out/logs/$tag-$(basename "$dir")-np$p-w$window.log
    log=${log//:/_}
    step "meshfeed bench: $tag $(basename "$dir") np $p window $window ($modes)"
    if ! "${mpi[@]}" -np "$p" "$bin" bench --data "$dir" --batch-size "${BATCH[$name]}" --window-bytes "$window" \
        --epochs "$repeats" --modes "$modes" --tag "$tag" --out "$results" "$@" >"$log" 2>&1; then
        cat "$log"; echo "bench/run.sh: meshfeed bench failed (log: $log)" >&2; exit 1
    fi
}
pytorch() { # NAME DIR FORMAT P
    local name=$1 dir=$2 fmt=$3 p=$4 log
    log=$out/logs/pytorch-$(basename "$dir")-np$p.log
    step "pytorch: $(basename "$dir") np $p (workers 0,1,2)"
    if ! "${mpi[@]}" -np "$p" "$py" bench/torch_loader.py --data "$dir" --format "$fmt" --batch-size "${BATCH[$name]}" \
        --epochs "$torch_epochs" --workers 0,1,2 --tag "$name" --window-bytes "$(numfmt --from=iec "${WINDOW[$name]}")" \
        --out "$results" >"$log" 2>&1; then
        cat "$log"; echo "bench/run.sh: the PyTorch baseline failed (log: $log)" >&2; exit 1
    fi
    tail -1 "$log"
}

all_modes=meshfeed,naive,random-access,read-limit,exchange-limit,memcpy-limit
((smoke)) && all_modes=all
for name in "${sizes[@]}"; do
    for fmt in "${formats[@]}"; do
        dir=$(gen "$name" "$fmt" "${SAMPLES[$name]}")
        for p in "${ranks[@]}"; do
            rust "$name" "$dir" "$p" "$name" "${WINDOW[$name]}" "$all_modes"
            ((torch)) && pytorch "$name" "$dir" "$fmt" "$p"
        done
    done
done

if ((scaling)); then
    # Scaling (issue 10, section 4), npy at the most ranks: the dataset size and the window
    # budget at one sample size, and the overlap with a simulated step of each size.
    fmt=npy
    if ((smoke)); then scale=tiny windows="64K 1M" fractions="2"; else scale=medium windows="2M 4M 16M 32M" fractions="4 2"; fi
    n=${SAMPLES[$scale]}
    for k in $fractions; do
        dir=$(gen "$scale" "$fmt" $((n / k)))
        rust "$scale" "$dir" "$most" "scale:dataset" "${WINDOW[$scale]}" meshfeed,read-limit,exchange-limit
    done
    if ((!smoke)); then
        dir=$(gen "$scale" "$fmt" $((n * 2)))
        rust "$scale" "$dir" "$most" "scale:dataset" "${WINDOW[$scale]}" meshfeed,read-limit,exchange-limit
    fi
    dir=$(gen "$scale" "$fmt" "$n")
    for w in $windows; do
        rust "$scale" "$dir" "$most" "scale:window" "$w" meshfeed,exchange-limit
    done
    for name in "${sizes[@]}"; do
        dir=$(gen "$name" "$fmt" "${SAMPLES[$name]}")
        rust "$name" "$dir" "$most" "overlap:$name" "${WINDOW[$name]}" meshfeed --compute-ms auto
    done
fi

# --- report ----------------------------------------------------------------------------
step "report: $out/report.md and plots"
"$bin" bench report --in "$results" --out "$out" | tee "$out/logs/report.log" | sed -n '/^## At/,/^## Every/p' | sed '$d'
if ((torch == 0)); then
    python3 -m py_compile bench/torch_loader.py
    echo "NOTE: the PyTorch baseline was NOT run ($( ((smoke)) && echo "smoke mode" || echo "--no-torch")); bench/torch_loader.py compiles (python3 -m py_compile)."
fi
plots=$(find "$out" -maxdepth 1 \( -name '*.png' -o -name '*.svg' \) | wc -l)
step "done: $(wc -l <"$results") results in $results, table in $out/report.md, $plots plot files in $out ($((SECONDS - start)) s)"
