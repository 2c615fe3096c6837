#!/usr/bin/env bash
# A scaling sweep on Slurm: one job per point of a grid, run one after another (each
# with its nodes to itself), each writing its telemetry to RESULTS/<sweep>/<point>/;
# then `meshfeed report` of the results: the table, the plots and the cost model's
# prediction.
#
#   bash slurm/sweep.sh SWEEP.toml [RESULTS_DIR]       # default RESULTS_DIR: results
#
# The whole sweep is validated first (slurm/sweep_points.py): every key's type, range or
# allowed values, unknown keys (top-level and in [grid]) and the name; every problem is
# printed with its key (`sweep: sweep.toml: grid.nodes[0]: 0: expected an integer >= 1`)
# and then nothing is submitted (exit 1). So is a missing, unreadable, non-UTF-8 or
# malformed file, in one line.
#
# SWEEP.toml (name, data and grid.nodes required; each grid key is a list of values or
# one value, which counts as a one-item list; lists are crossed, a value at most once):
#
#   name = "small"                    # the results directory's name: letters, digits,
#                                     # '-', '_', '.' (not '.' or '..')
#   data = "/shared/datasets/train"   # as the nodes see it
#   epochs = 1                        # >= 1
#   verify = true                     # check exactly-once in every run
#   drop_caches = "bash slurm/cluster.sh drop-caches"   # run before each point (cold reads)
#   storage_bytes = "bash slurm/cluster.sh storage-bytes" # prints the bytes read from the
#                                     # shared storage so far: sampled around each point,
#                                     # the report shows each loader's reads (× the data)
#   [grid]
#   nodes = [1, 2, 4]                 # integers >= 1, as ranks_per_node and batch_size
#   ranks_per_node = [2]
#   batch_size = [64]
#   window_bytes = ["8M"]             # sizes as meshfeed takes them: 65536, "8M", "1G"
#   transport = ["mpi"]               # mpi | ucx
#   loader = ["meshfeed", "broadcast", "pytorch"]
#       # broadcast: the single-loader baseline; pytorch: DataLoader + DistributedSampler
#       # (bench/torch_loader.py, random reads from every rank; needs torch in `python`)
#   format = "npy"                    # the dataset's format (for the pytorch loader):
#                                     # npy | hdf5 | arrow | raw (pytorch: not raw)
#   python = "python3"                # the pytorch loader's interpreter
#   pytorch_workers = "0,1,2"         # DataLoader worker counts it tries (the best counts)
#   predict = "16,64,256,1024,4096"   # node counts the cost model predicts ("": none;
#                                     # default 1,2,4,...,4096, when a meshfeed point ran)
#
# Each point's directory holds point.json (its configuration), run.json and
# rank-<r>.jsonl (meshfeed's telemetry: hosts, versions, time per phase, bytes), job.out
# and, with storage_bytes, storage.json (bytes read from the shared storage during the
# point); records join without wrapper scripts. The report's plots go to
# RESULTS/<sweep>/plots. Runs go through sbatch -W with srun --mpi=pmix (MPICH builds:
# MESHFEED_SRUN_MPI=pmi2); SLURM_CONF must
# point at the cluster (slurm/cluster.sh env). The meshfeed binary: MESHFEED_BIN, PATH,
# or this checkout's build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sweep=${1:?usage: sweep.sh SWEEP.toml [RESULTS_DIR]}
results=${2:-results}
# The grid's points, one JSON object per line: the whole sweep is checked first (every
# problem named, nothing submitted when there is one).
command -v python3 >/dev/null || { echo "sweep: python3 (3.11 or later) is needed to read $sweep" >&2; exit 1; }
points=$(python3 "$here/sweep_points.py" "$sweep") || exit 1
bin=${MESHFEED_BIN:-$(command -v meshfeed || echo "$here/../target/release/meshfeed")}
[[ -x $bin ]] || { echo "sweep: no meshfeed binary at $bin (cargo build --release, or MESHFEED_BIN)" >&2; exit 1; }

name=$(head -1 <<<"$points" | python3 -c 'import json,sys; print(json.load(sys.stdin)["sweep"])')
predict=$(head -1 <<<"$points" | python3 -c 'import json,sys; print(json.load(sys.stdin)["predict"])')
out=$results/$name
mkdir -p "$out"
total=$(wc -l <<<"$points")
echo "sweep: $total point(s) into $out"
i=0
# Each point's keys, which the eval below sets.
id='' nodes='' ranks_per_node='' loader='' verify=0
while IFS= read -r point; do
    i=$((i + 1))
    eval "$(python3 -c 'import json,shlex,sys
p = json.loads(sys.argv[1])
for k in ("id", "nodes", "ranks_per_node", "batch_size", "window_bytes", "transport", "loader", "data", "epochs",
          "drop_caches", "storage_bytes", "format", "python", "pytorch_workers"):
    print(f"{k}={shlex.quote(str(p[k]))}")
print("verify=" + ("1" if p["verify"] else "0"))' "$point")"
    dir=$(cd "$out" && pwd)/$id
    rm -rf "$dir" && mkdir -p "$dir"
    echo "$point" >"$dir/point.json"
    args=(run --data "$data" --batch-size "$batch_size" --window-bytes "$window_bytes" --epochs "$epochs"
        --transport "$transport" --telemetry "$dir" --json --heartbeat 0)
    [[ $loader == broadcast ]] && args+=(--exchange broadcast)
    ((verify)) && args+=(--verify)
    launch=(srun --kill-on-bad-exit=1 --mpi="${MESHFEED_SRUN_MPI:-pmix}" "$bin")
    # UCX ranks find each other through the rendezvous: rank 0's node, a port, a token.
    [[ $transport == ucx ]] && launch=(srun --kill-on-bad-exit=1 --mpi=none "$here/ucx_task.sh" "$bin")
    if [[ $loader == pytorch ]]; then
        launch=(srun --kill-on-bad-exit=1 --mpi=none "$python" "$here/../bench/torch_loader.py")
        args=(--data "$data" --format "$format" --batch-size "$batch_size" --epochs "$epochs" --workers "$pytorch_workers"
            --out "$dir/pytorch.jsonl" --tag "$id")
    fi
    echo "sweep: [$i/$total] $id ($(date +%T))"
    if [[ -n $drop_caches ]]; then
        bash -c "$drop_caches" || { echo "sweep: drop_caches failed: $drop_caches" >&2; exit 1; }
    fi
    MESHFEED_JOB_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    export MESHFEED_JOB_TOKEN
    storage() { [[ -z $storage_bytes ]] || bash -c "$storage_bytes" || { echo "sweep: storage_bytes failed: $storage_bytes" >&2; exit 1; }; }
    before=$(storage)
    if ! sbatch -W --exclusive -N "$nodes" --ntasks-per-node "$ranks_per_node" -J "sweep-$id" -o "$dir/job.out" \
        --wrap "$(printf '%q ' "${launch[@]}" "${args[@]}")" >/dev/null; then
        echo "sweep: $id failed; see $dir/job.out" >&2
        tail -5 "$dir/job.out" >&2 || true
        exit 1
    fi
    if [[ -n $storage_bytes ]]; then
        after=$(storage)
        echo "{\"storage_bytes\": $((after - before))}" >"$dir/storage.json"
    fi
done <<<"$points"
# The table, the plots and, where meshfeed ran, the cost model's prediction.
report=(report --plots "$out/plots")
if [[ -n $predict ]] && grep -q '"loader": "meshfeed"' <<<"$points"; then
    report+=(--predict "$predict")
fi
"$bin" "${report[@]}" "$out"
