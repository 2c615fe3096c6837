//! Helpers shared by the integration tests: running the binary under real `mpirun`,
//! building fixtures, and reading `--dump` directories.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The `meshfeed` binary of this build: it belongs to the `meshfeed-cli` workspace member,
/// so it sits next to this test's own `deps/` directory once the workspace is built
/// (`cargo build --release --workspace`; `tests/ci.sh` does that first).
pub fn bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        let dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
        let bin = dir.join("meshfeed");
        assert!(bin.exists(), "{} is missing: build the workspace first (cargo build --workspace)", bin.display());
        bin.to_str().expect("a UTF-8 target path").to_string()
    })
}

/// How long one command may take before the test fails as hung. Generous: the machine is
/// shared and ranks are oversubscribed; a hang is a failure, never a pass.
pub const HANG_LIMIT: Duration = Duration::from_secs(120);

/// Result of one command.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Runs `cmd` to its end and collects its output; a command that outlives the tests' bound
/// fails the test (a hang is never a pass).
pub fn wait_bounded(cmd: Command, what: &str) -> Run {
    wait_within(cmd, what, HANG_LIMIT)
}

/// [`wait_bounded`] for a command that is many runs in one (a sweep of batch jobs): its
/// bound is `limit`, each run's share of it no more generous than [`HANG_LIMIT`].
/// A command that outlives its bound fails the test with the last lines it printed.
pub fn wait_within(mut cmd: Command, what: &str, limit: Duration) -> Run {
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    // Drain pipes on threads so a chatty child cannot block; what they have read so far is
    // at hand when the command hangs (its grandchildren may keep the pipes open).
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            // The pipes' last lines, up to a moment after the kill.
            std::thread::sleep(Duration::from_millis(200));
            let tail = |text: &std::sync::Mutex<Vec<u8>>| {
                let text = String::from_utf8_lossy(&text.lock().unwrap()).into_owned();
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(40)..].join("\n")
            };
            panic!(
                "{what} hung for more than {limit:?}: this is a failure (contract 7: no hangs)\n\
                 --- its stdout so far:\n{}\n--- its stderr so far:\n{}",
                tail(&out.0),
                tail(&err.0)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (out.finish(), err.finish());
    Run { code: status.code().unwrap_or(-1), stdout, stderr, elapsed: start.elapsed() }
}

/// A pipe read to its end on a thread, into a buffer readable meanwhile.
struct Drain(std::sync::Arc<std::sync::Mutex<Vec<u8>>>, std::thread::JoinHandle<()>);

fn drain(mut pipe: impl std::io::Read + Send + 'static) -> Drain {
    let text = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let to = std::sync::Arc::clone(&text);
    let thread = std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => to.lock().unwrap().extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
    });
    Drain(text, thread)
}

impl Drain {
    fn finish(self) -> String {
        self.1.join().unwrap();
        let text = std::mem::take(&mut *self.0.lock().unwrap());
        String::from_utf8_lossy(&text).into_owned()
    }
}

/// An example program of this build (`cargo build --examples`), next to the binary.
pub fn example(name: &str) -> String {
    let path = Path::new(bin()).parent().expect("the target directory").join("examples").join(name);
    assert!(path.exists(), "{} is missing: build the examples first (cargo build --examples)", path.display());
    path.to_str().expect("a UTF-8 target path").to_string()
}

/// `mpirun -np NP PROGRAM ARGS` under real OpenMPI (as root, oversubscribed).
pub fn mpirun_program(np: usize, program: &str, args: &[&str]) -> Run {
    let mut cmd = Command::new("mpirun");
    cmd.args(MPIRUN_FLAGS).args(["-np", &np.to_string(), program]).args(args);
    cmd.env("HDF5_USE_FILE_LOCKING", "FALSE");
    wait_bounded(cmd, &format!("mpirun -np {np} {program} {}", args.join(" ")))
}

