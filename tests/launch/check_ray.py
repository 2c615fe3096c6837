#!/usr/bin/env python3
"""Checks the Ray launcher, `python -m meshfeed.launch.ray`, with small fake rank
commands (the ranks need no meshfeed).

Run with the Python that has ray and the meshfeed package installed:

    .venv/bin/python tests/launch/check_ray.py

Each case runs the launcher as a subprocess whose ranks are `python -c` snippets.
Prints one line per case and `N passed, M failed` last; exits 0 only if all
passed. Takes about 30 s (each case starts a local Ray instance).
"""

import os
import re
import subprocess
import sys
import tempfile
import time

PY = sys.executable
# The launcher, run as a module of the installed package.
LAUNCHER = [PY, "-m", "meshfeed.launch.ray"]

# A fake rank: installs a SIGTERM handler (writes term-R, prints a line, exits 143),
# prints its contract variables and one line on stderr, writes up-R, then acts on
# argv[1]: "ok" exits 0; "fail1": rank 1 exits 3 0.5 s after all ranks are up and
# the others sleep 60 s, then write marker-R; "sleep": every rank sleeps likewise.
FAKE_RANK = r"""
import os, signal, sys, time
r = int(os.environ["RANK"])
mode, workdir = sys.argv[1], sys.argv[2]
def on_term(*_):
    open(os.path.join(workdir, "term-%d" % r), "w").close()
    print("FAKE rank=%d got SIGTERM" % r, flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
e = os.environ
print("FAKE rank=%s world=%s addr=%s port=%s token=%s pid=%d" % (
    e["RANK"], e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"],
    e["MESHFEED_JOB_TOKEN"], os.getpid()), flush=True)
print("FAKE-ERR rank=%d on stderr" % r, file=sys.stderr, flush=True)
open(os.path.join(workdir, "up-%d" % r), "w").close()
if mode == "ok":
    sys.exit(0)
if mode == "fail1" and r == 1:
    # Fail once every rank is up (and so can catch SIGTERM), so the check
    # that the others get SIGTERM does not depend on how fast Ray starts actors.
    n = int(e["WORLD_SIZE"])
    t_end = time.time() + 20
    while time.time() < t_end and not all(
            os.path.exists(os.path.join(workdir, "up-%d" % i)) for i in range(n)):
        time.sleep(0.05)
    time.sleep(0.5)
    sys.exit(3)
if mode in ("fail1", "sleep"):
    time.sleep(60)
    open(os.path.join(workdir, "marker-%d" % r), "w").close()
    sys.exit(0)
sys.exit(99)
"""

LINE_RE = re.compile(
    r"^\[rank (\d+)\] FAKE rank=(\d+) world=(\d+) addr=(\S+) port=(\d+) token=(\S*) pid=(\d+)$",
    re.M,
)


def launch(args, env_extra=None, timeout=60):
    env = dict(os.environ)
    env.pop("MESHFEED_JOB_TOKEN", None)
    env.update(env_extra or {})
    t0 = time.monotonic()
    p = subprocess.run(
        LAUNCHER + args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        timeout=timeout,
        text=True,
    )
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


def fake(mode, workdir):
    return ["--", PY, "-c", FAKE_RANK, mode, workdir]


def rank_lines(out):
    """rank -> dict of the fake rank's printed variables."""
    got = {}
    for m in LINE_RE.finditer(out):
        pre, rank, world, addr, port, token, pid = m.groups()
        got[int(rank)] = dict(prefix=int(pre), world=world, addr=addr, port=port,
                              token=token, pid=int(pid))
    return got


