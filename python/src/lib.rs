//! `meshfeed._meshfeed`: the extension module under the `meshfeed` Python package. It is
//! thin on purpose: options arrive as a dict of the job file's keys, converted by serde
//! (`pythonize`) into the one job declaration, [`JobFile`]; states and the layout leave
//! and arrive as Python objects the same way; a batch leaves as a [`Batch`] whose tensor
//! fields are [`FieldBuffer`]s, handed over without a copy through the buffer protocol
//! with their element format and shape (so numpy needs no dtype table). The mapping,
//! the framework hand-offs and the exceptions' use are Python in `pysrc/meshfeed`.

use std::ffi::{c_int, c_void, CStr, OsString};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use pythonize::{depythonize, pythonize};

use meshfeed::config::{read_small_file, Job, JobFile, TransportKind, JOB_FILE_LIMIT};
use meshfeed::dataset::{DType, FieldKind};
use meshfeed::loader::{FieldData, LoaderState};
use meshfeed::runtime::Runtime;
use meshfeed::types::Epoch;

pyo3::create_exception!(
    meshfeed,
    Error,
    pyo3::exceptions::PyException,
    "A meshfeed error: the same message the command line prints, on every rank."
);
pyo3::create_exception!(
    meshfeed,
    DataError,
    Error,
    "A dataset file is missing, unreadable, truncated or corrupt, or files' schemas differ."
);
pyo3::create_exception!(meshfeed, ConfigError, Error, "Invalid options, job file or launch environment.");
pyo3::create_exception!(meshfeed, TransportError, Error, "Communication between ranks failed.");
pyo3::create_exception!(meshfeed, VerifyError, Error, "Delivered data failed verification.");
pyo3::create_exception!(meshfeed, MisuseError, Error, "The loader was used in a way it does not allow.");
pyo3::create_exception!(meshfeed, InternalError, Error, "A bug in meshfeed, or a build without a needed feature.");

/// The exception for `e`, of the class of its kind (the same on every rank of an agreed
/// failure), with `rank` set to the rank it came from (`None`: this rank, not agreed).
fn error(e: meshfeed::Error) -> PyErr {
    use meshfeed::error::ErrorKind;
    let message = e.to_string();
    let err = match e.kind() {
        ErrorKind::Data => DataError::new_err(message),
        ErrorKind::Config => ConfigError::new_err(message),
        ErrorKind::Transport => TransportError::new_err(message),
        ErrorKind::Verify => VerifyError::new_err(message),
        ErrorKind::Misuse => MisuseError::new_err(message),
        ErrorKind::Internal => InternalError::new_err(message),
    };
    let rank = match e {
        meshfeed::Error::Remote { rank, .. } => Some(rank),
        _ => None,
    };
    Python::with_gil(|py| {
        // Setting an attribute on a fresh exception cannot fail but for memory.
        let _ = err.value(py).setattr("rank", rank);
    });
    err
}

/// The process's runtime (MPI initialised or adopted, or the UCX rendezvous joined),
/// made by the first loader and kept until `shutdown`.
static RUNTIME: Mutex<Option<Runtime>> = Mutex::new(None);

/// The process that made the runtime (0: none yet). A forked child neither uses nor ends
/// it — nor locks `RUNTIME`, which a thread of the parent may have held at the fork.
static RUNTIME_PID: AtomicU32 = AtomicU32::new(0);

/// How a UCX process finds its peers when a framework's store is at hand: its rank, the
/// world size, and a Python callable `all_gather(bytes) -> list[bytes]` over the store.
type Bootstrap = (usize, usize, PyObject);

