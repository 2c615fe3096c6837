//! `meshfeed bench`: the fused exchange against the two-phase exchange and the naive
//! single-loader baseline (rank 0 reads every batch and broadcasts it), on the same job in
//! the same run, printed as ratios; optionally over several transports, and with a
//! simulated training step to measure how well loading overlaps with it. Machines are
//! shared and noisy: compare the ratios, not the absolute times.

use std::str::FromStr;
use std::time::{Duration, Instant};

use meshfeed::config::{ExchangeMode, Job, TransportKind};
use meshfeed::loader::{open_dataset, Loader, Phase};
use meshfeed::runtime::Runtime;
use meshfeed::transport::{agree, ReduceOp, Transport};
use meshfeed::types::Epoch;
use meshfeed::{Error, Result};

use crate::job::{with_runtime, JobArgs};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Modes to compare (ratios are against the first row): fused, two-phase, naive.
    #[arg(long, value_delimiter = ',', default_value = "fused,two-phase,naive")]
    pub modes: Vec<String>,
    /// Transports to compare, each with every mode: mpi, and (under mpirun, bootstrapped
    /// through MPI) ucx-shm (UCX_TLS=posix,cma), ucx-tcp (UCX_TLS=tcp), or ucx:<UCX_TLS>.
    #[arg(long, value_delimiter = ',', default_value = "mpi")]
    pub transports: Vec<String>,
    /// Also measure the overlap of loading with a simulated training step of this many
    /// milliseconds per batch — `auto`: the measured loading time per step, so that
    /// computing and loading take about as long. Reports, per mode, the epoch time with the
    /// step over max(epoch time without it, steps × step): 1.0 is perfect overlap, 2.0 none.
    #[arg(long, value_name = "MS|auto")]
    pub compute_ms: Option<ComputeMs>,
    /// Print one JSON object per mode instead of the table.
    #[arg(long)]
    pub json: bool,
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

/// Measurements of one mode, reduced over ranks.
#[derive(Debug, serde::Serialize)]
struct ModeResult {
    transport: String,
    mode: String,
    ranks: usize,
    epochs: u64,
    steps_per_epoch: u64,
    /// Mean epoch time (max over ranks).
    epoch_s: f64,
    /// Mean time per epoch in the exchange phase (max over ranks), and the exchange
    /// throughput it gives (all bytes sent over that time).
    exchange_s: f64,
    exchange_gb_per_s: f64,
    /// Most bytes any rank sent / received per epoch (including to itself).
    max_sent_per_rank: u64,
    max_received_per_rank: u64,
    total_sent: u64,
    delivered_bytes: u64,
    /// With `--compute-ms`: the step, the median epoch times without and with it (from
    /// interleaved blocks of epochs), and the overlap ratio: with / max(without, steps ×
    /// step).
    #[serde(skip_serializing_if = "Option::is_none")]
    compute_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch_without_compute_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch_with_compute_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    overlap_ratio: Option<f64>,
}

pub fn main(args: BenchArgs) -> i32 {
    let job = args.job.job();
    with_runtime(TransportKind::Mpi, None, |rt| bench(&args, job, rt).map(|()| 0))
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

fn exchange_mode(mode: &str) -> Result<ExchangeMode> {
    match mode {
        "fused" => Ok(ExchangeMode::Fused),
        "two-phase" => Ok(ExchangeMode::TwoPhase),
        "naive" => Ok(ExchangeMode::Broadcast),
        other => Err(Error::Config(format!("--modes: unknown mode '{other}' (fused, two-phase, naive)"))),
    }
}

/// The median of some measurements.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One epoch, sleeping `compute_ms` after each batch; returns the bytes delivered.
fn run_epoch(loader: &mut Loader, e: u64, compute_ms: f64) -> Result<u64> {
    let mut bytes = 0u64;
    for b in loader.epoch(Epoch(e)) {
        bytes += b?.fields().iter().map(|f| f.bytes().len() as u64).sum::<u64>();
        if compute_ms > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(compute_ms / 1e3));
        }
    }
    Ok(bytes)
}

/// Runs epochs `epochs` with a step of `compute_ms`; returns the slowest rank's mean
/// epoch time and the bytes all ranks delivered per epoch.
fn timed_epochs(
    loader: &mut Loader,
    t: &dyn Transport,
    epochs: std::ops::Range<u64>,
    compute_ms: f64,
) -> Result<(f64, u64)> {
    t.barrier()?;
    let start = Instant::now();
    let mut delivered = 0;
    let n = epochs.end - epochs.start;
    for e in epochs {
        delivered += run_epoch(loader, e, compute_ms)?;
    }
    let mut elapsed = [start.elapsed().as_nanos() as u64];
    t.all_reduce_u64(&mut elapsed, ReduceOp::Max)?;
    let mut delivered = [delivered];
    t.all_reduce_u64(&mut delivered, ReduceOp::Sum)?;
    Ok((elapsed[0] as f64 / 1e9 / n as f64, delivered[0] / n))
}

