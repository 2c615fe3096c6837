//! What is checked before the first step, on every rank, over MPI and UCX: ranks started
//! with different jobs are told which option differs (it once hung forever), output paths
//! that cannot be written and resume points outside the job are refused before anything
//! is delivered; and output nobody reads does not fail a job.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

/// Starts one rank per job over `t`: under MPI one MPMD `mpirun`, under UCX the
/// ranks one by one as a launcher would. One `Run`: the first non-zero exit code, the
/// ranks' output together.
fn run_per_rank(t: Transport, per_rank: &[Job]) -> Run {
    match t {
        Transport::Mpi => {
            let mut cmd = Command::new("mpirun");
            cmd.args(MPIRUN_FLAGS);
            for (r, job) in per_rank.iter().enumerate() {
                if r > 0 {
                    cmd.arg(":");
                }
                cmd.args(["-np", "1", bin()]).args(job.argv());
            }
            cmd.env("HDF5_USE_FILE_LOCKING", "FALSE").stdout(Stdio::piped()).stderr(Stdio::piped());
            finish(cmd.spawn().unwrap(), "mpmd mpirun")
        }
        Transport::Ucx => {
            let port = free_port();
            let n = per_rank.len();
            let children: Vec<_> = per_rank
                .iter()
                .enumerate()
                .map(|(r, job)| spawn_rank(r, n, port, "tok", &job.clone().transport("ucx").argv(), &[]))
                .collect();
            let runs: Vec<Run> =
                children.into_iter().enumerate().map(|(r, c)| finish(c, &format!("rank {r}"))).collect();
            Run {
                code: runs.iter().map(|r| r.code).find(|&c| c != 0).unwrap_or(0),
                stdout: runs.iter().map(|r| r.stdout.as_str()).collect(),
                stderr: runs.iter().map(|r| r.stderr.as_str()).collect(),
                elapsed: runs.iter().map(|r| r.elapsed).max().unwrap_or_default(),
            }
        }
    }
}

fn generated() -> tempfile::TempDir {
    let dir = tempdir();
    Dataset::gen("npy", 600).field("x:f32:4").write(&dir.path().join("d"));
    dir
}

