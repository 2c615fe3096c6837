#!/usr/bin/env python3
"""Checks of the Kubernetes launch files under launch/k8s/.

Run as root (the emulation uses mount and UTS namespaces) with the project venv:

    .venv/bin/pip install -q kubernetes-validate      # once; brings PyYAML
    .venv/bin/python tests/launch/check_k8s.py [--meshfeed target/release/meshfeed]

* meshfeed-job.yaml, meshfeed-jobset.yaml and meshfeed-mpijob.yaml: their built-in kinds
  (Service, Job, PersistentVolumeClaim) pass `kubernetes-validate --strict` (offline,
  bundled schemas) for Kubernetes 1.30 and for the newest version the installed package
  bundles; the JobSet and the MPIJob pass their projects' published OpenAPI definitions,
  vendored in tests/k8s-schemas/ (see its README), with the Kubernetes types they refer
  to (the Job and pod templates) resolved to kubernetes-validate's strict schemas of the
  same versions; strict validation does reject a typo'd field and a wrong type (so the
  checks have teeth);
* their content: Indexed Job, completions == parallelism == WORLD_SIZE, exit 75 restarts
  (podFailurePolicy Ignore; JobSet: FailJob + a restart rule that ignores maxRestarts),
  other failures fail, the state on a ReadWriteMany claim every pod mounts,
  MESHFEED_STATE, subdomain == the headless Service, MASTER_ADDR == rank 0's pod, the
  token from a secretKeyRef, RANK from the completion index, mpirun through the
  launcher script with -np == workers x slots, ...;
* entrypoint.sh: index -> RANK mapping, required variables, exit 2 on a bad environment,
  exec of MESHFEED_BIN with the arguments and its exit code; MESHFEED_STATE:
  --checkpoint (meshfeed resumes from the file when it exists), errors for a missing
  directory;
* mpijob-launcher.sh (the state arguments appended to mpirun's command line) and
  mpijob-worker.sh (a SIGTERM passed on to the ranks, sshd stopped after them; run in
  its own PID namespace so that it sees only its own processes);
* emulate.sh with tests/launch/fake_rank.sh as the rank program: 3 pods with their own
  RANK, hostname and a MASTER_ADDR that resolves to 127.0.10.1 in every pod; a pod that
  fails fails the job and the others are killed; the deadline; usage errors; -P: a
  preemption replaces the pods that exit 75 (same index, next EMULATE_ATTEMPT), and a
  pod that ignores SIGTERM is killed after the grace period and fails the job.

With `--meshfeed target/release/meshfeed` it also runs the real binary through the
emulation (3 ranks, --transport ucx, --verify; once more with rank 0 starting late).
With `--only REGEX` it runs only the checks whose names match (e.g. `--only
'validate|reject|content'`: the manifests and their schemas, no root needed).

Ends with `N passed, M failed`; exit 0 only when nothing failed.
"""

import hashlib
import json
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
JOBSET = os.path.join(K8S, "meshfeed-jobset.yaml")
MPIJOB = os.path.join(K8S, "meshfeed-mpijob.yaml")
MANIFESTS = [MANIFEST, JOBSET, MPIJOB]
ENTRYPOINT = os.path.join(K8S, "entrypoint.sh")
MPI_LAUNCHER = os.path.join(K8S, "mpijob-launcher.sh")
MPI_WORKER = os.path.join(K8S, "mpijob-worker.sh")
EMULATE = os.path.join(K8S, "emulate.sh")
SCHEMAS = os.path.join(ROOT, "tests", "k8s-schemas")
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


def load_manifest(path=MANIFEST):
    import yaml  # PyYAML, a dependency of kubernetes-validate

    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    return docs, by_kind


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


# ---------------------------------------------------------------- the manifest


# ------------------------------------------------- schemas of the custom resources

# Custom resources: (apiVersion, kind) -> (published definitions, vendored under
# tests/k8s-schemas/, and the definition of the resource itself).
CRDS = {
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): ("jobset/v1alpha2/swagger.json", "jobset.v1alpha2.JobSet"),
    ("kubeflow.org/v2beta1", "MPIJob"): ("mpi-operator/v2beta1/swagger.json", "v2beta1.MPIJob"),
}
# Kubernetes types the definitions refer to without defining them: mpi-operator's by
# their short Go names, JobSet's by URL into the Kubernetes OpenAPI document. They are
# resolved to kubernetes-validate's (strict) definitions of the Kubernetes version checked.
K8S_SHORT = {
    "v1.ObjectMeta": "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
    "v1.ListMeta": "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta",
    "v1.LabelSelector": "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector",
    "v1.Time": "io.k8s.apimachinery.pkg.apis.meta.v1.Time",
    "v1.PodTemplateSpec": "io.k8s.api.core.v1.PodTemplateSpec",
    "resource.Quantity": "io.k8s.apimachinery.pkg.api.resource.Quantity",
}
K8S_URL = re.compile(
    r"^https://raw\.githubusercontent\.com/kubernetes/kubernetes/refs/tags/v[0-9.]+"
    r"/api/openapi-spec/swagger\.json#/definitions/(io\.k8s\.[A-Za-z0-9_.]+)$")
