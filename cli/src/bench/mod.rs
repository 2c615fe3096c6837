//! `meshfeed bench`: measures the loader against the machine's limits and against the
//! loaders users would otherwise pick, on the same job in the same run (issue 10).
//!
//! Under `mpirun -np P`, each mode in `--modes` is one measurement ([`modes::Mode`]):
//!
//! * meshfeed itself ([`loader`]): `meshfeed` (the job's exchange, `auto` by default),
//!   `fused`, `two-phase`, and `naive` — the single-loader baseline, rank 0 reads each
//!   batch and broadcasts it;
//! * `random-access` ([`random_access`]): every rank reads its own shuffled samples one
//!   by one, the `DistributedSampler` pattern, in Rust;
//! * the limits ([`limits`]): `read-limit` (sequential reads of each rank's home range),
//!   `exchange-limit` (a bare all-to-all-v of exactly the bytes one loader epoch
//!   exchanged, in the same windows) and `memcpy-limit` (copying the bytes each rank
//!   receives, in window-sized chunks).
//!
//! Rank 0 prints a table of ratios, or with `--json` one JSON object per mode
//! ([`record::Record`]); `--out FILE` appends the same lines to a file, which
//! `meshfeed bench report` ([`suite`]; [`meshfeed_analysis::bench`]) turns into the tables
//! and plots of the benchmark suite (`bench/run.sh`). Machines are shared and noisy:
//! compare ratios.

mod limits;
mod loader;
mod modes;
mod random_access;
mod suite;
mod table;

pub(crate) use meshfeed_analysis::bench::record;
pub(crate) use meshfeed_analysis::median;

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Instant;

use meshfeed::config::{Balance, Job, JobFile, TransportKind};
use meshfeed::loader::open_dataset;
use meshfeed::runtime::Runtime;
use meshfeed::transport::{agree, ReduceOp, Transport};
use meshfeed::{Error, Result};

use crate::job::{with_runtime, JobArgs};
use modes::Mode;
use record::{Record, Setting};

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    #[command(flatten)]
    pub job: JobArgs,
    /// Measurements to make, in order (ratios in the table are against the first): meshfeed
    /// (the job's exchange), fused, two-phase, naive (rank 0 reads and broadcasts each
    /// batch), random-access (each rank reads its shuffled samples one by one, like
    /// DistributedSampler), read-limit, exchange-limit, memcpy-limit; `all` for every one.
    #[arg(long, value_delimiter = ',', default_value = "fused,two-phase,naive")]
    pub modes: Vec<String>,
    /// Transports to compare, each with every mode: mpi, and (under mpirun, bootstrapped
    /// through MPI) ucx-shm (UCX_TLS=posix,cma), ucx-tcp (UCX_TLS=tcp), or ucx:<UCX_TLS>.
    #[arg(long, value_delimiter = ',', default_value = "mpi")]
    pub transports: Vec<String>,
    /// Also measure the overlap of loading with a simulated training step of this many
    /// milliseconds per batch — `auto`: the measured loading time per step, so that
    /// computing and loading take about as long. Reports, per loader mode, the epoch time
    /// with the step over max(epoch time without it, steps × step): 1.0 is perfect
    /// overlap, 2.0 none.
    #[arg(long, value_name = "MS|auto")]
    pub compute_ms: Option<ComputeMs>,
    /// Print one JSON object per mode instead of the table (and, should the job fail, one
    /// error object a rank: `"kind":"error"`).
    #[arg(long)]
    pub json: bool,
    /// On a failure, every rank says why it stopped (without it, the cause is printed
    /// once, by rank 0).
    #[arg(short, long)]
    pub verbose: bool,
    /// Also append the JSON objects to this file (JSON lines; for `meshfeed bench report`).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// A label stored with every result (e.g. the dataset's name in a suite).
    #[arg(long, default_value = "")]
    pub tag: String,
}

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Turn JSON lines written by `meshfeed bench --out` (and bench/torch_loader.py) into
    /// the table of ratios and PNG/SVG plots.
    Report(suite::ReportArgs),
}

/// `--compute-ms`: a fixed step, or one as long as loading a step.
#[derive(Clone, Copy, Debug)]
pub enum ComputeMs {
    Auto,
    Fixed(f64),
}

impl FromStr for ComputeMs {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<ComputeMs, String> {
        match s {
            "auto" => Ok(ComputeMs::Auto),
            _ => s
                .parse::<f64>()
                .ok()
                .filter(|ms| ms.is_finite() && *ms >= 0.0)
                .map(ComputeMs::Fixed)
                .ok_or_else(|| format!("'{s}': expected a number of milliseconds or auto")),
        }
    }
}

pub fn main(args: BenchArgs) -> i32 {
    if let Some(BenchCommand::Report(r)) = args.command {
        return crate::output::exit_code(None, suite::run(r).map(|()| 0));
    }
    // Ranges stay equal unless asked otherwise: every mode and limit then measures the
    // same epoch, which the exchange and memcpy limits replay (balancing is measured by
    // bench/balance.py, with a slowed rank).
    let defaults = JobFile { balance: Some(Balance::Off), ..JobFile::default() };
    let job = args.job.job_over(defaults).and_then(|job| match (&job.telemetry, job.heartbeat) {
        (None, None) => Ok(job),
        _ => Err(Error::Config(
            "bench writes its own report: --telemetry and --heartbeat are for `meshfeed run` and training jobs".into(),
        )),
    });
    let style = crate::output::ErrorStyle { verbose: args.verbose, json: args.json };
    with_runtime(TransportKind::Mpi, None, style, |rt| bench(&args, job, rt).map(|()| 0))
}

