//! Reliability (docs/design.md: resumption, bounded memory, no hangs): clean stops on
//! SIGTERM at a step boundary, exact resumption across rank counts, meshes and
//! transports, fingerprint checks, tail policies, the memory budget and a soak test
//! (over MPI and UCX), bounded memory with and without prefetch, and a rank SIGKILLed
//! under mpirun (UCX: tests/behaviour/ucx.rs).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::common::*;

/// Global batches of a dump as (epoch, step) → ids of the given ranks' rows, in rank order.
fn ids_by_step(dir: &std::path::Path, np: usize, ranks: &[usize]) -> BTreeMap<(u64, u64), Vec<u64>> {
    let dump = read_dump(dir, np);
    let mut out: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
    for &r in ranks {
        for l in &dump[r] {
            out.entry((l.epoch, l.step)).or_default().extend(&l.ids);
        }
    }
    out
}

#[test]
fn sigterm_stops_every_rank_at_one_step_and_the_stream_resumes_exactly_elsewhere() {
    let out = tempdir();
    let data = out.path().join("d");
    Dataset::gen("npy", 3000).field("data:f32:8").write(&data);
    // The uninterrupted reference, one process.
    let reference = out.path().join("ref");
    ok(&Job::new(&data).batch(12).epochs(2).dump(&reference).mpirun(1));
    let reference = ids_by_step(&reference, 1, &[0]);
    assert_eq!(reference.len(), 2 * 250);

    // Three UCX ranks, stopped by SIGTERM mid-epoch (as Slurm preempts a job).
    let first = out.path().join("first");
    let state = out.path().join("state.json");
    let job = Job::new(&data).transport("ucx").batch(12).epochs(2).compute_ms(5).dump(&first).state(&state);
    let port = free_port();
    let ranks: Vec<_> = (0..3).map(|r| spawn_rank(r, 3, port, "tok", &job.argv(), &[])).collect();
    std::thread::sleep(Duration::from_millis(2000));
    for c in &ranks {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    }
    let runs: Vec<Run> = ranks.into_iter().enumerate().map(|(r, c)| finish(c, &format!("rank {r}"))).collect();
    for (r, run) in runs.iter().enumerate() {
        assert_eq!(run.code, 75, "rank {r} exits with 75 (stopped, resumable):\n{}", run.stderr);
    }
    let line = runs[0]
        .stderr
        .lines()
        .find(|l| l.contains("stopped by SIGTERM"))
        .unwrap_or_else(|| panic!("{}", runs[0].stderr));
    let resume = line.rsplit("--resume-from ").next().unwrap().trim().to_string();
    let (e, k): (u64, u64) = {
        let (a, b) = resume.split_once(':').unwrap();
        (a.parse().unwrap(), b.parse().unwrap())
    };
    assert!((e, k) > (0, 0) && (e, k) < (2, 0), "stopped mid-run: {resume}");
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!((saved["epoch"].as_u64().unwrap(), saved["step"].as_u64().unwrap()), (e, k));
    let before = ids_by_step(&first, 3, &[0, 1, 2]);
    let last = if k > 0 { (e, k - 1) } else { (e - 1, 249) };
    assert_eq!(before.keys().last(), Some(&last), "every rank stopped after the same step");

    // Resume from the state file on 2 ranks (MPI), and from EPOCH:STEP on a 4-rank mesh.
    let second = out.path().join("second");
    let r = Job::new(&data).batch(12).epochs(2).resume_from(&state).dump(&second).verify().mpirun(2);
    ok(&r);
    assert!(r.stdout.contains(&format!("resuming at epoch {e} step {k}")), "{}", r.stdout);
    let mut joined = before.clone();
    joined.extend(ids_by_step(&second, 2, &[0, 1]));
    assert_eq!(joined, reference, "stopped + resumed stream equals the uninterrupted one");

    let third = out.path().join("third");
    let resumed = Job::new(&data).batch(12).epochs(2).resume_from(&resume);
    ok(&resumed.mesh("dp=2,tp=2").opt("--shard", "data=dp,tp").dump(&third).mpirun(4));
    // Ranks 0 and 2 (tp = 0) hold the two halves of every batch's rows.
    let mut joined = before;
    joined.extend(ids_by_step(&third, 4, &[0, 2]));
    assert_eq!(joined, reference, "resumed on another mesh");
}