/// `meshfeed launch -n NP --exe PROGRAM -- ARGS` (the local launcher, UCX rendezvous).
pub fn launch_program(np: usize, program: &str, args: &[&str]) -> Run {
    let mut cmd = Command::new(bin());
    cmd.args(["launch", "-n", &np.to_string(), "--exe", program, "--"]).args(args);
    cmd.env("HDF5_USE_FILE_LOCKING", "FALSE").env("UCX_NET_DEVICES", "lo").env_remove("MESHFEED_JOB_TOKEN");
    wait_bounded(cmd, &format!("meshfeed launch -n {np} --exe {program} -- {}", args.join(" ")))
}

/// `meshfeed ARGS` in one process (gen, inspect).
pub fn meshfeed(args: &[&str]) -> Run {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    wait_bounded(cmd, &format!("meshfeed {}", args.join(" ")))
}

/// A synthetic dataset written by `meshfeed gen` (contents a function of the sample id, so
/// every delivered value can be checked), as a builder: `Dataset::gen("npy", 600)
/// .field("x:f32:4").write(&dir)`. Three files unless told otherwise.
pub struct Dataset {
    format: String,
    samples: u64,
    files: u64,
    fields: Vec<String>,
    extra: Vec<String>,
}

impl Dataset {
    /// `samples` samples in `format` (`npy`, `hdf5`, `arrow`, `raw`).
    pub fn gen(format: &str, samples: u64) -> Dataset {
        Dataset { format: format.into(), samples, files: 3, fields: Vec::new(), extra: Vec::new() }
    }

    /// In `files` files.
    pub fn files(mut self, files: u64) -> Dataset {
        self.files = files;
        self
    }

    /// One more field, `name:dtype[:shape]` (e.g. `x:f32:4x6`, `y:i64`, `t:bytes`).
    pub fn field(mut self, field: &str) -> Dataset {
        self.fields.push(field.into());
        self
    }

    /// More fields, in order (as [`Dataset::field`] for each).
    pub fn fields<'a>(self, fields: impl IntoIterator<Item = &'a str>) -> Dataset {
        fields.into_iter().fold(self, Dataset::field)
    }

    /// More `meshfeed gen` options, after the others (e.g. `["--arrow-batch-rows", "100"]`).
    pub fn args<'a>(mut self, args: impl IntoIterator<Item = &'a str>) -> Dataset {
        self.extra.extend(args.into_iter().map(String::from));
        self
    }

    /// Writes the dataset into `out` (created) and returns `out`; a failure fails the test.
    pub fn write(&self, out: &Path) -> PathBuf {
        let (samples, files) = (self.samples.to_string(), self.files.to_string());
        let out_s = out.to_str().expect("a UTF-8 test path");
        let mut args = vec!["gen", "--format", &self.format, "--samples", &samples, "--files", &files];
        for f in &self.fields {
            args.extend(["--field", f.as_str()]);
        }
        args.extend(["--out", out_s]);
        args.extend(self.extra.iter().map(String::as_str));
        ok(&meshfeed(&args));
        out.to_path_buf()
    }
}

/// A `meshfeed run` job on a dataset, as a builder of its command line: `Job::new(&data)
/// .batch(8).seed(9).epochs(2).mesh("dp=2,tp=2").dump(&dir).mpirun(4)`. The options go on
/// the command line in the order they are given, after `run --data DATA`; the job runs
/// under real `mpirun` ([`Job::mpirun`]), the UCX launcher ([`Job::launch`]) or either
/// ([`Job::over`]), and returns the [`Run`] the test asserts on.
#[derive(Clone, Debug)]
pub struct Job {
    args: Vec<String>,
}

impl Job {
    /// `meshfeed run --data DATA`.
    pub fn new(data: impl AsRef<Path>) -> Job {
        Job { args: vec!["run".into()] }.path("--data", data)
    }

    /// `meshfeed run --config FILE`: a job file (TOML) instead of `--data`; the options
    /// given after it override the file's.
    pub fn config(file: &Path) -> Job {
        Job { args: vec!["run".into()] }.path("--config", file)
    }

    /// `OPTION VALUE`.
    pub fn opt(mut self, option: &str, value: impl ToString) -> Job {
        self.args.extend([option.to_string(), value.to_string()]);
        self
    }

