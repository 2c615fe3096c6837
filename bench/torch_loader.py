#!/usr/bin/env python3
"""The PyTorch baseline of meshfeed's benchmark suite (issue 10): the real
``torch.utils.data.DataLoader`` + ``DistributedSampler`` over the files ``meshfeed gen``
writes, as a user would write it.

Launched like meshfeed, ``mpirun -np P python3 bench/torch_loader.py ...``: each process
reads its rank from OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (or RANK / WORLD_SIZE, or
Slurm's SLURM_PROCID / SLURM_NTASKS under ``srun``);
no torch.distributed is needed, the sampler is given ``num_replicas`` and ``rank``.
shuffle=True, drop_last=True, per-rank batch = global batch / P.

Datasets (one class per format, each opening its files lazily in every worker process):
  npy    numpy.load(mmap_mode="r") of the structured record files; a sample is the record's
         fields copied into tensors;
  hdf5   h5py, one dataset per field; a sample is one read per field;
  arrow  pyarrow.memory_map + ipc.open_file: zero-copy numpy views of each record batch's
         columns; a sample copies its rows out of them.

For each worker count in --workers, one DataLoader (persistent workers) runs one untimed
epoch and --epochs timed ones; every rank writes its epoch times to
``<out>.rank<r>`` and rank 0 waits for all of them and appends one JSON line to --out with
the slowest rank's time per epoch (the best worker count's; all counts are listed), in
the keys ``meshfeed bench --out`` writes.
"""

import argparse
import bisect
import datetime
import glob
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time


def rank_and_size():
    pairs = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"), ("RANK", "WORLD_SIZE"),
             ("SLURM_PROCID", "SLURM_NTASKS"))
    for r, s in pairs:
        if r in os.environ and s in os.environ:
            return int(os.environ[r]), int(os.environ[s])
    return 0, 1


def files_of(data, ext):
    files = sorted(glob.glob(os.path.join(data, "*." + ext)))
    if not files:
        sys.exit(f"torch_loader: no *.{ext} files in {data}")
    return files


class Files:
    """Global sample index -> (file, row), for per-file sample counts."""

    def __init__(self, counts):
        self.starts = [0]
        for c in counts:
            self.starts.append(self.starts[-1] + c)

    def __len__(self):
        return self.starts[-1]

    def locate(self, i):
        f = bisect.bisect_right(self.starts, i) - 1
        return f, i - self.starts[f]


class NpyDataset:
    def __init__(self, data):
        import numpy as np

        self.paths = files_of(data, "npy")
        self.index = Files([np.load(p, mmap_mode="r").shape[0] for p in self.paths])
        self.names = np.load(self.paths[0], mmap_mode="r").dtype.names
        self.arrays = None

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        import numpy as np
        import torch

        if self.arrays is None:  # opened in each worker
            self.arrays = [np.load(p, mmap_mode="r") for p in self.paths]
        f, row = self.index.locate(i)
        rec = self.arrays[f][row]
        return {n: torch.from_numpy(np.array(rec[n])) for n in self.names}


class Hdf5Dataset:
    def __init__(self, data):
        import h5py

        self.paths = files_of(data, "h5")
        counts = []
        for p in self.paths:
            with h5py.File(p, "r") as f:
                self.names = sorted(f.keys())
                counts.append(f[self.names[0]].shape[0])
        self.index = Files(counts)
        self.files = None

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        import h5py
        import numpy as np
        import torch

        if self.files is None:  # h5py handles must not cross fork: opened in each worker
            self.files = [h5py.File(p, "r") for p in self.paths]
            self.dsets = [{n: f[n] for n in self.names} for f in self.files]
        f, row = self.index.locate(i)
        return {n: torch.from_numpy(np.asarray(d[row])) for n, d in self.dsets[f].items()}


class ArrowDataset:
    def __init__(self, data):
        import pyarrow as pa

        self.paths = files_of(data, "arrow")
        counts = []
        for p in self.paths:
            with pa.memory_map(p) as m:
                t = pa.ipc.open_file(m).read_all()
                counts.append(t.num_rows)
                self.names = t.column_names
        self.index = Files(counts)
        self.columns = None

    def __len__(self):
        return len(self.index)

    @staticmethod
    def _views(table, name):
        """Per record batch: (first row, numpy view of shape (rows, *shape)), zero-copy."""
        import pyarrow as pa

        views, start = [], 0
        for chunk in table.column(name).chunks:
            arr, shape = chunk, []
            while pa.types.is_fixed_size_list(arr.type):
                shape.append(arr.type.list_size)
                arr = arr.flatten()
            np_arr = arr.to_numpy(zero_copy_only=True).reshape([len(chunk)] + shape)
            views.append((start, np_arr))
            start += len(chunk)
        return views

    def __getitem__(self, i):
        import numpy as np
        import pyarrow as pa
        import torch

        if self.columns is None:  # memory maps opened in each worker
            self.columns = []
            for p in self.paths:
                t = pa.ipc.open_file(pa.memory_map(p)).read_all()
                self.columns.append({n: self._views(t, n) for n in self.names})
        f, row = self.index.locate(i)
        out = {}
        for n, views in self.columns[f].items():
            k = bisect.bisect_right([s for s, _ in views], row) - 1
            start, v = views[k]
            out[n] = torch.from_numpy(np.array(v[row - start]))
        return out


