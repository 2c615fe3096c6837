//! The benchmark suite's measurements (issue 10), under real `mpirun` at 1 and 2 ranks on
//! tiny data: every mode writes its JSON line with the keys the report reads; the bare
//! all-to-all-v replays exactly the bytes the loader exchanged; the random-access baseline
//! delivers steps × batch samples; `meshfeed bench report` writes its table and non-empty
//! PNG and SVG plots. Outcomes only — never timings.

use std::path::Path;

use crate::common::*;

const SAMPLES: u64 = 1000;
const BATCH: u64 = 32;
/// x: u8[120] + y: i64.
const SAMPLE_BYTES: u64 = 128;

fn bench(np: usize, data: &Path, out: &Path, modes: &str) -> Vec<serde_json::Value> {
    let run = mpirun(
        np,
        &[
            "bench",
            "--data",
            data.to_str().unwrap(),
            "--batch-size",
            &BATCH.to_string(),
            "--window-bytes",
            "16K",
            // The storage path: nothing kept, every row read where a window needs it.
            "--memory-budget",
            "0",
            "--epochs",
            "2",
            "--modes",
            modes,
            "--tag",
            "tiny",
            "--out",
            out.to_str().unwrap(),
            "--json",
        ],
    );
    ok(&run);
    run.stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

#[test]
fn every_mode_reports_what_the_suite_needs_at_1_and_2_ranks() {
    let dir = tempdir();
    let data = dir.path().join("npy");
    Dataset::gen("npy", SAMPLES).field("x:u8:120").field("y:i64").write(&data);
    let results = dir.path().join("results.jsonl");
    let steps = SAMPLES / BATCH;
    for np in [1, 2] {
        let rows = bench(np, &data, &results, "all");
        let names: Vec<&str> = rows.iter().map(|r| r["loader"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "meshfeed",
                "fused",
                "two-phase",
                "naive",
                "random-access",
                "read-limit",
                "exchange-limit",
                "memcpy-limit"
            ]
        );
        let row = |name: &str| rows.iter().find(|r| r["loader"] == name).unwrap();
        for r in &rows {
            for key in ["tag", "format", "sample_bytes", "samples", "ranks", "batch_size", "window_bytes", "epoch_s"] {
                assert!(!r[key].is_null(), "{} lacks {key}: {r}", r["loader"]);
            }
            assert_eq!((r["ranks"].as_u64(), r["format"].as_str()), (Some(np as u64), Some("npy")));
            assert_eq!((r["sample_bytes"].as_u64(), r["tag"].as_str()), (Some(SAMPLE_BYTES), Some("tiny")));
            assert_eq!(r["epoch_s_all"].as_array().unwrap().len(), 2, "two timed epochs: {r}");
            assert!(r["epoch_s_best"].as_f64().unwrap() <= r["epoch_s"].as_f64().unwrap());
            assert_eq!(r["rss_per_rank"].as_array().unwrap().len(), np);
            assert!(r["max_rss_bytes"].as_u64().unwrap() > 0);
            assert!(r["machine"]["nproc"].as_u64().unwrap() >= 1, "{r}");
            assert_eq!(r["window_bytes"], 16 << 10);
        }
        // meshfeed's own measurements: phases per rank, bytes read vs needed, copies (at
        // least one into the send buffer and one into the batch per delivered byte).
        let m = row("meshfeed");
        assert_eq!(m["samples_per_epoch"], steps * BATCH);
        assert_eq!(m["bytes_needed"], steps * BATCH * SAMPLE_BYTES);
        assert_eq!(m["delivered_bytes"], steps * BATCH * SAMPLE_BYTES);
        assert!(m["bytes_read"].as_u64().unwrap() >= steps * BATCH * SAMPLE_BYTES, "{m}");
        assert!(m["bytes_copied"].as_u64().unwrap() >= 2 * steps * BATCH * SAMPLE_BYTES, "{m}");
        assert_eq!(m["phase_s_per_rank"].as_array().unwrap().len(), np);
        for phase in ["plan", "read", "fill", "exchange", "assemble"] {
            assert!(m["phase_s"][phase].as_f64().is_some(), "{phase}: {m}");
        }
        // The bare all-to-all-v moves exactly the bytes the loader exchanged, in as many
        // windows.
        let x = row("exchange-limit");
        assert_eq!(x["total_sent"], m["total_sent"], "{x}\n{m}");
        assert_eq!(x["delivered_bytes"], m["total_sent"]);
        // Each rank reads its home range's share of the files once; memcpy copies what
        // is delivered to every rank.
        let files: u64 = std::fs::read_dir(&data)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.path().extension().is_some_and(|x| x == "npy"))
            .map(|e| e.metadata().unwrap().len())
            .sum();
        assert_eq!(row("read-limit")["delivered_bytes"], files);
        assert_eq!(row("memcpy-limit")["delivered_bytes"], steps * BATCH * SAMPLE_BYTES);
        // The random-access baseline delivers steps × batch samples, each whole.
        let ra = row("random-access");
        assert_eq!(ra["samples_per_epoch"], steps * BATCH);
        assert_eq!(ra["delivered_bytes"], steps * BATCH * SAMPLE_BYTES);
        assert_eq!(ra["steps_per_epoch"], steps);
        // The broadcast baseline delivers the same batches (rank 0 reads them all).
        assert_eq!(row("naive")["delivered_bytes"], m["delivered_bytes"]);
    }
    // The lines appended to --out are the printed ones.
    assert_eq!(std::fs::read_to_string(&results).unwrap().lines().count(), 16);

    let plots = dir.path().join("report");
    let run = meshfeed(&["bench", "report", "--in", results.to_str().unwrap(), "--out", plots.to_str().unwrap()]);
    ok(&run);
    assert!(run.stdout.contains("## At 2 ranks"), "{}", run.stdout);
    let md = std::fs::read_to_string(plots.join("report.md")).unwrap();
    let row2 = md.lines().find(|l| l.starts_with("| tiny |") && l.contains("| npy |") && l.contains("| 2 |")).unwrap();
    // 128-byte samples are read in coalesced spans, packed and assembled: 3.32 copies.
    assert!(row2.contains("| 3.32 |"), "copies per byte as the loader counted them: {row2}");
    for name in ["epoch_vs_ranks_tiny", "phases", "scale_ranks", "scale_memory", "scale_sample_size"] {
        let png = std::fs::read(plots.join(format!("{name}.png"))).unwrap();
        assert!(png.len() > 1000 && png.starts_with(b"\x89PNG\r\n\x1a\n"), "{name}.png");
        let svg = std::fs::read_to_string(plots.join(format!("{name}.svg"))).unwrap();
        assert!(svg.contains("<svg") && svg.contains("</svg>") && svg.contains("<text"), "{name}.svg");
    }
}