    /// `OPTION PATH`, the path as given (test paths are UTF-8).
    pub fn path(self, option: &str, path: impl AsRef<Path>) -> Job {
        self.opt(option, path.as_ref().to_str().expect("a UTF-8 test path"))
    }

    /// `--batch-size B` (the global batch).
    pub fn batch(self, batch: u64) -> Job {
        self.opt("--batch-size", batch)
    }

    /// `--epochs E`.
    pub fn epochs(self, epochs: u64) -> Job {
        self.opt("--epochs", epochs)
    }

    /// `--seed S`.
    pub fn seed(self, seed: u64) -> Job {
        self.opt("--seed", seed)
    }

    /// `--mesh MESH` (e.g. `dp=2,tp=2`).
    pub fn mesh(self, mesh: &str) -> Job {
        self.opt("--mesh", mesh)
    }

    /// `--window-bytes SIZE` (e.g. `1K`).
    pub fn window(self, bytes: &str) -> Job {
        self.opt("--window-bytes", bytes)
    }

    /// `--dump DIR`.
    pub fn dump(self, dir: &Path) -> Job {
        self.path("--dump", dir)
    }

    /// `--compute-ms MS`: each rank sleeps this long after each batch (as training would),
    /// so that a signal or a kill lands mid-run.
    pub fn compute_ms(self, ms: u64) -> Job {
        self.opt("--compute-ms", ms)
    }

    /// `--state PATH`: where the run writes its position when stopped (SIGTERM/SIGINT) and
    /// at the end.
    pub fn state(self, path: &Path) -> Job {
        self.path("--state", path)
    }

    /// `--resume-from FROM`: a state file or `EPOCH:STEP`.
    pub fn resume_from(self, from: impl AsRef<Path>) -> Job {
        self.path("--resume-from", from)
    }

    /// `--transport NAME` (`mpi` or `ucx`), for a job started by hand (as
    /// [`spawn_rank`] does); [`Job::over`] and [`Job::launch`] add it themselves.
    pub fn transport(self, name: &str) -> Job {
        self.opt("--transport", name)
    }

    /// `--verify`: check each epoch that every sample arrived exactly once, in order, intact.
    pub fn verify(self) -> Job {
        self.args(["--verify"])
    }

    /// `--json`: JSON lines on stdout (the per-epoch summaries, progress and errors).
    pub fn json(self) -> Job {
        self.args(["--json"])
    }

    /// `--memory-budget BYTES` (e.g. `0`: nothing kept in memory, or `1G`).
    pub fn memory_budget(self, bytes: impl ToString) -> Job {
        self.opt("--memory-budget", bytes)
    }

    /// `--read-strategy NAME` (e.g. `resident`, `passes`, `random`).
    pub fn read_strategy(self, name: &str) -> Job {
        self.opt("--read-strategy", name)
    }

    /// `--local-reads MODE` (e.g. `off`: every row crosses the exchange).
    pub fn local_reads(self, mode: &str) -> Job {
        self.opt("--local-reads", mode)
    }

    /// `--spill-dir DIR`.
    pub fn spill_dir(self, dir: &Path) -> Job {
        self.path("--spill-dir", dir)
    }

    /// `--telemetry DIR`.
    pub fn telemetry(self, dir: &Path) -> Job {
        self.path("--telemetry", dir)
    }

    /// `--checkpoint PATH`.
    pub fn checkpoint(self, path: &Path) -> Job {
        self.path("--checkpoint", path)
    }

    /// `--fields A,B`: deliver only these fields.
    pub fn fields(self, names: &str) -> Job {
        self.opt("--fields", names)
    }

    /// `--exchange NAME` (`auto`, `fused`, `two-phase`, `broadcast`).
    pub fn exchange(self, name: &str) -> Job {
        self.opt("--exchange", name)
    }

    /// `--shard FIELD=SPEC`: how one field is split over the mesh (e.g. `x=dp,-,tp`).
    pub fn shard(self, spec: &str) -> Job {
        self.opt("--shard", spec)
    }

    /// `--stages FIELD=STAGE` (`first`, `last`, `all`): which pipeline stages get a field.
    pub fn stages(self, spec: &str) -> Job {
        self.opt("--stages", spec)
    }

