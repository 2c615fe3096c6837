//! Launchers under faults (issue 9): `meshfeed launch` as a supervisor (its ranks die
//! with it, even when it is SIGKILLed; ranks that ignore a forwarded SIGTERM are killed
//! after `--grace`; a rank killed by a signal is reported by name), a rank of another job
//! with the same token and port, a rank that publishes a malformed UCX worker address,
//! and stopping a job by signalling `mpirun`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// A unique value for `MESHFEED_TEST_MARKER`, which every process of one launch inherits,
/// so that they can be found in /proc whoever their parent is now.
fn marker(name: &str) -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    format!("{name}-{}-{n}", std::process::id())
}

/// Field 3 (state) and field 4 (parent pid) of /proc/PID/stat.
fn stat(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = stat.rsplit(')').next()?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((state, ppid))
}

fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()).collect()
}

fn environ_has(pid: i32, var: &str) -> bool {
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    env.split(|&b| b == 0).any(|v| v == var.as_bytes())
}

/// Live processes (not zombies: those have exited and only wait to be reaped) carrying
/// `MESHFEED_TEST_MARKER=marker`, other than `except`.
fn marked(marker: &str, except: u32) -> Vec<i32> {
    let var = format!("MESHFEED_TEST_MARKER={marker}");
    pids()
        .into_iter()
        .filter(|&p| p != except as i32 && environ_has(p, &var))
        .filter(|&p| stat(p).is_some_and(|(s, _)| s != 'Z' && s != 'X'))
        .collect()
}

/// Polls `f` every 50 ms until it returns `Some` or `limit` passes.
fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `meshfeed launch ARGS`, its output going to files in `dir`, with `marker` in its
/// environment.
fn start_launcher(dir: &Path, marker: &str, args: &[&str]) -> Child {
    Command::new(bin())
        .arg("launch")
        .args(args)
        .env("MESHFEED_TEST_MARKER", marker)
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .env("UCX_NET_DEVICES", "lo")
        .env_remove("MESHFEED_JOB_TOKEN")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("launcher.out")).unwrap())
        .stderr(std::fs::File::create(dir.join("launcher.err")).unwrap())
        .spawn()
        .unwrap()
}

/// Waits for our own child with the hang limit; returns its exit code (-1: a signal) and
/// how long it took.
fn wait_child(child: &mut Child, what: &str) -> (i32, Duration) {
    let start = Instant::now();
    let status = poll(HANG_LIMIT, || child.try_wait().unwrap()).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what} hung for more than {HANG_LIMIT:?}")
    });
    (status.code().unwrap_or(-1), start.elapsed())
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a process this test started (or one of its ranks).
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

#[test]
fn sigkill_to_the_launcher_takes_every_rank_with_it() {
    let out = tempdir();
    let data = Dataset::gen("npy", 20000).field("data:f32:8").write(&out.path().join("d"));
    let job = Job::new(&data).transport("ucx").batch(12).compute_ms(20);
    let job = job.argv();
    // Real meshfeed ranks, and ranks that ignore SIGTERM and SIGINT (SIG_IGN survives exec).
    let ignoring = ["-c", "trap '' TERM INT; exec sleep 120"];
    let cases: Vec<Vec<&str>> = vec![
        ["-n", "3", "--"].iter().chain(&job).copied().collect(),
        ["-n", "3", "--exe", "/bin/sh", "--"].iter().chain(&ignoring).copied().collect(),
    ];
    for args in cases {
        let m = marker("sigkill");
        let mut launcher = start_launcher(out.path(), &m, &args);
        let ranks = poll(Duration::from_secs(30), || {
            let r = marked(&m, launcher.id());
            (r.len() == 3).then_some(r)
        })
        .unwrap_or_else(|| panic!("{args:?}: the 3 ranks never ran"));
        for &r in &ranks {
            assert_eq!(stat(r).map(|(_, ppid)| ppid), Some(launcher.id() as i32), "ranks are the launcher's children");
        }
        std::thread::sleep(Duration::from_millis(1500)); // well into the job
        launcher.kill().unwrap(); // SIGKILL: no chance to pass anything on
        launcher.wait().unwrap();
        let left = poll(Duration::from_secs(10), || {
            let left = marked(&m, launcher.id());
            left.is_empty().then_some(())
        });
        assert!(left.is_some(), "{args:?}: ranks outlived the launcher: {:?}", marked(&m, launcher.id()));
    }
}

