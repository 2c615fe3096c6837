//! A shared feeder (`meshfeed serve`): jobs that read a dataset from it receive exactly the
//! stream they would read from the files, at the same time, at their own world sizes; the
//! feeder read the files once; strangers are refused; a feeder that dies fails its clients
//! with an error naming it, on every rank, never a hang.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// A running `meshfeed serve`, stopped when dropped.
struct Serving {
    child: Child,
    rendezvous: PathBuf,
    /// Its first `--json` line (`"kind":"serving"`).
    started: serde_json::Value,
    /// Its stdout.
    out: PathBuf,
}

impl Serving {
    /// Its `--json` line of kind `kind`, once printed.
    fn line(&self, kind: &str) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&self.out).unwrap();
            // (A line being written does not parse yet.)
            let mut lines = text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
            if let Some(v) = lines.find(|v| v["kind"] == kind) {
                return v;
            }
            assert!(start.elapsed() < HANG_LIMIT, "meshfeed serve printed no '{kind}' line:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Serving {
    /// Stops it with SIGTERM, as a user or Slurm would, and returns each rank's
    /// `"kind":"stopped"` line, by rank, once it exited 0.
    fn stop(mut self, ranks: usize) -> Vec<serde_json::Value> {
        // SAFETY: kill(2) on our child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let status = finish_child(&mut self.child).expect("meshfeed serve did not stop on SIGTERM");
        let text = std::fs::read_to_string(&self.out).unwrap();
        let mut lines: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["kind"] == "stopped")
            .collect();
        lines.sort_by_key(|v| v["rank"].as_u64());
        assert_eq!(lines.len(), ranks, "one 'stopped' line a rank:\n{text}");
        assert!(lines.iter().all(|l| l["signal"] == "SIGTERM"), "{text}");
        // A lone feeder exits 0; a launcher, itself signalled, may report the signal.
        assert!(ranks > 1 || status.success(), "meshfeed serve exited {status}");
        lines
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        // SIGTERM: mpirun passes it on to the feeder's ranks (a SIGKILL would orphan them).
        // SAFETY: kill(2) on our child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = finish_child(&mut self.child);
    }
}

/// Waits for `child` within the hang limit; kills it past that.
fn finish_child(child: &mut Child) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < HANG_LIMIT {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    None
}

/// Starts `meshfeed serve` on `data` (name `d`) on `ranks` ranks (under mpirun past one),
/// its rendezvous file and output in `dir`; returns once it serves (its rendezvous file
/// written).
fn serve(data: &Path, dir: &Path, ranks: usize) -> Serving {
    serve_with(data, dir, ranks, false, &[])
}

/// [`serve`], with more of `meshfeed serve`'s options; `ucx`: under `meshfeed launch`, its
/// ranks meeting over UCX.
fn serve_with(data: &Path, dir: &Path, ranks: usize, ucx: bool, options: &[&str]) -> Serving {
    serve_env(data, dir, ranks, ucx, options, &[])
}

/// [`serve_with`], with `env` added to its environment. A feeder of one rank (a singleton)
/// starts without meshfeed's own settings for singletons in its environment, unless `env`
/// sets them: the test's environment must not decide what it checks.
fn serve_env(data: &Path, dir: &Path, ranks: usize, ucx: bool, options: &[&str], env: &[(&str, &str)]) -> Serving {
    let rendezvous = dir.join("d.feeder.json");
    let (out, err) = (dir.join("serve.out"), dir.join("serve.err"));
    let mut cmd = if ucx {
        let mut cmd = Command::new(bin());
        cmd.args(["launch", "-n", &ranks.to_string(), "--"]).env("UCX_NET_DEVICES", "lo");
        cmd.env_remove("MESHFEED_JOB_TOKEN");
        cmd
    } else if ranks > 1 {
        let mut cmd = Command::new("mpirun");
        cmd.args(MPIRUN_FLAGS).args(["-np", &ranks.to_string(), bin()]);
        cmd
    } else {
        Command::new(bin())
    };
    cmd.args(["serve", "--name", "d", "--json", "--data"])
        .arg(data)
        .arg("--rendezvous")
        .arg(&rendezvous)
        .args(options)
        // (Under `meshfeed launch` the default `--transport auto` joins the feeder's ranks
        // over UCX: no flag, as a person would start it.)
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .env("UCX_NET_DEVICES", "lo");
    if ranks == 1 && !ucx {
        for var in SINGLETON_MCA_VARS {
            cmd.env_remove(var);
        }
    }
    let child = cmd
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let mut serving = Serving { child, rendezvous, started: serde_json::Value::Null, out: out.clone() };
    let start = Instant::now();
    // Rank 0 prints its line once the rendezvous file is written.
    while std::fs::read_to_string(&out).unwrap().lines().next().is_none() {
        if let Some(status) = serving.child.try_wait().unwrap() {
            panic!("meshfeed serve exited ({status}):\n{}", std::fs::read_to_string(&err).unwrap());
        }
        assert!(start.elapsed() < HANG_LIMIT, "meshfeed serve did not start within {HANG_LIMIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(serving.rendezvous.exists());
    let line = std::fs::read_to_string(&out).unwrap();
    serving.started = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    serving
}

/// The rendezvous file of `serving`, with `key` changed to `value`.
fn rendezvous_with(serving: &Serving, key: &str, value: &str, dir: &Path) -> PathBuf {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&serving.rendezvous).unwrap()).unwrap();
    v[key] = value.into();
    let path = dir.join(format!("{key}-{value}.feeder.json"));
    std::fs::write(&path, v.to_string()).unwrap();
    path
}

