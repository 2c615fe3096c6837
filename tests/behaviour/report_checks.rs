//! `meshfeed report` refuses what is not a run (issue 22, item 6): the telemetry of a real
//! 2-rank run is reported, and damaged copies of it — every rank file empty, a rank's file
//! missing, extra or a copy of another rank's, a rank cut short, negative or non-finite
//! seconds and samples — are each an error naming the file and what is wrong, never a
//! quiet table. Report options that are no scenario (a zero node count, batch, bandwidth,
//! ranks per node, replicas) and `bench report` results with epoch times of 0 or less are
//! refused naming the option or key and the value. A FIFO in the place of a telemetry file,
//! of run.json or of `run --config` is refused at once, not waited on (a hang is a
//! failure: every command here runs within a bound).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

/// How long one report (or a refused run) may take: seconds at most; a hang is a failure.
const BOUND: Duration = Duration::from_secs(60);

/// A real run's telemetry: 600 samples, 2 ranks under mpirun, 2 epochs; `dir/d` holds the
/// dataset, `dir/t` the telemetry.
fn real_run() -> tempfile::TempDir {
    let dir = tempdir();
    let d = Dataset::gen("npy", 600).field("x:f32:4").write(&dir.path().join("d"));
    let t = dir.path().join("t");
    let run = mpirun(
        2,
        &[
            "run",
            "--data",
            d.to_str().unwrap(),
            "--batch-size",
            "12",
            "--epochs",
            "2",
            "--telemetry",
            t.to_str().unwrap(),
        ],
    );
    ok(&run);
    for name in ["run.json", "rank-0.jsonl", "rank-1.jsonl"] {
        assert!(t.join(name).is_file(), "the run wrote {name}");
    }
    dir
}

/// `meshfeed ARGS`, within [`BOUND`].
fn meshfeed_bounded(args: &[&str]) -> Run {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    wait_within(cmd, &format!("meshfeed {}", args.join(" ")), BOUND)
}

/// `meshfeed report [--json] DIR`, within [`BOUND`].
fn report(dir: &Path, json: bool) -> Run {
    let mut args = vec!["report"];
    if json {
        args.push("--json");
    }
    args.push(dir.to_str().unwrap());
    meshfeed_bounded(&args)
}

/// A copy of the run's telemetry in `to` (the files only).
fn copy_run(from: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    to.to_path_buf()
}

/// Rewrites `rank-<rank>.jsonl` in `dir`, changing the records `change` says it changed;
/// returns the (1-based) numbers of the lines changed, at least one.
fn edit(dir: &Path, rank: usize, change: impl Fn(&mut serde_json::Value) -> bool) -> Vec<usize> {
    let path = dir.join(format!("rank-{rank}.jsonl"));
    let mut changed = Vec::new();
    let lines: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            if change(&mut v) {
                changed.push(i + 1);
            }
            v.to_string()
        })
        .collect();
    assert!(!changed.is_empty(), "{}: no record to change", path.display());
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    changed
}

/// Rewrites `rank-<rank>.jsonl` in `dir` without the records `drop` picks; returns the
/// records kept, in order, and how many were left out.
fn drop_records(dir: &Path, rank: usize, drop: impl Fn(&serde_json::Value) -> bool) -> (Vec<serde_json::Value>, usize) {
    let path = dir.join(format!("rank-{rank}.jsonl"));
    let all: Vec<serde_json::Value> =
        std::fs::read_to_string(&path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let total = all.len();
    let kept: Vec<serde_json::Value> = all.into_iter().filter(|v| !drop(v)).collect();
    let lines: Vec<String> = kept.iter().map(|v| v.to_string()).collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let dropped = total - kept.len();
    (kept, dropped)
}

/// The epoch record of `epoch`.
fn is_epoch(v: &serde_json::Value, epoch: u64) -> bool {
    v["kind"] == "epoch" && v["epoch"] == epoch
}

/// Asserts a refusal: a non-zero exit, no panic, no table, and stderr saying each of
/// `needles` (the file or option, and the reason).
fn refused(run: &Run, needles: &[&str]) {
    assert_ne!(run.code, 0, "must fail:\nstdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert!(!run.stdout.contains("epoch_s") && !run.stdout.contains("\"kind\""), "no table: {}", run.stdout);
    for n in needles {
        assert!(run.stderr.contains(n), "stderr should say '{n}':\n{}", run.stderr);
    }
}

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