DATASETS = {"npy": NpyDataset, "hdf5": Hdf5Dataset, "arrow": ArrowDataset}


def peak_rss_bytes():
    """Peak RSS of this process and its (finished) workers."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return kb * 1024


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True).stdout.strip()
        rev += "-dirty" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        rev = "unknown"
    return {
        "hostname": socket.gethostname(),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_rev": rev,
    }


def run_epochs(dataset, rank, size, per_rank, workers, epochs, seed):
    """One untimed epoch then `epochs` timed ones; returns (times, samples, bytes) of the last."""
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=size, rank=rank, shuffle=True, seed=seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=per_rank, sampler=sampler, num_workers=workers, drop_last=True,
                        persistent_workers=workers > 0)
    times, samples, nbytes = [], 0, 0
    for e in range(epochs + 1):
        sampler.set_epoch(e)
        start = time.perf_counter()
        samples = nbytes = 0
        for batch in loader:
            for t in batch.values():
                nbytes += t.numel() * t.element_size()
            samples += next(iter(batch.values())).shape[0]
        if e > 0:
            times.append(time.perf_counter() - start)
    del loader
    return times, samples, nbytes


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="directory of files written by meshfeed gen")
    p.add_argument("--format", required=True, choices=sorted(DATASETS))
    p.add_argument("--batch-size", type=int, required=True, help="global batch size (divided by the ranks)")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per worker count (after one untimed)")
    p.add_argument("--workers", default="0,1,2", help="worker counts to try; the best counts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window-bytes", type=int, default=0, help="recorded with the result (the point meshfeed ran at)")
    p.add_argument("--tag", default="")
    p.add_argument("--out", required=True, help="JSON lines file to append the result to (rank 0)")
    args = p.parse_args()

    import torch

    torch.set_num_threads(1)
    rank, size = rank_and_size()
    if args.batch_size % size:
        sys.exit(f"torch_loader: batch size {args.batch_size} is not divisible by {size} ranks")
    per_rank = args.batch_size // size
    dataset = DATASETS[args.format](args.data)
    first = dataset[0]
    sample_bytes = sum(t.numel() * t.element_size() for t in first.values())
    results = {}
    for w in [int(x) for x in args.workers.split(",")]:
        times, samples, nbytes = run_epochs(dataset, rank, size, per_rank, w, args.epochs, args.seed)
        results[w] = {"times": times, "samples": samples, "bytes": nbytes}
    mine = {"rank": rank, "results": results, "rss": peak_rss_bytes()}
    part = f"{args.out}.rank{rank}"
    with open(part + ".tmp", "w") as f:
        json.dump(mine, f)
    os.replace(part + ".tmp", part)
    if rank != 0:
        return
    # Rank 0 reduces: wait for every rank's file (they finish within moments of each other).
    parts = [f"{args.out}.rank{r}" for r in range(size)]
    deadline = time.time() + 600
    while not all(os.path.exists(q) for q in parts):
        if time.time() > deadline:
            missing = [q for q in parts if not os.path.exists(q)]
            sys.exit(f"torch_loader: ranks did not report within 10 minutes: {missing}")
        time.sleep(0.05)
    ranks = []
    for q in parts:
        with open(q) as f:
            ranks.append(json.load(f))
        os.remove(q)
    by_workers = {}
    for w in results:
        # Epoch k's time is the slowest rank's epoch k.
        epochs = [max(r["results"][str(w)]["times"][k] for r in ranks) for k in range(args.epochs)]
        by_workers[w] = epochs
    best_w = min(by_workers, key=lambda w: min(by_workers[w]))
    epochs = by_workers[best_w]
    best = min(epochs)
    samples = sum(r["results"][str(best_w)]["samples"] for r in ranks)
    nbytes = sum(r["results"][str(best_w)]["bytes"] for r in ranks)
    rss = [r["rss"] for r in ranks]
    record = {
        "loader": "pytorch",
        "mode": "pytorch",
        "transport": "none",
        "tag": args.tag,
        "format": args.format,
        "sample_bytes": sample_bytes,
        "samples": len(dataset),
        "ranks": size,
        "batch_size": args.batch_size,
        "window_bytes": args.window_bytes,
        "steps_per_epoch": samples // args.batch_size,
        "epochs": args.epochs,
        "epoch_s": statistics.median(epochs),
        "epoch_s_best": best,
        "epoch_s_all": epochs,
        "samples_per_epoch": samples,
        "samples_per_s": samples / best,
        "delivered_bytes": nbytes,
        "gb_per_s": nbytes / 1e9 / best,
        "bytes_needed": samples * sample_bytes,
        "num_workers": best_w,
        "epoch_s_by_workers": {str(w): min(t) for w, t in by_workers.items()},
        "max_rss_bytes": max(rss),
        "rss_per_rank": rss,
        "machine": machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    with open(args.out, "a") as f:
        f.write(json.dumps(record) + "\n")
    tried = ", ".join(f"{w} workers {min(t):.3f} s" for w, t in by_workers.items())
    print(f"pytorch {args.tag} {args.format} x{size}: best epoch {best:.3f} s "
          f"({samples / best:.0f} samples/s); {tried}")


if __name__ == "__main__":
    main()
