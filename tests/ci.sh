#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: install, lint (rustfmt, clippy,
# rustdoc, shellcheck, ruff, mypy), build the workspace once in release mode, run unit, doc
# and multi-rank (real mpirun, meshfeed launch) tests and
# the examples; then check that the library builds without each optional feature and that
# the command line names a missing feature. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's start, in seconds since this script began: where CI's time goes.
stage() { echo "== [${SECONDS} s] $*"; }
stage "setup"
bash launch/setup.sh --test
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HDF5_USE_FILE_LOCKING=FALSE
# Habits made mechanical, first (they fail in minutes): formatting, the workspace's lints
# (Cargo.toml [workspace.lints]), the library's docs with their links, the scripts, the
# Python code (ruff.toml) and the package's types.
stage "lints"
cargo fmt --all --check
cargo clippy --release --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --release -p meshfeed -p meshfeed-analysis --no-deps --document-private-items
# (The command line apart: its binary's docs and the library's share target/doc/meshfeed.)
RUSTDOCFLAGS="-D warnings" cargo doc --release -p meshfeed-cli --no-deps --document-private-items
mapfile -t scripts < <(git ls-files '*.sh' '*.sbatch')
shellcheck -S warning "${scripts[@]}" .ci/run
.venv/bin/ruff check .
.venv/bin/mypy --strict python/pysrc/meshfeed
stage "build"
cargo build --release --workspace --all-targets
# The Python package (python/, PyO3 + maturin), installed the way users install it, before
# any test: tests/emulation/launchers.rs runs the Ray Train example, which imports it,
# on a multi-node Ray cluster. (maturin's build hook runs the `maturin` program: the venv's bin
# goes on PATH.)
PATH="$PWD/.venv/bin:$PATH" .venv/bin/pip install -q --disable-pip-version-check --no-build-isolation ./python
# Stage 1: the loader's behaviour. Unit tests, the behaviour tests (tests/behaviour: one
# binary) and doc tests; two test threads: multi-rank tests oversubscribe the 2 cores
# already. The deployment emulations are stage 2, below. (The Python extension's library
# has no Rust tests, `test = false`, which naming `--lib` would override.)
stage "stage 1: unit, doc and behaviour tests"
cargo test --release --workspace --exclude meshfeed-python --no-fail-fast --lib --bins --test behaviour --test floors \
    -- --test-threads=2
cargo test --release --workspace --no-fail-fast --doc -- --test-threads=2
# The Python package tested from Python under real mpirun and the UCX launcher against
# the command line.
stage "stage 1: the Python package"
.venv/bin/python -m pytest -q -p no:cacheprovider python/tests
# Every command the documentation tells people to run, as written (README.md, python/README.md,
# docs/*.md, the examples' docstrings; only dataset paths and sizes are substituted:
# tests/docs/README.md), and every relative link of the documents.
stage "stage 1: the documented commands"
.venv/bin/python tests/docs/run.py
# The benchmark suite's smoke version (seconds, tiny data, no PyTorch, no ratios asserted):
# every measurement mode and the report's table and plots, so that the suite cannot rot.
# (--no-build: the binary built above, with the workspace's features; building the
# command line alone would compile the library again with another feature set.)
stage "stage 1: benchmark smokes"
bash bench/run.sh --smoke --no-build --out "$(mktemp -d)/bench-smoke"
# The cold-storage smoke (seconds): a throttled loop device and a memory cgroup; the data
# kept in memory is read from the device once and never after, no OOM kill; a feeder
# whose memory budget holds half the data, in a cgroup that cannot hold it all, serves a
# job every sample without an OOM kill. Where the kernel lacks the controllers it prints
# why it skipped (never a silent pass).
bash bench/run.sh --cold --smoke --no-build

# Stage 2: the deployment emulations (tests/emulation: one binary), once the loader's
# behaviour passed: the image's recipe, the MPIJob on emulated pods of the image, a
# preempted Kubernetes Job, a multi-node Ray cluster and a two-node Slurm, each node or
# pod a network namespace (launch/netns.sh). Before the feature builds below: they need
# the binary with every feature. (Selected as stage 1 selects, so that cargo reuses its
# build: `-p meshfeed` alone unifies dependencies' features differently.)
stage "stage 2: deployment emulations"
cargo test --release --workspace --exclude meshfeed-python --no-fail-fast --test emulation -- --test-threads=2

# The library does not depend on the command line's crates.
if cargo tree -p meshfeed --edges normal --prefix none | grep -E "^(clap|indicatif|toml) "; then
    echo "FAIL: the meshfeed library depends on a command-line crate"; exit 1
fi
# Each optional capability can be left out: the library and the command line compile
# without each one and without all of them (type-checked: `cargo check` reuses clippy's
# dependencies and takes seconds a combination), and a command line built without them
# says which feature is missing when asked for each. (That one is built unoptimised and
# without debug information, in target/debug: only its messages are checked, and it
# compiles in about half a release build's time.)
stage "feature checks"
cargo check --release -p meshfeed --no-default-features
for features in hdf5,ucx mpi,ucx mpi,hdf5; do
    cargo check --release -p meshfeed-cli --no-default-features --features "$features"
done
CARGO_PROFILE_DEV_DEBUG=0 cargo build -p meshfeed-cli --no-default-features
err=$(mktemp)
expect_missing() { # FEATURE COMMAND...: the command fails naming the feature
    local feature=$1; shift
    if "$@" >/dev/null 2>"$err"; then echo "FAIL: '$*' succeeded without the $feature feature"; exit 1; fi
    grep -q "built without the \`$feature\` feature" "$err" || { cat "$err"; echo "FAIL: unclear error without $feature"; exit 1; }
    echo "without $feature: '$*' names the feature: OK"
}
bin=target/debug/meshfeed
expect_missing mpi "$bin" run --transport mpi --data x --batch-size 1
# --transport auto (the default) names the feature it would need: MPI under mpirun's
# variables, UCX under torchrun's / meshfeed launch's.
expect_missing mpi env OMPI_COMM_WORLD_SIZE=2 "$bin" run --data x --batch-size 1
expect_missing hdf5 "$bin" gen --format hdf5 --samples 4 --field x:u8 --out "$(mktemp -d)"
expect_missing ucx env RANK=0 WORLD_SIZE=1 "$bin" run --transport ucx --data x --batch-size 1
expect_missing ucx env RANK=0 WORLD_SIZE=2 "$bin" run --data x --batch-size 1
echo "feature checks: OK"
stage "done"