#[test]
fn jobs_reading_from_one_feeder_get_exactly_the_streams_of_the_files() {
    let out = tempdir();
    let data = Dataset::gen("npy", 2400).files(5).field("x:u8:200").field("y:i64").write(&out.path().join("npy"));
    // A feeder of two ranks: each holds and serves half the files.
    let serving = serve(&data, out.path(), 2);
    assert_eq!(
        (serving.started["ranks"].as_u64(), serving.started["shared_memory_ranks"].as_u64()),
        (Some(2), Some(2))
    );
    let file_bytes: u64 = std::fs::read_dir(&data).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    assert_eq!(serving.started["samples"], 2400);

    // Three different jobs at once: 2 ranks (mesh dp=2) with the default strategy; 3 ranks
    // that read at random with nothing kept (every epoch's rows come from the feeder
    // again); 2 tensor-parallel ranks that both receive every row (asked for once, then
    // exchanged); each with its own seed and batch.
    let job = |source: &Path, i: usize| match i {
        0 => (2, Job::new(source).batch(48).seed(3).epochs(3).mesh("dp=2")),
        1 => (3, Job::new(source).batch(60).seed(11).epochs(3).read_strategy("random").memory_budget(0)),
        _ => (2, Job::new(source).batch(40).seed(7).epochs(2).mesh("dp=1,tp=2")),
    };
    let dirs: Vec<PathBuf> = (0..3).map(|i| out.path().join(format!("served-{i}"))).collect();
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..3)
            .map(|i| {
                let ((np, served), dir) = (job(&serving.rendezvous, i), &dirs[i]);
                s.spawn(move || served.dump(dir).mpirun(np))
            })
            .collect();
        for (i, run) in runs.into_iter().enumerate() {
            let run = run.join().unwrap();
            ok(&run);
            // Left to choose, a client keeps nothing: the feeder holds the rows.
            if i == 0 {
                let want = "meshfeed: reads: random — the rows come from the feeder meshfeed://";
                assert!(run.stdout.contains(want), "{}", run.stdout);
            }
            // Each row received by one rank is asked for by it: nothing is exchanged;
            // tensor-parallel ranks exchange the rows one of them asked for.
            let epochs: Vec<&str> = run.stdout.lines().filter(|l| l.starts_with("epoch ")).collect();
            assert!(!epochs.is_empty(), "{}", run.stdout);
            let none = epochs.iter().all(|l| l.contains(", 0.0 MB exchanged"));
            assert_eq!(none, i < 2, "job {i}: {}", run.stdout);
        }
    });
    for (i, dir) in dirs.iter().enumerate() {
        // The same job on the files.
        let (np, on_files) = job(&data, i);
        let standalone = out.path().join(format!("files-{i}"));
        ok(&on_files.dump(&standalone).mpirun(np));
        assert!(
            dump_bytes(dir, np) == dump_bytes(&standalone, np),
            "{np} ranks: the feeder's stream differs from the files'"
        );
    }
    // The jobs started as the feeder began reading; it read each file once, whole (its
    // header aside), whatever the jobs asked.
    let read = serving.line("loaded")["bytes_read"].as_u64().unwrap();
    assert!(read >= 2400 * 208 && read <= file_bytes, "the feeder read {read} bytes of {file_bytes}");
    // The URL form, with the token from the environment: the same stream again.
    let url = serving.started["url"].as_str().unwrap();
    let token: serde_json::Value = serde_json::from_slice(&std::fs::read(&serving.rendezvous).unwrap()).unwrap();
    let by_url = out.path().join("by-url");
    let mut cmd = Command::new("mpirun");
    cmd.args(MPIRUN_FLAGS).args(["-np", "2", "-x", "MESHFEED_FEEDER_TOKEN", bin()]);
    cmd.args(Job::new(url).batch(48).seed(3).epochs(3).mesh("dp=2").dump(&by_url).argv());
    cmd.env("MESHFEED_FEEDER_TOKEN", token["token"].as_str().unwrap());
    ok(&wait_bounded(cmd, "mpirun -np 2 meshfeed run --data meshfeed://..."));
    assert!(dump_bytes(&by_url, 2) == dump_bytes(&dirs[0], 2), "the URL's stream differs");
    // A job whose checkpoint is of another dataset is refused, on every rank: the
    // feeder's dataset has another fingerprint.
    let other = Dataset::gen("npy", 300).field("x:u8:200").field("y:i64").write(&out.path().join("other"));
    let checkpoint = out.path().join("other.json");
    ok(&Job::new(&other).batch(48).seed(3).epochs(1).checkpoint(&checkpoint).mpirun(2));
    let run = Job::new(&serving.rendezvous).batch(48).seed(3).epochs(2).checkpoint(&checkpoint).mpirun(2);
    assert_ne!(run.code, 0, "{}", run.stderr);
    let refused = agreed_failure(&run, 2);
    assert!(refused.contains("dataset samples 300 → 2400"), "{refused}");
    // On the feeder's host, the jobs read the rows from the feeder's memory: every epoch
    // of every job (3 + 3 + 2 + 3) asked for each of the 2400 rows of 208 bytes at least
    // once, and only their places (16 bytes a value) crossed the sockets.
    let stopped = serving.stop(2);
    let sum = |k: &str| stopped.iter().map(|s| s[k].as_u64().unwrap()).sum::<u64>();
    assert!(sum("bytes_mapped") >= 11 * 2400 * 208, "{stopped:?}");
    assert!(sum("bytes_sent") < sum("bytes_mapped") / 4, "{stopped:?}");
}

