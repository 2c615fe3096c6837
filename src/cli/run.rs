//! `meshfeed run`: the distributed loading job, launched with `mpirun -np P`.
//!
//! A thin client of [`crate::loader::Loader`]: it consumes every batch (optionally
//! dumping and verifying it), shows a progress bar on rank 0, and prints a per-epoch
//! summary reduced over all ranks (text, or JSON lines with `--json`).

use std::path::PathBuf;
use std::time::Instant;

use ::mpi::traits::*;
use indicatif::{ProgressBar, ProgressStyle};

use super::dump::DumpWriter;
use super::verify::{Report, Verifier};
use crate::dataset::{gen, DatasetOptions};
use crate::error::{Error, Result};
use crate::loader::{layout, ExchangeMode, Layout, Loader, LoaderOptions, Metrics, Phase, TailPolicy};
use crate::plan::HomeRanges;
use crate::transport::{agree, MpiTransport, ReduceOp, Transport};
use crate::types::Epoch;

/// What to load and how: shared by `run` and `bench`.
#[derive(clap::Args, Debug)]
pub struct JobArgs {
    /// TOML job file: dataset, loader options, mesh, specs, stages. Flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Dataset files or directories (all supported files in a directory, in name order).
    #[arg(long, num_args = 1.., value_name = "PATH")]
    pub data: Vec<PathBuf>,
    /// HDF5 group that holds the datasets (default: the file root).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// Global batch size B (must be divisible by the batch dimension's split).
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Number of epochs [default: 1].
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Seed of the shuffle [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Budget for bytes in flight per rank per exchange window (K/M/G suffixes) [default: 64M].
    #[arg(long, value_parser = super::parse_bytes)]
    pub window_bytes: Option<u64>,
    /// Device mesh, e.g. dp=2,tp=2,pp=2 (product = number of ranks) [default: dp=<ranks>].
    #[arg(long)]
    pub mesh: Option<String>,
    /// Mesh axes from slowest to fastest varying in the rank numbering [default: as written].
    #[arg(long, value_delimiter = ',')]
    pub mesh_order: Vec<String>,
    /// The pipeline axis [default: pp].
    #[arg(long)]
    pub pipeline_axis: Option<String>,
    /// Sharding of a field, per dimension of [batch, *shape]: mesh axis, axes joined by +, or -.
    #[arg(long = "shard", value_name = "FIELD=SPEC")]
    pub shard: Vec<String>,
    /// Pipeline stages that receive a field.
    #[arg(long = "stages", value_name = "FIELD=first|last|all")]
    pub stages: Vec<String>,
    /// Exchange algorithm: fused, two-phase, or auto (cost model) [default: auto].
    #[arg(long)]
    pub exchange: Option<String>,
    /// Last incomplete batch of an epoch: drop, pad (with the epoch's first samples) or
    /// partial (a short batch) [default: drop].
    #[arg(long, value_parser = ["drop", "pad", "partial"])]
    pub tail: Option<String>,
    /// Keep each rank's home range in memory when it fits in this many bytes (K/M/G), so
    /// that epochs after the first read nothing from disk [default: 0, off].
    #[arg(long, value_parser = super::parse_bytes)]
    pub cache_bytes: Option<u64>,
    /// Transport: mpi (launch with mpirun/srun) or ucx (launch with `meshfeed launch`, Ray or
    /// Kubernetes: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, MESHFEED_JOB_TOKEN).
    #[arg(long, default_value = "mpi", value_parser = ["mpi", "ucx"])]
    pub transport: String,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Check collectively that every sample arrived exactly once (per receiving rank), in
    /// order, with the right contents (contents: for datasets written by `meshfeed gen`).
    #[arg(long)]
    pub verify: bool,
    /// Write one rank-<r>.jsonl per rank: ids and CRC-32 of every delivered row.
    #[arg(long, value_name = "DIR")]
    pub dump: Option<PathBuf>,
    /// Print the per-epoch summary as JSON lines on stdout.
    #[arg(long)]
    pub json: bool,
    /// Resume a stream: `EPOCH:STEP`, or a state file written by `--state`. The stream
    /// continues exactly, also on another number of ranks or mesh.
    #[arg(long, value_name = "EPOCH:STEP|FILE")]
    pub resume_from: Option<String>,
    /// Write the loader state here (JSON) when stopped by SIGTERM/SIGINT or at the end.
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// Sleep this long after each batch, like a training step (for tests of failures
    /// mid-epoch and of overlap).
    #[arg(long, hide = true, default_value_t = 0)]
    pub throttle_ms: u64,
    /// Cap on bytes per MPI_Alltoallv round (larger exchanges are chunked); for testing.
    #[arg(long, hide = true, value_parser = super::parse_bytes)]
    pub max_round_bytes: Option<u64>,
}

/// The `--config` file. Every key is optional; flags override keys.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct JobFile {
    data: Vec<PathBuf>,
    group: Option<String>,
    batch_size: Option<usize>,
    epochs: Option<u64>,
    seed: Option<u64>,
    window_bytes: Option<toml::Value>,
    tail: Option<String>,
    cache_bytes: Option<u64>,
    #[serde(flatten)]
    layout: Layout,
}