/// The failure every rank agreed on, with its root cause line; nothing was delivered.
fn refused(t: Transport, run: &Run, np: usize) -> String {
    assert_ne!(run.code, 0, "{t:?}: the job must fail:\n{}\n{}", run.stdout, run.stderr);
    assert!(run.elapsed < Duration::from_secs(30), "{t:?}: took {:?}", run.elapsed);
    assert!(
        !run.stdout.contains("epoch 0:") && !run.stdout.contains("done:"),
        "{t:?}: nothing delivered: {}",
        run.stdout
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    agreed_failure(run, np).to_string()
}

over_transports! {
    fn ranks_given_different_jobs_are_told_which_option_differs(t: Transport) {
        let dir = generated();
        let d = dir.path().join("d");
        let base = || Job::new(&d).batch(12);
        // Different --epochs: once a hang forever under MPI.
        let run = run_per_rank(t, &[base().epochs(2), base().epochs(2), base().epochs(3)]);
        let line = refused(t, &run, 3);
        assert!(line.contains("rank 2: ranks disagree on epochs: 2 (ranks 0-1) vs 3 (rank 2)"), "{line}");
        // Different seeds: once "rank 1 sent 2088 bytes more than planned".
        let run = run_per_rank(t, &[base().seed(1), base().seed(2), base().seed(1)]);
        let line = refused(t, &run, 3);
        assert!(line.contains("rank 1: ranks disagree on seed: 1 (ranks 0, 2) vs 2 (rank 1)"), "{line}");
        // Several at once, each named.
        let run = run_per_rank(t, &[base().tail("pad"), base().window("1K").verify()]);
        let line = refused(t, &run, 2);
        for part in ["verify: false (rank 0) vs true (rank 1)", "window_bytes: 67108864 (rank 0) vs 1024 (rank 1)"] {
            assert!(line.contains(part) || run.stderr.contains(part), "{part}: {line}");
        }
    }

    fn outputs_and_resume_points_are_checked_before_the_first_step(t: Transport) {
        let dir = generated();
        let d = dir.path().join("d");
        let job = || Job::new(&d).batch(12);
        // An unwritable --state (once found by rank 0 alone, after all epochs).
        let nowhere = dir.path().join("no/such/dir/state.json");
        let run = job().state(&nowhere).over(t, 3);
        let line = refused(t, &run, 3);
        assert!(line.contains("state.json: the state file cannot be written"), "{line}");
        let run = job().state(dir.path()).over(t, 2);
        assert!(refused(t, &run, 2).contains("--state names a directory"), "{}", run.stderr);
        // Resume points outside the job: past the last epoch, past an epoch's steps, too big.
        for (from, needle) in [
            ("3:0", "cannot resume at epoch 3 step 0: the job has 2 epoch(s)"),
            ("2:5", "cannot resume at epoch 2 step 5: the job has 2 epoch(s)"),
            ("0:50", "cannot resume at epoch 0 step 50: an epoch has 50 steps"),
            ("18446744073709551616:0", "epoch 18446744073709551616 is out of range: epochs run from 0 to 9007199254740991"),
        ] {
            let run = job().epochs(2).resume_from(from).over(t, 2);
            let line = refused(t, &run, 2);
            assert!(line.contains(needle), "--resume-from {from}: {line}");
        }
        // Epochs beyond what a position holds exactly are refused, never wrapped.
        for (epochs, from) in [(18446744073709551615, "18446744073709551614:0"), (9007199254740993, "0:0")] {
            let run = job().epochs(epochs).resume_from(from).over(t, 2);
            let line = refused(t, &run, 2);
            assert!(line.contains(&format!("--epochs {epochs}: epochs run from 0 to 9007199254740991")), "{line}");
        }
        let run = job().epochs(9007199254740992).resume_from("9007199254740992:0").over(t, 2);
        assert!(refused(t, &run, 2).contains("epoch 9007199254740992 is out of range"), "{}", run.stderr);
        // State files read defensively: a FIFO (once a hang that ignored SIGTERM) and a
        // 1 GiB file (once read whole into every rank's memory) are refused unread.
        let fifo = dir.path().join("fifo.json");
        let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let huge = dir.path().join("huge.json");
        std::fs::File::create(&huge).unwrap().set_len(1 << 30).unwrap();
        for (from, needle) in [
            (&fifo, "fifo.json: not a regular file (a FIFO)"),
            (&huge, "huge.json: 1073741824 bytes: a file of this kind is at most"),
        ] {
            let run = job().epochs(2).resume_from(from).over(t, 2);
            let from = from.display();
            let line = refused(t, &run, 2);
            assert!(line.contains(needle), "--resume-from {from}: {line}");
        }
        let run = job().state(&fifo).over(t, 2);
        assert!(refused(t, &run, 2).contains("fifo.json: --state names something that is not a regular file"));
        // The end of the job is a valid resume point: nothing is left to do.
        let run = job().epochs(2).resume_from("2:0").over(t, 2);
        ok(&run);
        assert!(!run.stdout.contains("epoch 0:") && run.stdout.contains("done: 2 epoch(s)"), "{}", run.stdout);
    }

    fn output_nobody_reads_does_not_fail_the_job(t: Transport) {
        // `meshfeed run --json | head -1`: stdout is closed early; the job runs to its end.
        let dir = generated();
        let d = dir.path().join("d");
        let state = dir.path().join("s.json");
        let job = Job::new(&d).batch(12).epochs(3).json().state(&state);
        let mut cmd = match t {
            Transport::Mpi => {
                let mut c = Command::new("mpirun");
                c.args(MPIRUN_FLAGS).args(["-np", "2", bin()]).args(job.argv());
                c
            }
            Transport::Ucx => {
                let mut c = Command::new(bin());
                c.args(["launch", "-n", "2", "--"]).args(job.transport("ucx").argv()).env("UCX_NET_DEVICES", "lo");
                c
            }
        };
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take()); // nobody reads stdout
        let run = finish(child, "closed stdout");
        assert_eq!(run.code, 0, "{t:?}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked") && !run.stderr.contains("internal error"), "{}", run.stderr);
        let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
        assert_eq!(saved["epoch"], 3, "the job ran to its end");
    }
}

#[test]
fn inspect_and_gen_with_a_closed_stdout_do_not_panic() {
    // `meshfeed inspect ... | head -1` closes the pipe after the first line.
    let dir = generated();
    let d = dir.path().join("d");
    let closed = |args: &[&str]| {
        let mut child = Command::new(bin()).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let run = finish(child, &args.join(" "));
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked") && !run.stderr.contains("Broken pipe"), "{args:?}: {}", run.stderr);
    };
    closed(&["inspect", "--data", d.to_str().unwrap()]);
    closed(&["inspect", "--json", "--data", d.to_str().unwrap()]);
    let out = dir.path().join("g");
    // gen itself, with its stdout closed (Dataset::write reads gen's output).
    closed(&["gen", "--format", "raw", "--samples", "10", "--field", "x:u8", "--out", out.to_str().unwrap()]);
}

