"""Training loops that misuse the loader, under real mpirun: a loader used across a fork, a
rank that repositions alone, ranks that set different epochs, a Ctrl-C or SIGTERM while a
rank waits for an absent peer, positions that would wrap, and the Python API's edges
(numpy integers, strings for lists, bytes paths, edited states, to_torch's sharing). Each
ends in a clear error on the ranks concerned — or the documented behaviour — within a
bound; none hangs.

Run by tests/ci.sh after `pip install ./python` into the test venv: `pytest python/tests`.
"""

import json
import re
import subprocess
import sys
import time

import pytest

from test_loader import BIN, ENV, MPIRUN, ok, run

# Every job here ends by itself well within this; a job still running at it is a hang,
# and fails the test (subprocess.TimeoutExpired).
BOUND = 60


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    d = tmp_path_factory.mktemp("misuse") / "npy"
    ok(run([BIN, "gen", "--format", "npy", "--samples", "600", "--files", "3", "--out", d,
            "--field", "x:f32:4x6", "--field", "y:i64"]))
    return d


def mpirun(np_, script, *args, keep=False):
    """`python -c script args` on np_ ranks; with `keep`, mpirun lets the other ranks run
    on when one exits non-zero (srun's default), so that each reports for itself."""
    flags = ["--mca", "orte_abort_on_non_zero_status", "0"] if keep else []
    cmd = MPIRUN + flags + ["-np", str(np_), sys.executable, "-c", script] + [str(a) for a in args]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=BOUND)


# Each rank reports to its own file (`say`): ranks print at once, and their lines can run
# together on mpirun's stdout.
PREAMBLE = (
    "import json, os, sys, time, meshfeed\n"
    "rank = int(os.environ['OMPI_COMM_WORLD_RANK'])\n"
    "data, prefetch = sys.argv[1], int(sys.argv[2])\n"
    "def say(text):\n"
    "    with open(os.path.join(sys.argv[3], f'said-{rank}.txt'), 'a') as f:\n"
    "        f.write(text + '\\n')\n"
    "loader = meshfeed.Loader(data, 12, seed=4, window_bytes='2K', prefetch=prefetch)\n"
)


