"""Writes a small learnable dataset for the Python examples: NumPy structured arrays with
``x`` (f32[16]) and ``y`` (i64, the class of x under a fixed linear map, 4 classes), in
several files, as meshfeed reads them. ``--row-bytes`` pads each sample with a field
``pad`` of zeros to that size (storage-bound benchmarks: bench/balance.py).

    python examples/python/make_data.py OUT_DIR [--samples N] [--files F] [--row-bytes B]
"""

import argparse
import os

import numpy as np

DTYPE = np.dtype([("x", "<f4", (16,)), ("y", "<i8")])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--row-bytes", type=int, default=DTYPE.itemsize)
    a = p.parse_args()
    dtype = DTYPE
    if a.row_bytes > DTYPE.itemsize:
        dtype = np.dtype(DTYPE.descr + [("pad", "u1", (a.row_bytes - DTYPE.itemsize,))])
    elif a.row_bytes < DTYPE.itemsize:
        p.error(f"--row-bytes {a.row_bytes}: a sample holds at least {DTYPE.itemsize} bytes")
    rng = np.random.default_rng(0)
    w = rng.normal(size=(16, 4)).astype(np.float32)
    os.makedirs(a.out, exist_ok=True)
    bounds = np.linspace(0, a.samples, a.files + 1).astype(int)
    for i in range(a.files):
        n = bounds[i + 1] - bounds[i]
        rows = np.zeros(n, dtype=dtype)
        rows["x"] = rng.normal(size=(n, 16)).astype(np.float32)
        rows["y"] = np.argmax(rows["x"] @ w, axis=1)
        np.save(os.path.join(a.out, f"part-{i:05d}.npy"), rows)
    print(f"wrote {a.samples} samples in {a.files} files to {a.out}")


if __name__ == "__main__":
    main()