#[test]
fn a_real_run_is_reported_and_damaged_copies_of_it_are_refused() {
    let dir = real_run();
    let t = dir.path().join("t");
    // The run itself, and an undamaged copy: each epoch of 2 ranks, and the table.
    for run in [t.clone(), copy_run(&t, &dir.path().join("copy"))] {
        let json = report(&run, true);
        ok(&json);
        let epochs: Vec<serde_json::Value> = json
            .stdout
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["kind"] == "epoch")
            .collect();
        assert_eq!(
            epochs.iter().map(|e| (e["epoch"].as_u64(), e["ranks"].as_u64())).collect::<Vec<_>>(),
            [(Some(0), Some(2)), (Some(1), Some(2))]
        );
        assert!(epochs.iter().all(|e| e["samples"] == 600 && e["seconds"].as_f64().is_some_and(|s| s > 0.0)));
        let table = report(&run, false);
        ok(&table);
        assert!(table.stdout.contains("epoch_s") && table.stdout.contains(run.to_str().unwrap()), "{}", table.stdout);
    }
    let case = |name: &str| copy_run(&t, &dir.path().join(name));
    let path = |run: &Path, name: &str| run.join(name).display().to_string();

    // Every rank file empty (a run that stopped before its first epoch ended).
    let c = case("empty");
    for r in 0..2 {
        std::fs::write(c.join(format!("rank-{r}.jsonl")), "").unwrap();
    }
    refused(&report(&c, false), &[&format!("{}: empty, no epoch record", path(&c, "rank-0.jsonl"))]);

    // run.json says 2 ranks; rank 1's file is missing (once a 1-rank run).
    let c = case("missing");
    std::fs::remove_file(c.join("rank-1.jsonl")).unwrap();
    refused(
        &report(&c, true),
        &[&format!("{}: run.json says the run had 2 rank(s), but rank-1.jsonl is missing", c.display())],
    );

    // Rank 0's file copied as rank 1's (once a 2-rank run with rank 0 counted twice).
    let c = case("copied");
    std::fs::copy(c.join("rank-0.jsonl"), c.join("rank-1.jsonl")).unwrap();
    refused(
        &report(&c, false),
        &[&format!(
            "{}: line 1: a record of rank 0 in rank 1's file: a copy of another rank's file",
            path(&c, "rank-1.jsonl")
        )],
    );

    // Without run.json, two files holding rank 1's records: still refused.
    let c = case("copied-no-config");
    std::fs::remove_file(c.join("run.json")).unwrap();
    std::fs::copy(c.join("rank-1.jsonl"), c.join("rank-2.jsonl")).unwrap();
    refused(
        &report(&c, false),
        &[&format!("{}: line 1: a record of rank 1 in rank 2's file", path(&c, "rank-2.jsonl"))],
    );

    // Without run.json, rank 1's file missing: rank 0's epoch records say the run had 2.
    let c = case("missing-no-config");
    std::fs::remove_file(c.join("run.json")).unwrap();
    std::fs::remove_file(c.join("rank-1.jsonl")).unwrap();
    refused(
        &report(&c, false),
        &[
            &path(&c, "rank-0.jsonl"),
            "the record says the run had 2 rank(s), but without run.json, the rank files say the run had 1 rank(s)",
        ],
    );

    // A rank file that is no rank of run.json's.
    let c = case("extra");
    std::fs::copy(c.join("rank-1.jsonl"), c.join("rank-2.jsonl")).unwrap();
    refused(
        &report(&c, false),
        &[&format!(
            "{}: rank 2 is not one of the run's ranks: run.json says the run had 2 rank(s)",
            path(&c, "rank-2.jsonl")
        )],
    );

    // A rank whose last epoch is missing (cut, or it stopped early).
    let c = case("cut");
    let text = std::fs::read_to_string(c.join("rank-1.jsonl")).unwrap();
    let kept: Vec<&str> = text.lines().take_while(|l| !l.contains("\"epoch\":1")).collect();
    assert!(!kept.is_empty() && kept.len() < text.lines().count());
    std::fs::write(c.join("rank-1.jsonl"), kept.join("\n") + "\n").unwrap();
    refused(
        &report(&c, false),
        &[&format!("{}: no record of epoch 1, which 1 of the run's 2 ranks recorded", path(&c, "rank-1.jsonl"))],
    );

    // Every rank killed during epoch 1: its windows were written as each was finished,
    // its epoch record never was. Reported: the epoch the ranks finished, not the one
    // they were killed in.
    let c = case("killed");
    for r in 0..2 {
        let (kept, dropped) = drop_records(&c, r, |v| is_epoch(v, 1));
        assert_eq!(dropped, 1, "one record of epoch 1: {kept:?}");
        assert_eq!(kept.last().unwrap()["kind"], "window", "{kept:?}");
    }
    let run = report(&c, true);
    ok(&run);
    let epochs = records(&run.stdout, "epoch");
    assert_eq!(epochs.iter().map(|e| e["epoch"].as_u64()).collect::<Vec<_>>(), [Some(0)], "{}", run.stdout);
    // Epoch 0 run again after epoch 1 (a loop that sought back): its last run counts.
    let c = case("repeated");
    for r in 0..2 {
        let file = c.join(format!("rank-{r}.jsonl"));
        let text = std::fs::read_to_string(&file).unwrap();
        let again: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["epoch"] == 0)
            .map(|mut v| {
                if v["kind"] == "epoch" {
                    v["seconds"] = 54321.0.into();
                }
                v.to_string()
            })
            .collect();
        assert!(again.len() >= 2, "{text}");
        std::fs::write(&file, format!("{text}{}\n", again.join("\n"))).unwrap();
    }
    let run = report(&c, true);
    ok(&run);
    let epochs = records(&run.stdout, "epoch");
    let seconds: Vec<(Option<u64>, Option<f64>)> =
        epochs.iter().map(|e| (e["epoch"].as_u64(), e["seconds"].as_f64())).collect();
    assert_eq!(seconds.len(), 2, "{}", run.stdout);
    assert_eq!(seconds[0], (Some(0), Some(54321.0)), "{}", run.stdout);
    // A window with no record of its epoch before the last epoch record is no cut run.
    let c = case("window-without-epoch");
    let (kept, dropped) = drop_records(&c, 0, |v| is_epoch(v, 0));
    assert_eq!(dropped, 1, "{kept:?}");
    let window = kept.iter().position(|v| v["kind"] == "window" && v["epoch"] == 0).unwrap();
    refused(
        &report(&c, false),
        &[&format!(
            "{}: line {}: a window of epoch 0, which this file has no epoch record of",
            path(&c, "rank-0.jsonl"),
            window + 1
        )],
    );

    // Negative seconds, samples and phase times; a non-finite time.
    let c = case("negative-seconds");
    let lines = edit(&c, 1, |v| {
        is_epoch(v, 1) && {
            v["seconds"] = (-0.5).into();
            true
        }
    });
    refused(
        &report(&c, false),
        &[&format!(
            "{}: line {}: seconds is -0.5: a time is a finite, non-negative number of seconds",
            path(&c, "rank-1.jsonl"),
            lines[0]
        )],
    );
    let c = case("negative-samples");
    let lines = edit(&c, 0, |v| {
        is_epoch(v, 0) && {
            v["samples"] = (-600).into();
            true
        }
    });
    refused(
        &report(&c, false),
        &[&format!(
            "{}: line {}: samples is -600: a count is a non-negative integer",
            path(&c, "rank-0.jsonl"),
            lines[0]
        )],
    );
    let c = case("negative-phase");
    let lines = edit(&c, 1, |v| {
        v["kind"] == "window" && v["epoch"] == 0 && v["first_step"] == 0 && {
            v["phase_s"]["read"] = (-0.25).into();
            true
        }
    });
    refused(&report(&c, false), &[&format!("{}: line {}: phase_s.read is -0.25", path(&c, "rank-1.jsonl"), lines[0])]);
    let c = case("infinite");
    let lines = edit(&c, 0, |v| {
        is_epoch(v, 0) && {
            v["seconds"] = 12345.0.into();
            true
        }
    });
    let text = std::fs::read_to_string(c.join("rank-0.jsonl")).unwrap().replace("12345.0", "1e999");
    std::fs::write(c.join("rank-0.jsonl"), text).unwrap();
    refused(&report(&c, false), &[&format!("{}: line {}: not a JSON record", path(&c, "rank-0.jsonl"), lines[0])]);

    // run.json's ranks are no number of ranks.
    let c = case("zero-ranks");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.join("run.json")).unwrap()).unwrap();
    config["ranks"] = 0.into();
    std::fs::write(c.join("run.json"), config.to_string()).unwrap();
    refused(
        &report(&c, false),
        &[&format!("{}: ranks is 0: a number of ranks is a positive integer", path(&c, "run.json"))],
    );

    // FIFOs in the place of rank 0's file and of run.json: refused at once, not waited on.
    for name in ["rank-0.jsonl", "run.json"] {
        let c = case(&format!("fifo-{name}"));
        std::fs::remove_file(c.join(name)).unwrap();
        mkfifo(&c.join(name));
        let run = report(&c, false);
        refused(&run, &[&format!("{}: not a regular file (a FIFO)", path(&c, name))]);
        assert!(run.elapsed < Duration::from_secs(30), "took {:?}", run.elapsed);
    }
}

