"""A sweep's points (slurm/sweep.sh): reads SWEEP.toml, checks every key against the
schema below and prints the grid's points, one JSON object per line; or, when anything
is wrong, prints every problem on its own line (`sweep: FILE: KEY: VALUE: expected ...`)
to stderr, prints no point and exits 1. Never a traceback: a missing, unreadable,
non-UTF-8 or malformed file is one line naming the file and the reason.

    python3 slurm/sweep_points.py SWEEP.toml

Grid values are a list of values (crossed with the other keys') or one value, which
counts as a one-item list: a string is never split into letters, an empty list is an
error, a value twice in a list is an error (its point's results would be overwritten).
"""

import difflib
import itertools
import json
import os
import re
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

# A sweep file is a few lines; a bigger one is not a sweep (and is not read whole).
MAX_BYTES = 1 << 20
# The formats meshfeed reads (src/dataset/mod.rs, Format); the PyTorch baseline
# (bench/torch_loader.py) reads all of them but raw.
FORMATS = ("npy", "hdf5", "arrow", "raw")
PYTORCH_FORMATS = ("npy", "hdf5", "arrow")
DEFAULT_PREDICT = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096"


def show(v, depth=0):
    """A value as the TOML file wrote it, cut short when long."""
    if isinstance(v, bool):
        s = "true" if v else "false"
    elif isinstance(v, str):
        s = json.dumps(v)
    elif isinstance(v, (list, dict)) and depth > 3:
        s = "[...]" if isinstance(v, list) else "{...}"
    elif isinstance(v, list):
        items = [show(x, depth + 1) for x in v[:8]] + (["..."] if len(v) > 8 else [])
        s = "[" + ", ".join(items) + "]"
    elif isinstance(v, dict):
        items = [f"{key_name(k)} = {show(x, depth + 1)}" for k, x in list(v.items())[:8]]
        s = "{" + ", ".join(items + (["..."] if len(v) > 8 else [])) + "}"
    elif hasattr(v, "isoformat"):
        s = v.isoformat()
    else:
        s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def key_name(k):
    """A key as TOML writes it: bare when it can be, else quoted."""
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


# Each check: the value -> None when valid, else what was expected.
def integer(least):
    def check(v):
        if isinstance(v, int) and not isinstance(v, bool) and v >= least:
            return None
        return f"expected an integer >= {least}"
    return check


def one_of(*allowed):
    def check(v):
        if isinstance(v, str) and v in allowed:
            return None
        return "expected " + ", ".join(allowed[:-1]) + " or " + allowed[-1]
    return check


def string(nonempty=False):
    def check(v):
        if isinstance(v, str) and (v or not nonempty):
            return None
        return "expected a non-empty string" if nonempty else "expected a string"
    return check


def boolean(v):
    return None if isinstance(v, bool) else "expected true or false"


def byte_size(v):
    """What meshfeed's ByteSize accepts (src/config.rs): a non-negative integer, or digits
    with an optional K, M, G or T suffix (either case), within 64 bits."""
    expected = "expected a byte size: an integer >= 0, or digits with K, M, G or T (65536, \"8M\", \"1G\")"
    if isinstance(v, int) and not isinstance(v, bool):
        return None if 0 <= v < 1 << 64 else expected
    if isinstance(v, str):
        m = re.fullmatch(r"([0-9]+)([KMGTkmgt]?)", v)
        if m:
            n = int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2).upper()]
            return None if n < 1 << 64 else "expected a byte size within 64 bits"
    return expected


def dir_name(v):
    if isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9._-]+", v) and v not in (".", ".."):
        return None
    return "expected a plain directory name (letters, digits, '-', '_', '.'; not '.' or '..'; no '/')"


def int_list(least, empty_ok):
    """A comma-separated list of integers >= least ("0,1,2"); one integer counts too."""
    example = {0: "\"0,1,2\"", 1: "\"16,64,256\""}[least]
    expected = f"expected comma-separated integers >= {least}, such as {example}"
    if empty_ok:
        expected += " (\"\": none)"

    def check(v):
        if isinstance(v, int) and not isinstance(v, bool):
            return None if least <= v < 1 << 64 else expected
        if not isinstance(v, str):
            return expected
        if v == "":
            return None if empty_ok else expected
        for item in v.split(","):
            if not re.fullmatch(r"[0-9]+", item) or not least <= int(item) < 1 << 64:
                return f"{expected}; {json.dumps(item)} is not one"
        return None
    return check


# What a missing required key is.
REQUIRED = {
    "name": "the results directory's name",
    "data": "the dataset's path, as the nodes see it",
    "grid.nodes": "the node counts, such as nodes = [1, 2, 4]",
}
# Top-level keys: (check, default; None: required), in the order the point lists them.
TOP = {
    "name": (dir_name, None),
    "data": (string(nonempty=True), None),
    "epochs": (integer(1), 1),
    "verify": (boolean, False),
    "drop_caches": (string(), ""),
    "storage_bytes": (string(), ""),
    "format": (one_of(*FORMATS), "npy"),
    "python": (string(nonempty=True), "python3"),
    "pytorch_workers": (int_list(0, empty_ok=False), "0,1,2"),
    "predict": (int_list(1, empty_ok=True), DEFAULT_PREDICT),
}
# Grid keys: (check, default list; None: required), in the order they are crossed.
GRID = {
    "nodes": (integer(1), None),
    "ranks_per_node": (integer(1), [1]),
    "batch_size": (integer(1), [64]),
    "window_bytes": (byte_size, ["64M"]),
    "transport": (one_of("mpi", "ucx"), ["mpi"]),
    "loader": (one_of("meshfeed", "broadcast", "pytorch"), ["meshfeed"]),
}


