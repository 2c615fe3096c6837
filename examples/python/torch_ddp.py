"""A PyTorch DistributedDataParallel loop (CPU, gloo) fed by meshfeed.

    python examples/python/make_data.py /tmp/mf-data
    mpirun -np 4 python examples/python/torch_ddp.py /tmp/mf-data
    torchrun --standalone --nproc-per-node 4 examples/python/torch_ddp.py /tmp/mf-data --transport ucx

Under mpirun, torch.distributed takes its rank and size from Open MPI's variables and
meets at MASTER_ADDR:MASTER_PORT (default 127.0.0.1:29500; set MASTER_ADDR to rank 0's
host across nodes), and meshfeed uses MPI. Under torchrun, meshfeed's UCX transport
joins through torch.distributed's store. Each epoch the example checks that the ranks
together received every sample once, and rank 0 prints the mean loss, which falls.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import meshfeed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128, help="global batch size")
    p.add_argument("--transport", default="mpi", choices=["mpi", "ucx"])
    a = p.parse_args()
    if "RANK" not in os.environ:  # mpirun: Open MPI's variables
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = meshfeed.Loader([a.data], batch_size=a.batch_size, seed=42, transport=a.transport)
    for epoch in range(a.epochs):
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
        # Every rank received a disjoint part of each global batch: together, each sample
        # of the epoch's batches exactly once.
        mine = torch.cat(seen)
        parts = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(parts, mine)
        ids = torch.cat(parts)
        assert len(ids) == len(loader) * a.batch_size == len(torch.unique(ids)), "a sample twice or missing"
        mean = torch.tensor([total / steps])
        dist.all_reduce(mean)
        if rank == 0:
            print(f"epoch {epoch} loss {mean.item() / world:.4f} ({len(ids)} samples, each once)", flush=True)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
