//! `slurm/sweep.sh` checks the whole sweep before it submits anything (issue 22, item 7):
//! a wrong type, value, key or name, an empty grid list, a file that is missing, not
//! UTF-8 or not TOML — each is named with its key and reason, no Python traceback,
//! nothing submitted and nothing written anywhere; every problem of a file at once. A
//! valid sweep submits exactly its points. `sbatch` and the meshfeed binary are fakes
//! that log their arguments: no cluster and no build of meshfeed are needed.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// A temporary directory with a fake `sbatch` (appends its arguments, one line a job, to
/// `sbatch.log`) and a fake meshfeed (appends its arguments to `meshfeed.log`: sweep.sh
/// runs `meshfeed report` last), sweep files under `work/`, and the results directory
/// two levels down, so that a name escaping it would land inside the sandbox.
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempdir();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(dir.path().join("work/deep/er")).unwrap();
        let sandbox = Sandbox { dir };
        for (name, log) in [("sbatch", sandbox.sbatch_log()), ("meshfeed", sandbox.meshfeed_log())] {
            let script = bin.join(name);
            std::fs::write(&script, format!("#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\nexit 0\n", log.display()))
                .unwrap();
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        sandbox
    }

    fn sbatch_log(&self) -> PathBuf {
        self.dir.path().join("sbatch.log")
    }

    fn meshfeed_log(&self) -> PathBuf {
        self.dir.path().join("meshfeed.log")
    }

    fn results(&self) -> PathBuf {
        self.dir.path().join("work/deep/er/results")
    }

    /// Writes `work/<name>` and returns its path.
    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.dir.path().join("work").join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// `bash slurm/sweep.sh SWEEP RESULTS` with the fakes first on PATH.
    fn sweep(&self, file: &Path) -> Run {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("slurm/sweep.sh");
        let path = format!("{}:{}", self.dir.path().join("bin").display(), std::env::var("PATH").unwrap_or_default());
        let mut cmd = Command::new("bash");
        cmd.arg(script).arg(file).arg(self.results());
        cmd.env("PATH", path).env("MESHFEED_BIN", self.dir.path().join("bin/meshfeed"));
        wait_bounded(cmd, &format!("slurm/sweep.sh {}", file.display()))
    }

    /// The jobs submitted, one line of sbatch arguments each.
    fn submitted(&self) -> Vec<String> {
        std::fs::read_to_string(self.sbatch_log()).map_or(vec![], |s| s.lines().map(str::to_string).collect())
    }

    /// Every path in the sandbox, relative to it.
    fn tree(&self) -> BTreeSet<PathBuf> {
        fn walk(root: &Path, dir: &Path, into: &mut BTreeSet<PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                into.insert(path.strip_prefix(root).unwrap().to_path_buf());
                if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                    walk(root, &path, into);
                }
            }
        }
        let mut paths = BTreeSet::new();
        walk(self.dir.path(), self.dir.path(), &mut paths);
        paths
    }

    /// Runs the sweep `file` and checks it was refused as a whole: a non-zero exit, each
    /// of `needles` in stderr, no traceback, nothing submitted, nothing created (not even
    /// the results directory). The stderr.
    fn refused(&self, file: &Path, needles: &[&str]) -> String {
        let before = self.tree();
        let run = self.sweep(file);
        assert_ne!(run.code, 0, "the sweep must be refused:\n{}\n{}", run.stdout, run.stderr);
        assert!(!run.stderr.contains("Traceback"), "a traceback:\n{}", run.stderr);
        for needle in needles {
            assert!(run.stderr.contains(needle), "stderr lacks {needle:?}:\n{}", run.stderr);
        }
        assert_eq!(self.submitted(), Vec::<String>::new(), "nothing is submitted:\n{}", run.stderr);
        assert!(!self.sbatch_log().exists() && !self.meshfeed_log().exists(), "neither sbatch nor meshfeed ran");
        assert_eq!(self.tree(), before, "nothing is created, in RESULTS or anywhere else");
        assert!(!run.stdout.contains("point(s) into"), "{}", run.stdout);
        run.stderr
    }
}

