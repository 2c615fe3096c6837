#!/usr/bin/env python3
"""meshfeed's self-tuning benchmark (issue 25, item 4): from deliberately bad settings — a
tiny window and no producer thread — ``--tune auto`` should reach the throughput of the best
hand-picked window and prefetch within its first epoch.

Run it on Linux once built (``cargo build --release -p meshfeed-cli``); the cold half needs
root (a loop device), and is skipped, saying so, without it:

    python3 bench/tune.py                  # about ten minutes on 2 cores
    python3 bench/tune.py --ranks 3 --compute-ms 2 --storage warm

Every run is ``meshfeed run`` on ``--ranks`` ranks reading at random with nothing kept
(``--read-strategy random --memory-budget 0``): every epoch reads the dataset from storage.
Two storages, each its own table:

  warm    the dataset in the page cache
  cold    the dataset on an ext4 filesystem of its own on a loop device (bench/cold.py's),
          its pages dropped from the page cache every 100 ms, so every read goes to the
          device

On each, the runs side by side:

  hand-picked   every window of --windows with prefetch 0 and 2, untuned
  bad           the bad start (--start-window, prefetch 0), untuned (two epochs)
  tuned         the bad start with ``--tune auto``

Throughput is samples per second of an epoch (the slowest rank's epoch time, from
``--json``). The best hand-picked run is the one with the highest median throughput over
epochs 1 and later; the tuned run's epoch 1 is compared with it (the tuner has had epoch 0),
and so is its epoch 0 (tuning included). The tuned run's settings are read from rank 0's
telemetry (its last window). ``--compute-ms`` adds a simulated training step per batch
(default 0: the loader is the whole step). Results: ``OUT/results.jsonl``.
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
import cold  # noqa: E402  (the storage helpers)

START = time.monotonic()


def log(*a):
    print(f"[tune {time.monotonic() - START:5.0f}s]", *a, file=sys.stderr, flush=True)


def last_window(telemetry):
    """Rank 0's last window record."""
    with open(os.path.join(telemetry, "rank-0.jsonl")) as f:
        windows = [v for v in map(json.loads, filter(str.strip, f)) if v.get("kind") == "window"]
    return windows[-1]