def alive(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return b"FAKE rank=" in f.read()
    except OSError:
        return False


class Failed(Exception):
    pass


def check(cond, what, out="", err=""):
    if not cond:
        msg = what
        if out or err:
            msg += "\n--- launcher stdout ---\n%s--- launcher stderr (tail) ---\n%s" % (
                out, "\n".join(err.splitlines()[-15:]))
        raise Failed(msg)


def case_all_succeed(workdir):
    rc, out, err, dt = launch(["-n", "3"] + fake("ok", workdir))
    check(rc == 0, "exit code %d, expected 0" % rc, out, err)
    got = rank_lines(out)
    check(sorted(got) == [0, 1, 2], "expected lines of ranks 0,1,2, got %s" % sorted(got), out, err)
    for r, v in got.items():
        check(v["prefix"] == r, "line of RANK=%d has prefix [rank %d]" % (r, v["prefix"]), out, err)
        check(v["world"] == "3", "rank %d: WORLD_SIZE=%s" % (r, v["world"]), out, err)
        check(v["addr"] == "127.0.0.1", "rank %d: MASTER_ADDR=%s" % (r, v["addr"]), out, err)
    tokens = {v["token"] for v in got.values()}
    ports = {v["port"] for v in got.values()}
    check(len(tokens) == 1, "tokens differ across ranks: %s" % tokens, out, err)
    check(re.fullmatch(r"[0-9a-f]{32}", tokens.pop() or "") is not None, "token is not 32 hex chars", out, err)
    check(len(ports) == 1 and 0 < int(ports.pop()) < 65536, "ports differ or invalid", out, err)
    for r in range(3):
        check("[rank %d] FAKE-ERR rank=%d on stderr\n" % (r, r) in out,
              "rank %d's stderr line not on the launcher's stdout" % r, out, err)
    check(out.rstrip("\n").endswith("ray_launch: all 3 ranks succeeded"),
          "missing final 'ray_launch: all 3 ranks succeeded'", out, err)
    return "%.1f s" % dt


def case_rank_fails(workdir):
    rc, out, err, dt = launch(["-n", "3"] + fake("fail1", workdir))
    check(rc != 0, "exit code 0, expected non-zero", out, err)
    check(rc == 3, "exit code %d, expected rank 1's code 3" % rc, out, err)
    # The others sleep 60 s: a launcher that stops them is done well before (Ray's start
    # and the placement group take their share on a loaded machine).
    check(dt < 40, "launcher took %.1f s to stop the job (limit 40 s)" % dt, out, err)
    check("ray_launch: rank 1 exited with code 3; stopping the job" in out,
          "missing 'ray_launch: rank 1 exited with code 3; stopping the job'", out, err)
    check("all 3 ranks succeeded" not in out, "claims success", out, err)
    got = rank_lines(out)
    check(sorted(got) == [0, 1, 2], "expected lines of ranks 0,1,2, got %s" % sorted(got), out, err)
    time.sleep(1.0)
    for r in (0, 2):
        check(not alive(got[r]["pid"]), "rank %d (pid %d) still running after the launcher exited"
              % (r, got[r]["pid"]), out, err)
        check(not os.path.exists(os.path.join(workdir, "marker-%d" % r)),
              "rank %d wrote its marker: it was not stopped" % r, out, err)
        # Ray also SIGKILLs a dead worker's children; SIGTERM shows the launcher stopped it.
        check(os.path.exists(os.path.join(workdir, "term-%d" % r)),
              "rank %d was not sent SIGTERM" % r, out, err)
        check("[rank %d] FAKE rank=%d got SIGTERM\n" % (r, r) in out,
              "rank %d's output after SIGTERM was not printed" % r, out, err)
    return "exit %d in %.1f s" % (rc, dt)


def case_timeout_and_given_env(workdir):
    token = "feedfacecafe0123"
    rc, out, err, dt = launch(
        ["-n", "2", "--timeout", "4", "--master-addr", "127.0.0.1", "--master-port", "45678"]
        + fake("sleep", workdir),
        env_extra={"MESHFEED_JOB_TOKEN": token},
    )
    check(rc == 124, "exit code %d, expected 124 (timeout)" % rc, out, err)
    check(re.search(r"^ray_launch: timeout after 4 s .*stopping the job$", out, re.M) is not None,
          "missing the timeout message", out, err)
    got = rank_lines(out)
    check(sorted(got) == [0, 1], "expected lines of ranks 0,1, got %s" % sorted(got), out, err)
    for r, v in got.items():
        check(v["token"] == token, "rank %d: token %s, expected the preset %s" % (r, v["token"], token), out, err)
        check(v["port"] == "45678", "rank %d: port %s, expected 45678" % (r, v["port"]), out, err)
    time.sleep(0.5)
    for r, v in got.items():
        check(not alive(v["pid"]), "rank %d still running after the timeout" % r, out, err)
        check(os.path.exists(os.path.join(workdir, "term-%d" % r)),
              "rank %d was not sent SIGTERM" % r, out, err)
    return "%.1f s" % dt


def case_placement_that_cannot_be_met(workdir):
    # 3 ranks of 1 CPU, all on one node, on a 2-CPU instance: the placement group can
    # never be placed; the launcher says so and exits 124 at its timeout, having started
    # no rank.
    rc, out, err, dt = launch(["-n", "3", "--num-cpus", "2", "--strategy", "STRICT_PACK", "--timeout", "4"]
                              + fake("ok", workdir))
    check(rc == 124, "exit code %d, expected 124" % rc, out, err)
    check("ray_launch: timeout after 4 s waiting to place 3 ranks (1 CPUs each, STRICT_PACK)" in out,
          "missing the placement message", out, err)
    check(not rank_lines(out) and not os.listdir(workdir), "a rank started", out, err)
    # Without reservations (--cpus-per-rank 0) there is no placement group: they all run.
    rc, out, err, dt = launch(["-n", "3", "--num-cpus", "2", "--cpus-per-rank", "0"] + fake("ok", workdir))
    check(rc == 0 and sorted(rank_lines(out)) == [0, 1, 2], "exit code %d without reservations" % rc, out, err)
    check(len(re.findall(r"^ray_launch: rank \d on node ", out, re.M)) == 3, "missing the ranks' nodes", out, err)
    return ""


def case_bad_command_line(workdir):
    rc, out, err, dt = launch(["-n", "2"])
    check(rc == 2, "no COMMAND: exit code %d, expected 2" % rc, out, err)
    rc, out, err, dt = launch(["-n", "0", "--", PY, "-c", "pass"])
    check(rc == 2, "-n 0: exit code %d, expected 2" % rc, out, err)
    rc, out, err, dt = launch(["-n", "2", "--strategy", "EVERYWHERE", "--", PY, "-c", "pass"])
    check(rc == 2 and "invalid choice: 'EVERYWHERE'" in err, "--strategy EVERYWHERE: exit code %d" % rc, out, err)
    return ""


CASES = [
    ("bad command line exits 2", case_bad_command_line),
    ("3 ranks succeed with consistent env", case_all_succeed),
    ("rank 1 fails -> job stopped, others killed", case_rank_fails),
    ("timeout; preset token and port honoured", case_timeout_and_given_env),
    ("a placement that cannot be met times out; none without reservations", case_placement_that_cannot_be_met),
]


def main():
    try:
        import importlib.util

        found = importlib.util.find_spec("meshfeed.launch.ray") is not None
    except ImportError:
        found = False
    if not found:
        print("launcher not found: meshfeed.launch.ray (pip install ./python into %s's environment)" % PY)
        print("0 passed, 1 failed")
        return 1
    t0 = time.monotonic()
    passed = failed = 0
    for name, fn in CASES:
        with tempfile.TemporaryDirectory(prefix="check_ray.") as workdir:
            try:
                note = fn(workdir)
                passed += 1
                print("ok   %s%s" % (name, " (%s)" % note if note else ""), flush=True)
            except subprocess.TimeoutExpired as e:
                failed += 1
                print("FAIL %s: launcher did not finish within %s s" % (name, e.timeout), flush=True)
            except Failed as e:
                failed += 1
                print("FAIL %s: %s" % (name, e), flush=True)
    print("total %.1f s" % (time.monotonic() - t0))
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