/// A validated job: what to load and how.
#[derive(Debug)]
pub struct Job {
    pub data: Vec<PathBuf>,
    pub dataset: DatasetOptions,
    pub options: LoaderOptions,
    pub epochs: u64,
}

impl JobArgs {
    /// Merges the config file (if any) and the flags into a job; flags win.
    pub fn job(&self) -> Result<Job> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
                // Relative dataset paths are relative to the job file.
                let mut f: JobFile = toml::from_str(&text)
                    .map_err(|e| Error::file(path, format!("invalid job file: {}", e.message())))?;
                let base = path.parent().unwrap_or(std::path::Path::new("."));
                f.data = f.data.into_iter().map(|p| if p.is_relative() { base.join(p) } else { p }).collect();
                f
            }
            None => JobFile::default(),
        };
        let window_bytes = match (&self.window_bytes, &file.window_bytes) {
            (Some(b), _) => *b,
            (None, Some(toml::Value::Integer(i))) => {
                u64::try_from(*i).map_err(|_| Error::Config(format!("window_bytes {i} must be positive")))?
            }
            (None, Some(toml::Value::String(s))) => super::parse_bytes(s).map_err(Error::Config)?,
            (None, Some(v)) => {
                return Err(Error::Config(format!("window_bytes must be a number or a size string, not {v}")))
            }
            (None, None) => 64 << 20,
        };
        let mut layout = file.layout;
        if let Some(m) = &self.mesh {
            layout.mesh = Some(m.clone());
        }
        if !self.mesh_order.is_empty() {
            layout.mesh_order = self.mesh_order.clone();
        }
        if let Some(p) = &self.pipeline_axis {
            layout.pipeline_axis = Some(p.clone());
        }
        for s in &self.shard {
            let (k, v) = layout::parse_pair("--shard", s)?;
            layout.shard.insert(k, v);
        }
        for s in &self.stages {
            let (k, v) = layout::parse_pair("--stages", s)?;
            layout.stages.insert(k, v);
        }
        if let Some(x) = &self.exchange {
            layout.exchange = ExchangeMode::parse(x)
                .ok_or_else(|| Error::Config(format!("--exchange '{x}': expected fused, two-phase or auto")))?;
        }
        let data = if self.data.is_empty() { file.data } else { self.data.clone() };
        if data.is_empty() {
            return Err(Error::Config("no dataset given (--data PATH... or data = [...] in --config)".into()));
        }
        let batch_size = self
            .batch_size
            .or(file.batch_size)
            .ok_or_else(|| Error::Config("no batch size given (--batch-size or batch_size in --config)".into()))?;
        Ok(Job {
            data,
            dataset: DatasetOptions { hdf5_group: self.group.clone().or(file.group) },
            options: LoaderOptions {
                batch_size,
                seed: self.seed.or(file.seed).unwrap_or(0),
                window_bytes,
                layout,
                cache_bytes: self.cache_bytes.or(file.cache_bytes).unwrap_or(0),
                tail: match self.tail.as_ref().or(file.tail.as_ref()) {
                    None => TailPolicy::Drop,
                    Some(t) => TailPolicy::parse(t)
                        .ok_or_else(|| Error::Config(format!("tail '{t}': expected drop, pad or partial")))?,
                },
            },
            epochs: self.epochs.or(file.epochs).unwrap_or(1),
        })
    }
}