#[test]
fn limits_and_random_access_read_hdf5_and_arrow_too() {
    let dir = tempdir();
    for format in ["hdf5", "arrow"] {
        let data = dir.path().join(format);
        Dataset::gen(format, SAMPLES).field("x:u8:120").field("y:i64").write(&data);
        let rows = bench(2, &data, &dir.path().join("r.jsonl"), "meshfeed,random-access,read-limit,exchange-limit");
        let row = |name: &str| rows.iter().find(|r| r["loader"] == name).unwrap();
        assert_eq!(row("meshfeed")["format"], format);
        assert_eq!(row("random-access")["delivered_bytes"], (SAMPLES / BATCH) * BATCH * SAMPLE_BYTES, "{format}");
        assert_eq!(row("exchange-limit")["total_sent"], row("meshfeed")["total_sent"], "{format}");
        assert!(row("read-limit")["delivered_bytes"].as_u64().unwrap() > SAMPLES * SAMPLE_BYTES, "{format}");
    }
}

#[test]
fn bad_modes_and_reports_fail_with_clear_errors() {
    let dir = tempdir();
    let data = dir.path().join("npy");
    Dataset::gen("npy", SAMPLES).field("x:u8:120").field("y:i64").write(&data);
    let run = mpirun(1, &["bench", "--data", data.to_str().unwrap(), "--batch-size", "8", "--modes", "fused,bogus"]);
    assert!(run.code != 0 && run.stderr.contains("unknown mode 'bogus'"), "{}", run.stderr);
    let run = mpirun(
        2,
        &["bench", "--data", data.to_str().unwrap(), "--batch-size", "8", "--mesh", "dp=2", "--modes", "random-access"],
    );
    assert!(run.code != 0 && run.stderr.contains("random-access measures the data-parallel pattern"), "{}", run.stderr);
    // The job options bench does not honour are refused, not ignored.
    let run = mpirun(1, &["bench", "--data", data.to_str().unwrap(), "--batch-size", "8", "--heartbeat", "1"]);
    assert!(run.code != 0 && run.stderr.contains("--telemetry and --heartbeat are for"), "{}", run.stderr);
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"loader\":\"meshfeed\",\"ranks\":1}\n{oops\n").unwrap();
    let run =
        meshfeed(&["bench", "report", "--in", bad.to_str().unwrap(), "--out", dir.path().join("r").to_str().unwrap()]);
    assert!(run.code != 0 && run.stderr.contains("bad.jsonl") && run.stderr.contains("line 2"), "{}", run.stderr);
}
