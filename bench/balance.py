#!/usr/bin/env python3
"""meshfeed's straggler benchmark (issue 25, item 3): one rank reads from slow storage, the
others do not; with ``--balance auto`` the ranks move their home ranges so that the slow
reader reads less, with ``--balance off`` every epoch waits for it.

Run it as root on Linux once built (``cargo build --release -p meshfeed-cli``):

    python3 bench/balance.py               # about two minutes on 2 cores
    python3 bench/balance.py --ranks 3 --epochs 8
    python3 bench/balance.py --job torch   # the PyTorch example instead of meshfeed run

The dataset lives on an ext4 filesystem of its own on a loop device (bench/cold.py's), and
its pages are dropped from the page cache every 100 ms during every run, so that every
read goes to the device. The slow rank runs in a blkio cgroup that throttles its reads of
that device; the other ranks read at the device's full speed (the loop device's image is
itself cached by the host: fast). Every rank poses as a host of its own
(``MESHFEED_HOST``) and reads at random with nothing kept (``--read-strategy random
--memory-budget 0 --local-reads off``): every row crosses the exchange, and only the home
ranges decide who reads it.

``--job torch`` runs the PyTorch example (examples/python/torch_ddp.py: DistributedDataParallel
on the CPU over gloo, a `meshfeed.Loader` with the same options, ``--loader-option``) on
examples/python/make_data.py's learnable data padded to the same 16 KiB samples, instead
of ``meshfeed run``: the training job users run, balanced by the loader inside it. Its epoch
times are the slowest rank's epoch records in the loader's telemetry (``seconds``: the
epoch as the training loop saw it, its steps included). It needs the Python package built
into .venv (``launch/setup.sh --test`` and ``pip install ./python``).

Three runs, side by side, each starting with the dataset's pages dropped:

  unslowed        no throttle, ``--balance auto`` (the reference)
  slowed, off     rank 1 throttled, equal home ranges
  slowed, auto    rank 1 throttled, home ranges balanced at each epoch's start

The throttle is calibrated from the unslowed run: rank 1's home bytes per epoch over twice
the unslowed epoch, so that its reads alone take twice an unslowed epoch. Printed: each
run's epoch times (the slowest rank's, from ``--json``) and home range lengths (telemetry),
and the ratios of the slowed runs' epochs to the unslowed run's. Results:
``OUT/results.jsonl``. Epoch 0 measures (every run reads its data cold once), so the ratios
are over epochs 2 and later, where balancing has had an epoch to act.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cold  # noqa: E402  (the storage and cgroup helpers)


def log(*a):
    print(f"[balance {time.monotonic() - START:5.0f}s]", *a, file=sys.stderr, flush=True)


START = time.monotonic()


def home_rows(telemetry, ranks):
    """[rank][epoch]: each rank's home range length per epoch."""
    out = []
    for r in range(ranks):
        with open(os.path.join(telemetry, f"rank-{r}.jsonl")) as f:
            records = [json.loads(line) for line in f if line.strip()]
        out.append([v.get("home_rows", 0) for v in records if v.get("kind") == "epoch"])
    return out


def epoch_seconds(telemetry, ranks):
    """Each epoch's time: the slowest rank's epoch record."""
    per_rank = [[e["seconds"] for e in records if e.get("kind") == "epoch"]
                for records in (map(json.loads, filter(str.strip, open(os.path.join(telemetry, f"rank-{r}.jsonl"))))
                                for r in range(ranks))]
    return [max(epoch) for epoch in zip(*per_rank)]