fn bench(args: &BenchArgs, job: Result<Job>, rt: &Runtime) -> Result<()> {
    let world = rt.world();
    let job = agree(world, job)?;
    let dataset = open_dataset(world, &job.data, job.dataset.clone())?;
    let epochs = job.epochs.max(1);
    let mut results: Vec<ModeResult> = Vec::new();
    for transport_name in &args.transports {
        let boxed = agree(world, make_transport(transport_name, world))?;
        let transport: &dyn Transport = boxed.as_deref().unwrap_or(world);
        for mode in &args.modes {
            let mut options = job.loader.clone();
            options.layout.exchange = agree(transport, exchange_mode(mode))?;
            let mut loader = Loader::new(transport, dataset.clone(), options)?;
            let steps = loader.steps_per_epoch();
            // One untimed epoch warms the page cache and the connections.
            run_epoch(&mut loader, 0, 0.0)?;
            loader.take_metrics();
            let (epoch_s, delivered) = timed_epochs(&mut loader, transport, 1..epochs + 1, 0.0)?;
            let m = loader.take_metrics().reduce(transport)?;
            let exchange = m.time(Phase::Exchange).as_secs_f64();
            let mut sent = [m.max_sent, m.max_received];
            transport.all_reduce_u64(&mut sent, ReduceOp::Max)?;
            let mut row = ModeResult {
                transport: transport_name.clone(),
                mode: mode.clone(),
                ranks: transport.size(),
                epochs,
                steps_per_epoch: steps,
                epoch_s,
                exchange_s: exchange / epochs as f64,
                exchange_gb_per_s: m.bytes_sent as f64 / 1e9 / exchange.max(1e-9),
                max_sent_per_rank: m.max_sent / epochs,
                max_received_per_rank: m.max_received / epochs,
                total_sent: m.bytes_sent / epochs,
                delivered_bytes: delivered,
                compute_ms: None,
                epoch_without_compute_s: None,
                epoch_with_compute_s: None,
                overlap_ratio: None,
            };
            if let Some(c) = args.compute_ms {
                let ms = match c {
                    ComputeMs::Auto => epoch_s * 1e3 / steps.max(1) as f64,
                    ComputeMs::Fixed(ms) => ms,
                };
                // Blocks of `epochs` epochs without and with the step, interleaved so that
                // the machine's drift affects both alike; medians of each. Every block
                // starts from a cold pipeline (one epoch number is skipped, which restarts
                // the producer), so that neither inherits windows prefetched during the
                // other.
                let (mut without, mut with) = (Vec::new(), Vec::new());
                let mut e = epochs + 2;
                for _ in 0..3 {
                    without.push(timed_epochs(&mut loader, transport, e..e + epochs, 0.0)?.0);
                    e += epochs + 1;
                    with.push(timed_epochs(&mut loader, transport, e..e + epochs, ms)?.0);
                    e += epochs + 1;
                }
                loader.take_metrics();
                let (without, with) = (median(&mut without), median(&mut with));
                row.compute_ms = Some(ms);
                row.epoch_without_compute_s = Some(without);
                row.epoch_with_compute_s = Some(with);
                row.overlap_ratio = Some(with / without.max(steps as f64 * ms / 1e3).max(1e-9));
            }
            results.push(row);
        }
    }
    if rt.rank() != 0 {
        return Ok(());
    }
    if args.json {
        for r in &results {
            out!("{}", serde_json::to_string(r).expect("a result serialises"));
        }
    } else {
        print_table(&job, dataset.len(), &results);
    }
    let delivered: Vec<u64> = results.iter().map(|r| r.delivered_bytes).collect();
    if delivered.iter().any(|&d| d != delivered[0]) {
        return Err(Error::Verify(format!("modes delivered different byte counts: {delivered:?}")));
    }
    Ok(())
}

fn print_table(job: &Job, samples: u64, results: &[ModeResult]) {
    let base = &results[0];
    out!(
        "bench: {} ranks, mesh {}, batch {}, prefetch {}, {} timed epoch(s) per row, {} samples; ratios against {} {}",
        base.ranks,
        job.loader.layout.mesh.as_ref().map_or_else(|| "data parallel".to_string(), |m| m.to_string()),
        job.loader.batch_size,
        job.loader.prefetch,
        base.epochs,
        samples,
        base.transport,
        base.mode
    );
    out!(
        "{:<10} {:<10} {:>10} {:>11} {:>10} {:>16} {:>16} {:>14} {:>8} {:>8} {:>10}",
        "transport",
        "mode",
        "epoch s",
        "exchange s",
        "xchg GB/s",
        "max sent/rank",
        "max recv/rank",
        "total sent",
        "time ×",
        "xchg ×",
        "traffic ×"
    );
    for r in results {
        out!(
            "{:<10} {:<10} {:>10.4} {:>11.4} {:>10.2} {:>13.1} MB {:>13.1} MB {:>11.1} MB {:>8.2} {:>8.2} {:>10.2}",
            r.transport,
            r.mode,
            r.epoch_s,
            r.exchange_s,
            r.exchange_gb_per_s,
            r.max_sent_per_rank as f64 / 1e6,
            r.max_received_per_rank as f64 / 1e6,
            r.total_sent as f64 / 1e6,
            r.epoch_s / base.epoch_s.max(1e-12),
            r.exchange_s / base.exchange_s.max(1e-12),
            r.max_sent_per_rank.max(r.max_received_per_rank) as f64
                / base.max_sent_per_rank.max(base.max_received_per_rank).max(1) as f64
        );
    }
    for r in results {
        let (Some(ms), Some(without), Some(with), Some(ratio)) =
            (r.compute_ms, r.epoch_without_compute_s, r.epoch_with_compute_s, r.overlap_ratio)
        else {
            continue;
        };
        let compute = r.steps_per_epoch as f64 * ms / 1e3;
        out!(
            "overlap {} {}: step {ms:.3} ms × {} steps = {compute:.3} s compute, {without:.3} s loading alone → {with:.3} s per epoch with both = {ratio:.2} × max(loading, compute) (medians of interleaved runs)",
            r.transport, r.mode, r.steps_per_epoch
        );
    }
    out!("all modes delivered {:.1} MB per epoch in total", results[0].delivered_bytes as f64 / 1e6);
}