/// Runs `f` with the runtime of `kind`, making it first if there is none (over UCX through
/// `bootstrap` when given, otherwise from the environment).
fn with_runtime<T>(
    kind: TransportKind,
    bootstrap: Option<Bootstrap>,
    f: impl FnOnce(&Runtime) -> meshfeed::Result<T>,
) -> meshfeed::Result<T> {
    let made_in = RUNTIME_PID.load(Ordering::Acquire);
    if made_in != 0 && made_in != std::process::id() {
        return Err(meshfeed::loader::fork_error(made_in, std::process::id()));
    }
    let mut runtime = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if runtime.is_none() {
        *runtime = Some(match (kind, bootstrap) {
            // `auto` is given a store only where no MPI launcher started the process.
            (TransportKind::Ucx | TransportKind::Auto, Some((rank, world, all_gather))) => {
                Runtime::ucx_with(rank, world, |payload| {
                    Python::with_gil(|py| {
                        let all: Vec<Vec<u8>> = all_gather
                            .call1(py, (PyBytes::new(py, &payload),))
                            .and_then(|v| v.extract(py))
                            .map_err(|e| {
                                meshfeed::Error::Transport(format!("exchanging UCX addresses through the store: {e}"))
                            })?;
                        Ok(all)
                    })
                })?
            }
            _ => Runtime::from_env(kind)?,
        });
        RUNTIME_PID.store(std::process::id(), Ordering::Release);
    }
    let runtime = runtime.as_ref().expect("made above");
    // `auto` takes the runtime as the first loader's choice made it.
    if kind != TransportKind::Auto && runtime.transport_kind() != kind {
        return Err(meshfeed::Error::Config(format!(
            "this process already joined its job over {}: every loader of a process uses one transport",
            runtime.transport_kind()
        )));
    }
    f(runtime)
}

/// What Python sees of a loader's layout: the mesh's axes (name, size), each device's
/// coordinate (device `d` is driven by rank `d / devices_per_process`), devices per
/// process, this rank's local rank and the number of ranks on its host, per field its
/// name, dtype (`None`: variable length), shape and the mesh axes splitting each
/// dimension of `[batch, *shape]`, and the read plan.
#[derive(serde::Serialize)]
struct Layout<'a> {
    mesh: Vec<(&'a str, usize)>,
    device_coords: Vec<Vec<usize>>,
    devices_per_process: usize,
    local_rank: usize,
    local_size: usize,
    fields: Vec<FieldLayout<'a>>,
    read: ReadLayout<'a>,
}

#[derive(serde::Serialize)]
struct FieldLayout<'a> {
    name: &'a str,
    dtype: Option<&'static str>,
    shape: Option<Vec<usize>>,
    dims: Vec<Vec<&'a str>>,
    zigzag: Vec<bool>,
}

/// How the ranks read their home ranges: the strategy, its passes per epoch, whether
/// what does not fit is spilled, this rank's resident rows and why.
#[derive(serde::Serialize)]
struct ReadLayout<'a> {
    strategy: &'static str,
    passes: Option<u64>,
    spill: bool,
    resident_rows: Option<u64>,
    reason: &'a str,
}

/// `value` (from `pythonize`) as JSON carries it: its tuples (a Rust tuple's) as lists, at
/// any depth. The layout and the state are plain data, so a `state_dict()` equals its
/// own JSON round trip.
fn json_shaped(value: Bound<'_, PyAny>) -> PyResult<Bound<'_, PyAny>> {
    if let Ok(dict) = value.downcast::<PyDict>() {
        // Replacing the values of a dict's keys while iterating it is allowed (PyDict_Next).
        for (key, item) in dict.iter() {
            dict.set_item(key, json_shaped(item)?)?;
        }
    } else if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        let items = value.try_iter()?.map(|item| json_shaped(item?)).collect::<PyResult<Vec<_>>>()?;
        return Ok(PyList::new(value.py(), items)?.into_any());
    }
    Ok(value)
}

/// What `Loader.metrics()` returns: the last window's and the epoch's records.
#[derive(serde::Serialize)]
struct LiveMetrics {
    window: Option<Live<meshfeed::telemetry::WindowRecord>>,
    epoch: Option<Live<meshfeed::telemetry::EpochRecord>>,
}

/// A record, with the part of the consumer's time it spent waiting for data.
#[derive(serde::Serialize)]
struct Live<T> {
    #[serde(flatten)]
    record: T,
    wait_fraction: f64,
}