K8S_DEFS = "https://kubernetes.io/api/_definitions.json"  # $id of kubernetes-validate's
CRD_SCHEMA_ID = "https://meshfeed.invalid/k8s-schemas/"


def k8s_definitions(version):
    """kubernetes-validate's strict _definitions.json for `version` (None: the newest)."""
    from kubernetes_validate import utils

    if version is None:
        version = utils.latest_version()
    return utils.schema_contents(f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version)


def crd_schema(swagger_path, root):
    """The published OpenAPI 2 definitions as one JSON Schema (draft 2020-12) for `root`.

    OpenAPI 2 schemas are JSON Schema with extensions. Changed here: the $refs (local ones
    to $defs, Kubernetes types to kubernetes-validate's definitions, see K8S_SHORT and
    K8S_URL; anything else is an error), and every object schema that lists its
    properties and allows nothing else explicitly gets `additionalProperties: false`: the
    API server prunes (or, with `kubectl --validate=strict`, rejects) fields a structural
    schema does not name, so a misspelt field would otherwise pass unnoticed. x-kubernetes-*
    extensions are annotations to a JSON Schema validator; `default` and `format` too."""
    with open(os.path.join(SCHEMAS, swagger_path)) as f:
        doc = json.load(f)
    assert doc.get("swagger") == "2.0", f"{swagger_path}: not an OpenAPI 2 document"
    local = doc["definitions"]

    def ref(r):
        if r.startswith("#/definitions/"):
            name = r[len("#/definitions/"):]
            if name in local:
                return "#/$defs/" + name
            if name in K8S_SHORT:
                return f"{K8S_DEFS}#/$defs/{K8S_SHORT[name]}"
        m = K8S_URL.match(r)
        if m:
            return f"{K8S_DEFS}#/$defs/{m[1]}"
        raise AssertionError(f"{swagger_path}: unresolvable $ref {r}")

    def schema(node):
        out = dict(node)
        if "$ref" in out:
            out["$ref"] = ref(out["$ref"])
        if "properties" in out:
            out["properties"] = {k: schema(v) for k, v in out["properties"].items()}
            if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
                out["additionalProperties"] = False
        if isinstance(out.get("additionalProperties"), dict):
            out["additionalProperties"] = schema(out["additionalProperties"])
        if "items" in out:
            out["items"] = schema(out["items"])
        return out

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": CRD_SCHEMA_ID + swagger_path,
        "$defs": {k: schema(v) for k, v in local.items()},
        "$ref": "#/$defs/" + root,
    }


def crd_errors(doc, version):
    """Schema errors of custom resource `doc` (empty: valid), as 'path: message' lines."""
    import jsonschema
    from referencing import Registry, Resource

    path, root = CRDS[(doc["apiVersion"], doc["kind"])]
    schema = crd_schema(path, root)
    registry = Registry().with_resources([
        (K8S_DEFS, Resource.from_contents(k8s_definitions(version))),
        (schema["$id"], Resource.from_contents(schema)),
    ])
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                  for e in validator.iter_errors(doc))


def validate_file(path, version):
    """kubernetes-validate --strict on every built-in kind of `path`, the vendored
    schemas on its custom resources. Returns ("kind/name", ...) of what passed."""
    exe = validator()
    cmd = [exe, "--strict"] + (["-k", version] if version else []) + [path]
    r = run(cmd)
    out = r.stdout + r.stderr
    name = os.path.basename(path)
    print(f"    {name}: kubernetes-validate --strict -k {version or 'newest'} -> {r.returncode}")
    assert r.returncode == 0, f"kubernetes-validate {version or 'default'} failed on {name}:\n{out}"
    assert "ERROR" not in out, out
    passed = re.findall(r"passed for resource (\S+)", out)
    # What kubernetes-validate has no schema for must be a custom resource checked below.
    skipped = re.findall(r"Couldn't find schema for kind (\S+) with api version (\S+)", out)
    docs, _ = load_manifest(path)
    for kind, api in skipped:
        assert (api, kind) in CRDS, f"{name}: {kind} ({api}) is validated by nothing"
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRDS:
            errors = crd_errors(doc, version)
            assert not errors, f"{name}: {doc['kind']} fails its schema:\n" + "\n".join(errors)
            passed.append(f"{doc['kind'].lower()}/{doc['metadata']['name']}")
    print(f"      passed: {' '.join(sorted(passed))}")
    return sorted(passed)


