#!/usr/bin/env bash
# Installs what meshfeed needs on Debian 12, as root: OpenMPI, HDF5, UCX and libclang
# (system packages; fontconfig, FreeType and a font for the benchmark's plots), and with
# --test a Python venv (.venv) with what the tests use (numpy, h5py, pyarrow, Ray, torch, JAX,
# ...). Safe to
# run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(libopenmpi-dev openmpi-bin libhdf5-dev libucx-dev ucx-utils libclang-dev pkg-config gcc util-linux
    libfontconfig1-dev libfreetype-dev fonts-dejavu-core)
if [[ "${1:-}" == "--test" ]]; then
    # iproute2: the tests' emulated nodes and pods (network namespaces); openssh: the
    # MPIJob's workers run sshd, its launcher ssh (tests/emulation/mpijob.rs).
    packages+=(python3 python3-venv iproute2 openssh-client openssh-server
        e2fsprogs # e2fsprogs: mkfs.ext4 for the cold-storage benchmark's loop devices
        shellcheck) # the scripts' lint (tests/ci.sh)
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A python3 outside Debian's packages (pyenv) that can make venvs is fine too.
if [[ "${1:-}" == "--test" ]] && python3 -m venv --help >/dev/null 2>&1; then
    missing=("${missing[@]/python3-venv}")
    missing=("${missing[@]/python3}")
fi
read -r -a missing <<<"${missing[*]:-}"
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
    echo "setup: meshfeed needs Rust >= 1.85 (cargo); install it with rustup (https://rustup.rs)" >&2
    exit 1
fi

if [[ "${1:-}" == "--test" ]]; then
    # numpy/h5py/pyarrow/pandas/webdataset/megatron-core/datasets write the test fixtures (Pillow the
    # WebDataset example's JPEGs); ray and kubernetes-validate test the
    # Ray launcher and the Kubernetes manifests; maturin builds the Python package and
    # pytest tests it (mpi4py: MPI initialised by another library; torch, jax and Ray Train
    # run the framework tests and the examples on the CPU: PyPI's torch brings CUDA
    # libraries, ~5 GB, about a minute and a half to download here).
    if ! .venv/bin/python -c "import numpy, h5py, pyarrow, pandas, webdataset, megatron.core, datasets, PIL, ray.train, kubernetes_validate, maturin, pytest, mpi4py, torch, jax, ruff, mypy" 2>/dev/null; then
        echo "setup: creating .venv with numpy, h5py, pyarrow, pandas, webdataset, megatron-core, datasets, pillow, ray[train], kubernetes-validate, maturin, pytest, mpi4py, torch, jax, ruff, mypy (tests)"
        python3 -m venv .venv
        .venv/bin/pip install -q --disable-pip-version-check numpy h5py pyarrow pandas webdataset megatron-core datasets pillow "ray[train]" kubernetes-validate maturin \
            pytest mpi4py torch jax ruff mypy
    fi
fi
echo "setup: OK"