/// A distributed loader (the Rust `meshfeed::loader::Loader`).
#[pyclass(module = "meshfeed._meshfeed")]
struct Loader {
    // A Python object may be reached from several threads; the loader is used by one at
    // a time.
    inner: Mutex<Option<meshfeed::loader::Loader>>,
    /// The process the loader was made in: a forked child gets a `MisuseError` before the
    /// mutex is touched (a thread of the parent may have held it at the fork).
    pid: u32,
    /// The exception a signal handler raised while the loader waited (Ctrl-C's
    /// `KeyboardInterrupt`, a SIGTERM handler's `SystemExit`): raised instead of the
    /// loader's own "interrupted" error.
    pending: Arc<Mutex<Option<PyErr>>>,
}

/// The signal check a loader runs while it waits (about every 100 ms, with the GIL
/// released): Python's handlers run here, on the main thread, and an exception they raise
/// ends the wait and is kept in `pending`.
fn signal_check(pending: Arc<Mutex<Option<PyErr>>>) -> impl FnMut() -> bool + Send + 'static {
    move || {
        Python::with_gil(|py| match py.check_signals() {
            Ok(()) => false,
            Err(e) => {
                *pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                true
            }
        })
    }
}

impl Loader {
    fn open(py: Python<'_>, file: JobFile, bootstrap: Option<Bootstrap>) -> PyResult<Loader> {
        let job: Job = file.into_job().map_err(error)?;
        // Opening is collective: other ranks may take a while to arrive.
        let loader = py
            .allow_threads(|| {
                with_runtime(job.transport, bootstrap, |rt| {
                    let world = rt.world();
                    let mut loader =
                        meshfeed::loader::Loader::open(world, &job.data, job.dataset.clone(), job.loader.clone())?;
                    loader.record_telemetry(world, &job)?;
                    // A Python job's heartbeat goes to stderr (the job's log), when asked for.
                    if let Some(every) = job.heartbeat.filter(|&s| s > 0.0) {
                        loader.heartbeat(std::time::Duration::from_secs_f64(every), |line| {
                            let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{line}\n").as_bytes());
                        });
                    }
                    Ok(loader)
                })
            })
            .map_err(error)?;
        let mut loader = loader;
        let pending = Arc::new(Mutex::new(None));
        loader.interrupt_with(signal_check(pending.clone()));
        Ok(Loader { inner: Mutex::new(Some(loader)), pid: std::process::id(), pending })
    }

    /// Runs `f` on the loader (an error once it is closed, or in a forked child).
    fn with<T>(&self, f: impl FnOnce(&mut meshfeed::loader::Loader) -> PyResult<T>) -> PyResult<T> {
        self.check_process()?;
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(inner.as_mut().ok_or_else(|| MisuseError::new_err("the loader was closed"))?)
    }

    fn check_process(&self) -> PyResult<()> {
        let now = std::process::id();
        if now != self.pid {
            return Err(error(meshfeed::loader::fork_error(self.pid, now)));
        }
        Ok(())
    }

    /// The outcome of a call that may have waited: a signal handler's exception first.
    fn outcome<T>(&self, result: meshfeed::Result<T>) -> PyResult<T> {
        if let Some(e) = self.pending.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        result.map_err(error)
    }
}

/// An epoch from Python (an `int` already, by `operator.index`): out of range — negative,
/// beyond 64 bits or [`meshfeed::loader::MAX_EPOCH`] — is the library's error.
fn epoch_arg(value: &Bound<'_, PyAny>) -> PyResult<u64> {
    value.extract::<u64>().map_err(|_| {
        let shown = value.str().map_or_else(|_| "?".to_string(), |s| s.to_string());
        error(meshfeed::loader::epoch_out_of_range(&shown))
    })
}

#[pymethods]
impl Loader {
    /// Opens a loader from a dict of the job file's keys ([`JobFile`], unknown keys
    /// refused); over UCX, `bootstrap` (rank, world size, all_gather) joins the job
    /// through a framework's store.
    #[new]
    #[pyo3(signature = (options, bootstrap=None))]
    fn new(py: Python<'_>, options: &Bound<'_, PyAny>, bootstrap: Option<Bootstrap>) -> PyResult<Loader> {
        let file: JobFile =
            depythonize(options).map_err(|e| ConfigError::new_err(format!("invalid loader options: {e}")))?;
        Loader::open(py, file, bootstrap)
    }

