#!/usr/bin/env bash
# The hot path (read, fill the send buffers, exchange, assemble) of this checkout against
# an earlier revision's, in the same run: both `meshfeed` binaries take turns on the same
# datasets (page cache warm), and the table gives each one's best epoch time and the
# ratio (this checkout / the revision; below 1 is faster).
#
#   bash bench/revisions.sh REV [ROUNDS]      e.g. bash bench/revisions.sh HEAD~5 5
#
# REV is built in a worktree under target/revisions/ (its own target directory: the first
# time takes as long as a fresh build). Runs 4 ranks under mpirun; the datasets (small
# .npy records, read in spans; 4 KiB .npy records, read straight into the send buffer;
# Arrow with a variable-length field) go to target/revisions/data.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: bash bench/revisions.sh REV [ROUNDS]}
rounds=${2:-5}
sha=$(git rev-parse --short "$rev")
work=target/revisions
mkdir -p "$work"

echo "revisions: building this checkout and $rev ($sha)"
cargo build --release -p meshfeed-cli
new=$PWD/target/release/meshfeed
if [[ ! -d "$work/$sha" ]]; then
    git worktree add --detach "$work/$sha" "$sha" >/dev/null
fi
(cd "$work/$sha" && CARGO_TARGET_DIR=$PWD/../target-$sha cargo build --release -p meshfeed-cli)
old=$PWD/$work/target-$sha/release/meshfeed

data=$work/data
if [[ ! -d "$data/arrow" ]]; then
    "$new" gen --format npy --out "$data/small" --samples 1000000 --files 8 --field x:f32:16 --field y:i64
    "$new" gen --format npy --out "$data/large" --samples 50000 --files 8 --field x:u8:4096 --field y:i64
    "$new" gen --format arrow --out "$data/arrow" --samples 500000 --files 8 --field x:f32:16 --field t:bytes
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
out=$work/results.jsonl
: >"$out"
for round in $(seq "$rounds"); do
    for set in small large arrow; do
        for side in new old; do
            bin=$new
            [[ $side == old ]] && bin=$old
            echo "revisions: round $round/$rounds, $set, $side"
            mpirun -np 4 "$bin" bench --data "$data/$set" --batch-size 512 --epochs 3 --modes fused,two-phase \
                --json --tag "$side $set" | grep '^{' >>"$out"
        done
    done
done

python3 - "$out" "$sha" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
best = {}
for r in rows:
    side, data = r["tag"].split()
    best.setdefault((data, r["mode"]), {}).setdefault(side, []).append(r["epoch_s_best"])
print(f"{'dataset':8} {'mode':10} {'this (s)':>10} {sys.argv[2] + ' (s)':>12} {'ratio':>7}")
ratios = []
for (data, mode), sides in sorted(best.items()):
    new, old = statistics.median(sides["new"]), statistics.median(sides["old"])
    ratios.append(new / old)
    print(f"{data:8} {mode:10} {new:10.4f} {old:12.4f} {new / old:7.3f}")
print(f"geometric mean of the ratios: {statistics.geometric_mean(ratios):.3f} "
      f"(median best epoch of {len(rows) // (2 * len(best))} rounds each; below 1: this checkout is faster)")
EOF