def said(out, np_):
    """Each rank's last report (`say`), by rank."""
    return {k: (out / f"said-{k}.txt").read_text().splitlines()[-1] for k in range(np_)}


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_loader_cannot_cross_a_fork_and_the_parent_is_unaffected(npy, tmp_path, prefetch):
    # The child of os.fork, a multiprocessing child (fork start method) and a PyTorch
    # DataLoader worker iterating the loader each get a MisuseError; the parent then
    # delivers its whole epoch, exactly once over the ranks. The loader's telemetry is the
    # parent's alone: a child that exits does not write the parent's records again.
    script = PREAMBLE + (
        "import multiprocessing as mp, torch\n"
        "loader.close()\n"
        "loader = meshfeed.Loader(data, 12, seed=4, window_bytes='2K', prefetch=prefetch,\n"
        "                         telemetry=os.path.join(sys.argv[3], 'telemetry'))\n"
        "it = iter(loader)\n"
        "ids = [int(i) for _ in range(3) for i in next(it).ids]  # window records buffered\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        next(it)\n"
        "        os._exit(1)\n"
        "    except meshfeed.MisuseError as e:\n"
        "        print(f'fork: {e}', flush=True)\n"
        "    sys.exit(0)  # atexit runs in the child: it must leave the parent's loader alone\n"
        "assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0\n"
        "def child(q):\n"
        "    try:\n"
        "        loader.set_epoch(0)\n"
        "        q.put('no error')\n"
        "    except meshfeed.MisuseError as e:\n"
        "        q.put(f'multiprocessing: {e}')\n"
        "q = mp.get_context('fork').Queue()\n"
        "p = mp.get_context('fork').Process(target=child, args=(q,))\n"
        "p.start(); print(q.get(timeout=30), flush=True); p.join()\n"
        "class Wrapped(torch.utils.data.IterableDataset):\n"
        "    def __iter__(self):\n"
        "        return (b['x'] for b in loader)\n"
        "try:\n"
        "    next(iter(torch.utils.data.DataLoader(Wrapped(), batch_size=None, num_workers=1,\n"
        "                                          multiprocessing_context='fork')))\n"
        "    print('DataLoader: no error', flush=True)\n"
        "except Exception as e:\n"
        "    print(f'DataLoader: {type(e).__name__}: {e}', flush=True)\n"
        "for b in it:\n"
        "    ids += list(b.ids)\n"
        "with open(os.path.join(sys.argv[3], f'ids-{rank}.json'), 'w') as f:\n"
        "    json.dump([int(i) for i in ids], f)\n"
    )
    for np_ in (2, 3):
        r = ok(mpirun(np_, script, npy, prefetch, tmp_path))
        out = r.stdout + r.stderr
        report = run([BIN, "report", "--json", tmp_path / "telemetry"])
        assert report.returncode == 0 and '"epoch":0,"ranks":%d' % np_ in report.stdout, report.stdout + report.stderr
        # (Ranks print at once: their lines can run together.)
        for who in ("fork", "multiprocessing"):
            assert r.stdout.count(f"{who}: this loader was made in process ") == np_, f"{who}\n{out}"
        # (PyTorch re-raises the worker's exception in the parent, with its traceback.)
        assert r.stdout.count("DataLoader: MisuseError: Caught MisuseError in DataLoader worker") == np_, out
        assert r.stdout.count("a loader cannot cross a fork") == 3 * np_, out
        assert "no error" not in r.stdout, out
        delivered = [i for k in range(np_) for i in json.loads((tmp_path / f"ids-{k}.json").read_text())]
        assert sorted(delivered) == list(range(600)), f"{len(delivered)} ids\n{out}"


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_rank_that_repositions_alone_fails_and_so_do_the_others(npy, tmp_path, prefetch):
    # Rank 0 breaks out of the epoch and sets the next one while the others read on: every
    # rank ends with a MisuseError naming what happened (rank 0 used to wait forever).
    script = PREAMBLE + (
        "try:\n"
        "    for step, b in enumerate(loader):\n"
        "        if rank == 0 and step == 3:\n"
        "            break\n"
        "    loader.set_epoch(1)\n"
        "    for b in loader:\n"
        "        pass\n"
        "    say('no error')\n"
        "except meshfeed.MisuseError as e:\n"
        "    say(f'MisuseError: {e}')\n"
    )
    for np_ in (2, 3):
        out = tmp_path / str(np_)
        out.mkdir()
        r = ok(mpirun(np_, script, npy, prefetch, out))
        lines = said(out, np_)
        assert all(line.startswith("MisuseError: ") for line in lines.values()), (lines, r.stderr)
        # The next window's position agreement: rank 0 restarted at epoch 1; the others
        # read on, past the window their producers were stopped at (prefetch 2), or into
        # their next window (prefetch 0).
        others = "rank 1" if np_ == 2 else "ranks 1-2"
        reading = "read on past where rank 0 repositioned" if prefetch else "epoch 0 step 4"
        for k in range(np_):
            assert f"ranks disagree on the loader's position: epoch 1 step 0 (rank 0) vs {reading} ({others})" \
                in lines[k], lines


