//! The suite's plots, each as PNG and SVG (plotters): epoch time vs ranks per loader (one
//! plot per sample size), time per phase (stacked bars), and the scaling plots of issue 10
//! — epoch time vs sample size, dataset size, window budget and rank count, and peak
//! memory per rank.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use meshfeed::{Error, Result};

use super::record::Record;
use super::suite::{meshfeed_of, Grid, Point};

/// Loaders drawn in the per-loader plots, in legend order.
const LOADERS: [&str; 9] = [
    "meshfeed",
    "fused",
    "two-phase",
    "pytorch",
    "random-access",
    "naive",
    "read-limit",
    "exchange-limit",
    "memcpy-limit",
];

/// A line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart.
pub struct Lines {
    pub title: String,
    pub x: &'static str,
    pub y: &'static str,
    pub log_x: bool,
    pub log_y: bool,
    pub series: Vec<Series>,
}

/// The stacked bars of the phase plot.
pub struct Bars {
    pub title: String,
    pub labels: Vec<String>,
    /// Per bar, per segment (name, seconds); and the epoch time, drawn as a marker.
    pub stacks: Vec<(Vec<(String, f64)>, f64)>,
}

const SIZE: (u32, u32) = (900, 540);

fn color(i: usize) -> RGBColor {
    const C: [RGBColor; 9] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(23, 190, 207),
    ];
    C[i % C.len()]
}

fn err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::file(path, format!("cannot draw the plot: {e}"))
}

fn range(values: impl Iterator<Item = f64> + Clone, log: bool) -> (f64, f64) {
    let lo = values.clone().fold(f64::INFINITY, f64::min);
    let hi = values.fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() || !hi.is_finite() {
        return (0.1, 1.0);
    }
    if log {
        // At most four decades: a limit that is all but zero (nothing crosses the
        // exchange on one host) would otherwise squash every loader into the top row.
        let lo = lo.max(hi / 1e4).max(1e-9);
        (lo / 1.3, hi.max(lo) * 1.3)
    } else {
        (0.0, if hi > 0.0 { hi * 1.1 } else { 1.0 })
    }
}

fn draw_lines<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &Lines) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let all = || c.series.iter().flat_map(|s| s.points.iter().copied());
    let (x0, x1) = range(all().map(|p| p.0), c.log_x);
    let (x0, x1) = if c.log_x { (x0, x1) } else { (x0.min(all().map(|p| p.0).fold(f64::INFINITY, f64::min)), x1) };
    let (y0, y1) = range(all().map(|p| p.1), c.log_y);
    let mut b = ChartBuilder::on(&root);
    b.caption(&c.title, ("sans-serif", 22)).margin(12).x_label_area_size(45).y_label_area_size(70);
    macro_rules! body {
        ($chart:expr) => {{
            let mut chart = $chart.map_err(e)?;
            chart
                .configure_mesh()
                .x_desc(c.x)
                .y_desc(c.y)
                .x_label_formatter(&|v| format!("{}", trim(*v)))
                .y_label_formatter(&|v| format!("{}", trim(*v)))
                .draw()
                .map_err(e)?;
            for (i, s) in c.series.iter().enumerate() {
                let col = color(i);
                // Points below the range sit on its bottom edge.
                let points: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (x, y.max(y0))).collect();
                chart
                    .draw_series(LineSeries::new(points.clone(), col.stroke_width(2)))
                    .map_err(e)?
                    .label(s.name.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2)));
                chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, col.filled()))).map_err(e)?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(e)?;
        }};
    }
    match (c.log_x, c.log_y) {
        (true, true) => body!(b.build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())),
        (true, false) => body!(b.build_cartesian_2d((x0..x1).log_scale(), y0..y1)),
        (false, true) => body!(b.build_cartesian_2d(x0..x1, (y0..y1).log_scale())),
        (false, false) => body!(b.build_cartesian_2d(x0..x1, y0..y1)),
    }
    root.present().map_err(e)
}

