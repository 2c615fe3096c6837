//! What a person sees of a job (issue 42): under `mpirun` on a terminal a progress bar,
//! and no JSON; in a log, a progress line of text (JSON only with `--json`); and a failure
//! as one line naming its cause first, the other ranks quiet unless asked (`-v`).

use std::process::Command;

use crate::common::*;

/// A dataset of 200 samples (50 steps of 4).
fn small(dir: &std::path::Path) -> std::path::PathBuf {
    Dataset::gen("npy", 200).field("x:f32:4").write(&dir.join("d"))
}

/// `sh_command` run under a pseudo-terminal (util-linux's `script`, as an interactive
/// shell would run it): what the terminal received, escape sequences included.
fn on_a_terminal(sh_command: &str) -> Run {
    let mut cmd = Command::new("script");
    // -q: no banner; -e: its child's exit code; the transcript goes to /dev/null, and
    // what the terminal shows to script's own stdout.
    cmd.args(["-q", "-e", "-c", sh_command, "/dev/null"]).env("HDF5_USE_FILE_LOCKING", "FALSE");
    wait_bounded(cmd, &format!("script -c {sh_command}"))
}

/// `mpirun -np NP meshfeed ARGS` as a shell command line (the arguments are plain words).
fn mpirun_line(np: usize, args: &[&str]) -> String {
    let words: Vec<String> = [&["mpirun"][..], &MPIRUN_FLAGS[..], &["-np", &np.to_string(), bin()], args]
        .concat()
        .iter()
        .map(|w| format!("'{w}'"))
        .collect();
    words.join(" ")
}

/// Under `mpirun` on a terminal, rank 0 draws the bar (through Open MPI's forwarding of its
/// stdout) and prints no progress line; the bar is cleared before the summary is printed.
/// With `mpirun`'s stdout a pipe (a log), even on a terminal, no bar is drawn: the progress
/// line is text.
#[test]
fn under_mpirun_on_a_terminal_the_progress_bar_is_drawn() {
    let out = tempdir();
    let data = small(out.path());
    let args =
        ["run", "--data", data.to_str().unwrap(), "--batch-size", "4", "--compute-ms", "20", "--heartbeat", "0.1"];
    let run = on_a_terminal(&mpirun_line(2, &args));
    ok(&run);
    let screen = &run.stdout;
    assert!(screen.contains("epoch 0 [") && screen.contains("/50 steps"), "no bar drawn:\n{screen:?}");
    // The bar moved: a drawing with more than half of the steps done.
    let drawn: Vec<u64> =
        screen.split("] ").filter_map(|s| s.split_once("/50 steps")).filter_map(|(n, _)| n.parse().ok()).collect();
    assert!(drawn.iter().any(|&n| n > 25), "{drawn:?}");
    assert!(!screen.contains("heartbeat") && !screen.contains("meshfeed: epoch 0 step"), "{screen:?}");
    // The summary starts a line of its own: the bar's line was cleared (ESC [2K) before it.
    let (before, _) = screen.split_once("epoch 0: 200 samples").expect("the summary");
    assert!(before.ends_with("\r\u{1b}[2K") || before.ends_with('\n'), "the summary follows the bar: {before:?}");
    assert!(screen.contains("meshfeed: done: 1 epoch(s) on 2 ranks"), "{screen:?}");

    let piped = on_a_terminal(&format!("{} | cat", mpirun_line(2, &args)));
    ok(&piped);
    assert!(!piped.stdout.contains("/50 steps"), "a bar drawn into a pipe:\n{:?}", piped.stdout);
    let beats: Vec<&str> = piped.stdout.lines().filter(|l| l.starts_with("meshfeed: epoch 0 step ")).collect();
    assert!(beats.len() >= 3, "progress lines every 0.1 s of ~1 s:\n{}", piped.stdout);
    assert!(!piped.stdout.contains("{\""), "no JSON without --json:\n{}", piped.stdout);
}

/// A failure at 4 ranks: stderr's first line is its cause, naming the rank (once, not
/// `rank 0: rank 0:`), and nothing repeats it; `-v` adds one line for each other rank;
/// `--json` adds an error object for every rank on stdout. Every way, the job exits 1.
#[test]
fn a_failure_at_four_ranks_is_one_line_naming_its_cause() {
    let out = tempdir();
    let data = small(out.path());
    let cause = "invalid configuration: batch size 400 is larger than the dataset (200 samples)";
    let args = ["run", "--data", data.to_str().unwrap(), "--batch-size", "400"];
    let run = mpirun(4, &args);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let first = agreed_failure(&run, 4);
    assert!(first.starts_with(&format!("meshfeed: error on rank 0: {cause}")), "{}", run.stderr);
    assert_eq!(run.stderr.matches("is larger than the dataset").count(), 1, "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);

    let verbose = mpirun(4, &[&args[..], &["-v"]].concat());
    assert_eq!(verbose.code, 1, "{}", verbose.stderr);
    assert_eq!(verbose.stderr.matches("meshfeed: error on rank").count(), 1, "{}", verbose.stderr);
    assert_eq!(stopped_lines(&verbose, 4, 0), [1, 2, 3], "{}", verbose.stderr);

    let json = mpirun(4, &[&args[..], &["--json"]].concat());
    assert_eq!(json.code, 1, "{}", json.stderr);
    assert!(json.stderr.lines().next().unwrap_or("").starts_with(&format!("meshfeed: error on rank 0: {cause}")));
    let mut objects: Vec<serde_json::Value> = json.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    objects.sort_by_key(|o| o["rank"].as_u64());
    assert_eq!(objects.len(), 4, "{}", json.stdout);
    for (r, o) in objects.iter().enumerate() {
        assert_eq!(
            (o["kind"].as_str(), o["rank"].as_u64(), o["failed_rank"].as_u64()),
            (Some("error"), Some(r as u64), Some(0))
        );
        assert_eq!(o["error"], "config", "{o}");
        assert!(o["message"].as_str().unwrap().starts_with(cause), "{o}");
    }
}

/// The same over UCX (`meshfeed launch`): the cause once, the other ranks quiet, and with
/// `-v` a line for each.
#[test]
fn over_ucx_a_failure_is_printed_once_too() {
    let out = tempdir();
    let data = small(out.path());
    let args = ["run", "--transport", "ucx", "--data", data.to_str().unwrap(), "--batch-size", "400"];
    let run = launch(3, &args);
    assert_ne!(run.code, 0, "{}", run.stderr);
    let root = run.stderr.lines().find(|l| l.starts_with("meshfeed: error on rank ")).expect("the cause");
    assert!(root.starts_with("meshfeed: error on rank 0: invalid configuration: batch size 400"), "{root}");
    assert_eq!(run.stderr.matches("meshfeed: error on rank").count(), 1, "{}", run.stderr);
    assert!(!run.stderr.contains(" stopped: rank "), "{}", run.stderr);
    let verbose = launch(3, &[&args[..], &["-v"]].concat());
    assert_ne!(verbose.code, 0, "{}", verbose.stderr);
    assert_eq!(stopped_lines(&verbose, 3, 0), [1, 2], "{}", verbose.stderr);
}
