//! What `meshfeed bench report` makes of the results: JSON lines in, the suite's table of
//! ratios (markdown) out; [`super::plots`] draws the plots.
//!
//! Results are grouped by measurement point — dataset (`tag`, sample size, format, sample
//! count), window budget and ranks — and, within a point, by loader; where a loader was
//! measured more than once there, its best run counts. The ratios compare meshfeed (the
//! `meshfeed` mode, else `fused`) with each baseline at the same point, and its epoch with
//! the slower of the read and exchange limits.

use std::collections::BTreeMap;
use std::path::PathBuf;

use meshfeed::{Error, Result};

use super::record::{Machine, Record};
use crate::input::{read_small, RECORDS_LIMIT};

/// One measurement point: what was loaded, how, by how many ranks.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Point {
    pub sample_bytes: u64,
    pub format: String,
    pub samples: u64,
    pub window_bytes: u64,
    pub ranks: usize,
    pub tag: String,
}

impl Point {
    fn of(r: &Record) -> Point {
        Point {
            sample_bytes: r.sample_bytes,
            format: r.format.clone(),
            samples: r.samples,
            window_bytes: r.window_bytes,
            ranks: r.ranks,
            tag: r.tag.clone(),
        }
    }

    pub fn dataset_bytes(&self) -> u64 {
        self.samples * self.sample_bytes
    }
}

/// The best record of each loader at each point.
pub type Grid = BTreeMap<Point, BTreeMap<String, Record>>;

/// The loader that stands for meshfeed at a point.
pub fn meshfeed_of(loaders: &BTreeMap<String, Record>) -> Option<&Record> {
    loaders.get("meshfeed").or_else(|| loaders.get("fused"))
}

/// Refuses a result whose epoch times are not positive, finite seconds: 0 or less is no
/// measurement, and every ratio and rate of the report would divide by it.
fn check_times(r: &Record) -> std::result::Result<(), String> {
    let mut times = vec![("epoch_s_best".to_string(), r.epoch_s_best), ("epoch_s".to_string(), r.epoch_s)];
    times.extend(r.epoch_s_all.iter().enumerate().map(|(i, &t)| (format!("epoch_s_all[{i}]"), t)));
    if let Some(by) = &r.epoch_s_by_workers {
        times.extend(by.iter().map(|(w, &t)| (format!("epoch_s_by_workers.{w}"), t)));
    }
    times.extend(r.epoch_without_compute_s.map(|t| ("epoch_without_compute_s".to_string(), t)));
    times.extend(r.epoch_with_compute_s.map(|t| ("epoch_with_compute_s".to_string(), t)));
    match times.into_iter().find(|(_, t)| !(t.is_finite() && *t > 0.0)) {
        Some((key, t)) => Err(format!("{key} is {t}: an epoch takes a positive, finite number of seconds")),
        None => Ok(()),
    }
}

/// The results of `inputs` (each a regular file of at most 1 GiB: a FIFO is refused, not
/// waited on), each checked: a line that is no result, or a result without loader or
/// ranks or with an epoch time that is not positive, is an error naming the file and line.
/// A file's lines are all parsed before any is checked, so that a line that is not JSON
/// is the error reported.
pub fn read_grid(inputs: &[PathBuf]) -> Result<(Grid, Option<Machine>)> {
    let mut grid = Grid::new();
    let mut machine = None;
    for path in inputs {
        let text = read_small(path, RECORDS_LIMIT)?;
        let records = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, line)| {
                serde_json::from_str::<Record>(line)
                    .map(|r| (i, r))
                    .map_err(|e| Error::file(path, format!("line {}: not a bench result: {e}", i + 1)))
            })
            .collect::<Result<Vec<_>>>()?;
        for (i, r) in records {
            if r.loader.is_empty() || r.ranks == 0 {
                return Err(Error::file(path, format!("line {}: a result without loader or ranks", i + 1)));
            }
            check_times(&r).map_err(|why| Error::file(path, format!("line {}: {why}", i + 1)))?;
            if r.machine.is_some() {
                machine = r.machine.clone();
            }
            let slot = grid.entry(Point::of(&r)).or_default();
            let better = slot.get(&r.loader).is_none_or(|old| r.epoch_s_best < old.epoch_s_best);
            if better {
                slot.insert(r.loader.clone(), r);
            }
        }
    }
    if grid.is_empty() {
        return Err(Error::Config("bench report: the inputs hold no results".into()));
    }
    Ok((grid, machine))
}

fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.0} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "—".into(),
    }
}

fn secs(r: Option<&Record>) -> String {
    r.map_or("—".into(), |r| format!("{:.3}", r.epoch_s_best))
}

/// The ratios at one point, as table cells (None where meshfeed was not measured).
fn row(p: &Point, l: &BTreeMap<String, Record>) -> Option<Vec<String>> {
    let m = meshfeed_of(l)?;
    let sps = |name: &str| l.get(name).map(|r| r.samples_per_s);
    let limit = match (l.get("read-limit"), l.get("exchange-limit")) {
        (None, None) => None,
        (a, b) => Some(a.map_or(0.0, |r| r.epoch_s_best).max(b.map_or(0.0, |r| r.epoch_s_best))),
    };
    let torch = l.get("pytorch");
    Some(vec![
        p.tag.clone(),
        size(p.sample_bytes),
        p.format.clone(),
        format!("{:.0} MB", p.dataset_bytes() as f64 / 1e6),
        size(p.window_bytes),
        p.ranks.to_string(),
        format!("{:.3}", m.epoch_s_best),
        format!("{:.0}", m.samples_per_s),
        torch.map_or("—".into(), |t| format!("{:.3} ({}w)", t.epoch_s_best, t.num_workers.unwrap_or(0))),
        secs(l.get("random-access")),
        secs(l.get("naive")),
        secs(l.get("read-limit")),
        secs(l.get("exchange-limit")),
        secs(l.get("memcpy-limit")),
        ratio(Some(m.samples_per_s), sps("pytorch")),
        ratio(Some(m.samples_per_s), sps("random-access")),
        ratio(Some(m.samples_per_s), sps("naive")),
        ratio(Some(m.epoch_s_best), limit),
        m.bytes_read.map_or("—".into(), |b| format!("{:.2}", b as f64 / m.bytes_needed.max(1) as f64)),
        m.bytes_copied.map_or("n/a".into(), |c| format!("{:.2}", c as f64 / m.delivered_bytes.max(1) as f64)),
        format!("{:.0}", m.max_rss_bytes as f64 / 1e6),
    ])
}

const HEADER: [&str; 21] = [
    "dataset",
    "sample",
    "format",
    "data",
    "window",
    "ranks",
    "meshfeed s",
    "meshfeed samples/s",
    "PyTorch s (workers)",
    "random-access s",
    "broadcast s",
    "read limit s",
    "exchange limit s",
    "memcpy limit s",
    "vs PyTorch",
    "vs random-access",
    "vs broadcast",
    "epoch / max(read, exchange limit)",
    "read / needed",
    "copies / byte",
    "peak RSS MB",
];