@test
def manifests_validate_strict():
    want = {
        MANIFEST: ["job/meshfeed", "persistentvolumeclaim/meshfeed-state", "service/meshfeed"],
        JOBSET: ["jobset/meshfeed-jobset", "persistentvolumeclaim/meshfeed-jobset-state"],
        MPIJOB: ["mpijob/meshfeed-mpi", "persistentvolumeclaim/meshfeed-mpi-state"],
    }
    for version in K8S_VERSIONS:
        for path in MANIFESTS:
            assert validate_file(path, version) == want[path], path


def mutated(path, old, new):
    """The text of `path` with `old` (which must occur) replaced once by `new`."""
    with open(path) as f:
        text = f.read()
    assert old in text, f"{old!r} not in {path}"
    return text.replace(old, new, 1)


@test
def strict_validation_rejects_a_typo():
    # The check above must be able to fail: a misspelt pod field is an error in strict mode.
    exe = validator()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(mutated(MANIFEST, "      subdomain: meshfeed", "      subdomian: meshfeed"))
    try:
        r = run([exe, "--strict", "-k", K8S_VERSIONS[0], f.name])
    finally:
        os.unlink(f.name)
    assert r.returncode != 0 and "subdomian" in r.stdout + r.stderr, r.stdout + r.stderr


@test
def crd_schemas_reject_broken_manifests():
    # Each mutation must make the custom resource fail its schema, naming the culprit:
    # a misspelt field of the resource itself, a wrong type, and a misspelt field deep in
    # the embedded Kubernetes template (so the Kubernetes references are resolved, strictly).
    import yaml

    cases = [
        (JOBSET, "    maxRestarts: 3", "    maxRestart: 3", "maxRestart"),
        (JOBSET, "    maxRestarts: 3", '    maxRestarts: "3"',
         "spec.failurePolicy.maxRestarts: '3' is not of type 'integer'"),
        (JOBSET, "          backoffLimit: 0", "          backofLimit: 0", "backofLimit"),
        (JOBSET, "              terminationGracePeriodSeconds: 30",
         "              terminationGracePeriodSecond: 30", "terminationGracePeriodSecond"),
        (MPIJOB, "  slotsPerWorker: 1", "  slotPerWorker: 1", "slotPerWorker"),
        (MPIJOB, "    backoffLimit: 6", "    backoffLimit: six",
         "spec.runPolicy.backoffLimit: 'six' is not of type 'integer'"),
        (MPIJOB, "          enableServiceLinks: false", "          enableServiceLink: false", "enableServiceLink"),
    ]
    for path, old, new, needle in cases:
        docs = [d for d in yaml.safe_load_all(mutated(path, old, new)) if d]
        (doc,) = [d for d in docs if (d["apiVersion"], d["kind"]) in CRDS]
        errors = "\n".join(crd_errors(doc, K8S_VERSIONS[0]))
        assert needle in errors, f"{os.path.basename(path)} with {new.strip()!r}: {errors or 'no error'}"


def state_claim(by_kind, name):
    """The file's PersistentVolumeClaim `name`: the state volume, writable and shared."""
    claims = {c["metadata"]["name"]: c for c in by_kind["PersistentVolumeClaim"]}
    assert list(claims) == [name], list(claims)
    # Every pod, on whatever node, reads it; rank 0, wherever it runs, writes it.
    assert claims[name]["spec"]["accessModes"] == ["ReadWriteMany"], claims[name]["spec"]
    return claims[name]


def mounts_state(pod, container, claim):
    """The container mounts claim `claim` writable at /state, where MESHFEED_STATE is."""
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    m = mounts["/state"]
    assert not m.get("readOnly"), m
    pvc = vols[m["name"]]["persistentVolumeClaim"]
    assert pvc["claimName"] == claim and not pvc.get("readOnly"), pvc
    assert env_of(container)["MESHFEED_STATE"]["value"] == "/state/state.json"


def exit_rule(rules, action, operator, values):
    """The onExitCodes rule of the meshfeed container with this action (exactly one)."""
    (rule,) = [r for r in rules if r["action"] == action]
    codes = rule["onExitCodes"]
    assert codes["containerName"] == "meshfeed", codes
    assert (codes["operator"], codes["values"]) == (operator, values), codes
    # The API server wants the values sorted and unique, and 0 never with In.
    assert codes["values"] == sorted(set(codes["values"])) and not (operator == "In" and 0 in values)
    return rule


