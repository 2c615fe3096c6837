"""WebDataset shards through meshfeed, JPEGs decoded after delivery.

    python examples/python/make_shards.py /tmp/mf-shards
    mpirun -np 4 python examples/python/wds_decode.py /tmp/mf-shards
    mpirun -np 4 python examples/python/wds_decode.py /tmp/mf-shards --device cuda   # on GPUs

Needs, beside meshfeed and numpy: torch, Pillow (torchvision on GPUs); its shards
(make_shards.py) webdataset, Pillow (``launch/setup.sh --test``'s venv has them).

meshfeed reads the shards' members in place (no extraction), shuffles the samples globally
and hands each rank its part of every batch: ``jpg`` and ``cls`` arrive as bytes, one per
sample. Decoding stays with the program, after delivery: on a GPU with torchvision,
``torchvision.io.decode_jpeg(..., device="cuda")`` decodes a whole batch there; otherwise
Pillow decodes on the CPU. The example checks every decoded image against the colour its
class was drawn in (make_shards.py) and that the ranks together received every sample once
per epoch.
"""

import argparse
import io
import os

import numpy as np
import torch.distributed as dist

import meshfeed

SIZE = (24, 32, 3)


def decoder(device: str):
    """Batch JPEG decoding: torchvision on the GPU where asked, else Pillow."""
    if device == "cuda":
        import torch
        import torchvision.io

        def on_gpu(jpgs: list[bytes]) -> np.ndarray:
            data = [torch.frombuffer(bytearray(j), dtype=torch.uint8) for j in jpgs]
            images = torchvision.io.decode_jpeg(data, device="cuda")  # [C, H, W] each
            return torch.stack(images).permute(0, 2, 3, 1).cpu().numpy()

        return on_gpu
    from PIL import Image

    def on_cpu(jpgs: list[bytes]) -> np.ndarray:
        return np.stack([np.asarray(Image.open(io.BytesIO(j)).convert("RGB")) for j in jpgs])

    return on_cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shards")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = p.parse_args()
    if "RANK" not in os.environ:  # mpirun: Open MPI's variables
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo")  # to check the ranks' ids together
    decode = decoder(a.device)
    loader = meshfeed.Loader([a.shards], batch_size=a.batch_size, seed=3)
    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        ids: list[int] = []
        for batch in loader:
            images = decode(batch["jpg"])
            classes = [int(c) for c in batch["cls"]]  # WebDataset writes an int label as text
            assert images.shape == (len(batch.ids), *SIZE), images.shape
            for image, cls in zip(images, classes):
                want = np.array([25 * cls, 255 - 25 * cls, 128])
                got = image.reshape(-1, 3).mean(axis=0)
                assert np.abs(got - want).max() < 8, f"class {cls}: mean colour {got}, drawn in {want}"
            ids.extend(batch.ids.tolist())
        # The ranks together decoded each sample of the epoch's batches once.
        parts: list = [None] * dist.get_world_size()
        dist.all_gather_object(parts, ids)
        every = [i for part in parts for i in part]
        assert len(every) == len(set(every)) == len(loader) * a.batch_size, "an image twice or missing"
        if loader.rank == 0:
            print(f"epoch {epoch}: {len(every)} images decoded ({a.device}), each once, on "
                  f"{loader.world_size} ranks", flush=True)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
