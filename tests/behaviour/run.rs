//! Multi-rank tests of `meshfeed run`, over MPI (real `mpirun`) and UCX (`meshfeed
//! launch`), on files written by numpy, h5py and pyarrow: exactly once, byte exactness, world-size invariance, the `--dump`
//! format, `--verify` and `--json`.

use std::collections::BTreeSet;
use std::path::Path;

use crate::common::*;

const NPS: [usize; 4] = [1, 2, 3, 4];

/// Runs `dataset` at 1..4 ranks and checks every delivered row against expected.json.
/// Returns the global batch sequence (identical at every rank count).
fn check_dataset(t: Transport, dataset: &Path, extra: &[&str]) -> GlobalBatches {
    let exp = expected(dataset);
    let (b, epochs) = (12u64, 2u64);
    let steps = exp.samples / b;
    let mut reference = None;
    for np in NPS {
        let out = tempdir();
        let dump = out.path().join("dump");
        // A small window budget forces several exchange windows per epoch.
        let job = Job::new(dataset).batch(12).epochs(2).seed(5).window("700").dump(&dump).args(extra);
        let run = job.over(t, np);
        ok(&run);
        let lines = read_dump(&dump, np);
        for (r, l) in lines.iter().enumerate() {
            assert!(l.iter().all(|l| l.ids.len() as u64 == b / np as u64), "rank {r} of {np}: B/P rows per step");
        }
        let batches = global_batches(&lines);
        assert_eq!(batches.len() as u64, epochs * steps, "{}: steps", dataset.display());
        for e in 0..epochs {
            let mut seen = BTreeSet::new();
            for ((epoch, _), rows) in batches.iter().filter(|((epoch, _), _)| *epoch == e) {
                assert_eq!(*epoch, e);
                for (id, crcs) in rows {
                    assert!(
                        seen.insert(*id),
                        "{}: np {np}: sample {id} delivered twice in epoch {e}",
                        dataset.display()
                    );
                    let names: BTreeSet<&String> = crcs.keys().collect();
                    assert_eq!(names, exp.fields.iter().collect(), "fields delivered");
                    for (f, crc) in crcs {
                        assert_eq!(
                            *crc,
                            exp.crc32[f][*id as usize],
                            "{}: np {np}: sample {id} field {f}: bytes differ from the file",
                            dataset.display()
                        );
                    }
                }
            }
            assert_eq!(seen.len() as u64, steps * b, "epoch {e}: every full batch delivered");
        }
        // Epochs are shuffled differently.
        assert_ne!(batches[0].1, batches[steps as usize].1);
        match &reference {
            None => reference = Some(batches),
            Some(r) => assert_eq!(
                &batches,
                r,
                "{}: np {np} delivers a different global batch sequence than np 1",
                dataset.display()
            ),
        }
    }
    reference.unwrap()
}

over_transports! {
    fn xyz_in_every_format_gives_identical_batches(t: Transport) {
        let fx = fixtures();
        let npy = check_dataset(t, &fx.join("npy_struct"), &[]);
        for other in ["hdf5", "arrow", "raw", "arrow_stream", "arrow_lz4", "arrow_zstd", "parquet"] {
            let batches = check_dataset(t, &fx.join(other), &[]);
            assert_eq!(batches, npy, "{other} delivers other batches than npy for the same samples");
        }
    }

    fn dumps_are_byte_identical_across_formats(t: Transport) {
        let fx = fixtures();
        let dump_of = |name: &str| {
            let out = tempdir();
            let dump = out.path().join("d");
            ok(&Job::new(fx.join(name)).batch(10).seed(3).dump(&dump).over(t, 2));
            dump_bytes(&dump, 2)
        };
        let npy = dump_of("npy_struct");
        for other in ["hdf5", "arrow", "raw", "arrow_stream"] {
            assert!(dump_of(other) == npy, "{other} dump differs from npy dump");
        }
        let line = String::from_utf8(npy[0].clone()).unwrap();
        assert!(line.starts_with("{\"epoch\":0,\"step\":0,\"ids\":["), "{line}");
        assert!(line.contains("\"crc32\":{\"x\":["), "fields sorted by name: {line}");
    }

    /// `--fields z,x` delivers the same stream (ids, placement) with only those fields,
    /// byte for byte as the full run's, for formats that read only them (HDF5, Arrow
    /// streams) and those that read whole records (npy, raw).
    fn a_field_selection_delivers_those_fields_of_the_same_stream(t: Transport) {
        let fx = fixtures();
        for (name, np) in [("hdf5", 3), ("arrow_stream", 2), ("npy_struct", 1), ("raw", 4)] {
            let out = tempdir();
            let (full, some) = (out.path().join("full"), out.path().join("some"));
            ok(&Job::new(fx.join(name)).batch(12).epochs(2).seed(3).window("700").dump(&full).over(t, np));
            let job = Job::new(fx.join(name)).batch(12).epochs(2).seed(3).window("700").dump(&some);
            ok(&job.fields("z,x").over(t, np));
            let (full, some) = (read_dump(&full, np), read_dump(&some, np));
            for (a, b) in full.iter().flatten().zip(some.iter().flatten()) {
                assert_eq!((a.epoch, a.step, &a.ids), (b.epoch, b.step, &b.ids), "{name}, {np} ranks");
                let kept: Vec<&(String, Vec<u32>)> = a.crc32.iter().filter(|(f, _)| f == "x" || f == "z").collect();
                assert_eq!(kept, b.crc32.iter().collect::<Vec<_>>(), "{name}, {np} ranks: step {}", a.step);
            }
            assert_eq!(full.iter().flatten().count(), some.iter().flatten().count());
            let r = Job::new(fx.join(name)).batch(12).fields("x,w").over(t, np);
            assert_ne!(r.code, 0);
            assert!(r.stderr.contains("--fields names unknown field 'w' (fields: x, y, z)"), "{}", r.stderr);
        }
    }

    /// WebDataset shards written by `webdataset.TarWriter`: every sample exactly once per
    /// epoch with each member's bytes (CRCs from Python's tarfile), the same global batches
    /// at every rank count.
    /// Token lists (Arrow `List<int32>` and `LargeList<int64>`, some empty): each row's
    /// elements exactly once per epoch, the same batches at every rank count; also as
    /// Hugging Face `datasets` saved them itself (`save_to_disk`).
    fn arrow_lists_of_numbers(t: Transport) {
        check_dataset(t, &fixtures().join("arrow_lists"), &[]);
        check_dataset(t, &fixtures().join("parquet_lists"), &[]);
        check_dataset(t, &fixtures().join("hf_datasets"), &[]);
    }

    /// Megatron indexed datasets written by megatron.core's `IndexedDatasetBuilder`: every
    /// document's tokens exactly once per epoch, the same batches at every rank count.
    fn megatron_indexed_datasets(t: Transport) {
        check_dataset(t, &fixtures().join("megatron"), &[]);
    }

    /// Sequence packing (`--pack`) of a Megatron corpus (an end-of-document token after each
    /// document) and of Parquet and Arrow token lists (none, some documents empty): every packed
    /// sample exactly once per epoch, its inputs, labels, positions and document starts
    /// equal to an independent packing written in Python (`pack_reference` in
    /// make_fixtures.py), the same batches at every rank count.
    fn packed_sequences_equal_an_independent_packing(t: Transport) {
        check_dataset(t, &fixtures().join("megatron_packed"), &["--pack", "tokens:16,eos=0,position_ids,cu_seqlens"]);
        for lists in ["parquet_lists_packed", "arrow_lists_packed"] {
            check_dataset(t, &fixtures().join(lists), &["--pack", "tokens:8,position_ids,cu_seqlens"]);
        }
    }

    /// A DataFrame saved by `pandas.DataFrame.to_feather` (LZ4-compressed IPC) as it is.
    fn pandas_feather_files(t: Transport) {
        check_dataset(t, &fixtures().join("pandas_feather"), &[]);
    }

    fn webdataset_shards_from_tarwriter(t: Transport) {
        check_dataset(t, &fixtures().join("wds"), &[]);
    }

    fn plain_f16_bool_npy(t: Transport) {
        let fx = fixtures();
        for d in ["npy_plain", "npy_f16", "npy_bool"] {
            check_dataset(t, &fx.join(d), &[]);
        }
    }

    fn arrow_variable_length_fields(t: Transport) {
        check_dataset(t, &fixtures().join("arrow_var"), &[]);
    }

    fn hdf5_group_option(t: Transport) {
        let fx = fixtures();
        check_dataset(t, &fx.join("hdf5_group"), &["--group", "train"]);
    }
}

