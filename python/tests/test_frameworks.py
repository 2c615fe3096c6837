"""meshfeed inside JAX and PyTorch jobs: JAX global arrays built from processes that drive
several devices each equal the command line's one-rank-per-device placement; UCX joins
through JAX's and torch.distributed's own stores (torchrun, whose store holds
MASTER_PORT); batches reach torch through DLPack; the examples train and their loss falls.

Needs jax and torch (CPU) in the test venv, as `launch/setup.sh --test` installs them.
"""

import json
import re
import socket
import sys
from pathlib import Path

import pytest

from test_loader import BIN, ENV, MPIRUN, ok, read_dump, run

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "examples"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    d = tmp_path_factory.mktemp("data") / "npy"
    ok(run([BIN, "gen", "--format", "npy", "--samples", "600", "--files", "3", "--out", d,
            "--field", "x:f32:4x6", "--field", "y:i64"]))
    return d


JAX_CASES = [
    # (processes, devices per process, mesh, x's sharding, transport)
    (2, 2, "dp=2,tp=2", "dp,tp", "mpi"),  # a process per dp row: its rows, all of x
    (2, 2, "tp=2,dp=2", "dp,tp", "ucx"),  # a process per tp column: every row, half of x
    (4, 2, "dp=4,tp=2", "dp,-,tp", "mpi"),
]


@pytest.mark.parametrize("procs,k,mesh,x,transport", JAX_CASES, ids=[f"{c[2]}-np{c[0]}x{c[1]}-{c[4]}" for c in JAX_CASES])
def test_jax_global_arrays_equal_one_rank_per_device(npy, tmp_path, procs, k, mesh, x, transport):
    devices = procs * k
    cli = tmp_path / "cli"
    ok(run(MPIRUN + ["-np", devices, BIN, "run", "--data", npy, "--batch-size", "12", "--epochs", "2", "--seed", "5",
                     "--mesh", mesh, "--shard", f"x={x}", "--window-bytes", "2K", "--dump", cli]))
    options = {"data": [str(npy)], "batch_size": 12, "seed": 5, "mesh": mesh, "shard": {"x": x},
               "window_bytes": "2K", "transport": transport}
    out = tmp_path / "jax"
    env = dict(ENV, XLA_FLAGS=f"--xla_force_host_platform_device_count={k}", UCX_NET_DEVICES="lo")
    # Over UCX no RANK/MASTER_* is set: the loader can only join through JAX's store.
    r = ok(run(MPIRUN + ["-x", "XLA_FLAGS", "-x", "UCX_NET_DEVICES", "-np", procs, sys.executable, HERE / "jax_job.py",
                         json.dumps(options), out, 2, f"127.0.0.1:{free_port()}"], env=env))
    assert sorted(re.findall(r"ok process (\d+)", r.stdout)) == [str(p) for p in range(procs)], r.stdout
    expected = read_dump(cli, devices)
    assert sum(len(lines) for lines in expected) == 2 * 50 * devices
    assert read_dump(out, devices) == expected


TORCHRUN = [Path(sys.executable).with_name("torchrun")]


@pytest.mark.parametrize("mode", ["store", "env"])
def test_torchrun_joins_over_ucx_without_taking_its_port(npy, tmp_path, mode):
    cli = tmp_path / "cli"
    ok(run(MPIRUN + ["-np", 2, BIN, "run", "--data", npy, "--batch-size", "12", "--epochs", "2", "--seed", "5",
                     "--window-bytes", "2K", "--dump", cli]))
    out = tmp_path / "torch"
    options = {"data": [str(npy)], "batch_size": 12, "seed": 5, "window_bytes": "2K"}
    env = dict(ENV, UCX_NET_DEVICES="lo")
    if mode == "env":
        env.update(MESHFEED_MASTER_PORT=str(free_port()), MESHFEED_JOB_TOKEN="torchrun-test")
    r = ok(run(TORCHRUN + ["--standalone", "--nproc-per-node", 2, HERE / "torch_job.py", json.dumps(options), out, 2,
                           mode], env=env))
    assert sorted(re.findall(r"ok rank (\d) local (\d)", r.stdout)) == [("0", "0"), ("1", "1")], r.stdout + r.stderr
    assert read_dump(out, 2) == read_dump(cli, 2)
