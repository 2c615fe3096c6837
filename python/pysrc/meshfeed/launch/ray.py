"""Launch a meshfeed job on Ray: one Ray actor per rank, on a local Ray instance
or on a running (multi-node) Ray cluster.

Usage
-----

    python -m meshfeed.launch.ray -n N [--address local|auto|HOST:PORT]
        [--cpus-per-rank C] [--strategy SPREAD|PACK|STRICT_SPREAD|STRICT_PACK]
        [--master-addr ADDR] [--master-port 0] [--num-cpus C] [--timeout SECONDS]
        [--split-stderr] -- COMMAND [ARGS...]

for example, on a Ray cluster (run on one of its nodes, e.g. the head):

    python -m meshfeed.launch.ray -n 8 --address auto -- \\
        meshfeed run --transport ucx --data /shared/ds --batch-size 1024

``--address local`` (the default) starts a Ray instance of its own on loopback,
with ``num_cpus = --num-cpus`` (default ``max(N × cpus per rank, 2)``), no
dashboard, ``RAY_AUTH_MODE=disabled`` and usage statistics off. ``--address auto``
(the cluster this node belongs to: ``RAY_ADDRESS`` or the local node's) or
``--address HOST:PORT`` (a head node's GCS) joins a running cluster instead; the
launcher never runs ``ray stop`` and leaves a cluster it joined running.

The ranks are placed with a placement group of one bundle per rank, each bundle
reserving ``--cpus-per-rank`` CPUs (default 1; 0 reserves nothing, and then
takes no placement group: any N fits anywhere), with ``--strategy`` (default
``SPREAD``: the ranks spread over the cluster's nodes as evenly as Ray can;
``PACK`` fills nodes first; the ``STRICT_`` forms fail rather than bend). The
launcher waits for the group to be placed (up to ``--timeout``), then creates
actor ``r`` in bundle ``r``. Actor ``r`` runs COMMAND as a subprocess in the
launcher's working directory (which must exist on every node) with the
launcher's environment plus

    RANK=r  WORLD_SIZE=N  MASTER_ADDR=<rank 0's node address>  MASTER_PORT=<port>
    MESHFEED_JOB_TOKEN=<secret shared by the job's ranks>
    MESHFEED_JOB_ID=<this launch's identity>

which is the contract of a meshfeed rank started without mpirun (rank 0 hosts the
TCP rendezvous at MASTER_ADDR:MASTER_PORT). On a cluster, MASTER_ADDR is the
Ray node address of the node rank 0's actor landed on; on a private instance,
127.0.0.1 (``--master-addr`` overrides either).
``--master-port 0`` (the default) picks a free port on rank 0's node, by binding
port 0 there just before the ranks start. Each rank's first line of output is
``ray_launch: rank R on node ADDR``.
The token is ``$MESHFEED_JOB_TOKEN`` when that is set, else
``secrets.token_hex(16)`` (32 hex characters). The job id is a fresh
``secrets.token_hex(16)`` for every launch, whatever the environment holds: rank 0
refuses a rank of another job that shares the token and port.

Output
------

Each actor reads its subprocess's output line by line in a background thread;
the launcher polls every actor (``RankRunner.poll``, which returns the lines
gathered so far, waiting up to 0.5 s for some) and prints each line as soon as
it arrives, prefixed with ``[rank r] ``. By default a rank's stderr is merged into
its stdout (order within a rank is preserved) and everything goes to the
launcher's stdout; with ``--split-stderr`` a rank's stderr lines go to the
launcher's stderr instead. The launcher's own messages are lines starting with
``ray_launch: `` on stdout. Ray's own diagnostics, if any, go to stderr.

Failure semantics
-----------------

* When every rank exits 0, the launcher prints
  ``ray_launch: all N ranks succeeded`` and exits 0.
* As soon as any rank exits non-zero, it prints
  ``ray_launch: rank R exited with code C; stopping the job`` (a rank killed by
  signal S is reported as code 128+S, after a line naming the signal; a command
  that cannot be executed is reported as code 127), stops the other ranks
  (SIGTERM to each rank's process group, SIGKILL after 5 s), prints what they
  wrote meanwhile, kills the actors, shuts Ray down and exits with C.
* If a rank's actor dies (its Ray worker crashed), that is a failure with code 1.
* After ``--timeout`` seconds (default 600; 0 = none; counted from when Ray is
  up and the actors are being created) the job is stopped the same
  way and the launcher exits 124.
* On SIGINT or SIGTERM the job is stopped the same way and the launcher exits
  130 or 143.
* A bad command line exits 2 (argparse's message on stderr); Ray failing to
  start prints ``ray_launch: error: cannot start Ray: ...`` and exits 1.

Each rank runs in a session (process group) of its own, so stopping a rank also
stops any processes it started, and it gets SIGKILL if its actor's process dies
(Linux parent-death signal), so a crashed launcher leaves no rank behind.

It needs Ray (``pip install ray``) in the Python that runs it, and imports it only when
run; the ranks need nothing of it.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import FrameType, ModuleType
from typing import IO, Any, Optional

__all__ = ["main", "parse_args", "RankRunner"]

#: A rank's output: (from its stderr, the line without its end).
Line = tuple[bool, str]

POLL_WAIT_S = 0.5  # how long one RankRunner.poll waits for output
TERM_GRACE_S = 5.0  # SIGTERM -> SIGKILL delay when stopping ranks
EXIT_TIMEOUT = 124

# Run in front of COMMAND by every rank: asks Linux to SIGKILL the rank when
# the actor process that started it dies, then execs COMMAND (argv[2:]).
_EXEC_SHIM = r"""
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
except Exception:
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(137)  # the actor died before prctl took effect
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as e:
    sys.stderr.write("ray_launch: cannot execute %r: %s\n" % (sys.argv[2], e.strerror))
    sys.exit(127)