def check_ucx_ranks(js, master_addr, claim):
    """An Indexed Job template running every rank of the UCX transport at once through
    entrypoint.sh, rank 0 at `master_addr`, the state on claim `claim`. Returns the pod."""
    assert js["completionMode"] == "Indexed"
    assert js["backoffLimit"] == 0
    pod = js["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # what podFailurePolicy requires
    (c,) = pod["containers"]
    assert c["name"] == "meshfeed" and c["image"] == "meshfeed:latest", c
    env = env_of(c)
    world = env["WORLD_SIZE"]["value"]
    assert isinstance(world, str), "env values must be strings"
    assert js["completions"] == js["parallelism"] == int(world), (
        js["completions"], js["parallelism"], world)
    assert env["MASTER_ADDR"]["value"] == master_addr, env["MASTER_ADDR"]
    assert env["MASTER_PORT"]["value"] == "29500", env["MASTER_PORT"]
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"), env["RANK"]
    ref = env["MESHFEED_JOB_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == ("meshfeed-token", "token"), ref
    assert "value" not in env["MESHFEED_JOB_TOKEN"]
    assert env["UCX_TLS"]["value"] == "tcp"
    # The job id is the Job's own uid, so that a new Job refuses the old one's ranks.
    assert env["MESHFEED_JOB_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['batch.kubernetes.io/controller-uid']"), env["MESHFEED_JOB_ID"]
    # Command: the entrypoint, then `run --transport ucx ...` reading /data; the state
    # arguments come from MESHFEED_STATE, never from the arguments (the entrypoint refuses).
    assert c["command"][-1].endswith("launch/k8s/entrypoint.sh"), c["command"]
    assert c["args"][:3] == ["run", "--transport", "ucx"], c["args"]
    assert "/data" in c["args"]
    assert not {"--state", "--resume-from", "--checkpoint"} & set(c["args"]), c["args"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert "persistentVolumeClaim" in vols[mounts["/data"]], vols
    mounts_state(pod, c, claim)
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    ports_c = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports_c["rendezvous"] == 29500
    return pod


@test
def manifest_content():
    docs, by_kind = load_manifest()
    assert sorted(by_kind) == ["Job", "PersistentVolumeClaim", "Service"], f"documents: {sorted(by_kind)}"
    (svc,) = by_kind["Service"]
    (job,) = by_kind["Job"]
    service, job_name = svc["metadata"]["name"], job["metadata"]["name"]
    assert (job_name, service) == ("meshfeed", "meshfeed"), (job_name, service)
    claim = state_claim(by_kind, "meshfeed-state")

    # Headless Service with the rendezvous port, selecting exactly the Job's pods.
    ss = svc["spec"]
    assert ss["clusterIP"] == "None", ss.get("clusterIP")
    ports = {p["name"]: p for p in ss["ports"]}
    assert ports["rendezvous"]["port"] == 29500, ports
    assert ss.get("publishNotReadyAddresses") is True

    js = job["spec"]
    pod_labels = js["template"]["metadata"]["labels"]
    assert ss["selector"] and all(pod_labels.get(k) == v for k, v in ss["selector"].items()), (
        f"service selector {ss['selector']} does not select the pod labels {pod_labels}"
    )
    pod = check_ucx_ranks(js, f"{job_name}-0.{service}", claim["metadata"]["name"])
    assert pod["subdomain"] == service, pod.get("subdomain")

    # Restartable: exit 75 (stopped cleanly, state saved) is ignored, and the Job
    # controller gives the index a new pod; any other failure fails the Job at once. The
    # Ignore rule comes first (the first matching rule applies).
    rules = js["podFailurePolicy"]["rules"]
    assert [r["action"] for r in rules] == ["Ignore", "FailJob"], rules
    exit_rule(rules, "Ignore", "In", [75])
    exit_rule(rules, "FailJob", "NotIn", [0, 75])
    # No new pod while the old one still terminates (the only value podFailurePolicy allows).
    assert js["podReplacementPolicy"] == "Failed"
    # A single index retried on its own cannot rejoin the running ranks.
    assert "backoffLimitPerIndex" not in js

    # The Secret is documented (kubectl line) but not applied with a placeholder value.
    with open(MANIFEST) as f:
        text = f.read()
    assert "kubectl create secret generic meshfeed-token" in text


# Enumerations the published definitions (OpenAPI 2, from Go types) do not carry but the
# CRDs' schemas and the operators' validation do: kubernetes-sigs/jobset
# config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml (failurePolicy.rules[].action)
# and kubeflow/mpi-operator pkg/apis/kubeflow/validation/validation.go (restartPolicy,
# cleanPodPolicy, mpiImplementation; slotsPerWorker, sshAuthMountPath and cleanPodPolicy
# required, Launcher replicas 1). See tests/k8s-schemas/README.md.
JOBSET_ACTIONS = {"FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"}
RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
MPI_RESTART_POLICIES = {"Never", "OnFailure"}
MPI_CLEAN_POLICIES = {"None", "Running", "All"}


@test
def jobset_content():
    docs, by_kind = load_manifest(JOBSET)
    assert sorted(by_kind) == ["JobSet", "PersistentVolumeClaim"], f"documents: {sorted(by_kind)}"
    (js,) = by_kind["JobSet"]
    name = js["metadata"]["name"]
    claim = state_claim(by_kind, f"{name}-state")
    spec = js["spec"]
    # JobSet's own headless Service: pods resolve as <pod hostname>.<jobset name>, also
    # before they are ready (rank 0's name must resolve while it starts).
    net = spec["network"]
    assert net["enableDNSHostnames"] is True and net["publishNotReadyAddresses"] is True, net
    assert "subdomain" not in net  # the default: the JobSet's name
    (rj,) = spec["replicatedJobs"]
    assert rj["replicas"] == 1, "one Indexed Job holds every rank"
    job = rj["template"]["spec"]
    # Pod hostname: <jobset>-<replicatedJob>-<job index>-<completion index>; rank 0's is 0-0.
    pod = check_ucx_ranks(job, f"{name}-{rj['name']}-0-0.{name}", claim["metadata"]["name"])
    assert "subdomain" not in pod  # set by JobSet
    # Hostnames are DNS labels: at most 63 characters, for the highest index too.
    assert len(f"{name}-{rj['name']}-0-{job['completions'] - 1}") <= 63
    # Exit 75 fails the child Job through its podFailurePolicy (reason PodFailurePolicy)...
    (rule,) = job["podFailurePolicy"]["rules"]
    assert exit_rule([rule], "FailJob", "In", [75])
    # ...which the JobSet restarts as a whole without counting it; other failures
    # (BackoffLimitExceeded) restart it too, counted against maxRestarts.
    fp = spec["failurePolicy"]
    assert fp["maxRestarts"] >= 1, fp
    (jrule,) = fp["rules"]
    assert jrule["action"] == "RestartJobSetAndIgnoreMaxRestarts", jrule
    assert jrule["onJobFailureReasons"] == ["PodFailurePolicy"], jrule
    assert jrule["action"] in JOBSET_ACTIONS and RULE_NAME.match(jrule["name"]), jrule
    assert "targetReplicatedJobs" not in jrule


@test
def mpijob_content():
    docs, by_kind = load_manifest(MPIJOB)
    assert sorted(by_kind) == ["MPIJob", "PersistentVolumeClaim"], f"documents: {sorted(by_kind)}"
    (mj,) = by_kind["MPIJob"]
    name = mj["metadata"]["name"]
    claim = state_claim(by_kind, f"{name}-state")["metadata"]["name"]
    spec = mj["spec"]
    assert spec["mpiImplementation"] == "OpenMPI"
    assert spec["sshAuthMountPath"] and spec["runPolicy"]["cleanPodPolicy"] in MPI_CLEAN_POLICIES
    assert spec["runPolicy"]["backoffLimit"] >= 1, "launcher restarts (after exit 75) need room"
    reps = spec["mpiReplicaSpecs"]
    assert sorted(reps) == ["Launcher", "Worker"], sorted(reps)
    for kind, r in reps.items():
        # OnFailure: the launcher runs mpirun again after exit 75 and resumes.
        assert r["restartPolicy"] == "OnFailure" and r["restartPolicy"] in MPI_RESTART_POLICIES, (kind, r)
    launcher, worker = reps["Launcher"], reps["Worker"]
    assert launcher["replicas"] == 1
    lpod = launcher["template"]["spec"]
    (lc,) = lpod["containers"]
    assert lc["command"][-1].endswith("launch/k8s/mpijob-launcher.sh"), lc["command"]
    args = lc["args"]
    # mpirun -np N ... meshfeed run ...: the MPI transport (no --transport ucx), every slot.
    assert args[0] == "-np" and int(args[1]) == worker["replicas"] * spec["slotsPerWorker"], args
    prog = args.index("meshfeed")
    assert args[prog + 1] == "run" and "--transport" not in args and "/data" in args, args
    assert not {"--state", "--resume-from", "--checkpoint"} & set(args), args
    # mpirun, when stopped itself, gives the ranks time to stop cleanly before SIGKILL.
    follows = dict(zip(args[:prog], args[1:prog]))  # each mpirun word -> the next one
    timeout = int(follows["odls_base_sigkill_timeout"])
    assert 2 * timeout < lpod["terminationGracePeriodSeconds"], (timeout, lpod)
    lenv = env_of(lc)
    assert lenv["HDF5_USE_FILE_LOCKING"]["value"] == "FALSE" and follows["-x"] == "HDF5_USE_FILE_LOCKING"
    mounts_state(lpod, lc, claim)
    wpod = worker["template"]["spec"]
    (wc,) = wpod["containers"]
    assert wc["command"][-1].endswith("launch/k8s/mpijob-worker.sh"), wc["command"]
    assert wc["args"][0].endswith("sshd") and "-D" in wc["args"][1], wc["args"]
    grace = int(env_of(wc)["MESHFEED_STOP_GRACE"]["value"])
    assert grace < wpod["terminationGracePeriodSeconds"], (grace, wpod)
    # Rank 0 runs on a worker and writes the state there; the launcher reads it.
    mounts = {m["mountPath"]: m for m in wc["volumeMounts"]}
    assert mounts["/data"].get("readOnly") is True
    wmounts = {m["mountPath"]: m["name"] for m in wc["volumeMounts"]}
    wvols = {v["name"]: v for v in wpod["volumes"]}
    assert wvols[wmounts["/state"]]["persistentVolumeClaim"]["claimName"] == claim
    # Pod hostnames <name>-worker-<i> must be DNS labels (mpi-operator's validation).
    assert len(f"{name}-worker-{worker['replicas'] - 1}") <= 63


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


def recorder(d):
    """A stand-in program that prints its arguments, one per line, after `ARGS`."""
    prog = os.path.join(d, "prog")
    with open(prog, "w") as f:
        f.write('#!/bin/sh\necho ARGS\nfor a in "$@"; do echo "$a"; done\n')
    os.chmod(prog, 0o755)
    return prog


def printed_args(stdout):
    lines = stdout.splitlines()
    assert lines and lines[0] == "ARGS", stdout
    return lines[1:]


@test
def entrypoint_state_arguments():
    # MESHFEED_STATE: --checkpoint, which resumes once the file exists (a restarted pod);
    # the user's arguments first, unchanged (spaces included).
    with tempfile.TemporaryDirectory() as d:
        prog = recorder(d)
        state = os.path.join(d, "vol", "state.json")
        os.mkdir(os.path.dirname(state))
        env = {**GOOD, "RANK": "1", "MESHFEED_STATE": state}
        r = entry(env, ["run", "--data", "a b"], prog)
        assert r.returncode == 0, r.stderr
        assert printed_args(r.stdout) == ["run", "--data", "a b", "--checkpoint", state], r.stdout
        assert r.stderr.strip() == f"meshfeed entrypoint: rank 1 starts afresh (no {state} yet)", r.stderr
        with open(state, "w") as f:
            f.write("{}")
        r = entry(env, ["run", "--data", "a b"], prog)
        assert printed_args(r.stdout) == ["run", "--data", "a b", "--checkpoint", state], r.stdout
        assert r.stderr.strip() == f"meshfeed entrypoint: rank 1 resumes from {state}", r.stderr
        # Without MESHFEED_STATE nothing is added (the manifests of before still work).
        r = entry({**GOOD, "RANK": "1"}, ["run", "--data", "a b"], prog)
        assert printed_args(r.stdout) == ["run", "--data", "a b"] and r.stderr == "", (r.stdout, r.stderr)
        # Errors, before meshfeed starts: a missing mount must not pass for a fresh start.
        cases = [
            ({"MESHFEED_STATE": os.path.join(d, "nomount", "state.json")}, ["run"],
             f"directory {d}/nomount does not exist (is the state volume mounted?)"),
            ({"MESHFEED_STATE": state}, ["gen", "--out", "x"], "MESHFEED_STATE is for `meshfeed run`"),
            ({"MESHFEED_STATE": state}, ["run", "--state", "x"], "leave --state out of the arguments"),
            ({"MESHFEED_STATE": state}, ["run", "--resume-from=1:0"], "leave --resume-from=1:0 out"),
            ({"MESHFEED_STATE": state}, ["run", "--checkpoint", "y"], "leave --checkpoint out of the arguments"),
        ]
        for extra, args, needle in cases:
            r = entry({**GOOD, "RANK": "0", **extra}, args, prog)
            assert r.returncode == 2 and r.stdout == "", (args, r.returncode, r.stdout)
            assert r.stderr.startswith("meshfeed entrypoint: ") and needle in r.stderr, (args, r.stderr)


# ---------------------------------------------------------------- mpijob-*.sh


@test
def mpijob_launcher_appends_the_state_arguments():
    with tempfile.TemporaryDirectory() as d:
        prog = recorder(d)
        state = os.path.join(d, "state.json")
        mpi = ["-np", "4", "--mca", "odls_base_sigkill_timeout", "10", "meshfeed", "run", "--data", "/data"]
        env = {"PATH": os.environ["PATH"], "MPIRUN": prog, "MESHFEED_STATE": state}
        r = run([MPI_LAUNCHER, *mpi], env=env, timeout=20)
        assert r.returncode == 0, r.stderr
        # Appended at the end: words after the program go to `meshfeed run`.
        assert printed_args(r.stdout) == mpi + ["--checkpoint", state], r.stdout
        assert "starting afresh" in r.stderr, r.stderr
        open(state, "w").close()
        r = run([MPI_LAUNCHER, *mpi], env=env, timeout=20)
        assert printed_args(r.stdout) == mpi + ["--checkpoint", state], r.stdout
        assert f"resuming from {state}" in r.stderr, r.stderr
        r = run([MPI_LAUNCHER, *mpi], env={**env, "MESHFEED_STATE": ""}, timeout=20)
        assert printed_args(r.stdout) == mpi, r.stdout
        # mpirun's exit code is the launcher's (75: stopped cleanly; restartPolicy reruns it).
        r = run([MPI_LAUNCHER, "-c", "exit 75"], env={**env, "MPIRUN": "/bin/sh", "MESHFEED_STATE": ""}, timeout=20)
        assert r.returncode == 75, (r.returncode, r.stderr)
        for args, extra, needle in [
            ([], {}, "usage"),
            (["-np", "2", "meshfeed", "gen"], {}, "hold no `run` command"),
            (mpi + ["--state", "x"], {}, "leave --state out"),
            (mpi, {"MESHFEED_STATE": os.path.join(d, "no", "state.json")}, "is the state volume mounted?"),
        ]:
            r = run([MPI_LAUNCHER, *args], env={**env, **extra}, timeout=20)
            assert r.returncode == 2 and r.stdout == "", (args, r.returncode, r.stdout)
            assert r.stderr.startswith("meshfeed mpijob launcher: ") and needle in r.stderr, (args, r.stderr)


@test
def mpijob_worker_passes_sigterm_to_the_ranks():
    # In its own PID namespace (with its own /proc), the worker script sees only the
    # processes of this test, as in a container: it must not signal any other meshfeed.
    # Two stand-in ranks named `meshfeed` under a stand-in sshd: on the worker's SIGTERM
    # the ranks get SIGTERM, take 0.5 s to "save the state", exit 75; sshd is stopped only
    # after them, and the worker exits 0.
    need_root()
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "log")
        rank = os.path.join(d, "meshfeed")
        with open(rank, "w") as f:
            f.write(f"#!/bin/sh\ntrap 'sleep 0.5; echo \"rank $$ stopped\" >>{log}; exit 75' TERM\n"
                    f"echo \"rank $$ started\" >>{log}\nwhile :; do sleep 0.05; done\n")
        sshd = os.path.join(d, "sshd")
        with open(sshd, "w") as f:
            f.write(f"#!/bin/sh\ntrap 'echo sshd stopped >>{log}; exit 0' TERM\n"
                    f"{rank} & {rank} &\nwhile :; do sleep 0.05; done\n")
        os.chmod(rank, 0o755)
        os.chmod(sshd, 0o755)
        script = (f'{MPI_WORKER} {sshd} & w=$!\n'
                  f'while [ "$(grep -c started {log} 2>/dev/null)" != 2 ]; do sleep 0.05; done\n'
                  'kill -TERM $w; wait $w; echo "worker exit $?"\n'
                  'for f in /proc/[0-9]*/comm; do cat $f; done 2>/dev/null | grep -cx -e meshfeed -e sshd || true\n')
        r = run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script], timeout=30)
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        out = r.stdout.split()
        assert out == ["worker", "exit", "0", "0"], f"{r.stdout}\n{r.stderr}"  # nothing left running
        with open(log) as f:
            events = [" ".join(line.split()[::2]) for line in f.read().splitlines()]  # drop the pids
        assert events == ["rank started", "rank started", "rank stopped", "rank stopped", "sshd"], events
        assert "stopping the ranks here" in r.stderr, r.stderr


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