    /// `--pack SPEC` (sequence packing, e.g. `tokens:16,eos=0`).
    pub fn pack(self, spec: &str) -> Job {
        self.opt("--pack", spec)
    }

    /// `--prefetch N`: windows made ahead by the producer thread (0: none).
    pub fn prefetch(self, windows: u64) -> Job {
        self.opt("--prefetch", windows)
    }

    /// `--tail MODE` (e.g. `partial`: deliver the last, short batch).
    pub fn tail(self, mode: &str) -> Job {
        self.opt("--tail", mode)
    }

    /// More arguments, as they are (flags, options and their values).
    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Job {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_string()));
        self
    }

    /// The command line after `meshfeed`, for callers that start it their own way.
    pub fn argv(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }

    /// `mpirun -np NP meshfeed run ...` under real OpenMPI.
    pub fn mpirun(&self, np: usize) -> Run {
        mpirun(np, &self.argv())
    }

    /// `meshfeed launch -n NP -- meshfeed run ... --transport ucx`.
    pub fn launch(&self, np: usize) -> Run {
        Transport::Ucx.run(np, &self.argv())
    }

    /// `meshfeed run ...` in one process, without a launcher (an MPI singleton).
    pub fn singleton(&self) -> Run {
        meshfeed(&self.argv())
    }

    /// `mpirun -np NP meshfeed run ...` inside the memory cgroup `cg`.
    pub fn mpirun_in(&self, cg: &MemoryCgroup, np: usize) -> Run {
        cg.mpirun(np, &self.argv())
    }

    /// On `np` ranks over `t` (as [`Transport::run`]).
    pub fn over(&self, t: Transport, np: usize) -> Run {
        t.run(np, &self.argv())
    }
}

/// mpirun flags of every multi-rank test: as root, more ranks than cores, ranks that
/// yield instead of busy-polling (busy-polling oversubscribed ranks starve each other).
pub const MPIRUN_FLAGS: [&str; 5] = ["--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"];

/// `mpirun -np NP meshfeed ARGS` under real OpenMPI (as root, oversubscribed).
pub fn mpirun(np: usize, args: &[&str]) -> Run {
    let mut cmd = Command::new("mpirun");
    cmd.args(MPIRUN_FLAGS).args(["-np", &np.to_string(), bin()]);
    cmd.args(args);
    cmd.env("HDF5_USE_FILE_LOCKING", "FALSE");
    wait_bounded(cmd, &format!("mpirun -np {np} meshfeed {}", args.join(" ")))
}

/// How the ranks of a multi-rank test talk. Every behaviour test runs once per transport
/// (see [`over_transports`]): MPI under real `mpirun`, UCX under `meshfeed launch` (the TCP
/// rendezvous), with the same arguments and the same expectations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Mpi,
    Ucx,
}

impl Transport {
    /// `meshfeed ARGS` (a `run` command) on `np` ranks over this transport.
    pub fn run(self, np: usize, args: &[&str]) -> Run {
        match self {
            Transport::Mpi => mpirun(np, args),
            Transport::Ucx => {
                assert_eq!(args.first(), Some(&"run"), "only `run` takes --transport");
                let mut with = args.to_vec();
                with.extend(["--transport", "ucx"]);
                launch(np, &with)
            }
        }
    }
}

