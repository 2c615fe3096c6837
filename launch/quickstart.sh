#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install, build, generate a small dataset,
# and run a verified 4-rank global shuffle with mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
cargo build --release
bin=target/release/meshfeed
work=${MESHFEED_QUICKSTART_DIR:-/tmp/meshfeed-quickstart}
rm -rf "$work"

echo "== generate 40000 samples (image u8[3,32,32] + label i64) in 8 .npy files"
"$bin" gen --format npy --samples 40000 --files 8 --field image:u8:3x32x32 --field label:i64 --out "$work/data"
"$bin" inspect --data "$work/data"

echo "== 4-rank global shuffle, 3 epochs, verified, dumped to $work/dump"
# As root OpenMPI needs --allow-run-as-root; 4 ranks on fewer cores need
# --oversubscribe and yield-when-idle (README, "Running under MPI": the same as variables).
mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 4 \
    "$bin" run --data "$work/data" --batch-size 256 --epochs 3 --seed 42 --verify --dump "$work/dump"
echo "== first line of rank 0's dump:"
head -c 300 "$work/dump/rank-0.jsonl"; echo " ..."
