"""The ``meshfeed`` console script that ``pip install ./python`` puts next to the venv's
interpreter: the same command line as the binary (target/release/meshfeed), compared with it
here for the version, data written, jobs under real mpirun and under ``meshfeed launch``
(whose ranks are the console script again), errors, a closed stdout and stop signals.

Run by tests/ci.sh after the package is installed into the test venv.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import test_loader
from test_loader import BIN, MPIRUN, ROOT, TIMEOUT, ok

# The console script of the interpreter running the tests (the venv's bin).
SCRIPT = Path(sys.executable).parent / "meshfeed"
ENV = dict(test_loader.ENV, UCX_NET_DEVICES="lo")
ENV.pop("MESHFEED_JOB_TOKEN", None)


def run(cmd, **kw):
    """test_loader's bounded run, in this module's environment by default."""
    return test_loader.run(cmd, env=kw.pop("env", ENV), **kw)


def both(args, mpirun_np=None):
    """The console script's and the binary's results for the same arguments."""
    def one(program):
        prefix = MPIRUN + ["-np", mpirun_np] if mpirun_np else []
        return run(prefix + [program, *args])
    return one(SCRIPT), one(BIN)


def test_the_console_script_is_installed_next_to_the_interpreter():
    assert SCRIPT.is_file() and os.access(SCRIPT, os.X_OK), f"pip install ./python did not install {SCRIPT}"
    assert BIN.is_file(), f"{BIN}: build the workspace first (cargo build --release --workspace)"


def test_version_names_the_revision():
    script, native = both(["--version"])
    ok(script)
    ok(native)
    assert script.stdout == native.stdout
    m = re.fullmatch(r"meshfeed (\d+\.\d+\.\d+) \((\S+) (\d{4}-\d{2}-\d{2})\)\n", script.stdout)
    assert m, script.stdout
    rev = m.group(2)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        # A source tree without git (an archive): the version says so instead of a revision.
        assert script.stdout.endswith("(not built from a git checkout)\n"), script.stdout
        return
    short = rev.removesuffix("-dirty")
    assert len(short) >= 7 and head.stdout.strip().startswith(short), (script.stdout, head.stdout)
    # `python -m meshfeed` is the same command line.
    assert ok(run([sys.executable, "-m", "meshfeed", "--version"])).stdout == script.stdout


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli")
    made = {}
    for name, program in [("script", SCRIPT), ("native", BIN)]:
        d = base / name
        ok(run([program, "gen", "--format", "npy", "--samples", "3000", "--files", "3", "--field", "x:f32:8",
                "--field", "y:i64", "--out", d]))
        made[name] = d
    files = sorted(p.name for p in made["native"].iterdir())
    assert files and files == sorted(p.name for p in made["script"].iterdir())
    for f in files:
        assert (made["script"] / f).read_bytes() == (made["native"] / f).read_bytes(), f
    return made["native"]


def dumps(d: Path, ranks: int):
    return [(d / f"rank-{r}.jsonl").read_text() for r in range(ranks)]


def test_run_under_mpirun_delivers_what_the_binary_delivers(data, tmp_path):
    job = ["run", "--data", data, "--batch-size", "24", "--epochs", "2", "--verify"]
    ok(run(MPIRUN + ["-np", "2", SCRIPT, *job, "--dump", tmp_path / "script"]))
    ok(run(MPIRUN + ["-np", "2", BIN, *job, "--dump", tmp_path / "native"]))
    got, want = dumps(tmp_path / "script", 2), dumps(tmp_path / "native", 2)
    assert all(want) and got == want
    # Both ranks delivered (a world of 2, not two jobs of one).
    assert len(want[0].splitlines()) == 2 * (3000 // 24)


def test_launch_starts_the_console_script_as_its_ranks(data, tmp_path):
    job = ["run", "--data", data, "--batch-size", "24", "--verify"]
    script = run([SCRIPT, "launch", "-n", "2", "--", *job, "--dump", tmp_path / "script"])
    ok(script)
    ok(run([BIN, "launch", "-n", "2", "--", *job, "--dump", tmp_path / "native"]))
    got, want = dumps(tmp_path / "script", 2), dumps(tmp_path / "native", 2)
    assert all(want) and got == want


@pytest.mark.parametrize("args", [
    ["run", "--data", "/nonexistent/meshfeed-data", "--batch-size", "4"],
    ["run", "--batch-size", "4"],
    ["gen", "--format", "npy", "--samples", "4", "--field", "x:q9", "--out", "/nonexistent/out"],
    ["no-such-command"],
])
def test_errors_exit_codes_and_messages_are_the_binarys(args):
    script, native = both(args)
    assert native.returncode != 0, native
    assert (script.returncode, script.stdout, script.stderr) == (native.returncode, native.stdout, native.stderr)
    assert "Traceback" not in script.stderr


def test_a_closed_stdout_ends_the_output_not_the_command(data):
    for program in (SCRIPT, BIN):
        child = subprocess.Popen([str(program), "inspect", "--data", str(data)], env=ENV, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        assert child.stdout is not None
        child.stdout.close()  # `| head -0`
        _, err = child.communicate(timeout=TIMEOUT)
        assert child.returncode == 0, (program, err)
        assert "panicked" not in err and "Broken pipe" not in err and "Traceback" not in err, err


def catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for `sig` (/proc/PID/status, SigCgt)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
    return bool(mask >> (sig - 1) & 1)


def children(pid: int) -> list:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def stopped_by(program, sig, data, launch=()):
    # A slow job (many epochs of 20 ms steps): it ends only when stopped.
    child = subprocess.Popen([str(program), *launch, "run", "--data", str(data), "--batch-size", "24", "--epochs",
                              "1000", "--compute-ms", "20"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    # Running once the command (and under `launch` each rank) handles SIGTERM (Python itself
    # never does), then a moment in.
    deadline = time.monotonic() + 60

    def started():
        ranks = children(child.pid) if launch else []
        return catches(child.pid, signal.SIGTERM) and len(ranks) == (2 if launch else 0) and all(
            catches(r, signal.SIGTERM) for r in ranks)
    while not started():
        assert child.poll() is None and time.monotonic() < deadline, f"{program} never started its job"
        time.sleep(0.05)
    time.sleep(1.0)
    child.send_signal(sig)
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail(f"{program} did not stop within 60 s of {sig!r}")
    return child.returncode, err


@pytest.mark.parametrize("launch", [(), ("launch", "-n", "2", "--")], ids=["run", "launch"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_stops_a_run_as_it_stops_the_binary(data, sig, launch):
    native_code, native_err = stopped_by(BIN, sig, data, launch)
    assert native_code == 75, native_err
    code, err = stopped_by(SCRIPT, sig, data, launch)
    assert code == native_code, err
    assert f"stopped by {sig.name}" in err and f"stopped by {sig.name}" in native_err, err
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err


def test_output_is_the_binarys(data):
    script, native = both(["inspect", "--data", data])
    ok(native)
    assert native.stdout and (script.returncode, script.stdout, script.stderr) == (0, native.stdout, native.stderr)


IN_PROCESS = """
import sys, threading, time
from meshfeed import _meshfeed
ticks = 0
def tick():
    global ticks
    while not done:
        ticks += 1
        time.sleep(0.01)
