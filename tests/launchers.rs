//! Launching without mpirun: the Ray launcher (launch/ray_launch.py, real Ray) and the
//! Kubernetes Indexed Job (manifest validated offline, emulated with namespaces by
//! launch/k8s/emulate.sh) produce the same dump as mpirun; their own checkers pass.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

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
        .arg(repo("launch/ray_launch.py"))
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