/// Defines each test once per transport, as `name::mpi` and `name::ucx`; the body gets
/// the [`Transport`] as its argument.
#[allow(unused_macros)]
macro_rules! over_transports {
    ($($(#[$meta:meta])* fn $name:ident($t:ident: Transport) $body:block)*) => {
        $(
            $(#[$meta])*
            mod $name {
                #[allow(unused_imports)]
                use super::*;

                fn body($t: Transport) $body

                #[test]
                fn mpi() {
                    body(Transport::Mpi)
                }

                #[test]
                fn ucx() {
                    body(Transport::Ucx)
                }
            }
        )*
    };
}
#[allow(unused_imports)]
pub(crate) use over_transports;

/// Asserts success, showing the output otherwise.
pub fn ok(run: &Run) {
    assert_eq!(run.code, 0, "exit code {}\nstdout:\n{}\nstderr:\n{}", run.code, run.stdout, run.stderr);
}

/// The Python interpreter with numpy, h5py and pyarrow (the venv made by the setup
/// script, or $MESHFEED_PYTHON). Missing Python is a test failure, not a skip.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("MESHFEED_PYTHON") {
        return p.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        venv.exists(),
        "no Python with numpy/h5py/pyarrow: run launch/setup.sh (creates .venv) or set MESHFEED_PYTHON"
    );
    venv
}

/// Fixtures written by numpy, h5py and pyarrow (tests/fixtures/make_fixtures.py), made
/// once per test binary.
pub fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("meshfeed-fixtures-{}", std::process::id()));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/make_fixtures.py");
        let out = Command::new(python()).arg(&script).arg(&dir).output().expect("run make_fixtures.py");
        assert!(out.status.success(), "make_fixtures.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
        dir
    })
}

/// expected.json of a fixture dataset.
pub struct Expected {
    pub samples: u64,
    pub fields: Vec<String>,
    pub crc32: BTreeMap<String, Vec<u32>>,
}

pub fn expected(dataset: &Path) -> Expected {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(dataset.join("expected.json")).unwrap()).unwrap();
    Expected {
        samples: v["samples"].as_u64().unwrap(),
        fields: v["fields"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect(),
        crc32: v["crc32"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, a)| (k.clone(), a.as_array().unwrap().iter().map(|c| c.as_u64().unwrap() as u32).collect()))
            .collect(),
    }
}

/// One line of a dump file.
#[derive(Clone, Debug, PartialEq)]
pub struct DumpLine {
    pub epoch: u64,
    pub step: u64,
    pub ids: Vec<u64>,
    /// Field name → CRC per row, in the order written.
    pub crc32: Vec<(String, Vec<u32>)>,
}

/// Reads `rank-<r>.jsonl` for every rank `0..np`, checking the line format strictly.
pub fn read_dump(dir: &Path, np: usize) -> Vec<Vec<DumpLine>> {
    let names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names.len(), np, "one dump file per rank: {names:?}");
    (0..np)
        .map(|r| {
            let text = std::fs::read_to_string(dir.join(format!("rank-{r}.jsonl"))).unwrap();
            text.lines()
                .map(|l| {
                    let v: serde_json::Value =
                        serde_json::from_str(l).unwrap_or_else(|e| panic!("bad dump line {l}: {e}"));
                    let o = v.as_object().unwrap();
                    let keys: Vec<&str> = o.keys().map(|k| k.as_str()).collect();
                    assert_eq!(keys, ["crc32", "epoch", "ids", "step"], "dump keys");
                    // serde_json (no preserve_order) sorts object keys: check the raw order too.
                    assert!(l.starts_with("{\"epoch\":"), "{l}");
                    let ids: Vec<u64> = v["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
                    let crc32: Vec<(String, Vec<u32>)> = v["crc32"]
                        .as_object()
                        .unwrap()
                        .iter()
                        .map(|(k, a)| {
                            let c: Vec<u32> =
                                a.as_array().unwrap().iter().map(|c| c.as_u64().unwrap() as u32).collect();
                            assert_eq!(c.len(), ids.len(), "one CRC per row");
                            (k.clone(), c)
                        })
                        .collect();
                    DumpLine { epoch: v["epoch"].as_u64().unwrap(), step: v["step"].as_u64().unwrap(), ids, crc32 }
                })
                .collect()
        })
        .collect()
}

/// Global batches in order: `((epoch, step), [(id, field → crc)])`.
pub type GlobalBatches = Vec<((u64, u64), Vec<(u64, BTreeMap<String, u32>)>)>;