    /// Opens a loader from a TOML job file (relative dataset paths are relative to it).
    #[staticmethod]
    #[pyo3(signature = (path, bootstrap=None))]
    fn from_config(py: Python<'_>, path: &str, bootstrap: Option<Bootstrap>) -> PyResult<Loader> {
        let path = Path::new(path);
        let text = read_small_file(path, JOB_FILE_LIMIT).map_err(|e| ConfigError::new_err(e.to_string()))?;
        let file: JobFile = toml::from_str(&text).map_err(|e| {
            ConfigError::new_err(meshfeed::Error::file(path, format!("invalid job file: {}", e.message())).to_string())
        })?;
        Loader::open(py, file.relative_to(path.parent().unwrap_or(Path::new("."))), bootstrap)
    }

    /// The loader's [`Layout`] as a dict.
    fn layout<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.with(|l| {
            let mesh = l.mesh();
            let names = mesh.names();
            let fields = l
                .dataset()
                .fields()
                .iter()
                .zip(l.sharding())
                .map(|(f, s)| {
                    let (dtype, shape) = match &f.kind {
                        FieldKind::Tensor { dtype, shape } => (Some(dtype.name()), Some(shape.clone())),
                        FieldKind::Bytes { .. } => (None, None),
                    };
                    let dims = s.dims.iter().map(|axes| axes.iter().map(|&a| names[a].as_str()).collect()).collect();
                    FieldLayout { name: &f.name, dtype, shape, dims, zigzag: s.zigzag.clone() }
                })
                .collect();
            let (local_rank, local_size) = l.local_rank();
            let plan = l.read_plan();
            let layout = Layout {
                mesh: names.iter().map(String::as_str).zip(mesh.sizes().iter().copied()).collect(),
                device_coords: (0..mesh.devices()).map(|d| mesh.coords(meshfeed::types::Rank(d))).collect(),
                devices_per_process: l.options().layout.devices_per_process,
                local_rank,
                local_size,
                fields,
                read: ReadLayout {
                    strategy: plan.strategy.name(),
                    passes: match plan.strategy {
                        meshfeed::plan::Strategy::Passes { passes } => Some(passes),
                        _ => None,
                    },
                    spill: plan.spill,
                    resident_rows: plan.resident.get(l.rank().0).copied(),
                    reason: &plan.reason,
                },
            };
            json_shaped(pythonize(py, &layout).map_err(|e| InternalError::new_err(format!("layout: {e}")))?)
        })
    }

    fn steps_per_epoch(&self) -> PyResult<u64> {
        self.with(|l| Ok(l.steps_per_epoch()))
    }

    /// The agreed stop request: the signal number, or `None` (see `Loader::stop_requested`).
    fn stop_requested(&self) -> PyResult<Option<i32>> {
        self.with(|l| l.stop_requested().map_err(error))
    }

    fn request_stop(&self) -> PyResult<()> {
        self.with(|l| {
            l.request_stop();
            Ok(())
        })
    }

    /// The last window's and the epoch's figures, as the telemetry records them, each with
    /// its `wait_fraction`: `{"window": {...} | None, "epoch": {...} | None}`.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (window, epoch) = self.with(|l| Ok(l.live_metrics()))?;
        let out = LiveMetrics {
            window: window.map(|w| Live { wait_fraction: w.wait_fraction(), record: w }),
            epoch: epoch.map(|e| Live { wait_fraction: e.wait_fraction(), record: e }),
        };
        json_shaped(pythonize(py, &out).map_err(|e| InternalError::new_err(format!("metrics: {e}")))?)
    }

    fn rank(&self) -> PyResult<usize> {
        self.with(|l| Ok(l.rank().0))
    }

    fn world_size(&self) -> PyResult<usize> {
        self.with(|l| Ok(l.world_size()))
    }

    /// Positions the loader at the start of `epoch` (collective, interruptible).
    fn set_epoch(&self, py: Python<'_>, epoch: &Bound<'_, PyAny>) -> PyResult<()> {
        let epoch = epoch_arg(epoch)?;
        self.with(|l| {
            let set = py.allow_threads(|| l.set_epoch(Epoch(epoch)));
            self.outcome(set)
        })
    }

    /// The next batch of the epoch, or `None` at the epoch's end. The GIL is released
    /// while it waits.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<Batch>> {
        let Some((batch, rows)) = self.with(|l| {
            let batch = py.allow_threads(|| l.next_batch());
            let batch = self.outcome(batch)?;
            Ok(batch.map(|b| {
                let rows = l.placement_for_step(b.step()).batch_size();
                (b, rows)
            }))
        })?
        else {
            return Ok(None);
        };
        let (epoch, step, coords) = (batch.epoch().0, batch.step().0, batch.coords().to_vec());
        let ids: Vec<u8> = batch.ids().iter().flat_map(|id| (id.0 as i64).to_le_bytes()).collect();
        let ids = FieldBuffer::new(Bytes::Owned(ids), DType::I64, vec![batch.ids().len()])?;
        let fields = PyDict::new(py);
        for data in batch.into_fields() {
            let name = data.field().name.clone();
            match (&data.field().kind, data.shape()) {
                (FieldKind::Tensor { dtype, .. }, Some(shape)) => {
                    let dtype = *dtype;
                    fields.set_item(name, FieldBuffer::new(Bytes::Field(data), dtype, shape)?)?;
                }
                // Lists of numbers: every row's elements in one array, and where each
                // row's start (rows + 1 offsets, in elements).
                (FieldKind::Bytes { elem: Some(dtype), .. }, _) => {
                    let dtype = *dtype;
                    let mut values = Vec::new();
                    let mut offsets = Vec::with_capacity((data.rows() + 1) * 8);
                    offsets.extend(0i64.to_le_bytes());
                    for i in 0..data.rows() {
                        values.extend_from_slice(data.row(i));
                        offsets.extend(((values.len() / dtype.size()) as i64).to_le_bytes());
                    }
                    let n = values.len() / dtype.size();
                    let values = Py::new(py, FieldBuffer::new(Bytes::Owned(values), dtype, vec![n])?)?;
                    let offsets =
                        Py::new(py, FieldBuffer::new(Bytes::Owned(offsets), DType::I64, vec![data.rows() + 1])?)?;
                    fields.set_item(name, PyTuple::new(py, [values, offsets])?)?;
                }
                _ => {
                    let rows: Vec<Bound<'_, PyBytes>> =
                        (0..data.rows()).map(|i| PyBytes::new(py, data.row(i))).collect();
                    fields.set_item(name, PyList::new(py, rows)?)?;
                }
            }
        }
        Ok(Some(Batch { epoch, step, coords, global_rows: rows, ids: Py::new(py, ids)?, fields: fields.unbind() }))
    }

    /// The loader's state ([`LoaderState`]) as a dict.
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = self.with(|l| Ok(l.state()))?;
        json_shaped(pythonize(py, &state).map_err(|e| InternalError::new_err(format!("state: {e}")))?)
    }

    /// Continues where a state from `state` (of any rank count) says.
    fn load_state(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let state: LoaderState =
            depythonize(state).map_err(|e| ConfigError::new_err(format!("invalid loader state: {e}")))?;
        self.with(|l| {
            let sought = py.allow_threads(|| l.seek(&state));
            self.outcome(sought)
        })
    }

    /// Drops the loader (collective: every rank closes it at the same point). In a forked
    /// child nothing happens: the loader is the parent's.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.check_process().is_err() {
            return Ok(());
        }
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.allow_threads(|| drop(inner));
        self.outcome(Ok(()))
    }
}

