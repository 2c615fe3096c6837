#!/usr/bin/env python3
"""meshfeed's cold-storage benchmark (issue 21): loaders reading data that is not in the
page cache, from storage throttled to a cloud volume's baseline, with memory capped.

Run it as root on Linux, through ``bash bench/run.sh --cold`` (which installs and builds
first) or directly once built:

    python3 bench/cold.py                      # the suite (about two hours on 2 cores)
    python3 bench/cold.py --smoke              # seconds: what CI runs
    python3 bench/cold.py --sizes medium --formats npy --scenarios over

Storage. The datasets live on an ext4 filesystem of their own, on a loop device, so that
the kernel's block-I/O throttling applies to them alone: cgroup v1
``blkio.throttle.read_{bps,iops}_device`` (or v2 ``io.max``) at ``--bps`` and ``--iops``
(250 MB/s and 3 000 reads/s by default: a cloud volume's baseline, a busy parallel
filesystem client). A second, unthrottled loop device stands for node-local scratch (the
spill directory). Every run starts with the dataset's pages dropped from the page cache.

Memory. Every loader of a scenario runs in one memory cgroup (page cache included) with
the same limit: the job's memory.
  fits   the limit leaves meshfeed's default budget room for all of the data;
  over   the data is 4x that budget (the page cache gets what the loaders leave);
  spill  as over, with ``--spill-dir`` on the unthrottled device.
meshfeed's budget comes from the limit by its own rule (src/loader/read/plan.rs, mirrored
in ``budget_of`` below).

Loaders (each in the scenario's cgroups; meshfeed with 4 ranks under mpirun):
  meshfeed             defaults, no flags (``auto``)
  meshfeed:resident / :passes / :random   each strategy forced (in ``over`` and ``spill``)
  meshfeed:random-access  every sample read where a window needs it, nothing kept, 16 reads
                       in flight (``--read-strategy random --memory-budget 0``)
  meshfeed:today       meshfeed as it was before storage-aware reading (``--baseline``, git
                       e7f0ec8, built once in a worktree of its own), with its defaults
  meshfeed:warm        defaults, page cache warm, no limits (the warm-cache reference)
  meshfeed:local       defaults on a copy of the data on the node-local device (``spill``'s
                       reference: what the spill tier should come close to)
  pytorch:memmap / pytorch:pread   DataLoader + DistributedSampler (bench/torch_cold.py)
Limits: ``sequential`` (the files streamed in 8 MiB reads under the same throttle) and the
IOPS floor (one read per sample: the device's reads/s, or its bandwidth / sample size where that
binds first).

For each run it records samples/s per epoch, storage bytes and reads per epoch (from the
cgroup's counters, polled every 50 ms and cut at the moments the loader reports each
epoch's end), the cgroup's peak memory, OOM kills, and the strategy meshfeed chose with
its reason. Results: ``OUT/results.jsonl``; ``OUT/report.md`` has the tables and each
target checked, naming the phase and the measurement where one is missed.
"""

import argparse
import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB, GiB = 1 << 20, 1 << 30
# The meshfeed measured (``--binary``): a copy lets the tree be rebuilt during a long run.
MESHFEED = os.path.join(ROOT, "target", "release", "meshfeed")

# The sizes of the warm suite (bench/run.sh): fields and global batch.
SIZES = {
    "small": ("x:u8:248 label:i64", 256, 4096),
    "medium": ("x:u8:16376 label:i64", 16 << 10, 1024),
    "imagenet": ("x:u8:3x224x224 label:i64", 3 * 224 * 224 + 8, 256),
    "large": ("x:u8:1048568 label:i64", 1 << 20, 64),
}
EXT = {"npy": "npy", "hdf5": "h5", "arrow": "arrow"}

# meshfeed's default budget rule (src/loader/read/plan.rs): of the headroom, a quarter
# (at least 256 MiB) stays with the program, and each rank's pipeline (prefetch + 1 =
# 3 windows of 64 MiB) and one 8 MiB streaming read are set aside.
MARGIN_FRACTION, MIN_MARGIN = 0.25, 256 * MiB
PIPELINE = 3 * 64 * MiB + 8 * MiB


def budget_of(headroom, ranks):
    margin = max(int(headroom * MARGIN_FRACTION), MIN_MARGIN)
    return max(0, headroom - margin - ranks * PIPELINE)


