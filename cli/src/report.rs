//! `meshfeed report`: its arguments, and the tables it prints. What it reports — each run
//! and epoch's phases, skew, stragglers and what-if estimate, the scaling table, the cost
//! model's fit and predictions, the plots — is computed by
//! [`meshfeed_analysis::report`].

use std::path::PathBuf;

use clap::builder::RangedU64ValueParser;
use meshfeed::config::ByteSize;
use meshfeed::error::ErrorKind;
use meshfeed::{Result, ResultExt};
use meshfeed_analysis::report::{self, Model, PredictOptions};
use serde::Serialize;

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Telemetry directories (`run --telemetry DIR`), or directories of them (a sweep's
    /// results), each a run.
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Print one JSON line per run and epoch instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Draw plots into this directory, each as PNG and SVG: throughput vs nodes per
    /// loader, time per phase per run, and each rank's own work per run (skew).
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    #[command(flatten)]
    pub predict: PredictArgs,
}

/// The cost model's prediction (`--predict`) and what to predict for: by default the
/// largest measured meshfeed run's dataset, batch, window, ranks per node and read
/// strategy.
///
/// Every count, size and rate is at least 1, checked when the command line is parsed
/// (clap names the option and the value): a zero node count, batch or bandwidth is no
/// scenario, and the model would otherwise quietly predict something else.
#[derive(clap::Args, Debug, Default)]
pub struct PredictArgs {
    /// Fit the cost model to the meshfeed runs' window records and predict epoch time,
    /// throughput and scaling efficiency at these node counts (comma-separated, each 1 to
    /// 2^20) [default when given alone: 1,2,4,...,4096].
    #[arg(long, num_args = 0..=1, value_delimiter = ',', value_name = "NODES",
          default_missing_value = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096",
          value_parser = count(MAX_NODES))]
    pub predict: Option<Vec<usize>>,
    /// Ranks per node (1 to 2^16).
    #[arg(long, requires = "predict", value_parser = count(MAX_RANKS_PER_NODE))]
    pub ranks_per_node: Option<usize>,
    /// Samples in the dataset.
    #[arg(long, requires = "predict", value_parser = clap::value_parser!(u64).range(1..))]
    pub samples: Option<u64>,
    /// Bytes per sample (K/M/G).
    #[arg(long, requires = "predict", value_name = "BYTES", value_parser = positive_bytes)]
    pub sample_bytes: Option<ByteSize>,
    /// Global batch size.
    #[arg(long, requires = "predict", value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_size: Option<u64>,
    /// Window budget per rank (K/M/G).
    #[arg(long, requires = "predict", value_name = "BYTES", value_parser = positive_bytes)]
    pub window_bytes: Option<ByteSize>,
    /// Ranks that receive each sample (1: data parallel; the size of the mesh axes the
    /// batch is replicated over, e.g. tp).
    #[arg(long, requires = "predict", default_value_t = 1, value_parser = count(u64::MAX))]
    pub replicas: usize,
    /// The storage's aggregate read bandwidth, bytes/s (K/M/G) [default: fitted, or
    /// unlimited when the runs never saturated it].
    #[arg(long, requires = "predict", value_name = "BYTES", value_parser = positive_bytes)]
    pub storage_bandwidth: Option<ByteSize>,
    /// One node's read bandwidth from the storage, bytes/s (K/M/G) [default: fitted].
    #[arg(long, requires = "predict", value_name = "BYTES", value_parser = positive_bytes)]
    pub node_read_bandwidth: Option<ByteSize>,
    /// One node's network link for the exchange, bytes/s (K/M/G) [default: fitted, or
    /// the `--exchange-costs` default when no run crossed nodes].
    #[arg(long, requires = "predict", value_name = "BYTES", value_parser = positive_bytes)]
    pub link_bandwidth: Option<ByteSize>,
}

impl PredictArgs {
    /// What to predict, where `--predict` is given.
    fn options(&self) -> Option<PredictOptions> {
        let bytes = |b: Option<ByteSize>| b.map(|b| b.0);
        Some(PredictOptions {
            nodes: self.predict.clone()?,
            ranks_per_node: self.ranks_per_node,
            samples: self.samples,
            sample_bytes: bytes(self.sample_bytes),
            batch_size: self.batch_size,
            window_bytes: bytes(self.window_bytes),
            replicas: self.replicas,
            storage_bandwidth: bytes(self.storage_bandwidth),
            node_read_bandwidth: bytes(self.node_read_bandwidth),
            link_bandwidth: bytes(self.link_bandwidth),
        })
    }
}