#[test]
fn a_feeder_past_its_memory_budget_reads_the_rest_from_storage_and_says_what_it_served() {
    let out = tempdir();
    // 4 files of 300 samples of 64 bytes; a feeder of 2 ranks on one host holds 2 files
    // each. Held, a file takes 300 × (64 + 24) bytes: the budget fits one a rank. The
    // feeder's ranks meet over UCX (`meshfeed launch`), and so do its client's.
    let data = Dataset::gen("npy", 1200).files(4).field("x:u8:64").write(&out.path().join("npy"));
    // (7/8 of a rank's budget holds files; the rest caches rows read from storage.)
    let budget = (2 * 31_000).to_string();
    // Without shared memory, every row crosses the sockets.
    let serving = serve_with(&data, out.path(), 2, true, &["--memory-budget", &budget, "--no-shared-memory"]);
    assert_eq!(serving.started["shared_memory_ranks"], 0);
    assert_eq!((serving.started["files"].as_u64(), serving.started["held_files"].as_u64()), (Some(4), Some(2)));
    let (served, files) = (out.path().join("served"), out.path().join("files"));
    let job = |data: &Path, epochs| Job::new(data).batch(48).seed(5).epochs(epochs);
    ok(&job(&serving.rendezvous, 2).dump(&served).launch(3));
    ok(&job(&data, 2).dump(&files).mpirun(3));
    assert!(dump_bytes(&served, 3) == dump_bytes(&files, 3), "the stream of a feeder past its budget differs");
    // A client that spills the feeder's rows to a local directory once and reads them
    // from there gets the same stream.
    let spilled = out.path().join("spilled");
    let spill_dir = out.path().join("spill");
    std::fs::create_dir(&spill_dir).unwrap();
    let spill = |job: Job| job.read_strategy("random").memory_budget(0).spill_dir(&spill_dir);
    let run = spill(job(&serving.rendezvous, 2)).dump(&spilled).mpirun(3);
    ok(&run);
    assert!(run.stdout.contains("the rest spilled"), "{}", run.stdout);
    assert!(dump_bytes(&spilled, 3) == dump_bytes(&files, 3), "a client spilling the feeder's rows differs");
    // A job stopped after an epoch on the files resumes through the feeder (the dataset's
    // fingerprint is the files'): the two runs are the uninterrupted one.
    let (first, rest) = (out.path().join("first"), out.path().join("rest"));
    let checkpoint = out.path().join("ckpt.json");
    ok(&job(&data, 1).checkpoint(&checkpoint).dump(&first).mpirun(3));
    let resumed = job(&serving.rendezvous, 2).checkpoint(&checkpoint).dump(&rest).launch(3);
    ok(&resumed);
    assert!(resumed.stdout.contains("meshfeed: resuming at epoch 1 step 0"), "{}", resumed.stdout);
    let joined: Vec<Vec<u8>> =
        dump_bytes(&first, 3).into_iter().zip(dump_bytes(&rest, 3)).map(|(a, b)| [a, b].concat()).collect();
    assert!(joined == dump_bytes(&files, 3), "resumed through the feeder, the stream differs");
    let loaded = serving.line("loaded");
    assert_eq!(loaded["held_files"], 2);
    let read = loaded["bytes_read"].as_u64().unwrap();
    assert!((2 * 300 * 64..=2 * 300 * 64 + 2 * 4096).contains(&read), "held files read once: {read} bytes");
    // Stopped, each rank says what it read and served: one file held and one read from
    // storage as asked, at least two epochs' rows of both sent.
    let stopped = serving.stop(2);
    for (rank, s) in stopped.iter().enumerate() {
        let n = |k: &str| s[k].as_u64().unwrap();
        assert_eq!((n("held_files"), n("storage_files")), (1, 1), "rank {rank}: {s}");
        // Every window asks for some rows of each file: epochs × their share of 600 rows.
        assert!(n("storage_bytes") >= 2 * 300 * 64, "rank {rank} read its other file every epoch: {s}");
        assert!(n("requests") > 0 && n("bytes_sent") >= 2 * 600 * 64, "rank {rank}: {s}");
        assert_eq!(n("bytes_mapped"), 0, "rank {rank}: {s}");
        // Each job's rank 0 alone attached (three jobs), to the feeder's rank 0; their
        // readers asked for no headers.
        assert_eq!(n("jobs"), 3 * u64::from(rank == 0), "rank {rank}: {s}");
        // Each of the jobs' 3 processes opened one connection to this rank for both of
        // its files (not one a file); the spilling job's ranks read each file once.
        assert_eq!(n("connections"), n("jobs") + 3 * 3, "rank {rank}: {s}");
    }
}

