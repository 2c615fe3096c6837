"""meshfeed: exact global shuffle and device-mesh placement for distributed training data.

Each rank of a job (``mpirun -np N python train.py``, ``srun``, or the UCX launchers)
makes a :class:`Loader` over the same files with the same options; iterating it yields
this rank's shard of every global batch, as numpy arrays::

    import meshfeed
    loader = meshfeed.Loader(["/data/train"], batch_size=256, seed=42)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:              # one epoch
            x, y = batch["image"], batch["label"]

Every rank must consume the same batches: the loader's windows are collectives.
"""

from __future__ import annotations

import atexit
import json
import weakref
from collections.abc import Mapping
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

from . import _meshfeed
from ._meshfeed import Error

__all__ = ["Loader", "Batch", "Error"]

# meshfeed dtype names -> numpy dtypes (little-endian, as meshfeed delivers them).
_DTYPES = {
    "bool": np.dtype("?"),
    "u8": np.dtype("u1"),
    "i8": np.dtype("i1"),
    "u16": np.dtype("<u2"),
    "i16": np.dtype("<i2"),
    "u32": np.dtype("<u4"),
    "i32": np.dtype("<i4"),
    "u64": np.dtype("<u8"),
    "i64": np.dtype("<i8"),
    "f16": np.dtype("<f2"),
    "f32": np.dtype("<f4"),
    "f64": np.dtype("<f8"),
}


class Batch(Mapping):
    """This rank's part of one global batch: a read-only mapping of field name to array.

    Attributes:
        ids: numpy int64 array of the global sample ids of the rows, in row order.
        epoch, step: which global batch this is.
        coords: this rank's coordinate on each mesh axis.

    Tensor fields are numpy arrays of shape ``[rows, *slice]`` that view the loader's
    buffer (no copy; read-only; valid as long as you hold them). Variable-length fields
    are lists of ``bytes``, one per row.
    """

    __slots__ = ("ids", "epoch", "step", "coords", "_fields")

    def __init__(self, raw: tuple) -> None:
        epoch, step, coords, ids, fields = raw
        self.epoch: int = epoch
        self.step: int = step
        self.coords: tuple = tuple(coords)
        self.ids: np.ndarray = np.frombuffer(ids, dtype="<i8")
        self._fields: dict = {}
        for name, dtype, shape, data in fields:
            if dtype is None:
                self._fields[name] = data
            else:
                self._fields[name] = np.frombuffer(data, dtype=_DTYPES[dtype]).reshape(shape)

    def __getitem__(self, name: str) -> Any:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{k}: {v.dtype}{list(v.shape)}" if isinstance(v, np.ndarray) else f"{k}: {len(v)} values"
            for k, v in self._fields.items()
        )
        return f"Batch(epoch={self.epoch}, step={self.step}, rows={len(self.ids)}, {fields})"


_live: "weakref.WeakSet[Loader]" = weakref.WeakSet()