/// The most nodes `--predict` takes, and ranks per node: their product (the world size
/// the model computes with) stays exact in a `usize` and an `f64`.
const MAX_NODES: u64 = 1 << 20;
const MAX_RANKS_PER_NODE: u64 = 1 << 16;

/// The parser of a count from 1 to `max` (clap's message names the option and the value).
fn count(max: u64) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(1..=max)
}

/// The parser of a size or rate of at least 1 byte (K/M/G).
fn positive_bytes(s: &str) -> std::result::Result<ByteSize, String> {
    match s.parse::<ByteSize>() {
        Ok(ByteSize(0)) => Err("0 bytes: a size or a rate is at least 1 byte".into()),
        Ok(b) => Ok(b),
        Err(e) => Err(e.to_string()),
    }
}

/// The model's part of the report, for people.
fn print_model(m: &Model) {
    let c = &m.calibration;
    let rate = |b: Option<f64>, none: &str| b.map_or(none.to_string(), |b| format!("{:.1} MB/s", b / 1e6));
    crate::output::line("");
    crate::output::line(&format!(
        "cost model, fitted to {} run(s), {} window records: read {:.2} ms + bytes at {} a node (storage: {}), \
         kept rows {:.3} ns a byte, \
         own work {:.2} µs a row, spread {:.0}%; consumer {:.2} µs a row + {:.2} ns a byte; exchange {:.2} ms a window + {} a peer, {} on a host, {} a node's link",
        c.runs,
        c.windows,
        c.read_latency_s * 1e3,
        rate(Some(c.node_read_bytes_per_s), "?"),
        rate(c.storage_bytes_per_s, "not saturated"),
        c.kept_read_s_per_byte * 1e9,
        c.cpu_s_per_row * 1e6,
        c.cv * 100.0,
        c.consume_s_per_row * 1e6,
        c.consume_s_per_byte * 1e9,
        c.overhead_s * 1e3,
        c.latency_s.map_or("? (one world size measured; default used)".into(), |l| format!("{:.1} µs", l * 1e6)),
        rate(c.intra_bytes_per_s, "not measured"),
        rate(c.inter_bytes_per_s, "not measured (no run crossed nodes)"),
    ));
    crate::output::line(&format!("    calibrated for --exchange auto: --exchange-costs {}", c.exchange_costs()));
    crate::output::line(&format!(
        "{:<40} {:>5} {:>5} {:>11} {:>11} {:>6}",
        "model vs measured (last epoch)", "nodes", "ranks", "measured_s", "predicted_s", "ratio"
    ));
    for v in &m.validation {
        crate::output::line(&format!(
            "{:<40} {:>5} {:>5} {:>11.3} {:>11.3} {:>6.2}",
            v.run, v.nodes, v.ranks, v.measured_s, v.predicted_s, v.ratio
        ));
    }
    let s = &m.scenario;
    crate::output::line(&format!(
        "prediction: {} samples of {:.0} B, batch {}, window {} B, {} rank(s) per node, each sample to {} rank(s); \
         reads {:.2}× the data in the first epoch, {:.2}× in later ones",
        s.samples,
        s.sample_bytes,
        s.batch_size,
        s.window_bytes,
        s.ranks_per_node,
        s.replicas,
        s.reads.first,
        s.reads.later
    ));
    crate::output::line(&format!(
        "{:>6} {:>7} {:>8} {:>10} {:>10} {:>12} {:>10} {:>9} {:>9} {:>11} {:>6} {:>10}",
        "nodes",
        "ranks",
        "windows",
        "first_s",
        "epoch_s",
        "samples/s",
        "efficiency",
        "read_s",
        "cpu_s",
        "exchange_s",
        "skew",
        "consume_s"
    ));
    for p in &m.predictions {
        crate::output::line(&format!(
            "{:>6} {:>7} {:>8} {:>10.3} {:>10.3} {:>12.0} {:>10.2} {:>9.4} {:>9.4} {:>11.4} {:>5.0}% {:>10.4}{}",
            p.nodes,
            p.ranks,
            p.windows,
            p.first_epoch_s,
            p.epoch_s,
            p.samples_per_s,
            p.efficiency,
            p.read_s,
            p.cpu_s,
            p.exchange_s,
            p.skew_share * 100.0,
            p.consume_s,
            if p.consumer_bound { " consumer-bound" } else { "" }
        ));
    }
    crate::output::line(
        "    (first_s: the first epoch; epoch_s and the rest: a later one. Per window: read_s, cpu_s: the slowest \
         rank's; skew: the share of a window spent waiting for it; consume_s: the consumer's)",
    );
}

