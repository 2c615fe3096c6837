"""A multi-process JAX training loop (CPU) fed by meshfeed: one process per host driving
all its local devices, data parallel over every device of the job.

    python examples/python/make_data.py /tmp/mf-data
    XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
        mpirun -np 4 -x XLA_FLAGS python examples/python/jax_train.py /tmp/mf-data

Needs, beside meshfeed and numpy: jax (``launch/setup.sh --test``'s venv has them).

JAX meets at MESHFEED_JAX_COORDINATOR (default 127.0.0.1:12355; rank 0's host across
nodes) with Open MPI's rank and size (or JAX's own detection under Slurm); meshfeed
uses MPI under mpirun (``--transport ucx``: UCX through JAX's key-value store). Each process receives
the union of its devices' shards (``devices_per_process``) and
``meshfeed.jax.make_global`` assembles the global batch. Each epoch the example checks
that the global batches held every sample once, and process 0 prints the mean loss,
which falls.
"""

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import meshfeed
import meshfeed.jax


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=128, help="global batch size")
    p.add_argument("--transport", default="auto", choices=["auto", "mpi", "ucx"])
    a = p.parse_args()
    jax.config.update("jax_enable_x64", True)  # int64 labels and ids as they are
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        jax.distributed.initialize(
            os.environ.get("MESHFEED_JAX_COORDINATOR", "127.0.0.1:12355"),
            num_processes=int(os.environ["OMPI_COMM_WORLD_SIZE"]),
            process_id=int(os.environ["OMPI_COMM_WORLD_RANK"]),
        )
    else:
        jax.distributed.initialize()

    devices = jax.device_count()
    loader = meshfeed.Loader([a.data], batch_size=a.batch_size, seed=42, transport=a.transport,
                             mesh=f"dp={devices}", devices_per_process=jax.local_device_count())
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("dp",))
    batch_sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("dp"))

    params = {"w": jnp.zeros((16, 4), jnp.float32), "b": jnp.zeros((4,), jnp.float32)}

    def loss_fn(params, x, y):
        logits = x @ params["w"] + params["b"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

    @jax.jit
    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 0.5 * g, params, grads), loss

    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        losses, ids = [], []
        for batch in loader:
            arrays = meshfeed.jax.make_global(batch, mesh)
            params, loss = step(params, arrays["x"], arrays["y"])
            losses.append(loss)
            ids.append(jax.make_array_from_process_local_data(batch_sharding, batch.ids, (batch.global_rows,)))
        # The global batches together held each sample of the epoch once.
        every = np.concatenate([multihost_utils.process_allgather(i, tiled=True) for i in ids])
        assert len(every) == len(loader) * a.batch_size == len(np.unique(every)), "a sample twice or missing"
        if jax.process_index() == 0:
            mean = float(np.mean([float(loss) for loss in losses]))
            print(f"epoch {epoch} loss {mean:.4f} ({len(every)} samples, each once, on {devices} devices "
                  f"in {jax.process_count()} processes)", flush=True)
    loader.close()


if __name__ == "__main__":
    main()