#[test]
fn report_options_that_are_no_scenario_are_refused_naming_the_option_and_value() {
    let dir = real_run();
    let t = dir.path().join("t");
    let t = t.to_str().unwrap();
    // Every option at a valid value: the model is fitted and predicts.
    let run = meshfeed_bounded(&[
        "report",
        "--json",
        t,
        "--predict",
        "1,2",
        "--ranks-per-node",
        "2",
        "--samples",
        "600",
        "--sample-bytes",
        "16",
        "--batch-size",
        "12",
        "--window-bytes",
        "1M",
        "--replicas",
        "1",
        "--storage-bandwidth",
        "1G",
        "--node-read-bandwidth",
        "1G",
        "--link-bandwidth",
        "1G",
    ]);
    ok(&run);
    let predictions = run.stdout.lines().filter(|l| l.contains("\"kind\":\"prediction\"")).count();
    assert_eq!(predictions, 2, "{}", run.stdout);
    for (option, value) in [
        ("--predict", "0"),
        ("--predict", "1,0,4"),
        ("--predict", "2000000"),
        ("--ranks-per-node", "0"),
        ("--samples", "0"),
        ("--sample-bytes", "0"),
        ("--batch-size", "0"),
        ("--batch-size", "-1"),
        ("--window-bytes", "0K"),
        ("--replicas", "0"),
        ("--storage-bandwidth", "0"),
        ("--node-read-bandwidth", "0"),
        ("--link-bandwidth", "0M"),
    ] {
        let mut args = vec!["report", t];
        if option != "--predict" {
            args.extend(["--predict", "1,2"]);
        }
        let arg = format!("{option}={value}");
        args.push(&arg);
        let run = meshfeed_bounded(&args);
        // clap's usage error: exit 2, naming the option and the value.
        assert_eq!(run.code, 2, "{arg}:\n{}\n{}", run.stdout, run.stderr);
        let bad = if value.contains(',') { "0" } else { value };
        refused(&run, &[&format!("invalid value '{bad}' for '{option}")]);
    }
}