/// Reports a panic (with a backtrace when `RUST_BACKTRACE` is set) and then calls `stop`,
/// so that a panic on one rank never leaves the others waiting in a collective. Panics of
/// the Arrow decoder on corrupt input are caught and reported as a corrupt file: they pass.
fn on_panic(stop: fn() -> !) {
    std::panic::set_hook(Box::new(move |info| {
        if crate::dataset::arrow::decoding_untrusted_input() {
            return;
        }
        eprintln!("meshfeed: internal error (panic): {info}\n{}", std::backtrace::Backtrace::capture());
        stop();
    }));
}

/// Initialises MPI, runs `job` on the world, prints any error once per rank, finalises
/// MPI; returns the exit code.
pub fn with_mpi(max_round_bytes: Option<u64>, job: impl FnOnce(MpiTransport) -> Result<i32>) -> i32 {
    let Some(universe) = ::mpi::initialize() else {
        eprintln!("meshfeed: error: MPI was already initialised");
        return 1;
    };
    let world = universe.world();
    let rank = world.rank() as usize;
    // A panic on one rank must not leave the others waiting in a collective.
    on_panic(|| ::mpi::topology::SimpleCommunicator::world().abort(101));
    let mut transport = MpiTransport::new(world);
    if let Some(cap) = max_round_bytes {
        transport = transport.with_max_round_bytes(cap as usize);
    }
    let code = match transport.check_launcher().and_then(|()| job(transport)) {
        Ok(code) => code,
        Err(e) => {
            super::print_error(Some(rank), &e);
            1
        }
    };
    drop(universe); // MPI_Finalize
    code
}

/// Connects the UCX transport through the TCP rendezvous described by the environment,
/// runs `job`, prints any error once; returns the exit code.
#[cfg(feature = "ucx")]
pub fn with_ucx(job: impl FnOnce(crate::transport::ucx::UcxTransport) -> Result<i32>) -> i32 {
    use crate::transport::rendezvous::{self, RendezvousConfig};
    use crate::transport::ucx::{UcxConfig, UcxTransport};
    // A panic leaves the other ranks to notice the lost peer (peer timeout).
    on_panic(|| std::process::exit(101));
    let cfg = match RendezvousConfig::from_env() {
        Ok(c) => c,
        Err(e) => {
            super::print_error(None, &e);
            return 1;
        }
    };
    // The edge that reads the transport's settings from the environment.
    let result = UcxConfig::from_env()
        .and_then(|config| UcxTransport::connect(cfg.rank, cfg.world, &config, |addr| rendezvous::exchange(&cfg, addr)))
        .and_then(job);
    match result {
        Ok(code) => code,
        Err(e) => {
            super::print_error(Some(cfg.rank), &e);
            1
        }
    }
}

/// Without the `ucx` feature, selecting UCX is a clear error.
#[cfg(not(feature = "ucx"))]
pub fn with_ucx(_job: impl FnOnce(crate::transport::LocalTransport) -> Result<i32>) -> i32 {
    super::print_error(
        None,
        &Error::Config(
            "meshfeed was built without the `ucx` feature; rebuild with default features (needs libucx-dev)".into(),
        ),
    );
    1
}

/// `meshfeed run`.
pub fn main(args: RunArgs) -> i32 {
    let cap = args.max_round_bytes;
    match args.job.transport.as_str() {
        "ucx" => with_ucx(|t| run(args, t)),
        _ => with_mpi(cap, |t| run(args, t)),
    }
}