over_transports! {
    fn a_state_from_another_stream_is_refused_naming_the_change(t: Transport) {
        let out = tempdir();
        let data = out.path().join("d");
        Dataset::gen("npy", 500).field("data:u8:4").write(&data);
        let state = out.path().join("s.json");
        ok(&Job::new(&data).batch(10).seed(3).state(&state).over(t, 2));
        for (args, needle) in [
            (vec!["--batch-size", "20", "--seed", "3"], "batch size 10 → 20"),
            (vec!["--batch-size", "10", "--seed", "4"], "seed 3 → 4"),
            (vec!["--batch-size", "10", "--seed", "3", "--shared-order", "7,block=50"], "shared order none → 7,block=50"),
        ] {
            let run = Job::new(&data).resume_from(&state).args(args).over(t, 2);
            assert_ne!(run.code, 0);
            let line = agreed_failure(&run, 2);
            assert!(line.contains(needle), "{line}");
        }
        // Another dataset.
        let other = out.path().join("o");
        Dataset::gen("npy", 600).field("data:u8:4").write(&other);
        let run = Job::new(&other).batch(10).seed(3).resume_from(&state).over(t, 2);
        assert!(run.code != 0 && agreed_failure(&run, 2).contains("dataset samples 500 → 600"), "{}", run.stderr);
        // The state of a finished run resumes to nothing more; a state one epoch further on runs it.
        let run = Job::new(&data).batch(10).seed(3).epochs(2).resume_from(&state).verify().over(t, 2);
        ok(&run);
        assert_eq!(run.stdout.matches("delivered exactly once").count(), 1, "only epoch 1 remains: {}", run.stdout);
    }
}

over_transports! {
    fn soak_many_epochs_small_windows_prime_sizes(t: Transport) {
        let out = tempdir();
        let data = out.path().join("d");
        Dataset::gen("npy", 1009).field("x:f32:3").write(&data);
        let run = Job::new(&data).batch(28).epochs(25).window("911").verify().over(t, 4);
        ok(&run);
        let verified = run
            .stdout
            .lines()
            .filter(|l| l.contains("1008 samples delivered exactly once, in permutation order; contents match"))
            .count();
        assert_eq!(verified, 25, "{}", run.stdout);
    }
}

/// Peak RSS (max over ranks) of one epoch, keeping nothing in memory (what the window
/// budget alone bounds; the strategies' budgets: tests/behaviour/memory.rs).
fn peak_rss(data: &std::path::Path, window: &str, prefetch: usize) -> u64 {
    let job = Job::new(data).batch(32).window(window).opt("--prefetch", prefetch).json();
    let run = job.opt("--memory-budget", 0).mpirun(4);
    ok(&run);
    let last: serde_json::Value = serde_json::from_str(run.stdout.lines().last().unwrap()).unwrap();
    last["max_rss_bytes"].as_u64().unwrap()
}

#[test]
fn memory_is_bounded_by_the_window_and_prefetch_not_the_dataset() {
    let out = tempdir();
    let (tiny, big, bigger) = (out.path().join("tiny"), out.path().join("big"), out.path().join("bigger"));
    // Big enough that the window budget, not the minimum number of windows per epoch,
    // sets the window length in both.
    Dataset::gen("npy", 200).field("data:f32:1024").write(&tiny);
    Dataset::gen("npy", 12000).field("data:f32:1024").write(&big); // 48 MB: 12 MB per rank, 12x the window
    Dataset::gen("npy", 48000).field("data:f32:1024").write(&bigger); // 192 MB: 48 MB per rank, 48x the window
    let window = 1u64 << 20;
    for prefetch in [0, 2] {
        let base = peak_rss(&tiny, "1M", prefetch);
        let (b1, b2) = (peak_rss(&big, "1M", prefetch), peak_rss(&bigger, "1M", prefetch));
        // Documented bound: the pipeline holds at most (prefetch + 1) × --window-bytes;
        // peak RSS ≤ baseline process + 1.5 × that (allocator slack) + 2 MB.
        let bound = base + (prefetch as u64 + 1) * window * 3 / 2 + (2 << 20);
        assert!(
            b1 <= bound && b2 <= bound,
            "prefetch {prefetch}: peak RSS {b1} / {b2} bytes exceeds {bound} (baseline {base})"
        );
        assert!(b2 <= b1 + (2 << 20), "prefetch {prefetch}: 4x the data must not need more memory: {b1} → {b2}");
    }
}