def headroom_for(budget, ranks):
    """The smallest headroom whose default budget is `budget`."""
    h = budget + ranks * PIPELINE + MIN_MARGIN
    if h * MARGIN_FRACTION > MIN_MARGIN:
        h = int((budget + ranks * PIPELINE) / (1 - MARGIN_FRACTION)) + 1
    return h


def log(*a):
    print(f"[cold {time.monotonic() - START:6.0f}s]", *a, file=sys.stderr, flush=True)


START = time.monotonic()


def sh(*cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, text=True, capture_output=True, **kw)


# --- cgroups -------------------------------------------------------------------------

class Cgroups:
    """A blkio (or v2 io) cgroup throttling reads of one device, and a memory cgroup with a
    limit; processes started by ``popen`` run in both."""

    def __init__(self, name, dev, bps, iops, mem_limit):
        self.dev, self.name = dev, name
        self.v1 = os.path.exists("/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device")
        if self.v1:
            self.io = f"/sys/fs/cgroup/blkio/{name}"
            self.mem = f"/sys/fs/cgroup/memory/{name}"
        else:
            self.io = self.mem = f"/sys/fs/cgroup/{name}"
        for d in {self.io, self.mem}:
            os.makedirs(d, exist_ok=True)
        if self.v1:
            if bps:
                self._w(self.io, "blkio.throttle.read_bps_device", f"{dev} {bps}")
            if iops:
                self._w(self.io, "blkio.throttle.read_iops_device", f"{dev} {iops}")
            if mem_limit:
                self._w(self.mem, "memory.limit_in_bytes", str(mem_limit))
                with contextlib.suppress(OSError):
                    self._w(self.mem, "memory.memsw.limit_in_bytes", str(mem_limit))
        else:
            parts = [f"rbps={bps}" if bps else "", f"riops={iops}" if iops else ""]
            if any(parts):
                self._w(self.io, "io.max", f"{dev} {' '.join(p for p in parts if p)}")
            if mem_limit:
                self._w(self.mem, "memory.max", str(mem_limit))
                with contextlib.suppress(OSError):
                    self._w(self.mem, "memory.swap.max", "0")

    @staticmethod
    def _w(d, f, v):
        with open(os.path.join(d, f), "w") as fh:
            fh.write(v)

    @staticmethod
    def _r(d, f):
        with open(os.path.join(d, f)) as fh:
            return fh.read()

    def prefix(self):
        """A shell prefix that moves the shell into the cgroups, then execs the command."""
        procs = " ".join(f"echo $$ > {d}/cgroup.procs;" for d in sorted({self.io, self.mem}))
        return ["sh", "-c", procs + ' exec "$@"', "sh"]

    def io_counters(self):
        """(bytes, reads) this cgroup read from the device so far."""
        if self.v1:
            def total(f):
                for line in self._r(self.io, f).splitlines():
                    p = line.split()
                    if len(p) == 3 and p[0] == self.dev and p[1] == "Read":
                        return int(p[2])
                return 0
            return total("blkio.throttle.io_service_bytes"), total("blkio.throttle.io_serviced")
        for line in self._r(self.io, "io.stat").splitlines():
            p = line.split()
            if p and p[0] == self.dev:
                kv = dict(x.split("=") for x in p[1:])
                return int(kv.get("rbytes", 0)), int(kv.get("rios", 0))
        return 0, 0

    def memory(self):
        """(peak usage, OOM kills)."""
        if self.v1:
            peak = int(self._r(self.mem, "memory.max_usage_in_bytes"))
            oom = self._r(self.mem, "memory.oom_control")
        else:
            peak = int(self._r(self.mem, "memory.peak")) if os.path.exists(f"{self.mem}/memory.peak") else 0
            oom = self._r(self.mem, "memory.events")
        kills = next((int(line.split()[1]) for line in oom.splitlines() if line.startswith("oom_kill ")), 0)
        return peak, kills

    def close(self):
        for d in {self.io, self.mem}:
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    time.sleep(0.05)