/// Per-epoch summary, reduced over ranks.
#[derive(Debug, serde::Serialize)]
struct EpochSummary {
    epoch: u64,
    ranks: usize,
    steps: u64,
    samples: u64,
    seconds: f64,
    samples_per_s: f64,
    gb_per_s: f64,
    /// Max over ranks of the time in each phase.
    phase_s: std::collections::BTreeMap<&'static str, f64>,
    bytes_read: u64,
    bytes_exchanged: u64,
    bytes_delivered: u64,
    windows: u64,
    /// Peak resident set size of the largest rank so far (getrusage).
    max_rss_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    verified: Option<bool>,
}

/// Exit code of a run stopped by SIGTERM/SIGINT at a step boundary (EX_TEMPFAIL: resume it).
pub const EXIT_STOPPED: i32 = 75;

/// Set by the SIGTERM/SIGINT handler; read at every step.
static STOP: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_stop_signal(signal: libc::c_int) {
    STOP.store(signal, std::sync::atomic::Ordering::SeqCst);
}

/// Lets SIGTERM (Slurm preemption) and SIGINT end the run at the next step boundary.
fn install_stop_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t) };
    }
}

/// Parses `--resume-from`: `EPOCH:STEP`, or the path of a state file.
fn parse_resume(s: &str) -> Result<std::result::Result<(u64, u64), crate::loader::LoaderState>> {
    if let Some((e, k)) = s.split_once(':') {
        if let (Ok(e), Ok(k)) = (e.parse(), k.parse()) {
            return Ok(Ok((e, k)));
        }
    }
    let text = std::fs::read_to_string(s)
        .map_err(|e| Error::Config(format!("--resume-from '{s}': expected EPOCH:STEP or a state file ({e})")))?;
    Ok(Err(crate::loader::LoaderState::from_json(&text).map_err(|e| Error::file(s, e.to_string()))?))
}

