//! `meshfeed._meshfeed`: the extension module under the `meshfeed` Python package. It is
//! thin on purpose: options arrive as the job file's keys (JSON from the Python side),
//! batches leave as plain tuples whose field buffers are handed over without a copy
//! (`FieldBuffer`, the buffer protocol), and everything else — arrays, the mapping, state
//! dicts, exceptions' classes — is Python in `pysrc/meshfeed`.

use std::ffi::{c_int, c_void};
use std::path::Path;
use std::sync::Mutex;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use meshfeed::config::{Job, JobFile, TransportKind};
use meshfeed::dataset::FieldKind;
use meshfeed::loader::{FieldData, LoaderState};
use meshfeed::runtime::Runtime;
use meshfeed::types::Epoch;

pyo3::create_exception!(
    _meshfeed,
    Error,
    pyo3::exceptions::PyException,
    "A meshfeed error: the same message the command line prints, on every rank."
);

fn error(e: meshfeed::Error) -> PyErr {
    Error::new_err(e.to_string())
}

/// The process's runtime (MPI initialised or adopted, or the UCX rendezvous joined),
/// made by the first loader and kept until `shutdown`.
static RUNTIME: Mutex<Option<Runtime>> = Mutex::new(None);

/// Runs `f` with the runtime of `kind`, making it first if there is none.
fn with_runtime<T>(kind: TransportKind, f: impl FnOnce(&Runtime) -> meshfeed::Result<T>) -> meshfeed::Result<T> {
    let mut runtime = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if runtime.is_none() {
        *runtime = Some(Runtime::from_env(kind)?);
    }
    let runtime = runtime.as_ref().expect("made above");
    if runtime.transport_kind() != kind {
        return Err(meshfeed::Error::Config(format!(
            "this process already joined its job over {}: every loader of a process uses one transport",
            runtime.transport_kind()
        )));
    }
    f(runtime)
}

/// A distributed loader (the Rust `meshfeed::loader::Loader`).
#[pyclass(module = "meshfeed._meshfeed")]
struct Loader {
    // A Python object may be reached from several threads; the loader is used by one at
    // a time.
    inner: Mutex<Option<meshfeed::loader::Loader>>,
}

impl Loader {
    fn open(py: Python<'_>, file: JobFile) -> PyResult<Loader> {
        let job: Job = file.into_job().map_err(error)?;
        // Opening is collective: other ranks may take a while to arrive.
        let loader = py
            .allow_threads(|| {
                with_runtime(job.transport, |rt| {
                    meshfeed::loader::Loader::open(rt.world(), &job.data, job.dataset.clone(), job.loader.clone())
                })
            })
            .map_err(error)?;
        Ok(Loader { inner: Mutex::new(Some(loader)) })
    }

    /// Runs `f` on the loader (an error once it is closed).
    fn with<T>(&self, f: impl FnOnce(&mut meshfeed::loader::Loader) -> PyResult<T>) -> PyResult<T> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(inner.as_mut().ok_or_else(|| Error::new_err("the loader was closed"))?)
    }
}

#[pymethods]
impl Loader {
    /// Opens a loader from the job file's keys, as a JSON object.
    #[new]
    fn new(py: Python<'_>, options_json: &str) -> PyResult<Loader> {
        let file: JobFile =
            serde_json::from_str(options_json).map_err(|e| Error::new_err(format!("invalid loader options: {e}")))?;
        Loader::open(py, file)
    }

    /// Opens a loader from a TOML job file (relative dataset paths are relative to it).
    #[staticmethod]
    fn from_config(py: Python<'_>, path: &str) -> PyResult<Loader> {
        let path = Path::new(path);
        let text = std::fs::read_to_string(path).map_err(|e| error(meshfeed::Error::io(path, e)))?;
        let file: JobFile = toml::from_str(&text)
            .map_err(|e| error(meshfeed::Error::file(path, format!("invalid job file: {}", e.message()))))?;
        Loader::open(py, file.relative_to(path.parent().unwrap_or(Path::new("."))))
    }

    fn steps_per_epoch(&self) -> PyResult<u64> {
        self.with(|l| Ok(l.steps_per_epoch()))
    }

    fn rank(&self) -> PyResult<usize> {
        self.with(|l| Ok(l.rank().0))
    }

    fn world_size(&self) -> PyResult<usize> {
        self.with(|l| Ok(l.world_size()))
    }

