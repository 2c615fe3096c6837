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

Hand-off to frameworks: :meth:`Batch.to_torch` (DLPack on the CPU, pinned buffers and
asynchronous copies to a GPU) and :func:`meshfeed.jax.make_global` (global ``jax.Array``
s for a ``jax.sharding.Mesh``; with ``devices_per_process=K``, one process drives K
devices).

Types: the enumerated options are ``Literal`` s and the job's options, the loader's state
and layout ``TypedDict`` s, in :mod:`meshfeed.options`. Launching on Ray, one actor per
rank: ``python -m meshfeed.launch.ray`` (imports Ray only when run).

Errors are :class:`Error` subclasses (:class:`DataError`, :class:`ConfigError`,
:class:`TransportError`, :class:`VerifyError`, :class:`MisuseError`,
:class:`InternalError`), raised on every rank with the same class and message.

One loader per training process: a loader cannot cross a ``fork`` (``os.fork``,
``multiprocessing`` with the fork start method, a ``torch.utils.data.DataLoader`` with
``num_workers > 0`` iterating it): the child gets a :class:`MisuseError`, the parent is
unaffected. Decode in DataLoader workers by handing them the batches (see the README).
Waiting for a slow or absent peer, the loader checks for signals every 100 ms: Ctrl-C
(``KeyboardInterrupt``) and a SIGTERM handler's exception are raised promptly; the loader
cannot continue after that, and the process should end.
"""

from __future__ import annotations

import atexit
import operator
import os
import sys
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional, SupportsIndex, Union, cast

import numpy as np
import numpy.typing as npt

from . import _meshfeed
from ._meshfeed import (
    ConfigError,
    DataError,
    Error,
    InternalError,
    MisuseError,
    TransportError,
    VerifyError,
)
from .options import (
    Bootstrap,
    Exchange,
    JobOptions,
    Layout,
    LoaderState,
    LocalReads,
    Balance,
    Tune,
    Metrics,
    ReadPlan,
    ReadStrategy,
    Stage,
    Tail,
    Transport,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "Loader",
    "Batch",
    "FieldValue",
    "LoaderState",
    "Metrics",
    "JobOptions",
    "Error",
    "DataError",
    "ConfigError",
    "TransportError",
    "VerifyError",
    "MisuseError",
    "InternalError",
]

#: A field of a batch: a tensor field's array (``[rows, *slice]``, read-only), or a
#: variable-length field's values, one ``bytes`` per row.
FieldValue = Union["npt.NDArray[Any]", "list[bytes]", "tuple[npt.NDArray[Any], npt.NDArray[np.int64]]"]
#: A path argument: ``str``, ``bytes`` or ``os.PathLike``.
PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
#: A number of bytes: an integer (Python's or numpy's), or a string with a suffix ("64M").
Size = Union[str, SupportsIndex]


def _field(value: Any) -> FieldValue:
    """A field as the extension gives it, for Python: numpy views of its buffers."""
    if isinstance(value, list):
        return value
    if isinstance(value, tuple):
        return (np.asarray(value[0]), np.asarray(value[1]))
    return np.asarray(value)


class Batch(Mapping[str, FieldValue]):
    """This rank's part of one global batch: a read-only mapping of field name to array.

    Attributes:
        ids: numpy int64 array of the global sample ids of the rows, in row order.
        epoch, step: which global batch this is.
        coords: this rank's coordinate on each mesh axis (of its first device).
        global_rows: the size of the global batch (smaller for a ``partial`` tail).

    Tensor fields are numpy arrays of shape ``[rows, *slice]`` that view the loader's
    buffer (no copy; read-only; valid as long as you hold them). Variable-length fields
    are lists of ``bytes``, one per row; lists of numbers (Arrow ``List<int32>``, token
    ids) are a pair ``(values, offsets)``: every row's elements in one array, and row
    ``i``'s at ``values[offsets[i]:offsets[i + 1]]``.
    """

    __slots__ = ("ids", "epoch", "step", "coords", "global_rows", "_fields", "_loader")

    def __init__(self, raw: _meshfeed.Batch, loader: Optional[Loader] = None) -> None:
        self.epoch: int = raw.epoch
        self.step: int = raw.step
        self.coords: tuple[int, ...] = raw.coords
        self.global_rows: int = raw.global_rows
        # The extension's buffers carry their dtype and shape: numpy views them as they are.
        self.ids: npt.NDArray[np.int64] = np.asarray(raw.ids)
        self._loader = loader
        self._fields: dict[str, FieldValue] = {name: _field(value) for name, value in raw.fields.items()}

    def __getitem__(self, name: str) -> FieldValue:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{k}: {v.dtype}{list(v.shape)}"
            if isinstance(v, np.ndarray)
            else f"{k}: {len(v[1]) - 1} lists of {v[0].dtype}"
            if isinstance(v, tuple)
            else f"{k}: {len(v)} values"
            for k, v in self._fields.items()
        )
        return f"Batch(epoch={self.epoch}, step={self.step}, rows={len(self.ids)}, {fields})"

    def to_torch(
        self, device: Union[str, torch.device, None] = None, non_blocking: bool = True
    ) -> dict[str, Union[torch.Tensor, list[bytes], tuple[torch.Tensor, torch.Tensor]]]:
        """The batch as a dict of ``torch.Tensor`` (plus ``"ids"``, int64, unless a field
        has that name).

        On the CPU the field tensors share the batch's buffers through DLPack (no copy):
        writing to one changes the batch's numpy array of that field, and nothing else
        (no other batch, rank or epoch reads those bytes); ``clone()`` it to keep the
        batch as delivered. ``"ids"`` is a copy. On a GPU each field is copied into a pinned host buffer that the
        loader reuses, then to the device with ``non_blocking``; a buffer is only reused
        after its copy has finished. ``device`` defaults to ``cuda:<local rank>`` when
        CUDA is available (the launcher's ``LOCAL_RANK``), else the CPU. Variable-length
        fields stay lists of ``bytes``; lists of numbers become a pair of tensors (values,
        offsets) on ``device``.
        """
        import torch
        from torch.utils.dlpack import from_dlpack

        if device is None:
            local = self._loader.local_rank if self._loader is not None else 0
            device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        # The sample ids as "ids", unless a field has that name (then they stay batch.ids).
        items: list[tuple[str, FieldValue]] = [] if "ids" in self._fields else [("ids", self.ids)]
        items += self._fields.items()
        out: dict[str, Union[torch.Tensor, list[bytes], tuple[torch.Tensor, torch.Tensor]]] = {}
        for name, value in items:
            if isinstance(value, list):
                out[name] = value
                continue
            if isinstance(value, tuple):
                out[name] = (
                    torch.from_numpy(value[0].copy()).to(device, non_blocking=non_blocking),
                    torch.from_numpy(value[1].copy()).to(device, non_blocking=non_blocking),
                )
                continue
            # The ids are read-only and shared by every user of the batch: a tensor gets
            # its own copy.
            host = torch.from_numpy(value.copy()) if value is self.ids else from_dlpack(value)
            if device.type == "cpu":
                out[name] = host
            else:
                pool = self._loader._pinned if self._loader is not None else _PinnedPool()
                out[name] = pool.copy_to(name, host, device, non_blocking)
        return out


class _PinnedPool:
    """Pinned host buffers for copies to a GPU, a few per field, reused round-robin once
    the copy that last used a buffer has finished (a CUDA event marks it)."""

    SLOTS = 3

    def __init__(self) -> None:
        # Per field, SLOTS entries of (pinned buffer, the event of its last copy).
        self._slots: dict[str, list[Optional[tuple[torch.Tensor, Optional[torch.cuda.Event]]]]] = {}
        self._next: dict[str, int] = {}

    def copy_to(self, name: str, host: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
        import torch

        slots = self._slots.setdefault(name, [None] * self.SLOTS)
        i = self._next.get(name, 0)
        self._next[name] = (i + 1) % self.SLOTS
        slot = slots[i]
        nbytes = host.numel() * host.element_size()
        if slot is None or slot[0].numel() < nbytes:
            slot = (torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=True), None)
        elif slot[1] is not None:
            slot[1].synchronize()
        buf, _ = slot
        pinned = buf[:nbytes].view(host.dtype).view(host.shape)
        pinned.copy_(host)
        on_device = pinned.to(device, non_blocking=non_blocking)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        event.record(torch.cuda.current_stream(device))
        slots[i] = (buf, event)
        return on_device


def _launcher_local_rank() -> Optional[int]:
    """The local rank the launcher set: LOCAL_RANK (torchrun, Ray Train, Kubernetes
    operators), Open MPI's, Slurm's, MPICH's."""
    for var in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"):
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return None


_exchanges = 0


AllGather = Callable[[bytes], "list[bytes]"]


def _store_all_gather(
    kind: str, rank: int, world: int, set_: Callable[[str, bytes], object], get_all: Callable[[list[str]], list[bytes]]
) -> AllGather:
    """An all-gather of bytes over a key-value store, under a prefix that is fresh for each
    exchange and each restart of the job (torchrun's TORCHELASTIC_RESTART_COUNT)."""

    def all_gather(payload: bytes) -> list[bytes]:
        global _exchanges
        _exchanges += 1
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        prefix = f"meshfeed/{kind}/{restart}/{_exchanges}/"
        set_(prefix + str(rank), bytes(payload))
        return get_all([prefix + str(r) for r in range(world)])

    return all_gather


def _bootstrap(transport: str, bootstrap: str) -> Optional[tuple[int, int, AllGather]]:
    """(rank, world, all_gather) over a framework's store, or None for the environment.

    ``transport="auto"`` joins over UCX through a framework's store when one is initialised
    and no MPI launcher started the process; otherwise the extension chooses from the
    environment (MPI under an MPI launcher, the rendezvous where WORLD_SIZE or RANK is
    set, else one process)."""
    if bootstrap not in ("auto", "env", "torch", "jax"):
        raise ConfigError(f"bootstrap='{bootstrap}': expected auto, env, torch or jax")
    if transport == "auto" and _meshfeed.launched_by_mpi():
        return None
    if transport not in ("ucx", "auto") or bootstrap == "env":
        return None
    from datetime import timedelta

    try:
        timeout = float(os.environ.get("MESHFEED_RENDEZVOUS_TIMEOUT", "120"))
    except ValueError:
        raise ConfigError("MESHFEED_RENDEZVOUS_TIMEOUT is not a number of seconds") from None
    dist = sys.modules.get("torch.distributed")
    if bootstrap in ("auto", "torch") and dist is not None and dist.is_available() and dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
        rank, world = dist.get_rank(), dist.get_world_size()

        def get_all(keys: list[str]) -> list[bytes]:
            store.wait(keys, timedelta(seconds=timeout))
            return [store.get(k) for k in keys]

        return rank, world, _store_all_gather("torch", rank, world, store.set, get_all)
    if bootstrap in ("auto", "jax") and "jax" in sys.modules:
        from jax._src.distributed import global_state

        client = global_state.client
        if client is not None:
            rank, world = global_state.process_id, global_state.num_processes

            def jax_get_all(keys: list[str]) -> list[bytes]:
                return [client.blocking_key_value_get_bytes(k, int(timeout * 1000)) for k in keys]

            return rank, world, _store_all_gather("jax", rank, world, client.key_value_set_bytes, jax_get_all)
    if bootstrap != "auto":
        init = "torch.distributed.init_process_group" if bootstrap == "torch" else "jax.distributed.initialize"
        raise ConfigError(
            f"bootstrap='{bootstrap}': {bootstrap} has no distributed store initialised in this process "
            f"(call {init} first)"
        )
    return None


_live: "weakref.WeakSet[Loader]" = weakref.WeakSet()


def _plain(value: Any) -> Any:
    """Options and states as the extension reads them: numpy integers (anything with
    ``__index__`` but a bool) as Python ints, mappings as dicts and tuples as lists, at
    any depth; anything else as it is (the extension names what it cannot take)."""
    if isinstance(value, (bool, int, float, str, bytes)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "__index__"):
        return operator.index(value)
    return value


def _integer(name: str, value: Any) -> int:
    """An int argument: Python and numpy integers; not a bool, a float or a string."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r}: expected an integer, not a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise ConfigError(f"{name}={value!r}: expected an integer, not {type(value).__name__}") from None


def _path(name: str, value: Any) -> str:
    """A path: ``str``, ``bytes`` (decoded as the file system does) or ``os.PathLike``."""
    try:
        return os.fsdecode(os.fspath(value))
    except TypeError:
        raise ConfigError(f"{name}: {value!r} is not a path (str, bytes or os.PathLike)") from None


def _names(name: str, value: Any) -> list[str]:
    """A list of names: a sequence of strings, or one string of comma-separated names
    (``"dp,tp"``, as on the command line) — never split into letters."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    try:
        if isinstance(value, (bytes, Mapping)):
            raise TypeError
        names = list(value)
    except TypeError:
        raise ConfigError(f"{name}={value!r}: expected a list of names or a comma-separated string") from None
    for v in names:
        if not isinstance(v, str):
            raise ConfigError(f"{name}: {v!r} is not a name (expected strings)")
    return names


def _mapping(name: str, value: Any) -> dict[str, str]:
    """A field -> spec mapping (``{"x": "dp,tp"}``)."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name}={value!r}: expected a mapping of field name to spec, e.g. {{'x': 'dp,tp'}}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ConfigError(f"{name}: {k!r}: {v!r}: expected a field name and a spec string")
    return dict(value)


class Loader:
    """A distributed loader over one dataset: this rank's shard of every global batch.

    Collective: every rank of the job makes it with the same options (a difference is an
    error naming the option and the ranks, on every rank).

    Args:
        data: dataset files or directories, the format from the extension: NumPy
            ``.npy``, HDF5 ``.h5``/``.hdf5``, Arrow IPC ``.arrow``/``.feather``/``.ipc``
            (files and streams: Hugging Face ``save_to_disk``), Parquet ``.parquet``,
            Megatron ``.idx`` + ``.bin``, WebDataset ``.tar`` shards, ``.raw`` with
            ``schema.json`` (docs/formats.md).
        batch_size: global batch size B (all ranks together).
        source: instead of ``data``, a shared feeder (``meshfeed serve``) to read the
            dataset from: ``"meshfeed://HOST:PORT/NAME"`` (the token in
            ``MESHFEED_FEEDER_TOKEN``) or the path of its rendezvous file. The batches are
            those of the files themselves.
        seed: seed of the permutation (default 0).
        shared_order: jobs of a sweep reading one feeder that cannot hold the data:
            ``SEED`` (an int) or ``"SEED,block=N"``, the same in every job; each job's order is
            the common seed's, reordered by ``seed`` within blocks of N positions (1024),
            so that the feeder reads each row from storage once for all of them. Each
            job's order is still a uniform random permutation of every epoch.
        mesh: device mesh, e.g. ``"dp=2,tp=2"`` (default: data parallel over all ranks).
        shard: per field, the mesh axes its dimensions are split over, e.g.
            ``{"tokens": "dp,tp"}``.
        stages: per field, the pipeline stages that receive it (``first``, ``last``,
            ``all``).
        mesh_order: the order of the mesh's axes over ranks.
        pipeline_axis: the mesh axis of pipeline stages.
        transport: ``"auto"`` (default: the launcher's. MPI under mpirun or srun; else UCX
            through torch.distributed's or JAX's store when one is initialised in the
            process (torchrun, Ray Train, ``jax.distributed``); else UCX through the
            environment where WORLD_SIZE or RANK is set (``meshfeed launch``; torchrun
            without a process group needs MESHFEED_JOB_TOKEN and MESHFEED_MASTER_PORT);
            else one process. See docs/launching.md), ``"mpi"`` (refused when WORLD_SIZE
            disagrees with MPI's world, as under torchrun) or ``"ucx"`` (RANK,
            WORLD_SIZE, MASTER_ADDR, MASTER_PORT and MESHFEED_JOB_TOKEN in the
            environment, or a framework's store).
        window_bytes: buffer budget of one exchange window per rank (``"64M"``).
        prefetch: windows the background producer runs ahead (0: none).
        tail: the last incomplete batch of an epoch: ``drop``, ``pad`` or ``partial``.
        exchange: ``auto``, ``fused``, ``two-phase`` or ``broadcast``.
        exchange_costs: the all-to-all costs ``auto`` decides with, e.g.
            ``"latency=5e-6,intra=1e10,inter=1.2e9"`` (``meshfeed report --predict``
            fits them to a cluster's runs).
        read_strategy: how ranks read their home ranges: ``auto`` (default: keep the data
            in memory when it fits the memory budget, else the cheaper of sequential
            passes and random reads by the storage's probed speed), ``resident``,
            ``passes`` or ``random``.
        memory_budget: memory the ranks of one host may hold for data together
            (``"8G"``; default: from the cgroup limit or the host's available memory).
        storage_bandwidth, storage_iops: the storage's sequential bytes/s and random
            reads/s per host (default: probed when the choice depends on them).
        spill_dir: node-local directory (NVMe scratch) where what does not fit in
            memory is streamed once and read back from.
        read_queue_depth: reads in flight per rank when reading at random (default 16).
        local_reads: ``auto`` or ``off``: ranks on one host read the rows they get from
            each other straight from the files instead of exchanging them.
        balance: ``auto`` or ``off``: at each epoch's start the ranks move their home
            ranges with their measured read speeds, so that a slow reader reads less
            (where nothing is kept across epochs and rows cross the fused exchange; the
            batches are the same either way).
        tune: ``auto`` or ``off`` (the default): the loader tunes its window length,
            prefetch depth and reads in flight as it runs, from the waiting it measures
            (every rank changes at the same window; the batches are the same either way).
            ``window_bytes``, ``prefetch`` and ``read_queue_depth`` are where it starts.
        group: the HDF5 group holding the datasets.
        fields: only these fields, in this order (HDF5, Arrow and Parquet files read only
            these, and only their types and nulls are checked; default: every field).
        nulls: per Arrow or Parquet field, what its nulls are delivered as: ``"mask"``
            (zeros, and a field ``<name>_valid`` of ``uint8`` per row, 1 present and 0
            null, right after it) or ``"fill:VALUE"`` (e.g. ``{"label": "fill:-1"}``);
            default: nulls in a delivered field are an error naming both.
        pack: sequence packing,
            ``"FIELD:SEQ_LEN[,eos=ID][,position_ids[=document]][,cu_seqlens]"``: the
            documents of a token field concatenated (each followed by ``eos``, if given)
            and cut into samples of ``SEQ_LEN`` inputs (field ``FIELD``) and their labels
            (``labels``, the inputs shifted by one token); optionally each input's position
            (``position_ids``: restarting at 0 at each sample and each document start in it,
            as Megatron-LM's ``reset_position_ids``; ``position_ids=document``: in its whole
            document) and the starts of its documents (``cu_seqlens``, int32, as
            flash-attention's variable-length kernels take them).
        devices_per_process: mesh devices this process drives (default 1). The mesh then
            has ``world × K`` devices; process ``p`` drives devices ``p·K .. (p+1)·K`` and
            receives the union of their shards, as
            ``jax.make_array_from_process_local_data`` expects (see
            :func:`meshfeed.jax.make_global`).
        telemetry: a directory where each rank writes its telemetry (``rank-<r>.jsonl``:
            a record per window and epoch, with the time the training loop waited for
            data and spent between batches, step by step) and rank 0 the job's
            configuration (``run.json``): ``meshfeed report DIR`` reads it, as it reads
            ``meshfeed run --telemetry``'s. An epoch's record is written when it ends, or
            when the loader is closed.
        heartbeat: rank 0 writes a JSON line to stderr this often (seconds): epoch, step,
            samples per second, the part of the time spent waiting for data.
        bootstrap: how ``transport="ucx"`` (or ``"auto"`` outside an MPI launcher) finds
            the other ranks: ``"auto"`` (default)
            uses torch.distributed's store when a process group is initialised, else
            JAX's key-value store when ``jax.distributed`` is initialised, else the
            environment; ``"torch"``, ``"jax"`` or ``"env"`` force one. The environment's
            rendezvous is on ``MASTER_ADDR`` and ``MESHFEED_MASTER_PORT`` (or
            ``MASTER_PORT``, which torchrun's own store already holds).

    These are the command line's options and the job file's keys (``meshfeed run
    --help``); :meth:`from_config` reads a job file.
    """

    def __init__(
        self,
        data: Union[PathArg, Sequence[PathArg], None] = None,
        batch_size: Optional[SupportsIndex] = None,
        *,
        source: Optional[PathArg] = None,
        seed: SupportsIndex = 0,
        shared_order: Union[str, int, None] = None,
        mesh: Optional[str] = None,
        shard: Optional[Mapping[str, str]] = None,
        stages: Optional[Mapping[str, Stage]] = None,
        mesh_order: Union[str, Sequence[str], None] = None,
        pipeline_axis: Optional[str] = None,
        transport: Transport = "auto",
        window_bytes: Optional[Size] = None,
        prefetch: Optional[SupportsIndex] = None,
        tail: Optional[Tail] = None,
        exchange: Optional[Exchange] = None,
        exchange_costs: Optional[str] = None,
        read_strategy: Optional[ReadStrategy] = None,
        memory_budget: Optional[Size] = None,
        storage_bandwidth: Optional[Size] = None,
        storage_iops: Optional[SupportsIndex] = None,
        spill_dir: Optional[PathArg] = None,
        read_queue_depth: Optional[SupportsIndex] = None,
        local_reads: Optional[LocalReads] = None,
        balance: Optional[Balance] = None,
        tune: Optional[Tune] = None,
        group: Optional[str] = None,
        fields: Optional[Sequence[str]] = None,
        nulls: Optional[Mapping[str, str]] = None,
        pack: Optional[str] = None,
        devices_per_process: Optional[SupportsIndex] = None,
        telemetry: Optional[PathArg] = None,
        heartbeat: Optional[float] = None,
        bootstrap: Bootstrap = "auto",
    ) -> None:
        if (data is None) == (source is None):
            raise ConfigError(
                "give data (dataset files or directories) or source (a shared feeder: "
                "'meshfeed://HOST:PORT/NAME' or its rendezvous file), one of them"
            )
        if batch_size is None:
            raise ConfigError("no batch size given (batch_size=...)")
        paths: Sequence[Any] = data  # type: ignore[assignment]  # one path is made a list below
        if data is None:
            paths = [source]
        elif isinstance(data, (str, bytes)) or hasattr(data, "__fspath__"):
            paths = [data]
        options: dict[str, Any] = {
            "data": [_path("source" if data is None else "data", p) for p in paths],
            "batch_size": _integer("batch_size", batch_size),
            "seed": _integer("seed", seed),
            "shared_order": shared_order,
            "mesh": mesh,
            "shard": _mapping("shard", shard or {}),
            "stages": _mapping("stages", stages or {}),
            "mesh_order": _names("mesh_order", mesh_order or []),
            "pipeline_axis": pipeline_axis,
            "transport": transport,
            "window_bytes": window_bytes,
            "prefetch": prefetch,
            "tail": tail,
            "exchange": exchange,
            "exchange_costs": exchange_costs,
            "read_strategy": read_strategy,
            "memory_budget": memory_budget,
            "storage_bandwidth": storage_bandwidth,
            "storage_iops": storage_iops,
            "spill_dir": None if spill_dir is None else _path("spill_dir", spill_dir),
            "read_queue_depth": read_queue_depth,
            "local_reads": local_reads,
            "balance": balance,
            "tune": tune,
            "group": group,
            "fields": None if fields is None else _names("fields", fields),
            "nulls": _mapping("nulls", nulls or {}),
            "pack": pack,
            "devices_per_process": devices_per_process,
            "telemetry": None if telemetry is None else _path("telemetry", telemetry),
            "heartbeat": None if heartbeat is None else float(heartbeat),
        }
        for key in ("prefetch", "storage_iops", "read_queue_depth", "devices_per_process"):
            if options[key] is not None:
                options[key] = _integer(key, options[key])
        # The job file's keys, as the extension reads them into its job declaration (which
        # refuses unknown keys and values of the wrong type, naming them).
        job = cast(JobOptions, _plain({k: v for k, v in options.items() if v is not None}))
        self._init(_meshfeed.Loader(job, _bootstrap(transport, bootstrap)))

    @classmethod
    def from_config(cls, path: PathArg, *, bootstrap: Bootstrap = "auto") -> Loader:
        """A loader from a TOML job file (the command line's ``--config``)."""
        transport = "auto"  # a job file's default, as on the command line
        try:
            import stat
            import tomllib

            # Only a regular file of job-file size is read here (a FIFO would block).
            info = os.stat(path)
            if stat.S_ISREG(info.st_mode) and info.st_size <= 1 << 20:
                with open(path, "rb") as f:
                    transport = str(tomllib.load(f).get("transport", "auto"))
        except (ImportError, OSError, ValueError, TypeError):
            pass  # the extension reports an unreadable job file
        self = cls.__new__(cls)
        self._init(_meshfeed.Loader.from_config(_path("path", path), _bootstrap(transport, bootstrap)))
        return self

    def _init(self, inner: _meshfeed.Loader) -> None:
        self._inner = inner
        self.rank: int = inner.rank()
        self.world_size: int = inner.world_size()
        layout = inner.layout()
        #: How the ranks read their home ranges: ``strategy`` (``resident``, ``passes``
        #: or ``random``), ``passes`` per epoch, ``spill``, this rank's ``resident_rows``
        #: and the ``reason`` for the choice (memory budget, storage speed).
        self.read_plan: ReadPlan = layout.pop("read")
        #: The mesh, the devices' coordinates and the fields (the read plan apart).
        self.layout: Layout = layout
        launcher = _launcher_local_rank()
        #: This process's index among the job's processes on its host: the launcher's
        #: LOCAL_RANK (or Open MPI's, Slurm's, MPICH's) when set, else counted from the
        #: ranks' host names.
        self.local_rank: int = launcher if launcher is not None else self.layout["local_rank"]
        self._pinned = _PinnedPool()
        _live.add(self)

    @property
    def mesh_shape(self) -> dict[str, int]:
        """The device mesh's axes and sizes, e.g. ``{"dp": 2, "tp": 2}``."""
        return {str(name): int(size) for name, size in self.layout["mesh"]}

    @property
    def devices_per_process(self) -> int:
        """Mesh devices this process drives."""
        return self.layout["devices_per_process"]

    def partition_specs(self) -> dict[str, tuple[Union[None, str, tuple[str, ...]], ...]]:
        """Per tensor field, the mesh axes splitting each dimension of ``[batch, *shape]``,
        as ``jax.sharding.PartitionSpec`` arguments: ``None`` (not split), an axis name,
        or a tuple of names (trailing unsplit dimensions left out). A field split zigzag
        has no ``PartitionSpec``: asking for it raises :class:`ConfigError`."""
        specs = {}
        for f in self.layout["fields"]:
            if any(f["zigzag"]):
                raise ConfigError(
                    f"field {f['name']!r} is split zigzag (context parallelism), which a PartitionSpec cannot "
                    "express: use each rank's local arrays, as Megatron-LM and Transformer Engine do"
                )
            dims: list[Union[None, str, tuple[str, ...]]] = [
                None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in f["dims"]
            ]
            while dims and dims[-1] is None:
                dims.pop()
            specs[f["name"]] = tuple(dims)
        return specs

    def stop_requested(self) -> bool:
        """Whether the job was asked to stop, as every rank agreed it: after the same step,
        every rank gets the same answer. True once any rank received SIGTERM (what Slurm
        and Kubernetes send before preempting) or SIGUSR1 (``sbatch --signal``), or called
        :meth:`request_stop`. Ask after each step::

            for batch in loader:
                train_step(batch)
                if loader.stop_requested():
                    save(model, loader.state_dict())
                    sys.exit(75)  # requeue

        The first call installs the signal handlers (a program that never asks keeps the
        signals' usual effect); they chain to a handler installed before them. The request
        reaches the other ranks with the agreement every window of the loader makes anyway
        (no collective per step): the answer turns true at the first step of a window
        assembled after the signal, up to ``prefetch + 1`` windows later."""
        return self._inner.stop_requested() is not None

    def request_stop(self) -> None:
        """Asks every rank to stop, as a stop signal would (:meth:`stop_requested` then
        turns true on every rank after the same step): for programs that handle signals
        themselves, from their handler."""
        self._inner.request_stop()

    def metrics(self) -> Metrics:
        """This rank's figures, as its telemetry records them (also without a telemetry
        directory): ``"window"``, the last window the loop finished, and ``"epoch"``, the
        epoch so far (between epochs, the last one). Each has ``wait_fraction``, the part
        of the loop's time spent waiting for data (``wait_s``) rather than in its own
        steps (``compute_s``, the time from a batch's delivery to the next request), the
        time in each phase of the pipeline, and the bytes read and exchanged."""
        return self._inner.metrics()

    def __len__(self) -> int:
        """Steps (global batches) per epoch."""
        return self._inner.steps_per_epoch()

    def set_epoch(self, epoch: int) -> None:
        """Positions the loader at the start of ``epoch`` (like
        ``DistributedSampler.set_epoch``). Every rank must call it at the same point: where
        a rank repositions alone, every rank raises :class:`MisuseError` at its next batch,
        naming each rank's position. Epochs run from 0 to 2**53 - 1."""
        self._inner.set_epoch(_integer("epoch", epoch))

    def __iter__(self) -> Iterator[Batch]:
        """The batches of the current epoch (after which the loader stands at the start of
        the next one). The GIL is released while a batch is awaited."""
        while True:
            raw = self._inner.next_batch()
            if raw is None:
                return
            yield Batch(raw, self)

    def state_dict(self) -> LoaderState:
        """The position after the last delivered batch, and what defines the stream (a
        small dict, the same on every rank). Load it with :meth:`load_state_dict` on any
        number of ranks or mesh."""
        return self._inner.state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues exactly where ``state`` (a :meth:`state_dict`, also after a JSON round
        trip) says. Refuses a state of another stream (dataset, seed, shared order, batch
        size or tail policy changed), naming what changed."""
        if not isinstance(state, Mapping):
            raise ConfigError(
                f"invalid loader state: expected the dict state_dict() returned, not {type(state).__name__}"
            )
        if "epoch" in state:
            _meshfeed.check_epoch(_integer("epoch", state["epoch"]))
        self._inner.load_state(_plain(state))

    def close(self) -> None:
        """Stops the loader (collective: at the same point on every rank). In a forked
        child it does nothing (the loader is the parent's)."""
        _live.discard(self)
        self._inner.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@atexit.register
def _shutdown() -> None:
    # Loaders still open hold the loader's communicators: close them before MPI ends.
    for loader in list(_live):
        loader.close()
    _meshfeed.shutdown()
