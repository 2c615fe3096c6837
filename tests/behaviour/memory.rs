//! Memory is bounded by the window budget for every format and sample size (issue 9): peak
//! RSS of a job over data many times the window stays within the documented bound, and
//! four times the data needs no more memory — for .npy, HDF5, Arrow and raw files, at tiny
//! (4-byte) samples, where per-row bookkeeping dominates, and at large (64 KiB) samples,
//! fixed-size tensors and variable-length Arrow values alike.
//!
//! The bound itself holds, not only a multiple of it (issue 22, item 9): at a 4 MiB window,
//! without and with a producer thread, for variable-length Arrow values (read, then
//! packed) and fixed-size `.npy` records (read in place).
//!
//! Every read strategy stays within the memory it is given (issue 21): a job runs under a
//! cgroup memory limit of its processes, its pipelines and its data budget, and is never
//! killed for memory; a budget larger than the limit allows is cut to it, and data that
//! cannot be kept is refused with a message, not an OOM kill.

use std::path::Path;
use std::sync::Arc;

use crate::common::*;
use meshfeed::loader::MIN_MARGIN;
use meshfeed::plan::io::STREAM_READ_BYTES;

/// The window budget of every run here.
const WINDOW: u64 = 1 << 20;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The last epoch's summary of a 4-rank job with a 1 MiB window and `prefetch`, keeping
/// nothing in memory (every row read from the files where a window needs it: what the
/// window budget alone bounds).
fn summary(data: &Path, prefetch: usize) -> serde_json::Value {
    summary_at(data, "1M", prefetch, &|job| job)
}

/// [`summary`] with window budget `window` and `extra` options (added last). The read
/// strategy is given (`random`, what `auto` picks with a budget of 0), so that no storage
/// probe runs: where the page cache has lost the data, the probe's buffers (4 MiB and 256
/// samples) would count in the peak and say nothing about the window budget.
fn summary_at(data: &Path, window: &str, prefetch: usize, extra: &dyn Fn(Job) -> Job) -> serde_json::Value {
    let job = Job::new(data).batch(32).window(window).prefetch(prefetch as u64);
    let run = extra(job.json().memory_budget(0).read_strategy("random")).mpirun(4);
    ok(&run);
    let last: serde_json::Value = serde_json::from_str(run.stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["read_strategy"], "random", "{last}");
    last
}

/// Checks a dataset family: `small` is one window's worth or less, `big` and `bigger`
/// (4× `big`) are many windows per rank. Peak RSS ≤ baseline process (the small run) +
/// 1.5 × (prefetch + 1) windows (allocator slack) + 2 MB, and `bigger` needs at most 2 MB
/// more than `big`; every sample of a step is delivered.
fn check_bounded(what: &str, small: &Path, big: &Path, bigger: &Path, samples: [u64; 2]) {
    for prefetch in [0, 2] {
        let base = summary(small, prefetch)["max_rss_bytes"].as_u64().unwrap();
        let (b1, b2) = (summary(big, prefetch), summary(bigger, prefetch));
        for (run, n) in [(&b1, samples[0]), (&b2, samples[1])] {
            assert_eq!(run["samples"].as_u64().unwrap(), n / 32 * 32, "{what}: samples delivered: {run}");
        }
        let (r1, r2) = (b1["max_rss_bytes"].as_u64().unwrap(), b2["max_rss_bytes"].as_u64().unwrap());
        let bound = base + (prefetch as u64 + 1) * WINDOW * 3 / 2 + (2 << 20);
        assert!(
            r1 <= bound && r2 <= bound,
            "{what}, prefetch {prefetch}: peak RSS {r1} / {r2} exceeds {bound} (baseline {base})"
        );
        assert!(
            r2 <= r1 + (2 << 20),
            "{what}, prefetch {prefetch}: 4× the data must not need more memory: {r1} → {r2}"
        );
    }
}

fn check_format(format: &str, field: &str, samples: [u64; 3]) {
    let out = tempdir();
    let dirs = ["small", "big", "bigger"].map(|d| out.path().join(d));
    for (dir, n) in dirs.iter().zip(samples) {
        Dataset::gen(format, n).files(4).field(field).write(dir);
    }
    check_bounded(&format!("{format} {field}"), &dirs[0], &dirs[1], &dirs[2], [samples[1], samples[2]]);
}