"""


class RankRunner:
    """Ray actor body: runs one rank's subprocess and buffers its output lines."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.lines: collections.deque[Line] = collections.deque()
        self.cond = threading.Condition()
        self.readers: list[threading.Thread] = []
        self.exit_seen_at: Optional[float] = None

    def node(self) -> str:
        """The id of the Ray node this actor runs on."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def free_port(self) -> int:
        """A TCP port free now on this actor's node."""
        return free_port("")

    def start(self, argv: list[str], env: dict[str, str], cwd: str, split_stderr: bool) -> Optional[str]:
        shim = [sys.executable, "-c", _EXEC_SHIM, str(os.getpid())]
        try:
            self.proc = subprocess.Popen(
                shim + list(argv),
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE if split_stderr else subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            return "cannot start rank %d: %s" % (self.rank, e)
        streams: list[tuple[Optional[IO[bytes]], bool]] = [(self.proc.stdout, False)]
        if split_stderr:
            streams.append((self.proc.stderr, True))
        for pipe, is_err in streams:
            assert pipe is not None  # both are PIPE
            t = threading.Thread(target=self._read, args=(pipe, is_err), daemon=True)
            t.start()
            self.readers.append(t)
        return None

    def _read(self, pipe: IO[bytes], is_err: bool) -> None:
        for raw in iter(pipe.readline, b""):
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            with self.cond:
                self.lines.append((is_err, text))
                self.cond.notify_all()
        pipe.close()
        with self.cond:
            self.cond.notify_all()

    def _drain(self, max_lines: int = 20000) -> list[Line]:
        out: list[Line] = []
        while self.lines and len(out) < max_lines:
            out.append(self.lines.popleft())
        return out

    def _exit_code(self) -> Optional[int]:
        """The exit code once the process exited and its output was read
        (or 2 s after exit if a leftover child keeps the pipe open)."""
        if self.proc is None:
            return None
        rc = self.proc.poll()
        if rc is None:
            return None
        now = time.monotonic()
        if self.exit_seen_at is None:
            self.exit_seen_at = now
        if any(t.is_alive() for t in self.readers) and now - self.exit_seen_at < 2.0:
            return None
        return rc

    def poll(self, wait_s: float) -> tuple[list[Line], Optional[int]]:
        """Returns (lines, exit code or None); waits up to wait_s for either."""
        deadline = time.monotonic() + wait_s
        with self.cond:
            while True:
                if self.lines:
                    break
                rc = self._exit_code()
                if rc is not None:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(min(left, 0.1))
            rc = self._exit_code() if not self.lines else None
            return self._drain(), rc

    def stop(self, grace_s: float) -> tuple[list[Line], Optional[int]]:
        """SIGTERM the rank's process group, SIGKILL after grace_s; returns
        (remaining lines, exit code)."""
        if self.proc is None:
            return [], None
        pgid = self.proc.pid  # start_new_session: the rank leads its own group

        def signal_group(sig: signal.Signals) -> None:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass

        if self.proc.poll() is None:
            signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        signal_group(signal.SIGKILL)  # the rank if still there, and its leftovers
        rc = self.proc.wait()
        for t in self.readers:
            t.join(timeout=1.0)
        with self.cond:
            return self._drain(), rc


def free_port(addr: str) -> int:
    """A port that is free now on addr (on every address if addr is not local)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, 0))
        except OSError:
            s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


class Stop(Exception):
    """Raised by the SIGINT/SIGTERM handler."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def say(msg: str) -> None:
    sys.stdout.write("ray_launch: %s\n" % msg)
    sys.stdout.flush()


def emit(rank: int, lines: list[Line]) -> None:
    if not lines:
        return
    out: list[str] = []
    err: list[str] = []
    for is_err, text in lines:
        (err if is_err else out).append("[rank %d] %s\n" % (rank, text))
    if out:
        sys.stdout.write("".join(out))
        sys.stdout.flush()
    if err:
        sys.stderr.write("".join(err))
        sys.stderr.flush()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m meshfeed.launch.ray",
        description="Run N ranks of COMMAND as Ray actors, on a local Ray instance or a Ray cluster.",
        usage="%(prog)s -n N [options] -- COMMAND [ARGS...]",
    )
    p.add_argument("-n", "--np", dest="n", type=int, required=True, help="number of ranks")
    p.add_argument("--address", default="local",
                   help="local (start a private Ray), auto (the running cluster) or HOST:PORT of a head node")
    p.add_argument("--cpus-per-rank", type=float, default=1.0,
                   help="CPUs each rank's bundle reserves (default 1; 0: no placement group)")
    p.add_argument("--strategy", default="SPREAD", choices=["SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK"],
                   help="placement group strategy (default SPREAD)")
    p.add_argument("--master-addr", default=None, help="rendezvous address (default: rank 0's node address)")
    p.add_argument("--master-port", type=int, default=0, help="rendezvous port; 0 picks a free one")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the Ray instance (default max(N, 2))")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the job is stopped; 0 = none")
    p.add_argument("--split-stderr", action="store_true", help="send ranks' stderr lines to stderr")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the rank command, after --")
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error("no COMMAND given (put it after --)")
    if args.n < 1:
        p.error("-n must be at least 1")
    if not 0 <= args.master_port <= 65535:
        p.error("--master-port must be in 0..65535")
    if args.num_cpus is not None and args.num_cpus < 1:
        p.error("--num-cpus must be at least 1")
    if args.cpus_per_rank < 0:
        p.error("--cpus-per-rank must be >= 0")
    if args.timeout < 0:
        p.error("--timeout must be >= 0")
    return args