def why_not_here():
    """Why the cold benchmark cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "it must run as root (loop devices, cgroups)"
    v1 = os.path.exists("/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device") and os.path.exists(
        "/sys/fs/cgroup/memory/memory.limit_in_bytes")
    v2 = False
    with contextlib.suppress(OSError):
        controllers = open("/sys/fs/cgroup/cgroup.controllers").read().split()
        v2 = "io" in controllers and "memory" in controllers
    if not (v1 or v2):
        return ("the kernel offers no block-I/O throttling and memory cgroup "
                "(cgroup v1 blkio + memory, or v2 io + memory)")
    if shutil.which("losetup") is None or shutil.which("mkfs.ext4") is None:
        return "losetup and mkfs.ext4 (util-linux, e2fsprogs) are needed"
    r = sh("losetup", "-f", check=False)
    if r.returncode != 0:
        return f"no free loop device ({r.stderr.strip()})"
    return None


# --- storage -------------------------------------------------------------------------

class LoopFs:
    """An ext4 filesystem in an image file on a loop device, mounted at ``mnt``."""

    def __init__(self, image, mnt, size):
        self.image, self.mnt = image, mnt
        os.makedirs(mnt, exist_ok=True)
        # An interrupted suite leaves its mount and loop device behind; a second loop device
        # on the same image, mounted over the first, would corrupt the filesystem.
        while sh("mountpoint", "-q", mnt, check=False).returncode == 0:
            sh("umount", mnt)
        if os.path.exists(image):
            for line in sh("losetup", "-j", image, check=False).stdout.splitlines():
                sh("losetup", "-d", line.split(":")[0], check=False)
        fresh = not os.path.exists(image) or os.path.getsize(image) < size
        if fresh:
            with open(image, "wb") as f:
                f.truncate(size)
            sh("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", image)
        self.loop = sh("losetup", "-f", "--show", image).stdout.strip()
        sh("mount", self.loop, mnt)
        st = os.stat(mnt)
        self.dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"

    def close(self):
        # The last run's processes may hold the mount for a moment.
        for _ in range(50):
            if sh("umount", self.mnt, check=False).returncode == 0:
                break
            time.sleep(0.2)
        else:
            log(f"cannot unmount {self.mnt}: {sh('umount', self.mnt, check=False).stderr.strip()}")
        sh("losetup", "-d", self.loop, check=False)


def drop_cache(paths):
    """Drops the files' pages from the page cache (written back first: dirty pages stay)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_cache(paths):
    for p in paths:
        with open(p, "rb") as f:
            while f.read(8 * MiB):
                pass


# --- one run -------------------------------------------------------------------------

def run_loader(cmd, cg, parse_epoch, time_limit, env=None):
    """Runs `cmd` in cgroups `cg` (or none), polling the I/O counters; returns
    (epochs, exit code, output, errors, whether the time limit stopped it) where each
    epoch dict has the loader's figures plus storage bytes and reads between its start
    and its end."""
    polls = []
    stop = threading.Event()
    fired = threading.Event()  # the time limit sent SIGTERM

    def poll():
        while not stop.is_set():
            polls.append((time.monotonic(), *(cg.io_counters() if cg else (0, 0))))
            time.sleep(0.05)

    t0 = time.monotonic()
    full = (cg.prefix() if cg else []) + cmd
    proc = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    lines, ends = [], []
    err = []
    et = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    et.start()
    killer = None
    if time_limit:
        def stop_it():
            fired.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        killer = threading.Timer(time_limit, stop_it)
        killer.start()
    for line in proc.stdout:
        lines.append(line)
        e = parse_epoch(line)
        if e is not None:
            ends.append((time.monotonic(), e))
    code = proc.wait()
    if killer:
        killer.cancel()
    et.join()
    polls.append((time.monotonic(), *(cg.io_counters() if cg else (0, 0))))
    stop.set()
    poller.join()

    def counters_at(t):
        best = polls[0]
        for p in polls:
            if p[0] <= t:
                best = p
        return best[1], best[2]

    epochs, prev = [], counters_at(t0)
    for at, e in ends:
        now = counters_at(at + 0.06)
        e["storage_bytes"], e["storage_reads"] = now[0] - prev[0], now[1] - prev[1]
        prev = now
        epochs.append(e)
    return epochs, code, "".join(lines), "".join(err), fired.is_set()


def meshfeed_epoch(line):
    with contextlib.suppress(ValueError):
        v = json.loads(line)
        if "epoch" in v and "samples" in v and "seconds" in v:
            # The first epoch includes opening the loader (where it starts streaming).
            v["seconds"] += v.get("open_s") or 0.0
            return v
    return None


