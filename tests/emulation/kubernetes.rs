//! Kubernetes, restartable (issue 13): a preempted job restarts and resumes exactly.
//!
//! * An emulated Indexed Job (launch/k8s/emulate.sh: one process per pod, with its own
//!   hostname and /etc/hosts; see its header) is preempted twice mid-epoch, first every
//!   pod (a node drain), then a single pod (a SIGTERM to one rank stops them all): every
//!   pod exits 75 and is replaced as the Job controller replaces pods under the
//!   manifest's podFailurePolicy, the replacements resume from the state on the shared
//!   "volume" (a directory), and the attempts' dumps, joined per rank, are byte for byte
//!   an uninterrupted run's.
//! * launch/k8s/entrypoint.sh with MESHFEED_STATE and the real binary: a fresh start when
//!   there is no state (and the state written at the end), a resume when there is.
//! * The manifests (Indexed Job, JobSet, MPIJob) pass their schema checks
//!   (tests/launch/check_k8s.py: kubernetes-validate --strict for built-in kinds, the
//!   vendored OpenAPI definitions in tests/k8s-schemas/ for the custom resources).
//!
//! The MPIJob runs on emulated pods of the image in tests/emulation/mpijob.rs.
//!
//! Needs root (emulate.sh's namespaces), OpenMPI's mpirun for the reference runs, and the
//! project's .venv (kubernetes-validate).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use crate::common::*;

fn repo(p: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p).to_str().unwrap().to_string()
}

