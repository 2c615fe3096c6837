"""Writes a small learnable token corpus for the packed-sequence example (gpt_packed.py):
documents of 8-60 tokens that count up from a random start (``t, t+1, t+2, ...`` modulo the
vocabulary), as a Megatron-LM indexed dataset (``.bin`` + ``.idx``, written by
megatron.core's ``IndexedDatasetBuilder``) or as Parquet with a ``List<int32>`` column
``tokens`` (pyarrow), in several files.

    python examples/python/make_corpus.py OUT_DIR [--format megatron|parquet] [--documents N]

Needs, beside numpy: megatron-core and torch (``--format megatron``), or pyarrow
(``--format parquet``); ``launch/setup.sh --test``'s venv has them.

Token 0 is kept free for the end-of-document token the example packs with
(``--pack tokens:SEQ,eos=0``).
"""

import argparse
import os

import numpy as np

VOCAB = 64


def documents(n: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    docs = []
    for _ in range(n):
        start, length = int(rng.integers(1, VOCAB)), int(rng.integers(8, 61))
        docs.append([1 + (start + i) % (VOCAB - 1) for i in range(length)])
    return docs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--format", default="parquet", choices=["parquet", "megatron"])
    p.add_argument("--documents", type=int, default=2000)
    p.add_argument("--files", type=int, default=2)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    docs = documents(a.documents)
    bounds = np.linspace(0, len(docs), a.files + 1).astype(int)
    for f in range(a.files):
        part = docs[bounds[f]:bounds[f + 1]]
        if a.format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.table({"tokens": pa.array(part, pa.list_(pa.int32()))})
            pq.write_table(table, os.path.join(a.out, f"train-{f:05d}.parquet"), row_group_size=256)
        else:
            import torch
            from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

            prefix = os.path.join(a.out, f"corpus-{f}")
            builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
            for doc in part:
                builder.add_item(torch.tensor(doc, dtype=torch.int64))
                builder.end_document()
            builder.finalize(prefix + ".idx")
    tokens = sum(len(d) for d in docs)
    print(f"make_corpus: {len(docs)} documents, {tokens} tokens in {a.files} {a.format} files under {a.out}")


if __name__ == "__main__":
    main()
