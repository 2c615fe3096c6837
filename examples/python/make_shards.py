"""Writes WebDataset shards of small JPEG images for wds_decode.py, with
``webdataset.TarWriter``: sample ``k`` is ``{key}.jpg`` (a 32×24 image filled with a colour
that encodes its class) and ``{key}.cls`` (the class, 0-9), as LAION and ImageNet shards
lay out image and label.

    python examples/python/make_shards.py OUT_DIR [--samples N] [--shards S]

Needs, beside numpy: webdataset, Pillow (``launch/setup.sh --test``'s venv has them).

"""

import argparse
import io
import os

import numpy as np
import webdataset
from PIL import Image


def colour(cls: int) -> tuple[int, int, int]:
    """The colour of class ``cls``: what wds_decode.py checks a decoded image against."""
    return (25 * cls, 255 - 25 * cls, 128)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--samples", type=int, default=600)
    p.add_argument("--shards", type=int, default=3)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(0)
    bounds = np.linspace(0, a.samples, a.shards + 1).astype(int)
    for s in range(a.shards):
        with webdataset.TarWriter(os.path.join(a.out, f"images-{s:06d}.tar")) as w:
            for k in range(bounds[s], bounds[s + 1]):
                cls = int(rng.integers(0, 10))
                jpg = io.BytesIO()
                Image.new("RGB", (32, 24), colour(cls)).save(jpg, format="JPEG", quality=90)
                w.write({"__key__": f"{k:08d}", "jpg": jpg.getvalue(), "cls": cls})
    print(f"make_shards: {a.samples} JPEG samples in {a.shards} shards under {a.out}")


if __name__ == "__main__":
    main()
