"""The Python package under real mpirun (and the UCX launcher): what a training loop sees
from Python equals what the command line delivers for the same job (`--dump`), states
resume on another rank count, and errors reach every rank as meshfeed.Error.

Run by tests/ci.sh after `pip install ./python` into the test venv: `pytest python/tests`.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "target" / "release" / "meshfeed"
DUMP_JOB = Path(__file__).with_name("dump_job.py")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HDF5_USE_FILE_LOCKING="FALSE")
# A hang is a failure (never a pass): every command is bounded.
TIMEOUT = 180


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], env=kw.pop("env", ENV), capture_output=True, text=True,
                          timeout=TIMEOUT, **kw)


def ok(r):
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


def read_dump(d: Path, np_: int):
    return [[json.loads(line) for line in (d / f"rank-{r}.jsonl").read_text().splitlines()] for r in range(np_)]


def delivered_ids(dump) -> list:
    """Every sample id a dump's ranks received, sorted."""
    return sorted(i for rank in dump for line in rank for i in line["ids"])


def python_job(np_, options, out, epochs, *extra, transport="mpi"):
    args = [sys.executable, DUMP_JOB, json.dumps(options), out, epochs, *extra]
    if transport == "mpi":
        return run(MPIRUN + ["-np", np_] + args)
    env = dict(ENV, UCX_NET_DEVICES="lo")
    env.pop("MESHFEED_JOB_TOKEN", None)
    return run([BIN, "launch", "-n", np_, "--exe", args[0], "--"] + args[1:], env=env)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    base = tmp_path_factory.mktemp("data")
    out = {}
    for name, fmt, fields in [
        ("npy", "npy", ["x:f32:4x6", "y:i64"]),
        ("arrow", "arrow", ["x:f32:4x6", "t:utf8", "y:i64"]),
        # 2 KiB samples: read in place, by the receiving rank (local reads).
        ("large", "npy", ["x:u8:2040", "y:i64"]),
    ]:
        d = base / name
        args = [BIN, "gen", "--format", fmt, "--samples", "600", "--files", "3", "--out", d]
        for f in fields:
            args += ["--field", f]
        ok(run(args))
        out[name] = d
    return out


JOBS = [
    # (name, format, ranks, Loader options beyond data, the CLI's flags for the same job)
    ("dp", "npy", 1, {}, []),
    ("dp", "npy", 2, {}, []),
    ("dp", "npy", 4, {}, []),
    ("var-length", "arrow", 3, {}, []),
    ("local-reads", "large", 3, {}, []),
    ("mesh", "npy", 4, {"mesh": "dp=2,tp=2", "shard": {"x": "dp,tp"}}, ["--mesh", "dp=2,tp=2", "--shard", "x=dp,tp"]),
    # Read strategies: the home ranges streamed in passes, or kept in part and read at random.
    ("passes", "large", 3, {"read_strategy": "passes", "memory_budget": "400K"},
     ["--read-strategy", "passes", "--memory-budget", "400K"]),
    ("random", "large", 2, {"read_strategy": "random", "memory_budget": 400 * 1024, "read_queue_depth": 4},
     ["--read-strategy", "random", "--memory-budget", "400K", "--read-queue-depth", "4"]),
    # Tuned from windows of one step and no producer thread, against the untuned command.
    ("tuned", "npy", 3, {"tune": "auto", "window_bytes": "1K", "prefetch": 0}, []),
]


@pytest.mark.parametrize("name,fmt,np_,options,flags", JOBS, ids=[f"{j[0]}-{j[1]}-np{j[2]}" for j in JOBS])
def test_batches_from_python_equal_the_command_lines(datasets, tmp_path, name, fmt, np_, options, flags):
    data = datasets[fmt]
    cli = tmp_path / "cli"
    ok(run(MPIRUN + ["-np", np_, BIN, "run", "--data", data, "--batch-size", "12", "--epochs", "2", "--seed", "5",
                     "--window-bytes", "2K", "--dump", cli] + flags))
    py = tmp_path / "py"
    ok(python_job(np_, {"data": [str(data)], "batch_size": 12, "seed": 5, "window_bytes": "2K", **options}, py, 2))
    expected = read_dump(cli, np_)
    assert sum(len(r) for r in expected) == 2 * 50 * np_
    assert read_dump(py, np_) == expected