// Tiny samples: 200 000 and 800 000 rows of 4 bytes (50 000 and 200 000 per rank): the
// per-row bookkeeping of a window (ids, sources, offsets) is many times the values'
// bytes, and it used to go uncounted (4-byte samples reached 148 MB at an 8 MB budget).
const TINY: [u64; 3] = [2_000, 200_000, 800_000];
// Large samples: 64 KiB each; 12 and 48 MiB per rank, 12× and 48× the window.
const LARGE: [u64; 3] = [200, 800, 3_200];

#[test]
fn npy_memory_is_bounded_at_tiny_and_large_samples() {
    check_format("npy", "x:u8:4", TINY);
    check_format("npy", "x:u8:65536", LARGE);
}

#[test]
fn hdf5_memory_is_bounded_at_tiny_and_large_samples() {
    check_format("hdf5", "x:u8:4", TINY);
    check_format("hdf5", "x:u8:65536", LARGE);
}

#[test]
fn arrow_memory_is_bounded_at_tiny_and_large_samples() {
    check_format("arrow", "x:u8:4", TINY);
    check_format("arrow", "x:u8:65536", LARGE);
}

/// Writes `samples` samples of 64 KiB (4 files) with Python: WebDataset shards (`wds`:
/// tarfile, as webdataset.TarWriter writes them), LZ4-compressed Arrow (`lz4`:
/// pyarrow.feather, pandas' path, 8 rows a record batch, one binary column) or Parquet
/// (`parquet`: snappy, 8 rows a row group).
fn write_py(kind: &str, dir: &Path, samples: u64) {
    const SCRIPT: &str = r#"
import io, os, sys, tarfile
import pyarrow as pa, pyarrow.feather as feather, pyarrow.parquet as pq
kind, d, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(d, exist_ok=True)
per = n // 4
for f in range(4):
    ids = range(f * per, (f + 1) * per)
    if kind == "wds":
        with tarfile.open(f"{d}/shard-{f}.tar", "w", format=tarfile.USTAR_FORMAT) as t:
            for i in ids:
                data = bytes([i % 251]) * 65536
                info = tarfile.TarInfo(f"{i:07d}.bin")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    else:
        col = pa.array([bytes([i % 251]) * 65536 for i in ids], pa.binary())
        if kind == "lz4":
            feather.write_feather(pa.table({"blob": col}), f"{d}/part-{f}.feather", chunksize=8)
        else:
            pq.write_table(pa.table({"blob": col}), f"{d}/part-{f}.parquet", row_group_size=8)
"#;
    let out =
        std::process::Command::new(python()).args(["-c", SCRIPT, kind, s(dir), &samples.to_string()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// WebDataset shards (values read in place from the tar), compressed Arrow files (a
/// record batch's column decompressed at a time, only the rows' values kept) and Parquet
/// (a row group's pages decoded at a time, likewise) stay within the window bound as the
/// other formats do.
#[test]
fn webdataset_compressed_arrow_and_parquet_memory_is_bounded() {
    for kind in ["wds", "lz4", "parquet"] {
        let out = tempdir();
        let dirs = ["small", "big", "bigger"].map(|d| out.path().join(d));
        for (dir, n) in dirs.iter().zip(LARGE) {
            write_py(kind, dir, n);
        }
        check_bounded(kind, &dirs[0], &dirs[1], &dirs[2], [LARGE[1], LARGE[2]]);
    }
}

#[test]
fn raw_memory_is_bounded_at_tiny_and_large_samples() {
    check_format("raw", "x:u8:4", TINY);
    check_format("raw", "x:u8:65536", LARGE);
}

/// Writes `samples` rows of one variable-length binary column to `dir/part-F.arrow`
/// (4 files, 64 rows per record batch): row `i` holds 32 KiB + (i × 4099 mod 64 KiB)
/// bytes, 64 KiB on average, unlike the 256-byte estimate used where sizes are unknown.
fn write_large_values(dir: &Path, samples: u64) {
    use arrow_array::{BinaryArray, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};
    std::fs::create_dir_all(dir).unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new("blob", DataType::Binary, false)]));
    let per_file = samples / 4;
    for f in 0..4 {
        let file = std::fs::File::create(dir.join(format!("part-{f}.arrow"))).unwrap();
        let mut writer = arrow_ipc::writer::FileWriter::try_new(file, &schema).unwrap();
        let rows: Vec<u64> = (f * per_file..(f + 1) * per_file).collect();
        for chunk in rows.chunks(64) {
            let values: Vec<Vec<u8>> =
                chunk.iter().map(|&i| vec![(i % 251) as u8; (32 << 10) + (i * 4099 % (64 << 10)) as usize]).collect();
            let column = BinaryArray::from_iter_values(values.iter());
            writer.write(&RecordBatch::try_new(schema.clone(), vec![Arc::new(column)]).unwrap()).unwrap();
        }
        writer.finish().unwrap();
    }
}

