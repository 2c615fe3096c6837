"""A meshfeed.Loader inside a torch.distributed job (run by torchrun), writing what this
rank received — through ``Batch.to_torch`` — in the command line's ``--dump`` format.

    torchrun --standalone --nproc-per-node N torch_job.py OPTIONS_JSON OUT_DIR EPOCHS MODE

MODE ``store``: a gloo process group is initialised first and UCX joins through its store.
MODE ``env``: no process group; UCX joins on MESHFEED_MASTER_PORT (torchrun's store holds
MASTER_PORT) with MESHFEED_JOB_TOKEN from the environment.
MODE ``auto``: as ``env``, with ``transport="auto"``, which picks UCX under torchrun.
"""

import json
import os
import sys
import zlib

import torch
import torch.distributed as dist

import meshfeed


def main() -> None:
    options, out, epochs, mode = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if mode in ("store", "default"):
        dist.init_process_group("gloo")
    data = options.pop("data")
    if mode == "default":  # a DDP program's usual loader: no transport, no bootstrap
        loader = meshfeed.Loader(data, **options)
    else:
        transport = "auto" if mode == "auto" else "ucx"
        loader = meshfeed.Loader(data, transport=transport, bootstrap="torch" if mode == "store" else "env", **options)
    assert loader.rank == int(os.environ["RANK"]) and loader.local_rank == int(os.environ["LOCAL_RANK"])
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank-{loader.rank}.jsonl"), "w") as dump:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                tensors = batch.to_torch(device="cpu")
                assert tensors["ids"].dtype == torch.int64 and tensors["x"].dtype == torch.float32
                # DLPack: the tensor is the loader's buffer, not a copy.
                assert tensors["x"].data_ptr() == batch["x"].ctypes.data
                crc = {name: [zlib.crc32(row.numpy().tobytes()) for row in tensors[name]] for name in sorted(batch)}
                line = {"epoch": batch.epoch, "step": batch.step, "ids": tensors["ids"].tolist(), "crc32": crc}
                dump.write(json.dumps(line, separators=(",", ":")) + "\n")
    loader.close()
    if mode in ("store", "default"):
        dist.barrier()  # the process group still works after the loader used its store
        dist.destroy_process_group()
    print(f"ok rank {loader.rank} local {loader.local_rank}", flush=True)


if __name__ == "__main__":
    main()