fn run<T: Transport>(args: RunArgs, transport: T) -> Result<i32> {
    install_stop_handlers();
    let rank = transport.rank().0;
    let job = agree(&transport, args.job.job())?;
    let batch_size = job.options.batch_size;
    let seed = job.options.seed;
    let dataset = crate::loader::open_dataset(&transport, &job.data, job.dataset.clone())?;
    let mut loader = agree(&transport, Loader::new(&transport, dataset, job.options))?;
    let world = loader.transport().size();
    let n = loader.dataset().len();
    let steps = loader.steps_per_epoch();
    let home = HomeRanges::new(n, world);
    let resume = args.resume_from.as_deref().map(parse_resume).transpose().and_then(|r| match r {
        None => Ok((Epoch(0), crate::types::Step(0))),
        Some(Ok((e, k))) => loader.resume_point(&loader.state(Epoch(e), crate::types::Step(k))),
        Some(Err(state)) => loader.resume_point(&state),
    });
    let (first_epoch, mut first_step) = agree(loader.transport(), resume).map(|(e, k)| (e.0, k.0))?;
    if rank == 0 && !args.json && (first_epoch, first_step) != (0, 0) {
        println!("meshfeed: resuming at epoch {first_epoch} step {first_step}");
    }

    let mut verifier = match args.verify {
        true => Some(agree(
            loader.transport(),
            gen::find_manifest(&job.data).and_then(|m| {
                Verifier::new(loader.dataset(), loader.placement(), loader.tail_placement(), steps, seed, m)
            }),
        )?),
        false => None,
    };
    let mut dump = match &args.dump {
        Some(dir) => Some(agree(loader.transport(), DumpWriter::create(dir, rank))?),
        None => None,
    };
    if rank == 0 && !args.json {
        println!(
            "meshfeed: {} samples, {} field(s), {} ranks, mesh {}, {} exchange; batch {} → {} steps/epoch ({} dropped), {} steps per window",
            n,
            loader.dataset().fields().len(),
            world,
            loader.mesh(),
            match loader.exchange_mode() {
                ExchangeMode::TwoPhase => "two-phase",
                _ => "fused",
            },
            batch_size,
            steps,
            loader.dropped_per_epoch(),
            loader.steps_per_window()
        );
    }

    let mut all_ok = true;
    let mut stopped = None;
    for e in first_epoch..job.epochs {
        let epoch = Epoch(e);
        let first = std::mem::take(&mut first_step);
        let bar = progress_bar(rank == 0 && !args.json, steps, e);
        bar.set_position(first);
        if let Some(v) = verifier.as_mut() {
            v.begin_epoch(n, epoch);
        }
        let start = Instant::now();
        let mut delivered_bytes = 0u64;
        // A local failure while consuming (e.g. the dump disk is full) must not stop this
        // rank from taking part in the remaining windows: remember it, agree at the end.
        let mut local: Result<()> = Ok(());
        let dataset = loader.dataset().clone();
        let mut batches = loader.epoch_from(epoch, crate::types::Step(first));
        let mut end = steps;
        while let Some(batch) = batches.next() {
            let batch = batch?;
            delivered_bytes += batch.fields().iter().map(|f| f.bytes().len() as u64).sum::<u64>();
            if let Some(v) = verifier.as_mut() {
                v.check(&batch, &dataset);
            }
            if let (Some(d), Ok(())) = (dump.as_mut(), &local) {
                local = d.write(&batch);
            }
            bar.inc(1);
            if args.throttle_ms > 0 {
                std::thread::sleep(std::time::Duration::from_millis(args.throttle_ms));
            }
            // Every rank asks at every step, so all stop at the same step boundary.
            let signal = STOP.load(std::sync::atomic::Ordering::SeqCst);
            if batches.any_rank_stops(signal != 0)? && batches.next_step().0 < steps {
                end = batches.next_step().0;
                stopped = Some(if signal == libc::SIGINT { "SIGINT" } else { "SIGTERM" });
                break;
            }
        }
        drop(batches);
        agree(loader.transport(), local)?;
        let seconds = start.elapsed().as_secs_f64();
        bar.finish_and_clear();
        let metrics = loader.take_metrics();
        let delivered_steps = end - first;
        let mut summary = summarize(
            loader.transport(),
            e,
            loader.rows_in_steps(first..end),
            delivered_steps,
            seconds,
            delivered_bytes,
            &metrics,
        )?;
        if let Some(v) = verifier.as_mut() {
            let b = batch_size as u64;
            let (report, first) = v.finish_epoch(loader.transport(), &home, first * b..end * b)?;
            summary.verified = Some(report.ok());
            all_ok &= report.ok();
            if rank == 0 && !args.json {
                print_report(e, summary.samples, n, &report, v.checks_contents(), first.as_deref());
            }
            if !report.ok() {
                if rank == 0 && args.json {
                    println!("{}", serde_json::to_string(&summary).expect("summary serialises"));
                }
                return Err(Error::Verify(format!("epoch {e}: {}", first.unwrap_or_else(|| "see report".into()))));
            }
        }
        if rank == 0 {
            if args.json {
                println!("{}", serde_json::to_string(&summary).expect("summary serialises"));
            } else {
                print_summary(&summary);
            }
        }
        if let Some(signal) = stopped {
            // Stopped at a step boundary: report where to resume, flush, exit 75.
            let state = loader.state(epoch, crate::types::Step(end));
            if let Some(d) = dump.take() {
                agree(loader.transport(), d.finish())?;
            }
            if rank == 0 {
                if let Some(path) = &args.state {
                    std::fs::write(path, state.to_json()).map_err(|e| Error::io(path, e))?;
                }
                eprintln!(
                    "meshfeed: stopped by {signal} at epoch {} step {} (earlier steps were delivered); resume with --resume-from {}:{}",
                    state.epoch, state.step, state.epoch, state.step
                );
            }
            return Ok(EXIT_STOPPED);
        }
    }
    if let Some(d) = dump.take() {
        agree(loader.transport(), d.finish())?;
    }
    if rank == 0 {
        if let Some(path) = &args.state {
            let state = loader.state(Epoch(job.epochs), crate::types::Step(0));
            std::fs::write(path, state.to_json()).map_err(|e| Error::io(path, e))?;
        }
    }
    if rank == 0 && !args.json {
        let verified = if verifier.is_some() && all_ok { ", verified" } else { "" };
        println!("meshfeed: done: {} epoch(s) on {world} ranks{verified}", job.epochs);
    }
    Ok(0)
}