/// Jobs of a sweep that opt into a shared order (`--shared-order`) ask a feeder past its
/// memory budget for the same rows at about the same time: it reads them from storage
/// about once for all, where jobs of their own orders read them once each. Each job still
/// gets exactly the stream it would read from the files.
#[test]
fn jobs_of_a_shared_order_read_the_feeders_storage_about_once_between_them() {
    let out = tempdir();
    // 8 files of 250 samples of 256 bytes; held, a file takes 250 × (256 + 24) bytes. The
    // lone feeder rank holds 4 (7/8 of its budget) and caches about 210 rows read from
    // storage with the rest: a fifth of the 1000 rows it reads from storage each epoch.
    let data = Dataset::gen("npy", 2000).files(8).field("x:u8:256").write(&out.path().join("npy"));
    let budget = 360_000.to_string();
    let job = |data: &Path, seed, order: Option<&str>, dump: &Path| {
        let job = Job::new(data).batch(40).seed(seed).epochs(2).window("40K").dump(dump);
        // Served, a training step's 50 ms: the jobs' start a few tenths of a second apart
        // is a few steps, and the rows asked for since are still in the feeder's cache.
        let job = if data.extension().is_some_and(|e| e == "json") { job.compute_ms(50) } else { job };
        match order {
            Some(order) => job.opt("--shared-order", order),
            None => job,
        }
    };
    // The bytes a feeder read from storage serving `seeds`' jobs at once, each job's
    // stream checked against the files'.
    let storage = |name: &str, seeds: &[u64], order: Option<&str>| {
        let dir = out.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        let serving = serve_with(&data, &dir, 1, false, &["--memory-budget", &budget]);
        assert_eq!(serving.started["held_files"], 4);
        let dumps: Vec<PathBuf> = seeds.iter().map(|s| dir.join(format!("served-{s}"))).collect();
        let rendezvous = &serving.rendezvous;
        std::thread::scope(|scope| {
            let runs: Vec<_> = seeds
                .iter()
                .zip(&dumps)
                .map(|(&seed, dump)| scope.spawn(move || job(rendezvous, seed, order, dump).mpirun(2)))
                .collect();
            runs.into_iter().for_each(|r| ok(&r.join().unwrap()));
        });
        for (&seed, served) in seeds.iter().zip(&dumps) {
            let files = dir.join(format!("files-{seed}"));
            ok(&job(&data, seed, order, &files).mpirun(2));
            assert!(dump_bytes(served, 2) == dump_bytes(&files, 2), "{name}: seed {seed}'s stream differs");
        }
        let stopped = serving.stop(1);
        let n = |k: &str| stopped[0][k].as_u64().unwrap();
        (n("storage_bytes"), n("cache_rows"))
    };
    let (shared, shared_hits) = storage("shared", &[1, 2], Some("7,block=100"));
    let (own, own_hits) = storage("own", &[1, 2], None);
    // One job reads two epochs of 1000 rows of 256 bytes from storage (and a little more:
    // 534 016 bytes measured here), two jobs of their own orders twice that, less the
    // cache's chance hits (1.8 × measured), two of a shared order about once (1.0 ×).
    let lone = 2 * 1000 * 256;
    assert!(shared >= lone, "the rows past the budget come from storage: {shared} bytes");
    assert!((shared as f64) < 1.4 * lone as f64, "two jobs of a shared order read {shared} bytes, one {lone}");
    assert!((own as f64) > 1.6 * lone as f64, "two jobs of their own orders read {own} bytes, one {lone}");
    // The cache answered most of one job's 2000 rows (2100 measured), against chance
    // (about 500).
    assert!(shared_hits >= 1500 && own_hits < 1000, "rows from the cache: shared {shared_hits}, own {own_hits}");
    // Orders of the two seeds differ.
    let first = |name: &str, seed: u64| dump_bytes(&out.path().join(name).join(format!("files-{seed}")), 2);
    assert!(first("shared", 1) != first("shared", 2));
}