/// A sweep file: the top-level lines, then `[grid]` and its lines.
fn toml(top: &str, grid: &str) -> Vec<u8> {
    format!("{top}\n[grid]\n{grid}\n").into_bytes()
}

const BASE: &str = "name = \"scaling\"\ndata = \"/shared/d\"";

/// Each job's value of `flag` (`-N`, `-J`) in the sbatch log's lines.
fn flag_values(jobs: &[String], flag: &str) -> Vec<String> {
    jobs.iter()
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words.iter().position(|w| *w == flag).unwrap_or_else(|| panic!("no {flag} in {line}"));
            words[at + 1].to_string()
        })
        .collect()
}

#[test]
fn wrong_values_are_named_with_their_key_and_nothing_is_submitted() {
    let s = Sandbox::new();
    for (top, grid, needle) in [
        // A string is one value, never its letters (it once submitted jobs on 1 and 2 nodes).
        (BASE, "nodes = \"12\"", "sweep.toml: grid.nodes: \"12\": expected an integer >= 1"),
        (BASE, "nodes = [0]", "sweep.toml: grid.nodes[0]: 0: expected an integer >= 1"),
        (
            BASE,
            "nodes = [1]\nbatch_size = [\"abc\"]",
            "sweep.toml: grid.batch_size[0]: \"abc\": expected an integer >= 1",
        ),
        (BASE, "nodes = [1]\ntransport = [\"tcp\"]", "sweep.toml: grid.transport[0]: \"tcp\": expected mpi or ucx"),
        (BASE, "nodes = [1]\nloader = [\"dali\"]", "grid.loader[0]: \"dali\": expected meshfeed, broadcast or pytorch"),
        (BASE, "nodes = [1]\nwindow_bytes = [\"8X\"]", "grid.window_bytes[0]: \"8X\": expected a byte size"),
        (BASE, "nodes = [1]\nranks_per_node = 1.5", "grid.ranks_per_node: 1.5: expected an integer >= 1"),
        ("name = \"a\"\ndata = [\"a\"]", "nodes = [1]", "sweep.toml: data: [\"a\"]: expected a non-empty string"),
        (BASE, "nodes = []", "sweep.toml: grid.nodes: []: expected at least one value"),
        (BASE, "nodes = [2, 2]", "grid.nodes[1]: 2: repeats grid.nodes[0]"),
        ("name = \"a\"\ndata = \"/d\"\nepochs = 0", "nodes = [1]", "sweep.toml: epochs: 0: expected an integer >= 1"),
        (
            "name = \"a\"\ndata = \"/d\"\nverify = \"yes\"",
            "nodes = [1]",
            "sweep.toml: verify: \"yes\": expected true or false",
        ),
        (
            "name = \"a\"\ndata = \"/d\"\nformat = \"csv\"",
            "nodes = [1]",
            "format: \"csv\": expected npy, hdf5, arrow or raw",
        ),
        ("name = \"a\"\ndata = \"/d\"\npytorch_workers = \"0,x\"", "nodes = [1]", "pytorch_workers: \"0,x\": expected"),
        (
            "name = \"a\"\ndata = \"/d\"\npredict = \"0,16\"",
            "nodes = [1]",
            "predict: \"0,16\": expected comma-separated integers >= 1",
        ),
        ("name = \"a\"\ndata = \"/d\"", "", "sweep.toml: grid.nodes: missing"),
        ("data = \"/d\"", "nodes = [1]", "sweep.toml: name: missing"),
    ] {
        let file = s.file("sweep.toml", &toml(top, grid));
        s.refused(&file, &[needle, "nothing submitted"]);
    }
}