def test_a_training_job_reads_from_a_shared_feeder_exactly_as_from_the_files(datasets, tmp_path):
    """`meshfeed serve` holds the Arrow dataset (variable-length strings among its fields);
    a Python job given its rendezvous file as data gets the batches of the command line on
    the files, value for value."""
    rendezvous = tmp_path / "arrow.feeder.json"
    serve = subprocess.Popen([str(c) for c in [BIN, "serve", "--data", datasets["arrow"], "--rendezvous", rendezvous]],
                             env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not rendezvous.exists():
            assert serve.poll() is None, serve.communicate()[1]
            assert time.monotonic() < deadline, "meshfeed serve did not start"
            time.sleep(0.02)
        cli = tmp_path / "cli"
        ok(run(MPIRUN + ["-np", 2, BIN, "run", "--data", datasets["arrow"], "--batch-size", "12", "--epochs", "2",
                         "--seed", "5", "--dump", cli]))
        py = tmp_path / "py"
        ok(python_job(2, {"data": [str(rendezvous)], "batch_size": 12, "seed": 5}, py, 2))
        expected = read_dump(cli, 2)
        assert sum(len(r) for r in expected) == 2 * 50 * 2
        assert read_dump(py, 2) == expected
        # The feeder as `source`, by its URL, the token in the environment.
        feeder = json.loads(rendezvous.read_text())
        by_url = tmp_path / "by-url"
        url = f"meshfeed://{feeder['address']}/{feeder['name']}"
        args = [sys.executable, DUMP_JOB, json.dumps({"source": url, "batch_size": 12, "seed": 5}), by_url, 2]
        env = dict(ENV, MESHFEED_FEEDER_TOKEN=feeder["token"])
        ok(run(MPIRUN + ["-np", 2, "-x", "MESHFEED_FEEDER_TOKEN"] + args, env=env))
        assert read_dump(by_url, 2) == expected
        # A job of a sweep's shared order (blocks of 24 positions): the order of the
        # command line's on the files, not the job's own.
        cli_shared, py_shared = tmp_path / "cli-shared", tmp_path / "py-shared"
        ok(run(MPIRUN + ["-np", 2, BIN, "run", "--data", datasets["arrow"], "--batch-size", "12", "--epochs", "2",
                         "--seed", "5", "--shared-order", "7,block=24", "--dump", cli_shared]))
        job = {"data": [str(rendezvous)], "batch_size": 12, "seed": 5, "shared_order": "7,block=24"}
        ok(python_job(2, job, py_shared, 2))
        shared = read_dump(cli_shared, 2)
        assert read_dump(py_shared, 2) == shared
        assert shared != expected and delivered_ids(shared) == delivered_ids(expected)
    finally:
        serve.kill()
        serve.wait()


def json_objects(text: str) -> list:
    """The JSON objects ranks printed, one each: ranks print at once, and their lines can
    run together."""
    decoder, objects, i = json.JSONDecoder(), [], 0
    while (i := text.find("{", i)) != -1:
        obj, i = decoder.raw_decode(text, i)
        objects.append(obj)
    return objects


def test_the_read_plan_is_visible_from_python(datasets, tmp_path):
    # What the loader chose and why, on every rank: passes under a small budget, the data
    # kept where it fits, and a spill directory for what does not.
    script = (
        "import json, sys, meshfeed\n"
        "l = meshfeed.Loader(sys.argv[1], 12, **json.loads(sys.argv[2]))\n"
        "assert 'read' not in l.layout and l.layout == json.loads(json.dumps(l.layout)), l.layout\n"
        "assert l.layout['mesh'] == [['dp', 2]] and l.mesh_shape == {'dp': 2}, l.layout\n"
        "print(json.dumps({'rank': l.rank, **l.read_plan}))\n"
    )
    spill = tmp_path / "spill"
    spill.mkdir()
    for options, strategy in [
        ({"read_strategy": "passes", "memory_budget": "300K"}, "passes"),
        ({"memory_budget": "8M"}, "resident"),
        ({"memory_budget": "300K", "spill_dir": str(spill)}, "random"),
    ]:
        r = ok(run(MPIRUN + ["-np", 2, sys.executable, "-c", script, datasets["large"], json.dumps(options)]))
        plans = json_objects(r.stdout)
        assert sorted(p["rank"] for p in plans) == [0, 1]
        for p in plans:
            assert p["strategy"] == strategy, p
            assert "budget" in p["reason"], p
            if strategy == "passes":
                assert p["passes"] >= 2, p
            if strategy == "random":
                assert p["spill"] and 0 < p["resident_rows"] < 300, p
    # A spill directory that does not exist is a clear error on every rank.
    r = run(MPIRUN + ["-np", 2, sys.executable, "-c", script, datasets["large"],
                      json.dumps({"memory_budget": "300K", "spill_dir": str(tmp_path / "none")})])
    assert r.returncode != 0
    assert "spill directory" in r.stderr and "none" in r.stderr, r.stderr


def test_the_ucx_launcher_delivers_the_same_batches(datasets, tmp_path):
    data = datasets["npy"]
    cli = tmp_path / "cli"
    ok(run(MPIRUN + ["-np", 2, BIN, "run", "--data", data, "--batch-size", "12", "--epochs", "1", "--seed", "5",
                     "--dump", cli]))
    py = tmp_path / "py"
    ok(python_job(2, {"data": [str(data)], "batch_size": 12, "seed": 5, "transport": "ucx"}, py, 1, transport="ucx"))
    assert read_dump(py, 2) == read_dump(cli, 2)
    # The default transport ("auto") takes the launcher's: the 2-rank stream again, never
    # two 1-rank loaders each delivering every batch.
    default = tmp_path / "default"
    ok(python_job(2, {"data": [str(data)], "batch_size": 12, "seed": 5}, default, 1, transport="ucx"))
    assert read_dump(default, 2) == read_dump(cli, 2)


def global_batches(dump):
    """(epoch, step) -> the global batch's ids (data parallel: ranks hold consecutive rows)."""
    out = {}
    for rank_lines in dump:
        for line in rank_lines:
            out.setdefault((line["epoch"], line["step"]), []).extend(line["ids"])
    return out


def test_state_dict_resumes_exactly_on_another_rank_count(datasets, tmp_path):
    data = datasets["npy"]
    options = {"data": [str(data)], "batch_size": 12, "seed": 9, "window_bytes": "2K"}
    whole = tmp_path / "whole"
    ok(python_job(2, options, whole, 2))
    first, state = tmp_path / "first", tmp_path / "state.json"
    ok(python_job(2, options, first, 2, 70, state))  # stops at epoch 1, step 20
    saved = json.loads(state.read_text())
    assert (saved["epoch"], saved["step"]) == (1, 20)
    rest = tmp_path / "rest"
    ok(python_job(3, options, rest, 2, state))
    combined = global_batches(read_dump(first, 2))
    resumed = global_batches(read_dump(rest, 3))
    assert min(resumed) == (1, 20) and not set(resumed) & set(combined)
    combined.update(resumed)
    assert combined == global_batches(read_dump(whole, 2))


def test_an_error_reaches_every_rank_as_meshfeed_error(datasets, tmp_path):
    script = (
        "import meshfeed, os\n"
        "rank = int(os.environ['OMPI_COMM_WORLD_RANK'])\n"
        "try:\n"
        f"    meshfeed.Loader([{str(datasets['npy'])!r}], batch_size=12, seed=rank)\n"
        "except meshfeed.Error as e:\n"
        "    print(f'meshfeed.Error: {e}', flush=True)\n"
    )
    r = ok(run(MPIRUN + ["-np", 3, sys.executable, "-c", script]))
    # (Ranks print at once: their lines can run together.)
    assert r.stdout.count("meshfeed.Error: rank 1: ranks disagree on seed:") == 3, r.stdout + r.stderr
    # Every rank raises the same subclass, naming the rank the failure came from.
    script = (
        "import meshfeed, os, sys\n"
        "rank = int(os.environ['OMPI_COMM_WORLD_RANK'])\n"
        f"data = [{str(datasets['npy'])!r}] if rank != 1 else ['/nonexistent/data']\n"
        "try:\n"
        "    meshfeed.Loader(data, batch_size=12)\n"
        "except meshfeed.DataError as e:\n"
        "    print(f'{type(e).__module__}.{type(e).__name__} from rank {e.rank}', flush=True)\n"
        "try:\n"
        f"    meshfeed.Loader([{str(datasets['npy'])!r}], batch_size=12, mesh='dp=5')\n"
        "except meshfeed.ConfigError as e:\n"
        "    print(f'{type(e).__name__}: {e}', flush=True)\n"
        "try:\n"
        f"    meshfeed.Loader([{str(datasets['npy'])!r}], batch_size=12, exchange_costs='speed=3')\n"
        "except meshfeed.ConfigError as e:\n"
        "    print(f'costs {type(e).__name__}: {e}', flush=True)\n"
        f"l = meshfeed.Loader([{str(datasets['npy'])!r}], batch_size=12, exchange_costs='inter=1e8')\n"
        "print('costs ok', sum(1 for _ in l), flush=True)\n"
    )
    r = ok(run(MPIRUN + ["-np", 3, sys.executable, "-c", script]))
    assert r.stdout.count("meshfeed.DataError from rank 1") == 3, r.stdout + r.stderr
    assert r.stdout.count("ConfigError: rank 0: invalid configuration: mesh dp=5 has 5 devices") == 3, r.stdout
    assert r.stdout.count("costs ConfigError:") == 3 and "unknown key 'speed'" in r.stdout, r.stdout
    assert r.stdout.count("costs ok") == 3, r.stdout
    # Uncaught, it ends every rank with exit code 1 and the message. mpirun is told not to
    # kill the other ranks when the first one exits non-zero (it could before they print),
    # so each rank reports its own exit code.
    keep = ["--mca", "orte_abort_on_non_zero_status", "0"]
    uncaught = (f"{sys.executable} -c \"import meshfeed; meshfeed.Loader(['/nonexistent/data'], batch_size=4)\""
                "; echo exit=$?")
    r = ok(run(MPIRUN + keep + ["-np", 2, "sh", "-c", uncaught]))
    assert r.stdout.count("exit=1") == 2, r.stdout + r.stderr
    assert r.stderr.count("/nonexistent/data: No such file or directory (os error 2)") == 2, r.stderr


def test_batches_are_read_only_views_that_outlive_the_loader(datasets):
    script = (
        "import meshfeed, numpy as np\n"
        f"l = meshfeed.Loader([{str(datasets['npy'])!r}], batch_size=12, seed=1)\n"
        "b = next(iter(l))\n"
        "x = b['x']\n"
        "assert x.shape == (12, 4, 6) and x.dtype == np.float32 and not x.flags.writeable\n"
        "try:\n"
        "    x[0, 0, 0] = 1\n"
        "    raise SystemExit('writable')\n"
        "except ValueError:\n"
        "    pass\n"
        "assert sorted(b) == ['x', 'y'] and b.ids.dtype == np.int64 and len(b.ids) == 12\n"
        "assert len(l) == 50 and (b.epoch, b.step) == (0, 0)\n"
        "l.close(); del l, b\n"
        "assert float(x[0, 0, 0]) == float(x[0, 0, 0])\n"
        "print('ok', x.sum())\n"
    )
    r = ok(run(MPIRUN + ["-np", 1, sys.executable, "-c", script]))
    assert r.stdout.startswith("ok"), r.stdout


def test_mpi_initialised_by_mpi4py_is_adopted_and_left_to_it(datasets):
    # mpi4py initialises MPI at import (MPI_THREAD_MULTIPLE); the loader adopts it, runs its
    # collectives on its own communicator between the program's own, and leaves MPI to
    # mpi4py, which finalises it at exit.
    script = (
        "from mpi4py import MPI\n"
        "import meshfeed\n"
        "comm = MPI.COMM_WORLD\n"
        f"loader = meshfeed.Loader([{str(datasets['npy'])!r}], batch_size=12, seed=2, window_bytes='2K')\n"
        "steps = 0\n"
        "for batch in loader:\n"
        "    ids = [i for part in comm.allgather(batch.ids.tolist()) for i in part]\n"
        "    assert len(ids) == len(set(ids)) == 12, ids\n"
        "    steps += 1\n"
        "assert steps == len(loader) == 50\n"
        "loader.close()\n"
        "assert not MPI.Is_finalized()\n"
        "comm.Barrier()\n"
        "print(f'ok {comm.rank}', flush=True)\n"
    )
    for np_ in (2, 3):
        r = ok(run(MPIRUN + ["-np", np_, sys.executable, "-c", script]))
        # (Ranks print at once: their lines can run together.)
        assert sorted(re.findall(r"ok (\d+)", r.stdout)) == [str(k) for k in range(np_)], r.stdout + r.stderr


def test_a_rank_that_leaves_with_an_exception_does_not_leave_the_others_waiting(datasets):
    # Rank 1 fails in its own code after the first batch while rank 0 goes on into the
    # next window's collectives. mpirun is told not to end the job when a rank exits
    # non-zero (srun's default): rank 1's loader, closed at exit, tells rank 0, which
    # raises instead of waiting for it.
    script = (
        "import meshfeed, os\n"
        "rank = int(os.environ['OMPI_COMM_WORLD_RANK'])\n"
        f"loader = meshfeed.Loader([{str(datasets['npy'])!r}], batch_size=12, seed=3, window_bytes='2K')\n"
        "try:\n"
        "    for step, batch in enumerate(loader):\n"
        "        if rank == 1 and step == 1:\n"
        "            raise RuntimeError('boom on rank 1')\n"
        "except meshfeed.MisuseError as e:\n"
        "    print(f'rank {rank}: {type(e).__name__}: {e}', flush=True)\n"
    )
    keep = ["--mca", "orte_abort_on_non_zero_status", "0"]
    r = run(MPIRUN + keep + ["-np", 2, sys.executable, "-c", script])
    assert "RuntimeError: boom on rank 1" in r.stderr, r.stderr
    assert "rank 0: MisuseError: rank 1 closed its loader while this rank still reads from it" \
        in r.stdout, r.stdout + r.stderr


def test_lists_of_numbers_arrive_as_values_and_offsets(tmp_path):
    """Arrow List<int32> (token ids, some rows empty) reach Python as (values, offsets):
    row i's elements are values[offsets[i]:offsets[i + 1]], in numpy and in torch."""
    import pyarrow as pa

    d = tmp_path / "lists"
    d.mkdir()
    n = 48
    table = pa.table({"tokens": pa.array([list(range(i, i + i % 5)) for i in range(n)], pa.list_(pa.int32())),
                      "y": pa.array(range(n), pa.int64())})
    with pa.OSFile(str(d / "data.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for b in table.to_batches(max_chunksize=7):
            w.write_batch(b)
    script = (
        "import meshfeed, numpy as np, torch\n"
        f"l = meshfeed.Loader([{str(d)!r}], batch_size=6, seed=4)\n"
        "seen = 0\n"
        "for b in l:\n"
        "    values, offsets = b['tokens']\n"
        "    assert values.dtype == np.int32 and offsets.dtype == np.int64, (values.dtype, offsets.dtype)\n"
        "    assert len(offsets) == len(b.ids) + 1 and offsets[0] == 0 and offsets[-1] == len(values)\n"
        "    for i, id in enumerate(b.ids):\n"
        "        assert values[offsets[i]:offsets[i + 1]].tolist() == list(range(id, id + id % 5)), id\n"
        "        assert int(b['y'][i]) == id\n"
        "    tv, to = b.to_torch('cpu')['tokens']\n"
        "    assert tv.dtype == torch.int32 and tv.tolist() == values.tolist() and to.tolist() == offsets.tolist()\n"
        "    seen += len(b.ids)\n"
        "assert seen == 24, seen\n"
        "print('ok')\n"
    )
    r = ok(run(MPIRUN + ["-np", 2, sys.executable, "-c", script]))
    assert r.stdout.count("ok") == 2, r.stdout


def test_hub_columns_booleans_and_nulls_reach_python(tmp_path):
    """A pandas Parquet file with text, lists of text and structs beside the fields asked
    for loads with ``fields=``; a boolean arrives as numpy ``bool``, a nullable column
    filled (``fill:-1``) or masked (zeros, and ``score_valid``: 1 present, 0 null)."""
    import pandas as pd

    d = tmp_path / "hub"
    d.mkdir()
    n = 24
    pd.DataFrame({
        "y": pd.Series(range(n), dtype="int64"),
        "flag": pd.Series([i % 3 == 0 for i in range(n)], dtype="bool"),
        "label": pd.Series([None if i % 4 == 1 else i for i in range(n)], dtype="Int64"),
        "score": pd.Series([None if i % 5 == 2 else i / 2 for i in range(n)], dtype="Float32"),
        "text": [f"row {i}" for i in range(n)],
        "tags": [[f"t{i}"] for i in range(n)],
        "meta": [{"a": i} for i in range(n)],
    }).to_parquet(d / "part-0.parquet")
    script = (
        "import meshfeed, numpy as np\n"
        f"l = meshfeed.Loader([{str(d)!r}], batch_size=6, seed=2, fields=['y', 'flag', 'label', 'score'],\n"
        "                    nulls={'label': 'fill:-1', 'score': 'mask'})\n"
        "seen = 0\n"
        "for b in l:\n"
        "    assert list(b) == ['y', 'flag', 'label', 'score', 'score_valid'], list(b)\n"
        "    assert b['flag'].dtype == np.bool_ and b['score_valid'].dtype == np.uint8\n"
        "    for i, id in enumerate(b.ids):\n"
        "        assert int(b['y'][i]) == id and bool(b['flag'][i]) == (id % 3 == 0), id\n"
        "        assert int(b['label'][i]) == (-1 if id % 4 == 1 else id), id\n"
        "        assert int(b['score_valid'][i]) == (id % 5 != 2), id\n"
        "        assert float(b['score'][i]) == (0.0 if id % 5 == 2 else id / 2), id\n"
        "    seen += len(b.ids)\n"
        "assert seen == 12, seen\n"
        "try:\n"
        f"    meshfeed.Loader([{str(d)!r}], batch_size=6, fields=['y', 'label'])\n"
        "except meshfeed.DataError as e:\n"
        "    assert \"column 'label' has nulls in row group 0\" in str(e) and '--nulls label=mask' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('nulls without a policy must be refused')\n"
        "print('ok')\n"
    )
    r = ok(run(MPIRUN + ["-np", 2, sys.executable, "-c", script]))
    assert r.stdout.count("ok") == 2, r.stdout


def test_packed_sequences_arrive_as_inputs_labels_positions_and_document_starts(tmp_path):
    """`pack=` on Parquet token lists: each sample's inputs and labels are the windows of the
    documents concatenated with an end-of-document token (checked against a packing done
    here with numpy), its positions restart at 0 at each sample and at each document start
    inside it (below S; with position_ids=document they count from the document's start
    instead), and cu_seqlens marks where documents start, as int32 for flash-attention."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "corpus"
    d.mkdir()
    docs = [list(range(100 * i, 100 * i + i % 13)) for i in range(60)]
    pq.write_table(pa.table({"ids": pa.array(docs, pa.list_(pa.int32()))}), str(d / "train.parquet"),
                   row_group_size=16)
    script = (
        "import meshfeed, numpy as np, torch\n"
        f"docs = {docs!r}\n"
        "stream = np.concatenate([np.array(x + [-1], np.int32) for x in docs])\n"
        "doc_pos = np.concatenate([np.arange(len(x) + 1) for x in docs])\n"
        "starts = set(np.cumsum([0] + [len(x) + 1 for x in docs]).tolist())\n"
        "S = 8\n"
        "def pos(w):\n"
        "    # 0 at the window's first input and at every document start inside it.\n"
        "    out = []\n"
        "    for p in range(w, w + S):\n"
        "        out.append(0 if p == w or p in starts else out[-1] + 1)\n"
        "    return out\n"
        "n = (len(stream) - 1) // S\n"
        f"l = meshfeed.Loader([{str(d)!r}], batch_size=4, seed=4,\n"
        "                     pack='ids:8,eos=-1,position_ids,cu_seqlens')\n"
        "seen = []\n"
        "for b in l:\n"
        "    assert b['ids'].shape == (2, S) and b['ids'].dtype == np.int32, b['ids'].shape\n"
        "    cu, offsets = b['cu_seqlens']\n"
        "    assert cu.dtype == np.int32\n"
        "    for i, j in enumerate(b.ids.tolist()):\n"
        "        w = j * S\n"
        "        assert b['ids'][i].tolist() == stream[w:w + S].tolist(), j\n"
        "        assert b['labels'][i].tolist() == stream[w + 1:w + S + 1].tolist(), j\n"
        "        assert b['position_ids'][i].tolist() == pos(w), j\n"
        "        assert max(pos(w)) < S\n"
        "        want = [0] + [p - w for p in range(w + 1, w + S) if p in starts] + [S]\n"
        "        assert cu[offsets[i]:offsets[i + 1]].tolist() == want, (j, cu[offsets[i]:offsets[i + 1]], want)\n"
        "    assert b.to_torch('cpu')['labels'].dtype == torch.int32\n"
        "    seen += b.ids.tolist()\n"
        "# position_ids=document: each input's position in its whole document.\n"
        f"l = meshfeed.Loader([{str(d)!r}], batch_size=4, seed=4, pack='ids:8,eos=-1,position_ids=document')\n"
        "long = 0\n"
        "for b in l:\n"
        "    for i, j in enumerate(b.ids.tolist()):\n"
        "        assert b['position_ids'][i].tolist() == doc_pos[j * S:j * S + S].tolist(), j\n"
        "        long += int(b['position_ids'][i].max() >= S)\n"
        "assert long > 0, 'no document runs past S'\n"
        "print(f'ok {len(seen)} {n}', flush=True)\n"
    )
    r = ok(run(MPIRUN + ["-np", 2, sys.executable, "-c", script]))
    # Every rank saw its half of each full batch of the n packed samples.
    counts = re.findall(r"ok (\d+) (\d+)", r.stdout)
    assert len(counts) == 2 and all(int(s) == int(n) // 4 * 2 for s, n in counts), r.stdout


def test_packed_position_ids_equal_megatron_reset_position_ids(tmp_path):
    """Plain position_ids are Megatron-LM's reset_position_ids: for every delivered sample,
    megatron-core's own _get_ltor_masks_and_position_ids on the sample's inputs (eod_token =
    the end-of-document token) gives the same positions, whether meshfeed appends the token
    (eos=0) or the documents already end with it (as Megatron's --append-eod writes them);
    over documents longer than 2·S, empty ones, and ones ending exactly at a sample's end."""
    pytest.importorskip("megatron.core")
    import pyarrow as pa
    import pyarrow.parquet as pq

    S = 8
    lengths = [7, 20, 0, 8, 1, 3, 0, 0, 15, 30, 2, 7, 9, 16, 5, 4, 17, 6]
    docs = [[1 + (101 * i + t) % 997 for t in range(n)] for i, n in enumerate(lengths)]
    # The corpus covers what it claims: a document over 2·S, and one whose end-of-document
    # token is the last input of a sample (the first document: 7 tokens + 0).
    ends = [sum(lengths[:k + 1]) + k + 1 for k in range(len(lengths))]
    assert max(lengths) > 2 * S and any(e % S == 0 for e in ends), ends
    for name, rows, pack in (("appended", docs, f"ids:{S},eos=0,position_ids"),
                             ("present", [x + [0] for x in docs], f"ids:{S},position_ids")):
        d = tmp_path / name
        d.mkdir()
        pq.write_table(pa.table({"ids": pa.array(rows, pa.list_(pa.int32()))}), str(d / "train.parquet"))
        script = (
            "import warnings; warnings.simplefilter('ignore')\n"
            "import meshfeed, numpy as np, torch\n"
            "from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids\n"
            f"l = meshfeed.Loader([{str(d)!r}], batch_size=4, seed=1, pack={pack!r})\n"
            "seen = 0\n"
            "for b in l:\n"
            "    for i, j in enumerate(b.ids.tolist()):\n"
            "        tokens = torch.from_numpy(b['ids'][i].astype(np.int64))\n"
            "        _, _, want = _get_ltor_masks_and_position_ids(tokens, 0, True, False, False, False)\n"
            "        got = b['position_ids'][i].tolist()\n"
            "        assert got == want.tolist(), (j, tokens.tolist(), got, want.tolist())\n"
            f"        assert max(got) < {S}, got\n"
            "        seen += 1\n"
            "print(f'ok {seen}', flush=True)\n"
        )
        r = ok(run(MPIRUN + ["-np", 2, sys.executable, "-c", script]))
        # (L - 1) // S samples, 2 of each batch of 4 on each rank.
        n = (sum(lengths) + len(lengths) - 1) // S
        assert re.findall(r"ok (\d+)", r.stdout) == [str(n // 4 * 2)] * 2, (r.stdout, n)


def test_a_zigzag_split_reaches_python_as_local_chunks(tmp_path):
    """`shard={"ids": "-,zigzag:cp"}` on cp=2: each rank's inputs are chunks i and 3 - i of
    the four chunks of every packed sample; the layout says zigzag, and partition_specs
    refuses what no PartitionSpec can express."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "corpus"
    d.mkdir()
    docs = [list(range(1000 * i, 1000 * i + 5 + i % 7)) for i in range(40)]
    pq.write_table(pa.table({"ids": pa.array(docs, pa.list_(pa.int32()))}), str(d / "train.parquet"))
    script = (
        "import meshfeed, numpy as np\n"
        f"docs = {docs!r}\n"
        "stream = np.concatenate([np.array(x, np.int32) for x in docs])\n"
        f"l = meshfeed.Loader([{str(d)!r}], batch_size=2, seed=1, pack='ids:8', mesh='cp=2',\n"
        "                     shard={'ids': '-,zigzag:cp', 'labels': '-,zigzag:cp'})\n"
        "i = l.layout['device_coords'][l.rank][0]\n"
        "assert [f['zigzag'] for f in l.layout['fields']] == [[False, True]] * 2, l.layout['fields']\n"
        "try:\n"
        "    l.partition_specs()\n"
        "    raise SystemExit('partition_specs accepted a zigzag split')\n"
        "except meshfeed.ConfigError as e:\n"
        "    assert 'split zigzag' in str(e), e\n"
        "n = 0\n"
        "for b in l:\n"
        "    assert b['ids'].shape == (2, 4), b['ids'].shape\n"
        "    for k, j in enumerate(b.ids.tolist()):\n"
        "        s = stream[8 * j:8 * j + 9]\n"
        "        want = np.concatenate([s[2 * i:2 * i + 2], s[2 * (3 - i):2 * (4 - i)]])\n"
        "        assert b['ids'][k].tolist() == want.tolist(), (i, j, b['ids'][k], want)\n"
        "        t = s[1:]\n"
        "        want = np.concatenate([t[2 * i:2 * i + 2], t[2 * (3 - i):2 * (4 - i)]])\n"
        "        assert b['labels'][k].tolist() == want.tolist(), (i, j)\n"
        "    n += 1\n"
        "print('ok', n)\n"
    )
    r = ok(run(MPIRUN + ["-np", 2, sys.executable, "-c", script]))
    assert r.stdout.count("ok") == 2, r.stdout


@pytest.mark.parametrize("sig,transport", [("SIGTERM", "mpi"), ("SIGUSR1", "ucx")])
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step(datasets, tmp_path, sig, transport):
    """A training loop asking loader.stop_requested() after each step: a SIGTERM (or Slurm's
    SIGUSR1) to rank 1 alone stops all three ranks after the same step, a few steps later,
    over MPI and over UCX; the saved state resumes on two ranks and the batches continue
    exactly."""
    data = datasets["npy"]
    options = {"data": [str(data)], "batch_size": 12, "seed": 9, "window_bytes": "2K"}
    whole = tmp_path / "whole"
    ok(python_job(2, options, whole, 2))
    first, state = tmp_path / "first", tmp_path / "state.json"
    r = python_job(3, dict(options, transport=transport), first, 2, "signal", f"1:7:{sig}", state,
                   transport=transport)
    assert r.returncode == 75, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    stops = re.findall(r"rank (\d) stopped at epoch (\d+) step (\d+) \((\d+) batches\)", r.stdout)
    assert sorted(s[0] for s in stops) == ["0", "1", "2"], r.stdout
    assert len({s[1:] for s in stops}) == 1, f"ranks stopped at different steps: {stops}"
    epoch, step, delivered = (int(x) for x in stops[0][1:])
    assert 7 <= delivered <= 7 + 10, f"stopped {delivered - 7} steps after the signal"
    saved = json.loads(state.read_text())
    after = (epoch, step + 1) if step + 1 < 50 else (epoch + 1, 0)  # 600 samples, batches of 12
    assert (saved["epoch"], saved["step"]) == after
    rest = tmp_path / "rest"
    ok(python_job(2, options, rest, 2, state))
    combined = global_batches(read_dump(first, 3))
    resumed = global_batches(read_dump(rest, 2))
    assert min(resumed) == after and not set(resumed) & set(combined)
    combined.update(resumed)
    assert combined == global_batches(read_dump(whole, 2))


def test_stop_requested_chains_to_the_programs_handler_and_request_stop_works_alone(datasets):
    """A handler the program installed before the loader's still runs; without a signal,
    request_stop() on one rank stops every rank after the same step; a loader never asked
    leaves SIGTERM's default alone (the process dies by it)."""
    data = datasets["npy"]
    script = (
        "import meshfeed, os, signal, sys\n"
        "seen = []\n"
        "signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))\n"
        f"l = meshfeed.Loader([{str(data)!r}], batch_size=8, seed=1, window_bytes='1K')\n"
        "stopped = None\n"
        "for i, b in enumerate(l):\n"
        "    if l.rank == 0 and i == 3:\n"
        "        os.kill(os.getpid(), signal.SIGUSR1)\n"
        "    if l.stop_requested():\n"
        "        stopped = b.step\n"
        "        break\n"
        "assert stopped is not None and (l.rank != 0 or seen == [signal.SIGUSR1]), (stopped, seen)\n"
        "l.close()\n"
        f"m = meshfeed.Loader([{str(data)!r}], batch_size=8, seed=1, window_bytes='1K')\n"
        "for i, b in enumerate(m):\n"
        "    if m.rank == 1 and i == 2:\n"
        "        m.request_stop()\n"
        "    if m.stop_requested():\n"
        "        break\n"
        "print(f'stopped {l.rank} {stopped} {b.step}', flush=True)\n"
        "m.close()\n"
        f"n = meshfeed.Loader([{str(data)!r}], batch_size=8, seed=1)\n"
        "if n.rank == 0:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('not reached', n.rank, flush=True)\n"
    )
    r = run(MPIRUN + ["-np", 2, sys.executable, "-c", script])
    lines = re.findall(r"stopped (\d) (\d+) (\d+)", r.stdout)
    assert len(lines) == 2 and lines[0][1:] == lines[1][1:], r.stdout + r.stderr
    assert int(lines[0][1]) >= 3 and int(lines[0][2]) >= 2, lines
    assert r.returncode != 0 and "not reached 0" not in r.stdout, r.stdout


def test_a_tuned_training_loop_gets_a_producer_and_longer_windows_and_the_same_batches(tmp_path):
    """tune="auto" from windows of one step and prefetch=0, in a loop that does nothing but
    take batches (every window is waited for): a producer thread comes to run ahead
    (prefetch 2) of windows of several steps, every rank's windows are the same, they tile
    each epoch, and the batches are those of the untuned loader."""
    data = tmp_path / "data"
    ok(run([BIN, "gen", "--format", "npy", "--samples", "16000", "--files", "2", "--field", "x:u8:4088",
            "--field", "y:i64", "--out", data]))
    script = (
        "import json, zlib, meshfeed\n"
        "out = {}\n"
        "for tune in ('off', 'auto'):\n"
        f"    l = meshfeed.Loader([{str(data)!r}], batch_size=48, seed=3, window_bytes='1K', prefetch=0, tune=tune,\n"
        "                        read_strategy='random', memory_budget=0)\n"
        "    ids, windows = [], set()\n"
        "    def seen():\n"
        "        w = l.metrics()['window']\n"
        "        if w:\n"
        "            windows.add((w['epoch'], w['first_step'], w['steps'], w.get('prefetch'), w.get('read_depth')))\n"
        "    for epoch in range(5):\n"
        "        l.set_epoch(epoch)\n"
        "        for b in l:\n"
        "            ids += b.ids.tolist()\n"
        "            seen()\n"
        "        seen()\n"
        "    windows = sorted(windows)\n"
        "    changes = [w for i, w in enumerate(windows) if i == 0 or w[2:] != windows[i - 1][2:]]\n"
        "    out[tune] = {'ids': zlib.crc32(json.dumps(ids).encode()), 'n': len(ids),\n"
        "                 'windows': zlib.crc32(json.dumps(windows).encode()), 'changes': changes,\n"
        "                 'steps': [sum(w[2] for w in windows if w[0] == e) for e in range(5)]}\n"
        "    rank = l.rank\n"
        "    l.close()\n"
        "print(json.dumps({'rank': rank, **out}), flush=True)\n"
    )
    r = ok(run(MPIRUN + ["-np", 2, sys.executable, "-c", script]))
    ranks = sorted(json_objects(r.stdout), key=lambda m: m["rank"])
    assert len(ranks) == 2, r.stdout
    for m in ranks:
        off, auto = m["off"], m["auto"]
        assert auto["ids"] == off["ids"] and auto["n"] == off["n"] == 5 * 333 * 24, m
        assert off["changes"] == [[0, 0, 1, None, None]] and off["steps"] == [333] * 5, off
        assert auto["steps"] == [333] * 5, auto
        assert auto["changes"][0] == [0, 0, 1, 0, 16], auto
        # A producer thread comes to run ahead of longer windows.
        assert any(steps >= 2 and prefetch == 2 for _, _, steps, prefetch, _ in auto["changes"]), auto
    assert ranks[0]["auto"]["windows"] == ranks[1]["auto"]["windows"], ranks


def test_a_training_jobs_telemetry_reads_as_a_runs_and_names_its_slow_rank(datasets, tmp_path):
    """A Python training loop given telemetry=DIR writes what `meshfeed run --telemetry`
    writes: `meshfeed report` reads it, and its step-by-step what-if finds the rank whose
    training step is 5x the others' (rank 1), prices it, and names it in the slowest
    steps. loader.metrics() tells each rank the part of its time spent waiting for data
    (the fast ranks wait for the slow one), and rank 0 beats on stderr."""
    data, tel = datasets["npy"], tmp_path / "tel"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    script = (
        "import json, time, meshfeed\n"
        "try:\n"
        f"    meshfeed.Loader([{str(data)!r}], batch_size=12, telemetry={str(blocker / 'tel')!r})\n"
        "except meshfeed.Error as e:\n"
        "    print(f'refused: {e}', flush=True)\n"
        f"l = meshfeed.Loader([{str(data)!r}], batch_size=12, seed=3, window_bytes='2K', telemetry={str(tel)!r},"
        " heartbeat=0.05)\n"
        "for epoch in range(2):\n"
        "    l.set_epoch(epoch)\n"
        "    for b in l:\n"
        "        time.sleep(0.02 if l.rank == 1 else 0.004)\n"
        "m = l.metrics()\n"
        "e, w = m['epoch'], m['window']\n"
        "print(json.dumps({'rank': l.rank, 'epoch': e['epoch'], 'steps': e['steps'], 'samples': e['samples'],"
        " 'wait_fraction': e['wait_fraction'], 'compute_s': e['compute_s'], 'window_steps': len(w['step_compute_s'])}),"
        " flush=True)\n"
        "l.close()\n"
    )
    r = ok(run(MPIRUN + ["-np", 3, sys.executable, "-c", script]))
    # A directory that cannot be made is an error on every rank, naming it.
    assert r.stdout.count(f"refused: rank 0: {blocker / 'tel'}: Not a directory") == 3, r.stdout
    metrics = sorted(json_objects(r.stdout), key=lambda m: m["rank"])
    assert [(m["epoch"], m["steps"], m["samples"]) for m in metrics] == [(1, 50, 600)] * 3, metrics
    assert metrics[1]["wait_fraction"] < 0.2 and metrics[1]["compute_s"] >= 50 * 0.02, metrics
    assert all(metrics[i]["wait_fraction"] > 0.5 for i in (0, 2)), metrics
    assert all(m["window_steps"] >= 1 for m in metrics), metrics
    beats = [json.loads(line) for line in r.stderr.splitlines() if line.startswith('{"elapsed_s"')]
    assert len(beats) >= 3 and all(b["heartbeat"] and b["steps"] == 50 for b in beats), r.stderr
    assert sorted(p.name for p in tel.iterdir()) == ["rank-0.jsonl", "rank-1.jsonl", "rank-2.jsonl", "run.json"]
    report = ok(run([BIN, "report", "--json", tel]))
    epochs = [e for e in json_objects(report.stdout) if e.get("kind") == "epoch"]
    assert [e["epoch"] for e in epochs] == [0, 1], report.stdout
    for e in epochs:
        s = e["steps"]
        assert (s["steps"], s["slowest_rank"], s["cause"]) == (50, 1, "training step"), s
        # The replay matches the epoch as measured, and had rank 1 stepped as the others
        # the epoch would have taken about a fifth of it.
        assert 0.75 * e["seconds"] <= s["replayed_s"] <= 1.1 * e["seconds"], (e["seconds"], s)
        assert s["what_if_s"] < 0.5 * s["replayed_s"], s
        assert s["saving"]["training_step_s"] > 0.5 * s["replayed_s"] > s["saving"]["data_loading_s"], s
        assert all(x["rank"] == 1 and x["cause"] == "training step" for x in s["slowest_steps"]), s
    text = ok(run([BIN, "report", tel])).stdout
    assert "step by step (50 steps)" in text and "rank 1, training step" in text, text