/// `meshfeed report`.
pub fn run(args: ReportArgs) -> Result<()> {
    let predict = args.predict.options();
    let r = report::report(&args.dirs, predict.as_ref())?;
    if let Some(dir) = &args.plots {
        let written = report::plots(dir, &r)?;
        crate::output::line_err(&format!("report: {} plot file(s) in {}", written.len(), dir.display()));
    }
    if args.json {
        for e in &r.epochs {
            crate::output::line(&json(e)?);
        }
        for row in &r.scaling {
            crate::output::line(&json(row)?);
        }
        if let Some(m) = &r.model {
            crate::output::line(&json(&m.calibration)?);
            for v in &m.validation {
                crate::output::line(&json(v)?);
            }
            for p in &m.predictions {
                crate::output::line(&json(p)?);
            }
        }
        return Ok(());
    }
    crate::output::line(&format!(
        "{:<40} {:>5} {:>5} {:>9} {:>9} {:>6}  {}",
        "run",
        "epoch",
        "ranks",
        "epoch_s",
        "what-if_s",
        "skew",
        "phase s, median/max: plan read fill exchange assemble"
    ));
    for e in &r.epochs {
        let phases: Vec<String> =
            e.phase_median_s.iter().zip(&e.phase_max_s).map(|((_, m), (_, x))| format!("{m:.3}/{x:.3}")).collect();
        crate::output::line(&format!(
            "{:<40} {:>5} {:>5} {:>9.3} {:>9.3} {:>5.2}x  {}",
            e.run,
            e.epoch,
            e.ranks,
            e.seconds,
            e.what_if_s,
            e.skew,
            phases.join(" ")
        ));
        for s in e.stragglers.iter().take(3) {
            crate::output::line(&format!(
                "    straggler: rank {} on {}: own work {:.3} s, {} {:.3} s (median {:.3} s)",
                s.rank, s.host, s.own_s, s.phase, s.phase_s, s.phase_median_s
            ));
        }
        if let Some(st) = &e.steps {
            let v = &st.saving;
            crate::output::line(&format!(
                "    step by step ({} steps): replayed {:.3} s, {:.3} s had rank {} on {} worked as the median rank; \
                 saved in its data loading {:.3} s, exchange {:.3} s, training step {:.3} s",
                st.steps,
                st.replayed_s,
                st.what_if_s,
                st.slowest_rank,
                st.slowest_host,
                v.data_loading_s,
                v.exchange_s,
                v.training_step_s
            ));
            let slow: Vec<String> = st
                .slowest_steps
                .iter()
                .map(|s| {
                    format!("{} ({:.3} s, median {:.3} s: rank {}, {})", s.step, s.seconds, s.median_s, s.rank, s.cause)
                })
                .collect();
            crate::output::line(&format!("    slowest steps: {}", slow.join("; ")));
        }
        if !e.slow_hosts.is_empty() {
            crate::output::line(&format!("    slowest host(s): {}", e.slow_hosts.join(", ")));
        }
        if e.verified == Some(false) {
            crate::output::line("    NOT VERIFIED: a sample was missing, repeated, out of order or wrong");
        }
    }
    crate::output::line("");
    crate::output::line(&format!(
        "{:<10} {:>5} {:>5} {:>12} {:>10}  {}",
        "loader",
        "nodes",
        "ranks",
        "samples/s",
        "efficiency",
        "run (last epoch; efficiency: per node, against the fewest nodes)"
    ));
    for row in &r.scaling {
        crate::output::line(&format!(
            "{:<10} {:>5} {:>5} {:>12.0} {:>10.2}  {}",
            row.loader, row.hosts, row.ranks, row.samples_per_s, row.efficiency, row.run
        ));
        if let Some(s) = &row.storage {
            crate::output::line(&format!(
                "    read from the shared storage: {:.1} MB, {:.2}× the data over {} epoch(s)",
                s.bytes as f64 / 1e6,
                s.times_data,
                s.epochs
            ));
        }
    }
    if let Some(m) = &r.model {
        print_model(m);
    }
    Ok(())
}

/// One JSON line.
fn json<T: Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).context(ErrorKind::Internal, "a record of the report does not serialise")
}