/// The report: the headline at the most ranks, then every point.
pub fn markdown(grid: &Grid, machine: Option<&Machine>) -> String {
    let mut s = String::from("# meshfeed benchmark suite\n\n");
    if let Some(m) = machine {
        s.push_str(&format!(
            "Measured on {} ({} cores, {}), {} UTC, git {}.\n\n",
            m.hostname, m.nproc, m.cpu, m.date, m.git_rev
        ));
    }
    s.push_str(
        "Times are best epochs in seconds (the slowest rank's); ratios above 1 mean meshfeed is faster \
         (samples/s) — except epoch / max(limits), the loader's epoch over the slower of the read and exchange \
         limits (1.0 would be at the limit). copies / byte: the bytes meshfeed copied (read into memory, filled into send buffers, \
         assembled; not the transport's own copies) over the bytes delivered; n/a for loaders that do not count \
         them.\n\n",
    );
    let table = |points: Vec<(&Point, &BTreeMap<String, Record>)>| {
        let mut t = format!("| {} |\n|{}\n", HEADER.join(" | "), "---|".repeat(HEADER.len()));
        let mut rows = 0;
        for (p, l) in points {
            if let Some(cells) = row(p, l) {
                t.push_str(&format!("| {} |\n", cells.join(" | ")));
                rows += 1;
            }
        }
        (t, rows)
    };
    let most = grid.keys().map(|p| p.ranks).max().unwrap_or(1);
    let headline: Vec<_> = grid.iter().filter(|(p, _)| p.ranks == most && !p.tag.contains(':')).collect();
    let (t, rows) = table(headline);
    if rows > 0 {
        s.push_str(&format!("## At {most} ranks\n\n{t}\n"));
    }
    let (t, _) = table(grid.iter().collect());
    s.push_str(&format!("## Every point\n\n{t}"));
    // Not part of the table: the overlap runs.
    let overlaps: Vec<String> = grid
        .iter()
        .flat_map(|(p, l)| l.values().map(move |r| (p, r)))
        .filter_map(|(p, r)| {
            let (ms, without, with, ratio) =
                (r.compute_ms?, r.epoch_without_compute_s?, r.epoch_with_compute_s?, r.overlap_ratio?);
            Some(format!(
                "| {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} |",
                p.tag,
                size(p.sample_bytes),
                p.ranks,
                r.loader,
                ms,
                r.steps_per_epoch as f64 * ms / 1e3,
                without,
                with,
                ratio
            ))
        })
        .collect();
    if !overlaps.is_empty() {
        s.push_str(
            "\n## Overlap with a simulated training step\n\n| dataset | sample | ranks | loader | step ms | compute s \
             | loading s | both s | both / max |\n|---|---|---|---|---|---|---|---|---|\n",
        );
        s.push_str(&overlaps.join("\n"));
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(loader: &str, ranks: usize, best: f64) -> Record {
        Record {
            loader: loader.into(),
            tag: "medium".into(),
            format: "npy".into(),
            sample_bytes: 16384,
            samples: 1000,
            ranks,
            window_bytes: 8 << 20,
            epoch_s: best,
            epoch_s_best: best,
            samples_per_s: 1000.0 / best,
            bytes_read: Some(2000),
            bytes_needed: 1000,
            ..Record::default()
        }
    }

    #[test]
    fn ratios_compare_meshfeed_with_baselines_and_limits_at_the_same_point() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let lines: Vec<String> = [
            rec("meshfeed", 4, 0.5),
            rec("pytorch", 4, 1.0),
            rec("pytorch", 4, 2.0), // a slower repeat: the best run counts
            rec("read-limit", 4, 0.1),
            rec("exchange-limit", 4, 0.25),
            rec("meshfeed", 2, 0.8),
        ]
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
        std::fs::write(&path, lines.join("\n")).unwrap();
        let (grid, _) = read_grid(&[path]).unwrap();
        assert_eq!(grid.len(), 2);
        let md = markdown(&grid, None);
        let four = md.lines().find(|l| l.starts_with("| medium") && l.contains("| 4 |")).unwrap();
        // 2× PyTorch's samples/s, 2× the exchange limit (the slower limit), read 2× needed.
        assert!(four.contains("| 2.00× | — | — | 2.00× | 2.00 | n/a |"), "{four}");
        assert!(md.contains("## At 4 ranks"));
    }

    #[test]
    fn bad_lines_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        std::fs::write(&path, "{\"loader\":\"x\",\"ranks\":1}\nnot json\n").unwrap();
        let err = read_grid(std::slice::from_ref(&path)).unwrap_err().to_string();
        assert!(err.contains("r.jsonl") && err.contains("line 2"), "{err}");
    }

    #[test]
    fn epoch_times_that_are_no_measurement_name_the_key_and_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let good = rec("meshfeed", 2, 0.5);
        for (change, want) in [
            (Box::new(|r: &mut Record| r.epoch_s_best = 0.0) as Box<dyn Fn(&mut Record)>, "epoch_s_best is 0"),
            (Box::new(|r: &mut Record| r.epoch_s = -1.0), "epoch_s is -1"),
            (Box::new(|r: &mut Record| r.epoch_s_all = vec![0.5, 0.0]), "epoch_s_all[1] is 0"),
            (Box::new(|r: &mut Record| r.epoch_with_compute_s = Some(-2.5)), "epoch_with_compute_s is -2.5"),
        ] {
            let mut r = good.clone();
            change(&mut r);
            let lines = [serde_json::to_string(&good).unwrap(), serde_json::to_string(&r).unwrap()];
            std::fs::write(&path, lines.join("\n")).unwrap();
            let err = read_grid(std::slice::from_ref(&path)).unwrap_err().to_string();
            assert!(err.contains("r.jsonl: line 2: ") && err.contains(want), "{want}: {err}");
            assert!(err.contains("a positive, finite number of seconds"), "{err}");
        }
        std::fs::write(&path, serde_json::to_string(&good).unwrap()).unwrap();
        assert_eq!(read_grid(&[path]).unwrap().0.len(), 1);
    }
}
