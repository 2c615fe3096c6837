"""The Python edge against the one job declaration (`meshfeed::config::JobFile`): Loader's
keyword arguments, the `JobOptions` type and the `Literal`s of the enumerated options
cannot drift from the job file's keys and values; field buffers carry their dtype and
shape, so that numpy, memoryview and torch read every dtype as it is.

Run by tests/ci.sh after `pip install ./python` into the test venv: `pytest python/tests`.
"""

import inspect
import re
import sys
import typing

import pytest

import meshfeed
from meshfeed import _meshfeed, options
from test_loader import BIN, MPIRUN, ok, run

# Loader's keyword arguments that are not job keys, and why.
PYTHON_ONLY = {
    "bootstrap": "how transport='ucx' finds its peers through a framework's store in this process "
                 "(torch.distributed, jax.distributed): a job file describes no process",
    "source": "a shared feeder as the data: the job file gives it as its one data path",
}
# Job keys Loader deliberately leaves out, and why.
OMITTED = {
    "epochs": "the training loop runs the epochs (set_epoch, then iterate): a loader has no run length",
}


def test_loader_keyword_arguments_are_the_job_keys():
    keys = set(_meshfeed.job_keys())
    params = set(inspect.signature(meshfeed.Loader.__init__).parameters) - {"self"}
    assert set(OMITTED) <= keys and not set(PYTHON_ONLY) & keys
    missing, extra = keys - set(OMITTED) - params, params - keys - set(PYTHON_ONLY)
    assert not missing, f"job keys Loader does not take (add them, or to OMITTED with a reason): {sorted(missing)}"
    assert not extra, f"Loader arguments that are no job key (add to PYTHON_ONLY with a reason): {sorted(extra)}"


def test_job_options_type_is_the_job_file():
    declared = set(options.JobOptions.__optional_keys__) | set(options.JobOptions.__required_keys__)
    assert declared == set(_meshfeed.job_keys())


@pytest.mark.parametrize("key, literal", [
    ("transport", options.Transport),
    ("tail", options.Tail),
    ("exchange", options.Exchange),
    ("read_strategy", options.ReadStrategy),
    ("local_reads", options.LocalReads),
    ("balance", options.Balance),
    ("tune", options.Tune),
    ("stages", options.Stage),
])
def test_literals_are_the_values_the_job_file_takes(key, literal):
    # The job declaration names the values it takes when given another (before any MPI).
    value = {"x": "?"} if key == "stages" else "?"
    with pytest.raises(meshfeed.ConfigError) as e:
        _meshfeed.Loader({"data": ["/nonexistent"], "batch_size": 1, key: value})
    message = str(e.value)
    assert message.startswith("invalid loader options: unknown variant `?`, expected"), message
    accepted = re.findall(r"`([^`]+)`", message.split("expected", 1)[1])
    assert sorted(typing.get_args(literal)) == sorted(accepted), message


def test_unknown_options_and_states_are_refused_by_name():
    with pytest.raises(meshfeed.ConfigError, match="invalid loader options: unknown field `bogus`, expected one of"):
        _meshfeed.Loader({"data": ["/nonexistent"], "batch_size": 1, "bogus": 1})
    with pytest.raises(meshfeed.ConfigError, match="invalid loader options: .*"):
        _meshfeed.Loader({"data": ["/nonexistent"], "batch_size": "twelve"})


def test_data_or_a_feeder_source_and_a_batch_size_are_asked_for():
    with pytest.raises(meshfeed.ConfigError, match="give data .* or source .*, one of them"):
        meshfeed.Loader(batch_size=4)
    with pytest.raises(meshfeed.ConfigError, match="one of them"):
        meshfeed.Loader("/data", 4, source="meshfeed://h:1/d")
    with pytest.raises(meshfeed.ConfigError, match=r"no batch size given \(batch_size=...\)"):
        meshfeed.Loader(source="meshfeed://h:1/d")
    with pytest.raises(meshfeed.ConfigError, match="shared order \"7,blk=2\": unknown part"):
        _meshfeed.Loader({"data": ["/nonexistent"], "batch_size": 1, "shared_order": "7,blk=2"})


def test_every_dtype_reaches_numpy_and_torch_as_it_is(tmp_path):
    data = tmp_path / "dtypes"
    fields = ["a:bool:3", "b:f16:2x2", "c:u16", "d:i8", "e:u64", "f:f64:2", "g:i16", "h:u32", "i:i32", "j:f32:1",
              "k:u8:5", "m:i64"]
    ok(run([BIN, "gen", "--format", "npy", "--samples", "24", "--files", "1", "--out", data]
           + [a for f in fields for a in ("--field", f)]))
    script = (
        "import sys, numpy as np, torch, meshfeed\n"
        "l = meshfeed.Loader(sys.argv[1], 8, seed=3)\n"
        "want = np.load(sys.argv[1] + '/part-00000.npy')\n"
        "for b in l:\n"
        "    assert b.ids.dtype == np.int64 and b.ids.shape == (8,) and not b.ids.flags.writeable\n"
        "    t = b.to_torch(device='cpu')\n"
        "    for name, v in b.items():\n"
        "        w = want[name][b.ids]\n"
        "        assert v.dtype == w.dtype and v.shape == w.shape and np.array_equal(v, w), (name, v, w)\n"
        "        assert not v.flags.writeable and memoryview(v).shape == v.shape, name\n"
        "        assert t[name].numpy().dtype == w.dtype and t[name].data_ptr() == v.ctypes.data, name\n"
        "print('dtypes ok', len(l))\n"
    )
    r = ok(run(MPIRUN + ["-np", 1, sys.executable, "-c", script, data]))
    assert "dtypes ok 3" in r.stdout, r.stdout + r.stderr


