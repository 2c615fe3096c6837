//! The UCX transport: equivalence with MPI (byte-identical dumps), the local launcher,
//! hostile rendezvous traffic, wrong tokens, concurrent jobs and a rank killed mid-epoch.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::*;

/// Runs the same job (with `extra` options, added last) over MPI and over UCX and
/// compares the dumps byte for byte.
fn same_dump(np: usize, data: &str, extra: fn(Job) -> Job) {
    let out = tempdir();
    let (dm, du) = (out.path().join("mpi"), out.path().join("ucx"));
    let base = extra(Job::new(data).batch(12).epochs(2).seed(4).window("2K"));
    ok(&base.clone().dump(&dm).mpirun(np));
    ok(&base.clone().dump(&du).launch(np));
    let (m, u) = (dump_bytes(&dm, np), dump_bytes(&du, np));
    assert!(m.iter().all(|f| !f.is_empty()));
    assert!(m == u, "{:?} at {np} ranks: UCX dump differs from MPI dump", base.argv());
}

#[test]
fn ucx_dumps_equal_mpi_dumps_for_every_format() {
    let fx = fixtures();
    for np in [1, 2, 3, 4] {
        for d in ["npy_struct", "hdf5", "arrow", "raw", "arrow_var"] {
            same_dump(np, fx.join(d).to_str().unwrap(), |job| job);
        }
    }
}

#[test]
fn ucx_dumps_equal_mpi_dumps_with_replication_and_two_phase() {
    let data = fixtures().join("npy_struct");
    let d = data.to_str().unwrap();
    same_dump(4, d, |job| job.mesh("dp=2,tp=2").shard("x=dp,tp").shard("z=dp,tp"));
    same_dump(4, d, |job| job.mesh("dp=2,tp=2").shard("x=dp,tp").exchange("two-phase"));
}

#[test]
fn launcher_verifies_and_fails_the_job_when_a_rank_fails() {
    let out = tempdir();
    let data = Dataset::gen("arrow", 300).field("x:f32:4").field("t:bytes").write(&out.path().join("g"));
    let run = Job::new(&data).batch(12).epochs(2).verify().launch(3);
    ok(&run);
    assert_eq!(run.stdout.matches("contents match the generator").count(), 2, "{}", run.stdout);
    // A bad file seen by one rank: every rank reports it, the launcher fails the job.
    let bad = out.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    for f in ["part-0.npy", "part-1.npy", "part-2.npy"] {
        std::fs::copy(fixtures().join("npy_struct").join(f), bad.join(f)).unwrap();
    }
    let p = bad.join("part-1.npy");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 5]).unwrap();
    let run = Job::new(&bad).batch(3).launch(3);
    assert_ne!(run.code, 0);
    let line = agreed_failure(&run, 3);
    assert!(line.contains("rank 1: ") && line.contains("part-1.npy") && line.contains("truncated"), "{line}");
}

#[test]
fn hostile_rendezvous_traffic_and_wrong_tokens_are_refused_with_the_job_intact() {
    let data = fixtures().join("npy_plain");
    let out = tempdir();
    let dump = out.path().join("d");
    let port = free_port();
    // The job, dumping to `dir`.
    let job = |dir: &std::path::Path| Job::new(&data).batch(8).dump(dir);
    let by_hand = job(&dump).transport("ucx");
    let args = by_hand.argv();
    let rank0 = spawn_rank(0, 2, port, "the-token", &args, &[]);
    // Wait for rank 0 to listen, then send it junk.
    let start = Instant::now();
    let mut http = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if start.elapsed() < Duration::from_secs(30) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("rank 0 never listened: {e}"),
        }
    };
    http.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut garbage = TcpStream::connect(("127.0.0.1", port)).unwrap();
    garbage.write_all(&[0u8, 255, 1, 254, 2, 253, 3, 252, 4]).unwrap();
    let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // An intruder with the wrong token never joins and exits non-zero.
    let intruder = finish(spawn_rank(1, 2, port, "not-the-token", &args, &[]), "intruder");
    assert_ne!(intruder.code, 0);
    assert!(intruder.stderr.contains("refused rank 1: wrong job token"), "{}", intruder.stderr);
    // The real rank 1 joins and the job completes.
    let rank1 = finish(spawn_rank(1, 2, port, "the-token", &args, &[]), "rank 1");
    let rank0 = finish(rank0, "rank 0");
    ok(&rank0);
    ok(&rank1);
    for needle in ["bad magic \"GET /", "not a meshfeed rendezvous client", "wrong job token"] {
        assert!(rank0.stderr.contains(needle), "rank 0 should log '{needle}':\n{}", rank0.stderr);
    }
    // Nothing of the intruder reached the job: the dump equals a clean run's.
    let clean = out.path().join("clean");
    ok(&job(&clean).launch(2));

    assert!(dump_bytes(&dump, 2) == dump_bytes(&clean, 2));
}