/// The transport named on the command line (`None`: MPI's world); UCX ones are
/// bootstrapped through MPI.
fn make_transport(name: &str, world: &dyn Transport) -> Result<Option<Box<dyn Transport>>> {
    let tls = match name {
        "mpi" => return Ok(None),
        "ucx-shm" => "posix,cma",
        "ucx-tcp" => "tcp",
        other => other.strip_prefix("ucx:").ok_or_else(|| {
            Error::Config(format!("--transports: unknown transport '{other}' (mpi, ucx-shm, ucx-tcp, ucx:<UCX_TLS>)"))
        })?,
    };
    ucx_over(tls, world).map(Some)
}

#[cfg(feature = "ucx")]
fn ucx_over(tls: &str, world: &dyn Transport) -> Result<Box<dyn Transport>> {
    use meshfeed::transport::ucx::{UcxConfig, UcxTransport};
    let config = UcxConfig { tls: Some(tls.into()), ..Default::default() };
    let t = UcxTransport::connect(world.rank().0, world.size(), &config, |addr| world.all_gather(&addr))?;
    Ok(Box::new(t))
}

#[cfg(not(feature = "ucx"))]
fn ucx_over(_tls: &str, _world: &dyn Transport) -> Result<Box<dyn Transport>> {
    Err(Error::feature_disabled("ucx", "--transports ucx-*"))
}

/// Times `f` on every rank, from a common start (barrier), as the slowest rank's seconds
/// (collective; an error on any rank is every rank's).
pub(crate) fn timed_max<R>(t: &dyn Transport, f: impl FnOnce() -> Result<R>) -> Result<(f64, R)> {
    t.barrier()?;
    let start = Instant::now();
    let r = f();
    let mut elapsed = [start.elapsed().as_nanos() as u64];
    // A rank that failed tells the others, which would otherwise wait in the reduction.
    let r = agree(t, r)?;
    t.all_reduce_u64(&mut elapsed, ReduceOp::Max)?;
    Ok((elapsed[0] as f64 / 1e9, r))
}

fn bench(args: &BenchArgs, job: Result<Job>, rt: &Runtime) -> Result<()> {
    let world = rt.world();
    let job = agree(world, job)?;
    let modes = agree(world, Mode::parse_list(&args.modes))?;
    let dataset = open_dataset(world, &job.data, job.dataset.clone())?;
    let machine = if rt.rank() == 0 { Some(record::Machine::here()) } else { None };
    let mut results: Vec<Record> = Vec::new();
    for transport_name in &args.transports {
        let boxed = agree(world, make_transport(transport_name, world))?;
        let transport: &dyn Transport = boxed.as_deref().unwrap_or(world);
        let setting = Setting::new(&job, &dataset, transport, transport_name, &args.tag);
        // The loader epoch the limits replay, made once per transport when a limit asks.
        let mut reference = None;
        for &mode in &modes {
            let started = Instant::now();
            record::reset_peak_rss();
            let mut row = match mode {
                Mode::Loader(exchange) => {
                    loader::measure(transport, &dataset, &job, &setting, mode, exchange, args.compute_ms)?
                }
                Mode::RandomAccess => random_access::measure(transport, &dataset, &job, &setting)?,
                Mode::ReadLimit => limits::read(transport, &dataset, &job, &setting)?,
                Mode::ExchangeLimit | Mode::MemcpyLimit => {
                    if reference.is_none() {
                        reference = Some(limits::Reference::record(transport, &dataset, &job, &setting)?);
                    }
                    let reference = reference.as_ref().expect("made above");
                    if mode == Mode::ExchangeLimit {
                        limits::exchange(transport, reference, &job, &setting)?
                    } else {
                        limits::memcpy(transport, reference, &job, &setting)?
                    }
                }
            };
            row.set_peak_rss(transport)?;
            row.machine = machine.clone();
            if rt.rank() == 0 && !args.json {
                crate::output::line_err(&format!(
                    "bench: {} {} done in {:.1} s",
                    transport_name,
                    mode.name(),
                    started.elapsed().as_secs_f64()
                ));
            }
            results.push(row);
        }
    }
    if rt.rank() != 0 {
        return Ok(());
    }
    if let Some(path) = &args.out {
        record::append(path, &results)?;
    }
    if args.json {
        for r in &results {
            out!("{}", serde_json::to_string(r).expect("a result serialises"));
        }
    } else {
        table::print(&job, dataset.len(), &results);
    }
    // Every loader delivers the same bytes (the limits measure other things).
    let delivered: Vec<(String, u64)> =
        results.iter().filter(|r| r.delivers_batches()).map(|r| (r.mode.clone(), r.delivered_bytes)).collect();
    if delivered.iter().any(|d| d.1 != delivered[0].1) {
        return Err(Error::Verify(format!("loaders delivered different byte counts per epoch: {delivered:?}")));
    }
    Ok(())
}