#[test]
fn a_feeder_refuses_strangers_and_its_death_fails_every_rank_of_its_clients() {
    let out = tempdir();
    let data = Dataset::gen("npy", 1200).field("x:u8:64").write(&out.path().join("npy"));
    let serving = serve(&data, out.path(), 1);
    let url = serving.started["url"].as_str().unwrap().to_string();
    let address = url.strip_suffix("/d").unwrap();
    // A wrong token, a name the feeder does not serve, a URL without a token: refused on
    // every rank, naming the feeder and the reason.
    let wrong_token = rendezvous_with(&serving, "token", "0000", out.path());
    let wrong_name = rendezvous_with(&serving, "name", "other", out.path());
    for (data, reason) in [
        (wrong_token, "refused: the feeder's token was not presented (wrong token)".to_string()),
        (wrong_name, "refused: this feeder serves 'd', not 'other'".to_string()),
        (PathBuf::from(&url), format!("{url}: no token: set MESHFEED_FEEDER_TOKEN")),
    ] {
        let run = Job::new(&data).batch(40).mpirun(2);
        assert_ne!(run.code, 0, "{}", run.stderr);
        let root = agreed_failure(&run, 2);
        assert!(root.contains(address) && root.contains(&reason), "{reason}: {root}");
    }
    // A client that dies mid-epoch (one of its ranks killed) disturbs nobody: the next
    // client gets its exact stream.
    let doomed = Job::new(&serving.rendezvous).batch(60).epochs(1_000_000);
    let doomed = spawn_mpirun(3, &doomed);
    std::thread::sleep(Duration::from_millis(1500));
    let ranks = children(doomed.id());
    assert_eq!(ranks.len(), 3, "the doomed client's ranks: {ranks:?}");
    // SAFETY: kill(2) on a rank of our child mpirun.
    unsafe { libc::kill(ranks[1] as libc::pid_t, libc::SIGKILL) };
    let run = finish(doomed, "a client with a rank killed");
    assert_ne!(run.code, 0, "{}", run.stderr);
    let (served, files) = (out.path().join("after-served"), out.path().join("after-files"));
    ok(&Job::new(&serving.rendezvous).batch(40).seed(9).epochs(2).dump(&served).mpirun(2));
    ok(&Job::new(&data).batch(40).seed(9).epochs(2).dump(&files).mpirun(2));
    assert!(dump_bytes(&served, 2) == dump_bytes(&files, 2), "the stream after a client died differs");
    // A client reading at random with nothing kept asks the feeder for rows every window;
    // the feeder is killed under it.
    let job = Job::new(&serving.rendezvous).batch(60).epochs(1_000_000).read_strategy("random").memory_budget(0);
    let client = spawn_mpirun(3, &job);
    std::thread::sleep(Duration::from_secs(2));
    drop(serving);
    let run = finish(client, "a client of a killed feeder");
    assert_ne!(run.code, 0, "{}", run.stderr);
    let root = agreed_failure(&run, 3);
    assert!(
        root.contains(&url) && (root.contains("the feeder closed the connection") || root.contains("cannot connect")),
        "{root}"
    );
}