#[test]
fn unknown_keys_top_level_and_in_the_grid_are_refused() {
    let s = Sandbox::new();
    let file = s.file("sweep.toml", &toml(&format!("{BASE}\ncolour = \"red\""), "nodes = [1]"));
    s.refused(&file, &["sweep.toml: colour: unknown key (known: name, data,"]);
    let file = s.file("sweep.toml", &toml(BASE, "nodes = [1]\nnodez = [2]"));
    s.refused(&file, &["sweep.toml: grid.nodez: unknown key (did you mean nodes?"]);
    // A grid key at the top level is not silently ignored either.
    let file = s.file("sweep.toml", &toml(&format!("{BASE}\nbatch_size = 64"), "nodes = [1]"));
    s.refused(&file, &["sweep.toml: batch_size: unknown key", "grid keys go under [grid]"]);
}

#[test]
fn files_that_cannot_be_read_are_one_clear_line() {
    let s = Sandbox::new();
    let one_line = |stderr: &str| assert_eq!(stderr.lines().count(), 1, "one line:\n{stderr}");
    let file = s.file("syntax.toml", b"name = \"a\"\ndata = \"/d\"\n[grid\nnodes = [1]\n");
    one_line(&s.refused(&file, &["syntax.toml: not valid TOML: ", "(at line 3"]));
    let file = s.file("latin1.toml", b"name = \"caf\xe9\"\ndata = \"/d\"\n[grid]\nnodes = [1]\n");
    one_line(&s.refused(&file, &["latin1.toml: not UTF-8 text (line 1: byte 0xe9)"]));
    let missing = s.dir.path().join("work/missing.toml");
    one_line(&s.refused(&missing, &["missing.toml: no such file"]));
    one_line(&s.refused(&s.dir.path().join("work"), &["work: is a directory"]));
}

#[test]
fn a_name_that_leaves_the_results_directory_is_refused() {
    let s = Sandbox::new();
    for name in ["../../x", "a/b", "..", ".", ""] {
        let file = s.file("sweep.toml", &toml(&format!("name = \"{name}\"\ndata = \"/d\""), "nodes = [1]"));
        s.refused(&file, &[&format!("sweep.toml: name: \"{name}\": expected a plain directory name")]);
    }
}

#[test]
fn every_problem_of_a_file_is_reported_at_once() {
    let s = Sandbox::new();
    let file = s.file(
        "sweep.toml",
        &toml("name = \"a/b\"\ndata = \"/d\"", "nodes = [1, 0]\ntransport = \"tcp\"\nloader = [\"meshfeed\"]"),
    );
    let stderr = s.refused(
        &file,
        &[
            "sweep.toml: name: \"a/b\": expected a plain directory name",
            "sweep.toml: grid.nodes[1]: 0: expected an integer >= 1",
            "sweep.toml: grid.transport: \"tcp\": expected mpi or ucx",
            "sweep.toml: 3 problem(s); nothing submitted",
        ],
    );
    assert_eq!(stderr.lines().count(), 4, "three problems and the summary:\n{stderr}");
}