class TorchEpochs:
    """Per-epoch lines of every rank, combined once all ranks reported an epoch."""

    def __init__(self, ranks):
        self.ranks, self.seen = ranks, {}

    def __call__(self, line):
        with contextlib.suppress(ValueError):
            v = json.loads(line)
            got = self.seen.setdefault(v["epoch"], [])
            got.append(v)
            if len(got) == self.ranks:
                return {"epoch": v["epoch"], "samples": sum(g["samples"] for g in got),
                        "seconds": max(g["seconds"] for g in got)}
        return None


# --- the suite -----------------------------------------------------------------------

def main():
    global MESHFEED
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="seconds: a tiny dataset, meshfeed only, outcomes asserted")
    p.add_argument("--out", help="results directory [bench/results/cold-<UTC time>]")
    p.add_argument("--sizes", default="medium,small,imagenet,large")
    p.add_argument("--formats", default="npy,hdf5,arrow")
    p.add_argument("--scenarios", default="fits,over,spill")
    p.add_argument("--gib", type=float, default=2.0, help="dataset size [2 GiB]")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--bps", type=int, default=250_000_000, help="read bandwidth of the throttled device")
    p.add_argument("--iops", type=int, default=3000, help="reads per second of the throttled device")
    p.add_argument("--time-limit", type=float, default=90, help="seconds a run may take before it is stopped")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch baselines")
    p.add_argument("--baseline", default="e7f0ec8",
                   help="git revision of meshfeed before storage-aware reading, run with its defaults as 'today' "
                        "(built once into --workdir; '' to skip)")
    p.add_argument("--workdir", default=os.path.join(ROOT, "bench", "cold"), help="disk images and mounts")
    p.add_argument("--loaders", default="",
                   help="only these meshfeed loaders in the scenarios, e.g. meshfeed,meshfeed:passes [all]")
    p.add_argument("--binary", default=MESHFEED, help="the meshfeed to measure [target/release/meshfeed]")
    args = p.parse_args()
    MESHFEED = os.path.abspath(args.binary)

    reason = why_not_here()
    if reason:
        print(f"SKIPPED: the cold-storage benchmark cannot run here: {reason}.", flush=True)
        print("         (no cold figure was measured; run it as root on a Linux machine with cgroups)", flush=True)
        return 0
    if args.smoke:
        return smoke(args)
    return suite(args)


def meshfeed_cmd(ranks, data, batch, epochs, extra, binary=None):
    mf = binary or MESHFEED
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", str(ranks),
            mf, "run", "--data", data, "--batch-size", str(batch), "--epochs", str(epochs),
            "--json", "--heartbeat", "0", *extra]