def run(args, data, name, balance, cg, out):
    """One run of the job (`meshfeed run`, or the PyTorch example); rank `args.slow` in
    the cgroups `cg` (None: unslowed)."""
    telemetry = os.path.join(out, f"telemetry-{name}")
    shutil.rmtree(telemetry, ignore_errors=True)
    wrapper = os.path.join(out, f"rank-{name}.sh")
    join = "" if cg is None else "".join(f"echo $$ > {d}/cgroup.procs; " for d in sorted({cg.io, cg.mem}))
    program = cold.MESHFEED if args.job == "cli" else PYTHON
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\nr=$OMPI_COMM_WORLD_RANK\n"
                f"if [ \"$r\" = {args.slow} ]; then {join}:; fi\n"
                f"MESHFEED_HOST=host$r exec {program} \"$@\"\n")
    os.chmod(wrapper, 0o755)
    files = cold.files_in(data)
    cold.drop_cache(files)
    options = {"read_strategy": "random", "memory_budget": "0", "local_reads": "off", "balance": balance}
    if args.job == "cli":
        cmd = cold.meshfeed_cmd(args.ranks, data, args.batch, args.epochs, [])
        cmd[cmd.index(cold.MESHFEED)] = wrapper
        cmd += [a for k, v in options.items() for a in (f"--{k.replace('_', '-')}", v)]
        cmd += ["--telemetry", telemetry]
    else:
        cmd = cold.meshfeed_cmd(args.ranks, data, args.batch, args.epochs, [])[:cmd_end(args.ranks)]
        cmd += ["-x", "MASTER_PORT", wrapper, TORCH_DDP, data, "--epochs", str(args.epochs),
                "--batch-size", str(args.batch), "--telemetry", telemetry]
        cmd += [a for k, v in options.items() for a in ("--loader-option", f"{k}={v}")]
    done = threading.Event()

    def evict():
        while not done.wait(0.1):
            cold.drop_cache(files)

    evictor = threading.Thread(target=evict, daemon=True)
    evictor.start()
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, text=True, capture_output=True,
                              env=dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE", MASTER_PORT=free_port()))
    finally:
        done.set()
        evictor.join()
    if proc.returncode != 0:
        sys.exit(f"{name}: the {args.job} job failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    if args.job == "cli":
        epoch_s = [e["seconds"] for e in map(cold.meshfeed_epoch, proc.stdout.splitlines()) if e is not None]
    else:
        # The example checked each epoch: every sample once.
        each_once = proc.stdout.count("samples, each once")
        if each_once != args.epochs:
            sys.exit(f"{name}: {each_once} of {args.epochs} epochs checked:\n{proc.stdout[-3000:]}")
        epoch_s = epoch_seconds(telemetry, args.ranks)
    rec = {"run": name, "job": args.job, "balance": balance, "slowed": cg is not None,
           "wall_s": time.monotonic() - t0, "epoch_s": epoch_s, "home_rows": home_rows(telemetry, args.ranks)}
    log(f"{name}: epochs {' '.join(f'{s:.2f}' for s in rec['epoch_s'])} s; "
        f"rank {args.slow}'s home rows {rec['home_rows'][args.slow]}")
    return rec


PYTHON = os.path.join(cold.ROOT, ".venv", "bin", "python")
TORCH_DDP = os.path.join(cold.ROOT, "examples", "python", "torch_ddp.py")


def cmd_end(ranks):
    """Where meshfeed_cmd's mpirun options end (before the program)."""
    return cold.meshfeed_cmd(ranks, "", 1, 1, []).index(cold.MESHFEED)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="results directory [bench/results/balance-<UTC time>]")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--slow", type=int, default=1, help="the slowed rank [1]")
    p.add_argument("--samples", type=int, default=24000)
    p.add_argument("--fields", default="x:u8:16376 label:i64", help="16 KiB samples")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--slowdown", type=float, default=2.0, help="the slow rank's reads take this many unslowed epochs")
    p.add_argument("--workdir", default=os.path.join(cold.ROOT, "bench", "cold"), help="disk image and mount")
    p.add_argument("--binary", default=cold.MESHFEED, help="the meshfeed to measure [target/release/meshfeed]")
    p.add_argument("--job", choices=["cli", "torch"], default="cli",
                   help="meshfeed run, or the PyTorch example (examples/python/torch_ddp.py) [cli]")
    args = p.parse_args()
    cold.MESHFEED = os.path.abspath(args.binary)
    reason = cold.why_not_here()
    if reason:
        sys.exit(f"the straggler benchmark cannot run here: {reason}")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = args.out or os.path.join(cold.ROOT, "bench", "results", f"balance-{stamp}")
    os.makedirs(out, exist_ok=True)
    sample = 16 << 10
    fs = cold.LoopFs(os.path.join(args.workdir, "balance.img"), os.path.join(args.workdir, "balance-mnt"),
                     int(args.samples * sample * 1.5) + 256 * cold.MiB)
    cg = None
    try:
        if args.job == "cli":
            data = os.path.join(fs.mnt, f"npy-{args.samples}")
            cold.gen(data, "npy", args.fields, args.samples)
        else:
            data = os.path.join(fs.mnt, f"learnable-{args.samples}")
            shutil.rmtree(data, ignore_errors=True)
            cold.sh(PYTHON, os.path.join(cold.ROOT, "examples", "python", "make_data.py"), data,
                    "--samples", str(args.samples), "--files", "8", "--row-bytes", str(sample))
        results = [run(args, data, "unslowed", "auto", None, out)]
        later = statistics.median(results[0]["epoch_s"][2:])
        home_bytes = args.samples // args.ranks * sample
        bps = max(1 << 20, int(home_bytes / (args.slowdown * later)))
        log(f"unslowed later epochs {later:.2f} s: rank {args.slow} throttled to {bps / 1e6:.1f} MB/s "
            f"(its {home_bytes / 1e6:.0f} MB in {args.slowdown:g} unslowed epochs)")
        cg = cold.Cgroups(f"meshfeed-balance-{os.getpid()}", fs.dev, bps, 0, 0)
        results.append(run(args, data, "slowed-off", "off", cg, out))
        results.append(run(args, data, "slowed-auto", "auto", cg, out))
    finally:
        if cg is not None:
            cg.close()
        fs.close()
    with open(os.path.join(out, "results.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    base = statistics.median(results[0]["epoch_s"][2:])
    print(f"{'run':<14}{'epochs ≥ 2 (median s)':>24}{'× unslowed':>12}   rank {args.slow}'s home rows by epoch")
    for r in results:
        m = statistics.median(r["epoch_s"][2:])
        print(f"{r['run']:<14}{m:>24.2f}{m / base:>12.2f}   {r['home_rows'][args.slow]}")
    print(f"results: {out}/results.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