/// This rank's part of one global batch: the global batch's position, this rank's
/// coordinates, the rows' sample ids (int64) and the fields received, by name: a
/// [`FieldBuffer`] per tensor field, a list of `bytes` per variable-length one.
#[pyclass(module = "meshfeed._meshfeed", frozen)]
struct Batch {
    #[pyo3(get)]
    epoch: u64,
    #[pyo3(get)]
    step: u64,
    coords: Vec<usize>,
    /// The size of the global batch (smaller for a `partial` tail).
    #[pyo3(get)]
    global_rows: usize,
    #[pyo3(get)]
    ids: Py<FieldBuffer>,
    fields: Py<PyDict>,
}

#[pymethods]
impl Batch {
    /// This rank's coordinate on each mesh axis (of its first device).
    #[getter]
    fn coords<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.coords)
    }

    /// The fields, by name, in the dataset's order (a fresh dict of the same objects).
    #[getter]
    fn fields<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.fields.bind(py).copy()
    }
}

/// The bytes behind a [`FieldBuffer`].
enum Bytes {
    Field(FieldData),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Field(f) => f.bytes(),
            Bytes::Owned(v) => v,
        }
    }
}

/// The buffer protocol's (struct module's) format of a dtype: meshfeed delivers
/// little-endian values.
fn buffer_format(dtype: DType) -> &'static CStr {
    match dtype {
        DType::Bool => c"?",
        DType::U8 => c"B",
        DType::I8 => c"b",
        DType::U16 => c"<H",
        DType::I16 => c"<h",
        DType::U32 => c"<I",
        DType::I32 => c"<i",
        DType::U64 => c"<Q",
        DType::I64 => c"<q",
        DType::F16 => c"<e",
        DType::F32 => c"<f",
        DType::F64 => c"<d",
    }
}