/// Global batches in order: for each (epoch, step), the concatenation of every rank's
/// rows in rank order, as (id, field → crc).
pub fn global_batches(dump: &[Vec<DumpLine>]) -> GlobalBatches {
    let steps = dump[0].len();
    for (r, lines) in dump.iter().enumerate() {
        assert_eq!(lines.len(), steps, "rank {r} wrote {} lines, rank 0 wrote {steps}", lines.len());
    }
    (0..steps)
        .map(|s| {
            let key = (dump[0][s].epoch, dump[0][s].step);
            let mut rows = Vec::new();
            for lines in dump {
                let l = &lines[s];
                assert_eq!((l.epoch, l.step), key, "ranks step in lockstep");
                for (i, id) in l.ids.iter().enumerate() {
                    rows.push((*id, l.crc32.iter().map(|(f, c)| (f.clone(), c[i])).collect()));
                }
            }
            (key, rows)
        })
        .collect()
}

/// The raw bytes of every rank's dump file, in rank order.
pub fn dump_bytes(dir: &Path, np: usize) -> Vec<Vec<u8>> {
    (0..np).map(|r| std::fs::read(dir.join(format!("rank-{r}.jsonl"))).unwrap()).collect()
}

/// Rank `r`'s error line in a failed run's stderr (panics, showing stderr, if missing).
pub fn error_line(run: &Run, r: usize) -> &str {
    run.stderr
        .lines()
        .find(|l| l.starts_with(&format!("meshfeed: error on rank {r}: ")))
        .unwrap_or_else(|| panic!("rank {r} printed no error line:\n{}", run.stderr))
}

/// Checks the report of a failure all `np` ranks agreed on, as a person sees it (issue
/// 42): the cause, printed once by rank 0 and naming the rank where it happened, is the
/// first line of stderr; without `-v` no other rank says anything about it. Returns the
/// line.
pub fn agreed_failure(run: &Run, np: usize) -> &str {
    let first = run.stderr.lines().next().unwrap_or_else(|| panic!("nothing on stderr; stdout:\n{}", run.stdout));
    let origin: usize = first
        .strip_prefix("meshfeed: error on rank ")
        .and_then(|s| s.split(':').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("the first line is not the cause, naming its rank:\n{}", run.stderr));
    assert!(origin < np, "rank {origin} of {np}: {first}");
    assert!(!first.contains(&format!("rank {origin}: rank {origin}:")), "the rank named twice: {first}");
    assert_eq!(
        run.stderr.matches("meshfeed: error on rank").count(),
        1,
        "the root cause is printed once:\n{}",
        run.stderr
    );
    assert!(!run.stderr.contains(" stopped: rank "), "the other ranks are quiet without -v:\n{}", run.stderr);
    first
}

/// The lines of a failed `-v` run in which ranks other than `origin` say they stopped
/// because `origin` failed, by rank (each checked to say so once).
pub fn stopped_lines(run: &Run, np: usize, origin: usize) -> Vec<usize> {
    let mut ranks: Vec<usize> = run
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("meshfeed: rank "))
        .filter_map(|l| l.split_once(&format!(" stopped: rank {origin} failed")))
        .map(|(r, _)| r.parse().unwrap())
        .collect();
    ranks.sort();
    assert!(ranks.iter().all(|r| *r < np), "{ranks:?}");
    ranks
}