#[test]
fn ranks_ignoring_a_forwarded_sigterm_are_killed_after_the_grace() {
    let out = tempdir();
    let m = marker("grace");
    let mut launcher = start_launcher(
        out.path(),
        &m,
        &[
            "-n",
            "2",
            "--grace",
            "1",
            "--exe",
            "/bin/sh",
            "--",
            "-c",
            "trap 'echo ignoring TERM' TERM; while :; do sleep 0.1; done",
        ],
    );
    poll(Duration::from_secs(30), || (marked(&m, launcher.id()).len() >= 2).then_some(()))
        .expect("the ranks never ran");
    std::thread::sleep(Duration::from_millis(300));
    signal(launcher.id(), libc::SIGTERM);
    let (code, took) = wait_child(&mut launcher, "meshfeed launch");
    let err = std::fs::read_to_string(out.path().join("launcher.err")).unwrap();
    assert_eq!(code, 137, "{err}");
    assert!(took < Duration::from_secs(10), "the launcher took {took:?} to give up on the ranks");
    assert!(
        err.contains(
            "meshfeed launch: rank(s) [0, 1] did not exit within 1 s of signal 15 (SIGTERM); killing them (SIGKILL)"
        ),
        "{err}"
    );
    assert!(std::fs::read_to_string(out.path().join("launcher.out")).unwrap().contains("ignoring TERM"));
    assert!(poll(Duration::from_secs(5), || marked(&m, launcher.id()).is_empty().then_some(())).is_some());

    // A second stop signal kills them at once, whatever the grace.
    let m = marker("twice");
    let mut launcher = start_launcher(
        out.path(),
        &m,
        &["-n", "2", "--grace", "600", "--exe", "/bin/sh", "--", "-c", "trap '' INT; exec sleep 120"],
    );
    poll(Duration::from_secs(30), || (marked(&m, launcher.id()).len() >= 2).then_some(()))
        .expect("the ranks never ran");
    signal(launcher.id(), libc::SIGINT);
    std::thread::sleep(Duration::from_millis(500));
    signal(launcher.id(), libc::SIGINT);
    let (code, took) = wait_child(&mut launcher, "meshfeed launch");
    let err = std::fs::read_to_string(out.path().join("launcher.err")).unwrap();
    assert_eq!(code, 137, "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(err.contains("signal 2 (SIGINT) again: killing the remaining rank(s) [0, 1]"), "{err}");
}

#[test]
fn a_forwarded_sigterm_stops_meshfeed_ranks_with_code_75() {
    let out = tempdir();
    let data = Dataset::gen("npy", 20000).field("data:f32:8").write(&out.path().join("d"));
    let state = out.path().join("state.json");
    let m = marker("stop");
    let job = Job::new(&data).transport("ucx").batch(12).compute_ms(5).state(&state);
    let mut launcher = start_launcher(out.path(), &m, &[&["-n", "3", "--"][..], &job.argv()].concat());
    poll(Duration::from_secs(30), || (marked(&m, launcher.id()).len() == 3).then_some(())).expect("ranks never ran");
    std::thread::sleep(Duration::from_millis(2500));
    signal(launcher.id(), libc::SIGTERM);
    let (code, took) = wait_child(&mut launcher, "meshfeed launch");
    let err = std::fs::read_to_string(out.path().join("launcher.err")).unwrap();
    assert_eq!(code, 75, "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(err.contains("stopped by SIGTERM at epoch"), "{err}");
    assert!(!err.contains("meshfeed launch:"), "a clean stop needs no word from the launcher: {err}");
    assert!(state.exists());
}

#[test]
fn a_rank_killed_by_a_signal_is_reported_by_name() {
    // Rank 2 dies of SIGSEGV (no core file: `ulimit -c 0`); the others wait to be stopped.
    let script = "ulimit -c 0; if [ \"$RANK\" = 2 ]; then sleep 0.5; kill -SEGV $$; fi; exec sleep 60";
    let run = launch_program(3, "/bin/sh", &["-c", script]);
    assert_eq!(run.code, 139, "{}", run.stderr);
    assert!(
        run.stderr.contains("meshfeed launch: rank 2 was killed by signal 11 (SIGSEGV); stopping the other ranks"),
        "{}",
        run.stderr
    );
    assert!(run.elapsed < Duration::from_secs(30), "{:?}", run.elapsed);
    // An exit code is still reported as one.
    let run = launch_program(2, "/bin/sh", &["-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 60"]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(
        run.stderr.contains("meshfeed launch: rank 1 exited with code 3; stopping the other ranks"),
        "{}",
        run.stderr
    );
}

/// Connects to rank 0's rendezvous port, retrying while it starts.
fn connect(port: u16) -> TcpStream {
    poll(Duration::from_secs(30), || TcpStream::connect(("127.0.0.1", port)).ok()).expect("rank 0 never listened")
}

/// A version-2 hello (the protocol documented in src/transport/rendezvous.rs).
fn hello(token: &str, job_id: &str, rank: u32, world: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = b"MFRV".to_vec();
    m.push(2);
    m.extend((token.len() as u16).to_le_bytes());
    m.extend(token.as_bytes());
    m.extend((job_id.len() as u16).to_le_bytes());
    m.extend(job_id.as_bytes());
    for v in [rank, world, payload.len() as u32] {
        m.extend(v.to_le_bytes());
    }
    m.extend(payload);
    m
}

#[test]
fn a_rank_of_another_job_with_the_same_token_and_port_is_refused() {
    let data = fixtures().join("npy_plain");
    let out = tempdir();
    let job = |dir: &Path| Job::new(&data).transport("ucx").batch(8).epochs(2).dump(dir);
    let dump = out.path().join("a");
    let job_a = job(&dump);
    let args = job_a.argv();
    let port = free_port();
    let rank0 = spawn_rank(0, 2, port, "shared", &args, &[("MESHFEED_JOB_ID", "job-a")]);
    drop(connect(port));
    // Job B's rank 1 reaches job A's rank 0 (same port, same token): refused, exits 1.
    let other = out.path().join("b");
    let job_b = job(&other);
    let intruder = finish(spawn_rank(1, 2, port, "shared", &job_b.argv(), &[("MESHFEED_JOB_ID", "job-b")]), "job B");
    assert_eq!(intruder.code, 1, "{}", intruder.stderr);
    assert!(
        intruder.stderr.contains("refused rank 1: job id \"job-b\" is not this job's (\"job-a\")"),
        "{}",
        intruder.stderr
    );
    // Job A's own rank 1 joins and the job completes with the dump of a clean run.
    let rank1 = finish(spawn_rank(1, 2, port, "shared", &args, &[("MESHFEED_JOB_ID", "job-a")]), "rank 1");
    let rank0 = finish(rank0, "rank 0");
    ok(&rank0);
    ok(&rank1);
    assert!(rank0.stderr.contains("job id \"job-b\" is not this job's"), "rank 0 logs the refusal:\n{}", rank0.stderr);
    let clean = out.path().join("clean");
    ok(&launch(2, &job(&clean).argv()));
    assert!(dump_bytes(&dump, 2) == dump_bytes(&clean, 2), "job A's dump equals a clean run's");
}

/// A framed worker address (the frame of src/transport/ucx/address.rs) around `address`.
fn framed(address: &[u8]) -> Vec<u8> {
    let mut m = b"MFWA".to_vec();
    m.push(1);
    m.extend(1u16.to_le_bytes());
    m.extend(13u16.to_le_bytes());
    m.extend((address.len() as u32).to_le_bytes());
    m.extend(crc32fast::hash(address).to_le_bytes());
    m.extend(address);
    m
}

#[test]
fn a_malformed_worker_address_fails_every_rank_cleanly_naming_the_sender() {
    let data = fixtures().join("npy_plain");
    let job = Job::new(&data).transport("ucx").batch(6);
    let args = job.argv();
    // A UCX-shaped address whose format version UCX 1.13 does not know: passed to
    // ucp_ep_create, it fails an assertion and aborts the process.
    let mut unknown_version = vec![0x2a];
    unknown_version.extend([7u8; 60]);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        ((0..200u32).map(|i| (i * 37 + 11) as u8).collect(), "not a meshfeed worker address"),
        (framed(&unknown_version), "address format version 10"),
    ];
    for (payload, needle) in cases {
        let port = free_port();
        let real: Vec<(usize, Child)> =
            [0, 2].into_iter().map(|r| (r, spawn_rank(r, 3, port, "tok", &args, &[]))).collect();
        // The fake rank 1 holds the token and speaks the protocol, but publishes garbage.
        let mut fake = connect(port);
        fake.write_all(&hello("tok", "", 1, 3, &payload)).unwrap();
        fake.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut kind = [0u8; 2];
        fake.read_exact(&mut kind).unwrap();
        assert_eq!(&kind, b"OK", "the rendezvous itself accepts it: the payload is opaque there");
        let started = Instant::now();
        for (r, child) in real {
            let run = finish(child, &format!("rank {r}"));
            assert_eq!(run.code, 1, "rank {r} exits 1, not by a signal:\n{}", run.stderr);
            let line = error_line(&run, r);
            assert!(
                line.contains("rank 1 published an invalid UCX worker address") && line.contains(needle),
                "rank {r}: {line}"
            );
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    }
}

/// mpirun's children that are ranks of its job (by OMPI_COMM_WORLD_RANK).
fn mpirun_ranks(mpirun: u32) -> Vec<i32> {
    pids()
        .into_iter()
        .filter(|&p| stat(p).is_some_and(|(_, ppid)| ppid == mpirun as i32))
        .filter(|&p| {
            let env = std::fs::read(format!("/proc/{p}/environ")).unwrap_or_default();
            env.split(|&b| b == 0).any(|v| v.starts_with(b"OMPI_COMM_WORLD_RANK="))
        })
        .collect()
}

/// `(epoch, step)` of the resume line rank 0 printed, and of the state file; and the
/// last step every rank dumped.
fn stop_point(stderr: &str, state: &Path, dump: &Path, np: usize) -> ((u64, u64), (u64, u64), Vec<(u64, u64)>) {
    let line = stderr.lines().find(|l| l.contains("resume with --resume-from")).unwrap_or_else(|| panic!("{stderr}"));
    let (e, k) = line.rsplit("--resume-from ").next().unwrap().trim().split_once(':').unwrap();
    let printed = (e.parse().unwrap(), k.parse().unwrap());
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(state).unwrap()).unwrap();
    let saved = (saved["epoch"].as_u64().unwrap(), saved["step"].as_u64().unwrap());
    let last = read_dump(dump, np).iter().map(|l| l.last().map(|l| (l.epoch, l.step)).unwrap()).collect();
    (printed, saved, last)
}

/// Whether `last` (a dumped step) is the step just before `next` (a resume point).
fn just_before(last: (u64, u64), next: (u64, u64)) -> bool {
    (last.0, last.1 + 1) == next || (next.1 == 0 && last.0 + 1 == next.0)
}

/// Starts `mpirun -np 3 [mpirun_args] meshfeed run ...` stopping-ready (state, dump),
/// and waits until rank 0 has dumped some steps.
fn start_mpirun_job(dir: &Path, mpirun_args: &[&str]) -> Child {
    let data = Dataset::gen("npy", 20000).field("data:f32:8").write(&dir.join("d"));
    let dump = dir.join("dump");
    let child = Command::new("mpirun")
        .args(MPIRUN_FLAGS)
        .args(mpirun_args)
        .args(["-np", "3", bin()])
        .args(Job::new(&data).batch(12).epochs(3).compute_ms(5).state(&dir.join("state.json")).dump(&dump).argv())
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("mpirun.out")).unwrap())
        .stderr(std::fs::File::create(dir.join("mpirun.err")).unwrap())
        .spawn()
        .unwrap();
    let rank0 = dump.join("rank-0.jsonl");
    poll(Duration::from_secs(60), || (std::fs::metadata(&rank0).map(|m| m.len()).unwrap_or(0) > 0).then_some(()))
        .expect("the job never delivered a step");
    child
}

