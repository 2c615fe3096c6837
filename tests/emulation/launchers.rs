//! Launching without mpirun: the Ray launcher (`python -m meshfeed.launch.ray`, real Ray) and the
//! Kubernetes Indexed Job (manifest validated offline, emulated with namespaces by
//! launch/k8s/emulate.sh) produce the same dump as mpirun; their own checkers pass.

use std::path::Path;
use std::process::Command;

use crate::common::*;

fn repo(p: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p).to_str().unwrap().to_string()
}

/// Runs a checker script; it must pass and say so in its last line.
fn checker(script: &str, extra: &[&str]) {
    let mut cmd = Command::new(python());
    cmd.arg(repo(script)).args(extra).current_dir(env!("CARGO_MANIFEST_DIR"));
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.ends_with(" passed, 0 failed") && !last.starts_with("0 passed"), "{script}: {last}");
}

fn mpirun_dump(np: usize, args: &[&str], dir: &Path) -> Vec<Vec<u8>> {
    let mut a = args.to_vec();
    a.extend(["--dump", dir.to_str().unwrap()]);
    ok(&mpirun(np, &a));
    dump_bytes(dir, np)
}

fn job_args(data: &Path) -> Vec<String> {
    [
        "run",
        "--data",
        data.to_str().unwrap(),
        "--batch-size",
        "8",
        "--epochs",
        "2",
        "--mesh",
        "dp=2,tp=2",
        "--shard",
        "x=dp,tp",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn ray_launcher_checker() {
    checker("tests/launch/check_ray.py", &[]);
}

#[test]
fn kubernetes_manifest_and_emulation_checker() {
    checker("tests/launch/check_k8s.py", &["--meshfeed", bin()]);
}

#[test]
fn ray_job_produces_the_mpirun_dump() {
    let data = fixtures().join("npy_struct");
    let out = tempdir();
    let args = job_args(&data);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let want = mpirun_dump(4, &argv, &out.path().join("mpi"));
    let dump = out.path().join("ray");
    let run = Command::new(python())
        .args(["-m", "meshfeed.launch.ray"])
        .args(["-n", "4", "--timeout", "120", "--", bin()])
        .args(&args)
        .args(["--transport", "ucx", "--dump", dump.to_str().unwrap()])
        .env("UCX_NET_DEVICES", "lo")
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .env_remove("MESHFEED_JOB_TOKEN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "ray job failed:\n{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("ray_launch: all 4 ranks succeeded"), "{stdout}");
    assert!(stdout.contains("[rank 0] meshfeed: done: 2 epoch(s) on 4 ranks"), "{stdout}");
    let got = dump_bytes(&dump, 4);
    assert!(got == want, "Ray job dump differs from mpirun's");
}

#[test]
fn emulated_indexed_job_produces_the_mpirun_dump() {
    let data = fixtures().join("hdf5");
    let out = tempdir();
    let args = job_args(&data);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let want = mpirun_dump(4, &argv, &out.path().join("mpi"));
    let dump = out.path().join("k8s");
    let run = Command::new("bash")
        .arg(repo("launch/k8s/emulate.sh"))
        .args(["-n", "4", "-t", "120", "--"])
        .args(&args)
        .args(["--transport", "ucx", "--dump", dump.to_str().unwrap()])
        .env("MESHFEED_BIN", bin())
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .env_remove("MESHFEED_JOB_TOKEN")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "emulated job failed:\n{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let got = dump_bytes(&dump, 4);
    assert!(got == want, "emulated Indexed Job dump differs from mpirun's");
}

/// A Ray cluster of two nodes (network namespaces with their own addresses and host
/// names, `ray start` in each: tests/launch/ray_nodes.sh), torn down however the test
/// ends.
struct RayNodes {
    dir: tempfile::TempDir,
}

impl RayNodes {
    fn script() -> String {
        repo("tests/launch/ray_nodes.sh")
    }

    /// `PATH` with the venv's `ray` and `python` first.
    fn path() -> String {
        let venv = python().parent().unwrap().to_path_buf();
        format!("{}:{}", venv.display(), std::env::var("PATH").unwrap_or_default())
    }

    fn up(n: usize) -> RayNodes {
        let dir = tempdir();
        let out = Command::new("bash")
            .args([&Self::script(), "up", &n.to_string(), dir.path().to_str().unwrap()])
            .env("PATH", Self::path())
            .output()
            .unwrap();
        let nodes = RayNodes { dir };
        assert!(out.status.success(), "ray_nodes.sh up failed:\n{}", String::from_utf8_lossy(&out.stderr));
        nodes
    }

    /// Runs `args` on node `i` (0: the head), in the working tree, to its end.
    fn exec(&self, i: usize, args: &[&str], what: &str) -> Run {
        let mut cmd = Command::new("bash");
        cmd.args([&Self::script(), "exec", &i.to_string(), self.dir.path().to_str().unwrap()]).args(args);
        cmd.env("PATH", Self::path()).env("HDF5_USE_FILE_LOCKING", "FALSE").env_remove("MESHFEED_JOB_TOKEN");
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
        wait_bounded(cmd, what)
    }
}

impl Drop for RayNodes {
    fn drop(&mut self) {
        let _ = Command::new("bash").args([&Self::script(), "down", self.dir.path().to_str().unwrap()]).status();
    }
}

/// On a running two-node Ray cluster, the launcher joins it (`--address auto`), spreads
/// the ranks over both nodes with a placement group, and points them at rank 0's node:
/// the job's dump equals mpirun's. Ray Train's `TorchTrainer` example, its workers on
/// both nodes, trains on meshfeed over UCX there. `down` leaves no namespace behind.
#[test]
fn a_two_node_ray_cluster_runs_the_launcher_and_ray_train() {
    let _alone = crate::one_cluster_at_a_time();
    let data = fixtures().join("npy_struct");
    let out = tempdir();
    let args = job_args(&data);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let want = mpirun_dump(4, &argv, &out.path().join("mpi"));
    let learn = out.path().join("learn");
    ok(&wait_bounded(
        {
            let mut c = Command::new(python());
            c.arg(repo("examples/python/make_data.py")).arg(&learn);
            c
        },
        "make_data.py",
    ));
    {
        let nodes = RayNodes::up(2);
        let dump = out.path().join("ray");
        let mut cmd = vec!["python", "-m", "meshfeed.launch.ray"];
        cmd.extend(["-n", "4", "--address", "auto", "--timeout", "120", "--", bin()]);
        cmd.extend(&argv);
        cmd.extend(["--transport", "ucx", "--dump", dump.to_str().unwrap()]);
        let run = nodes.exec(0, &cmd, "meshfeed.launch.ray on the cluster");
        ok(&run);
        assert!(run.stdout.contains("ray_launch: all 4 ranks succeeded"), "{}", run.stdout);
        // SPREAD: two ranks on each node. Rank 0 may land on either; the ranks on the
        // other node reach its rendezvous only because MASTER_ADDR is rank 0's node.
        let on = |addr: &str| run.stdout.matches(&format!(" on node {addr}\n")).count();
        let subnet = "10.78.8";
        assert_eq!((on(&format!("{subnet}.2")), on(&format!("{subnet}.3"))), (2, 2), "{}", run.stdout);
        assert!(dump_bytes(&dump, 4) == want, "the Ray cluster's dump differs from mpirun's");

        let example = repo("examples/python/ray_train.py");
        let train = [
            "python",
            &example,
            learn.to_str().unwrap(),
            "--address",
            "auto",
            "--placement-strategy",
            "SPREAD",
            "--workers",
            "2",
            "--epochs",
            "2",
        ];
        let run = nodes.exec(0, &train, "ray_train.py on the cluster");
        ok(&run);
        let text = format!("{}{}", run.stdout, run.stderr);
        assert!(run.stdout.contains("ray_train: finished (no error)"), "{text}");
        // One worker on each node (their host names), every sample once each epoch.
        let mut hosts: Vec<&str> = text.lines().filter_map(|l| l.split(" of 2 on ").nth(1)).map(str::trim).collect();
        hosts.sort_unstable();
        hosts.dedup();
        assert_eq!(hosts, ["mfray8-0", "mfray8-1"], "{text}");
        for epoch in 0..2 {
            assert!(
                text.contains(&format!("epoch {epoch} loss ")) && text.contains("(4096 samples, each once)"),
                "{text}"
            );
        }
    }
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&netns.stdout).contains("mfray8-"), "ray_nodes.sh down left namespaces");
}