def run_job(ray: ModuleType, args: argparse.Namespace) -> int:
    """Runs the job on an initialised Ray; returns the launcher's exit code."""
    from ray.exceptions import GetTimeoutError, RayActorError

    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    n = args.n
    token = os.environ.get("MESHFEED_JOB_TOKEN") or __import__("secrets").token_hex(16)
    job_id = __import__("secrets").token_hex(16)
    base_env = dict(os.environ)
    cwd = os.getcwd()
    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None

    def time_left() -> Optional[float]:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    # One bundle per rank, placed as --strategy says; actor r in bundle r.
    pg = None
    Runner = ray.remote(num_cpus=args.cpus_per_rank, max_restarts=0)(RankRunner)
    if args.cpus_per_rank > 0:
        pg = placement_group([{"CPU": args.cpus_per_rank}] * n, strategy=args.strategy)
        ready, _ = ray.wait([pg.ready()], timeout=time_left())
        if not ready:
            remove_placement_group(pg)
            say("timeout after %g s waiting to place %d ranks (%g CPUs each, %s): the cluster has %s"
                % (args.timeout, n, args.cpus_per_rank, args.strategy, ray.cluster_resources().get("CPU", 0)))
            return EXIT_TIMEOUT
        actors = [
            Runner.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=r)).remote(r)
            for r in range(n)
        ]
    else:
        actors = [Runner.remote(r) for r in range(n)]
    finished: dict[int, int] = {}  # rank -> exit code
    failure: Optional[tuple[int, int]] = None  # (rank, code)
    code = 0

    def fail_rank(rank: int, rc: int) -> None:
        nonlocal failure, code
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = "signal %d" % -rc
            say("rank %d was killed by %s" % (rank, name))
            rc = 128 - rc
        failure = (rank, rc)
        code = rc
        say("rank %d exited with code %d; stopping the job" % (rank, rc))

    pending: dict[Any, int] = {}  # poll ref -> rank

    def actor_died(rank: int, e: BaseException) -> None:
        first = str(e).strip().splitlines()
        say("rank %d: its actor died: %s" % (rank, first[0] if first else type(e).__name__))
        fail_rank(rank, 1)

    try:
        # Where the actors landed: rank 0's node hosts the rendezvous.
        try:
            node_ids = ray.get([a.node.remote() for a in actors], timeout=time_left())
            port = args.master_port or ray.get(actors[0].free_port.remote(), timeout=time_left())
        except GetTimeoutError:
            say("timeout after %g s while starting the ranks; stopping the job" % args.timeout)
            return EXIT_TIMEOUT  # the finally below stops the actors
        addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        nodes = [addresses.get(i, "?") for i in node_ids]
        for r, addr in enumerate(nodes):
            say("rank %d on node %s" % (r, addr))
        # A private instance is this machine: loopback, as its Ray itself uses.
        master_addr = args.master_addr or ("127.0.0.1" if args.address == "local" else nodes[0])
        starts = []
        for r, a in enumerate(actors):
            env = dict(base_env)
            env.update(
                RANK=str(r),
                WORLD_SIZE=str(n),
                MASTER_ADDR=master_addr,
                MASTER_PORT=str(port),
                MESHFEED_JOB_TOKEN=token,
                MESHFEED_JOB_ID=job_id,
            )
            starts.append(a.start.remote(args.command, env, cwd, args.split_stderr))
        ready, _ = ray.wait(starts, num_returns=n, timeout=time_left())
        ready = set(ready)
        for r, ref in enumerate(starts):
            if ref not in ready:
                continue
            try:
                err = ray.get(ref)
            except RayActorError as e:
                actor_died(r, e)
                break
            if err:
                say(err)
                fail_rank(r, 127)
                break
            pending[actors[r].poll.remote(POLL_WAIT_S)] = r
        if failure is None and len(ready) < n:
            say("timeout after %g s while starting the ranks; stopping the job" % args.timeout)
            code = EXIT_TIMEOUT

        while code == 0 and pending:
            if deadline is not None and time.monotonic() >= deadline:
                say("timeout after %g s with %d of %d ranks still running; stopping the job"
                    % (args.timeout, n - len(finished), n))
                code = EXIT_TIMEOUT
                break
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            if ready:
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
            failed: list[tuple[int, Any]] = []  # (rank, code or exception)
            # Print every ready batch first, then act on the failures.
            for ref in sorted(ready, key=lambda x: pending[x]):
                r = pending.pop(ref)
                try:
                    lines, rc = ray.get(ref)
                except RayActorError as e:
                    failed.append((r, e))
                    continue
                emit(r, lines)
                if rc is None:
                    pending[actors[r].poll.remote(POLL_WAIT_S)] = r
                else:
                    finished[r] = rc
                    if rc != 0:
                        failed.append((r, rc))
            if failed:
                r, what = failed[0]
                if isinstance(what, Exception):
                    actor_died(r, what)
                else:
                    fail_rank(r, what)
        if code == 0:
            say("all %d ranks succeeded" % n)
    except Stop as s:
        say("got %s; stopping the job" % signal.Signals(s.signum).name)
        code = 128 + s.signum
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # Stop every rank that may still run (and leftovers of finished ones).
        # Each actor runs its methods in order, so its stop() comes after any
        # poll() in flight: print those polls' lines first, then stop()'s.
        stops = {a.stop.remote(TERM_GRACE_S): r for r, a in enumerate(actors)}
        for refs in (pending, stops):
            try:
                ready, _ = ray.wait(list(refs), num_returns=len(refs),
                                    timeout=TERM_GRACE_S + POLL_WAIT_S + 5)
            except Exception:
                ready = []
            for ref in sorted(ready, key=lambda x: refs[x]):
                try:
                    lines, _rc = ray.get(ref)
                except Exception:
                    continue
                emit(refs[ref], lines)
        for a in actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        if pg is not None:
            try:
                remove_placement_group(pg)
            except Exception:
                pass
    return code


def main(argv: Optional[list[str]] = None) -> int:
    """Runs the launcher with ``argv`` (default: the command line); returns its exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)

    def on_signal(signum: int, _frame: Optional[FrameType]) -> None:
        raise Stop(signum)

    import logging

    # Must be set before ray is imported.
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError as e:
        say("error: cannot start Ray: %s (pip install ray)" % e)
        return 1

    try:
        if args.address == "local":
            ray.init(
                address="local",
                num_cpus=args.num_cpus or max(math.ceil(args.n * args.cpus_per_rank), 2),
                include_dashboard=False,
                _node_ip_address="127.0.0.1",  # a private instance: keep Ray on loopback
                logging_level=logging.WARNING,
                log_to_driver=True,
                configure_logging=True,
            )
        else:
            # Join the running cluster (this process becomes a driver on this node).
            ray.init(address=args.address, logging_level=logging.WARNING, log_to_driver=True)
    except Exception as e:
        say("error: cannot start Ray: %s" % e)
        return 1
    try:
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        return run_job(ray, args)
    except Stop as s:  # a signal between ray.init and run_job's own handling
        say("got %s; stopping the job" % signal.Signals(s.signum).name)
        return 128 + s.signum
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