/// The stream every run here delivers: 101 samples, batch 4 -> 25 steps per epoch, two
/// epochs, on a 2x2 mesh (4 ranks).
fn stream_args(data: &Path) -> Vec<String> {
    ["run", "--data", data.to_str().unwrap(), "--batch-size", "4", "--epochs", "2"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

const MESH: [&str; 4] = ["--mesh", "dp=2,tp=2", "--shard", "x=dp,tp"];

/// A stand-in for `meshfeed` in the pods: the real binary, with each attempt of a pod
/// dumping to its own directory (EMULATE_ATTEMPT: 0 for an index's first pod, k for its
/// k-th replacement), as the arguments of a Job's pods are the same for every attempt.
fn dumping_meshfeed(dir: &Path, dumps: &Path) -> String {
    let path = dir.join("meshfeed-per-attempt.sh");
    std::fs::write(
        &path,
        format!("#!/bin/sh\nexec '{}' \"$@\" --dump \"{}/attempt-$EMULATE_ATTEMPT\"\n", bin(), dumps.display()),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn preempted_emulated_job_restarts_and_resumes_exactly() {
    let _alone = crate::one_cluster_at_a_time();
    let data = fixtures().join("hdf5");
    let out = tempdir();
    let mut args = stream_args(&data);
    args.extend(MESH.iter().map(|s| s.to_string()));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();

    // The uninterrupted stream, under mpirun.
    let whole = out.path().join("uninterrupted");
    let mut with_dump = argv.clone();
    with_dump.extend(["--dump", whole.to_str().unwrap()]);
    ok(&mpirun(4, &with_dump));
    let want = dump_bytes(&whole, 4);
    let total_steps = read_dump(&whole, 4)[0].len();
    assert_eq!(total_steps, 50, "25 steps per epoch, 2 epochs");

    // The emulated Job: 150 ms per step makes the run take about 8 s of steps. The first
    // preemption (every pod) comes 3 s after the pods started: after the rendezvous (a
    // SIGTERM before meshfeed runs kills the rank, which fails the Job) and well before
    // the end; the second (pod 2 alone) 2.5 s after the replacements started.
    let state_dir = out.path().join("state-volume");
    std::fs::create_dir(&state_dir).unwrap();
    let state = state_dir.join("state.json");
    let dumps = out.path().join("dumps");
    let mut cmd = Command::new("bash");
    cmd.arg(repo("launch/k8s/emulate.sh"))
        .args(["-n", "4", "-t", "100", "-P", "3", "-P", "2.5:2", "--"])
        .args(&args)
        .args(["--transport", "ucx", "--compute-ms", "150"])
        .env("MESHFEED_BIN", dumping_meshfeed(out.path(), &dumps))
        .env("MESHFEED_STATE", &state)
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .env_remove("MESHFEED_JOB_TOKEN");
    let run = wait_bounded(cmd, "emulate.sh -P 3 -P 2.5:2");
    let log = format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert_eq!(run.code, 0, "the preempted job failed:\n{log}");

    // Both preemptions happened mid-run: every pod exited 75 each time (also after the
    // SIGTERM to pod 2 alone) and was replaced, and the job then finished.
    assert!(run.stderr.contains("emulate.sh: preemption 1: SIGTERM to every pod (4 running)"), "{log}");
    assert!(run.stderr.contains("emulate.sh: preemption 2: SIGTERM to pod meshfeed-2 (1 running)"), "{log}");
    for attempt in 1..=2 {
        for i in 0..4 {
            let line = format!("pod meshfeed-{i} exited 75 (stopped cleanly): replacing it (attempt {attempt})");
            assert!(run.stderr.contains(&line), "missing '{line}':\n{log}");
        }
    }
    assert!(run.stderr.contains("job succeeded: 4 pod(s) exited 0 (8 pod(s) replaced after exit 75)"), "{log}");
    // Each attempt's pods started afresh (the first) or resumed from the state (the others).
    for i in 0..4 {
        let fresh = format!("[meshfeed-{i}] meshfeed entrypoint: rank {i} starts afresh (no {} yet)", state.display());
        let resumed = format!("[meshfeed-{i}] meshfeed entrypoint: rank {i} resumes from {}", state.display());
        assert_eq!(run.stderr.matches(&fresh).count(), 1, "{log}");
        assert_eq!(run.stderr.matches(&resumed).count(), 2, "{log}");
    }

    // The attempts' dumps: each ran the ranks in lockstep, the first two stopped part of
    // the way (so the test really interrupted the stream), and each resumed exactly where
    // the previous one stopped, as rank 0 reported it.
    let stops = stop_points(&run.stderr);
    assert_eq!(stops.len(), 2, "rank 0 reports each stop once:\n{log}");
    let attempts: Vec<_> = (0..3).map(|k| read_dump(&dumps.join(format!("attempt-{k}")), 4)).collect();
    for (k, dump) in attempts.iter().enumerate() {
        let steps = global_batches(dump);
        if let (Some(first), Some(last)) = (steps.first(), steps.last()) {
            println!("attempt {k}: {} steps, {:?} to {:?}", steps.len(), first.0, last.0);
        }
        assert!(!steps.is_empty() && steps.len() < total_steps, "attempt {k} delivered {} steps", steps.len());
        if k > 0 {
            assert_eq!(steps[0].0, stops[k - 1], "attempt {k} starts where attempt {} stopped", k - 1);
        }
        if k < 2 {
            let last = steps.last().unwrap().0;
            assert!(last < stops[k], "attempt {k} delivered {last:?}, past its stop at {:?}", stops[k]);
        }
    }
    // Together, rank by rank, byte for byte: the uninterrupted run.
    let got: Vec<Vec<u8>> = (0..4)
        .map(|r| {
            (0..3).flat_map(|k| std::fs::read(dumps.join(format!("attempt-{k}/rank-{r}.jsonl"))).unwrap()).collect()
        })
        .collect();
    assert!(got == want, "the attempts' dumps joined differ from the uninterrupted run's");
    // The state now marks the end of the job: re-running the Job would deliver nothing.
    assert_eq!(state_position(&state), (2, 0));
}

fn strs(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

/// One rank (WORLD_SIZE 1) through entrypoint.sh with MESHFEED_STATE, as a pod runs it.
fn entrypoint_rank(args: &[&str], state: &Path) -> Run {
    let mut cmd = Command::new(repo("launch/k8s/entrypoint.sh"));
    cmd.args(args)
        .env_remove("RANK")
        .env("JOB_COMPLETION_INDEX", "0")
        .env("WORLD_SIZE", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", free_port().to_string())
        .env("MESHFEED_JOB_TOKEN", "entrypoint-test")
        .env("MESHFEED_BIN", bin())
        .env("MESHFEED_STATE", state)
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .env("UCX_TLS", "tcp")
        .env("UCX_NET_DEVICES", "lo");
    wait_bounded(cmd, &format!("entrypoint.sh {}", args.join(" ")))
}

#[test]
fn entrypoint_starts_afresh_without_state_and_resumes_with_it() {
    let data = fixtures().join("npy_struct");
    let out = tempdir();
    let base = stream_args(&data);
    let mut whole: Vec<&str> = base.iter().map(String::as_str).collect();
    let reference = out.path().join("whole");
    whole.extend(["--dump", reference.to_str().unwrap()]);
    ok(&mpirun(1, &whole));

    let state = out.path().join("state.json");
    // The run's arguments, with EPOCHS epochs, over UCX, dumping to NAME.
    let ucx = |epochs: &str, name: &str| -> Vec<String> {
        let mut a = base.clone();
        let at = a.iter().position(|w| w == "--epochs").unwrap();
        a[at + 1] = epochs.to_string();
        a.extend(["--transport", "ucx", "--dump", out.path().join(name).to_str().unwrap()].map(String::from));
        a
    };

    // No state yet: a fresh start, with --state, which holds the end (epoch 1) afterwards.
    let run = entrypoint_rank(&strs(&ucx("1", "first")), &state);
    ok(&run);
    let fresh = format!("meshfeed entrypoint: rank 0 starts afresh (no {} yet)", state.display());
    assert!(run.stderr.contains(&fresh), "{}", run.stderr);
    assert_eq!(state_position(&state), (1, 0), "the state written at the end of epoch 0");

    // The state exists: --resume-from it. The same job asked for two epochs continues with
    // the second, exactly: the two runs together are the two-epoch stream.
    let run = entrypoint_rank(&strs(&ucx("2", "second")), &state);
    ok(&run);
    let resumed = format!("meshfeed entrypoint: rank 0 resumes from {}", state.display());
    assert!(run.stderr.contains(&resumed), "{}", run.stderr);
    assert!(run.stdout.contains("meshfeed: resuming at epoch 1 step 0"), "{}", run.stdout);
    let joined: Vec<u8> = ["first", "second"]
        .iter()
        .flat_map(|n| std::fs::read(out.path().join(n).join("rank-0.jsonl")).unwrap())
        .collect();
    let first_lines = read_dump(&out.path().join("first"), 1)[0].len();
    assert!(first_lines > 0 && first_lines < read_dump(&reference, 1)[0].len());
    assert!(joined == dump_bytes(&reference, 1)[0], "fresh + resumed runs differ from one two-epoch run");
    assert_eq!(state_position(&state), (2, 0));

    // Once more (a Job applied again after it completed): it resumes at the end and
    // delivers nothing.
    let run = entrypoint_rank(&strs(&ucx("2", "again")), &state);
    ok(&run);
    assert!(run.stdout.contains("meshfeed: resuming at epoch 2 step 0"), "{}", run.stdout);
    assert!(read_dump(&out.path().join("again"), 1)[0].is_empty(), "nothing is left to deliver");
}

#[test]
fn manifests_pass_their_schema_checks() {
    // The offline checks of tests/launch/check_k8s.py that concern the manifests: built-in
    // kinds with kubernetes-validate --strict, the JobSet and the MPIJob against their
    // vendored OpenAPI definitions, broken variants rejected, and the restart semantics
    // of each manifest (rules, exit codes, state volume). Its other checks (scripts,
    // emulation) run in tests/emulation/launchers.rs.
    let only = "^(manifests_validate_strict|strict_validation_rejects_a_typo|crd_schemas_reject_broken_manifests\
                |manifest_content|jobset_content|mpijob_content)$";
    let out = Command::new(python())
        .arg(repo("tests/launch/check_k8s.py"))
        .args(["--only", only])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "check_k8s.py failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().last(), Some("6 passed, 0 failed"), "{stdout}");
    for name in ["job/meshfeed", "jobset/meshfeed-jobset", "mpijob/meshfeed-mpi"] {
        assert!(stdout.contains(name), "{name} was not validated:\n{stdout}");
    }
}