def run(args, data, storage, name, window, prefetch, tune, out, evict, epochs=None):
    telemetry = os.path.join(out, f"telemetry-{storage}-{name}")
    shutil.rmtree(telemetry, ignore_errors=True)
    cmd = cold.meshfeed_cmd(args.ranks, data, args.batch, epochs or args.epochs, [
        "--read-strategy", "random", "--memory-budget", "0", "--window-bytes", window,
        "--prefetch", str(prefetch), "--tune", tune, "--compute-ms", str(args.compute_ms),
        "--telemetry", telemetry])
    files = cold.files_in(data)
    if evict:
        cold.drop_cache(files)
    else:
        cold.warm_cache(files)
    done = threading.Event()

    def evictor():
        while not done.wait(0.1):
            cold.drop_cache(files)

    thread = threading.Thread(target=evictor, daemon=True)
    if evict:
        thread.start()
    try:
        proc = subprocess.run(cmd, text=True, capture_output=True, env=dict(os.environ, HDF5_USE_FILE_LOCKING="FALSE"))
    finally:
        done.set()
        if evict:
            thread.join()
    if proc.returncode != 0:
        sys.exit(f"{storage} {name}: meshfeed failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    epochs = [e for e in map(cold.meshfeed_epoch, proc.stdout.splitlines()) if e is not None]
    w = last_window(telemetry)
    rec = {"storage": storage, "run": name, "window_bytes": window, "prefetch": prefetch, "tune": tune,
           "samples_per_s": [e["samples"] / e["seconds"] for e in epochs],
           "epoch_s": [e["seconds"] for e in epochs],
           "last_window": {"steps": w["steps"], "prefetch": w.get("prefetch", prefetch),
                           "read_depth": w.get("read_depth")}}
    later = statistics.median(rec["samples_per_s"][1:])
    log(f"{storage} {name}: epochs {' '.join(f'{s:.2f}' for s in rec['epoch_s'])} s, "
        f"{later:.0f} samples/s later; last window {rec['last_window']}")
    return rec


def table(storage, results, out):
    rows = [r for r in results if r["storage"] == storage]
    later = {r["run"]: statistics.median(r["samples_per_s"][1:]) for r in rows}
    picked = [r for r in rows if r["run"].startswith("hand-picked")]
    best = max(picked, key=lambda r: later[r["run"]])
    tuned = next(r for r in rows if r["run"] == "tuned")
    b = later[best["run"]]
    print(f"\n{storage}: best hand-picked is {best['run']} ({b:.0f} samples/s over epochs >= 1)")
    print(f"{'run':<30}{'epoch 0':>10}{'epoch 1':>10}{'epochs >= 1':>13}   (x the best hand-picked)")
    for r in rows:
        e = r["samples_per_s"]
        print(f"{r['run']:<30}{e[0] / b:>10.2f}{e[1] / b:>10.2f}{later[r['run']] / b:>13.2f}")
    ratio = tuned["samples_per_s"][1] / b
    print(f"tuned epoch 1 / best hand-picked: {ratio:.2f} (target >= 0.9); tuned to {tuned['last_window']}")
    with open(os.path.join(out, "summary.jsonl"), "a") as f:
        f.write(json.dumps({"storage": storage, "best": best["run"], "best_samples_per_s": b,
                            "tuned_epoch1_ratio": ratio, "tuned_epoch0_ratio": tuned["samples_per_s"][0] / b,
                            "tuned_to": tuned["last_window"]}) + "\n")
    return ratio


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="results directory [bench/results/tune-<UTC time>]")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--samples", type=int, default=1200000)
    p.add_argument("--fields", default="x:u8:1016 label:i64", help="1 KiB samples")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--compute-ms", type=float, default=0.0, help="a simulated training step per batch [0]")
    p.add_argument("--windows", default="1M,4M,16M,64M", help="hand-picked windows")
    p.add_argument("--start-window", default="16K", help="the bad start's window")
    p.add_argument("--storage", default="warm,cold")
    p.add_argument("--workdir", default=os.path.join(cold.ROOT, "bench", "cold"), help="disk image and mount")
    p.add_argument("--binary", default=cold.MESHFEED, help="the meshfeed to measure [target/release/meshfeed]")
    args = p.parse_args()
    cold.MESHFEED = os.path.abspath(args.binary)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = args.out or os.path.join(cold.ROOT, "bench", "results", f"tune-{stamp}")
    os.makedirs(out, exist_ok=True)
    storages = args.storage.split(",")
    reason = cold.why_not_here() if "cold" in storages else None
    if reason:
        print(f"SKIPPED cold: {reason} (no cold figure was measured)", flush=True)
        storages.remove("cold")
    sample = sum(cold_bytes(f) for f in args.fields.split())
    results = []
    fs = None
    try:
        for storage in storages:
            if storage == "cold":
                fs = cold.LoopFs(os.path.join(args.workdir, "tune.img"), os.path.join(args.workdir, "tune-mnt"),
                                 int(args.samples * sample * 1.5) + 256 * cold.MiB)
                data = os.path.join(fs.mnt, f"npy-{args.samples}")
            else:
                data = os.path.join(out, f"npy-{args.samples}")
            cold.gen(data, "npy", args.fields, args.samples)
            evict = storage == "cold"
            for window in args.windows.split(","):
                for prefetch in (0, 2):
                    results.append(run(args, data, storage, f"hand-picked {window} prefetch {prefetch}", window,
                                       prefetch, "off", out, evict))
            # The bad start is slow: two epochs of it tell enough.
            results.append(run(args, data, storage, f"bad {args.start_window} prefetch 0", args.start_window, 0,
                               "off", out, evict, epochs=2))
            results.append(run(args, data, storage, "tuned", args.start_window, 0, "auto", out, evict))
            if fs is not None:
                fs.close()
                fs = None
    finally:
        if fs is not None:
            fs.close()
    with open(os.path.join(out, "results.jsonl"), "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    for storage in storages:
        table(storage, results, out)
    print(f"\nresults: {out}/results.jsonl, {out}/summary.jsonl")
    return 0


def cold_bytes(field):
    """Bytes of one value of a `gen` field (NAME:TYPE[:SHAPE])."""
    parts = field.split(":")
    size = {"u8": 1, "i8": 1, "f16": 2, "i16": 2, "f32": 4, "i32": 4, "u32": 4, "f64": 8, "i64": 8}[parts[1]]
    for d in (parts[2].split("x") if len(parts) > 2 else []):
        size *= int(d)
    return size


if __name__ == "__main__":
    sys.exit(main())
