#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: install, build once in release
# mode, run unit, doc and multi-rank (real mpirun) tests. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh --test
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HDF5_USE_FILE_LOCKING=FALSE
cargo build --release --all-targets
# Two test threads: multi-rank tests oversubscribe the 2 cores already.
cargo test --release -- --test-threads=2
# Without UCX development files the crate still builds with the ucx feature off, and
# selecting UCX is a clear error (built last: it replaces target/release/meshfeed).
cargo build --release --no-default-features
if RANK=0 WORLD_SIZE=1 target/release/meshfeed run --transport ucx --data x --batch-size 1 2>/tmp/meshfeed-noucx.err; then
    echo "FAIL: --transport ucx without the ucx feature succeeded"; exit 1
fi
grep -q "built without the \`ucx\` feature" /tmp/meshfeed-noucx.err || { cat /tmp/meshfeed-noucx.err; echo "FAIL: unclear error without ucx"; exit 1; }
echo "no-ucx build check: OK"