/// A fresh temporary directory.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// `meshfeed launch -n NP -- ARGS` (the local launcher, UCX transport).
pub fn launch(np: usize, args: &[&str]) -> Run {
    let mut cmd = Command::new(bin());
    cmd.args(["launch", "-n", &np.to_string(), "--"]);
    cmd.args(args);
    cmd.env("HDF5_USE_FILE_LOCKING", "FALSE").env("UCX_NET_DEVICES", "lo").env_remove("MESHFEED_JOB_TOKEN");
    wait_bounded(cmd, &format!("meshfeed launch -n {np} -- {}", args.join(" ")))
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts one rank of a UCX job by hand (as a Ray actor or a pod would).
pub fn spawn_rank(
    rank: usize,
    world: usize,
    port: u16,
    token: &str,
    args: &[&str],
    extra_env: &[(&str, &str)],
) -> std::process::Child {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("MESHFEED_JOB_TOKEN", token)
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .env("UCX_NET_DEVICES", "lo")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Waits for a spawned process with the hang limit; returns its result.
pub fn finish(mut child: std::process::Child, what: &str) -> Run {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > HANG_LIMIT {
            let _ = child.kill();
            panic!("{what} hung for more than {HANG_LIMIT:?}: this is a failure (contract 7: no hangs)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: start.elapsed(),
    }
}

/// `(epoch, step)` of every `stopped by SIGTERM at epoch E step K` line, in order.
pub fn stop_points(text: &str) -> Vec<(u64, u64)> {
    text.lines()
        .filter_map(|l| l.split("meshfeed: stopped by SIGTERM at epoch ").nth(1))
        .map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            assert_eq!(words[1], "step", "{rest}");
            (words[0].parse().unwrap(), words[2].parse().unwrap())
        })
        .collect()
}

/// `(epoch, step)` of a state file (`--state`).
pub fn state_position(path: &Path) -> (u64, u64) {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    (v["epoch"].as_u64().unwrap(), v["step"].as_u64().unwrap())
}

/// A memory cgroup of this test's own (cgroup v1 `memory`, else v2 with the memory
/// controller), with a limit; removed when dropped. Commands made by
/// [`MemoryCgroup::command`] run inside it. Needs root; a machine without a memory
/// controller fails the test with the reason (a limit that is not enforced proves nothing).
pub struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    pub fn new(limit: u64) -> MemoryCgroup {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let name =
            format!("meshfeed-test-{}-{}", std::process::id(), NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (dir, v2) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(name), false)
        } else {
            let root = Path::new("/sys/fs/cgroup");
            let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            assert!(
                controllers.split_whitespace().any(|c| c == "memory"),
                "no memory cgroup controller here (neither /sys/fs/cgroup/memory nor cgroup v2 with memory): \
                 the memory-limit tests need one (and root)"
            );
            (root.join(name), true)
        };
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create {} (root needed): {e}", dir.display()));
        let cg = MemoryCgroup { dir, v2 };
        let (file, value) =
            if v2 { ("memory.max", limit.to_string()) } else { ("memory.limit_in_bytes", limit.to_string()) };
        std::fs::write(cg.dir.join(file), value).unwrap();
        if !v2 {
            // No swap may hide an overrun.
            let _ = std::fs::write(cg.dir.join("memory.memsw.limit_in_bytes"), limit.to_string());
        }
        cg
    }

    /// `program args` to run inside this cgroup.
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("sh");
        let procs = self.dir.join("cgroup.procs");
        cmd.args(["-c", &format!("echo $$ > {} && exec \"$@\"", procs.display()), "sh", program]).args(args);
        cmd
    }

    /// `mpirun -np NP meshfeed ARGS` inside this cgroup.
    pub fn mpirun(&self, np: usize, args: &[&str]) -> Run {
        let mut all: Vec<&str> = MPIRUN_FLAGS.to_vec();
        let np = np.to_string();
        all.extend(["-np", &np, bin()]);
        all.extend(args);
        let mut cmd = self.command("mpirun", &all);
        cmd.env("HDF5_USE_FILE_LOCKING", "FALSE");
        wait_bounded(cmd, &format!("mpirun -np {np} meshfeed {} (in {})", args.join(" "), self.dir.display()))
    }

    /// Processes the kernel killed for running out of this cgroup's memory.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap();
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")).map_or(0, |n| n.trim().parse().unwrap())
    }

    /// The most memory the cgroup held (page cache included).
    pub fn peak(&self) -> u64 {
        let file = if self.v2 { "memory.peak" } else { "memory.max_usage_in_bytes" };
        std::fs::read_to_string(self.dir.join(file)).unwrap().trim().parse().unwrap()
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // The cgroup can be removed once its processes are gone (they may take a moment).
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The environment variables by which meshfeed keeps an MPI singleton off the network
/// (`src/runtime/mod.rs`, `SINGLETON_MCA`): a test that starts a singleton removes them,
/// so that a value in the tests' own environment does not decide what it checks.
pub const SINGLETON_MCA_VARS: [&str; 3] = ["OMPI_MCA_btl", "OMPI_MCA_pml", "OMPI_MCA_ess_singleton_isolated"];

/// A process `pid` and all its descendants (an MPI singleton's `orted` is its child).
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut tree = vec![pid];
    let mut at = 0;
    while at < tree.len() {
        let p = tree[at];
        for task in std::fs::read_dir(format!("/proc/{p}/task")).into_iter().flatten().flatten() {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            tree.extend(children.split_whitespace().map(|c| c.parse::<u32>().unwrap()));
        }
        at += 1;
    }
    tree
}