class Loader:
    """A distributed loader over one dataset: this rank's shard of every global batch.

    Collective: every rank of the job makes it with the same options (a difference is an
    error naming the option and the ranks, on every rank).

    Args:
        data: dataset files or directories (``.npy``, ``.h5``/``.hdf5``, ``.arrow``/
            ``.feather``/``.ipc``, ``.raw`` with ``schema.json``).
        batch_size: global batch size B (all ranks together).
        seed: seed of the permutation (default 0).
        mesh: device mesh, e.g. ``"dp=2,tp=2"`` (default: data parallel over all ranks).
        shard: per field, the mesh axes its dimensions are split over, e.g.
            ``{"tokens": "dp,tp"}``.
        stages: per field, the pipeline stages that receive it (``first``, ``last``,
            ``all``).
        mesh_order: the order of the mesh's axes over ranks.
        pipeline_axis: the mesh axis of pipeline stages.
        transport: ``"mpi"`` (launch with mpirun or srun) or ``"ucx"`` (RANK, WORLD_SIZE,
            MASTER_ADDR, MASTER_PORT and MESHFEED_JOB_TOKEN in the environment).
        window_bytes: buffer budget of one exchange window per rank (``"64M"``).
        prefetch: windows the background producer runs ahead (0: none).
        tail: the last incomplete batch of an epoch: ``drop``, ``pad`` or ``partial``.
        exchange: ``auto``, ``fused``, ``two-phase`` or ``broadcast``.
        cache_bytes: keep this rank's home range in memory when it fits (``"4G"``).
        local_reads: ``auto`` or ``off``: ranks on one host read the rows they get from
            each other straight from the files instead of exchanging them.
        group: the HDF5 group holding the datasets.

    These are the command line's options and the job file's keys (``meshfeed run
    --help``); :meth:`from_config` reads a job file.
    """

    def __init__(
        self,
        data: Union[str, Sequence[str]],
        batch_size: int,
        *,
        seed: int = 0,
        mesh: Optional[str] = None,
        shard: Optional[Mapping[str, str]] = None,
        stages: Optional[Mapping[str, str]] = None,
        mesh_order: Optional[Sequence[str]] = None,
        pipeline_axis: Optional[str] = None,
        transport: str = "mpi",
        window_bytes: Union[int, str, None] = None,
        prefetch: Optional[int] = None,
        tail: Optional[str] = None,
        exchange: Optional[str] = None,
        cache_bytes: Union[int, str, None] = None,
        local_reads: Optional[str] = None,
        group: Optional[str] = None,
    ) -> None:
        if isinstance(data, (str, bytes)) or hasattr(data, "__fspath__"):
            data = [data]
        options = {
            "data": [str(p) for p in data],
            "batch_size": batch_size,
            "seed": seed,
            "mesh": mesh,
            "shard": dict(shard or {}),
            "stages": dict(stages or {}),
            "mesh_order": list(mesh_order or []),
            "pipeline_axis": pipeline_axis,
            "transport": transport,
            "window_bytes": window_bytes,
            "prefetch": prefetch,
            "tail": tail,
            "exchange": exchange,
            "cache_bytes": cache_bytes,
            "local_reads": local_reads,
            "group": group,
        }
        options = {k: v for k, v in options.items() if v is not None}
        self._init(_meshfeed.Loader(json.dumps(options)))

    @classmethod
    def from_config(cls, path: str) -> "Loader":
        """A loader from a TOML job file (the command line's ``--config``)."""
        self = cls.__new__(cls)
        self._init(_meshfeed.Loader.from_config(str(path)))
        return self

    def _init(self, inner: Any) -> None:
        self._inner = inner
        self.rank: int = inner.rank()
        self.world_size: int = inner.world_size()
        _live.add(self)

    def __len__(self) -> int:
        """Steps (global batches) per epoch."""
        return self._inner.steps_per_epoch()

    def set_epoch(self, epoch: int) -> None:
        """Positions the loader at the start of ``epoch`` (like
        ``DistributedSampler.set_epoch``). Every rank must call it at the same point."""
        self._inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[Batch]:
        """The batches of the current epoch (after which the loader stands at the start of
        the next one). The GIL is released while a batch is awaited."""
        while True:
            raw = self._inner.next_batch()
            if raw is None:
                return
            yield Batch(raw)

    def state_dict(self) -> dict:
        """The position after the last delivered batch, and what defines the stream (a
        small dict, the same on every rank). Load it with :meth:`load_state_dict` on any
        number of ranks or mesh."""
        return json.loads(self._inner.state_json())

    def load_state_dict(self, state: dict) -> None:
        """Continues exactly where ``state`` says. Refuses a state of another stream
        (dataset, seed, batch size or tail policy changed), naming what changed."""
        self._inner.load_state_json(json.dumps(state))

    def close(self) -> None:
        """Stops the loader (collective: at the same point on every rank)."""
        self._inner.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@atexit.register
def _shutdown() -> None:
    # Loaders still open hold the loader's communicators: close them before MPI ends.
    for loader in list(_live):
        loader.close()
    _meshfeed.shutdown()