def stopping_rank(d, on_term, then="exit 0", finish_after=None):
    """A stand-in rank for preemption tests: it logs `attempt=<EMULATE_ATTEMPT>`, and in
    its first attempt runs `on_term` on SIGTERM (and ends by itself after `finish_after`
    seconds, if given); later attempts run `then` at once."""
    prog = os.path.join(d, "rank.sh")
    loop = "while :; do sleep 0.05; done" if finish_after is None else f"sleep {finish_after}; exit 0"
    with open(prog, "w") as f:
        f.write("#!/bin/sh\n"
                'echo "attempt=$EMULATE_ATTEMPT rank=$RANK"\n'
                f'[ "$EMULATE_ATTEMPT" = 0 ] || {{ {then}; }}\n'
                f"trap '{on_term}' TERM\n"
                f"{loop}\n")
    os.chmod(prog, 0o755)
    return prog


def attempts(stdout):
    """{pod name: [attempt numbers, in order]} from the stand-in's `attempt=` lines."""
    seen = {}
    for m in re.finditer(r"^\[(meshfeed-\d+)\] attempt=(\d+) rank=(\d+)$", stdout, re.M):
        assert m[1] == f"meshfeed-{m[3]}", m[0]  # a replacement keeps its index's rank
        seen.setdefault(m[1], []).append(int(m[2]))
    return seen