/// A feeder offering UCX (`--client-transport ucx`) sends its clients' large answers as
/// UCX messages, the connections carrying the requests: jobs under mpirun and under
/// `meshfeed launch` get exactly their streams, and a feeder killed under a client still
/// fails it on every rank, naming the feeder.
#[test]
fn a_feeder_offering_ucx_sends_large_answers_over_it_and_its_death_still_fails_its_clients() {
    let out = tempdir();
    // 240 samples of 64 KiB in 4 files: every answer of rows is one of UCX's.
    let data = Dataset::gen("npy", 240).files(4).field("x:u8:65536").write(&out.path().join("npy"));
    // Without shared memory, so that the rows go to this host's jobs over UCX.
    let options = ["--client-transport", "ucx", "--no-shared-memory"];
    let serving = serve_with(&data, out.path(), 2, false, &options);
    assert_eq!(serving.started["client_transport"], "ucx");
    let job = |data: &Path| Job::new(data).batch(24).seed(4).epochs(2);
    let dir = |name: &str| out.path().join(name);
    ok(&job(&serving.rendezvous).dump(&dir("served-2")).mpirun(2));
    ok(&job(&serving.rendezvous).dump(&dir("served-3")).launch(3));
    for np in [2, 3] {
        let files = dir(&format!("files-{np}"));
        ok(&job(&data).dump(&files).mpirun(np));
        let served = dump_bytes(&dir(&format!("served-{np}")), np);
        assert!(served == dump_bytes(&files, np), "{np} ranks: the stream over UCX differs from the files'");
    }
    // A client whose UCX worker the feeder cannot reach (UCX_TLS=self: no transport
    // leaves the process) is answered over its connections, and gets its stream.
    let mut lone = Command::new(bin());
    lone.args(job(&serving.rendezvous).dump(&dir("served-1")).argv()).env("UCX_TLS", "self");
    ok(&wait_bounded(lone, "meshfeed run (UCX_TLS=self) through a feeder offering UCX"));
    ok(&job(&data).dump(&dir("files-1")).mpirun(1));
    assert!(dump_bytes(&dir("served-1"), 1) == dump_bytes(&dir("files-1"), 1), "the stream over TCP differs");
    let log = std::fs::read_to_string(out.path().join("serve.err")).unwrap();
    assert!(log.contains("cannot reach a client's UCX worker"), "{log}");
    // The first two jobs (two epochs each) asked for every row at least once an epoch,
    // over UCX; the connections carried the announcements, and the third job's two
    // epochs (about half what the two sent over UCX).
    let stopped = serving.stop(2);
    let sum = |k: &str| stopped.iter().map(|s| s[k].as_u64().unwrap()).sum::<u64>();
    let (ucx, sent) = (sum("bytes_ucx"), sum("bytes_sent"));
    assert!(ucx >= 2 * 2 * 240 * 65536, "{stopped:?}");
    assert!(sent >= 2 * 240 * 65536 && sent < ucx * 2 / 3, "{stopped:?}");

    // A lone feeder killed (SIGKILL) under a client reading at random, nothing kept.
    let mut serving = serve_with(&data, &dir("."), 1, false, &options);
    let url = serving.started["url"].as_str().unwrap().to_string();
    let job = Job::new(&serving.rendezvous).batch(24).epochs(1_000_000);
    let client = spawn_mpirun(3, &job.args(["--read-strategy", "random", "--memory-budget", "0"]));
    std::thread::sleep(Duration::from_secs(2));
    serving.child.kill().unwrap();
    let run = finish(client, "a client of a killed feeder over UCX");
    assert_ne!(run.code, 0, "{}", run.stderr);
    let root = agreed_failure(&run, 3);
    assert!(root.contains(&url) && root.contains("the feeder closed the connection"), "{root}");
}