#[test]
fn chunked_exchange_equals_direct_exchange() {
    let fx = fixtures();
    let data = fx.join("arrow_var");
    let dump = |cap: Option<&str>| {
        let out = tempdir();
        let d = out.path().join("d");
        let mut job = Job::new(&data).batch(8).epochs(2).dump(&d);
        if let Some(c) = cap {
            job = job.opt("--max-round-bytes", c);
        }
        ok(&job.mpirun(4));
        dump_bytes(&d, 4)
    };
    // 64 bytes per round over 4 ranks: 16-byte pieces, many rounds per window.
    assert!(dump(Some("64")) == dump(None));
}

over_transports! {
    fn verify_generated_datasets_in_every_format(t: Transport) {
        for (format, fields) in [
            ("npy", vec!["x:f32:3x4", "y:i64", "z:u8:5", "h:f16:2", "b:bool:3"]),
            ("raw", vec!["x:f64:2", "y:i16"]),
            // 1 KiB and more: read straight into the send buffers.
            ("npy", vec!["x:f32:1024", "y:i64"]),
            ("raw", vec!["x:u8:5000"]),
            ("hdf5", vec!["x:f32:8", "y:i32", "b:bool"]),
            ("arrow", vec!["x:f32:2x3", "y:u16", "t:bytes", "s:utf8"]),
        ] {
            let out = tempdir();
            let data = fields
                .iter()
                .fold(Dataset::gen(format, 997), |d, f| d.field(f))
                .args(["--arrow-batch-rows", "100"])
                .write(&out.path().join(format));
            for np in [3, 4] {
                let run = Job::new(&data).batch(24).epochs(2).window("4K").verify().over(t, np);
                ok(&run);
                let steps = 997 / 24;
                assert_eq!(
                    run.stdout
                        .matches("delivered exactly once, in permutation order; contents match the generator")
                        .count(),
                    2,
                    "{}",
                    run.stdout
                );
                assert!(run.stdout.contains(&format!("{} samples delivered exactly once", steps * 24)), "{}", run.stdout);
                assert!(run.stdout.contains("done: 2 epoch(s) on"), "{}", run.stdout);
            }
        }
    }

    /// A job of a shared order (`--shared-order`) is a stream like any other: delivered
    /// exactly once in its own order (which the verifier derives from the same options),
    /// the same at any world size, resumed exactly from a checkpoint; and its own seed
    /// still matters.
    fn a_shared_order_is_exact_world_size_invariant_and_resumable(t: Transport) {
        let out = tempdir();
        let data = Dataset::gen("npy", 1001).files(3).field("x:u16:3").write(&out.path().join("d"));
        let epochs = |seed, epochs, dump: &Path| {
            let job = Job::new(&data).batch(24).seed(seed).epochs(epochs).window("2K");
            job.opt("--shared-order", "9,block=64").dump(dump)
        };
        let job = |seed, dump: &Path| epochs(seed, 2, dump);
        let (two, three) = (out.path().join("two"), out.path().join("three"));
        let run = job(1, &two).verify().over(t, 2);
        ok(&run);
        let verified = "delivered exactly once, in permutation order; contents match the generator";
        assert_eq!(run.stdout.matches(verified).count(), 2, "{}", run.stdout);
        ok(&job(1, &three).over(t, 3));
        let global = |dir: &Path, np| global_batches(&read_dump(dir, np));
        assert!(global(&two, 2) == global(&three, 3), "the stream depends on the ranks");
        // Another seed of the same shared order: another stream, over the same samples
        // block by block (64 positions); the job's own order (no shared order) is another.
        let other = out.path().join("other");
        ok(&job(2, &other).over(t, 2));
        assert!(global(&other, 2) != global(&two, 2), "the job's own seed changed nothing");
        let blocks = |dir: &Path, np| -> Vec<Vec<u64>> {
            let ids: Vec<u64> = global(dir, np).into_iter().flat_map(|(_, rows)| rows.into_iter().map(|(id, _)| id)).collect();
            // Each epoch delivers 41 batches of 24 (984 positions): 15 whole blocks each.
            let sorted = |block: &[u64]| {
                let mut block = block.to_vec();
                block.sort_unstable();
                block
            };
            ids.chunks(984).flat_map(|epoch| epoch.chunks(64).take(15).map(sorted).collect::<Vec<_>>()).collect()
        };
        assert_eq!(blocks(&two, 2), blocks(&other, 2), "two seeds of one shared order visit different samples");
        let own = out.path().join("own");
        ok(&Job::new(&data).batch(24).seed(1).epochs(2).window("2K").dump(&own).over(t, 2));
        assert!(blocks(&own, 2) != blocks(&two, 2), "the shared order was ignored");
        // The broadcast baseline derives the same order.
        let broadcast = out.path().join("broadcast");
        ok(&job(1, &broadcast).exchange("broadcast").over(t, 2));
        assert!(global(&broadcast, 2) == global(&two, 2), "the broadcast baseline's order differs");
        // An epoch, then a resume at 3 ranks: the two runs are the uninterrupted one.
        let (first, rest) = (out.path().join("first"), out.path().join("rest"));
        let ck = out.path().join("ck.json");
        ok(&epochs(1, 1, &first).checkpoint(&ck).over(t, 2));
        let resumed = job(1, &rest).checkpoint(&ck).over(t, 3);
        ok(&resumed);
        assert!(resumed.stdout.contains("resuming at epoch 1 step 0"), "{}", resumed.stdout);
        let joined = [global(&first, 2), global(&rest, 3)].concat();
        assert!(joined == global(&three, 3), "resumed, the shared order's stream differs");
    }

    fn verify_fails_on_corrupted_contents(t: Transport) {
        let out = tempdir();
        let data = Dataset::gen("raw", 64).files(2).field("x:u32:4").write(&out.path().join("d"));
        // Flip one byte of sample 40 (file 1 holds ids 32..64; record = 16 bytes).
        let f = data.join("part-00001.raw");
        let mut bytes = std::fs::read(&f).unwrap();
        bytes[(40 - 32) * 16 + 5] ^= 0xff;
        std::fs::write(&f, bytes).unwrap();
        let run = Job::new(&data).batch(64).verify().over(t, 2);
        assert_ne!(run.code, 0, "corruption must fail --verify:\n{}", run.stdout);
        assert!(run.stdout.contains("FAILED") && run.stdout.contains("1 wrong contents"), "{}", run.stdout);
        // Found by the collective check on every rank, printed once.
        let line = agreed_failure(&run, 2);
        assert!(line.contains("verification failed: epoch 0: ") && line.contains("sample 40 field 'x'"), "{line}");
        assert!(!run.stdout.contains("done:"), "no success line after a failed verification");
    }

    fn json_summary_lines(t: Transport) {
        let fx = fixtures();
        let run = Job::new(fx.join("npy_plain"))
            .batch(8)
            .epochs(3)
            .json()
            .verify()
            // Every row read where a window needs it (resident rows: tests below).
            .memory_budget(0)
            .over(t, 2);
        ok(&run);
        let lines: Vec<serde_json::Value> =
            run.stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect();
        assert_eq!(lines.len(), 3, "one JSON line per epoch and nothing else on stdout: {}", run.stdout);
        for (e, l) in lines.iter().enumerate() {
            assert_eq!(l["epoch"], e as u64);
            assert_eq!(l["ranks"], 2);
            assert_eq!(l["samples"], 48); // 49 samples, batch 8, tail dropped
            assert_eq!(l["verified"], true);
            assert_eq!(l["bytes_delivered"], 48 * 48); // float32 3x4 = 48 bytes per sample
            for p in ["plan", "read", "fill", "exchange", "assemble"] {
                assert!(l["phase_s"][p].as_f64().unwrap() >= 0.0);
            }
            assert!(l["samples_per_s"].as_f64().unwrap() > 0.0);
            // Read once into a buffer, packed once, assembled once (one epoch reads a
            // little more than it needs: coalesced spans).
            let copies = l["copies_per_byte"].as_f64().unwrap();
            assert!((3.0..3.5).contains(&copies), "copies per delivered byte: {copies}");
        }
    }
}