#[test]
fn sigterm_to_the_ranks_under_mpirun_stops_them_with_code_75() {
    let out = tempdir();
    let mut mpirun = start_mpirun_job(out.path(), &[]);
    let ranks = mpirun_ranks(mpirun.id());
    assert_eq!(ranks.len(), 3, "mpirun's ranks: {ranks:?}");
    // As Slurm does on preemption: every rank gets SIGTERM itself.
    for r in ranks {
        signal(r as u32, libc::SIGTERM);
    }
    let (code, _) = wait_child(&mut mpirun, "mpirun");
    let err = std::fs::read_to_string(out.path().join("mpirun.err")).unwrap();
    assert_eq!(code, 75, "mpirun passes the ranks' 75 on:\n{err}");
    let (printed, saved, last) = stop_point(&err, &out.path().join("state.json"), &out.path().join("dump"), 3);
    assert_eq!(printed, saved);
    assert!(last.iter().all(|&l| just_before(l, saved)), "every rank stopped before {saved:?}: {last:?}");
}

#[test]
fn sigterm_to_mpirun_saves_the_state_and_prints_the_resume_line() {
    // mpirun (OpenMPI 4.1) answers SIGTERM/SIGINT with SIGCONT to the ranks, SIGTERM one
    // `odls_base_sigkill_timeout` later and SIGKILL one more later. The default (1 s) is
    // enough here but not on a loaded machine; 10 s keeps the test from racing the kill.
    let out = tempdir();
    let mut mpirun = start_mpirun_job(out.path(), &["--mca", "odls_base_sigkill_timeout", "10"]);
    signal(mpirun.id(), libc::SIGTERM);
    let (code, took) = wait_child(&mut mpirun, "mpirun");
    let err = std::fs::read_to_string(out.path().join("mpirun.err")).unwrap();
    // mpirun reports its own failure, whatever the ranks did.
    assert_ne!(code, 0, "{err}");
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert!(err.contains("meshfeed: stopped by SIGTERM at epoch"), "{err}");
    let (printed, saved, last) = stop_point(&err, &out.path().join("state.json"), &out.path().join("dump"), 3);
    assert_eq!(printed, saved);
    assert!(last.iter().all(|&l| just_before(l, saved)), "every rank stopped before {saved:?}: {last:?}");
}

