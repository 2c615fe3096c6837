//! Replays the kept corpus (and the saved crash inputs) through the fuzz target bodies on
//! stable Rust, without libFuzzer or cargo-fuzz:
//!
//! ```sh
//! cargo test --manifest-path tests/fuzz/Cargo.toml --test replay            # corpus
//! FUZZ_REPLAY=path/to/input FUZZ_TARGET=npy_file \
//!   cargo test --manifest-path tests/fuzz/Cargo.toml --test replay one_input -- --nocapture
//! ```
//!
//! Every input of `corpus/<target>/` and `seeds/<target>/` must run without a panic.
//! `artifacts/<target>/` holds inputs that crashed meshfeed (README.md "Findings"); all
//! are fixed, and they stay here as regression inputs.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

fn target(name: &str) -> fn(&[u8]) {
    meshfeed_fuzz::TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no fuzz target '{name}'"))
        .1
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect(),
        Err(_) => vec![],
    };
    files.retain(|p| p.file_name().is_some_and(|n| n != "README.md" && n != ".gitkeep"));
    files.sort();
    files
}

/// Runs every input of `<kind>/<target>/`, returning the ones that panicked with the
/// panic message.
fn replay(kind: &str, name: &str) -> (usize, Vec<String>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(kind).join(name);
    let run = target(name);
    let files = inputs(&dir);
    let mut failed = Vec::new();
    for f in &files {
        let data = std::fs::read(f).unwrap();
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| run(&data))) {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!("{}: {msg}", f.display()));
        }
    }
    (files.len(), failed)
}

/// The kept (minimized) corpus and the hand-written seeds of one target.
fn corpus(name: &str) {
    let (n, mut failed) = replay("corpus", name);
    let (s, seed_failed) = replay("seeds", name);
    meshfeed_fuzz::cleanup(name);
    failed.extend(seed_failed);
    assert!(n > 0 && s > 0, "corpus/{name} or seeds/{name} is empty");
    assert!(failed.is_empty(), "{} of {} inputs panicked:\n{}", failed.len(), n + s, failed.join("\n"));
    eprintln!("{name}: {n} corpus + {s} seed inputs ok");
}

#[test]
fn corpus_npy_header() {
    corpus("npy_header");
}

#[test]
fn corpus_npy_file() {
    corpus("npy_file");
}

#[test]
fn corpus_arrow_file() {
    corpus("arrow_file");
}

#[test]
fn corpus_raw_schema() {
    corpus("raw_schema");
}

#[test]
fn corpus_specs() {
    corpus("specs");
}

/// The saved crash inputs (regressions): each must now run without a panic.
#[test]
fn artifacts_do_not_panic() {
    let mut all = Vec::new();
    let mut total = 0;
    for (name, _) in meshfeed_fuzz::TARGETS {
        let (n, failed) = replay("artifacts", name);
        meshfeed_fuzz::cleanup(name);
        total += n;
        all.extend(failed);
    }
    assert!(all.is_empty(), "{} of {total} crash inputs still panic:\n{}", all.len(), all.join("\n"));
}

/// One input given by `FUZZ_REPLAY` (a file) and `FUZZ_TARGET` (a target name); does
/// nothing without them. Panics propagate, with a backtrace under RUST_BACKTRACE=1.
#[test]
fn one_input() {
    let (Ok(file), Ok(name)) = (std::env::var("FUZZ_REPLAY"), std::env::var("FUZZ_TARGET")) else { return };
    let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
    target(&name)(&data);
    eprintln!("{name}: {file}: no panic");
}