@pytest.mark.parametrize("prefetch", [0, 2])
def test_ranks_that_set_different_epochs_are_told_so(npy, tmp_path, prefetch):
    script = PREAMBLE + (
        "try:\n"
        "    loader.set_epoch(rank + 1)\n"
        "    next(iter(loader))\n"
        "    say('no error')\n"
        "except meshfeed.MisuseError as e:\n"
        "    say(str(e))\n"
    )
    r = ok(mpirun(3, script, npy, prefetch, tmp_path))
    for k, line in said(tmp_path, 3).items():
        assert line.startswith("rank 1: ranks disagree on the loader's position: epoch 1 step 0 (rank 0) vs epoch 2 "
                               "step 0 (rank 1) vs epoch 3 step 0 (rank 2)"), (k, line, r.stderr)


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_reaches_a_loop_waiting_for_an_absent_peer(npy, tmp_path, prefetch, sig):
    # Rank 1 does not come to the first window for a long time; rank 0, waiting in next(),
    # gets SIGINT (KeyboardInterrupt) or SIGTERM (its own handler raises SystemExit) and
    # raises within a second. The loader then refuses to go on; the process exits, and
    # mpirun ends the job (rank 1's sleep is never waited for). Each signal runs on 2 ranks
    # with one prefetch and on 3 with the other.
    script = PREAMBLE + (
        "import signal, threading\n"
        "def on_term(signum, frame):\n"
        "    raise SystemExit(143)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "if rank == 1:\n"
        "    time.sleep(600)\n"
        "sent = []\n"
        "def fire():\n"
        "    sent.append(time.monotonic())\n"
        f"    os.kill(os.getpid(), signal.{sig})\n"
        "threading.Timer(1.5, fire).start()\n"
        "try:\n"
        "    for b in loader:\n"
        "        pass\n"
        "except (KeyboardInterrupt, SystemExit) as e:\n"
        "    print(f'raised {type(e).__name__} after {time.monotonic() - sent[0]:.3f} s', flush=True)\n"
        "try:\n"
        "    next(iter(loader))\n"
        "except meshfeed.MisuseError as e:\n"
        "    print(f'then: {e}', flush=True)\n"
        "sys.exit(3)\n"
    )
    for np_ in (3 if (prefetch == 2) != (sig == "SIGTERM") else 2,):
        start = time.monotonic()
        r = mpirun(np_, script, npy, prefetch, tmp_path)
        took = time.monotonic() - start
        out = r.stdout + r.stderr
        m = re.search(r"raised (\w+) after ([\d.]+) s", r.stdout)
        assert m, out
        assert m.group(1) == ("KeyboardInterrupt" if sig == "SIGINT" else "SystemExit"), out
        assert float(m.group(2)) <= 1.0, out
        assert "then: the loader failed earlier and cannot continue: interrupted while waiting" in r.stdout, out
        assert r.returncode != 0 and took < BOUND / 2, (r.returncode, took, out)


def test_positions_never_wrap(npy, tmp_path):
    script = (
        "import json, sys, numpy as np, meshfeed\n"
        "loader = meshfeed.Loader(sys.argv[1], 12, seed=4)\n"
        "for epoch in (2**64 - 1, 2**53, 2**64, 2**80, -1):\n"
        "    try:\n"
        "        loader.set_epoch(epoch)\n"
        "        print('accepted', epoch)\n"
        "    except meshfeed.ConfigError as e:\n"
        "        print('refused', e)\n"
        "state = loader.state_dict()\n"
        "for epoch in (2**64 - 1, 2**64, 2**53):\n"
        "    try:\n"
        "        loader.load_state_dict(dict(state, epoch=epoch))\n"
        "        print('accepted state', epoch)\n"
        "    except meshfeed.ConfigError as e:\n"
        "        print('refused state', e)\n"
        "loader.set_epoch(np.int64(2**53 - 1))\n"
        "print('last', loader.state_dict()['epoch'])\n"
        "try:\n"
        "    loader.set_epoch(1.0)\n"
        "except meshfeed.ConfigError as e:\n"
        "    print('float', e)\n"
    )
    r = ok(run(MPIRUN + ["-np", 1, sys.executable, "-c", script, npy]))
    out = r.stdout
    assert "accepted" not in out.replace("accepted state", ""), out
    for shown in ("18446744073709551615", "9007199254740992", "18446744073709551616",
                  "1208925819614629174706176", "-1"):
        assert f"refused invalid configuration: epoch {shown} is out of range: epochs run from 0 to " \
               f"9007199254740991" in out, out
    assert "refused state invalid configuration: epoch 18446744073709551615 is out of range" in out, out
    assert "refused state invalid configuration: epoch 18446744073709551616 is out of range" in out, out
    assert "refused state invalid configuration: epoch 9007199254740992 is out of range" in out, out
    assert "last 9007199254740991" in out, out
    assert "float epoch=1.0: expected an integer, not float" in out, out