/// A number for an axis label: no trailing zeros.
fn trim(v: f64) -> String {
    if v != 0.0 && v.abs() < 0.001 {
        return format!("{v:.0e}");
    }
    let s = if v.abs() >= 100.0 { format!("{v:.0}") } else { format!("{v:.3}") };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn draw_bars<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &Bars) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let n = c.stacks.len();
    let top = c.stacks.iter().map(|(s, epoch)| s.iter().map(|x| x.1).sum::<f64>().max(*epoch)).fold(0.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(&c.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..(top * 1.25).max(1e-3))
        .map_err(e)?;
    let labels = c.labels.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n + 1)
        .x_label_formatter(&move |v| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc("seconds per epoch (max over ranks)")
        .draw()
        .map_err(e)?;
    let names: Vec<String> = c.stacks.first().map(|s| s.0.iter().map(|x| x.0.clone()).collect()).unwrap_or_default();
    for (k, name) in names.iter().enumerate() {
        let col = color(k);
        let rects = c.stacks.iter().enumerate().map(|(i, (segs, _))| {
            let below: f64 = segs[..k].iter().map(|x| x.1).sum();
            let x = i as f64;
            Rectangle::new([(x - 0.35, below), (x + 0.35, below + segs[k].1)], col.filled())
        });
        chart
            .draw_series(rects)
            .map_err(e)?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], col.filled()));
    }
    chart
        .draw_series(c.stacks.iter().enumerate().map(|(i, (_, epoch))| {
            PathElement::new(vec![(i as f64 - 0.45, *epoch), (i as f64 + 0.45, *epoch)], BLACK.stroke_width(3))
        }))
        .map_err(e)?
        .label("epoch time")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(3)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

/// Draws a chart as `<name>.png` and `<name>.svg`; returns the paths.
fn save(dir: &Path, name: &str, draw: impl Fn(&Path, bool) -> std::result::Result<(), String>) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for svg in [false, true] {
        let path = dir.join(format!("{name}.{}", if svg { "svg" } else { "png" }));
        draw(&path, svg).map_err(|e| err(&path, e))?;
        written.push(path);
    }
    Ok(written)
}

/// Draws a line chart as `<name>.png` and `<name>.svg` (nothing when it has no points).
pub fn save_lines(dir: &Path, name: &str, chart: &Lines) -> Result<Vec<PathBuf>> {
    if chart.series.iter().all(|s| s.points.is_empty()) {
        return Ok(Vec::new());
    }
    save(dir, name, |path, svg| {
        if svg {
            draw_lines(SVGBackend::new(path, SIZE).into_drawing_area(), chart)
        } else {
            draw_lines(BitMapBackend::new(path, SIZE).into_drawing_area(), chart)
        }
    })
}

/// Draws stacked bars as `<name>.png` and `<name>.svg` (nothing when there are none).
pub fn save_bars(dir: &Path, name: &str, bars: &Bars) -> Result<Vec<PathBuf>> {
    if bars.stacks.is_empty() {
        return Ok(Vec::new());
    }
    save(dir, name, |path, svg| {
        if svg {
            draw_bars(SVGBackend::new(path, SIZE).into_drawing_area(), bars)
        } else {
            draw_bars(BitMapBackend::new(path, SIZE).into_drawing_area(), bars)
        }
    })
}

/// The format the per-format plots use: npy where measured, else the first.
fn main_format(grid: &Grid) -> String {
    if grid.keys().any(|p| p.format == "npy") {
        "npy".into()
    } else {
        grid.keys().next().map_or_else(String::new, |p| p.format.clone())
    }
}

/// The points of the main grid (not the scaling runs) in one format.
fn main_points<'a>(grid: &'a Grid, format: &'a str) -> impl Iterator<Item = (&'a Point, &'a BTreeMap<String, Record>)> {
    grid.iter().filter(move |(p, _)| p.format == format && !p.tag.contains(':'))
}

