"""The types at meshfeed's Python edge: the values an enumerated option takes, the job's
options as the extension receives them, the loader's state and layout.

``JobOptions`` has exactly the job file's keys (``meshfeed._meshfeed.job_keys()``; a test
checks it), so a dict typed by it is a job file's content.
"""

from __future__ import annotations

from typing import Literal, Optional, TypedDict, Union

__all__ = [
    "Transport",
    "Bootstrap",
    "Tail",
    "Exchange",
    "ReadStrategy",
    "LocalReads",
    "Balance",
    "Tune",
    "Stage",
    "ByteSize",
    "JobOptions",
    "Fingerprint",
    "LoaderState",
    "FieldLayout",
    "ReadPlan",
    "Layout",
    "Phases",
    "WindowMetrics",
    "EpochMetrics",
    "Metrics",
]

#: How the ranks communicate: MPI (mpirun, srun), UCX (torchrun, Ray, ``meshfeed launch``),
#: or the launcher's (``auto``: docs/launching.md, "Which transport").
Transport = Literal["mpi", "ucx", "auto"]
#: How ``transport="ucx"`` finds the other ranks (see :class:`meshfeed.Loader`).
Bootstrap = Literal["auto", "env", "torch", "jax"]
#: The last incomplete batch of an epoch.
Tail = Literal["drop", "pad", "partial"]
#: The exchange of samples between ranks.
Exchange = Literal["auto", "fused", "two-phase", "broadcast"]
#: How the ranks read their home ranges (``auto``: by the memory budget and the storage).
ReadStrategy = Literal["auto", "resident", "passes", "random"]
#: Whether ranks on one host read each other's rows straight from the files.
LocalReads = Literal["auto", "off"]
#: Whether home ranges follow the ranks' measured read speeds, epoch by epoch.
Balance = Literal["auto", "off"]
#: Whether the loader tunes its window length, prefetch depth and reads in flight as it runs.
Tune = Literal["auto", "off"]
#: The pipeline stages that receive a field.
Stage = Literal["first", "last", "all"]
#: A number of bytes: an integer, or a string with a suffix (``"64M"``, ``"1G"``).
ByteSize = Union[int, str]


class JobOptions(TypedDict, total=False):
    """The keys of a job file (``meshfeed run --config``), every one optional here; the
    loader needs ``data`` and ``batch_size``. Paths are strings."""

    data: list[str]
    group: str
    fields: list[str]
    nulls: dict[str, str]
    pack: str
    batch_size: int
    epochs: int
    seed: int
    shared_order: Union[str, int]
    window_bytes: ByteSize
    prefetch: int
    read_strategy: ReadStrategy
    memory_budget: ByteSize
    storage_bandwidth: ByteSize
    storage_iops: int
    spill_dir: str
    read_queue_depth: int
    tail: Tail
    transport: Transport
    mesh: str
    mesh_order: list[str]
    pipeline_axis: str
    shard: dict[str, str]
    stages: dict[str, Stage]
    exchange: Exchange
    exchange_costs: str
    local_reads: LocalReads
    balance: Balance
    tune: Tune
    devices_per_process: int
    telemetry: str
    heartbeat: float


class _FingerprintKeys(TypedDict):
    #: Per file: ``[name, samples, bytes]`` (the name, not the full path), a list as
    #: JSON carries it.
    files: list[list[Union[str, int]]]
    #: Field names and kinds, as text.
    fields: list[str]
    samples: int
    batch_size: int
    seed: int
    tail: Tail


class Fingerprint(_FingerprintKeys, total=False):
    """What defines the global batch stream (not the ranks or the mesh)."""

    #: The sweep's shared order (``"SEED,block=N"``), where the job has one.
    shared_order: str
    #: The sequence packing the samples were made by, where the job packs them.
    pack: str


class LoaderState(TypedDict):
    """A loader's position (:meth:`meshfeed.Loader.state_dict`): the next step to deliver,
    and the stream it belongs to. The same on every rank; plain data (a JSON round trip
    keeps it loadable)."""

    seed: int
    epoch: int
    step: int
    fingerprint: Fingerprint


class FieldLayout(TypedDict):
    """One field: its dtype (``None``: variable length), the shape of one value, and per
    dimension of ``[batch, *shape]`` the mesh axes splitting it."""

    name: str
    dtype: Optional[str]
    shape: Optional[list[int]]
    dims: list[list[str]]
    #: Per dimension, whether its split is the zigzag one (``zigzag:cp``).
    zigzag: list[bool]


class ReadPlan(TypedDict):
    """How the ranks read their home ranges (:attr:`meshfeed.Loader.read_plan`)."""

    strategy: Literal["resident", "passes", "random"]
    #: Passes over the files per epoch (``passes`` only).
    passes: Optional[int]
    #: Whether what does not fit in memory is streamed to the spill directory.
    spill: bool
    #: This rank's home rows kept in memory.
    resident_rows: Optional[int]
    #: Why, in a sentence: the numbers the choice was made from.
    reason: str


class Layout(TypedDict):
    """The loader's mesh and fields as this process sees them (:attr:`meshfeed.Loader.layout`;
    the read plan is :attr:`meshfeed.Loader.read_plan`). Plain data: lists, as JSON carries
    them."""

    #: The mesh's axes, ``[name, size]``, in order.
    mesh: list[list[Union[str, int]]]
    #: Each device's coordinate on the mesh; device ``d`` is driven by process
    #: ``d // devices_per_process``.
    device_coords: list[list[int]]
    devices_per_process: int
    #: This rank's index among the job's ranks on its host, counted from their host names.
    local_rank: int
    local_size: int
    fields: list[FieldLayout]


class Phases(TypedDict):
    """Seconds in each phase of the loader's pipeline."""

    plan: float
    read: float
    fill: float
    exchange: float
    assemble: float


class _Record(TypedDict):
    schema: int
    rank: int
    epoch: int
    steps: int
    phase_s: Phases
    #: Time in the exchange's agreements: waiting for the slowest peer.
    peer_wait_s: float
    #: Time the consumer waited for data, and spent between batches (its steps).
    wait_s: float
    compute_s: float
    #: ``wait_s / (wait_s + compute_s)``: the part of the step time spent waiting for data.
    wait_fraction: float
    bytes_read: int
    bytes_read_spill: int
    bytes_sent: int
    bytes_sent_off_host: int
    bytes_received: int
    #: This rank's home range length (the last window's): it moves between epochs where
    #: the loader balances the ranges.
    home_rows: int


class _Tuned(TypedDict, total=False):
    #: Where the loader tunes itself (``tune="auto"``): the windows its producer ran
    #: ahead and the reads it kept in flight when the window was assembled.
    prefetch: int
    read_depth: int


class WindowMetrics(_Record, _Tuned):
    """The last window the consumer finished (a telemetry window record)."""

    first_step: int
    rows: int
    #: Per step delivered from the window: waiting for its batch, and the training step.
    step_wait_s: list[float]
    step_compute_s: list[float]


class EpochMetrics(_Record):
    """The epoch so far, or the last one between epochs (a telemetry epoch record)."""

    ranks: int
    host: str
    #: Samples its steps delivered, all ranks together.
    samples: int
    seconds: float
    windows: int
    peak_rss_bytes: int
    verified: Optional[bool]


class Metrics(TypedDict):
    """What :meth:`meshfeed.Loader.metrics` returns (``None`` before the first batch)."""

    window: Optional[WindowMetrics]
    epoch: Optional[EpochMetrics]