#[test]
fn options_and_variables_out_of_range_are_clear_errors_not_panics() {
    // The launcher's own options: a value the parser can tell is wrong exits 2.
    for g in ["inf", "nan", "-1", "1e9"] {
        let run = meshfeed(&["launch", "-n", "1", "--grace", g, "--", "run"]);
        assert_eq!(run.code, 2, "--grace {g}: {}", run.stderr);
        assert!(run.stderr.contains("expected a number of seconds from 0 to 1e6"), "{}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    }
    for n in ["0", "99999999"] {
        let run = meshfeed(&["launch", "-n", n, "--exe", "/bin/true", "--", "x"]);
        assert_eq!(run.code, 1, "{}", run.stderr);
        assert!(run.stderr.contains(&format!("-n {n}: expected 1 to 1048576 ranks")), "{}", run.stderr);
    }
    let mut cmd = Command::new(bin());
    cmd.args(["launch", "-n", "1", "--exe", "/bin/true", "--", "x"]).env("MESHFEED_JOB_TOKEN", "t".repeat(2000));
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("MESHFEED_JOB_TOKEN has 2000 bytes; at most 1024"));
    // A rank's environment: every bad value is one error line naming the variable, exit 1.
    let data = fixtures().join("npy_plain");
    let job = Job::new(&data).transport("ucx").batch(6);
    let args = job.argv();
    for (var, value, needle) in [
        ("WORLD_SIZE", "99999999999", "WORLD_SIZE 99999999999 exceeds the 1048576 ranks"),
        ("MASTER_PORT", "0", "MASTER_PORT='0' is not a TCP port"),
        ("MESHFEED_RENDEZVOUS_TIMEOUT", "inf", "MESHFEED_RENDEZVOUS_TIMEOUT='inf'"),
        ("MESHFEED_RENDEZVOUS_TIMEOUT", "1e-300", "MESHFEED_RENDEZVOUS_TIMEOUT='1e-300'"),
        ("MESHFEED_PEER_TIMEOUT", "nan", "MESHFEED_PEER_TIMEOUT='nan'"),
        ("MESHFEED_PEER_TIMEOUT", "-inf", "MESHFEED_PEER_TIMEOUT='-inf'"),
        ("MESHFEED_UCX_PEER_ERRORS", "2", "MESHFEED_UCX_PEER_ERRORS='2'"),
    ] {
        let run = finish(spawn_rank(0, 1, free_port(), "t", &args, &[(var, value)]), var);
        assert_eq!(run.code, 1, "{var}={value}: {}", run.stderr);
        assert!(error_line(&run, 0).contains(needle), "{var}={value}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    }
}

/// A SIGTERM that reaches a rank while the ranks still meet (a pod deleted as its job
/// starts) does not kill it: once the job has met, every rank stops cleanly after its
/// first step, exits 75 (which Kubernetes manifests and Slurm scripts restart), and rank
/// 0 writes the state, from which the job resumes to the end: the two runs' dumps
/// together are an uninterrupted run's.
#[test]
fn a_sigterm_while_the_ranks_meet_is_a_clean_stop() {
    let data = fixtures().join("npy_plain");
    let out = tempdir();
    let state = out.path().join("state.json");
    let job = |dump: &Path| Job::new(&data).transport("ucx").batch(8).epochs(2).dump(dump);
    let first = out.path().join("first");
    let stopped = job(&first).state(&state);
    let args = stopped.argv();
    let port = free_port();
    let rank0 = spawn_rank(0, 2, port, "tok", &args, &[]);
    drop(connect(port)); // rank 0 listens: it waits for rank 1 at the rendezvous
                         // SAFETY: kill(2) on a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(rank0.id() as i32, libc::SIGTERM) }, 0);
    std::thread::sleep(Duration::from_millis(300));
    let rank1 = finish(spawn_rank(1, 2, port, "tok", &args, &[]), "rank 1");
    let rank0 = finish(rank0, "rank 0");
    assert_eq!((rank0.code, rank1.code), (75, 75), "rank 0:\n{}\nrank 1:\n{}", rank0.stderr, rank1.stderr);
    assert!(rank0.stderr.contains("meshfeed: stopped by SIGTERM at epoch 0 step "), "{}", rank0.stderr);
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(saved["epoch"], 0, "{saved}");
    let rest = out.path().join("rest");
    ok(&launch(2, &job(&rest).resume_from(&state).argv()));
    let clean = out.path().join("clean");
    ok(&launch(2, &job(&clean).argv()));
    let (a, b) = (dump_bytes(&first, 2), dump_bytes(&rest, 2));
    let joined: Vec<Vec<u8>> = a.into_iter().zip(b).map(|(x, y)| [x, y].concat()).collect();
    assert!(
        !joined[0].is_empty() && joined == dump_bytes(&clean, 2),
        "the stopped and resumed runs' dumps are a clean run's"
    );
}

/// A rank that ends — even with code 0 — before every rank joined the rendezvous used to
/// leave the others waiting out the rendezvous timeout (120 s): the launcher knows it
/// ended, and stops the others after a moment, exiting 1 and naming the rank. Ranks that
/// never meet (a program that is no meshfeed job) still end on their own, exit 0.
#[test]
fn a_rank_that_ends_before_the_rendezvous_stops_the_others_at_once() {
    let dir = tempdir();
    let data = Dataset::gen("npy", 600).field("data:f32:8").write(&dir.path().join("d"));
    let script = format!(
        "if [ \"$RANK\" = 1 ]; then exit 0; fi; exec {} run --transport ucx --data {} --batch-size 12",
        bin(),
        data.display()
    );
    for ranks in ["2", "3"] {
        let m = marker("early-exit");
        let mut launcher =
            start_launcher(dir.path(), &m, &["-n", ranks, "--grace", "2", "--exe", "sh", "--", "-c", &script]);
        let (code, took) = wait_child(&mut launcher, "meshfeed launch with a rank that ends at once");
        let err = std::fs::read_to_string(dir.path().join("launcher.err")).unwrap();
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("meshfeed launch: rank 1 exited with code 0 before every rank joined the rendezvous"),
            "{err}"
        );
        // The settle (3 s), SIGTERM and at most the grace (2 s): far below the rendezvous
        // timeout the others waited out before.
        assert!(took < Duration::from_secs(20), "took {took:?}: {err}");
        assert!(marked(&m, launcher.id()).is_empty(), "no rank outlives the launcher");
    }
    // No meshfeed job: every rank ends on its own, one later than the others.
    let m = marker("no-job");
    let mut launcher = start_launcher(
        dir.path(),
        &m,
        &["-n", "3", "--exe", "sh", "--", "-c", "if [ \"$RANK\" = 2 ]; then sleep 1; fi; exit 0"],
    );
    let (code, _) = wait_child(&mut launcher, "meshfeed launch of ranks that never meet");
    assert_eq!(code, 0, "{}", std::fs::read_to_string(dir.path().join("launcher.err")).unwrap());
}
