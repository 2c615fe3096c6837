//! One measurement as a JSON line: what was measured (loader, dataset, ranks), how long it
//! took, what it moved, and on which machine. `bench/torch_loader.py` writes the same keys,
//! so that `meshfeed bench report` reads both.

use std::io::Write;
use std::path::Path;

use meshfeed::config::Job;
use meshfeed::dataset::{Dataset, Format};
use meshfeed::transport::{ReduceOp, Transport};
use meshfeed::{Error, Result};

/// The machine a result was measured on.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Machine {
    pub hostname: String,
    pub nproc: usize,
    pub cpu: String,
    /// UTC, ISO 8601.
    pub date: String,
    /// `git rev-parse --short HEAD` of the working directory (the suite runs in the
    /// repository), `-dirty` when it has uncommitted changes; "unknown" outside a checkout.
    pub git_rev: String,
}

impl Machine {
    pub fn here() -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpu = read("/proc/cpuinfo")
            .lines()
            .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string()))
            .unwrap_or_else(|| "unknown".into());
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .stderr(std::process::Stdio::null())
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let git_rev = match git(&["rev-parse", "--short", "HEAD"]) {
            Some(rev) if git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty()) => {
                format!("{rev}-dirty")
            }
            Some(rev) => rev,
            None => "unknown".into(),
        };
        Machine {
            hostname: read("/proc/sys/kernel/hostname").trim().to_string(),
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu,
            date: utc_now(),
            git_rev,
        }
    }
}

/// The current time as `YYYY-MM-DDTHH:MM:SSZ` (no date crate for one line).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// The name a format has in the results (bench/torch_loader.py's `--format`).
fn format_name(f: Format) -> &'static str {
    match f {
        Format::Npy => "npy",
        Format::Hdf5 => "hdf5",
        Format::Arrow => "arrow",
        Format::Raw => "raw",
        Format::WebDataset => "tar",
        Format::Megatron => "idx",
        Format::Parquet => "parquet",
    }
}

/// What every measurement of one bench run shares: the dataset, the job and the world.
#[derive(Clone, Debug)]
pub struct Setting {
    pub transport: String,
    pub tag: String,
    pub format: String,
    /// Bytes of one sample (fixed-size fields; variable-length ones at their mean size
    /// where the files tell it, else 0).
    pub sample_bytes: u64,
    pub samples: u64,
    pub ranks: usize,
    pub batch_size: usize,
    pub window_bytes: u64,
}

impl Setting {
    pub fn new(job: &Job, dataset: &Dataset, t: &dyn Transport, transport: &str, tag: &str) -> Setting {
        let means = dataset.mean_value_bytes();
        let sample_bytes = dataset
            .fields()
            .iter()
            .zip(means)
            .map(|(f, mean)| f.fixed_bytes().map_or(mean.unwrap_or(0), |b| b as u64))
            .sum();
        Setting {
            transport: transport.to_string(),
            tag: tag.to_string(),
            format: dataset.files().first().map_or("?", |f| format_name(f.format)).to_string(),
            sample_bytes,
            samples: dataset.len(),
            ranks: t.size(),
            batch_size: job.loader.batch_size,
            window_bytes: job.loader.window_bytes,
        }
    }

    /// A record of this setting for `mode`, its epoch times (max over ranks, one per timed
    /// epoch) and the samples one epoch delivers.
    pub fn record(&self, mode: &str, epoch_s: &[f64], samples_per_epoch: u64) -> Record {
        let best = epoch_s.iter().copied().fold(f64::INFINITY, f64::min);
        let best = if best.is_finite() { best } else { 0.0 };
        Record {
            loader: mode.to_string(),
            mode: mode.to_string(),
            transport: self.transport.clone(),
            tag: self.tag.clone(),
            format: self.format.clone(),
            sample_bytes: self.sample_bytes,
            samples: self.samples,
            ranks: self.ranks,
            batch_size: self.batch_size,
            window_bytes: self.window_bytes,
            epochs: epoch_s.len() as u64,
            epoch_s: crate::median(epoch_s.to_vec()),
            epoch_s_best: best,
            epoch_s_all: epoch_s.to_vec(),
            samples_per_epoch,
            samples_per_s: samples_per_epoch as f64 / best.max(1e-9),
            ..Record::default()
        }
    }
}