@test
def emulate_preemption_replaces_the_pods_that_exit_75():
    need_root()
    with tempfile.TemporaryDirectory() as d:
        # Every pod preempted: each exits 75, and gets a replacement (same index, same
        # hostname and rank, EMULATE_ATTEMPT 1), which finishes.
        prog = stopping_rank(d, "exit 75")
        r, secs = emulate(3, ["run"], opts=["-P", "0.5", "-t", "20"], extra_env={"MESHFEED_BIN": prog})
        assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert "emulate.sh: preemption 1: SIGTERM to every pod (3 running)" in r.stderr, r.stderr
        for i in range(3):
            assert f"pod meshfeed-{i} exited 75 (stopped cleanly): replacing it (attempt 1)" in r.stderr
        assert "job succeeded: 3 pod(s) exited 0 (3 pod(s) replaced after exit 75)" in r.stderr, r.stderr
        assert attempts(r.stdout) == {f"meshfeed-{i}": [0, 1] for i in range(3)}, r.stdout
        # One pod preempted (-P SECONDS:INDEX), twice: only it is replaced, each time;
        # the others end by themselves. The second preemption comes once the first one's
        # replacement runs.
        prog = stopping_rank(d, "exit 75", then='[ "$EMULATE_ATTEMPT" = 2 ] && exit 0; trap "exit 75" TERM; '
                                               "while :; do sleep 0.05; done", finish_after=2)
        r, _ = emulate(3, ["run"], opts=["-P", "0.5:1", "-P", "0.5:1", "-t", "20"], extra_env={"MESHFEED_BIN": prog})
        assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert r.stderr.count("SIGTERM to pod meshfeed-1 (1 running)") == 2, r.stderr
        assert "job succeeded: 3 pod(s) exited 0 (2 pod(s) replaced after exit 75)" in r.stderr, r.stderr
        assert attempts(r.stdout) == {"meshfeed-0": [0], "meshfeed-1": [0, 1, 2], "meshfeed-2": [0]}, r.stdout