done = False
t = threading.Thread(target=tick)
t.start()
start = time.monotonic()
code = _meshfeed.cli_main(["meshfeed", *sys.argv[1:]], [sys.executable, "-m", "meshfeed"])
took = time.monotonic() - start
done = True
t.join()
print(f"code={code} took={took:.2f} ticks={ticks}")
"""


def test_the_command_runs_with_the_gil_released(data):
    # A Python thread keeps running while the command does (a 1.5 s job of 10 ms steps).
    r = ok(run([sys.executable, "-c", IN_PROCESS, "run", "--data", data, "--batch-size", "24", "--epochs", "1",
                "--compute-ms", "12"]))
    m = re.search(r"code=(\d+) took=([\d.]+) ticks=(\d+)", r.stdout)
    assert m and m.group(1) == "0", r.stdout + r.stderr
    took, ticks = float(m.group(2)), int(m.group(3))
    assert took > 1.0 and ticks > took * 100 / 4, r.stdout


def test_mpi_initialised_by_mpi4py_first_is_adopted(data, tmp_path):
    # A program that imported mpi4py (which initialises MPI) and then runs the command line.
    # One write per line: the two ranks' output shares mpirun's stdout, and an unbuffered
    # print of several pieces can be cut by the other rank's lines.
    prog = "from mpi4py import MPI\n" + IN_PROCESS + "sys.stdout.write(f'world {MPI.COMM_WORLD.Get_size()}\\n')\n"
    job = ["run", "--data", data, "--batch-size", "24", "--verify"]
    r = ok(run(MPIRUN + ["-np", "2", sys.executable, "-c", prog, *job, "--dump", tmp_path / "mpi4py"]))
    assert r.stdout.count("code=0") == 2 and r.stdout.count("world 2") == 2, r.stdout
    ok(run(MPIRUN + ["-np", "2", BIN, *job, "--dump", tmp_path / "native"]))
    assert dumps(tmp_path / "mpi4py", 2) == dumps(tmp_path / "native", 2)
