"""A Ray Train ``TorchTrainer`` whose workers are fed by meshfeed over UCX.

    python examples/python/make_data.py /tmp/mf-data
    python examples/python/ray_train.py /tmp/mf-data --workers 2            # a local Ray
    python examples/python/ray_train.py /tmp/mf-data --address auto --placement-strategy SPREAD
                                                                # a running cluster, one worker a node

Needs, beside meshfeed and numpy: ray[train], torch (``launch/setup.sh --test``'s venv has
them).

Ray Train starts one worker per rank and initialises torch.distributed (gloo) among
them; meshfeed's UCX transport joins through that process group's store, so no port or
token has to be arranged. The dataset path must be readable on every node (shared
storage). Each epoch the workers check that they received every sample once, and
worker 0 reports the mean loss, which falls.
"""

import argparse
import socket

import ray
import torch
import torch.distributed as dist
import torch.nn.functional as F
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model

import meshfeed


def train_loop_per_worker(config: dict) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(16, 4))  # DistributedDataParallel
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = meshfeed.Loader([config["data"]], batch_size=config["batch_size"], seed=42, transport="ucx")
    print(f"worker {rank} of {world} on {socket.gethostname()}", flush=True)
    for epoch in range(config["epochs"]):
        loader.set_epoch(epoch)
        seen, total, steps = [], 0.0, 0
        for batch in loader:
            t = batch.to_torch(device="cpu")
            loss = F.cross_entropy(model(t["x"]), t["y"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen.append(t["ids"].clone())
            total += loss.item()
            steps += 1
        mine = torch.cat(seen)
        parts = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(parts, mine)
        ids = torch.cat(parts)
        assert len(ids) == len(loader) * config["batch_size"] == len(torch.unique(ids)), "a sample twice or missing"
        mean = torch.tensor([total / steps])
        dist.all_reduce(mean)
        if rank == 0:
            print(f"epoch {epoch} loss {mean.item() / world:.4f} ({len(ids)} samples, each once)", flush=True)
    loader.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=128, help="global batch size")
    p.add_argument("--address", default=None, help="a Ray cluster to join (default: start a local one)")
    p.add_argument("--placement-strategy", default="PACK", choices=["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"],
                   help="how Ray Train places the workers on the cluster's nodes (default PACK)")
    a = p.parse_args()
    ray.init(address=a.address)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"data": a.data, "epochs": a.epochs, "batch_size": a.batch_size},
        scaling_config=ScalingConfig(num_workers=a.workers, use_gpu=False, placement_strategy=a.placement_strategy),
    )
    result = trainer.fit()
    print(f"ray_train: finished ({result.error or 'no error'})", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