#[test]
fn two_jobs_on_one_host_do_not_mix() {
    let fx = fixtures();
    let out = tempdir();
    let jobs: Vec<_> = [("npy_struct", "a"), ("arrow_var", "b")]
        .into_iter()
        .map(|(d, name)| {
            let dump = out.path().join(name);
            let job = Job::new(fx.join(d)).batch(6).epochs(3).dump(&dump);
            (std::thread::spawn(move || job.launch(3)), dump)
        })
        .collect();
    for (j, dump) in jobs {
        ok(&j.join().unwrap());
        let lines = read_dump(&dump, 3);
        assert!(lines.iter().all(|l| !l.is_empty()));
    }
    assert_eq!(read_dump(&out.path().join("b"), 3)[0][0].crc32.len(), 3, "job b has its own fields x, t, s");
}

#[test]
fn a_rank_killed_mid_epoch_stops_the_others_naming_it() {
    let out = tempdir();
    let data = Dataset::gen("npy", 4000).files(1).field("data:f32:16").write(&out.path().join("g"));
    let port = free_port();
    // Ranks started apart keep logs apart (as pods do): with -v each log says why its rank
    // stopped.
    let job = Job::new(&data).batch(12).window("2K").compute_ms(20).args(["-v"]).transport("ucx");
    let args = job.argv();
    let env = [("MESHFEED_PEER_TIMEOUT", "4")];
    let mut ranks: Vec<_> = (0..3).map(|r| spawn_rank(r, 3, port, "tok", &args, &env)).collect();
    std::thread::sleep(Duration::from_millis(2500));
    let mut victim = ranks.remove(2);
    assert!(victim.try_wait().unwrap().is_none(), "rank 2 must still be running when killed");
    victim.kill().unwrap(); // SIGKILL
    let killed_at = Instant::now();
    victim.wait().unwrap();
    for (r, child) in ranks.into_iter().enumerate() {
        let run = finish(child, &format!("rank {r}"));
        assert_ne!(run.code, 0, "rank {r} must fail when rank 2 dies");
        assert!(killed_at.elapsed() < Duration::from_secs(30), "rank {r} took {:?} to stop", killed_at.elapsed());
        // Rank 0 always prints the cause, naming the rank that noticed the loss (itself or
        // rank 1, whichever did first); rank 1 prints the cause where it noticed, else one
        // line naming the rank that did.
        match run.stderr.lines().find(|l| l.starts_with(&format!("meshfeed: rank {r} stopped: rank "))) {
            Some(_) => assert_ne!(r, 0, "rank 0 always prints the cause"),
            None => {
                let line = run
                    .stderr
                    .lines()
                    .find(|l| {
                        l.starts_with("meshfeed: error on rank 0: ") || l.starts_with("meshfeed: error on rank 1: ")
                    })
                    .unwrap_or_else(|| panic!("rank {r} printed no error line:\n{}", run.stderr));
                assert!(r == 0 || line.starts_with("meshfeed: error on rank 1: "), "rank {r}: {line}");
                assert!(line.contains("lost rank") && line.contains('2'), "rank {r}: {line}");
            }
        }
    }
}

#[test]
fn bench_compares_mpi_and_ucx_in_one_run() {
    let data = fixtures().join("npy_struct");
    let mut cmd = std::process::Command::new("mpirun");
    cmd.args(MPIRUN_FLAGS);
    cmd.args(["-x", "UCX_NET_DEVICES", "-np", "4", bin()]);
    cmd.args([
        "bench",
        "--data",
        data.to_str().unwrap(),
        "--batch-size",
        "8",
        "--epochs",
        "1",
        "--modes",
        "fused",
        "--transports",
        "mpi,ucx-shm,ucx-tcp",
        "--json",
        // Every row crosses the exchange (nothing kept, small rows: no local reads).
        "--memory-budget",
        "0",
    ]);
    let out = cmd.env("UCX_NET_DEVICES", "lo").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let names: Vec<&str> = rows.iter().map(|r| r["transport"].as_str().unwrap()).collect();
    assert_eq!(names, ["mpi", "ucx-shm", "ucx-tcp"]);
    for r in &rows {
        assert_eq!(r["delivered_bytes"], 12 * 8 * 30, "every transport delivers 12 steps × 8 rows × 30 bytes");
        assert!(r["exchange_gb_per_s"].as_f64().unwrap() > 0.0);
    }
}
