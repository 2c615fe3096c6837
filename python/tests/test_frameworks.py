"""meshfeed inside JAX and PyTorch jobs: JAX global arrays built from processes that drive
several devices each equal the command line's one-rank-per-device placement; UCX joins
through JAX's and torch.distributed's own stores (torchrun, whose store holds
MASTER_PORT); batches reach torch through DLPack; the examples train and their loss falls.

Needs jax and torch (CPU) in the test venv, as `launch/setup.sh --test` installs them.
"""

import json
import os
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


@pytest.mark.parametrize("procs,k,mesh,x,transport", JAX_CASES,
                         ids=[f"{c[2]}-np{c[0]}x{c[1]}-{c[4]}" for c in JAX_CASES])
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


@pytest.mark.parametrize("mode", ["store", "env", "auto", "default"])
def test_torchrun_joins_over_ucx_without_taking_its_port(npy, tmp_path, mode):
    cli = tmp_path / "cli"
    ok(run(MPIRUN + ["-np", 2, BIN, "run", "--data", npy, "--batch-size", "12", "--epochs", "2", "--seed", "5",
                     "--window-bytes", "2K", "--dump", cli]))
    out = tmp_path / "torch"
    options = {"data": [str(npy)], "batch_size": 12, "seed": 5, "window_bytes": "2K"}
    env = dict(ENV, UCX_NET_DEVICES="lo")
    if mode in ("env", "auto"):
        env.update(MESHFEED_MASTER_PORT=str(free_port()), MESHFEED_JOB_TOKEN="torchrun-test")
    r = ok(run(TORCHRUN + ["--standalone", "--nproc-per-node", 2, HERE / "torch_job.py", json.dumps(options), out, 2,
                           mode], env=env))
    assert sorted(re.findall(r"ok rank (\d) local (\d)", r.stdout)) == [("0", "0"), ("1", "1")], r.stdout + r.stderr
    assert read_dump(out, 2) == read_dump(cli, 2)


# A refusing rank waits 3 s before it exits: torchrun stops the other ranks as soon as one
# fails, which could cut a slower rank off before it said anything.
REFUSED_JOB = """
import os, sys, time, meshfeed
try:
    meshfeed.Loader(sys.argv[1], batch_size=12, **({"transport": sys.argv[2]} if len(sys.argv) > 2 else {}))
except meshfeed.Error as e:
    print(f"refused rank {os.environ['RANK']}: {type(e).__name__}: {e}", flush=True)
    time.sleep(3)
    sys.exit(3)
print(f"loaded rank {os.environ['RANK']}", flush=True)
"""


def test_torchrun_never_runs_two_one_rank_loaders(npy, tmp_path):
    """Issue 42: under torchrun a transport="mpi" loader made each process a world of its
    own, loading every batch; it is refused on every rank, naming both sizes. The default
    ("auto") without a process group and without meshfeed's token is refused naming it
    (with a process group it joins through torch's store:
    test_torchrun_joins_over_ucx_without_taking_its_port[default])."""
    script = tmp_path / "job.py"
    script.write_text(REFUSED_JOB)
    env = {k: v for k, v in ENV.items() if k not in ("MESHFEED_JOB_TOKEN", "MESHFEED_MASTER_PORT")}
    for extra, needles in [(["mpi"], ["TransportError", "WORLD_SIZE=2 but MPI_COMM_WORLD has 1 rank(s)"]),
                           ([], ["ConfigError", "WORLD_SIZE=2 is set", "MESHFEED_JOB_TOKEN"])]:
        r = run(TORCHRUN + ["--standalone", "--nproc-per-node", 2, script, npy] + extra, env=dict(env))
        assert r.returncode != 0 and "loaded rank" not in r.stdout, r.stdout + r.stderr
        for rank in (0, 1):
            line = re.search(rf"refused rank {rank}: .*", r.stdout)
            assert line and all(n in line.group(0) for n in needles), r.stdout + r.stderr


@pytest.fixture(scope="module")
def learnable(tmp_path_factory):
    d = tmp_path_factory.mktemp("learnable") / "data"
    ok(run([sys.executable, EXAMPLES / "python" / "make_data.py", d]))
    return d


def losses(stdout: str, epochs: int) -> list:
    """The per-epoch losses an example printed, checking each epoch saw every sample once."""
    found = [float(x) for x in re.findall(r"epoch \d+ loss ([0-9.]+) \(4096 samples, each once", stdout)]
    assert len(found) == epochs, stdout
    return found


def falls(values: list) -> bool:
    return all(b < a for a, b in zip(values, values[1:])) and values[-1] < 0.5 * values[0]


