#!/usr/bin/env bash
# A scaling sweep on Slurm: one job per point of a grid, run one after another (each
# with its nodes to itself), each writing its telemetry to RESULTS/<sweep>/<point>/;
# then `meshfeed report` of the results: the table, the plots and the cost model's
# prediction.
#
#   bash slurm/sweep.sh SWEEP.toml [RESULTS_DIR]       # default RESULTS_DIR: results
#
# SWEEP.toml (every grid key optional but nodes; lists are crossed):
#
#   name = "small"                    # the results directory's name
#   data = "/shared/datasets/train"   # as the nodes see it
#   epochs = 1
#   verify = true                     # check exactly-once in every run
#   drop_caches = "bash slurm/cluster.sh drop-caches"   # run before each point (cold reads)
#   storage_bytes = "bash slurm/cluster.sh storage-bytes" # prints the bytes read from the
#                                     # shared storage so far: sampled around each point,
#                                     # the report shows each loader's reads (× the data)
#   [grid]
#   nodes = [1, 2, 4]
#   ranks_per_node = [2]
#   batch_size = [64]
#   window_bytes = ["8M"]
#   transport = ["mpi"]               # mpi | ucx
#   loader = ["meshfeed", "broadcast", "pytorch"]
#       # broadcast: the single-loader baseline; pytorch: DataLoader + DistributedSampler
#       # (bench/torch_loader.py, random reads from every rank; needs torch in `python`)
#   format = "npy"                    # the dataset's format (for the pytorch loader)
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
bin=${MESHFEED_BIN:-$(command -v meshfeed || echo "$here/../target/release/meshfeed")}
[[ -x $bin ]] || { echo "sweep: no meshfeed binary at $bin (cargo build --release, or MESHFEED_BIN)" >&2; exit 1; }

# The grid's points, one JSON object per line (Python's tomllib reads the TOML).
points=$(python3 - "$sweep" <<'PY'
import itertools, json, sys, tomllib
with open(sys.argv[1], "rb") as f:
    s = tomllib.load(f)
for key in ("name", "data"):
    if key not in s:
        sys.exit(f"sweep: {sys.argv[1]}: no '{key}'")
grid = s.get("grid", {})
if "nodes" not in grid:
    sys.exit(f"sweep: {sys.argv[1]}: no [grid] nodes")
keys = ["nodes", "ranks_per_node", "batch_size", "window_bytes", "transport", "loader"]
defaults = {"ranks_per_node": [1], "batch_size": [64], "window_bytes": ["64M"], "transport": ["mpi"], "loader": ["meshfeed"]}
unknown = set(grid) - set(keys)
if unknown:
    sys.exit(f"sweep: {sys.argv[1]}: unknown grid keys {sorted(unknown)} (known: {keys})")
values = [grid.get(k, defaults.get(k)) for k in keys]
for combo in itertools.product(*values):
    p = dict(zip(keys, combo))
    if p["loader"] not in ("meshfeed", "broadcast", "pytorch"):
        sys.exit(f"sweep: loader '{p['loader']}': expected meshfeed, broadcast or pytorch")
    if p["loader"] == "pytorch" and p["transport"] != grid.get("transport", ["mpi"])[0]:
        continue  # the PyTorch baseline has no transport: run it once per other point
    p.update(sweep=s["name"], data=s["data"], epochs=s.get("epochs", 1), verify=bool(s.get("verify", False)),
             drop_caches=s.get("drop_caches", ""), storage_bytes=s.get("storage_bytes", ""),
             format=s.get("format", "npy"), python=s.get("python", "python3"),
             pytorch_workers=str(s.get("pytorch_workers", "0,1,2")),
             predict=str(s.get("predict", "1,2,4,8,16,32,64,128,256,512,1024,2048,4096")))
    p["id"] = "{loader}-n{nodes}x{ranks_per_node}-b{batch_size}-w{window_bytes}-{transport}".format(**p)
    if p["loader"] == "pytorch":
        p["id"] = "pytorch-n{nodes}x{ranks_per_node}-b{batch_size}".format(**p)
    print(json.dumps(p))
PY
)
name=$(head -1 <<<"$points" | python3 -c 'import json,sys; print(json.load(sys.stdin)["sweep"])')
predict=$(head -1 <<<"$points" | python3 -c 'import json,sys; print(json.load(sys.stdin)["predict"])')
out=$results/$name
mkdir -p "$out"
total=$(wc -l <<<"$points")
echo "sweep: $total point(s) into $out"
i=0
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
    launch=(srun --mpi="${MESHFEED_SRUN_MPI:-pmix}" "$bin")
    # UCX ranks find each other through the rendezvous: rank 0's node, a port, a token.
    [[ $transport == ucx ]] && launch=(srun --mpi=none "$here/ucx_task.sh" "$bin")
    if [[ $loader == pytorch ]]; then
        launch=(srun --mpi=none "$python" "$here/../bench/torch_loader.py")
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