/// A stranger on the network, a buggy job holding the token and a process of the same
/// user try to end, starve or change a feeder: idle and dripping connections by the
/// hundred, descriptors run out, a request of 2^36 bytes, writes and truncation through
/// `/proc/PID/fd` of the memory jobs map. The feeder serves on, its threads bounded, and
/// a job afterwards gets its exact stream, its contents verified through the feeder.
#[test]
fn a_hostile_neighbour_neither_ends_nor_starves_the_feeder_nor_changes_its_rows() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    let out = tempdir();
    let data = Dataset::gen("npy", 1200).files(3).field("x:u8:64").field("y:i64").write(&out.path().join("npy"));
    let options = ["--hello-timeout", "2", "--max-unauthenticated", "8"];
    let serving = serve_with(&data, out.path(), 1, false, &options);
    let pid = serving.child.id();
    let url = serving.started["url"].as_str().unwrap().to_string();
    let address = url.strip_prefix("meshfeed://").unwrap().strip_suffix("/d").unwrap().to_string();
    serving.line("loaded");
    let status = |key: &str| -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = text.lines().find(|l| l.starts_with(key)).unwrap();
        line[key.len()..].trim().parse().unwrap()
    };
    let threads = status("Threads:");

    // 200 strangers that send 3 bytes and wait: the feeder holds 8 of them at most, a
    // thread each, and closes each within the hello's 2 s.
    let strangers: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut s = TcpStream::connect(&address).unwrap();
            s.write_all(b"abc").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    assert!(status("Threads:") <= threads + 8, "{} threads, {threads} before", status("Threads:"));
    for mut s in strangers {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(matches!(s.read(&mut [0u8; 16]), Ok(0) | Err(_)), "a stranger was held past its hello's deadline");
    }

    // A job's process holding the token announces a request of 2^36 bytes: told why, its
    // connection closed, nothing allocated.
    let token: serde_json::Value = serde_json::from_slice(&std::fs::read(&serving.rendezvous).unwrap()).unwrap();
    let token = token["token"].as_str().unwrap();
    let mut buggy = TcpStream::connect(&address).unwrap();
    let frame = |payload: &[u8]| [&(payload.len() as u64).to_le_bytes()[..], payload].concat();
    let text = |s: &str| [&(s.len() as u64).to_le_bytes()[..], s.as_bytes()].concat();
    let hello = [&b"MFEED\x004\n"[..], &text(token), &text("d"), &[0, 0]].concat();
    buggy.write_all(&frame(&hello)).unwrap();
    buggy.write_all(&(1u64 << 36).to_le_bytes()).unwrap();
    buggy.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answers = Vec::new();
    buggy.read_to_end(&mut answers).unwrap();
    let answers = String::from_utf8_lossy(&answers);
    assert!(
        answers.contains("a request of 68719476736 bytes; a request for rows of this dataset holds at most"),
        "{answers}"
    );

    // Its memory, as a process of the same user (root here) reaches it: every region the
    // jobs map is sealed, so no write, no truncation, no writable mapping.
    let mut regions = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let path = entry.unwrap().path();
        if !std::fs::read_link(&path).is_ok_and(|l| l.to_string_lossy().starts_with("/memfd:meshfeed-feeder")) {
            continue;
        }
        regions += 1;
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let err = std::os::unix::fs::FileExt::write_at(&file, &[0xff; 64], 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{}: {err}", path.display());
        let err = file.set_len(0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{}: {err}", path.display());
    }
    assert!(regions >= 2, "the probe and a region holding the files: {regions}");

    // Descriptors run out: accept fails, the feeder says so and serves on.
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    let prlimit = |n: usize| {
        // (The soft limit only: the hard one cannot be raised again here.)
        let limit = format!("--nofile={n}:");
        let run = Command::new("prlimit").args(["--pid", &pid.to_string(), &limit]).output().unwrap();
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    };
    prlimit(fds);
    let crowd: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(&address).unwrap()).collect();
    let log = out.path().join("serve.err");
    let start = Instant::now();
    while !std::fs::read_to_string(&log).unwrap().contains("accept: Too many open files (os error 24); serving on") {
        assert!(start.elapsed() < Duration::from_secs(20), "{}", std::fs::read_to_string(&log).unwrap());
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(crowd);
    prlimit(4096);

    // A job now: its exact stream, and through the feeder its contents are checked.
    let (served, files) = (out.path().join("served"), out.path().join("files"));
    let run = Job::new(&serving.rendezvous).batch(40).seed(5).epochs(2).verify().dump(&served).mpirun(2);
    ok(&run);
    assert!(run.stdout.contains("contents match the generator"), "{}", run.stdout);
    ok(&Job::new(&data).batch(40).seed(5).epochs(2).dump(&files).mpirun(2));
    assert!(dump_bytes(&served, 2) == dump_bytes(&files, 2), "the stream after the attacks differs from the files'");
    let stopped = serving.stop(1);
    assert!(stopped[0]["evicted"].as_u64().unwrap() >= 150, "{stopped:?}");
}

/// A rendezvous file that is a FIFO (or anything but a regular file) is refused at once,
/// on every rank, never waited on.
#[test]
fn a_rendezvous_file_that_is_a_fifo_fails_the_job_at_once() {
    let out = tempdir();
    let fifo = out.path().join("d.feeder.json");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let start = Instant::now();
    let run = Job::new(&fifo).batch(8).mpirun(2);
    assert_ne!(run.code, 0, "{}", run.stderr);
    let root = agreed_failure(&run, 2);
    assert!(root.contains("d.feeder.json") && root.contains("not a regular file (a FIFO)"), "{root}");
    assert!(start.elapsed() < Duration::from_secs(60), "{:?}", start.elapsed());
}