/// Planning costs a rank its share of the epoch, not the epoch: each rank inverts the
/// permutation for its home range and evaluates it for the rows it receives, so the most
/// evaluations any rank makes is at most 2·N/P and falls as ranks are added.
#[test]
fn planning_work_per_rank_falls_with_the_number_of_ranks() {
    let out = tempdir();
    let n = 8192u64;
    let data = Dataset::gen("raw", n).files(2).field("x:u8:8").write(&out.path().join("d"));
    let mut most = vec![];
    for np in [1usize, 2, 4] {
        let run = Job::new(&data).batch(64).epochs(2).json().mpirun(np);
        ok(&run);
        for line in run.stdout.lines() {
            let l: serde_json::Value = serde_json::from_str(line).unwrap();
            let evaluations = l["plan_evaluations"].as_u64().unwrap();
            let share = n / np as u64;
            assert!((share..=2 * share).contains(&evaluations), "{np} ranks: {evaluations} evaluations, N = {n}");
            most.push((np, evaluations));
        }
    }
    assert!(most.windows(2).all(|w| w[0].0 == w[1].0 || w[1].1 < w[0].1), "{most:?}");
}

over_transports! {
    fn file_names_need_not_be_utf8(t: Transport) {
        // A file name with a byte that is not UTF-8 (a known panic once): the files still
        // load, in name order, every sample exactly once with its generated contents.
        use std::os::unix::ffi::OsStrExt;
        let out = tempdir();
        let data = Dataset::gen("npy", 300).files(3).field("x:u16:3").write(&out.path().join("d"));
        let odd = data.join(std::ffi::OsStr::from_bytes(b"part-00002\xff.npy"));
        std::fs::rename(data.join("part-00002.npy"), &odd).unwrap();
        for np in [1, 3] {
            let run = Job::new(&data).batch(12).verify().over(t, np);
            ok(&run);
            assert!(run.stdout.contains("300 samples delivered exactly once, in permutation order; contents match"), "{}", run.stdout);
        }
    }
}