def unknown(key, where, known):
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"{where}: unknown key ({hint}known: {', '.join(known)})"


def check_sweep(s):
    """(problems, settings, grid lists): every problem, each as `KEY: VALUE: reason`."""
    problems = []
    settings = {}
    for key, value in s.items():
        if key not in TOP and key != "grid":
            hint = "; grid keys go under [grid]" if key in GRID else ""
            problems.append(unknown(key, key_name(key), list(TOP) + ["grid"]) + hint)
    for key, (check, default) in TOP.items():
        if key not in s:
            if default is None:
                problems.append(f"{key}: missing ({REQUIRED[key]})")
            settings[key] = default
            continue
        why = check(s[key])
        if why:
            problems.append(f"{key}: {show(s[key])}: {why}")
        settings[key] = s[key]
    grid = s.get("grid")
    lists = {}
    if grid is None:
        problems.append("grid: missing (a [grid] table with nodes at least)")
        return problems, settings, lists
    if not isinstance(grid, dict):
        problems.append(f"grid: {show(grid)}: expected a table ([grid])")
        return problems, settings, lists
    for key in grid:
        if key not in GRID:
            problems.append(unknown(key, "grid." + key_name(key), list(GRID)))
    for key, (check, default) in GRID.items():
        where = "grid." + key
        if key not in grid:
            if default is None:
                problems.append(f"{where}: missing ({REQUIRED[where]})")
            lists[key] = default
            continue
        value = grid[key]
        if isinstance(value, list):
            if not value:
                problems.append(f"{where}: []: expected at least one value (a list of values, or one value)")
            items = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
        else:
            items = [(where, value)]  # one value: a one-item list (a string is never split)
        seen = {}
        for at, v in items:
            why = check(v)
            if why:
                problems.append(f"{at}: {show(v)}: {why}")
            elif str(v) in seen:
                problems.append(f"{at}: {show(v)}: repeats {seen[str(v)]} (the point would run twice, "
                                "its results overwritten)")
            else:
                seen[str(v)] = at
        lists[key] = [v for _, v in items]
    if "pytorch" in lists.get("loader", []) and settings["format"] in FORMATS \
            and settings["format"] not in PYTORCH_FORMATS:
        problems.append(f"format: {show(settings['format'])}: the pytorch loader (bench/torch_loader.py) reads "
                        + ", ".join(PYTORCH_FORMATS[:-1]) + " or " + PYTORCH_FORMATS[-1])
    return problems, settings, lists


def points(settings, lists):
    """The grid's points in order, as JSON lines (the format slurm/sweep.sh and the
    report read: point.json)."""
    keys = list(GRID)
    for combo in itertools.product(*(lists[k] for k in keys)):
        p = dict(zip(keys, combo))
        if p["loader"] == "pytorch" and p["transport"] != lists["transport"][0]:
            continue  # the PyTorch baseline has no transport: run it once per other point
        p.update(sweep=settings["name"], data=settings["data"], epochs=settings["epochs"],
                 verify=settings["verify"], drop_caches=settings["drop_caches"],
                 storage_bytes=settings["storage_bytes"], format=settings["format"], python=settings["python"],
                 pytorch_workers=str(settings["pytorch_workers"]), predict=str(settings["predict"]))
        p["id"] = "{loader}-n{nodes}x{ranks_per_node}-b{batch_size}-w{window_bytes}-{transport}".format(**p)
        if p["loader"] == "pytorch":
            p["id"] = "pytorch-n{nodes}x{ranks_per_node}-b{batch_size}".format(**p)
        yield json.dumps(p)


def read(path):
    """The file's TOML as a dict, or exits with one line saying why it cannot be."""
    def fail(reason):
        sys.exit(f"sweep: {path}: {reason}")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        fail("no such file")
    except OSError as e:
        fail(f"cannot be read: {(e.strerror or str(e)).lower()}")
    if os.path.isdir(path):
        fail("is a directory, not a sweep file")
    if not os.path.isfile(path):
        fail("not a regular file (a sweep is a TOML file)")
    if st.st_size > MAX_BYTES:
        fail(f"{st.st_size} bytes: a sweep file is at most {MAX_BYTES} bytes")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        fail(f"cannot be read: {(e.strerror or str(e)).lower()}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        fail(f"not UTF-8 text (line {line}: byte 0x{data[e.start]:02x})")
    if tomllib is None:
        fail("reading TOML needs Python 3.11 or later (tomllib); python3 is " + sys.version.split()[0])
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        fail(f"not valid TOML: {e}")
    except RecursionError:
        fail("not valid TOML: nested too deeply")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: sweep_points.py SWEEP.toml")
    path = sys.argv[1]
    problems, settings, lists = check_sweep(read(path))
    if problems:
        for p in problems:
            print(f"sweep: {path}: {p}", file=sys.stderr)
        sys.exit(f"sweep: {path}: {len(problems)} problem(s); nothing submitted")
    for line in points(settings, lists):
        print(line)


if __name__ == "__main__":
    try:
        main()
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as e:  # never a traceback: whatever went wrong, in one line
        sys.exit(f"sweep: {sys.argv[1] if len(sys.argv) > 1 else '?'}: cannot be checked: {type(e).__name__}: {e}")