#[test]
fn a_rank_killed_under_mpirun_ends_the_job_naming_it() {
    let out = tempdir();
    let data = out.path().join("d");
    Dataset::gen("npy", 4000).field("data:f32:16").write(&data);
    let mut cmd = std::process::Command::new("mpirun");
    cmd.args(MPIRUN_FLAGS);
    cmd.args(["-np", "3", bin()]);
    cmd.args(Job::new(&data).batch(12).compute_ms(20).window("2K").argv());
    let child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    // Find rank 2 among mpirun's children by its OMPI_COMM_WORLD_RANK.
    let victim = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid: i32 = stat
                .rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().nth(1))
                .and_then(|p| p.parse().ok())
                .unwrap_or(-1);
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            ppid == child.id() as i32 && env.split(|&b| b == 0).any(|v| v == b"OMPI_COMM_WORLD_RANK=2")
        })
        .expect("rank 2 is running under mpirun");
    // SAFETY: kill(2) with SIGKILL on rank 2 of our own job.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let killed = Instant::now();
    let run = finish(child, "mpirun");
    assert_ne!(run.code, 0);
    assert!(killed.elapsed() < Duration::from_secs(30), "the job took {:?} to stop", killed.elapsed());
    assert!(
        run.stderr.contains("rank 2") && run.stderr.contains("signal 9"),
        "mpirun names the lost rank:\n{}",
        run.stderr
    );
    assert!(!run.stdout.contains("done:"));
}

over_transports! {
    fn tail_policies_at_several_rank_counts(t: Transport) {
        let out = tempdir();
        let data = out.path().join("d");
        Dataset::gen("npy", 103).field("x:f32:4").write(&data);
        for tail in ["drop", "pad", "partial"] {
            let mut reference: Option<BTreeMap<(u64, u64), Vec<u64>>> = None;
            for np in [1, 3, 4] {
                let dump = out.path().join(format!("{tail}-{np}"));
                let job = Job::new(&data).batch(12).epochs(2).opt("--tail", tail).window("300").verify();
                let run = job.dump(&dump).over(t, np);
                ok(&run);
                assert_eq!(run.stdout.matches("delivered exactly once").count(), 2, "{tail} np {np}: {}", run.stdout);
                let ranks: Vec<usize> = (0..np).collect();
                let batches = ids_by_step(&dump, np, &ranks);
                let (steps, last_len) = match tail {
                    "drop" => (8, 12),
                    "pad" => (9, 12),
                    _ => (9, 7),
                };
                assert_eq!(batches.len(), 2 * steps, "{tail} np {np}");
                assert_eq!(batches[&(0, steps as u64 - 1)].len(), last_len, "{tail} np {np}: last batch");
                if tail == "pad" {
                    // The padding is the start of the epoch's order: the first batch's first 5 ids.
                    assert_eq!(batches[&(0, 8)][7..], batches[&(0, 0)][..5]);
                }
                if tail == "partial" && np == 4 {
                    // 7 rows over 4 ranks: blocks of 1, 2, 2, 2 rows.
                    let lines = read_dump(&dump, 4);
                    let sizes: Vec<usize> = lines.iter().map(|l| l[8].ids.len()).collect();
                    assert_eq!(sizes, vec![1, 2, 2, 2]);
                }
                match &reference {
                    None => reference = Some(batches),
                    Some(r) => assert_eq!(&batches, r, "{tail}: np {np} differs from np 1"),
                }
            }
        }
        // A partial batch on a mesh with replication: 7 rows over dp=2 blocks, tp replicas.
        let dump = out.path().join("mesh");
        let job = Job::new(&data).batch(12).opt("--tail", "partial").mesh("dp=2,tp=2").opt("--shard", "x=dp,tp");
        ok(&job.verify().dump(&dump).over(t, 4));
        let lines = read_dump(&dump, 4);
        let sizes: Vec<usize> = lines.iter().map(|l| l[8].ids.len()).collect();
        assert_eq!(sizes, vec![3, 3, 4, 4]);
        assert_eq!(lines[0][8].ids, lines[1][8].ids, "tp replicas get the same rows");
    }
}

