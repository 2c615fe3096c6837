//! The default transport under each launcher (issue 42, item 2): a 2-process job started
//! with default options by `meshfeed launch` or by torchrun delivers the 2-rank stream
//! (the dumps of `mpirun -np 2` on the same job) or is refused on every rank naming why —
//! never two 1-rank streams. An explicit `--transport mpi` under a launcher without MPI is
//! refused naming both sizes.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// torchrun of the test Python (`MESHFEED_PYTHON`, or the venv `launch/setup.sh` makes).
fn torchrun() -> PathBuf {
    let torchrun = python().with_file_name("torchrun");
    assert!(torchrun.exists(), "no torchrun beside {} (torch is in launch/setup.sh's venv)", python().display());
    torchrun
}

/// `torchrun --standalone --no-python --nproc-per-node NP meshfeed ARGS`, with `env` added.
fn torchrun_job(np: usize, args: &[&str], env: &[(&str, &str)]) -> Run {
    torchrun_cmd(np, &[&[bin()], args].concat(), env)
}

/// [`torchrun_job`] for a job every rank of which should refuse: each rank's meshfeed runs
/// under `sh`, which waits 3 s before passing its exit code on. torchrun stops the other
/// ranks as soon as one fails, which could cut a slower rank off before it said anything:
/// the wait lets every rank's own outcome be seen.
fn torchrun_refusal(np: usize, args: &[&str], env: &[(&str, &str)]) -> Run {
    let script = format!("{} \"$@\"; code=$?; sleep 3; exit $code", bin());
    torchrun_cmd(np, &[&["/bin/sh", "-c", script.as_str(), "meshfeed"], args].concat(), env)
}

/// `torchrun --standalone --no-python --nproc-per-node NP PROGRAM ARGS...` (`program`).
fn torchrun_cmd(np: usize, program: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(torchrun());
    cmd.args(["--standalone", "--no-python", "--nproc-per-node", &np.to_string()]).args(program);
    cmd.env("HDF5_USE_FILE_LOCKING", "FALSE").env("UCX_NET_DEVICES", "lo").env_remove("MESHFEED_JOB_TOKEN");
    cmd.env_remove("MESHFEED_MASTER_PORT").envs(env.iter().copied());
    wait_bounded(cmd, &format!("torchrun --nproc-per-node {np} {}", program.join(" ")))
}

/// The job every test runs, with default options (no `--transport`).
fn job(data: &Path) -> Job {
    Job::new(data).batch(12).epochs(2).seed(4).window("2K")
}

/// `mpirun -np 2`'s dumps of [`job`]: the 2-rank stream.
fn mpirun_dumps(data: &Path, out: &Path) -> Vec<Vec<u8>> {
    let dir = out.join("mpirun");
    ok(&job(data).dump(&dir).mpirun(2));
    let dumps = dump_bytes(&dir, 2);
    assert!(dumps.iter().all(|d| !d.is_empty()), "mpirun wrote empty dumps");
    dumps
}

fn dataset(out: &Path) -> PathBuf {
    Dataset::gen("npy", 120).field("x:f32:4").write(&out.join("data"))
}

/// Asserts a refusal: non-zero exit, no dump (nothing was delivered), and every one of
/// `ranks` printed an error containing each of `needles`.
fn refused(run: &Run, dump: &Path, ranks: &[usize], needles: &[&str]) {
    assert_ne!(run.code, 0, "not refused\nstdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(!dump.exists(), "a refused job wrote a dump: {}", run.stderr);
    for r in ranks {
        let prefix = format!("meshfeed: error on rank {r}: ");
        let line = run.stderr.lines().find(|l| l.starts_with(&prefix));
        let line = line.unwrap_or_else(|| panic!("rank {r} printed no error:\n{}", run.stderr));
        for n in needles {
            assert!(line.contains(n), "rank {r}'s error lacks '{n}': {line}");
        }
    }
}

#[test]
fn meshfeed_launch_with_default_options_delivers_the_two_rank_stream() {
    let out = tempdir();
    let data = dataset(out.path());
    let expected = mpirun_dumps(&data, out.path());
    let dir = out.path().join("launch");
    let run = launch(2, &job(&data).dump(&dir).argv());
    ok(&run);
    assert!(run.stdout.contains("2 ranks"), "{}", run.stdout);
    assert!(dump_bytes(&dir, 2) == expected, "meshfeed launch's dumps differ from mpirun -np 2's");
}

#[test]
fn torchrun_with_default_options_delivers_the_two_rank_stream_or_is_refused() {
    let out = tempdir();
    let data = dataset(out.path());
    let expected = mpirun_dumps(&data, out.path());
    // With meshfeed's token and a port of its own: the 2-rank stream over UCX.
    let dir = out.path().join("torchrun");
    let port = free_port().to_string();
    let env = [("MESHFEED_JOB_TOKEN", "torchrun-default"), ("MESHFEED_MASTER_PORT", port.as_str())];
    ok(&torchrun_job(2, &job(&data).dump(&dir).argv(), &env));
    assert!(dump_bytes(&dir, 2) == expected, "torchrun's dumps differ from mpirun -np 2's");
    // Without the token: refused, saying why auto picked the rendezvous and what to set.
    let dir = out.path().join("no-token");
    let run = torchrun_refusal(2, &job(&data).dump(&dir).argv(), &[]);
    refused(&run, &dir, &[0, 1], &["WORLD_SIZE=2 is set", "MESHFEED_JOB_TOKEN", "MESHFEED_MASTER_PORT", "mpirun"]);
    // With the token but torchrun's own MASTER_PORT: refused, naming the port to set.
    let run = torchrun_refusal(2, &job(&data).dump(&dir).argv(), &env[..1]);
    refused(&run, &dir, &[0, 1], &["TORCHELASTIC_RUN_ID", "MESHFEED_MASTER_PORT is not set"]);
}

#[test]
fn an_explicit_mpi_transport_under_a_launcher_without_mpi_is_refused_naming_both_sizes() {
    let out = tempdir();
    let data = dataset(out.path());
    let dir = out.path().join("dump");
    let mpi = job(&data).dump(&dir).args(["--transport", "mpi"]);
    let needles = ["WORLD_SIZE=2 but MPI_COMM_WORLD has 1 rank(s)", "--transport auto", "unset WORLD_SIZE"];
    refused(&launch(2, &mpi.argv()), &dir, &[0, 1], &needles);
    let run = torchrun_refusal(2, &mpi.argv(), &[]);
    refused(&run, &dir, &[0, 1], &needles);
    // Under mpirun, a WORLD_SIZE that agrees (as scripts set it for torch.distributed)
    // changes nothing; one that disagrees is refused the same way.
    let agreeing = Job::new(&data).batch(12).args(["--transport", "mpi"]);
    let mut cmd = Command::new("mpirun");
    cmd.args(MPIRUN_FLAGS).args(["-np", "2", "-x", "WORLD_SIZE=2", bin()]).args(agreeing.argv());
    ok(&wait_bounded(cmd, "mpirun -np 2 -x WORLD_SIZE=2 meshfeed run"));
    let mut cmd = Command::new("mpirun");
    cmd.args(MPIRUN_FLAGS).args(["-np", "2", "-x", "WORLD_SIZE=3", bin()]).args(mpi.argv());
    let run = wait_bounded(cmd, "mpirun -np 2 -x WORLD_SIZE=3 meshfeed run");
    assert_ne!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.contains("WORLD_SIZE=3 but MPI_COMM_WORLD has 2 rank(s)"), "{}", run.stderr);
    assert!(!dir.exists());
}