/// Variable-length values are sized from what the Arrow headers say (their value
/// buffers' lengths), not from a fixed estimate: 64 KiB values used to reach 285 MB at an
/// 8 MB budget.
#[test]
fn arrow_memory_is_bounded_at_large_variable_length_values() {
    let out = tempdir();
    let dirs = ["small", "big", "bigger"].map(|d| out.path().join(d));
    for (dir, n) in dirs.iter().zip(LARGE) {
        write_large_values(dir, n);
    }
    check_bounded("arrow variable-length 64 KiB", &dirs[0], &dirs[1], &dirs[2], [LARGE[1], LARGE[2]]);
}

/// Peak memory of a 4-rank job's processes with nothing kept, on tiny data (a cgroup's peak:
/// `mpirun`, the ranks, their libraries and an idle pipeline).
fn process_baseline(out: &Path) -> u64 {
    let tiny = out.join("tiny");
    Dataset::gen("npy", 400).files(4).field("x:u8:64").write(&tiny);
    let cg = MemoryCgroup::new(4 << 30);
    ok(&Job::new(&tiny).batch(32).window("1M").memory_budget(0).mpirun_in(&cg, 4));
    cg.peak()
}

/// Each strategy with a data budget of 12 MiB (16 MiB resident) over 48 MiB of 16 KiB samples
/// runs under a limit of the processes, four pipelines (1 MiB windows, prefetch 2) and the
/// budget, with slack for the allocator; nothing is OOM-killed and every epoch is exact.
#[test]
fn every_read_strategy_stays_within_a_cgroup_memory_limit() {
    let out = tempdir();
    let base = process_baseline(out.path());
    let data = out.path().join("d");
    Dataset::gen("npy", 3072).files(4).field("x:u8:16384").write(&data); // 48 MiB, 12 MiB per rank
    let spill = out.path().join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    // Per rank: the pipeline's bound (with the allocator's slack) and one streaming read.
    let pipelines = 4 * (3 * WINDOW * 3 / 2 + STREAM_READ_BYTES);
    let slack = 24 << 20;
    // (name, data budget, --read-strategy, spilled)
    for (name, budget, strategy, spilled) in [
        ("resident", 56u64 << 20, Some("resident"), false),
        ("passes", 12 << 20, Some("passes"), false),
        ("random", 12 << 20, Some("random"), false),
        ("spill", 12 << 20, None, true),
        ("spill-passes", 12 << 20, Some("passes"), true),
    ] {
        let limit = base + pipelines + budget + slack;
        let cg = MemoryCgroup::new(limit);
        let mut job = Job::new(&data).batch(64).epochs(2).window("1M").memory_budget(budget).verify().json();
        if let Some(strategy) = strategy {
            job = job.read_strategy(strategy);
        }
        if spilled {
            job = job.spill_dir(&spill);
        }
        let run = job.mpirun_in(&cg, 4);
        assert_eq!(cg.oom_kills(), 0, "{name}: OOM-killed under a limit of {limit} (baseline {base})\n{}", run.stderr);
        ok(&run);
        for l in run.stdout.lines() {
            let e: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(e["verified"], true, "{name}: {e}");
            let want = match name {
                "spill" => "random",
                "spill-passes" => "passes",
                _ => name,
            };
            assert_eq!(e["read_strategy"], want, "{name}: {e}");
        }
    }
}

