"""A PyTorch DistributedDataParallel loop (CPU, gloo) fed by meshfeed.

    python examples/python/make_data.py /tmp/mf-data
    mpirun -np 4 python examples/python/torch_ddp.py /tmp/mf-data
    torchrun --standalone --nproc-per-node 4 examples/python/torch_ddp.py /tmp/mf-data

Needs, beside meshfeed and numpy: torch (``launch/setup.sh --test``'s venv has them).

Under mpirun, torch.distributed takes its rank and size from Open MPI's variables and
meets at MASTER_ADDR:MASTER_PORT (default 127.0.0.1:29500; set MASTER_ADDR to rank 0's
host across nodes), and meshfeed's default transport ("auto") uses MPI. Under torchrun it
joins over UCX through torch.distributed's store. Each epoch the example checks that the ranks
together received every sample once, and rank 0 prints the mean loss, which falls.

Preemption: with ``--state PATH`` (or ``$MESHFEED_STATE``: under
``sbatch slurm/preemptible.sbatch -- python torch_ddp.py DATA``) the loop asks ``loader.stop_requested()`` after every
step; when any rank received SIGTERM or SIGUSR1 (``sbatch --signal=USR1@60``), every rank
stops after the same step, rank 0 saves the model and the loader's state to PATH, and all
exit 75 for the scheduler to requeue. Started again with the same PATH, the job resumes
there, on any number of ranks, with the batches it would have had.

At the end rank 0 prints the share of step time spent waiting for data (fetching the
next batch and handing it to the device). ``--telemetry DIR`` has every rank's loader
record its windows, epochs and steps there: ``meshfeed report DIR`` reads them as it
reads ``meshfeed run``'s. ``--device cuda`` trains on each rank's GPU
(``cuda:LOCAL_RANK``; ranks share GPUs round-robin where they outnumber them);
``--loader dataloader`` runs the baseline instead: PyTorch's ``DataLoader`` +
``DistributedSampler`` over the same files (``--workers`` processes,
pinned memory on a GPU), to compare the two:

    torchrun --nproc-per-node 4 torch_ddp.py DATA --device cuda
    torchrun --nproc-per-node 4 torch_ddp.py DATA --loader dataloader --workers 4 --device cuda
"""

import argparse
import glob
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import meshfeed


class NpyFiles(torch.utils.data.Dataset):
    """The baseline's dataset: the same structured .npy files, memory-mapped, one sample
    per index (random reads, as DistributedSampler asks for them)."""

    def __init__(self, data: str) -> None:
        self.files = [np.load(f, mmap_mode="r") for f in sorted(glob.glob(os.path.join(data, "*.npy")))]
        self.starts = np.cumsum([0] + [len(f) for f in self.files])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> dict:
        f = int(np.searchsorted(self.starts, i, side="right")) - 1
        row = self.files[f][i - self.starts[f]]
        return {"x": torch.from_numpy(np.array(row["x"])), "y": int(row["y"]), "ids": i}


