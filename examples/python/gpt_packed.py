"""A tiny GPT trained on packed sequences with data × context parallelism (CPU, gloo), fed by
meshfeed.

    python examples/python/make_corpus.py /tmp/mf-corpus --format megatron
    mpirun -np 4 python examples/python/gpt_packed.py /tmp/mf-corpus --mesh dp=2,cp=2

Needs, beside meshfeed and numpy: torch; its corpus (make_corpus.py) megatron-core, or
pyarrow for Parquet (``launch/setup.sh --test``'s venv has them).

meshfeed packs the corpus's documents into sequences (``--pack
tokens:SEQ,eos=0,position_ids,cu_seqlens``: SEQ inputs, their labels, each input's position
in its document's run inside the sequence, restarting at 0 at the sequence's start and at
each document's as Megatron-LM's ``reset_position_ids`` does, so below SEQ, and where the
documents start) and hands each rank its dp block of every
global batch and, of each sequence, the two chunks of the zigzag split its cp coordinate
holds (``shard={"tokens": "dp,zigzag:cp", ...}``), the layout of Megatron-LM's context
parallelism. The attention gathers the keys and values of the cp group (context
parallelism by all-gather) and masks them by global position (causal) and by document
(from ``cu_seqlens``), so no token attends to another document. Gradients are averaged
over all ranks.

It checks what it is given: each epoch every packed sequence reaches the cp ranks of
exactly one dp group, the cp group's chunks put back in order give labels that are the
inputs shifted by one token, and rank 0 prints the mean loss, which falls.
"""

import argparse
import math
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import meshfeed

VOCAB = 64


class GatherCP(torch.autograd.Function):
    """All-gather of keys or values over the cp group along the token axis; the backward
    sums the gathered gradient over the group and keeps this rank's part."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, size: int, index: int) -> torch.Tensor:  # type: ignore[override]
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.group, ctx.index, ctx.n = group, index, x.shape[2]
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[:, :, ctx.index * ctx.n:(ctx.index + 1) * ctx.n], None, None, None


class TinyGPT(torch.nn.Module):
    def __init__(self, max_position: int = 256, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.tok = torch.nn.Embedding(VOCAB, d)
        self.pos = torch.nn.Embedding(max_position, d)
        self.ln1, self.ln2, self.ln_f = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        self.head = torch.nn.Linear(d, VOCAB)

    def forward(self, tokens, positions, mask, cp) -> torch.Tensor:
        """tokens, positions: [b, n] (this rank's chunks); mask: [b, n, cp·n], which of the
        cp group's tokens each of these may attend to."""
        # Positions restart at each sequence and each document in it: all below the sequence
        # length, the table's size.
        x = self.tok(tokens) + self.pos(positions)
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        k, v = GatherCP.apply(k, *cp), GatherCP.apply(v, *cp)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
        x = x + self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d))
        x = x + self.mlp(self.ln2(x))
        return self.head(self.ln_f(x))


def zigzag_positions(seq: int, cp: int, i: int) -> torch.Tensor:
    """The sequence positions cp rank i holds: chunks i and 2·cp − 1 − i of 2·cp."""
    c = seq // (2 * cp)
    return torch.cat([torch.arange(i * c, (i + 1) * c), torch.arange((2 * cp - 1 - i) * c, (2 * cp - i) * c)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--mesh", default="dp=2,cp=2", help="dp=D,cp=C (D·C ranks)")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16, help="global batch size (sequences)")
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()
    if "RANK" not in os.environ:  # mpirun: Open MPI's variables
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in a.mesh.split(","))
    dp, cp = sizes["dp"], sizes["cp"]
    assert list(sizes) == ["dp", "cp"] and dp * cp == world, f"--mesh {a.mesh}: dp=D,cp=C with D·C = {world}"
    # Ranks are numbered row-major over the mesh: cp is the fastest axis.
    my_dp, my_cp = rank // cp, rank % cp
    groups = [dist.new_group(list(range(g * cp, (g + 1) * cp))) for g in range(dp)]
    cp_args = (groups[my_dp], cp, my_cp)
    seq = a.seq_len
    split = "dp,zigzag:cp"
    loader = meshfeed.Loader([a.data], batch_size=a.batch_size, seed=7, mesh=a.mesh,
                             pack=f"tokens:{seq},eos=0,position_ids,cu_seqlens",
                             shard={"tokens": split, "labels": split, "position_ids": split})

    torch.manual_seed(0)
    model = TinyGPT(max_position=seq)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    mine = zigzag_positions(seq, cp, my_cp)
    group_positions = torch.cat([zigzag_positions(seq, cp, j) for j in range(cp)])  # all_gather order
    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        seen, total, steps = [], 0.0, 0
        for batch in loader:
            t = batch.to_torch("cpu")
            tokens, labels, positions = t["tokens"].long(), t["labels"].long(), t["position_ids"]
            # Document of every sequence position, from cu_seqlens (whole on every cp rank).
            values, offsets = t["cu_seqlens"]
            doc = torch.stack([
                torch.bucketize(torch.arange(seq), values[offsets[r]:offsets[r + 1]], right=True)
                for r in range(len(tokens))
            ])
            causal = group_positions[None, :] <= mine[:, None]
            same_doc = doc[:, mine][:, :, None] == doc[:, group_positions][:, None, :]
            logits = model(tokens, positions, causal[None] & same_doc, cp_args)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
            opt.zero_grad()
            loss.backward()
            grads = torch.cat([q.grad.reshape(-1) for q in model.parameters()])
            dist.all_reduce(grads)
            at = 0
            for q in model.parameters():
                q.grad.copy_(grads[at:at + q.numel()].view_as(q) / world)
                at += q.numel()
            opt.step()
            if steps == 0:
                # The cp group's chunks in sequence order: labels are the inputs shifted.
                full = {}
                for name, local in (("tokens", tokens), ("labels", labels)):
                    parts = [torch.empty_like(local) for _ in range(cp)]
                    dist.all_gather(parts, local, group=groups[my_dp])
                    full[name] = torch.empty(len(local), seq, dtype=local.dtype)
                    full[name][:, group_positions] = torch.cat(parts, dim=1)
                assert torch.equal(full["labels"][:, :-1], full["tokens"][:, 1:]), "zigzag chunks out of place"
            seen.append(batch.ids.copy())
            total += loss.item()
            steps += 1
        # Every sequence of the epoch's batches reached one dp group, on each of its cp ranks.
        mine_ids = torch.from_numpy(np.concatenate(seen))
        parts = [torch.empty_like(mine_ids) for _ in range(world)]
        dist.all_gather(parts, mine_ids)
        for g in range(dp):
            assert all(torch.equal(parts[g * cp], parts[g * cp + j]) for j in range(cp)), "a cp group disagrees"
        ids = torch.cat([parts[g * cp] for g in range(dp)])
        assert len(ids) == len(loader) * a.batch_size == len(torch.unique(ids)), "a sequence twice or missing"
        mean = torch.tensor([total / steps])
        dist.all_reduce(mean)
        if rank == 0:
            print(f"epoch {epoch} loss {mean.item() / world:.4f} ({len(ids)} sequences of {seq}, each once, "
                  f"dp={dp} cp={cp})", flush=True)
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