def test_python_api_edges(npy, tmp_path):
    # numpy integers where ints go; a string where a list goes is comma-separated names,
    # never letters; bytes are a path; a state whose seed contradicts its fingerprint is
    # refused whole; to_torch shares the fields' buffers (documented) but not the ids.
    script = (
        "import json, os, sys, numpy as np, torch, meshfeed\n"
        "data = sys.argv[1]\n"
        "l = meshfeed.Loader(os.fsencode(data), np.int64(12), seed=np.uint32(4), prefetch=np.int8(1),\n"
        "                    window_bytes=np.int64(4096), mesh='dp=1', mesh_order='dp')\n"
        "ref = meshfeed.Loader([data], 12, seed=4, window_bytes=4096)\n"
        "a, b = next(iter(l)), next(iter(ref))\n"
        "assert list(a.ids) == list(b.ids) and l.mesh_shape == {'dp': 1}, (a.ids, b.ids)\n"
        "print('numpy ints ok')\n"
        "for bad in [dict(mesh_order=['d', 'p']), dict(mesh_order=5), dict(shard='x=dp'), dict(batch_size=True),\n"
        "            dict(data=b'/nonexistent/data')]:\n"
        "    kw = dict(data=data, batch_size=12, mesh='dp=1'); kw.update(bad)\n"
        "    try:\n"
        "        meshfeed.Loader(**kw)\n"
        "        print('accepted', bad)\n"
        "    except (meshfeed.ConfigError, meshfeed.DataError) as e:\n"
        "        print('refused', list(bad)[0], e)\n"
        "state = ref.state_dict()\n"
        "step = state['step']\n"
        "try:\n"
        "    ref.load_state_dict(dict(state, seed=99, step=0))\n"
        "    print('accepted contradicting seed')\n"
        "except meshfeed.ConfigError as e:\n"
        "    print('refused seed', e)\n"
        "print('position kept', ref.state_dict()['step'] == step)\n"
        "t = b.to_torch(device='cpu')\n"
        "t['ids'].fill_(0)\n"
        "print('ids untouched', b.ids.tolist() != [0] * 12 and b.ids.min() >= 0)\n"
        "before = float(b['y'][0])\n"
        "t['y'][0] = -7\n"
        "print('fields shared', int(b['y'][0]) == -7, t['y'].data_ptr() == b['y'].ctypes.data)\n"
        "fifo = os.path.join(sys.argv[2], 'job.toml')\n"
        "os.mkfifo(fifo)\n"
        "try:\n"
        "    meshfeed.Loader.from_config(fifo)\n"
        "except meshfeed.ConfigError as e:\n"
        "    print('job file', e)\n"
    )
    r = ok(run(MPIRUN + ["-np", 1, sys.executable, "-c", script, npy, tmp_path]))
    out = r.stdout
    assert "numpy ints ok" in out and "accepted" not in out, out + r.stderr
    assert "refused mesh_order rank 0: invalid configuration: --mesh-order: unknown mesh axis 'd'" in out, out
    assert "refused mesh_order mesh_order=5: expected a list of names or a comma-separated string" in out, out
    assert "refused shard shard='x=dp': expected a mapping" in out, out
    assert "refused batch_size batch_size=True: expected an integer, not a bool" in out, out
    assert "refused data rank 0: /nonexistent/data: No such file or directory (os error 2)" in out, out
    assert "refused seed invalid configuration: cannot resume: the state contradicts itself: seed 99, but its " \
           "fingerprint says seed 4" in out, out
    assert "position kept True" in out, out
    assert "ids untouched True" in out, out
    assert "fields shared True True" in out, out
    # A job file that is a FIFO is refused, not waited on (run would block forever).
    assert f"job file {tmp_path}/job.toml: not a regular file (a FIFO)" in out, out


def test_a_python_rank_that_ends_before_the_rendezvous_does_not_leave_the_others_waiting(npy):
    # Under `meshfeed launch`, rank 1 ends (code 0) before making its loader; rank 0 would
    # wait at the UCX rendezvous for the full timeout (120 s). The launcher stops it.
    script = (
        "import os, sys, meshfeed\n"
        "if os.environ['RANK'] == '1':\n"
        "    sys.exit(0)\n"
        "meshfeed.Loader(sys.argv[1], 12, transport='ucx')\n"
    )
    env = dict(ENV, UCX_NET_DEVICES="lo")
    env.pop("MESHFEED_JOB_TOKEN", None)
    start = time.monotonic()
    r = run([BIN, "launch", "-n", 2, "--grace", 2, "--exe", sys.executable, "--", "-c", script, npy], env=env)
    took = time.monotonic() - start
    assert r.returncode == 1, r.stdout + r.stderr
    assert "rank 1 exited with code 0 before every rank joined the rendezvous" in r.stderr, r.stderr
    assert took < 30, took
