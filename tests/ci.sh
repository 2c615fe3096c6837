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