# A consumer's requests of a field buffer (PyObject_GetBuffer through ctypes), and what
# each one fills in: (len, itemsize, ndim, format, shape, strides).
BUFFER_REQUESTS = r"""
import ctypes, hashlib, sys, zlib
import numpy as np, meshfeed

SIMPLE, WRITABLE, FORMAT, ND, STRIDES = 0, 0x1, 0x4, 0x8, 0x18
C_CONTIGUOUS, F_CONTIGUOUS, ANY_CONTIGUOUS, FULL_RO = 0x38, 0x58, 0x98, 0x11C


class Py_buffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
                ("strides", ctypes.POINTER(ctypes.c_ssize_t)), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]


get, release = ctypes.pythonapi.PyObject_GetBuffer, ctypes.pythonapi.PyBuffer_Release
get.argtypes = [ctypes.py_object, ctypes.POINTER(Py_buffer), ctypes.c_int]
release.argtypes, release.restype = [ctypes.POINTER(Py_buffer)], None


def request(obj, flags):
    view = Py_buffer(obj=1)  # garbage the exporter must overwrite (NULL on an error)
    try:
        get(obj, ctypes.byref(view), flags)
    except BufferError:
        assert view.obj is None, "a refused request leaves view.obj set"
        raise
    try:
        assert view.obj == id(obj) and view.readonly == 1 and view.suboffsets is None, flags
        n = view.ndim
        return (view.len, view.itemsize, n, view.format, tuple(view.shape[:n]) if view.shape else None,
                tuple(view.strides[:n]) if view.strides else None)
    finally:
        release(ctypes.byref(view))


def refused(obj, flags):
    try:
        request(obj, flags)
    except BufferError as e:
        return str(e)
    raise AssertionError(f"request {flags:#x} of {obj.shape} not refused")


loader = meshfeed.Loader(sys.argv[1], 8, seed=3)
raw = loader._inner.next_batch()
x, v, ids = raw.fields["x"], raw.fields["v"], raw.ids  # (8, 4, 6) f32, (8, 1) i16, (8,) i64
refs = sys.getrefcount(x)
n = 8 * 4 * 6 * 4

# memoryview (a full request): the dtype's format, the shape, C-order strides.
m = memoryview(x)
assert (m.format, m.itemsize, m.ndim, m.shape, m.strides, m.nbytes) == ("<f", 4, 3, (8, 4, 6), (96, 24, 4), n)
assert m.readonly and m.c_contiguous and m.contiguous and not m.f_contiguous
assert m.tobytes() == bytes(x) == np.asarray(x).tobytes()
m.release()
assert memoryview(v).f_contiguous and memoryview(ids).f_contiguous
assert request(x, FULL_RO) == (n, 4, 3, b"<f", (8, 4, 6), (96, 24, 4))
assert request(x, STRIDES) == request(x, C_CONTIGUOUS) == request(x, ANY_CONTIGUOUS) == (
    n, 4, 3, None, (8, 4, 6), (96, 24, 4))
assert request(x, ND) == (n, 4, 3, None, (8, 4, 6), None)
assert request(x, ND | FORMAT) == (n, 4, 3, b"<f", (8, 4, 6), None)

# Without PyBUF_ND: the bytes as one run, as PyBuffer_FillInfo exports them.
assert request(x, SIMPLE) == (n, 1, 1, None, None, None)
assert request(x, FORMAT) == (n, 1, 1, b"B", None, None)
# hashlib and zlib make SIMPLE requests (hashlib refuses a view of more than one dimension).
assert hashlib.sha256(x).digest() == hashlib.sha256(np.asarray(x).tobytes()).digest()
assert zlib.crc32(x) == zlib.crc32(np.asarray(x).tobytes())

# Fortran order: refused where the C-ordered data is not also Fortran-ordered.
assert "Fortran" in refused(x, F_CONTIGUOUS) and "Fortran" in refused(x, F_CONTIGUOUS | FORMAT)
assert request(v, F_CONTIGUOUS) == (16, 2, 2, None, (8, 1), (2, 2))
assert request(ids, F_CONTIGUOUS | FORMAT) == (64, 8, 1, b"<q", (8,), (8,))
assert "read-only" in refused(x, WRITABLE) and "read-only" in refused(x, FULL_RO | WRITABLE)
assert sys.getrefcount(x) == refs, "a view's reference was not released"
loader.close()
print("buffers ok")
"""


def test_field_buffers_answer_each_buffer_request_as_pep_3118_says(tmp_path):
    data = tmp_path / "buffers"
    ok(run([BIN, "gen", "--format", "npy", "--samples", "16", "--files", "1", "--out", data]
           + ["--field", "x:f32:4x6", "--field", "v:i16:1"]))
    r = ok(run(MPIRUN + ["-np", 1, sys.executable, "-c", BUFFER_REQUESTS, data]))
    assert "buffers ok" in r.stdout, r.stdout + r.stderr


def test_the_ray_launcher_is_a_module_that_imports_ray_only_when_run():
    # `import meshfeed` (and the launcher's module itself) work without importing Ray.
    script = (
        "import sys, meshfeed, meshfeed.launch.ray as launcher\n"
        "assert 'ray' not in sys.modules, 'ray imported'\n"
        "assert launcher.parse_args(['-n', '2', '--', 'true']).n == 2\n"
        "print('ok')\n"
    )
    r = ok(run([sys.executable, "-c", script]))
    assert r.stdout.strip() == "ok", r.stdout + r.stderr