    fn set_epoch(&self, epoch: u64) -> PyResult<()> {
        self.with(|l| {
            l.set_epoch(Epoch(epoch));
            Ok(())
        })
    }

    /// The next batch of the epoch as `(epoch, step, coords, ids, fields)`, or `None` at
    /// the epoch's end; `ids` are int64 bytes and each field is `(name, dtype, shape,
    /// buffer)` (tensors) or `(name, None, None, [bytes, ...])` (variable length). The GIL
    /// is released while it waits.
    fn next_batch<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(batch) = self.with(|l| py.allow_threads(|| l.next_batch()).map_err(error))? else {
            return Ok(None);
        };
        let (epoch, step, coords) = (batch.epoch().0, batch.step().0, batch.coords().to_vec());
        let ids: Vec<u8> = batch.ids().iter().flat_map(|id| (id.0 as i64).to_le_bytes()).collect();
        let fields = PyList::empty(py);
        for data in batch.into_fields() {
            let name = data.field().name.clone();
            let dtype = match &data.field().kind {
                FieldKind::Tensor { dtype, .. } => Some(dtype.name()),
                FieldKind::Bytes { .. } => None,
            };
            let item = match (dtype, data.shape()) {
                (Some(dtype), Some(shape)) => {
                    let buffer = Bound::new(py, FieldBuffer { data })?;
                    (name, Some(dtype), Some(shape), buffer.into_any()).into_pyobject(py)?
                }
                _ => {
                    let rows: Vec<Bound<'py, PyBytes>> =
                        (0..data.rows()).map(|i| PyBytes::new(py, data.row(i))).collect();
                    (name, None::<&str>, None::<Vec<usize>>, PyList::new(py, rows)?.into_any()).into_pyobject(py)?
                }
            };
            fields.append(item)?;
        }
        Ok(Some((epoch, step, coords, PyBytes::new(py, &ids), fields).into_pyobject(py)?))
    }

    /// The loader's state ([`LoaderState`]) as JSON.
    fn state_json(&self) -> PyResult<String> {
        self.with(|l| serde_json::to_string(&l.state()).map_err(|e| Error::new_err(format!("state: {e}"))))
    }

    /// Continues where a state from `state_json` (of any rank count) says.
    fn load_state_json(&self, py: Python<'_>, state: &str) -> PyResult<()> {
        let state: LoaderState =
            serde_json::from_str(state).map_err(|e| Error::new_err(format!("invalid loader state: {e}")))?;
        self.with(|l| py.allow_threads(|| l.seek(&state)).map_err(error))
    }

    /// Drops the loader (collective: every rank closes it at the same point).
    fn close(&self, py: Python<'_>) {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.allow_threads(|| drop(inner));
    }
}

/// One field's bytes, owned, exposed read-only through the buffer protocol: numpy arrays
/// are views of it (`numpy.frombuffer`), and keep it alive.
#[pyclass(module = "meshfeed._meshfeed", frozen)]
struct FieldBuffer {
    data: FieldData,
}

#[pymethods]
impl FieldBuffer {
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        use pyo3::ffi;
        if view.is_null() {
            return Err(PyBufferError::new_err("no view to fill"));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("meshfeed batches are read-only"));
        }
        let bytes = slf.get().data.bytes();
        // SAFETY: `view` is the caller's; the bytes live as long as `obj` (this object,
        // referenced by the view), and a frozen FieldBuffer never changes them.
        unsafe {
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).buf = bytes.as_ptr() as *mut c_void;
            (*view).len = bytes.len() as ffi::Py_ssize_t;
            (*view).readonly = 1;
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                c"B".as_ptr() as *mut _
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape =
                if flags & ffi::PyBUF_ND == ffi::PyBUF_ND { &mut (*view).len } else { std::ptr::null_mut() };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                &mut (*view).itemsize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

/// Ends the process's runtime (finalises MPI if meshfeed initialised it). Called at exit
/// by the package, after its loaders are closed.
#[pyfunction]
fn shutdown(py: Python<'_>) {
    let runtime = RUNTIME.lock().unwrap_or_else(|p| p.into_inner()).take();
    py.allow_threads(|| drop(runtime));
}

#[pymodule]
fn _meshfeed(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Loader>()?;
    m.add_class::<FieldBuffer>()?;
    m.add_function(wrap_pyfunction!(shutdown, m)?)?;
    m.add("Error", m.py().get_type::<Error>())?;
    Ok(())
}
