#!/usr/bin/env python3
"""The PyTorch baselines of meshfeed's cold-storage benchmark (bench/cold.py): the real
``torch.utils.data.DataLoader`` + ``DistributedSampler`` over the files ``meshfeed gen``
writes, in two variants:

  memmap  as users write it: numpy memmap (npy), h5py (HDF5), a pyarrow memory map (Arrow)
          — the datasets of bench/torch_loader.py;
  pread   as a careful user would: one ``os.pread`` per sample (per field where the format
          stores fields apart) at offsets found once from the file's header, no mmap and
          no readahead (``POSIX_FADV_RANDOM``).

Launched like meshfeed, ``mpirun -np P python3 bench/torch_cold.py ...``. shuffle=True,
drop_last=True, per-rank batch = global batch / P. Every rank prints one JSON line per
epoch on stdout, as the epoch ends: ``{"rank", "epoch", "samples", "seconds"}``. An epoch
ends early after ``--time-limit`` seconds (cold storage can take hours per epoch); its
samples and seconds are then those so far.
"""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_loader import ArrowDataset, Files, Hdf5Dataset, NpyDataset, files_of, rank_and_size  # noqa: E402


class PreadDataset:
    """Samples read with one ``os.pread`` per field at offsets known from the headers."""

    def __init__(self, files, counts, fields):
        # files: paths; counts: rows per file; fields: per file, [(name, dtype, shape, offset, row_bytes)]
        self.paths, self.fields = files, fields
        self.index = Files(counts)
        self.fds = None

    def __len__(self):
        return len(self.index)

    def open_files(self):
        """The files, opened once in each worker, read at random (no readahead)."""
        if self.fds is None:
            self.fds = []
            for p in self.paths:
                fd = os.open(p, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                self.fds.append(fd)

    def __getitem__(self, i):
        import numpy as np
        import torch

        self.open_files()
        f, row = self.index.locate(i)
        out = {}
        for name, dtype, shape, offset, row_bytes in self.fields[f]:
            b = os.pread(self.fds[f], row_bytes, offset + row * row_bytes)
            out[name] = torch.from_numpy(np.frombuffer(b, dtype=dtype).reshape(shape).copy())
        return out


def npy_pread(data):
    """Structured .npy records: one pread per sample (the record), split into fields."""
    import numpy as np

    paths = files_of(data, "npy")
    counts, fields = [], []
    for p in paths:
        a = np.load(p, mmap_mode="r")
        counts.append(a.shape[0])
        fields.append(("__record__", a.dtype, a.offset))

    class Npy(PreadDataset):
        def __getitem__(self, i):
            import torch

            self.open_files()
            f, row = self.index.locate(i)
            _, dtype, offset = self.fields[f]
            rec = np.frombuffer(os.pread(self.fds[f], dtype.itemsize, offset + row * dtype.itemsize), dtype=dtype)[0]
            return {n: torch.from_numpy(np.array(rec[n])) for n in dtype.names}

    return Npy(paths, counts, fields)


def hdf5_pread(data):
    """Contiguous HDF5 datasets (what meshfeed gen writes): one pread per field."""
    import h5py

    paths = files_of(data, "h5")
    counts, fields = [], []
    for p in paths:
        with h5py.File(p, "r") as f:
            names = sorted(f.keys())
            counts.append(f[names[0]].shape[0])
            per = []
            for n in names:
                d = f[n]
                offset = d.id.get_offset()
                if offset is None:
                    sys.exit(f"torch_cold: {p}:{n} is not contiguous: the pread variant needs contiguous datasets")
                shape = d.shape[1:]
                row_bytes = d.dtype.itemsize * int(max(1, math.prod(shape)))
                per.append((n, d.dtype, shape, offset, row_bytes))
            fields.append(per)
    return PreadDataset(paths, counts, fields)


def arrow_pread(data):
    """Fixed-size Arrow columns: one pread per field at the record batch's buffer offset."""
    import pyarrow as pa

    paths = files_of(data, "arrow")
    files, counts, fields = [], [], []
    for p in paths:
        m = pa.memory_map(p)
        base = m.read_buffer(1).address
        m.seek(0)
        reader = pa.ipc.open_file(m)
        for b in range(reader.num_record_batches):
            batch = reader.get_batch(b)
            per = []
            for name, col in zip(batch.schema.names, batch.columns):
                arr, shape = col, []
                while pa.types.is_fixed_size_list(arr.type):
                    shape.append(arr.type.list_size)
                    arr = arr.flatten()
                width = arr.type.byte_width
                row_bytes = width * int(max(1, math.prod(shape)))
                offset = arr.buffers()[1].address - base + arr.offset * width
                per.append((name, arr.type.to_pandas_dtype(), tuple(shape), offset, row_bytes))
            # One "file" per record batch: its rows at their own offsets.
            files.append(p)
            counts.append(batch.num_rows)
            fields.append(per)
    return PreadDataset(files, counts, fields)


VARIANTS = {
    ("npy", "memmap"): NpyDataset,
    ("hdf5", "memmap"): Hdf5Dataset,
    ("arrow", "memmap"): ArrowDataset,
    ("npy", "pread"): npy_pread,
    ("hdf5", "pread"): hdf5_pread,
    ("arrow", "pread"): arrow_pread,
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--format", required=True, choices=["npy", "hdf5", "arrow"])
    p.add_argument("--variant", required=True, choices=["memmap", "pread"])
    p.add_argument("--batch-size", type=int, required=True, help="global batch size (divided by the ranks)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--time-limit", type=float, default=0, help="seconds per epoch at most (0: none)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    torch.set_num_threads(1)
    rank, size = rank_and_size()
    if args.batch_size % size:
        sys.exit(f"torch_cold: batch size {args.batch_size} is not divisible by {size} ranks")
    dataset = VARIANTS[(args.format, args.variant)](args.data)
    sampler = DistributedSampler(dataset, num_replicas=size, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size // size, sampler=sampler, num_workers=args.workers,
                        drop_last=True, persistent_workers=args.workers > 0)
    for e in range(args.epochs):
        sampler.set_epoch(e)
        start = time.perf_counter()
        samples = 0
        for batch in loader:
            samples += next(iter(batch.values())).shape[0]
            if args.time_limit and time.perf_counter() - start > args.time_limit:
                break
        seconds = time.perf_counter() - start
        print(json.dumps({"rank": rank, "epoch": e, "samples": samples, "seconds": seconds}), flush=True)
        if args.time_limit and seconds > args.time_limit:
            break  # an epoch that did not finish: the next would start from a cold cache anyway


if __name__ == "__main__":
    main()