#[test]
fn a_valid_sweep_submits_exactly_its_points() {
    let s = Sandbox::new();
    let file = s.file(
        "sweep.toml",
        &toml(BASE, "nodes = [1, 2]\nloader = [\"meshfeed\", \"pytorch\"]\ntransport = [\"mpi\", \"ucx\"]"),
    );
    let before = s.tree();
    let run = s.sweep(&file);
    ok(&run);
    assert!(!run.stderr.contains("Traceback"), "{}", run.stderr);
    assert!(run.stdout.contains("sweep: 6 point(s)"), "{}", run.stdout);
    // Per node count: meshfeed over MPI and UCX, PyTorch once (it has no transport).
    let jobs = s.submitted();
    assert_eq!(flag_values(&jobs, "-N"), ["1", "1", "1", "2", "2", "2"], "{jobs:#?}");
    assert_eq!(
        flag_values(&jobs, "-J"),
        [
            "sweep-meshfeed-n1x1-b64-w64M-mpi",
            "sweep-pytorch-n1x1-b64",
            "sweep-meshfeed-n1x1-b64-w64M-ucx",
            "sweep-meshfeed-n2x1-b64-w64M-mpi",
            "sweep-pytorch-n2x1-b64",
            "sweep-meshfeed-n2x1-b64-w64M-ucx",
        ]
    );
    // The point's record, as before the checks (the report reads it).
    let out = s.results().join("scaling");
    let point = std::fs::read_to_string(out.join("meshfeed-n1x1-b64-w64M-mpi/point.json")).unwrap();
    assert_eq!(
        point,
        "{\"nodes\": 1, \"ranks_per_node\": 1, \"batch_size\": 64, \"window_bytes\": \"64M\", \"transport\": \"mpi\", \
         \"loader\": \"meshfeed\", \"sweep\": \"scaling\", \"data\": \"/shared/d\", \"epochs\": 1, \"verify\": false, \
         \"drop_caches\": \"\", \"storage_bytes\": \"\", \"format\": \"npy\", \"python\": \"python3\", \
         \"pytorch_workers\": \"0,1,2\", \"predict\": \"1,2,4,8,16,32,64,128,256,512,1024,2048,4096\", \
         \"id\": \"meshfeed-n1x1-b64-w64M-mpi\"}\n"
    );
    // Then the report, with the default prediction (meshfeed points ran).
    let report = std::fs::read_to_string(s.meshfeed_log()).unwrap();
    assert_eq!(
        report,
        format!("report --plots {0}/plots --predict 1,2,4,8,16,32,64,128,256,512,1024,2048,4096 {0}\n", out.display())
    );
    // Everything it wrote is under RESULTS (and the fakes' logs).
    let results = s.results().strip_prefix(s.dir.path()).unwrap().to_path_buf();
    for path in s.tree().difference(&before) {
        assert!(
            path.starts_with(&results)
                || results.starts_with(path)
                || path.ends_with("sbatch.log")
                || path.ends_with("meshfeed.log"),
            "{} is outside RESULTS",
            path.display()
        );
    }
}

#[test]
fn one_value_counts_as_a_one_item_list() {
    let s = Sandbox::new();
    let file = s.file("sweep.toml", &toml(BASE, "nodes = 2\ntransport = \"ucx\"\nwindow_bytes = 1048576"));
    ok(&s.sweep(&file));
    let jobs = s.submitted();
    assert_eq!(flag_values(&jobs, "-N"), ["2"], "{jobs:#?}");
    assert_eq!(flag_values(&jobs, "-J"), ["sweep-meshfeed-n2x1-b64-w1048576-ucx"]);
}

#[test]
fn every_optional_key_takes_its_valid_values() {
    // The sizes meshfeed takes, every top-level key set; `predict = ""`: no prediction.
    let s = Sandbox::new();
    let file = s.file(
        "sweep.toml",
        &toml(
            "name = \"all.keys_1\"\ndata = \"/d\"\nepochs = 2\nverify = true\ndrop_caches = \"true\"\n\
             storage_bytes = \"echo 0\"\nformat = \"hdf5\"\npython = \"python3\"\npytorch_workers = \"0,2\"\npredict = \"\"",
            "nodes = [1]\nranks_per_node = [2]\nbatch_size = 32\nwindow_bytes = [\"8M\", 65536, \"1G\", \"64k\"]\n\
             loader = [\"meshfeed\", \"broadcast\"]",
        ),
    );
    let run = s.sweep(&file);
    ok(&run);
    let jobs = s.submitted();
    assert_eq!(jobs.len(), 8, "{jobs:#?}");
    assert!(jobs.iter().all(|j| j.contains("--epochs 2") && j.contains("--verify")), "{jobs:#?}");
    assert!(
        jobs[0].contains("--window-bytes 8M") && jobs[3].contains("-J sweep-broadcast-n1x2-b32-w65536-mpi"),
        "{jobs:#?}"
    );
    let out = s.results().join("all.keys_1");
    let storage = std::fs::read_to_string(out.join("meshfeed-n1x2-b32-w1G-mpi/storage.json")).unwrap();
    assert_eq!(storage.trim(), "{\"storage_bytes\": 0}");
    let report = std::fs::read_to_string(s.meshfeed_log()).unwrap();
    assert_eq!(report, format!("report --plots {0}/plots {0}\n", out.display()));
}