/// One tensor's bytes, owned, exposed read-only through the buffer protocol as a C-order
/// array of its dtype and shape: `numpy.asarray`, `memoryview` and friends view it without
/// a copy, and keep it alive.
#[pyclass(module = "meshfeed._meshfeed", frozen)]
struct FieldBuffer {
    bytes: Bytes,
    dtype: DType,
    /// The shape and C-order strides in bytes, as the buffer protocol reads them: they
    /// live (and never move) as long as this object, which every view references.
    shape: Box<[pyo3::ffi::Py_ssize_t]>,
    strides: Box<[pyo3::ffi::Py_ssize_t]>,
}

impl FieldBuffer {
    fn new(bytes: Bytes, dtype: DType, shape: Vec<usize>) -> PyResult<FieldBuffer> {
        let items: Option<usize> = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if items.and_then(|n| n.checked_mul(dtype.size())) != Some(bytes.as_slice().len()) {
            return Err(InternalError::new_err(format!(
                "a field of {} bytes is not a {} array of shape {shape:?}",
                bytes.as_slice().len(),
                dtype.name()
            )));
        }
        let size = |n: usize| {
            pyo3::ffi::Py_ssize_t::try_from(n).map_err(|_| InternalError::new_err("a field too large for Python"))
        };
        let mut strides = vec![0; shape.len()];
        let mut stride = dtype.size();
        for (s, &d) in strides.iter_mut().zip(&shape).rev() {
            *s = size(stride)?;
            stride = stride.saturating_mul(d);
        }
        let shape = shape.into_iter().map(size).collect::<PyResult<Vec<_>>>()?;
        Ok(FieldBuffer { bytes, dtype, shape: shape.into(), strides: strides.into() })
    }
}