/// A socket that accepts connections or datagrams from the network: a TCP socket in state
/// LISTEN, or a UDP socket bound to a port and connected to no peer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listener {
    pub protocol: &'static str,
    pub address: std::net::SocketAddr,
    /// The process holding it, and its command name.
    pub pid: u32,
    pub command: String,
}

/// The listening sockets of process `pid` and its descendants, from `/proc`: the socket
/// inodes among each process's open files, looked up in its network namespace's
/// `net/tcp`, `tcp6`, `udp` and `udp6` (what `ss -ltunp` shows). A process that has ended
/// meanwhile holds none.
pub fn listeners(pid: u32) -> Vec<Listener> {
    let mut found = Vec::new();
    for p in process_tree(pid) {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{p}/fd")) else { continue };
        let inodes: std::collections::BTreeSet<u64> = fds
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
            .collect();
        let command = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default().trim().to_string();
        for (protocol, table) in [("tcp", "tcp"), ("tcp", "tcp6"), ("udp", "udp"), ("udp", "udp6")] {
            let text = std::fs::read_to_string(format!("/proc/{p}/net/{table}")).unwrap_or_default();
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                let (local, remote, state, inode) = (f[1], f[2], f[3], f[9].parse::<u64>().unwrap());
                let listening = match protocol {
                    "tcp" => state == "0A",
                    _ => proc_net_address(remote).port() == 0 && proc_net_address(local).port() != 0,
                };
                if listening && inodes.contains(&inode) {
                    let address = proc_net_address(local);
                    found.push(Listener { protocol, address, pid: p, command: command.clone() });
                }
            }
        }
    }
    found.sort();
    found
}

/// An address of `/proc/net/tcp{,6}`: the IP as 32-bit words in host byte order (one for
/// IPv4, four for IPv6), in hex, then `:` and the port in hex.
fn proc_net_address(text: &str) -> std::net::SocketAddr {
    let (ip, port) = text.split_once(':').expect("ADDRESS:PORT");
    let port = u16::from_str_radix(port, 16).unwrap();
    let bytes: Vec<u8> =
        (0..ip.len() / 8).flat_map(|w| u32::from_str_radix(&ip[8 * w..8 * w + 8], 16).unwrap().to_ne_bytes()).collect();
    let ip = match bytes.len() {
        4 => std::net::IpAddr::from(<[u8; 4]>::try_from(bytes).unwrap()),
        _ => std::net::IpAddr::from(<[u8; 16]>::try_from(bytes).unwrap()),
    };
    std::net::SocketAddr::new(ip, port)
}

/// `meshfeed ARGS` in one process, as user `nobody` when the tests run as root: root
/// passes every permission check, so a path it must be denied is tried by someone else.
/// What it reads must be readable by all (`chmod a+rX`, its directories included).
pub fn meshfeed_unprivileged(args: &[&str]) -> Run {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(bin());
    cmd.args(args);
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        // (std drops root's supplementary groups along with its uid.)
        cmd.uid(65534).gid(65534);
    }
    wait_bounded(cmd, &format!("meshfeed {} (unprivileged)", args.join(" ")))
}

/// A directory no one but root may enter (mode 000), under `parent`, holding `files`
/// copied in by name; `parent` is opened to all. Returns the directory.
pub fn locked_dir(parent: &Path, files: &[(&str, &Path)]) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = parent.join("locked");
    std::fs::create_dir(&dir).unwrap();
    for (name, from) in files {
        std::fs::copy(from, dir.join(name)).unwrap();
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o000)).unwrap();
    dir
}

/// Opens a [`locked_dir`] again (for its owner), so that its temporary parent can be
/// removed by a user other than root.
pub fn unlock(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
}