/// With no budget given, the loader sizes itself from the cgroup limit: under a tight one it
/// keeps part of the data (or streams it in passes) and is not killed; under a roomy one it
/// keeps all of it. Asked to keep more than the limit has room for, it says so and stops.
#[test]
fn the_default_budget_follows_the_cgroup_limit() {
    let out = tempdir();
    let base = process_baseline(out.path());
    let data = out.path().join("d");
    Dataset::gen("npy", 3072).files(4).field("x:u8:16384").write(&data); // 48 MiB
    let job = Job::new(&data).batch(64).epochs(2).window("1M").verify().json();
    let pipelines = 4 * (3 * WINDOW + STREAM_READ_BYTES);
    for (room, keeps) in [(MIN_MARGIN + pipelines + (16 << 20), false), (MIN_MARGIN * 2 + pipelines + (96 << 20), true)]
    {
        let cg = MemoryCgroup::new(base + room);
        let run = job.mpirun_in(&cg, 4);
        assert_eq!(cg.oom_kills(), 0, "OOM-killed with {room} bytes of room:\n{}", run.stderr);
        ok(&run);
        let last: serde_json::Value = serde_json::from_str(run.stdout.lines().last().unwrap()).unwrap();
        assert_eq!(last["verified"], true);
        assert_eq!(last["read_strategy"] == "resident", keeps, "{room} bytes of room: {last}");
        assert!(last["read_reason"].as_str().unwrap().contains("cgroup v"), "{last}");
    }
    // Resident data asked for where the limit has no room for it: a clear refusal.
    let cg = MemoryCgroup::new(base + pipelines + (16 << 20));
    let run = job.read_strategy("resident").memory_budget("1G").mpirun_in(&cg, 4);
    assert_eq!(cg.oom_kills(), 0, "{}", run.stderr);
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("--read-strategy resident: the data does not fit in memory"), "{}", run.stderr);
}

/// The documented bound itself, not a multiple of it (issue 22, item 9): at a 4 MiB window,
/// peak RSS ≤ the process (a tiny dataset's run with the same flags) + `(prefetch + 1) ×
/// --window-bytes`, with 10% of that as allowance (allocator rounding, the sends' and value
/// sizes' variation around their means, the baseline's own noise of a few hundred KB) —
/// for 64 KiB variable-length Arrow values (read into buffers, then packed) and, as the
/// control, the same bytes as fixed-size `.npy` records (read in place, with and without
/// the exchange). Without a producer thread the budget must count the read buffers besides
/// the receive and batch buffers that the previous window leaves in their pools: counted as
/// before (3 windows' worth, not 5) the Arrow run peaked at 5.7 MB over the process
/// against a bound of 4.2 MB. With `--prefetch 2` the consumer is slower than the producer
/// (`--compute-ms`), so that the queue is full, as in training.
#[test]
fn variable_length_values_stay_within_the_documented_bound() {
    const W: u64 = 4 << 20;
    const SAMPLES: u64 = 800; // 50 MiB, 12.5 MiB per rank: 25 steps of 32
    let out = tempdir();
    let (tiny, var, npy) = (out.path().join("tiny"), out.path().join("var"), out.path().join("npy"));
    Dataset::gen("npy", 400).files(4).field("x:u8:64").write(&tiny);
    write_large_values(&var, SAMPLES);
    Dataset::gen("npy", SAMPLES).files(4).field("x:u8:65536").write(&npy);
    let mut failures = Vec::new();
    // (prefetch, --compute-ms)
    for (prefetch, compute_ms) in [(0, None), (2, Some(2))] {
        let extra = |job: Job| match compute_ms {
            Some(ms) => job.compute_ms(ms),
            None => job,
        };
        let exchanged = |job: Job| extra(job).local_reads("off");
        let rss = |run: &serde_json::Value| run["max_rss_bytes"].as_u64().unwrap();
        let base = rss(&summary_at(&tiny, "4M", prefetch, &extra));
        let bound = (prefetch as u64 + 1) * W;
        let limit = base + bound + bound / 10;
        let runs: [(&str, &Path, &dyn Fn(Job) -> Job); 3] = [
            ("Arrow, 64 KiB variable-length values", &var, &extra),
            ("npy, 64 KiB records", &npy, &extra),
            ("npy, 64 KiB records, every row exchanged", &npy, &exchanged),
        ];
        for (what, data, flags) in runs {
            let run = summary_at(data, "4M", prefetch, flags);
            assert_eq!(
                run["samples"].as_u64().unwrap(),
                SAMPLES,
                "{what}, prefetch {prefetch}: samples delivered: {run}"
            );
            assert!(run["windows"].as_u64().unwrap() >= 8, "{what}, prefetch {prefetch}: many windows: {run}");
            let peak = rss(&run);
            eprintln!("{what}, prefetch {prefetch}: peak RSS {peak} = process {base} + {}", peak as i64 - base as i64);
            if peak > limit {
                failures.push(format!(
                    "{what}, prefetch {prefetch}: peak RSS {peak} = process {base} + {} exceeds the bound {bound} + 10%",
                    peak - base
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