/// `mpirun -np NP meshfeed <job>` started in the background (stdout discarded).
/// Issue 41, item 7: started without a launcher, a feeder listens on its documented
/// socket only (`--listen`'s default: 127.0.0.1, a free port), and a job of one process
/// reading from it on none: Open MPI's singleton would add its TCP transport on all
/// addresses (`0.0.0.0:1024`, `[::]:1024`) and a daemon listening on all addresses too.
#[test]
fn a_lone_feeder_and_a_lone_job_listen_on_nothing_but_the_feeders_socket() {
    let out = tempdir();
    let data = Dataset::gen("npy", 2400).files(2).field("x:u8:200").write(&out.path().join("npy"));
    let serving = serve(&data, out.path(), 1);
    let url = serving.started["url"].as_str().unwrap();
    let host_port = url.strip_prefix("meshfeed://").and_then(|u| u.strip_suffix("/d")).unwrap();
    let address: std::net::SocketAddr = host_port.parse().unwrap();
    assert_eq!(address.ip(), std::net::Ipv4Addr::LOCALHOST, "{url}");
    let feeder = serving.child.id();
    let only = |pid: u32, want: Vec<std::net::SocketAddr>, what: &str| {
        let found = listeners(pid);
        let got: Vec<(&str, std::net::SocketAddr, u32)> =
            found.iter().map(|l| (l.protocol, l.address, l.pid)).collect();
        let want: Vec<(&str, std::net::SocketAddr, u32)> = want.into_iter().map(|a| ("tcp", a, pid)).collect();
        assert_eq!(got, want, "{what} listens on: {found:#?}");
        assert_eq!(process_tree(pid), vec![pid], "{what} started no other process (an orted)");
    };
    only(feeder, vec![address], "the feeder");

    // A job of one process reading from it, looked at once it has delivered an epoch (MPI
    // is initialised) and while it still runs.
    let (job_out, job_err) = (out.path().join("job.out"), out.path().join("job.err"));
    let mut cmd = Command::new(bin());
    cmd.args(Job::new(&serving.rendezvous).batch(48).epochs(3).compute_ms(40).json().argv());
    for var in SINGLETON_MCA_VARS {
        cmd.env_remove(var);
    }
    let mut job = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&job_out).unwrap())
        .stderr(std::fs::File::create(&job_err).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::fs::read_to_string(&job_out).unwrap().lines().next().is_none() {
        assert!(
            job.try_wait().unwrap().is_none(),
            "the job ended early:\n{}",
            std::fs::read_to_string(&job_err).unwrap()
        );
        assert!(start.elapsed() < HANG_LIMIT, "the job delivered no epoch within {HANG_LIMIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    only(job.id(), vec![], "the job");
    only(feeder, vec![address], "the feeder, serving a job");
    assert!(job.try_wait().unwrap().is_none(), "the job still ran when looked at: make its epochs longer");
    let status = finish_child(&mut job).expect("the job ended");
    let text = std::fs::read_to_string(&job_out).unwrap();
    assert!(
        status.success() && text.lines().count() == 3,
        "{status}: {text}{}",
        std::fs::read_to_string(&job_err).unwrap()
    );
    assert_eq!(serving.stop(1)[0]["jobs"], 1);
}

/// A user's own Open MPI settings win over meshfeed's for singletons: with the TCP
/// transport asked for, a lone feeder listens on it too (which also shows that the
/// listing above sees MPI's listeners).
#[test]
fn a_lone_feeder_keeps_the_users_own_mpi_settings() {
    let out = tempdir();
    let data = Dataset::gen("npy", 200).files(1).field("x:u8:8").write(&out.path().join("npy"));
    // The TCP transport on loopback (bound to all addresses all the same), so that a host
    // with no other network still has it.
    let env = [("OMPI_MCA_btl", "self,tcp"), ("OMPI_MCA_btl_tcp_if_include", "lo")];
    let serving = serve_env(&data, out.path(), 1, false, &[], &env);
    let feeder = serving.child.id();
    let found = listeners(feeder);
    assert!(
        found.iter().any(|l| l.protocol == "tcp" && l.address.ip().is_unspecified() && l.pid == feeder),
        "{found:#?}"
    );
    assert!(found.iter().any(|l| l.address.ip().is_loopback()), "and its own socket: {found:#?}");
    serving.stop(1);
}

fn spawn_mpirun(np: usize, job: &Job) -> Child {
    Command::new("mpirun")
        .args(MPIRUN_FLAGS)
        .args(["-np", &np.to_string(), bin()])
        .args(job.argv())
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The pids of `pid`'s children.
fn children(pid: u32) -> Vec<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    text.split_whitespace().map(|p| p.parse().unwrap()).collect()
}
