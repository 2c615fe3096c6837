#!/usr/bin/env python3
"""Checks of the Kubernetes launch files under launch/k8s/.

Run as root (the emulation uses mount and UTS namespaces) with the project venv:

    .venv/bin/pip install -q kubernetes-validate      # once; brings PyYAML
    .venv/bin/python tests/launch/check_k8s.py [--meshfeed target/release/meshfeed]

* meshfeed-job.yaml passes `kubernetes-validate --strict` (offline, bundled schemas) for
  Kubernetes 1.30 and for the newest version the installed package bundles, and strict
  validation does reject a typo'd field (so the check has teeth);
* its content: Indexed Job, completions == parallelism == WORLD_SIZE, backoffLimit 0,
  subdomain == the headless Service, MASTER_ADDR == <job>-0.<service>, the token from a
  secretKeyRef, RANK from the completion index, ...;
* entrypoint.sh: index -> RANK mapping, required variables, exit 2 on a bad environment,
  exec of MESHFEED_BIN with the arguments and its exit code;
* emulate.sh with tests/launch/fake_rank.sh as the rank program: 3 pods with their own
  RANK, hostname and a MASTER_ADDR that resolves to 127.0.10.1 in every pod; a pod that
  fails fails the job and the others are killed; the deadline; usage errors.

With `--meshfeed target/release/meshfeed` it also runs the real binary through the
emulation (3 ranks, --transport ucx, --verify; once more with rank 0 starting late).

Ends with `N passed, M failed`; exit 0 only when nothing failed.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "launch", "k8s")
MANIFEST = os.path.join(K8S, "meshfeed-job.yaml")
ENTRYPOINT = os.path.join(K8S, "entrypoint.sh")
EMULATE = os.path.join(K8S, "emulate.sh")
FAKE_RANK = os.path.join(ROOT, "tests", "launch", "fake_rank.sh")
# The oldest Kubernetes the manifest is meant for (podFailurePolicy is on by default
# from 1.26, GA in 1.31); the newest bundled one is checked too.
K8S_VERSIONS = ["1.30.0", None]

TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


def run(cmd, timeout=60, env=None, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kw)


def validator():
    exe = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
    if not os.path.exists(exe):
        exe = shutil.which("kubernetes-validate")
    assert exe, (
        "kubernetes-validate is not installed: "
        f"{os.path.dirname(sys.executable)}/pip install -q kubernetes-validate"
    )
    return exe


def load_manifest():
    import yaml  # PyYAML, a dependency of kubernetes-validate

    with open(MANIFEST) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    return docs, by_kind


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


# ---------------------------------------------------------------- the manifest


@test
def manifest_validates_strict():
    exe = validator()
    for version in K8S_VERSIONS:
        cmd = [exe, "--strict"] + (["-k", version] if version else []) + [MANIFEST]
        r = run(cmd)
        out = r.stdout + r.stderr
        print("   ", " ".join(os.path.basename(c) if c == exe else c for c in cmd[:-1]), "->", r.returncode)
        for line in out.strip().splitlines():
            print("     ", line)
        assert r.returncode == 0, f"kubernetes-validate {version or 'default'} failed:\n{out}"
        assert "ERROR" not in out, out
        passed = re.findall(r"passed for resource (\S+)", out)
        assert sorted(passed) == ["job/meshfeed", "service/meshfeed"], passed


@test
def strict_validation_rejects_a_typo():
    # The check above must be able to fail: a misspelt pod field is an error in strict mode.
    exe = validator()
    with open(MANIFEST) as f:
        text = f.read()
    assert "      subdomain: meshfeed" in text
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text.replace("      subdomain: meshfeed", "      subdomian: meshfeed", 1))
    try:
        r = run([exe, "--strict", "-k", K8S_VERSIONS[0], f.name])
    finally:
        os.unlink(f.name)
    assert r.returncode != 0 and "subdomian" in r.stdout + r.stderr, r.stdout + r.stderr


@test
def manifest_content():
    docs, by_kind = load_manifest()
    assert sorted(by_kind) == ["Job", "Service"], f"documents: {sorted(by_kind)}"
    (svc,) = by_kind["Service"]
    (job,) = by_kind["Job"]
    service, job_name = svc["metadata"]["name"], job["metadata"]["name"]
    assert (job_name, service) == ("meshfeed", "meshfeed"), (job_name, service)

    # Headless Service with the rendezvous port, selecting exactly the Job's pods.
    ss = svc["spec"]
    assert ss["clusterIP"] == "None", ss.get("clusterIP")
    ports = {p["name"]: p for p in ss["ports"]}
    assert ports["rendezvous"]["port"] == 29500, ports
    assert ss.get("publishNotReadyAddresses") is True

    js = job["spec"]
    assert js["completionMode"] == "Indexed"
    assert js["backoffLimit"] == 0
    pod_labels = js["template"]["metadata"]["labels"]
    assert ss["selector"] and all(pod_labels.get(k) == v for k, v in ss["selector"].items()), (
        f"service selector {ss['selector']} does not select the pod labels {pod_labels}"
    )

    pod = js["template"]["spec"]
    assert pod["subdomain"] == service, pod.get("subdomain")
    assert pod["restartPolicy"] == "Never"
    (c,) = pod["containers"]
    assert c["image"] == "meshfeed:latest"
    env = env_of(c)

    world = env["WORLD_SIZE"]["value"]
    assert isinstance(world, str), "env values must be strings"
    assert js["completions"] == js["parallelism"] == int(world), (
        js["completions"], js["parallelism"], world)
    assert env["MASTER_ADDR"]["value"] == f"{job_name}-0.{service}", env["MASTER_ADDR"]
    assert env["MASTER_PORT"]["value"] == str(ports["rendezvous"]["port"]), env["MASTER_PORT"]
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"), env["RANK"]
    ref = env["MESHFEED_JOB_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == ("meshfeed-token", "token"), ref
    assert "value" not in env["MESHFEED_JOB_TOKEN"]
    assert env["UCX_TLS"]["value"] == "tcp"
    # The job id is the Job's own uid, so that a new Job refuses the old one's ranks.
    assert env["MESHFEED_JOB_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['batch.kubernetes.io/controller-uid']"), env["MESHFEED_JOB_ID"]

    # Command: the entrypoint, then `run --transport ucx ...` reading /data.
    assert c["command"][-1].endswith("launch/k8s/entrypoint.sh"), c["command"]
    assert c["args"][:3] == ["run", "--transport", "ucx"], c["args"]
    assert "/data" in c["args"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert "persistentVolumeClaim" in vols[mounts["/data"]], vols
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    ports_c = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports_c["rendezvous"] == 29500

    # The Secret is documented (kubectl line) but not applied with a placeholder value.
    with open(MANIFEST) as f:
        text = f.read()
    assert "kubectl create secret generic meshfeed-token" in text


# ---------------------------------------------------------------- entrypoint.sh


def entry(env, args=(), bin_=None):
    e = {"PATH": os.environ["PATH"]}
    e.update(env)
    if bin_:
        e["MESHFEED_BIN"] = bin_
    return run([ENTRYPOINT, *args], env=e, timeout=20)


GOOD = {"WORLD_SIZE": "4", "MASTER_ADDR": "meshfeed-0.meshfeed", "MASTER_PORT": "29500",
        "MESHFEED_JOB_TOKEN": "s3cret"}


@test
def entrypoint_maps_index_and_execs():
    with tempfile.TemporaryDirectory() as d:
        prog = os.path.join(d, "prog")
        with open(prog, "w") as f:
            f.write('#!/bin/sh\necho "RANK=$RANK WORLD_SIZE=$WORLD_SIZE ARGS=$*"\nexit 7\n')
        os.chmod(prog, 0o755)
        r = entry({**GOOD, "JOB_COMPLETION_INDEX": "2"}, ["run", "--transport", "ucx", "a b"], prog)
        assert r.returncode == 7, (r.returncode, r.stderr)  # exec: the program's exit code
        assert r.stdout.strip() == "RANK=2 WORLD_SIZE=4 ARGS=run --transport ucx a b", r.stdout
        # RANK, when set (as the manifest sets it), wins over the index.
        r = entry({**GOOD, "JOB_COMPLETION_INDEX": "2", "RANK": "3"}, [], prog)
        assert r.stdout.startswith("RANK=3 "), r.stdout
        assert "s3cret" not in r.stdout + r.stderr


@test
def entrypoint_rejects_a_bad_environment():
    cases = [
        ({k: v for k, v in GOOD.items() if k != "MESHFEED_JOB_TOKEN"} | {"RANK": "0"}, "MESHFEED_JOB_TOKEN"),
        ({"RANK": "0"}, "WORLD_SIZE MASTER_ADDR MASTER_PORT MESHFEED_JOB_TOKEN"),
        (GOOD, "neither RANK nor JOB_COMPLETION_INDEX"),
        (GOOD | {"JOB_COMPLETION_INDEX": "4"}, "out of range"),
        (GOOD | {"RANK": "x"}, "RANK must be"),
        (GOOD | {"RANK": "0", "MASTER_PORT": "70000"}, "MASTER_PORT"),
    ]
    for env, needle in cases:
        r = entry(env, ["run"], "/bin/true")
        assert r.returncode == 2, (env, r.returncode, r.stderr)
        assert needle in r.stderr and r.stderr.startswith("meshfeed entrypoint: "), (env, r.stderr)
        assert "s3cret" not in r.stderr


# ---------------------------------------------------------------- emulate.sh


def emulate(n, args, timeout=60, opts=(), extra_env=None):
    env = dict(os.environ)
    for k in ("RANK", "MASTER_PORT", "MESHFEED_JOB_TOKEN"):
        env.pop(k, None)
    env["MESHFEED_BIN"] = FAKE_RANK
    env["RANK"] = "99"  # a stray RANK in the caller's environment must not reach the pods
    env.update(extra_env or {})
    t0 = time.monotonic()
    r = run([EMULATE, "-n", str(n), *opts, "--", *args], timeout=timeout, env=env)
    return r, time.monotonic() - t0


def pod_reports(stdout):
    """{pod name: {key: value}} from the `[meshfeed-i] key=value` lines."""
    pods = {}
    for line in stdout.splitlines():
        m = re.match(r"\[(meshfeed-\d+)\] (\w+)=(.*)$", line)
        if m:
            pods.setdefault(m[1], {})[m[2]] = m[3]
    return pods


def need_root():
    assert os.geteuid() == 0, "emulate.sh needs root (unshare --mount --uts); run this check as root"


@test
def emulate_three_pods():
    need_root()
    with open("/etc/hosts") as f:
        hosts_before = f.read()
    host_before = os.uname().nodename
    r, secs = emulate(3, ["run", "--transport", "ucx", "--data", "/data"])
    print(f"    3 pods in {secs:.2f} s")
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "job succeeded: 3 pod(s)" in r.stderr, r.stderr
    pods = pod_reports(r.stdout)
    assert sorted(pods) == ["meshfeed-0", "meshfeed-1", "meshfeed-2"], sorted(pods)
    for i in range(3):
        p = pods[f"meshfeed-{i}"]
        print(f"    meshfeed-{i}: rank={p['rank']} hostname={p['hostname']} "
              f"{p['master_addr']} -> {p['master_resolved']}, own name -> {p['self_resolved']}")
        assert p["rank"] == p["index"] == str(i), p
        assert p["world_size"] == "3", p
        assert p["hostname"] == f"meshfeed-{i}", p
        assert p["master_addr"] == "meshfeed-0.meshfeed", p
        assert p["master_resolved"] == "127.0.10.1", p
        assert p["self_resolved"] == f"127.0.10.{i + 1}", p
        assert p["ucx_tls"] == "tcp", p
        assert p["args"] == "run --transport ucx --data /data", p
    assert len({p["master_port"] for p in pods.values()}) == 1
    assert int(pods["meshfeed-0"]["master_port"]) > 0
    assert len({p["token_sha"] for p in pods.values()}) == 1  # one shared (random) token
    # The host is untouched: the hostname and /etc/hosts were changed only inside the pods.
    assert os.uname().nodename == host_before
    with open("/etc/hosts") as f:
        assert f.read() == hosts_before


@test
def emulate_given_port_token_and_log_dir():
    need_root()
    token = "given-token"
    with tempfile.TemporaryDirectory() as d:
        r, _ = emulate(2, ["run"], opts=["-p", "29555", "-o", d], extra_env={"MESHFEED_JOB_TOKEN": token})
        assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert not re.search(r"^\[meshfeed-", r.stdout + r.stderr, re.M), "pod output not in the log dir"
        assert sorted(os.listdir(d)) == [f"meshfeed-{i}.{x}" for i in (0, 1) for x in ("err", "out")]
        want = hashlib.sha256(token.encode()).hexdigest()[:16]
        for i in (0, 1):
            with open(os.path.join(d, f"meshfeed-{i}.out")) as f:
                p = dict(line.split("=", 1) for line in f.read().splitlines() if "=" in line)
            assert p["rank"] == str(i) and p["master_port"] == "29555" and p["token_sha"] == want, p
        assert token not in r.stdout + r.stderr


@test
def emulate_failed_pod_fails_the_job():
    need_root()
    with tempfile.TemporaryDirectory() as d:
        nap = 5  # the healthy pods' run time: they must be killed well before it ends
        r, secs = emulate(3, ["run", "--markers", d, "--fail-rank", "1", "--sleep", str(nap)], timeout=60)
        print(f"    failed in {secs:.2f} s")
        assert r.returncode != 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert "pod meshfeed-1 failed with exit status 3" in r.stderr, r.stderr
        assert secs < nap - 1, f"took {secs:.1f} s: the other pods were not killed"
        started = sorted(f for f in os.listdir(d) if f.startswith("started-"))
        assert started == ["started-0", "started-1", "started-2"], started
        pids = [int(open(os.path.join(d, f"started-{i}")).read()) for i in (0, 2)]
        time.sleep(nap + 1 - secs)  # past the --sleep: a surviving pod would have written its marker
        done = sorted(f for f in os.listdir(d) if f.startswith("done-"))
        assert done == [], f"pods survived the failure: {done}"
        for pid in pids:
            assert not alive(pid), f"pod process {pid} still running"


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@test
def emulate_deadline_kills_the_pods():
    need_root()
    with tempfile.TemporaryDirectory() as d:
        r, secs = emulate(2, ["run", "--markers", d, "--sleep", "30"], opts=["-t", "1"])
        assert r.returncode == 1, (r.returncode, r.stderr)
        assert "deadline of 1s exceeded" in r.stderr, r.stderr
        assert secs < 8, secs
        assert not [f for f in os.listdir(d) if f.startswith("done-")]


@test
def emulate_usage_errors():
    for opts in ([], ["-n", "0"], ["-n", "x"], ["-n", "2", "-t", "soon"], ["-z"]):
        r = run([EMULATE, *opts, "--", "run"], timeout=20)
        assert r.returncode == 2 and r.stderr.startswith("emulate.sh: "), (opts, r.returncode, r.stderr)
    r = run([EMULATE, "-h"], timeout=20)
    assert r.returncode == 0 and "Usage" in r.stdout


REAL_BIN = None  # --meshfeed PATH


def real_meshfeed_through_emulation():
    """Opt-in (--meshfeed PATH): the real binary, 3 pods over UCX, verified; then again
    with rank 0 starting 2 s late, as a pod may on Kubernetes (its DNS name and rendezvous
    do not exist yet when the other ranks start)."""
    need_root()
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "data")
        r = run([REAL_BIN, "gen", "--format", "npy", "--samples", "3000", "--files", "3",
                 "--field", "x:f32:8", "--field", "y:i64", "--out", data])
        assert r.returncode == 0, r.stderr
        late = os.path.join(d, "late0.sh")
        with open(late, "w") as f:
            f.write(f'#!/bin/sh\n[ "$RANK" = 0 ] && sleep 2\nexec "{REAL_BIN}" "$@"\n')
        os.chmod(late, 0o755)
        args = ["run", "--transport", "ucx", "--data", data, "--batch-size", "48", "--epochs", "2", "--verify"]
        for bin_ in (REAL_BIN, late):
            r, secs = emulate(3, args, timeout=180, opts=["-t", "120"], extra_env={"MESHFEED_BIN": bin_})
            print(f"    {os.path.basename(bin_)}: exit {r.returncode} in {secs:.1f} s")
            assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
            assert "[meshfeed-0] meshfeed: done: 2 epoch(s) on 3 ranks, verified" in r.stdout, r.stdout


def main():
    global REAL_BIN
    if sys.argv[1:2] == ["--meshfeed"] and len(sys.argv) == 3:
        REAL_BIN = os.path.abspath(sys.argv[2])
        TESTS.append(real_meshfeed_through_emulation)
    elif sys.argv[1:]:
        print(f"usage: {sys.argv[0]} [--meshfeed PATH-TO-BINARY]", file=sys.stderr)
        return 2
    passed = failed = 0
    t0 = time.monotonic()
    for fn in TESTS:
        t = time.monotonic()
        try:
            fn()
        except Exception:
            failed += 1
            print(f"FAIL {fn.__name__} ({time.monotonic() - t:.1f} s)")
            print("    " + traceback.format_exc().strip().replace("\n", "\n    "))
        else:
            passed += 1
            print(f"ok   {fn.__name__} ({time.monotonic() - t:.1f} s)")
    print(f"total {time.monotonic() - t0:.1f} s")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
