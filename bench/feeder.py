#!/usr/bin/env python3
"""meshfeed's shared-feeder benchmark (issue 26): K training jobs at once on one dataset on
cold, throttled storage, each reading the files itself, against the same K jobs reading
through one ``meshfeed serve``.

Run it as root on Linux once built (``cargo build --release -p meshfeed-cli``):

    python3 bench/feeder.py                        # about three minutes on 2 cores
    python3 bench/feeder.py --jobs 1,2,4 --throttle 25M --epochs 3
    python3 bench/feeder.py --storage warm         # the same from the page cache, unthrottled
    python3 bench/feeder.py --feeder-budget 96M    # a feeder holding part of the data
    python3 bench/feeder.py --feeder-budget 96M --shared-order 7   # and jobs of a shared order
    python3 bench/feeder.py --storage warm --socket   # and a feeder without shared memory
    python3 bench/feeder.py --storage warm --socket --ucx   # and one answering over UCX

The dataset lives on an ext4 filesystem of its own on a loop device (bench/cold.py's); its
pages are dropped from the page cache every 100 ms during every run, and every process that
reads it runs in one cgroup whose reads of the device are throttled to ``--throttle`` bytes
a second: a shared filesystem's bandwidth, which K jobs share. The cgroup's I/O counters
give the storage bytes each scenario read.

For each K of ``--jobs``, two scenarios, each starting with the dataset's pages dropped:

  files     K jobs (``meshfeed run``, ``--ranks`` ranks each, seeds 0..K-1) start at once
            and read the files, each as it would alone (the default read strategy)
  feeder    ``meshfeed serve`` starts; once it serves (before it has read the files) the K
            jobs start at once with its rendezvous file as their data, their requests
            for files not read yet waiting for them

(the jobs run on the feeder's host, so they read the rows it holds from its shared
memory), and with ``--shared-order SPEC``, ``--socket`` or ``--ucx`` more:

  shared    as feeder, each job also given ``--shared-order SPEC`` (its order the common
            seed's, reordered by its own within blocks), so that the jobs ask a feeder
            past its budget for the same rows at about the same time
  socket    as feeder, the feeder started with ``--no-shared-memory``: every row's bytes
            cross the jobs' connections
  ucx       as socket, the feeder also given ``--client-transport ucx``: answers of 64 KiB
            or more go as UCX messages (over the network's fastest transport UCX finds;
            TCP on one host)

A job's time runs from its scenario's start (the feeder's loading included) to its end; its
throughput is its samples over all epochs divided by that time. Printed: the storage bytes
each scenario read over the dataset's bytes, and the median job's throughput against a lone
job reading the files (K = 1, files) in the same invocation. Results: ``OUT/results.jsonl``.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cold  # noqa: E402  (the storage helpers)

START = time.monotonic()


def log(*a):
    print(f"[feeder {time.monotonic() - START:5.0f}s]", *a, file=sys.stderr, flush=True)


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def start_job(args, data, seed, cg, out, name, extra):
    """One `meshfeed run` job in the cgroups; returns (process, its stdout file)."""
    cmd = cg.prefix() + cold.meshfeed_cmd(args.ranks, data, args.batch, args.epochs, ["--seed", str(seed), *extra])
    stdout = os.path.join(out, f"{name}.out")
    proc = subprocess.Popen(cmd, stdout=open(stdout, "w"), stderr=open(os.path.join(out, f"{name}.err"), "w"),
                            env=dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE"))
    return proc, stdout


def scenario(args, data, k, mode, cg, out):
    """K jobs on the files, or through a feeder (``mode``: files, feeder, shared, socket,
    ucx); returns the scenario's record."""
    name = f"{mode}-{k}"
    shared = mode != "files"
    extra = ["--shared-order", args.shared_order] if mode == "shared" else []
    files = cold.files_in(data)
    done = threading.Event()
    if args.storage == "warm":
        cold.warm_cache(files)
    else:
        cold.drop_cache(files)

    def evict():
        while args.storage == "cold" and not done.wait(0.1):
            cold.drop_cache(files)

    evictor = threading.Thread(target=evict, daemon=True)
    evictor.start()
    before = cg.io_counters()[0]
    t0 = time.monotonic()
    feeder, load_s, held, served = None, None, None, []
    try:
        source = data
        if shared:
            source = os.path.join(out, f"{name}.feeder.json")
            budget = ["--memory-budget", args.feeder_budget] if args.feeder_budget else []
            budget += ["--no-shared-memory"] if mode in ("socket", "ucx") else []
            budget += ["--client-transport", "ucx"] if mode == "ucx" else []
            feeder = subprocess.Popen(cg.prefix() + [cold.MESHFEED, "serve", "--data", data, "--json",
                                                     "--rendezvous", source, *budget],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            # It serves from its first line on; jobs' requests for files not read yet wait.
            first = feeder.stdout.readline()
            if not first:
                sys.exit(f"{name}: meshfeed serve failed: {feeder.stderr.read()[-3000:]}")
            held = json.loads(first)["held_files"]
        jobs = [start_job(args, source, seed, cg, out, f"{name}-job{seed}", extra) for seed in range(k)]
        ends = []
        for proc, stdout in jobs:
            code = proc.wait()
            ends.append(time.monotonic() - t0)
            if code != 0:
                sys.exit(f"{name}: a job failed ({code}): {open(stdout).read()[-2000:]}")
    finally:
        done.set()
        evictor.join()
        if feeder is not None:
            # SIGTERM: it says what it served (its 'stopped' line), then exits.
            feeder.terminate()
            try:
                rest, _ = feeder.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                feeder.kill()
                rest, _ = feeder.communicate()
            lines = list(map(json.loads, rest.splitlines()))
            loaded = [v for v in lines if v.get("kind") == "loaded"]
            load_s = loaded[0]["load_s"] if loaded else None
            served = [v for v in lines if v.get("kind") == "stopped"]
    storage = cg.io_counters()[0] - before
    samples = []
    for _, stdout in jobs:
        epochs = [e for e in map(cold.meshfeed_epoch, open(stdout)) if e is not None]
        if len(epochs) != args.epochs:
            sys.exit(f"{name}: {len(epochs)} of {args.epochs} epochs in {stdout}")
        samples.append(sum(e["samples"] for e in epochs))
    rec = {"scenario": mode, "jobs": k, "ranks": args.ranks, "epochs": args.epochs,
           "storage_bytes": storage, "job_s": ends, "samples_per_s": [s / t for s, t in zip(samples, ends)],
           "feeder_load_s": load_s, "feeder_held_files": held,
           "feeder_bytes_sent": sum(v["bytes_sent"] for v in served) if served else None,
           "feeder_bytes_mapped": sum(v["bytes_mapped"] for v in served) if served else None,
           "feeder_bytes_ucx": sum(v["bytes_ucx"] for v in served) if served else None,
           "shared_order": args.shared_order if mode == "shared" else None}
    log(f"{name}: storage {storage / 1e6:.0f} MB, jobs done at {' '.join(f'{t:.1f}' for t in ends)} s"
        + (f" (the feeder read the files in {load_s:.1f} s)" if load_s is not None else ""))
    return rec


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="results directory [bench/results/feeder-<UTC time>]")
    p.add_argument("--jobs", default="1,2,4", help="K: concurrent jobs [1,2,4]")
    p.add_argument("--ranks", type=int, default=2, help="ranks per job [2]")
    p.add_argument("--samples", type=int, default=12000)
    p.add_argument("--fields", default="x:u8:16376 label:i64", help="16 KiB samples")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--throttle", default="25M", help="the storage's read bandwidth, shared by every reader [25M]")
    p.add_argument("--storage", choices=["cold", "warm"], default="cold",
                   help="cold: throttled, pages dropped every 100 ms; warm: the page cache, unthrottled [cold]")
    p.add_argument("--workdir", default=os.path.join(cold.ROOT, "bench", "cold"), help="disk image and mount")
    p.add_argument("--binary", default=cold.MESHFEED, help="the meshfeed to measure [target/release/meshfeed]")
    p.add_argument("--feeder-budget", metavar="BYTES",
                   help="the feeder's --memory-budget (K/M/G): it holds the files that fit and reads the others' "
                        "rows from storage as jobs ask [its default: 3/4 of the headroom]")
    p.add_argument("--shared-order", metavar="SPEC",
                   help="also run the K jobs through the feeder with --shared-order SPEC (SEED[,block=N])")
    p.add_argument("--socket", action="store_true",
                   help="also run the K jobs through a feeder started with --no-shared-memory")
    p.add_argument("--ucx", action="store_true",
                   help="also run the K jobs through a feeder started with --no-shared-memory --client-transport ucx")
    args = p.parse_args()
    cold.MESHFEED = os.path.abspath(args.binary)
    reason = cold.why_not_here()
    if reason:
        sys.exit(f"the feeder benchmark cannot run here: {reason}")
    ks = [int(k) for k in args.jobs.split(",")]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = args.out or os.path.join(cold.ROOT, "bench", "results", f"feeder-{stamp}")
    os.makedirs(out, exist_ok=True)
    sample = 16 << 10
    fs = cold.LoopFs(os.path.join(args.workdir, "feeder.img"), os.path.join(args.workdir, "feeder-mnt"),
                     int(args.samples * sample * 1.5) + 256 * cold.MiB)
    cg = None
    results = []
    log(f"storage {args.storage}" + (f", throttled to {args.throttle}B/s" if args.storage == "cold" else ""))
    try:
        data = os.path.join(fs.mnt, f"npy-{args.samples}")
        cold.gen(data, "npy", args.fields, args.samples)
        bps = parse_size(args.throttle) if args.storage == "cold" else 0
        cg = cold.Cgroups(f"meshfeed-feeder-{os.getpid()}", fs.dev, bps, 0, 0)
        modes = ["files", "feeder"] + (["shared"] if args.shared_order else []) + (["socket"] if args.socket else [])
        modes += ["ucx"] if args.ucx else []
        for k in ks:
            for mode in modes:
                results.append(scenario(args, data, k, mode, cg, out))
    finally:
        if cg is not None:
            cg.close()
        fs.close()
    dataset = sum(os.path.getsize(f) for f in cold.files_in(data)) if os.path.exists(data) else 0
    dataset = dataset or args.samples * sample
    with open(os.path.join(out, "results.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(dict(r, dataset_bytes=dataset, storage=args.storage)) + "\n")
    lone = next((statistics.median(r["samples_per_s"]) for r in results
                 if r["scenario"] == "files" and r["jobs"] == 1), None)
    print(f"{'scenario':<10}{'K':>3}{'storage read (x data)':>24}{'job samples/s (median)':>25}{'x lone job':>12}"
          f"{'sent, mapped, ucx (x data)':>30}")
    for r in results:
        m = statistics.median(r["samples_per_s"])
        keys = ["feeder_bytes_sent", "feeder_bytes_mapped", "feeder_bytes_ucx"]
        served = ", ".join(f"{r[k] / dataset:.2f}" for k in keys) if r["feeder_bytes_sent"] is not None else ""
        print(f"{r['scenario']:<10}{r['jobs']:>3}{r['storage_bytes'] / dataset:>24.2f}{m:>25.0f}"
              f"{(m / lone if lone else float('nan')):>12.2f}{served:>30}")
    print(f"results: {out}/results.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