def test_the_pytorch_example_trains_under_mpirun_and_torchrun(learnable, tmp_path):
    script = EXAMPLES / "python" / "torch_ddp.py"
    env = dict(ENV, MASTER_PORT=str(free_port()))
    tel = tmp_path / "telemetry"
    # Self-tuned (a loader keyword through --loader-option): tuning moves no sample, so the
    # losses below equal the untuned torchrun run's.
    r = ok(run(MPIRUN + ["-x", "MASTER_PORT", "-np", 4, sys.executable, script, learnable, "--epochs", 4,
                         "--telemetry", tel, "--loader-option", "tune=auto"], env=env))
    over_mpi = losses(r.stdout, 4)
    assert falls(over_mpi), over_mpi
    assert re.search(r"data wait: \d+\.\d% of step time \(meshfeed, cpu, 4 ranks\)", r.stdout), r.stdout
    # The loader's telemetry of a PyTorch job reads as a meshfeed run's: every epoch of
    # every rank, replayed step by step (32 steps of 128 samples of 4096).
    report = ok(run([BIN, "report", "--json", tel]))
    epochs = [json.loads(line) for line in report.stdout.splitlines() if '"kind":"epoch"' in line]
    assert [(e["epoch"], e["ranks"], e["samples"]) for e in epochs] == [(i, 4, 4096) for i in range(4)], epochs
    assert all(e["steps"]["steps"] == 32 and e["steps"]["replayed_s"] > 0 for e in epochs), epochs
    # A tuned loader's windows record the settings in force (an untuned one's do not).
    lines = (tel / "rank-0.jsonl").read_text().splitlines()
    windows = [json.loads(line) for line in lines if '"kind":"window"' in line]
    assert windows and all(w["prefetch"] is not None and w["read_depth"] >= 1 for w in windows), windows[:3]
    # The baseline it compares with: DataLoader + DistributedSampler over the same files.
    r = ok(run(MPIRUN + ["-x", "MASTER_PORT", "-np", 2, sys.executable, script, learnable, "--epochs", 3,
                         "--loader", "dataloader", "--workers", 1], env=env))
    baseline = losses(r.stdout, 3)
    assert falls(baseline), baseline
    assert re.search(r"data wait: \d+\.\d% of step time \(dataloader, cpu, 2 ranks\)", r.stdout), r.stdout
    # torchrun, meshfeed over UCX through torch's store, 2 ranks: the same global batches,
    # so the same losses.
    r = ok(run(TORCHRUN + ["--standalone", "--nproc-per-node", 2, script, learnable, "--epochs", 4,
                           "--transport", "ucx"],
               env=dict(ENV, UCX_NET_DEVICES="lo")))
    assert losses(r.stdout, 4) == pytest.approx(over_mpi, abs=2e-4)