fn progress_bar(visible: bool, steps: u64, epoch: u64) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps).with_style(
        ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} steps {per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(epoch.to_string());
    bar
}

fn summarize(
    t: &dyn Transport,
    epoch: u64,
    samples: u64,
    steps: u64,
    seconds: f64,
    delivered: u64,
    m: &Metrics,
) -> Result<EpochSummary> {
    // Times in nanoseconds, reduced with max; byte counts with sum.
    let mut maxes: Vec<u64> = Phase::ALL.iter().map(|&p| m.time(p).as_nanos() as u64).collect();
    maxes.push((seconds * 1e9) as u64);
    t.all_reduce_u64(&mut maxes, ReduceOp::Max)?;
    maxes.push(peak_rss_bytes());
    let mut sums = [m.bytes_read, m.bytes_sent, delivered];
    t.all_reduce_u64(&mut sums, ReduceOp::Sum)?;
    let seconds = maxes[Phase::ALL.len()] as f64 / 1e9;
    Ok(EpochSummary {
        epoch,
        ranks: t.size(),
        steps,
        samples,
        seconds,
        samples_per_s: samples as f64 / seconds.max(1e-9),
        gb_per_s: sums[2] as f64 / 1e9 / seconds.max(1e-9),
        phase_s: Phase::ALL.iter().zip(&maxes).map(|(p, &ns)| (p.name(), ns as f64 / 1e9)).collect(),
        bytes_read: sums[0],
        bytes_exchanged: sums[1],
        bytes_delivered: sums[2],
        windows: m.windows,
        max_rss_bytes: maxes[Phase::ALL.len() + 1],
        verified: None,
    })
}

/// Peak resident set size of this process.
fn peak_rss_bytes() -> u64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out-pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    usage.ru_maxrss as u64 * 1024 // Linux reports kilobytes
}

fn print_summary(s: &EpochSummary) {
    let phases: Vec<String> = Phase::ALL.iter().map(|p| format!("{} {:.3}s", p.name(), s.phase_s[p.name()])).collect();
    println!(
        "epoch {}: {} samples in {:.3} s — {:.0} samples/s, {:.3} GB/s | {} (max over {} ranks) | {} windows, {:.1} MB exchanged, peak RSS {:.0} MB",
        s.epoch,
        s.samples,
        s.seconds,
        s.samples_per_s,
        s.gb_per_s,
        phases.join(", "),
        s.ranks,
        s.windows,
        s.bytes_exchanged as f64 / 1e6,
        s.max_rss_bytes as f64 / 1e6
    );
}

fn print_report(epoch: u64, samples: u64, dataset: u64, r: &Report, contents: bool, first: Option<&str>) {
    if r.ok() {
        let what = if contents {
            format!("contents match the generator ({} values checked)", r.values_checked)
        } else {
            "contents not checked (no meshfeed-gen manifest)".to_string()
        };
        let mut copies = if r.delivered > samples {
            format!(" to each of its ranks ({} deliveries)", r.delivered)
        } else {
            String::new()
        };
        if samples > dataset {
            copies.push_str(&format!(", the last batch padded with the epoch's first {} samples", samples - dataset));
        }
        println!(
            "verify: epoch {epoch}: {samples} samples delivered exactly once{copies}, in permutation order; {what}"
        );
    } else {
        println!(
            "verify: epoch {epoch}: FAILED — {} missing, {} duplicated, {} unexpected, {} out of order, {} wrong contents; first: {}",
            r.missing,
            r.duplicated,
            r.unexpected,
            r.out_of_order,
            r.wrong_contents,
            first.unwrap_or("-")
        );
    }
}