def build_baseline(rev, workdir):
    """meshfeed as it was at `rev` (the defaults before storage-aware reading), built once in
    a worktree of its own under `workdir`."""
    workdir = os.path.abspath(workdir)
    src, target = os.path.join(workdir, "baseline-src"), os.path.join(workdir, "baseline-target")
    binary = os.path.join(target, "release", "meshfeed")
    stamp = os.path.join(workdir, "baseline-rev")
    if os.path.exists(binary) and os.path.exists(stamp) and open(stamp).read().strip() == rev:
        return binary
    log(f"building the baseline: meshfeed at {rev} (once; a few minutes)")
    if os.path.exists(src):
        sh("git", "-C", ROOT, "worktree", "remove", "--force", src, check=False)
        shutil.rmtree(src, ignore_errors=True)
    sh("git", "-C", ROOT, "worktree", "add", "--detach", src, rev)
    env = dict(os.environ, CARGO_TARGET_DIR=target)
    subprocess.run(["cargo", "build", "--release", "-p", "meshfeed-cli"], cwd=src, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    with open(stamp, "w") as f:
        f.write(rev + "\n")
    return binary


def gen(data, fmt, fields, samples):
    if os.path.exists(os.path.join(data, ".complete")):
        return
    shutil.rmtree(data, ignore_errors=True)
    mf = MESHFEED
    cmd = [mf, "gen", "--format", fmt, "--samples", str(samples), "--files", "8", "--out", data]
    for f in fields.split():
        cmd += ["--field", f]
    log("gen", data, f"({samples} samples)")
    sh(*cmd)
    open(os.path.join(data, ".complete"), "w").close()


def files_in(data):
    return sorted(f for f in glob.glob(os.path.join(data, "*")) if not os.path.basename(f).startswith("."))


def base_memory(ranks, data, batch, dev):
    """The cgroup peak of a meshfeed job that keeps nothing, on a tiny dataset: the
    processes' own memory, which the scenario limits add to."""
    cg = Cgroups(f"meshfeed-cold-base-{os.getpid()}", dev, 0, 0, 0)
    try:
        _, code, out, err, _ = run_loader(meshfeed_cmd(ranks, data, batch, 1, ["--memory-budget", "0"]), cg,
                                       meshfeed_epoch, 0)
        if code != 0:
            raise SystemExit(f"cold: the baseline run failed:\n{err}")
        return cg.memory()[0]
    finally:
        cg.close()


def measure(name, cmd, cg_args, files, parse, time_limit, warm=False, env=None):
    """One run: drop (or warm) the dataset's cache, run in fresh cgroups, collect."""
    (warm_cache if warm else drop_cache)(files)
    cg = Cgroups(f"meshfeed-cold-{os.getpid()}", *cg_args) if cg_args else None
    try:
        epochs, code, out, err, limited = run_loader(cmd, cg, parse, time_limit, env=env)
        peak, kills = cg.memory() if cg else (0, 0)
    finally:
        if cg:
            cg.close()
    # A run stopped at the time limit (SIGTERM) ends with the epoch it was in, or with the
    # last it finished where mpirun took the ranks down before they printed.
    stopped = code != 0 and limited and not kills and bool(epochs)
    ok = code == 0 or stopped
    if not ok:
        log(f"{name}: exit {code}\n{err[-2000:]}")
    return {"loader": name, "exit": code, "ok": ok, "stopped": stopped, "epochs": epochs,
            "cgroup_peak_bytes": peak, "oom_kills": kills,
            "error": None if ok else "\n".join(err.strip().splitlines()[-3:])}


def sequential_limit(files, cg_args):
    """The files streamed in 8 MiB reads under the throttle: bytes/s."""
    drop_cache(files)
    cmd = [sys.executable, "-c",
           "import sys\nfor p in sys.argv[1:]:\n f=open(p,'rb',buffering=0)\n while f.read(8<<20): pass\n", *files]
    cg = Cgroups(f"meshfeed-cold-seq-{os.getpid()}", *cg_args)
    try:
        t = time.monotonic()
        subprocess.run(cg.prefix() + cmd, check=True)
        secs = time.monotonic() - t
        nbytes, reads = cg.io_counters()
    finally:
        cg.close()
    return {"seconds": secs, "bytes": nbytes, "reads": reads, "bytes_per_s": nbytes / secs}


def suite(args):
    out = args.out or os.path.join(ROOT, "bench", "results", time.strftime("cold-%Y%m%dT%H%M%SZ", time.gmtime()))
    os.makedirs(out, exist_ok=True)
    results = os.path.join(out, "results.jsonl")
    sizes, formats = args.sizes.split(","), args.formats.split(",")
    scenarios = args.scenarios.split(",")
    data_bytes = int(args.gib * GiB)
    os.makedirs(args.workdir, exist_ok=True)
    need = int(len(sizes) * len(formats) * data_bytes * 1.15) + 2 * GiB
    disk = LoopFs(os.path.join(args.workdir, "shared.img"), os.path.join(args.workdir, "shared"), need)
    scratch = LoopFs(os.path.join(args.workdir, "scratch.img"), os.path.join(args.workdir, "scratch"),
                     data_bytes * 2 + GiB)
    # The PyTorch venv of the benchmark suite, or the tests' (both have torch).
    py = next((v for v in (os.path.join(ROOT, d, "bin", "python") for d in ("bench/.venv", ".venv"))
               if os.path.exists(v) and subprocess.run([v, "-c", "import torch"], capture_output=True).returncode == 0),
              None)
    if py is None and not args.no_torch:
        raise SystemExit("cold: no Python with torch (bench/run.sh --cold makes bench/.venv); or pass --no-torch")
    today = build_baseline(args.baseline, args.workdir) if args.baseline else None
    try:
        tiny = os.path.join(disk.mnt, "tiny")
        gen(tiny, "npy", "x:u8:64", 400)
        base = base_memory(args.ranks, tiny, 32, disk.dev)
        log(f"processes' own memory (4 ranks, nothing kept): {base / MiB:.0f} MiB")
        for size in sizes:
            fields, sample, batch = SIZES[size]
            samples = data_bytes // sample // batch * batch
            for fmt in formats:
                data = os.path.join(disk.mnt, f"{size}-{fmt}")
                gen(data, fmt, fields, samples)
                files = files_in(data)
                nbytes = sum(os.path.getsize(f) for f in files)
                seq = sequential_limit(files, (disk.dev, args.bps, args.iops, 0))
                record(results, {"kind": "limit", "size": size, "format": fmt, "sample_bytes": sample,
                                 "samples": samples, "data_bytes": nbytes, "sequential": seq,
                                 "iops_floor_samples_per_s": args.iops,
                                 "bps": args.bps, "iops": args.iops})
                log(f"{size} {fmt}: sequential limit {seq['bytes_per_s'] / 1e6:.0f} MB/s "
                    f"({samples / seq['seconds']:.0f} samples/s), IOPS floor {args.iops} samples/s")
                warm = measure("meshfeed:warm", meshfeed_cmd(args.ranks, data, batch, 6, []), None, files,
                               meshfeed_epoch, args.time_limit, warm=True)
                record(results, {"kind": "run", "size": size, "format": fmt, "scenario": "warm", "sample_bytes": sample,
                                 "samples": samples, "data_bytes": nbytes, **warm})
                for scenario in scenarios:
                    budget = nbytes * 11 // 10 if scenario == "fits" else nbytes // 4
                    limit = base + headroom_for(budget, args.ranks)
                    cg_args = (disk.dev, args.bps, args.iops, limit)
                    log(f"{size} {fmt} {scenario}: memory limit {limit / MiB:.0f} MiB (meshfeed's default budget "
                        f"{budget_of(limit - base, args.ranks) / MiB:.0f} MiB for {nbytes / MiB:.0f} MiB of data)")
                    loaders = [("meshfeed", [])]
                    if scenario == "spill":
                        spill = os.path.join(scratch.mnt, "spill")
                        os.makedirs(spill, exist_ok=True)
                        loaders = [("meshfeed", ["--spill-dir", spill])]
                        # The reference: the same data on the node-local device itself.
                        # The scratch device holds one dataset's copy (marked whole once
                        # copied: an interrupted copy is made again) and the spill files.
                        local = os.path.join(scratch.mnt, f"{size}-{fmt}")
                        for other in os.listdir(scratch.mnt):
                            if other not in (f"{size}-{fmt}", "spill", "lost+found"):
                                shutil.rmtree(os.path.join(scratch.mnt, other), ignore_errors=True)
                        if not os.path.exists(os.path.join(local, ".copied")):
                            shutil.rmtree(local, ignore_errors=True)
                            shutil.copytree(data, local)
                            open(os.path.join(local, ".copied"), "w").close()
                        r = measure("meshfeed:local", meshfeed_cmd(args.ranks, local, batch, 3, []), cg_args,
                                    files_in(local), meshfeed_epoch, args.time_limit)
                        record(results, {"kind": "run", "size": size, "format": fmt, "scenario": scenario,
                                         "sample_bytes": sample, "samples": samples, "data_bytes": nbytes,
                                         "memory_limit": limit, **r})
                        show(size, fmt, scenario, r, samples)
                    elif scenario == "over":
                        loaders += [("meshfeed:passes", ["--read-strategy", "passes"]),
                                    ("meshfeed:random", ["--read-strategy", "random"]),
                                    ("meshfeed:resident", ["--read-strategy", "resident"])]
                    if scenario != "spill":
                        loaders.append(("meshfeed:random-access",
                                        ["--read-strategy", "random", "--memory-budget", "0"]))
                    if today:
                        loaders.append(("meshfeed:today", []))
                    if args.loaders:
                        loaders = [(n, e) for n, e in loaders if n in args.loaders.split(",")]
                    for name, extra in loaders:
                        # Later epochs from memory take fractions of a second: several, for a median.
                        epochs = 6 if name == "meshfeed" and scenario == "fits" else 2
                        binary = today if name == "meshfeed:today" else None
                        r = measure(name, meshfeed_cmd(args.ranks, data, batch, epochs, extra, binary), cg_args,
                                    files, meshfeed_epoch, args.time_limit)
                        record(results, {"kind": "run", "size": size, "format": fmt, "scenario": scenario,
                                         "sample_bytes": sample, "samples": samples, "data_bytes": nbytes,
                                         "memory_limit": limit, **r})
                        show(size, fmt, scenario, r, samples)
                    if not args.no_torch and scenario != "spill":
                        for variant in ["memmap", "pread"]:
                            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.ranks), py,
                                   os.path.join(ROOT, "bench", "torch_cold.py"), "--data", data, "--format", fmt,
                                   "--variant", variant, "--batch-size", str(batch), "--epochs", "2",
                                   "--time-limit", str(args.time_limit / 2)]
                            r = measure(f"pytorch:{variant}", cmd, cg_args, files, TorchEpochs(args.ranks), 0)
                            record(results, {"kind": "run", "size": size, "format": fmt, "scenario": scenario,
                                             "sample_bytes": sample, "samples": samples, "data_bytes": nbytes,
                                             "memory_limit": limit, **r})
                            show(size, fmt, scenario, r, samples)
    finally:
        disk.close()
        scratch.close()
    mf = MESHFEED
    rep = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "cold_report.py"), results,
                          os.path.join(out, "report.md")], text=True, capture_output=True)
    print(rep.stdout)
    if rep.returncode != 0:
        print(rep.stderr, file=sys.stderr)
    log(f"done: {results}, {out}/report.md ({mf})")
    return 0