#[pymethods]
impl FieldBuffer {
    /// The element type, as meshfeed names it (`f32`, `i64`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    /// The array's shape, `(rows, *slice)`.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.shape.iter())
    }

    /// The buffer protocol (PEP 3118): a read-only C-order array of the dtype's format and
    /// the shape. A request without `PyBUF_ND` gets the bytes as one run (`ndim` 1, no
    /// shape, `itemsize` 1, format `B`), as `PyBuffer_FillInfo` exports them; one for
    /// Fortran order is refused unless the array is also Fortran-contiguous.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        use pyo3::ffi;
        if view.is_null() {
            return Err(PyBufferError::new_err("no view to fill"));
        }
        // SAFETY: `view` is the caller's, to fill; on an error its `obj` must be NULL.
        unsafe { (*view).obj = std::ptr::null_mut() };
        let requested = |flag: c_int| flags & flag == flag;
        if requested(ffi::PyBUF_WRITABLE) {
            return Err(PyBufferError::new_err("meshfeed batches are read-only"));
        }
        let this = slf.get();
        let bytes = this.bytes.as_slice();
        // C order is also Fortran order where at most one dimension exceeds 1, or where
        // there are no elements (CPython's PyBuffer_IsContiguous).
        if requested(ffi::PyBUF_F_CONTIGUOUS) && !bytes.is_empty() && this.shape.iter().filter(|&&d| d > 1).count() > 1
        {
            return Err(PyBufferError::new_err(format!(
                "a meshfeed field of shape {:?} is C-contiguous, not Fortran-contiguous",
                this.shape
            )));
        }
        let nd = requested(ffi::PyBUF_ND);
        // SAFETY: the bytes, the format, the shape and the strides live as long as `obj`
        // (this object, referenced by the view), and a frozen FieldBuffer never changes
        // them. PyBUF_STRIDES includes PyBUF_ND: strides are only given with the shape.
        unsafe {
            (*view).buf = bytes.as_ptr() as *mut c_void;
            (*view).len = bytes.len() as ffi::Py_ssize_t;
            (*view).readonly = 1;
            (*view).itemsize = if nd { this.dtype.size() as ffi::Py_ssize_t } else { 1 };
            (*view).format = match (requested(ffi::PyBUF_FORMAT), nd) {
                (false, _) => std::ptr::null_mut(),
                (true, true) => buffer_format(this.dtype).as_ptr() as *mut _,
                (true, false) => c"B".as_ptr() as *mut _,
            };
            (*view).ndim = if nd { this.shape.len() as c_int } else { 1 };
            (*view).shape = if nd { this.shape.as_ptr() as *mut _ } else { std::ptr::null_mut() };
            (*view).strides =
                if requested(ffi::PyBUF_STRIDES) { this.strides.as_ptr() as *mut _ } else { std::ptr::null_mut() };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
            (*view).obj = slf.clone().into_any().into_ptr();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

/// Refuses an epoch out of range (as `set_epoch` does): a state's epoch, checked before
/// the state is, so that the message is the same as `set_epoch`'s.
#[pyfunction]
fn check_epoch(epoch: &Bound<'_, PyAny>) -> PyResult<()> {
    meshfeed::loader::check_epoch(epoch_arg(epoch)?).map_err(error)
}

/// Ends the process's runtime (finalises MPI if meshfeed initialised it). Called at exit
/// by the package, after its loaders are closed.
#[pyfunction]
fn shutdown(py: Python<'_>) {
    let made_in = RUNTIME_PID.load(Ordering::Acquire);
    if made_in != 0 && made_in != std::process::id() {
        return; // a forked child: the runtime is the parent's
    }
    let runtime = RUNTIME.lock().unwrap_or_else(|p| p.into_inner()).take();
    py.allow_threads(|| drop(runtime));
}

/// Whether an MPI launcher started this process (`transport="auto"` then joins over MPI,
/// not through a framework's store).
#[pyfunction]
fn launched_by_mpi() -> bool {
    meshfeed::runtime::launched_by_mpi(|v| std::env::var(v).ok())
}

/// Every key of a job file, sorted ([`JobFile::keys`]): what `Loader`'s keyword
/// arguments are checked against.
#[pyfunction]
fn job_keys() -> Vec<String> {
    JobFile::keys()
}

/// The `meshfeed` command line (the package's console script, `python -m meshfeed`): runs
/// `argv` (the program's name first) with the GIL released and returns the exit code.
/// `relaunch` is the command that starts the command line again (`launch`'s ranks): the
/// current executable is the interpreter here, not a `meshfeed` binary.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<OsString>, relaunch: Vec<OsString>) -> i32 {
    py.allow_threads(|| meshfeed_cli::main_relaunched_by(argv, Some(relaunch)))
}

#[pymodule]
fn _meshfeed(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Loader>()?;
    m.add_class::<Batch>()?;
    m.add_class::<FieldBuffer>()?;
    m.add_function(wrap_pyfunction!(job_keys, m)?)?;
    m.add_function(wrap_pyfunction!(launched_by_mpi, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(check_epoch, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add("Error", m.py().get_type::<Error>())?;
    m.add("DataError", m.py().get_type::<DataError>())?;
    m.add("ConfigError", m.py().get_type::<ConfigError>())?;
    m.add("TransportError", m.py().get_type::<TransportError>())?;
    m.add("VerifyError", m.py().get_type::<VerifyError>())?;
    m.add("MisuseError", m.py().get_type::<MisuseError>())?;
    m.add("InternalError", m.py().get_type::<InternalError>())?;
    Ok(())
}