@test
def emulate_preemption_kills_a_pod_past_its_grace_period():
    # A pod that ignores SIGTERM is killed when the grace period ends (137), and that
    # fails the job (FailJob), as on Kubernetes.
    need_root()
    with tempfile.TemporaryDirectory() as d:
        prog = stopping_rank(d, "")  # trap '' TERM: ignored
        r, secs = emulate(2, ["run"], opts=["-P", "0.3", "-g", "1", "-t", "20"], extra_env={"MESHFEED_BIN": prog})
        assert r.returncode == 1, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert "outlived its grace period of 1s: SIGKILL" in r.stderr, r.stderr
        assert re.search(r"job failed: pod meshfeed-\d failed with exit status 137", r.stderr), r.stderr
        assert secs < 10, secs


@test
def emulate_preemption_usage_errors():
    for opts, needle in [(["-n", "2", "-P", "x"], "-P must be SECONDS or SECONDS:INDEX"),
                         (["-n", "2", "-P", "1:2"], "-P 1:2: no pod 2 among 2"),
                         (["-n", "2", "-g", "soon"], "-g must be a number of seconds")]:
        r = run([EMULATE, *opts, "--", "run"], timeout=20)
        assert r.returncode == 2 and needle in r.stderr, (opts, r.returncode, r.stderr)


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
    args = sys.argv[1:]
    only = None
    if args[:1] == ["--only"] and len(args) >= 2:
        only = re.compile(args[1])
        args = args[2:]
    if args[:1] == ["--meshfeed"] and len(args) == 2:
        REAL_BIN = os.path.abspath(args[1])
        TESTS.append(real_meshfeed_through_emulation)
    elif args:
        print(f"usage: {sys.argv[0]} [--only REGEX] [--meshfeed PATH-TO-BINARY]", file=sys.stderr)
        return 2
    tests = [fn for fn in TESTS if only is None or only.search(fn.__name__)]
    if not tests:
        print(f"no test matches --only {only.pattern}", file=sys.stderr)
        return 2
    passed = failed = 0
    t0 = time.monotonic()
    for fn in tests:
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
