"""JAX hand-off: a meshfeed batch as global ``jax.Array`` s on a ``jax.sharding.Mesh``.

Each process holds its devices' shards (with ``devices_per_process=K``, the union of K
devices' shards); :func:`make_global` assembles the global arrays with
``jax.make_array_from_process_local_data``, without communication::

    mesh = jax.make_mesh((2, 2), ("dp", "tp"))          # the loader's mesh, same order
    loader = meshfeed.Loader(data, batch_size=64, mesh="dp=2,tp=2",
                             shard={"x": "dp,tp"}, devices_per_process=jax.local_device_count())
    for batch in loader:
        arrays = meshfeed.jax.make_global(batch, mesh)  # {"x": jax.Array, ...}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Optional

import numpy as np

from . import Batch, ConfigError, Loader

if TYPE_CHECKING:
    import jax

__all__ = ["make_global"]


def _check_mesh(loader: Loader, mesh: jax.sharding.Mesh) -> None:
    """The JAX mesh must be the loader's: same axes and sizes, and each device of it in
    the process meshfeed delivers that device's shard to."""
    want = loader.mesh_shape
    got = dict(mesh.shape)
    if list(got.items()) != list(want.items()):
        raise ConfigError(f"the JAX mesh {got} is not the loader's mesh {want} (same axes, sizes and order)")
    k = loader.devices_per_process
    for d, coords in enumerate(loader.layout["device_coords"]):
        device = mesh.devices[tuple(coords)]
        if device.process_index != d // k:
            raise ConfigError(
                f"the JAX mesh has device {device} (process {device.process_index}) at {dict(zip(want, coords))}, "
                f"where meshfeed places the shard of its device {d}, driven by process {d // k}: build the mesh "
                f"from jax.devices() in order (jax.make_mesh or Mesh(np.array(jax.devices()).reshape(...)))"
            )


def make_global(
    batch: Batch,
    mesh: jax.sharding.Mesh,
    specs: Optional[Mapping[str, jax.sharding.PartitionSpec]] = None,
    *,
    allow_downcast: bool = False,
) -> dict[str, jax.Array]:
    """The batch's tensor fields as global ``jax.Array`` s of shape ``[global_rows, *shape]``
    sharded by ``NamedSharding(mesh, spec)``.

    ``specs`` maps field names to ``PartitionSpec`` s; fields it leaves out use the
    loader's own sharding (:meth:`meshfeed.Loader.partition_specs`), which is what the
    shards were cut by. Variable-length fields are left out. Every process calls it for
    the same batch (fields a pipeline stage does not receive are absent).
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    loader = batch._loader
    if loader is None:
        raise ConfigError("make_global needs a batch from a meshfeed.Loader")
    _check_mesh(loader, mesh)
    own = loader.partition_specs()
    shapes = {f["name"]: f["shape"] or [] for f in loader.layout["fields"]}
    out: dict[str, jax.Array] = {}
    for name, value in batch.items():
        if not isinstance(value, np.ndarray):
            continue
        # getattr: jax's Config holds its flags as dynamic attributes its type stubs do not declare.
        if value.dtype.itemsize == 8 and not getattr(jax.config, "jax_enable_x64") and not allow_downcast:
            raise ConfigError(
                f"field '{name}' is {value.dtype}, which JAX would cast to 32 bits: enable "
                f"jax.config.update('jax_enable_x64', True), or pass allow_downcast=True"
            )
        spec = (specs or {}).get(name)
        if spec is None:
            spec = PartitionSpec(*own[name])  # type: ignore[no-untyped-call]  # jax leaves it unannotated
        global_shape = (batch.global_rows, *shapes[name])
        sharding = NamedSharding(mesh, spec)
        out[name] = jax.make_array_from_process_local_data(  # type: ignore[no-untyped-call]  # likewise
            sharding, value, global_shape
        )
    return out
