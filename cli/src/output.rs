//! What the command line prints: errors (once per job), per-epoch summaries (text or JSON
//! lines) and verification reports; progress is [`crate::progress`]'s.

use std::collections::BTreeMap;

use meshfeed::loader::{MetricsSummary, Phase};
use meshfeed::verify::Report;
use meshfeed::Error;

/// The exit code of a command's result, printing its error (see [`ErrorStyle::print`]).
pub fn exit_code(rank: Option<usize>, result: meshfeed::Result<i32>) -> i32 {
    ErrorStyle::default().exit_code(rank, result)
}

/// How a ranked command reports a failure: `-v` (every rank says why it stopped) and
/// `--json` (every rank also writes a JSON object on stdout, where its JSON lines go).
#[derive(Clone, Copy, Debug, Default)]
pub struct ErrorStyle {
    pub verbose: bool,
    pub json: bool,
}

impl ErrorStyle {
    /// The exit code of a command's result, printing its error.
    pub fn exit_code(self, rank: Option<usize>, result: meshfeed::Result<i32>) -> i32 {
        match result {
            Ok(code) => code,
            Err(e) => {
                self.print(rank, &e);
                1
            }
        }
    }

    /// Prints an error on stderr, on one line with its source chain: `meshfeed: error on
    /// rank R: <cause>`, R being the rank where it happened.
    ///
    /// A failure all ranks agreed on ([`Error::Remote`]) is printed once, by rank 0: at 4
    /// ranks the cause is the first line and the only one (issue 42). The other ranks
    /// print one short line saying why they stop only with `-v` (per-rank logs, as
    /// Kubernetes keeps them, then explain every exit). An error that was not agreed (a
    /// rank that found a peer lost, a launch environment it refused) is printed by the
    /// rank that has it.
    pub fn print(self, rank: Option<usize>, e: &Error) {
        let (origin, message) = describe(rank, e);
        if self.json {
            let kind = format!("{:?}", e.kind()).to_lowercase();
            let v = serde_json::json!({
                "kind": "error", "error": kind, "rank": rank, "failed_rank": origin, "message": message,
            });
            line(&v.to_string());
        }
        match (rank, e) {
            (Some(r), Error::Remote { rank: origin, .. }) if r != 0 => {
                if self.verbose {
                    write_line(&format!(
                        "meshfeed: rank {r} stopped: rank {origin} failed (the error is printed by rank 0)\n"
                    ));
                }
            }
            _ => write_line(&match origin {
                Some(r) => format!("meshfeed: error on rank {r}: {message}\n"),
                None => format!("meshfeed: error: {message}\n"),
            }),
        }
    }
}

/// The rank an error happened on (`None`: not known) and its message with its source
/// chain. An agreed failure's own text names its origin (`rank 0: ...`, as the library's
/// callers see it): here the origin is the line's rank and the message follows once.
fn describe(rank: Option<usize>, e: &Error) -> (Option<usize>, String) {
    if let Error::Remote { rank: origin, message, .. } = e {
        return (Some(*origin), message.clone());
    }
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(&format!(": {text}"));
        }
        source = s.source();
    }
    (rank, msg)
}

