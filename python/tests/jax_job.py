"""Builds global jax.Arrays from meshfeed batches on a multi-process CPU JAX, each process
driving several forced host devices, and writes what every device holds in the command
line's ``--dump`` format, one file per *device* (``DIR/rank-<device>.jsonl``), so that it
can be compared with a command-line run of one rank per device.

    XLA_FLAGS=--xla_force_host_platform_device_count=K \\
        mpirun -np P python jax_job.py OPTIONS_JSON OUT_DIR EPOCHS COORDINATOR

OPTIONS_JSON are Loader keyword arguments (``devices_per_process`` is set to K here).
JAX joins its job at COORDINATOR (host:port) with Open MPI's rank and size.
"""

import json
import os
import sys
import zlib

import jax
import numpy as np

import meshfeed
import meshfeed.jax


def main() -> None:
    options, out, epochs, coordinator = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    jax.config.update("jax_enable_x64", True)  # int64 ids and labels, byte for byte
    jax.distributed.initialize(
        coordinator,
        num_processes=int(os.environ["OMPI_COMM_WORLD_SIZE"]),
        process_id=int(os.environ["OMPI_COMM_WORLD_RANK"]),
    )
    k = jax.local_device_count()
    data = options.pop("data")
    loader = meshfeed.Loader(data, devices_per_process=k, **options)
    axes = loader.mesh_shape
    mesh = jax.make_mesh(tuple(axes.values()), tuple(axes))
    # Where each device sits in the mesh: meshfeed's device number from its coordinate.
    device_of = {}
    for d, coords in enumerate(loader.layout["device_coords"]):
        device_of[mesh.devices[tuple(coords)].id] = d
    batch_axes = loader.partition_specs()["y"][0] if loader.partition_specs()["y"] else None
    os.makedirs(out, exist_ok=True)
    lines = {}
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            arrays = meshfeed.jax.make_global(batch, mesh)
            ids = jax.make_array_from_process_local_data(
                jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(batch_axes)), batch.ids,
                (batch.global_rows,))
            assert all(a.shape[0] == batch.global_rows for a in arrays.values())
            for shard in ids.addressable_shards:
                d = device_of[shard.device.id]
                line = {"epoch": batch.epoch, "step": batch.step, "ids": np.asarray(shard.data).tolist(), "crc32": {}}
                for name in sorted(arrays):
                    (mine,) = [s for s in arrays[name].addressable_shards if s.device == shard.device]
                    line["crc32"][name] = [zlib.crc32(np.ascontiguousarray(r).tobytes()) for r in np.asarray(mine.data)]
                lines.setdefault(d, []).append(line)
    for d, dev_lines in lines.items():
        with open(os.path.join(out, f"rank-{d}.jsonl"), "w") as f:
            for line in dev_lines:
                f.write(json.dumps(line, separators=(",", ":")) + "\n")
    loader.close()
    print(f"ok process {jax.process_index()} devices {sorted(lines)}", flush=True)


if __name__ == "__main__":
    main()