over_transports! {
    /// The memory budget decides how much of the data stays in memory (it replaced
    /// `--cache-bytes`): all of it is read once, then never; half of it is read once and
    /// the other half every epoch; with none, everything every epoch. Memory grows by no
    /// more than the budget.
    fn a_memory_budget_keeps_what_fits_and_reads_the_rest(t: Transport) {
        let out = tempdir();
        let data = out.path().join("d");
        Dataset::gen("npy", 4000).field("data:f32:256").write(&data); // 4 MB, 1 MB per rank
        let epochs = |budget: &str| -> Vec<serde_json::Value> {
            let job = Job::new(&data).batch(32).epochs(3).window("256K").opt("--read-strategy", "random");
            let run = job.opt("--memory-budget", budget).verify().json().over(t, 4);
            ok(&run);
            run.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
        };
        let read = |v: &[serde_json::Value], e: usize| v[e]["bytes_read"].as_u64().unwrap();
        let all = epochs("8M");
        assert!(all.iter().all(|e| e["verified"] == true));
        assert_eq!(read(&all, 0), 4000 * 1024, "the first epoch reads the dataset exactly once");
        assert_eq!((read(&all, 1), read(&all, 2)), (0, 0));
        // Half the data in memory: the other half is read every epoch.
        let half = epochs("2M");
        assert!(half.iter().all(|e| e["verified"] == true));
        for e in 1..3 {
            let r = read(&half, e);
            assert!((1000 * 1024..3000 * 1024).contains(&r), "epoch {e} read {r} bytes with half the data kept");
        }
        let none = epochs("0");
        assert!(none.iter().all(|e| e["bytes_read"].as_u64().unwrap() >= 4000 * 1024 && e["verified"] == true));
        // A rank's RSS counts the kept rows of its host it touched (its own and those it
        // copied from the others): at most the 2 MiB budget, plus 2 MiB of run-to-run noise.
        let rss = |v: &[serde_json::Value]| v[2]["max_rss_bytes"].as_u64().unwrap();
        assert!(rss(&half) <= rss(&none) + (4 << 20), "{} vs {}", rss(&half), rss(&none));
    }
}

#[test]
fn an_invalid_option_on_one_rank_only_stops_every_rank() {
    let out = tempdir();
    let data = out.path().join("d");
    Dataset::gen("npy", 200).field("x:u8:4").write(&data);
    // MPMD launch: ranks 0-1 get a valid mesh, rank 2 a mesh that does not fit the world.
    let mut cmd = std::process::Command::new("mpirun");
    cmd.args(MPIRUN_FLAGS);
    cmd.args(["-np", "2", bin()]).args(Job::new(&data).batch(6).mesh("dp=3").argv()).arg(":");
    cmd.args(["-np", "1", bin()]).args(Job::new(&data).batch(6).mesh("dp=2,tp=2").argv());
    let start = Instant::now();
    let run =
        finish(cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap(), "mpmd");
    assert_ne!(run.code, 0);
    assert!(start.elapsed() < Duration::from_secs(30));
    let line = agreed_failure(&run, 3);
    assert!(line.contains("rank 2: ranks disagree on mesh: dp=3 (ranks 0-1) vs dp=2,tp=2 (rank 2)"), "{line}");
    assert!(!line.contains("on every rank"), "{line}");
}

#[test]
fn a_stop_signal_on_one_rank_stops_every_rank_after_the_same_step() {
    let out = tempdir();
    let data = out.path().join("d");
    Dataset::gen("npy", 6000).field("data:f32:8").write(&data);
    let dump = out.path().join("dump");
    let job = Job::new(&data).transport("ucx").batch(12).epochs(3).compute_ms(2).dump(&dump);
    let port = free_port();
    let ranks: Vec<_> = (0..3).map(|r| spawn_rank(r, 3, port, "tok", &job.argv(), &[])).collect();
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) on our own child, rank 1 only.
    unsafe { libc::kill(ranks[1].id() as i32, libc::SIGTERM) };
    let runs: Vec<Run> = ranks.into_iter().enumerate().map(|(r, c)| finish(c, &format!("rank {r}"))).collect();
    for (r, run) in runs.iter().enumerate() {
        assert_eq!(run.code, 75, "rank {r} stops with the others:\n{}", run.stderr);
    }
    assert!(runs[0].stderr.contains("stopped by SIGTERM"), "rank 0 names the signal rank 1 got:\n{}", runs[0].stderr);
    let lines = read_dump(&dump, 3);
    let last: Vec<(u64, u64)> = lines.iter().map(|l| l.last().map(|l| (l.epoch, l.step)).unwrap()).collect();
    assert!(last.iter().all(|&l| l == last[0]), "every rank stopped after the same step: {last:?}");
    assert!(last[0] < (2, 499), "stopped before the end: {last:?}");
}