/// One write call: ranks share the launcher's stderr pipe, and `eprintln!` would write a
/// line in pieces that interleave with other ranks' lines. A closed stderr is ignored.
fn write_line(line: &str) {
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// A line on stdout (see `out!`). Write errors — a reader that went away — are ignored:
/// the output is informational, and a job must not fail because nobody reads it.
pub fn line(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = std::io::Write::write_all(&mut out, text.as_bytes())
        .and_then(|()| std::io::Write::write_all(&mut out, b"\n"))
        .and_then(|()| std::io::Write::flush(&mut out));
}

/// A line on stderr, in one write; errors ignored.
pub fn line_err(text: &str) {
    write_line(&format!("{text}\n"));
}

/// Per-epoch summary, reduced over ranks.
#[derive(Debug, serde::Serialize)]
pub struct EpochSummary {
    pub epoch: u64,
    pub ranks: usize,
    pub steps: u64,
    pub samples: u64,
    pub seconds: f64,
    pub samples_per_s: f64,
    pub gb_per_s: f64,
    /// Max over ranks of the time in each phase.
    pub phase_s: BTreeMap<&'static str, f64>,
    /// Max over ranks of the time the consumer waited for data, and of the time spent in
    /// the simulated training step (`--compute-ms`).
    pub wait_s: f64,
    pub compute_s: f64,
    /// Bytes read from the dataset's files, and from spill files.
    pub bytes_read: u64,
    pub bytes_read_spill: u64,
    pub bytes_exchanged: u64,
    pub bytes_delivered: u64,
    /// Bytes the loader copied (read, filled into send buffers, assembled; summed over ranks) and that over
    /// the bytes delivered: the copies each delivered byte took.
    pub bytes_copied: u64,
    pub copies_per_byte: f64,
    /// The most permutation evaluations any rank made planning the epoch's windows.
    pub plan_evaluations: u64,
    pub windows: u64,
    /// Peak resident set size of the largest rank so far (getrusage).
    pub max_rss_bytes: u64,
    /// How the ranks read their home ranges (`resident`, `passes`, `random`), the passes
    /// per epoch, whether the rest is spilled, and why the strategy was chosen.
    pub read_strategy: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passes: Option<u64>,
    pub spill: bool,
    pub read_reason: String,
    /// Rows kept in memory, all ranks together; the memory budget of the host that
    /// decided; the storage's speed the choice was made with (bytes/s, reads/s; absent
    /// where it was not needed); the cost model's time for this epoch.
    pub resident_rows: u64,
    pub memory_budget: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage_bandwidth: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage_iops: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_s: Option<f64>,
    /// The time rank 0 took to open the dataset and build the loader (the first epoch's
    /// summary only): a loader that keeps its data starts streaming it then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,
}

/// What one rank measured over an epoch, besides the loader's metrics.
pub struct EpochTimes {
    pub epoch: u64,
    pub samples: u64,
    pub steps: u64,
    pub seconds: f64,
    pub compute_s: f64,
    pub delivered: u64,
}

impl EpochSummary {
    /// The summary of an epoch (collective).
    pub fn reduce(
        world: &dyn meshfeed::transport::Transport,
        t: &EpochTimes,
        m: &MetricsSummary,
        io: &meshfeed::plan::IoPlan,
    ) -> meshfeed::Result<EpochSummary> {
        use meshfeed::transport::ReduceOp;
        let mut maxes = [(t.seconds * 1e9) as u64, (t.compute_s * 1e9) as u64, meshfeed::runtime::peak_rss_bytes()];
        world.all_reduce_u64(&mut maxes, ReduceOp::Max)?;
        let mut delivered = [t.delivered];
        world.all_reduce_u64(&mut delivered, ReduceOp::Sum)?;
        let seconds = maxes[0] as f64 / 1e9;
        Ok(EpochSummary {
            epoch: t.epoch,
            ranks: world.size(),
            steps: t.steps,
            samples: t.samples,
            seconds,
            samples_per_s: t.samples as f64 / seconds.max(1e-9),
            gb_per_s: delivered[0] as f64 / 1e9 / seconds.max(1e-9),
            phase_s: Phase::ALL.iter().map(|&p| (p.name(), m.time(p).as_secs_f64())).collect(),
            wait_s: m.wait_max.as_secs_f64(),
            compute_s: maxes[1] as f64 / 1e9,
            bytes_read: m.bytes_read,
            bytes_read_spill: m.bytes_read_spill,
            bytes_exchanged: m.bytes_sent,
            bytes_delivered: delivered[0],
            bytes_copied: m.bytes_copied,
            copies_per_byte: m.bytes_copied as f64 / delivered[0].max(1) as f64,
            plan_evaluations: m.max_evaluations,
            windows: m.windows,
            max_rss_bytes: maxes[2],
            read_strategy: io.strategy.name(),
            passes: match io.strategy {
                meshfeed::plan::Strategy::Passes { passes } => Some(passes),
                _ => None,
            },
            spill: io.spill,
            read_reason: io.reason.clone(),
            resident_rows: io.resident.iter().sum(),
            memory_budget: io.budget,
            storage_bandwidth: io.storage.map(|s| s.bandwidth),
            storage_iops: io.storage.map(|s| s.iops),
            predicted_s: io.prediction.map(|p| if t.epoch == 0 { p.first_epoch_s } else { p.later_epoch_s }),
            open_s: None,
            verified: None,
        })
    }

    /// The summary as one line of text.
    pub fn print(&self) {
        let phases: Vec<String> =
            Phase::ALL.iter().map(|p| format!("{} {:.3}s", p.name(), self.phase_s[p.name()])).collect();
        let compute = if self.compute_s > 0.0 {
            format!(" | compute {:.3}s, waited for data {:.3}s", self.compute_s, self.wait_s)
        } else {
            String::new()
        };
        out!(
            "epoch {}: {} samples in {:.3} s — {:.0} samples/s, {:.3} GB/s | {} (max over {} ranks){compute} | {} windows, {:.1} MB read, {:.1} MB exchanged, peak RSS {:.0} MB",
            self.epoch,
            self.samples,
            self.seconds,
            self.samples_per_s,
            self.gb_per_s,
            phases.join(", "),
            self.ranks,
            self.windows,
            self.bytes_read as f64 / 1e6,
            self.bytes_exchanged as f64 / 1e6,
            self.max_rss_bytes as f64 / 1e6
        );
    }

    /// The summary as one JSON line.
    pub fn print_json(&self) {
        out!("{}", serde_json::to_string(self).expect("a summary serialises"));
    }
}

/// The verification report of one epoch.
pub fn print_verify_report(epoch: u64, samples: u64, dataset: u64, r: &Report, contents: bool, first: Option<&str>) {
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
        out!("verify: epoch {epoch}: {samples} samples delivered exactly once{copies}, in permutation order; {what}");
    } else {
        out!(
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