#[test]
fn bench_report_refuses_epoch_times_of_zero_or_less() {
    let dir = tempdir();
    let line = |best: f64| {
        serde_json::json!({
            "loader": "meshfeed", "ranks": 2, "tag": "tiny", "format": "npy", "sample_bytes": 16,
            "samples": 600, "window_bytes": 1048576, "epochs": 1, "epoch_s": 0.5, "epoch_s_best": best,
            "epoch_s_all": [0.5], "samples_per_epoch": 600, "samples_per_s": 1200.0,
        })
        .to_string()
    };
    let bench_report = |name: &str, lines: &[String]| {
        let input = dir.path().join(name);
        std::fs::write(&input, lines.join("\n") + "\n").unwrap();
        let out = dir.path().join(format!("{name}.out"));
        (
            meshfeed_bounded(&[
                "bench",
                "report",
                "--in",
                input.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--no-plots",
            ]),
            input,
            out,
        )
    };
    let (run, _, out) = bench_report("good.jsonl", &[line(0.5)]);
    ok(&run);
    assert!(run.stdout.contains("## Every point") && out.join("report.md").is_file(), "{}", run.stdout);
    for (best, shown) in [(0.0, "0"), (-1.0, "-1")] {
        let (run, input, out) = bench_report(&format!("best-{shown}.jsonl"), &[line(0.5), line(best)]);
        refused(
            &run,
            &[&format!(
                "{}: line 2: epoch_s_best is {shown}: an epoch takes a positive, finite number of seconds",
                input.display()
            )],
        );
        assert!(!out.join("report.md").exists(), "no report of a bad input");
    }
    // The median and every epoch count too.
    let mut bad: serde_json::Value = serde_json::from_str(&line(0.5)).unwrap();
    bad["epoch_s_all"] = serde_json::json!([0.5, -0.25]);
    let (run, input, _) = bench_report("all.jsonl", &[bad.to_string()]);
    refused(&run, &[&format!("{}: line 1: epoch_s_all[1] is -0.25", input.display())]);
}