def test_the_pytorch_example_stops_on_sigterm_and_resumes_on_another_rank_count(learnable, tmp_path):
    """Preemption of a PyTorch job: a SIGTERM to one of its four processes (as a scheduler
    sends it) stops every rank after the same step; the state resumes on two ranks, which
    finish the remaining epochs, every sample once per whole epoch and the resumed epoch's
    remaining steps once."""
    import signal
    import subprocess
    import time

    script = EXAMPLES / "python" / "torch_ddp.py"
    state = tmp_path / "state.json"
    env = dict(ENV, MASTER_PORT=str(free_port()))
    cmd = MPIRUN + ["-x", "MASTER_PORT", "-np", 4, sys.executable, script, learnable, "--epochs", 40,
                    "--state", state]
    job = subprocess.Popen([str(c) for c in cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    out = []
    assert job.stdout is not None
    for line in job.stdout:
        out.append(line)
        if line.startswith("epoch 1 loss"):
            break
    # The ranks are the python processes running the script (not mpirun).
    ranks = [int(p) for p in subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout.split()
             if Path(f"/proc/{p}/comm").read_text().startswith("python")]
    assert len(ranks) == 4, ranks
    os.kill(sorted(ranks)[2], signal.SIGTERM)
    start = time.time()
    rest, _ = job.communicate(timeout=120)
    out.append(rest)
    text = "".join(out)
    assert job.returncode == 75, f"exit {job.returncode}:\n{text}"
    assert time.time() - start < 60, text
    stops = re.findall(r"rank (\d) stopped before epoch (\d+) step (\d+): state saved", text)
    assert sorted(r for r, _, _ in stops) == ["0", "1", "2", "3"], text
    assert len({(e, s) for _, e, s in stops}) == 1, f"ranks stopped at different steps: {stops}"
    epoch, step = int(stops[0][1]), int(stops[0][2])
    assert 1 <= epoch < 40 and epoch * 32 + step < 40 * 32, (epoch, step)
    env = dict(ENV, MASTER_PORT=str(free_port()))
    r = ok(run(MPIRUN + ["-x", "MASTER_PORT", "-np", 2, sys.executable, script, learnable, "--epochs", 40,
                         "--state", state], env=env))
    assert f"resumed at epoch {epoch} step {step}" in r.stdout, r.stdout
    done = re.findall(r"epoch (\d+) loss [0-9.]+ \((\d+) samples, each once", r.stdout)
    assert [int(e) for e, _ in done] == list(range(epoch, 40)), r.stdout
    assert int(done[0][1]) == (32 - step) * 128 and all(int(n) == 4096 for _, n in done[1:]), done


def test_the_jax_example_trains_on_several_processes_and_devices(learnable):
    env = dict(ENV, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               MESHFEED_JAX_COORDINATOR=f"127.0.0.1:{free_port()}")
    r = ok(run(MPIRUN + ["-x", "XLA_FLAGS", "-x", "MESHFEED_JAX_COORDINATOR", "-np", 4, sys.executable,
                         EXAMPLES / "python" / "jax_train.py", learnable, "--epochs", 4], env=env))
    found = losses(r.stdout, 4)
    assert falls(found), found
    assert r.stdout.count("on 8 devices in 4 processes") == 4, r.stdout


def test_the_ray_train_example_trains_over_ucx(learnable):
    r = ok(run([sys.executable, EXAMPLES / "python" / "ray_train.py", learnable, "--workers", 2, "--epochs", 3],
               env=dict(ENV, UCX_NET_DEVICES="lo")))
    # Ray may repeat a worker's lines in the driver's log: the distinct epochs count.
    found = sorted(set(re.findall(r"epoch (\d+) loss ([0-9.]+) \(4096 samples, each once", r.stdout)))
    assert [e for e, _ in found] == ["0", "1", "2"], r.stdout
    assert falls([float(loss) for _, loss in found]), found
    assert "ray_train: finished (no error)" in r.stdout, r.stdout


def test_the_packed_gpt_example_trains_with_context_parallelism(tmp_path):
    """A tiny GPT on packed sequences of a Megatron corpus on dp=2,cp=2 (zigzag chunks,
    attention over the cp group): every sequence once per epoch, the chunks in place, the
    loss falls; the same documents as Parquet on dp=1,cp=2 give the same global batches,
    hence the same losses."""
    script = EXAMPLES / "python" / "gpt_packed.py"
    losses_of = {}
    for fmt, np_, mesh, epochs in (("megatron", 4, "dp=2,cp=2", 2), ("parquet", 2, "dp=1,cp=2", 2)):
        d = tmp_path / fmt
        ok(run([sys.executable, EXAMPLES / "python" / "make_corpus.py", d, "--format", fmt]))
        env = dict(ENV, MASTER_PORT=str(free_port()))
        r = ok(run(MPIRUN + ["-x", "MASTER_PORT", "-np", np_, sys.executable, script, d, "--mesh", mesh,
                             "--epochs", epochs], env=env))
        dp, cp = (int(x.split("=")[1]) for x in mesh.split(","))
        found = [float(x) for x in re.findall(
            rf"epoch \d+ loss ([0-9.]+) \(2176 sequences of 32, each once, dp={dp} cp={cp}\)", r.stdout)]
        assert len(found) == epochs, r.stdout
        losses_of[fmt] = found
    assert falls(losses_of["megatron"]), losses_of
    assert losses_of["parquet"] == pytest.approx(losses_of["megatron"], abs=2e-3), losses_of


def test_the_webdataset_example_decodes_every_image_once(tmp_path):
    """JPEG shards written by webdataset.TarWriter, decoded with Pillow after delivery: every
    image the colour of its class, each once per epoch over the ranks."""
    d = tmp_path / "shards"
    ok(run([sys.executable, EXAMPLES / "python" / "make_shards.py", d]))
    env = dict(ENV, MASTER_PORT=str(free_port()))
    r = ok(run(MPIRUN + ["-x", "MASTER_PORT", "-np", 2, sys.executable, EXAMPLES / "python" / "wds_decode.py", d],
               env=env))
    assert re.findall(r"epoch (\d): 576 images decoded \(cpu\), each once, on 2 ranks", r.stdout) == ["0", "1"], \
        r.stdout


def test_pinned_buffers_are_reused_only_after_their_copy_finished(monkeypatch):
    # The GPU path of Batch.to_torch without a GPU: pinning and CUDA events are replaced
    # by stand-ins that record what happens; the copies themselves are real.
    import torch

    import meshfeed

    log = []

    class Event:
        def __init__(self):
            self.id = len([e for e in log if e[0] == "record"])

        def record(self, stream):
            log.append(("record", self.id))

        def synchronize(self):
            log.append(("sync", self.id))

    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty",
                        lambda *a, pin_memory=False, **kw: (log.append(("pin", a[0])), real_empty(*a, **kw))[1])
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: None)
    pool = meshfeed._PinnedPool()
    outs = []
    for i in range(5):
        host = torch.arange(4 + i, dtype=torch.int64) * (i + 1)  # grows every time
        out = pool.copy_to("x", host, torch.device("cpu"), True)
        assert torch.equal(out, host) and out.data_ptr() != host.data_ptr()
        outs.append(out.clone())
    # Three buffers round-robin: the 4th and 5th copies needed bigger ones (new pins),
    # with no wait; same-size reuse waits for the buffer's last copy.
    assert [e for e in log if e[0] == "pin"] == [("pin", 32), ("pin", 40), ("pin", 48), ("pin", 56), ("pin", 64)]
    log.clear()
    for i in range(3):
        pool.copy_to("x", torch.ones(2, dtype=torch.int64), torch.device("cpu"), True)
    assert [e[0] for e in log] == ["sync", "record", "sync", "record", "sync", "record"], log