/// Samples of 1 KiB and more in .npy, raw, fixed-size Arrow columns and contiguous HDF5
/// datasets are read straight into the send buffers (local reads off, as between hosts):
/// each delivered byte is copied twice (file → send buffer, receive buffer → batch) and a
/// rank reads exactly the bytes it sends, where smaller samples take a third copy and
/// coalesced reads bring in more than they need.
#[test]
fn large_samples_are_read_straight_into_send_buffers() {
    let out = tempdir();
    for (format, field, direct) in [
        ("npy", "x:u8:1024", true),
        ("raw", "x:u8:8192", true),
        ("arrow", "x:u8:4096", true),
        ("hdf5", "x:u8:2048", true),
        ("npy", "x:u8:512", false),
    ] {
        let data =
            Dataset::gen(format, 3000).files(3).field(field).write(&out.path().join(format!("{format}-{field}")));
        let run = Job::new(&data).batch(64).window("1M").verify().json().local_reads("off").memory_budget(0).mpirun(4);
        ok(&run);
        let l: serde_json::Value = serde_json::from_str(run.stdout.lines().last().unwrap()).unwrap();
        let (copies, read, sent) = (
            l["copies_per_byte"].as_f64().unwrap(),
            l["bytes_read"].as_u64().unwrap(),
            l["bytes_exchanged"].as_u64().unwrap(),
        );
        assert_eq!(l["verified"], true);
        if direct {
            assert_eq!((copies, read), (2.0, sent), "{format} {field}: {l}");
        } else {
            assert!(copies > 2.9 && read > sent, "{format} {field}: {l}");
        }
    }
}

/// `job` on `np` ranks over `t`, each rank posing as host `host<rank / 2>`
/// (`MESHFEED_HOST`, set by a wrapper script in `dir`).
fn run_on_hosts_of_two(t: Transport, dir: &Path, np: usize, job: &Job) -> Run {
    let body = "MESHFEED_HOST=host$((r / 2))";
    run_wrapped(t, &dir.join("two-ranks-per-host.sh"), body, np, job)
}