def record(path, rec):
    rec["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rec["git_rev"] = sh("git", "-C", ROOT, "rev-parse", "--short", "HEAD", check=False).stdout.strip()
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def show(size, fmt, scenario, r, samples):
    rates = ", ".join(f"e{e['epoch']} {e['samples'] / max(e['seconds'], 1e-9):.0f}/s "
                      f"{e['storage_bytes'] / MiB:.0f} MiB" for e in r["epochs"])
    chosen = r["epochs"][0].get("read_strategy", "") if r["epochs"] else ""
    extra = f" [{chosen}]" if chosen else ""
    status = "ok" if r["ok"] else f"FAILED (exit {r['exit']})"
    log(f"  {size} {fmt} {scenario} {r['loader']}{extra}: {rates or '-'}; peak {r['cgroup_peak_bytes'] / MiB:.0f} MiB,"
        f" OOM kills {r['oom_kills']}: {status}")


def smoke(args):
    """A seconds-long cold run: 48 MiB of 16 KiB samples on a throttled loop device, with a
    memory limit that holds them. Asserts what the suite relies on: the loaders run under
    the limit without an OOM kill, meshfeed keeps the data (resident), reads it from the
    device once in the first epoch and not at all after, and delivers the same numbers of
    samples as the run that keeps nothing; and a feeder past its memory budget stays within
    its memory limit (``feeder_smoke``)."""
    work = tempfile.mkdtemp(prefix="meshfeed-cold-smoke-")
    disk = LoopFs(os.path.join(work, "shared.img"), os.path.join(work, "shared"), 256 * MiB)
    failures = []
    try:
        data = os.path.join(disk.mnt, "medium-npy")
        gen(data, "npy", "x:u8:16376 label:i64", 3072)
        files = files_in(data)
        nbytes = sum(os.path.getsize(f) for f in files)
        tiny = os.path.join(disk.mnt, "tiny")
        gen(tiny, "npy", "x:u8:64", 400)
        base = base_memory(args.ranks, tiny, 32, disk.dev)
        limit = base + headroom_for(nbytes * 11 // 10, args.ranks)
        cg_args = (disk.dev, 100_000_000, 2000, limit)
        seq = sequential_limit(files, cg_args[:3] + (0,))
        print(f"cold smoke: {nbytes / MiB:.0f} MiB on {disk.loop} ({disk.dev}) throttled to 100 MB/s and 2000 reads/s, "
              f"memory limit {limit / MiB:.0f} MiB; sequential limit {seq['bytes_per_s'] / 1e6:.0f} MB/s")
        if not 0.5 * nbytes <= seq["bytes"] <= 1.5 * nbytes:
            failures.append(f"the sequential read was not counted by the cgroup: {seq}")
        runs = {}
        for name, extra in [("meshfeed", []),
                            ("meshfeed:random-access", ["--read-strategy", "random", "--memory-budget", "0"])]:
            r = measure(name, meshfeed_cmd(args.ranks, data, 256, 3, extra), cg_args, files, meshfeed_epoch, 120)
            runs[name] = r
            show("medium", "npy", "smoke", r, 3072)
            if not r["ok"] or r["oom_kills"] or len(r["epochs"]) != 3:
                failures.append(f"{name}: exit {r['exit']}, OOM kills {r['oom_kills']}, {len(r['epochs'])} epochs")
        e = runs["meshfeed"]["epochs"]
        if len(e) == 3:
            if e[0].get("read_strategy") != "resident":
                failures.append(f"meshfeed did not keep data that fits the limit: {e[0].get('read_reason')}")
            if not e[0]["storage_bytes"] >= 0.9 * nbytes:
                failures.append(f"epoch 0 read {e[0]['storage_bytes']} bytes of {nbytes} from the device")
            later = e[1]["storage_bytes"] + e[2]["storage_bytes"]
            if later > nbytes // 100:
                failures.append(f"epochs 1 and 2 read {later} bytes from the device (resident data: expected none)")
        t = runs["meshfeed:random-access"]["epochs"]
        if len(t) == 3 and len(e) == 3:
            if [x["samples"] for x in t] != [x["samples"] for x in e]:
                failures.append("the two runs delivered different numbers of samples")
            if not t[0]["storage_bytes"] >= 0.9 * nbytes:
                failures.append(f"keeping nothing, epoch 0 read {t[0]['storage_bytes']} bytes of {nbytes} "
                                "from the device")
        feeder_smoke(args, work, data, nbytes, base_memory(1, tiny, 32, disk.dev), disk.dev, failures)
    finally:
        disk.close()
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        for f in failures:
            print(f"cold smoke FAILED: {f}")
        return 1
    print("cold smoke: OK (resident data read from the throttled device once, never after; no OOM kill; "
          "a feeder past its memory budget within its memory limit)")
    return 0


def feeder_smoke(args, work, data, nbytes, base, dev, failures):
    """`meshfeed serve` with a memory budget of half the data, in a memory cgroup of its
    process's own memory (`base`) plus that budget plus 16 MiB, which could not hold all the
    data: it is not OOM-killed, holds some files and reads the others' rows from the
    device as asked, and a job through it delivers every sample of every epoch."""
    budget = nbytes // 2
    limit = base + budget + 16 * MiB
    files = files_in(data)
    rendezvous = os.path.join(work, "d.feeder.json")
    drop_cache(files)
    cg = Cgroups(f"meshfeed-cold-feeder-{os.getpid()}", dev, 100_000_000, 2000, limit)
    cmd = [MESHFEED, "serve", "--data", data, "--memory-budget", str(budget), "--rendezvous", rendezvous, "--json"]
    feeder = subprocess.Popen(cg.prefix() + cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        first = feeder.stdout.readline()
        if not first.startswith("{"):
            why = feeder.stderr.read() if feeder.poll() is not None else ""
            failures.append(f"the feeder did not start: {first}{why}")
            return
        serving = json.loads(first)
        r = measure("meshfeed:feeder", meshfeed_cmd(args.ranks, rendezvous, 256, 3, []), None, [], meshfeed_epoch, 120)
        os.killpg(feeder.pid, signal.SIGTERM)
        out, err = feeder.communicate(timeout=60)
        peak, kills = cg.memory()
    finally:
        if feeder.poll() is None:
            os.killpg(feeder.pid, signal.SIGKILL)
            feeder.wait()
        cg.close()
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    stopped = next((v for v in lines if v.get("kind") == "stopped"), None)
    held, served = serving["held_files"], serving["files"]
    if stopped:
        log(f"  medium npy smoke feeder --memory-budget {budget / MiB:.0f} MiB: held {held} of {served} files "
            f"({stopped['bytes_loaded'] / MiB:.0f} MiB read into memory), {stopped['storage_bytes'] / MiB:.0f} MiB "
            f"read from the device on request over 3 epochs; memory limit {limit / MiB:.0f} MiB, "
            f"peak {peak / MiB:.0f} MiB, OOM kills {kills}")
    if kills or feeder.returncode != 0 or not stopped:
        failures.append(f"feeder: exit {feeder.returncode}, OOM kills {kills}, stopped line {stopped}:\n{err[-2000:]}")
        return
    if not 0 < held < served or stopped["bytes_loaded"] > budget or not stopped["storage_bytes"] > 0:
        failures.append(f"feeder: held {held} of {served} files in a budget of {budget} bytes: {stopped}")
    if not r["ok"] or [e["samples"] for e in r["epochs"]] != [3072] * 3:
        failures.append(f"a job through the feeder: exit {r['exit']}, epochs {[e['samples'] for e in r['epochs']]}")


if __name__ == "__main__":
    sys.exit(main())
