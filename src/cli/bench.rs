//! `meshfeed bench`: the fused exchange against the two-phase exchange and the naive
//! single-loader baseline (rank 0 reads every batch and broadcasts it), on the same job in
//! the same run, printed as ratios. Machines are shared and noisy: compare the ratios, not
//! the absolute times.

use std::time::Instant;

use super::run::{with_mpi, JobArgs};
use crate::error::{Error, Result};
use crate::loader::{open_dataset, ExchangeMode, Loader, Metrics};
use crate::transport::{MpiTransport, ReduceOp, Transport};
use crate::types::Epoch;

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
    /// Print one JSON object per mode instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Measurements of one mode, reduced over ranks.
#[derive(Debug, serde::Serialize)]
struct ModeResult {
    transport: String,
    mode: String,
    ranks: usize,
    epochs: u64,
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
}

pub fn main(args: BenchArgs) -> i32 {
    with_mpi(None, |t| bench(args, t).map(|()| 0))
}

/// The transport named on the command line; UCX ones are bootstrapped through MPI.
fn make_transport<'a>(name: &str, mpi: &'a MpiTransport) -> Result<Box<dyn Transport + 'a>> {
    if name == "mpi" {
        return Ok(Box::new(mpi));
    }
    let tls = match name {
        "ucx-shm" => "posix,cma",
        "ucx-tcp" => "tcp",
        other => other.strip_prefix("ucx:").ok_or_else(|| {
            Error::Config(format!("--transports: unknown transport '{other}' (mpi, ucx-shm, ucx-tcp, ucx:<UCX_TLS>)"))
        })?,
    };
    ucx_over_mpi(tls, mpi)
}

#[cfg(feature = "ucx")]
fn ucx_over_mpi<'a>(tls: &str, mpi: &'a MpiTransport) -> Result<Box<dyn Transport + 'a>> {
    use crate::transport::ucx::{UcxConfig, UcxTransport};
    let config = UcxConfig { tls: Some(tls.into()), ..Default::default() };
    let t = UcxTransport::connect(mpi.rank().0, mpi.size(), &config, |addr| mpi.all_gather(&addr))?;
    Ok(Box::new(t))
}

#[cfg(not(feature = "ucx"))]
fn ucx_over_mpi<'a>(_tls: &str, _mpi: &'a MpiTransport) -> Result<Box<dyn Transport + 'a>> {
    Err(Error::Config("meshfeed was built without the `ucx` feature".into()))
}

fn bench(args: BenchArgs, mpi: MpiTransport) -> Result<()> {
    let job = args.job.job()?;
    let dataset = open_dataset(&mpi, &job.data, job.dataset.clone())?;
    let rank = mpi.rank().0;
    let mut results: Vec<ModeResult> = Vec::new();
    for transport_name in &args.transports {
        let boxed = crate::transport::agree(&mpi, make_transport(transport_name, &mpi))?;
        let transport: &dyn Transport = &*boxed;
        for mode in &args.modes {
            let mut options = job.options.clone();
            options.layout.exchange = match mode.as_str() {
                "fused" | "naive" => ExchangeMode::Fused,
                "two-phase" => ExchangeMode::TwoPhase,
                other => {
                    return Err(Error::Config(format!("--modes: unknown mode '{other}' (fused, two-phase, naive)")))
                }
            };
            let mut loader = Loader::new(transport, dataset.clone(), options)?;
            let run_epoch = |loader: &mut Loader<&dyn Transport>, e: u64| -> Result<u64> {
                let mut bytes = 0u64;
                if mode == "naive" {
                    loader.naive_epoch(Epoch(e), |b| {
                        bytes += b.fields().iter().map(|f| f.bytes().len() as u64).sum::<u64>()
                    })?;
                } else {
                    for b in loader.epoch(Epoch(e)) {
                        bytes += b?.fields().iter().map(|f| f.bytes().len() as u64).sum::<u64>();
                    }
                }
                Ok(bytes)
            };
            // One untimed epoch warms the page cache and the MPI connections.
            run_epoch(&mut loader, 0)?;
            loader.take_metrics();
            transport.barrier()?;
            let start = Instant::now();
            let mut delivered = 0;
            for e in 1..=job.epochs {
                delivered += run_epoch(&mut loader, e)?;
            }
            let elapsed = start.elapsed().as_nanos() as u64;
            let m: Metrics = loader.take_metrics();
            let exchange = m.time(crate::loader::Phase::Exchange).as_nanos() as u64;
            let mut maxes = [elapsed, m.bytes_sent, m.bytes_received, exchange];
            transport.all_reduce_u64(&mut maxes, ReduceOp::Max)?;
            let mut sums = [m.bytes_sent, delivered];
            transport.all_reduce_u64(&mut sums, ReduceOp::Sum)?;
            let epochs = job.epochs.max(1);
            results.push(ModeResult {
                transport: transport_name.clone(),
                mode: mode.clone(),
                ranks: transport.size(),
                epochs,
                epoch_s: maxes[0] as f64 / 1e9 / epochs as f64,
                exchange_s: maxes[3] as f64 / 1e9 / epochs as f64,
                exchange_gb_per_s: sums[0] as f64 / (maxes[3] as f64).max(1.0),
                max_sent_per_rank: maxes[1] / epochs,
                max_received_per_rank: maxes[2] / epochs,
                total_sent: sums[0] / epochs,
                delivered_bytes: sums[1] / epochs,
            });
        }
    }
    if rank != 0 {
        return Ok(());
    }
    if args.json {
        for r in &results {
            println!("{}", serde_json::to_string(r).expect("result serialises"));
        }
        return Ok(());
    }
    let base = &results[0];
    println!(
        "bench: {} ranks, mesh {}, batch {}, {} timed epoch(s) per row, {} samples; ratios against {} {}",
        base.ranks,
        job.options.layout.mesh.as_deref().unwrap_or("data parallel"),
        job.options.batch_size,
        base.epochs,
        dataset.len(),
        base.transport,
        base.mode
    );
    println!(
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
    for r in &results {
        println!(
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
    let delivered: Vec<u64> = results.iter().map(|r| r.delivered_bytes).collect();
    if delivered.iter().any(|&d| d != delivered[0]) {
        return Err(Error::Verify(format!("modes delivered different byte counts: {delivered:?}")));
    }
    println!("all modes delivered {:.1} MB per epoch in total", delivered[0] as f64 / 1e6);
    Ok(())
}