def baseline_batches(loader: torch.utils.data.DataLoader, device: torch.device):
    for batch in loader:
        yield {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def loader_option(text: str) -> tuple:
    key, sep, value = text.partition("=")
    if not sep:
        sys.exit(f"torch_ddp: --loader-option {text!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128, help="global batch size")
    p.add_argument("--transport", default="auto", choices=["auto", "mpi", "ucx"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--loader", default="meshfeed", choices=["meshfeed", "dataloader"])
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes (baseline)")
    p.add_argument("--state", default=os.environ.get("MESHFEED_STATE"),
                   help="save here when stopped by SIGTERM/SIGUSR1, and resume from it (meshfeed; default: "
                        "$MESHFEED_STATE, which slurm/preemptible.sbatch sets)")
    p.add_argument("--telemetry", help="each rank writes its loader's telemetry here, for `meshfeed report` (meshfeed)")
    p.add_argument("--loader-option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other meshfeed.Loader keyword, e.g. read_strategy=random or memory_budget=0 "
                        "(VALUE as JSON where it parses, else a string; repeatable)")
    a = p.parse_args()
    options = dict(loader_option(o) for o in a.loader_option)
    if "RANK" not in os.environ:  # mpirun: Open MPI's variables; srun: Slurm's
        os.environ["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ["SLURM_NTASKS"]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    if a.device == "cuda":
        # One GPU per rank where there are enough; ranks share them where there are not.
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    model = torch.nn.Linear(16, 4).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if a.device == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    first_epoch, resumed = 0, False
    if a.loader == "meshfeed":
        loader = meshfeed.Loader([a.data], batch_size=a.batch_size, seed=42, transport=a.transport,
                                 telemetry=a.telemetry, **options)
        if a.state and os.path.exists(a.state):
            with open(a.state) as f:
                saved = json.load(f)
            model.module.load_state_dict({k: torch.tensor(v) for k, v in saved["model"].items()})
            loader.load_state_dict(saved["loader"])
            first_epoch, resumed = saved["loader"]["epoch"], True
            if rank == 0:
                print(f"resumed at epoch {first_epoch} step {saved['loader']['step']}", flush=True)
    else:
        dataset = NpyFiles(a.data)
        sampler = torch.utils.data.distributed.DistributedSampler(dataset, seed=42, drop_last=True)
        loader = torch.utils.data.DataLoader(dataset, batch_size=a.batch_size // world, sampler=sampler,
                                             num_workers=a.workers, pin_memory=a.device == "cuda", drop_last=True,
                                             persistent_workers=a.workers > 0)
    waited = stepped = 0.0
    for epoch in range(first_epoch, a.epochs):
        if not (resumed and epoch == first_epoch):  # a resumed loader stands where it stopped
            (loader if a.loader == "meshfeed" else sampler).set_epoch(epoch)
        if a.loader == "meshfeed":
            batches = (b.to_torch(device) for b in loader)
        else:
            batches = baseline_batches(loader, device)
        seen, total, steps = [], 0.0, 0
        start = time.perf_counter()
        while True:
            t = next(batches, None)  # waiting for data: the next batch, on the device
            got = time.perf_counter()
            if t is None:
                break
            loss = F.cross_entropy(model(t["x"]), t["y"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen.append(t["ids"].to("cpu", copy=True))
            total += loss.item()  # waits for the device: the step is over
            steps += 1
            end = time.perf_counter()
            waited, stepped, start = waited + (got - start), stepped + (end - start), end
            if a.state and a.loader == "meshfeed" and loader.stop_requested():
                # Every rank stops after this same step; the state resumes after it.
                state = loader.state_dict()
                if rank == 0:
                    model_state = {k: v.tolist() for k, v in model.module.state_dict().items()}
                    with open(a.state + ".tmp", "w") as f:
                        json.dump({"model": model_state, "loader": state}, f)
                    os.replace(a.state + ".tmp", a.state)
                print(f"rank {rank} stopped before epoch {state['epoch']} step {state['step']}: state saved to "
                      f"{a.state}", flush=True)
                loader.close()
                dist.destroy_process_group()
                sys.exit(75)
        # Every rank received a disjoint part of each global batch: together, each sample
        # of the epoch's batches exactly once.
        mine = torch.cat(seen)
        parts = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(parts, mine)
        ids = torch.cat(parts)
        # (A resumed epoch has the steps after the saved one.)
        whole = len(loader) * (a.batch_size if a.loader == "meshfeed" else a.batch_size // world * world)
        expected = steps * a.batch_size if resumed and epoch == first_epoch else whole
        assert len(ids) == expected == len(torch.unique(ids)), "a sample twice or missing"
        mean = torch.tensor([total / steps])
        dist.all_reduce(mean)
        if rank == 0:
            print(f"epoch {epoch} loss {mean.item() / world:.4f} ({len(ids)} samples, each once)", flush=True)
    share = torch.tensor([waited / stepped])
    dist.all_reduce(share)
    if rank == 0:
        print(f"data wait: {100 * share.item() / world:.1f}% of step time ({a.loader}, {device.type}, "
              f"{world} ranks)", flush=True)
    if a.loader == "meshfeed":
        loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
