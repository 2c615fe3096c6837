//! meshfeed's own loader (and its single-loader baseline): epoch times, time per phase per
//! rank, bytes read, sent and delivered, and the overlap with a simulated training step.

use std::collections::BTreeMap;
use std::time::Duration;

use meshfeed::config::{ExchangeMode, Job};
use meshfeed::dataset::Dataset;
use meshfeed::loader::{Loader, Phase};
use meshfeed::transport::{agree, ReduceOp, Transport};
use meshfeed::types::Epoch;
use meshfeed::Result;

use super::modes::Mode;
use super::record::{gather_u64, Record, Setting};
use super::{median, timed_max, ComputeMs};

/// One epoch, sleeping `compute_ms` after each batch; returns the bytes delivered.
pub fn run_epoch(loader: &mut Loader, e: u64, compute_ms: f64) -> Result<u64> {
    let mut bytes = 0u64;
    for b in loader.epoch(Epoch(e)) {
        bytes += b?.fields().iter().map(|f| f.bytes().len() as u64).sum::<u64>();
        if compute_ms > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(compute_ms / 1e3));
        }
    }
    Ok(bytes)
}

/// Epochs `epochs`, each timed on its own (the slowest rank's seconds), with a step of
/// `compute_ms`; returns the times and the bytes all ranks delivered per epoch.
fn timed_epochs(
    loader: &mut Loader,
    t: &dyn Transport,
    epochs: std::ops::Range<u64>,
    compute_ms: f64,
) -> Result<(Vec<f64>, u64)> {
    let mut times = Vec::new();
    let mut delivered = 0;
    for e in epochs {
        let (s, bytes) = timed_max(t, || run_epoch(loader, e, compute_ms))?;
        times.push(s);
        delivered = bytes;
    }
    let mut delivered = [delivered];
    t.all_reduce_u64(&mut delivered, ReduceOp::Sum)?;
    Ok((times, delivered[0]))
}

/// A loader for `job` with exchange `exchange` (`None`: the job's), with one untimed
/// epoch (0) behind it: the page cache and the connections are warm.
pub fn warm_loader(t: &dyn Transport, dataset: &Dataset, job: &Job, exchange: Option<ExchangeMode>) -> Result<Loader> {
    let mut options = job.loader.clone();
    if let Some(x) = exchange {
        options.layout.exchange = x;
    }
    let mut loader = Loader::new(t, dataset.clone(), options)?;
    run_epoch(&mut loader, 0, 0.0)?;
    loader.take_metrics();
    Ok(loader)
}

/// Bytes of the samples of `steps` full global batches: what the batches of an epoch hold
/// once (the bytes a loader must read at least).
pub fn bytes_needed(setting: &Setting, loader: &Loader) -> u64 {
    loader.rows_in_steps(0..loader.steps_per_epoch()) * setting.sample_bytes
}

pub fn measure(
    t: &dyn Transport,
    dataset: &Dataset,
    job: &Job,
    setting: &Setting,
    mode: Mode,
    exchange: Option<ExchangeMode>,
    compute_ms: Option<ComputeMs>,
) -> Result<Record> {
    let mut loader = agree(t, warm_loader(t, dataset, job, exchange))?;
    let steps = loader.steps_per_epoch();
    let epochs = job.epochs.max(1);
    let (times, delivered) = timed_epochs(&mut loader, t, 1..epochs + 1, 0.0)?;
    let local = loader.take_metrics();
    let m = local.reduce(t)?;
    let per_epoch = |d: Duration| d.as_secs_f64() / epochs as f64;
    let rows = loader.rows_in_steps(0..steps);
    let mut row = setting.record(mode.name(), &times, rows);
    row.steps_per_epoch = steps;
    row.delivered_bytes = delivered;
    row.gb_per_s = delivered as f64 / 1e9 / row.epoch_s_best.max(1e-9);
    row.bytes_needed = bytes_needed(setting, &loader);
    row.bytes_read = Some(m.bytes_read / epochs);
    // Read, filled and assembled bytes (the transport's own copies are not counted).
    row.bytes_copied = Some(m.bytes_copied / epochs);
    row.exchange_s = per_epoch(m.time(Phase::Exchange));
    row.exchange_gb_per_s = m.bytes_sent as f64 / 1e9 / m.time(Phase::Exchange).as_secs_f64().max(1e-9);
    let mut sent = [m.max_sent, m.max_received];
    t.all_reduce_u64(&mut sent, ReduceOp::Max)?;
    row.max_sent_per_rank = sent[0] / epochs;
    row.max_received_per_rank = sent[1] / epochs;
    row.total_sent = m.bytes_sent / epochs;
    row.phase_s = Some(Phase::ALL.iter().map(|&p| (p.name().to_string(), per_epoch(m.time(p)))).collect());
    let nanos: Vec<u64> = Phase::ALL.iter().map(|&p| local.time(p).as_nanos() as u64).collect();
    row.phase_s_per_rank = Some(
        gather_u64(t, &nanos)?
            .iter()
            .map(|ns| {
                Phase::ALL
                    .iter()
                    .zip(ns)
                    .map(|(p, &n)| (p.name().to_string(), n as f64 / 1e9 / epochs as f64))
                    .collect()
            })
            .collect::<Vec<BTreeMap<String, f64>>>(),
    );
    if exchange.is_none() {
        row.exchange = Some(loader.exchange_mode().name().to_string());
    }
    if let Some(c) = compute_ms {
        let ms = match c {
            ComputeMs::Auto => row.epoch_s * 1e3 / steps.max(1) as f64,
            ComputeMs::Fixed(ms) => ms,
        };
        // Blocks of `epochs` epochs without and with the step, interleaved so that the
        // machine's drift affects both alike; medians of each. Every block starts from a
        // cold pipeline (one epoch number is skipped, which restarts the producer), so
        // that neither inherits windows prefetched during the other.
        let (mut without, mut with) = (Vec::new(), Vec::new());
        let mut e = epochs + 2;
        let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len().max(1) as f64;
        for _ in 0..3 {
            without.push(mean(timed_epochs(&mut loader, t, e..e + epochs, 0.0)?.0));
            e += epochs + 1;
            with.push(mean(timed_epochs(&mut loader, t, e..e + epochs, ms)?.0));
            e += epochs + 1;
        }
        loader.take_metrics();
        let (without, with) = (median(without), median(with));
        row.compute_ms = Some(ms);
        row.epoch_without_compute_s = Some(without);
        row.epoch_with_compute_s = Some(with);
        row.overlap_ratio = Some(with / without.max(steps as f64 * ms / 1e3).max(1e-9));
    }
    Ok(row)
}