/// One measurement, reduced over ranks (times: the slowest rank's; bytes: all ranks').
/// Keys a measurement does not have are left out of its JSON line.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Record {
    /// What was measured: meshfeed, fused, two-phase, naive, random-access, read-limit,
    /// exchange-limit, memcpy-limit, or pytorch (bench/torch_loader.py).
    pub loader: String,
    /// The same as `loader` (the key older `meshfeed bench --json` output had).
    pub mode: String,
    pub transport: String,
    pub tag: String,
    pub format: String,
    pub sample_bytes: u64,
    /// Samples in the dataset.
    pub samples: u64,
    pub ranks: usize,
    /// Global batch size.
    pub batch_size: usize,
    pub window_bytes: u64,
    pub steps_per_epoch: u64,
    /// Timed epochs (repeats; a warm-up epoch before them is not counted).
    pub epochs: u64,
    /// Median epoch time, the best one, and all of them (each the slowest rank's).
    pub epoch_s: f64,
    pub epoch_s_best: f64,
    pub epoch_s_all: Vec<f64>,
    /// Samples one epoch delivers (all ranks; each sample once however many ranks hold a
    /// part of it), and per second in the best epoch.
    pub samples_per_epoch: u64,
    pub samples_per_s: f64,
    /// Bytes all ranks delivered (loaders) or moved (limits) per epoch, and per second
    /// in the best epoch.
    pub delivered_bytes: u64,
    pub gb_per_s: f64,
    /// Bytes of the samples one epoch delivers: what a loader must read at least.
    pub bytes_needed: u64,
    /// Bytes the readers brought into memory per epoch (all ranks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_read: Option<u64>,
    /// Bytes copied by meshfeed per epoch (`Metrics::bytes_copied`, all ranks); absent for
    /// loaders that do not count them ("n/a" in the report, never a guess).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_copied: Option<u64>,
    /// Per phase (plan, read, fill, exchange, assemble; `pack` for fill before telemetry schema 6): the slowest rank's seconds per
    /// epoch, and every rank's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase_s: Option<std::collections::BTreeMap<String, f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase_s_per_rank: Option<Vec<std::collections::BTreeMap<String, f64>>>,
    /// The exchange phase per epoch (max over ranks) and its throughput (all bytes sent).
    pub exchange_s: f64,
    pub exchange_gb_per_s: f64,
    /// Most bytes any rank sent / received per epoch (including to itself), and all
    /// ranks' bytes sent.
    pub max_sent_per_rank: u64,
    pub max_received_per_rank: u64,
    pub total_sent: u64,
    /// Which exchange `meshfeed` (auto) chose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exchange: Option<String>,
    /// Peak resident set size during this measurement: the largest rank's, and every
    /// rank's (VmHWM, reset before each mode; for PyTorch, with its workers).
    pub max_rss_bytes: u64,
    pub rss_per_rank: Vec<u64>,
    /// PyTorch: the worker count of the best run, and each tried count's best epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_workers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch_s_by_workers: Option<std::collections::BTreeMap<String, f64>>,
    /// With `--compute-ms`: the step, the median epoch times without and with it (from
    /// interleaved blocks of epochs), and the overlap ratio: with / max(without, steps ×
    /// step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compute_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch_without_compute_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch_with_compute_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlap_ratio: Option<f64>,
    /// Only on rank 0's lines (every line of one run has it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
}

impl Record {
    /// Whether this measurement delivers batches (a loader), as opposed to a limit.
    pub fn delivers_batches(&self) -> bool {
        !self.loader.ends_with("-limit")
    }

    /// Fills the peak RSS of every rank since [`reset_peak_rss`] (collective).
    pub fn set_peak_rss(&mut self, t: &dyn Transport) -> Result<()> {
        let per_rank = gather_u64(t, &[peak_rss_bytes()])?;
        self.rss_per_rank = per_rank.iter().map(|v| v[0]).collect();
        self.max_rss_bytes = self.rss_per_rank.iter().copied().max().unwrap_or(0);
        Ok(())
    }
}

/// Every rank's `mine`, in rank order (collective).
pub fn gather_u64(t: &dyn Transport, mine: &[u64]) -> Result<Vec<Vec<u64>>> {
    let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(t.all_gather(&bytes)?
        .into_iter()
        .map(|b| b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
        .collect())
}

/// Sums `values` over ranks (collective).
pub fn sum_u64<const N: usize>(t: &dyn Transport, mut values: [u64; N]) -> Result<[u64; N]> {
    t.all_reduce_u64(&mut values, ReduceOp::Sum)?;
    Ok(values)
}

/// Resets this process's peak RSS (Linux: writing 5 to /proc/self/clear_refs resets
/// VmHWM), so that each mode reports its own peak. Where that fails, the peak is the
/// process's since it started (getrusage), which can only overstate a later mode's.
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Peak RSS since the last [`reset_peak_rss`] (VmHWM), else since the process started.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or_else(meshfeed::runtime::peak_rss_bytes)
}

/// Appends results to a JSON lines file (created if missing).
pub fn append(path: &Path, results: &[Record]) -> Result<()> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| Error::io(path, e))?;
    let mut text = String::new();
    for r in results {
        text.push_str(&serde_json::to_string(r).expect("a result serialises"));
        text.push('\n');
    }
    f.write_all(text.as_bytes()).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_iso_utc() {
        let d = utc_now();
        assert_eq!(d.len(), 20, "{d}");
        assert!(d.starts_with("20") && d.ends_with('Z') && &d[10..11] == "T", "{d}");
    }

    #[test]
    fn missing_keys_read_as_defaults_and_absent_options_stay_absent() {
        let r: Record = serde_json::from_str(r#"{"loader":"pytorch","ranks":4,"epoch_s":1.5}"#).unwrap();
        assert_eq!((r.loader.as_str(), r.ranks, r.epoch_s), ("pytorch", 4, 1.5));
        assert!(r.bytes_copied.is_none());
        let line = serde_json::to_string(&r).unwrap();
        assert!(!line.contains("bytes_copied") && !line.contains("phase_s\""), "{line}");
    }
}