/// Per loader, points (x, best epoch seconds).
fn per_loader<'a>(
    points: impl Iterator<Item = (&'a Point, &'a BTreeMap<String, Record>)>,
    x: impl Fn(&Point) -> f64,
) -> Vec<Series> {
    let mut by: BTreeMap<usize, Series> = BTreeMap::new();
    for (p, loaders) in points {
        for (name, r) in loaders {
            let k = LOADERS.iter().position(|l| l == name).unwrap_or(LOADERS.len());
            by.entry(k)
                .or_insert_with(|| Series { name: name.clone(), points: Vec::new() })
                .points
                .push((x(p), r.epoch_s_best));
        }
    }
    by.into_values()
        .map(|mut s| {
            s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
            s
        })
        .collect()
}

pub fn draw_all(grid: &Grid, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let format = main_format(grid);
    let most = grid.keys().map(|p| p.ranks).max().unwrap_or(1);
    // Epoch time vs ranks, per loader, one plot per dataset (sample size).
    let mut datasets: BTreeMap<(u64, String), ()> = BTreeMap::new();
    for (p, _) in main_points(grid, &format) {
        datasets.insert((p.sample_bytes, p.tag.clone()), ());
    }
    for (sample_bytes, tag) in datasets.keys() {
        let pts = main_points(grid, &format).filter(|(p, _)| p.sample_bytes == *sample_bytes && &p.tag == tag);
        let chart = Lines {
            title: format!("epoch time vs ranks: {tag} ({sample_bytes} B samples, {format})"),
            x: "ranks",
            y: "best epoch, s",
            log_x: true,
            log_y: true,
            series: per_loader(pts, |p| p.ranks as f64),
        };
        let name =
            if tag.is_empty() { format!("epoch_vs_ranks_{sample_bytes}") } else { format!("epoch_vs_ranks_{tag}") };
        written.extend(save_lines(dir, &name, &chart)?);
    }
    // Time per phase of meshfeed, per dataset and ranks.
    let mut bars =
        Bars { title: format!("meshfeed: time per phase ({format})"), labels: Vec::new(), stacks: Vec::new() };
    for (p, loaders) in main_points(grid, &format) {
        let Some(m) = meshfeed_of(loaders) else { continue };
        let Some(phases) = &m.phase_s else { continue };
        bars.labels.push(format!(
            "{} ×{}",
            if p.tag.is_empty() { p.sample_bytes.to_string() } else { p.tag.clone() },
            p.ranks
        ));
        let order = ["plan", "read", "fill", "exchange", "assemble"];
        // Records written before telemetry schema 6 name the fill phase "pack".
        let seconds = |k: &str| phases.get(k).or_else(|| (k == "fill").then(|| phases.get("pack")).flatten());
        bars.stacks.push((
            order.iter().map(|k| (k.to_string(), seconds(k).copied().unwrap_or(0.0))).collect(),
            m.epoch_s_best,
        ));
    }
    written.extend(save_bars(dir, "phases", &bars)?);
    // Scaling: epoch time vs sample size (at the most ranks), per loader.
    let chart = Lines {
        title: format!("epoch time vs sample size ({most} ranks, {format}; datasets differ in size)"),
        x: "sample bytes",
        y: "best epoch, s per GB",
        log_x: true,
        log_y: true,
        series: per_loader(main_points(grid, &format).filter(|(p, _)| p.ranks == most), |p| p.sample_bytes as f64)
            .into_iter()
            .map(|s| Series { name: s.name, points: s.points })
            .collect(),
    };
    // Per GB, so that datasets of different sizes compare.
    let per_gb = |grid_points: Vec<Series>, bytes: &dyn Fn(f64) -> f64| -> Vec<Series> {
        grid_points
            .into_iter()
            .map(|s| Series { points: s.points.iter().map(|&(x, y)| (x, y / bytes(x))).collect(), name: s.name })
            .collect()
    };
    let dataset_gb: BTreeMap<u64, f64> = main_points(grid, &format)
        .filter(|(p, _)| p.ranks == most)
        .map(|(p, _)| (p.sample_bytes, p.dataset_bytes() as f64 / 1e9))
        .collect();
    let chart = Lines {
        series: per_gb(chart.series, &|x| dataset_gb.get(&(x as u64)).copied().unwrap_or(1.0).max(1e-9)),
        ..chart
    };
    written.extend(save_lines(dir, "scale_sample_size", &chart)?);
    // Scaling: meshfeed's epoch time vs rank count, one line per sample size.
    let mut by_size: BTreeMap<u64, Series> = BTreeMap::new();
    let mut rss: BTreeMap<(String, u64), Series> = BTreeMap::new();
    for (p, loaders) in main_points(grid, &format) {
        if let Some(m) = meshfeed_of(loaders) {
            by_size
                .entry(p.sample_bytes)
                .or_insert_with(|| Series { name: format!("{} B samples", p.sample_bytes), points: Vec::new() })
                .points
                .push((p.ranks as f64, m.epoch_s_best));
        }
        for (name, r) in loaders {
            if (name == "meshfeed" || name == "pytorch") && r.max_rss_bytes > 0 {
                rss.entry((name.clone(), p.sample_bytes))
                    .or_insert_with(|| Series {
                        name: format!("{name}, {} B samples", p.sample_bytes),
                        points: Vec::new(),
                    })
                    .points
                    .push((p.ranks as f64, r.max_rss_bytes as f64 / 1e6));
            }
        }
    }
    let sorted = |m: Vec<Series>| -> Vec<Series> {
        m.into_iter()
            .map(|mut s| {
                s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
                s
            })
            .collect()
    };
    let chart = Lines {
        title: format!("meshfeed: epoch time vs ranks ({format})"),
        x: "ranks",
        y: "best epoch, s",
        log_x: true,
        log_y: true,
        series: sorted(by_size.into_values().collect()),
    };
    written.extend(save_lines(dir, "scale_ranks", &chart)?);
    let chart = Lines {
        title: format!("peak memory per rank ({format})"),
        x: "ranks",
        y: "peak RSS of the largest rank, MB",
        log_x: true,
        log_y: true,
        series: sorted(rss.into_values().collect()),
    };
    written.extend(save_lines(dir, "scale_memory", &chart)?);
    // Scaling runs: dataset size and window budget, at one sample size and rank count.
    let scaling = |vary: fn(&Point) -> f64, x: &'static str, title: &str, name: &str| -> Result<Vec<PathBuf>> {
        // The (sample size, ranks, format) with the most distinct values of the variable.
        let mut groups: BTreeMap<(u64, usize, String), Vec<(&Point, &BTreeMap<String, Record>)>> = BTreeMap::new();
        for (p, l) in grid {
            groups.entry((p.sample_bytes, p.ranks, p.format.clone())).or_default().push((p, l));
        }
        let distinct = |v: &[(&Point, &BTreeMap<String, Record>)]| {
            let mut xs: Vec<u64> = v.iter().map(|(p, _)| vary(p) as u64).collect();
            xs.sort_unstable();
            xs.dedup();
            xs.len()
        };
        let Some(((bytes, ranks, fmt), pts)) = groups.into_iter().max_by_key(|(_, v)| distinct(v)) else {
            return Ok(Vec::new());
        };
        if distinct(&pts) < 2 {
            return Ok(Vec::new());
        }
        // Hold the other variable at its most common value.
        let other = |p: &Point| if x.starts_with("window") { p.samples } else { p.window_bytes };
        let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
        for (p, _) in &pts {
            *counts.entry(other(p)).or_default() += 1;
        }
        let keep = counts.into_iter().max_by_key(|c| c.1).map(|c| c.0).unwrap_or(0);
        let chart = Lines {
            title: format!("{title} ({bytes} B samples, {ranks} ranks, {fmt})"),
            x,
            y: "best epoch, s",
            log_x: true,
            log_y: true,
            series: per_loader(pts.into_iter().filter(|(p, _)| other(p) == keep), vary),
        };
        save_lines(dir, name, &chart)
    };
    written.extend(scaling(
        |p| p.dataset_bytes() as f64 / 1e6,
        "dataset, MB",
        "epoch time vs dataset size",
        "scale_dataset_size",
    )?);
    written.extend(scaling(
        |p| p.window_bytes as f64 / (1u64 << 20) as f64,
        "window budget, MiB",
        "epoch time vs window budget",
        "scale_window",
    )?);
    Ok(written)
}