/// srun with the wrong `--mpi` plugin starts each task as an MPI singleton (MPICH does):
/// a process whose world has one rank while Slurm started several is refused, naming
/// the variable; `mpirun` inside an allocation (whose ranks inherit the daemons' step,
/// one task per node) is not.
#[test]
fn a_singleton_that_srun_started_as_one_of_several_tasks_is_refused() {
    let data = fixtures().join("npy_struct");
    let job = Job::new(&data).batch(8);
    let mut cmd = Command::new(bin());
    cmd.args(job.argv()).env("SLURM_STEP_NUM_TASKS", "3");
    let run = wait_bounded(cmd, "a singleton in a 3-task step");
    assert_ne!(run.code, 0);
    assert!(
        run.stderr.contains(
            "the launcher started 3 processes (SLURM_STEP_NUM_TASKS) but MPI_COMM_WORLD has 1 rank(s): \
             meshfeed was built against a different MPI than the launcher that started it, or srun used the wrong --mpi plugin"
        ),
        "{}",
        run.stderr
    );
    let mut cmd = Command::new("mpirun");
    cmd.args(MPIRUN_FLAGS).args(["-np", "2", "-x", "SLURM_STEP_NUM_TASKS", bin()]).args(job.argv());
    cmd.env("SLURM_STEP_NUM_TASKS", "1");
    ok(&wait_bounded(cmd, "mpirun -np 2 in a step of 1 task"));
}

/// `--checkpoint FILE`: the first run starts afresh and leaves its state there, the next
/// resumes from it; the two runs' dumps together are one uninterrupted run's. The option
/// stands for `--state` and `--resume-from`, so it refuses to be given with either.
#[test]
fn a_checkpoint_file_resumes_the_stream_where_the_last_run_left_it() {
    let data = fixtures().join("npy_plain");
    let out = tempdir();
    let checkpoint = out.path().join("ckpt.json");
    let job = |epochs, dump: &Path| Job::new(&data).batch(8).epochs(epochs).dump(dump);
    let (first, rest, clean) = (out.path().join("first"), out.path().join("rest"), out.path().join("clean"));
    let r = job(1, &first).checkpoint(&checkpoint).mpirun(2);
    ok(&r);
    assert!(!r.stdout.contains("resuming"), "{}", r.stdout);
    assert!(checkpoint.is_file(), "the first run leaves its state");
    let r = job(2, &rest).checkpoint(&checkpoint).mpirun(2);
    ok(&r);
    assert!(r.stdout.contains("meshfeed: resuming at epoch 1 step 0"), "{}", r.stdout);
    ok(&job(2, &clean).mpirun(2));
    let joined: Vec<Vec<u8>> =
        dump_bytes(&first, 2).into_iter().zip(dump_bytes(&rest, 2)).map(|(a, b)| [a, b].concat()).collect();
    assert!(!joined[0].is_empty() && joined == dump_bytes(&clean, 2), "the two runs are one uninterrupted run");
    // A literal command line: the parser's refusal of it is the test.
    let ck = checkpoint.to_str().unwrap();
    let r = meshfeed(&["run", "--data", "x", "--batch-size", "8", "--checkpoint", ck, "--state", ck]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("--checkpoint") && r.stderr.contains("cannot be used with"), "{}", r.stderr);
}

/// Issue 41, item 8: a state file the OS refuses is named with its error, kind and text —
/// a symbolic link loop given to `--resume-from` was once "no such file" — and only a path
/// that is not there reads as a mistyped `EPOCH:STEP`. The cases fail as root too (a path
/// under a directory it may not enter is tried as `nobody`).
#[test]
fn state_files_the_os_refuses_are_named_with_its_error() {
    let dir = tempdir();
    let data = Dataset::gen("npy", 60).files(1).field("x:u8").write(&dir.path().join("d"));
    let job = || Job::new(&data).batch(6);
    let state = dir.path().join("state.json");
    ok(&job().state(&state).singleton());
    let looping = dir.path().join("loop.json");
    std::os::unix::fs::symlink(&looping, &looping).unwrap();
    let locked = locked_dir(dir.path(), &[("state.json", &state)]);
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let cases = [
        (path(&looping), "loop.json: Too many levels of symbolic links (os error 40)".to_string()),
        (path(dir.path()), format!("{}: Is a directory (os error 21)", dir.path().display())),
        (path(&state.join("x.json")), "state.json/x.json: Not a directory (os error 20)".into()),
        (path(&locked.join("state.json")), "locked/state.json: Permission denied (os error 13)".into()),
        (
            path(&dir.path().join("gone.json")),
            "gone.json': expected EPOCH:STEP or a state file (No such file or directory (os error 2))".into(),
        ),
    ];
    for (from, needle) in &cases {
        let r = meshfeed_unprivileged(&job().resume_from(from).argv());
        assert_ne!(r.code, 0, "--resume-from {from}: {}", r.stdout);
        assert!(!r.stdout.contains("epoch 0:"), "nothing delivered: {}", r.stdout);
        assert!(r.stderr.contains(needle.as_str()), "--resume-from {from}: the error lacks '{needle}':\n{}", r.stderr);
    }
    // `--checkpoint` resumes from what is there: a path it cannot look at is an error, not
    // a fresh start.
    let denied = path(&locked.join("state.json"));
    let r = meshfeed_unprivileged(&job().checkpoint(Path::new(&denied)).argv());
    assert_ne!(r.code, 0, "{}", r.stdout);
    assert!(r.stderr.contains("locked/state.json: --checkpoint: Permission denied (os error 13)"), "{}", r.stderr);
    unlock(&locked);
}