#[test]
fn a_fifo_or_a_huge_file_as_the_job_file_is_refused_at_once() {
    let dir = tempdir();
    let d = dir.path().join("d");
    ok(&meshfeed(&[
        "gen",
        "--format",
        "npy",
        "--samples",
        "120",
        "--files",
        "1",
        "--field",
        "x:f32:4",
        "--out",
        d.to_str().unwrap(),
    ]));
    let mpirun_bounded = |config: &Path| {
        let mut cmd = Command::new("mpirun");
        cmd.args(MPIRUN_FLAGS).args(["-np", "1", bin(), "run", "--config", config.to_str().unwrap()]);
        cmd.env("HDF5_USE_FILE_LOCKING", "FALSE");
        wait_within(cmd, &format!("mpirun -np 1 meshfeed run --config {}", config.display()), BOUND)
    };
    // A job file that is a regular file is read.
    let good = dir.path().join("job.toml");
    std::fs::write(&good, format!("data = [{:?}]\nbatch_size = 12\n", d.to_str().unwrap())).unwrap();
    ok(&mpirun_bounded(&good));
    // A FIFO: once every rank waited for a writer forever.
    let fifo = dir.path().join("fifo.toml");
    mkfifo(&fifo);
    let run = mpirun_bounded(&fifo);
    assert_ne!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains(&format!("{}: not a regular file (a FIFO)", fifo.display())), "{}", run.stderr);
    assert!(run.elapsed < Duration::from_secs(30), "took {:?}", run.elapsed);
    // A 2 MiB job file (sparse): refused before it is read.
    let huge = dir.path().join("huge.toml");
    std::fs::File::create(&huge).unwrap().set_len(2 << 20).unwrap();
    let run = mpirun_bounded(&huge);
    assert_ne!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains(&format!("{}: 2097152 bytes: a file of this kind is at most 1048576 bytes", huge.display())),
        "{}",
        run.stderr
    );
}

/// Measured runs committed to the repository (`tests/fixtures/telemetry/npy-16k`): 24 000
/// samples of 16 KiB, batch 240, 4 MiB windows, `--local-reads off --memory-budget 0` (so
/// that every window reads and exchanges), 3 epochs at 2, 3 and 4 ranks on one 2-core host
/// (the 3- and 4-rank runs oversubscribed), recorded at revision 78598ee with
/// `mpirun -np P meshfeed run ... --telemetry DIR`.
fn committed_runs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/telemetry/npy-16k")
}

/// The JSON records of `kind` that `meshfeed report --json` printed.
fn records(stdout: &str, kind: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == kind)
        .collect()
}

/// The cost model (`report --predict`, whose exchange term is the function
/// `--exchange auto` chooses with) against measurements it did not generate: fitted to the
/// committed runs, it predicts each one's last epoch within a factor of two, and fitted to
/// the 2- and 3-rank runs alone it predicts the 4-rank run's within a factor of two. (At
/// 78598ee the ratios were 0.70–1.31 in sample and 0.68 held out: the oversubscribed runs
/// are slower than the model's per-rank rates say.)
#[test]
fn the_cost_model_predicts_committed_runs_within_a_factor_of_two() {
    let runs = committed_runs();
    let run = meshfeed_bounded(&["report", "--predict", "1", "--json", runs.to_str().unwrap()]);
    ok(&run);
    let validation = records(&run.stdout, "validation");
    assert_eq!(validation.len(), 3, "{}", run.stdout);
    let measured_4 =
        validation.iter().find(|v| v["ranks"] == 4).expect("the 4-rank run")["measured_s"].as_f64().unwrap();
    for v in &validation {
        let ratio = v["ratio"].as_f64().unwrap();
        assert!((0.5..=2.0).contains(&ratio), "predicted/measured {ratio} for {v}");
    }
    // Held out: fit to 2 and 3 ranks, predict 4.
    let fit = tempdir();
    for p in ["np2", "np3"] {
        copy_run(&runs.join(p), &fit.path().join(p));
    }
    let fit_dir = fit.path().to_str().unwrap();
    let run = meshfeed_bounded(&["report", "--predict", "1", "--ranks-per-node", "4", "--json", fit_dir]);
    ok(&run);
    let prediction = records(&run.stdout, "prediction");
    assert_eq!(prediction.len(), 1, "{}", run.stdout);
    assert_eq!(prediction[0]["ranks"], 4, "{}", prediction[0]);
    let ratio = prediction[0]["epoch_s"].as_f64().unwrap() / measured_4;
    assert!((0.5..=2.0).contains(&ratio), "4 ranks held out: predicted/measured {ratio}");
}