/// `job` on `np` ranks over `t`, each rank through a shell script at `wrapper` that sets
/// `$r` to the rank and runs `body`, whose last line (variable assignments) prefixes the
/// `exec` of meshfeed.
fn run_wrapped(t: Transport, wrapper: &Path, body: &str, np: usize, job: &Job) -> Run {
    let args = job.argv();
    let script = format!("#!/bin/sh\nr=${{OMPI_COMM_WORLD_RANK:-$RANK}}\n{body} exec {} \"$@\"\n", bin());
    std::fs::write(wrapper, script).unwrap();
    std::fs::set_permissions(wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let program = wrapper.to_str().unwrap();
    match t {
        Transport::Mpi => mpirun_program(np, program, &args),
        Transport::Ucx => launch_program(np, program, &job.clone().transport("ucx").argv()),
    }
}

/// Held by a job with a slowed rank: one at a time. Two at once on 2 cores (the test's MPI
/// and UCX variants) starved a slowed UCX rank past its 60 s peer timeout in CI twice,
/// at 4 ranks and then at 3.
static ONE_SLOWED_JOB: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `job` on `np` ranks over `t`, each rank a host of its own, rank
/// `slow`'s process in a CPU cgroup of a tenth of a core (cgroup v1, as root): a straggler.
/// One such job runs at a time, and a peer may stay silent 300 s (not 60) before it is
/// declared lost: what is tested is the balancing, on a shared machine.
fn run_with_a_slow_rank(t: Transport, dir: &Path, np: usize, slow: usize, job: &Job) -> Run {
    let _alone = ONE_SLOWED_JOB.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // One cgroup per run directory: the test runs once per transport.
    let name = dir.file_name().unwrap().to_string_lossy();
    let cgroup = Path::new("/sys/fs/cgroup/cpu").join(format!("meshfeed-test-slow-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&cgroup).expect("a cpu cgroup (cgroup v1, as root)");
    std::fs::write(cgroup.join("cpu.cfs_period_us"), "100000").unwrap();
    std::fs::write(cgroup.join("cpu.cfs_quota_us"), "10000").unwrap();
    let body = format!(
        "[ \"$r\" = {slow} ] && echo $$ > {}/cgroup.procs\nMESHFEED_HOST=host$r MESHFEED_PEER_TIMEOUT=300",
        cgroup.display()
    );
    let run = run_wrapped(t, &dir.join("slow-rank.sh"), &body, np, job);
    std::fs::remove_dir(&cgroup).unwrap();
    run
}

/// Each epoch's `home_rows` of every rank in a telemetry directory: `[rank][epoch]`.
fn home_rows_by_epoch(dir: &Path, np: usize) -> Vec<Vec<u64>> {
    telemetry_records(dir, np, "epoch")
        .iter()
        .map(|rank| rank.iter().map(|v| v["home_rows"].as_u64().unwrap()).collect())
        .collect()
}

/// Every record of `kind` of every rank in a telemetry directory: `[rank][record]`.
fn telemetry_records(dir: &Path, np: usize, kind: &str) -> Vec<Vec<serde_json::Value>> {
    (0..np)
        .map(|r| {
            let text = std::fs::read_to_string(dir.join(format!("rank-{r}.jsonl"))).unwrap();
            text.lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .filter(|v| v["kind"] == kind)
                .collect()
        })
        .collect()
}

over_transports! {
    /// Home ranges follow the ranks' read speeds (`--balance auto`, the default): with rank 1
    /// slowed to a tenth of a core, reading at random with nothing kept and every row
    /// exchanged, its range shrinks over the epochs while the ranges still tile the ids;
    /// the batches are byte for byte those of equal ranges (`--balance off`, whose ranges
    /// never move), and every epoch verifies exactly once. With 3 and 4 ranks over MPI, 3
    /// over UCX (jobs with a slowed rank run one at a time: [`run_with_a_slow_rank`]).
    fn balanced_home_ranges_follow_a_slow_rank_and_keep_the_stream(t: Transport) {
        let out = tempdir();
        let data = Dataset::gen("npy", 6000).files(4).field("x:u8:4096").field("y:i64").write(&out.path().join("npy"));
        // Nothing kept, every row exchanged: the ranges are read anew each epoch.
        let fixed = Job::new(&data).batch(48).epochs(4).window("512K").verify().memory_budget(0);
        let fixed = fixed.read_strategy("random").local_reads("off");
        let counts: &[usize] = if t == Transport::Ucx { &[3] } else { &[3, 4] };
        for &np in counts {
            let run = |balance: &str| {
                let name = format!("{balance}-{np}");
                let (dump, telemetry) =
                    (out.path().join(format!("dump-{name}")), out.path().join(format!("telemetry-{name}")));
                let job = fixed.clone().opt("--balance", balance).dump(&dump).telemetry(&telemetry);
                ok(&run_with_a_slow_rank(t, out.path(), np, 1, &job));
                (dump_bytes(&dump, np), home_rows_by_epoch(&telemetry, np))
            };
            let equal = 6000 / np as u64;
            let (dumps_off, rows_off) = run("off");
            let (dumps_auto, rows_auto) = run("auto");
            assert_eq!(dumps_auto, dumps_off, "{np} ranks: balancing changed the batches");
            assert!(rows_off.iter().flatten().all(|&n| n == equal), "{np} ranks, off: {rows_off:?}");
            for e in 0..4 {
                let total: u64 = rows_auto.iter().map(|r| r[e]).sum();
                assert_eq!(total, 6000, "{np} ranks, epoch {e}: the ranges tile the ids: {rows_auto:?}");
            }
            // Epoch 0 measures; from epoch 1 on the slow rank reads less: a quarter less at
            // least by epoch 3 (an epoch measured on a loaded machine may leave it where it
            // was), never by more than half its range in one epoch. The others' ranges follow
            // their own, noisier, speeds.
            assert!(rows_auto.iter().all(|r| r[0] == equal), "{np} ranks: {rows_auto:?}");
            assert!(rows_auto[1].windows(2).all(|e| e[1] >= e[0] / 2), "{np} ranks: {rows_auto:?}");
            assert!(rows_auto[1][3] < equal * 3 / 4, "{np} ranks: {rows_auto:?}");
        }
    }
}

over_transports! {
    /// The loader tunes itself (`--tune auto`) from deliberately bad settings — windows of
    /// one step, no producer thread — with nothing between batches but the dump, so that
    /// every window is waited for: a producer thread starts (prefetch 2) and the window
    /// grows. Every rank changes at the same window (their windows are the same,
    /// setting for setting), the windows still tile each epoch, the batches are byte for
    /// byte those of the untuned run, and every epoch verifies. With 2 and 3 ranks.
    fn a_tuned_loader_starts_a_producer_and_grows_its_window_at_the_same_window_on_every_rank(t: Transport) {
        let out = tempdir();
        // Windows of one step take about a millisecond to make here: the tuner's rounds (at
        // least 0.2 s) fit five epochs of 333 steps several times over, on a machine twice
        // as fast too.
        let data = Dataset::gen("npy", 16000).files(3).field("x:u8:4088").field("y:i64").write(&out.path().join("npy"));
        let fixed = Job::new(&data).batch(48).epochs(5).window("1K").prefetch(0).verify().memory_budget(0);
        let fixed = fixed.read_strategy("random");
        for np in [2, 3] {
            let run = |tune: &str| {
                let name = format!("{tune}-{np}");
                let (dump, telemetry) =
                    (out.path().join(format!("dump-{name}")), out.path().join(format!("telemetry-{name}")));
                ok(&fixed.clone().opt("--tune", tune).dump(&dump).telemetry(&telemetry).over(t, np));
                (dump_bytes(&dump, np), telemetry_records(&telemetry, np, "window"))
            };
            let (dumps_off, windows_off) = run("off");
            let (dumps_auto, windows_auto) = run("auto");
            assert_eq!(dumps_auto, dumps_off, "{np} ranks: tuning changed the batches");
            assert!(
                windows_off.iter().flatten().all(|w| w["steps"] == 1 && w.get("prefetch").is_none()),
                "{np} ranks, untuned: a window of several steps, or tuned"
            );
            let settings = |r: usize| -> Vec<[u64; 5]> {
                let n = |w: &serde_json::Value, k: &str| w[k].as_u64().unwrap_or_else(|| panic!("{k} of {w}"));
                let keys = ["epoch", "first_step", "steps", "prefetch", "read_depth"];
                windows_auto[r].iter().map(|w| keys.map(|k| n(w, k))).collect()
            };
            let first = settings(0);
            // Where the settings change (a window per run of equal settings), for messages.
            let mut changes = first.clone();
            changes.dedup_by_key(|w| [w[2], w[3], w[4]]);
            for r in 1..np {
                assert!(settings(r) == first, "{np} ranks: rank {r} tuned differently from rank 0 ({changes:?})");
            }
            for e in 0..5 {
                let steps: u64 = first.iter().filter(|w| w[0] == e).map(|w| w[2]).sum();
                assert_eq!(steps, 16000 / 48, "{np} ranks, epoch {e}: the windows tile the epoch: {changes:?}");
            }
            // The run starts as given, then a producer thread runs ahead of windows of
            // several steps.
            assert_eq!(first[0][2..4], [1, 0], "{np} ranks: {changes:?}");
            assert!(first.iter().any(|w| w[2] >= 2 && w[3] == 2), "{np} ranks: {changes:?}");
        }
    }
}

over_transports! {
    /// Ranks on one host read the rows they receive from each other's home ranges straight
    /// from the files into their batches (local reads): nothing crosses the exchange, each
    /// delivered byte is read once and copied once. Ranks posing as hosts of two ranks
    /// exchange exactly the rows whose owner is on another host (copied twice). Either
    /// way, every rank's batches are byte for byte those of the exchange (local reads off).
    /// npy, the fixed-size columns of Arrow files and contiguous HDF5 datasets; with a
    /// partial last batch.
    fn ranks_on_one_host_read_each_others_rows_from_the_files(t: Transport) {
        let out = tempdir();
        for (format, np) in [("npy", 2), ("npy", 3), ("npy", 4), ("arrow", 3), ("hdf5", 4)] {
            let data = out.path().join(format);
            if !data.exists() {
                Dataset::gen(format, 3000).files(3).field("x:u8:2048").field("y:i64").write(&data);
            }
            let dump = |name: &str| out.path().join(format!("{name}-{format}-{np}"));
            let job = |name: &str, reads: &str| -> Job {
                // 3000 = 62 × 48 + 24: the partial last batch has a window of its own.
                // Nothing kept in memory: the rows come from the files (kept rows: below).
                // Equal home ranges (the shares that cross, below, assume them).
                let job = Job::new(&data).batch(48).epochs(2).window("256K").tail("partial").verify().json();
                job.memory_budget(0).opt("--balance", "off").local_reads(reads).dump(&dump(name))
            };
            let summary = |run: &Run| -> serde_json::Value {
                ok(run);
                serde_json::from_str(run.stdout.lines().last().unwrap()).unwrap()
            };
            let one_host = summary(&job("one-host", "auto").over(t, np));
            let two_hosts = summary(&run_on_hosts_of_two(t, out.path(), np, &job("two-hosts", "auto")));
            let exchanged = summary(&job("exchanged", "off").over(t, np));
            for (name, l) in [("one host", &one_host), ("hosts of two", &two_hosts), ("local reads off", &exchanged)] {
                let n = |k: &str| l[k].as_u64().unwrap();
                assert_eq!(l["verified"], true, "{name}, {format}, {np} ranks: {l}");
                // Every delivered value is read once: by its receiver or by its owner.
                assert_eq!(n("bytes_read"), n("bytes_delivered"), "{name}, {format}, {np} ranks: {l}");
                // Once from the file, and twice more for what crossed the exchange.
                assert_eq!(n("bytes_copied"), n("bytes_delivered") + n("bytes_exchanged"), "{name}, {format}, {np} ranks: {l}");
            }
            let delivered = one_host["bytes_delivered"].as_u64().unwrap();
            assert_eq!(one_host["bytes_exchanged"], 0, "{format}, {np} ranks: {one_host}");
            assert_eq!(one_host["copies_per_byte"], 1.0, "{format}, {np} ranks: {one_host}");
            assert_eq!(exchanged["bytes_exchanged"], delivered, "{format}, {np} ranks: {exchanged}");
            let across = two_hosts["bytes_exchanged"].as_u64().unwrap();
            if np == 2 {
                assert_eq!(across, 0, "two ranks are one host of two: {two_hosts}");
            } else {
                // Rows owned on the other host. 3 ranks (hosts of 2 and 1): host A receives
                // 2/3 of the rows, 1/3 of them owned on B, and B 1/3, 2/3 owned on A: 4/9.
                // 4 ranks: 2 · (1/2 · 1/2) = 1/2.
                let share = across as f64 / delivered as f64;
                let expected = if np == 3 { 4.0 / 9.0 } else { 0.5 };
                assert!((share - expected).abs() < 0.05, "{format}, {np} ranks: {share} of the bytes crossed, not ~{expected}");
            }
            let reference = dump_bytes(&dump("exchanged"), np);
            assert_eq!(dump_bytes(&dump("one-host"), np), reference, "{format}, {np} ranks, one host");
            assert_eq!(dump_bytes(&dump("two-hosts"), np), reference, "{format}, {np} ranks, hosts of two");
        }
    }
}

over_transports! {
    /// Every read strategy delivers the stream byte for byte as reading every row from
    /// the files where a window needs it (no memory budget, local reads off): resident
    /// (the default where the data fits), passes, random with part of each home range in
    /// memory, random with the rest spilled and passes over the spill files; on one host (same-host rows copied from
    /// each other's memory) and on hosts of two; at 1 to 4 ranks; for rows read in place
    /// (2 KiB .npy), small rows packed from memory (HDF5) and variable-length values kept
    /// as read (Arrow). The files are read as the strategy says: once for resident data,
    /// K times an epoch in passes, only the rows not kept at random, never again once
    /// spilled.
    fn every_read_strategy_delivers_the_same_stream(t: Transport) {
        let out = tempdir();
        let cases: [(&str, &[&str], &[usize]); 3] = [
            ("npy", &["x:u8:2048", "y:i64"], &[1, 2, 3, 4]),
            ("hdf5", &["x:u8:200", "y:i64"], &[3]),
            ("arrow", &["t:bytes", "y:i64"], &[2, 4]),
        ];
        for (format, fields, nps) in cases {
            let data = Dataset::gen(format, 3000).files(3).fields(fields.iter().copied()).write(&out.path().join(format));
            let bytes: u64 = std::fs::read_dir(&data).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
            // Budgets that hold about a third and a half of the data.
            let (third, half) = (bytes / 3, bytes / 2);
            let fixed = format != "arrow";
            for &np in nps {
                let dump = |name: &str| out.path().join(format!("{format}-{np}-{name}"));
                let spill = out.path().join(format!("spill-{format}-{np}"));
                std::fs::create_dir_all(&spill).unwrap();
                let run = |name: &str, extra: &dyn Fn(Job) -> Job, hosts_of_two: bool| -> Vec<serde_json::Value> {
                    // 3000 = 62 × 48 + 24: a partial last batch in a window of its own.
                    let job = Job::new(&data).batch(48).epochs(3).tail("partial");
                    let job = extra(job.window("64K").verify().json().dump(&dump(name)));
                    let r = if hosts_of_two { run_on_hosts_of_two(t, out.path(), np, &job) } else { job.over(t, np) };
                    ok(&r);
                    let epochs: Vec<serde_json::Value> =
                        r.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
                    assert_eq!(epochs.len(), 3, "{name}: {}", r.stdout);
                    for e in &epochs {
                        assert_eq!(e["verified"], true, "{format}, {np} ranks, {name}: {e}");
                    }
                    epochs
                };
                let n = |e: &serde_json::Value, k: &str| e[k].as_u64().unwrap();
                let from_files = run("files", &|j| j.read_strategy("random").memory_budget(0).local_reads("off"), false);
                let reference = dump_bytes(&dump("files"), np);
                let resident = run("resident", &|j| j, false);
                let passes = run("passes", &|j| j.read_strategy("passes").memory_budget(third), false);
                let random = run("random", &|j| j.read_strategy("random").memory_budget(half), false);
                for (name, epochs) in [("resident", &resident), ("passes", &passes), ("random", &random)] {
                    assert_eq!(dump_bytes(&dump(name), np), reference, "{format}, {np} ranks, {name}");
                    assert_eq!(epochs[0]["read_strategy"], *name, "{}", epochs[0]);
                }
                // Resident: the home ranges are read once, then never.
                assert!(n(&resident[0], "bytes_read") >= n(&from_files[0], "bytes_delivered") * 9 / 10, "{}", resident[0]);
                assert_eq!((n(&resident[1], "bytes_read"), n(&resident[2], "bytes_read")), (0, 0), "{format}, {np} ranks");
                // Passes: several per epoch, each streaming (most of) the home range.
                let k = n(&passes[0], "passes");
                assert!(k >= 2, "{}", passes[0]);
                for e in &passes {
                    assert!(n(e, "bytes_read") > bytes * (k - 1) / 2, "{k} passes read too little: {e}");
                }
                // Random: what is kept is not read again; the rest is, every epoch.
                for e in &random[1..] {
                    let read = n(e, "bytes_read");
                    if fixed {
                        assert!(read > 0 && read < n(e, "bytes_delivered"), "{format}, {np} ranks: {e}");
                    } else {
                        assert!(read >= n(e, "bytes_delivered") * 9 / 10, "nothing kept: {e}");
                    }
                }
                if fixed {
                    // Spilled: the rest goes to the spill directory once and is read from there.
                    let spilled = run("spill", &|j| j.memory_budget(third).spill_dir(&spill), false);
                    assert_eq!(dump_bytes(&dump("spill"), np), reference, "{format}, {np} ranks, spill");
                    assert_eq!((spilled[0]["spill"].as_bool(), n(&spilled[1], "bytes_read")), (Some(true), 0), "{}", spilled[1]);
                    assert!(n(&spilled[2], "bytes_read_spill") > 0, "{}", spilled[2]);
                    // The spill files are gone with the job.
                    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0, "{format}, {np} ranks");
                    // Passes over the spill files: the first epoch streams the data there
                    // (and reads spilled rows one by one), later ones stream the spill
                    // files K times and read nothing from the data files.
                    let sp = run("spill-passes", &|j| j.read_strategy("passes").memory_budget(third).spill_dir(&spill), false);
                    assert_eq!(dump_bytes(&dump("spill-passes"), np), reference, "{format}, {np} ranks, spill passes");
                    assert_eq!((sp[0]["read_strategy"].as_str(), sp[0]["spill"].as_bool()), (Some("passes"), Some(true)));
                    let k = n(&sp[0], "passes");
                    assert!(k >= 2, "{}", sp[0]);
                    for e in &sp[1..] {
                        assert_eq!(n(e, "bytes_read"), 0, "{format}, {np} ranks: {e}");
                        assert!(n(e, "bytes_read_spill") > bytes * (k - 1) / 2, "{k} passes read too little: {e}");
                    }
                    assert_eq!(std::fs::read_dir(&spill).unwrap().count(), 0, "{format}, {np} ranks");
                } else {
                    let r = Job::new(&data).batch(48).memory_budget(third).spill_dir(&spill).over(t, np);
                    assert_ne!(r.code, 0);
                    assert!(r.stderr.contains("--spill-dir needs every field to have a fixed size"), "{}", r.stderr);
                }
                if np >= 3 {
                    // Hosts of two: kept rows of the other host cross the exchange.
                    let two = run("two-hosts", &|j| j, true);
                    assert_eq!(dump_bytes(&dump("two-hosts"), np), reference, "{format}, {np} ranks, hosts of two");
                    assert!(n(&two[1], "bytes_exchanged") > 0 && n(&two[1], "bytes_read") == 0, "{}", two[1]);
                }
            }
        }
    }
}

/// Batch jobs (no terminal, so no progress bar) get rank 0's progress line on stdout every
/// --heartbeat seconds, with the step advancing: text for a log, JSON with --json; 0 turns
/// it off.
#[test]
fn batch_jobs_print_a_heartbeat() {
    let data = fixtures().join("npy_struct");
    let job = |interval: &str| Job::new(&data).batch(4).compute_ms(20).opt("--heartbeat", interval);
    let beats = |interval: &str| -> Vec<serde_json::Value> {
        let run = job(interval).json().mpirun(2);
        ok(&run);
        run.stdout
            .lines()
            .filter(|l| l.starts_with("{\"elapsed_s\""))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let some = beats("0.1");
    assert!(some.len() >= 3, "25 steps of 20 ms, a beat every 0.1 s: {some:?}");
    assert!(some.iter().all(|b| b["heartbeat"] == true && b["steps"] == 25 && b["epoch"] == 0), "{some:?}");
    // A beat after (nearly) every step (20 ms apart, every 1 ms asked): the epoch's steps
    // done, one more each time, up to 25 — also after the last step, when the loader
    // already stands at the next epoch.
    let every = beats("0.001");
    let steps: Vec<u64> = every.iter().map(|b| b["step"].as_u64().unwrap()).collect();
    assert!(steps.len() >= 20 && steps.windows(2).all(|w| w[1] == w[0] + 1), "{steps:?}");
    assert_eq!(steps.last(), Some(&25), "{steps:?}");
    assert!(every.iter().all(|b| b["epoch"] == 0), "{every:?}");
    // Without --json, the same beats as text: `meshfeed: epoch 0 step K/25, T s, ...`.
    let text = job("0.001").mpirun(2);
    ok(&text);
    assert!(!text.stdout.contains('{'), "no JSON without --json:\n{}", text.stdout);
    let steps: Vec<u64> = text
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("meshfeed: epoch 0 step "))
        .map(|l| {
            assert!(l.contains(" samples/s, waiting for data ") && l.ends_with("% of the time"), "{l}");
            l.split_once("/25, ").unwrap_or_else(|| panic!("{l}")).0.parse().unwrap()
        })
        .collect();
    assert!(steps.len() >= 20 && steps.windows(2).all(|w| w[1] == w[0] + 1), "{steps:?}\n{}", text.stdout);
    assert_eq!(steps.last(), Some(&25), "{steps:?}");
    for quiet in [job("0").mpirun(2), job("0").json().mpirun(2)] {
        ok(&quiet);
        assert!(!quiet.stdout.contains("heartbeat") && !quiet.stdout.contains(" step "), "{}", quiet.stdout);
    }
}

/// `--telemetry` writes one record per window per rank, which add up to the rank's epoch
/// record, with the time waiting for the slowest peer inside the exchange and the bytes
/// sent to other hosts: none on one host, and with ranks posing as hosts of two, the rows
/// owned on the other host. `meshfeed report --predict` fits the cost model to those
/// records (the link between hosts only where a run crossed hosts) and predicts the node
/// counts asked for.
#[test]
fn telemetry_records_each_window_and_the_cost_model_fits_them() {
    let out = tempdir();
    let data = Dataset::gen("npy", 3000).files(3).field("x:u8:2048").field("y:i64").write(&out.path().join("data"));
    let read = |path: &Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    for np in [2, 3, 4] {
        let mut total = [0u64; 2]; // bytes sent, and sent to other hosts, over ranks (two hosts)
        for hosts in ["one-host", "two-hosts"] {
            let dir = out.path().join(format!("{hosts}-{np}"));
            let job = Job::new(&data).batch(48).epochs(2).window("256K").local_reads("off").verify().telemetry(&dir);
            let run = if hosts == "one-host" {
                job.mpirun(np)
            } else {
                run_on_hosts_of_two(Transport::Mpi, out.path(), np, &job)
            };
            ok(&run);
            let config = &read(&dir.join("run.json"))[0];
            assert_eq!((config["schema"].as_u64(), config["sample_bytes"].as_u64()), (Some(6), Some(2056)), "{config}");
            let spw = config["steps_per_window"].as_u64().unwrap();
            for rank in 0..np {
                let lines = read(&dir.join(format!("rank-{rank}.jsonl")));
                for epoch in 0..2u64 {
                    let of_epoch = |kind: &str| -> Vec<&serde_json::Value> {
                        lines.iter().filter(|l| l["kind"] == kind && l["epoch"] == epoch).collect()
                    };
                    let windows = of_epoch("window");
                    let e = of_epoch("epoch");
                    assert_eq!(e.len(), 1, "{hosts}, {np} ranks, rank {rank}");
                    let e = e[0];
                    assert_eq!(e["verified"], true);
                    assert_eq!(
                        windows.len() as u64,
                        e["windows"].as_u64().unwrap(),
                        "{hosts}, {np} ranks, rank {rank}"
                    );
                    let firsts: Vec<u64> = windows.iter().map(|w| w["first_step"].as_u64().unwrap()).collect();
                    assert_eq!(firsts, (0..62).step_by(spw as usize).collect::<Vec<u64>>(), "62 steps of 48 rows");
                    let sum = |k: &str| windows.iter().map(|w| w[k].as_u64().unwrap()).sum::<u64>();
                    for k in ["bytes_read", "bytes_sent", "bytes_sent_off_host", "bytes_received"] {
                        assert_eq!(sum(k), e[k].as_u64().unwrap(), "{k}: {hosts}, {np} ranks, rank {rank}");
                    }
                    for w in &windows {
                        let exchange = w["phase_s"]["exchange"].as_f64().unwrap();
                        assert!(w["peer_wait_s"].as_f64().unwrap() <= exchange + 1e-9, "{w}");
                        // Each step the window delivered, with the consumer's wait and step.
                        let steps = w["steps"].as_u64().unwrap() as usize;
                        assert_eq!(w["step_compute_s"].as_array().map(Vec::len), Some(steps), "{w}");
                        assert_eq!(w["step_wait_s"][0].as_f64(), w["wait_s"].as_f64(), "{w}");
                    }
                    let off = e["bytes_sent_off_host"].as_u64().unwrap();
                    if hosts == "one-host" || np == 2 {
                        assert_eq!(off, 0, "{hosts}, {np} ranks, rank {rank}: {e}");
                    } else {
                        total[0] += e["bytes_sent"].as_u64().unwrap();
                        total[1] += off;
                    }
                }
            }
        }
        if np > 2 {
            // As in the local-reads test: 4/9 of the rows cross with 3 ranks, 1/2 with 4.
            let share = total[1] as f64 / total[0] as f64;
            let expected = if np == 3 { 4.0 / 9.0 } else { 0.5 };
            assert!((share - expected).abs() < 0.05, "{np} ranks: {share} of the bytes sent crossed, not ~{expected}");
        }
    }
    // The model: fitted to every run with window records; the link measured only where a
    // run crossed hosts.
    let report = |dirs: &[&Path]| -> Vec<serde_json::Value> {
        let mut args = vec!["report", "--json", "--predict", "1,2,64"];
        args.extend(dirs.iter().map(|d| d.to_str().unwrap()));
        let run = meshfeed(&args);
        ok(&run);
        run.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let of = |lines: &[serde_json::Value], kind: &str| -> Vec<serde_json::Value> {
        lines.iter().filter(|l| l["kind"] == kind).cloned().collect()
    };
    let all = report(&[out.path()]);
    let c = &of(&all, "calibration")[0];
    assert_eq!(c["runs"], 6, "{c}");
    // Where runs crossed hosts the link may be fitted; on a loaded machine the bytes may
    // not explain the time, and then it is unknown (null), never zero or negative.
    assert!(c["inter_bytes_per_s"].is_null() || c["inter_bytes_per_s"].as_f64().is_some_and(|b| b > 0.0), "{c}");
    assert!(c["node_read_bytes_per_s"].as_f64().is_some_and(|b| b > 0.0), "{c}");
    assert_eq!(of(&all, "validation").len(), 6);
    assert!(of(&all, "validation").iter().all(|v| v["ratio"].as_f64().is_some_and(|r| r > 0.0 && r.is_finite())));
    let p = of(&all, "prediction");
    assert_eq!(p.iter().map(|p| p["nodes"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 64]);
    // By default for the largest run's shape: 4 ranks on 2 hosts, 2 ranks a node.
    assert_eq!(p.iter().map(|p| p["ranks"].as_u64().unwrap()).collect::<Vec<_>>(), [2, 4, 128]);
    assert_eq!(p[0]["efficiency"], 1.0);
    assert!(p.iter().all(|p| p["epoch_s"].as_f64().is_some_and(|s| s > 0.0)), "{p:?}");
    let one = report(&[&out.path().join("one-host-4")]);
    assert_eq!(of(&one, "calibration")[0]["inter_bytes_per_s"], serde_json::Value::Null);
    // Without --predict, no model.
    let plain = meshfeed(&["report", "--json", out.path().to_str().unwrap()]);
    ok(&plain);
    assert!(!plain.stdout.contains("\"calibration\""));
}
