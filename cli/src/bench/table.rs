//! The table `meshfeed bench` prints on rank 0: one row per mode, ratios against the first.

use meshfeed::config::Job;
use meshfeed::loader::Phase;

use super::record::Record;

pub fn print(job: &Job, samples: u64, results: &[Record]) {
    let base = &results[0];
    out!(
        "bench: {} ranks, mesh {}, batch {}, window {:.1} MB, prefetch {}, {} timed epoch(s) per row, {} samples; ratios against {} {}",
        base.ranks,
        job.loader.layout.mesh.as_ref().map_or_else(|| "data parallel".to_string(), |m| m.to_string()),
        job.loader.batch_size,
        job.loader.window_bytes as f64 / 1e6,
        job.loader.prefetch,
        base.epochs,
        samples,
        base.transport,
        base.mode
    );
    out!(
        "{:<10} {:<15} {:>9} {:>9} {:>12} {:>9} {:>11} {:>10} {:>14} {:>14} {:>10} {:>8} {:>8}",
        "transport",
        "mode",
        "epoch s",
        "best s",
        "samples/s",
        "GB/s",
        "exchange s",
        "xchg GB/s",
        "max sent/rank",
        "max recv/rank",
        "peak RSS",
        "time ×",
        "xchg ×"
    );
    for r in results {
        out!(
            "{:<10} {:<15} {:>9.4} {:>9.4} {:>12.0} {:>9.2} {:>11.4} {:>10.2} {:>11.1} MB {:>11.1} MB {:>7.0} MB {:>8.2} {:>8}",
            r.transport,
            r.mode,
            r.epoch_s,
            r.epoch_s_best,
            r.samples_per_s,
            r.gb_per_s,
            r.exchange_s,
            r.exchange_gb_per_s,
            r.max_sent_per_rank as f64 / 1e6,
            r.max_received_per_rank as f64 / 1e6,
            r.max_rss_bytes as f64 / 1e6,
            r.epoch_s / base.epoch_s.max(1e-12),
            if base.exchange_s > 0.0 && r.exchange_s > 0.0 {
                format!("{:.2}", r.exchange_s / base.exchange_s)
            } else {
                "-".into()
            }
        );
    }
    for r in results {
        if let (Some(phases), Some(read)) = (&r.phase_s, r.bytes_read) {
            let text: Vec<String> = Phase::ALL
                .iter()
                .map(|p| format!("{} {:.3}s", p.name(), phases.get(p.name()).copied().unwrap_or(0.0)))
                .collect();
            out!(
                "phases {} {}: {} (max over ranks, per epoch); read {:.1} MB for {:.1} MB needed ({:.2}×); copies per delivered byte: {}",
                r.transport,
                r.mode,
                text.join(", "),
                read as f64 / 1e6,
                r.bytes_needed as f64 / 1e6,
                read as f64 / r.bytes_needed.max(1) as f64,
                r.bytes_copied.map_or("n/a".into(), |c| format!(
                    "{:.2}",
                    c as f64 / r.delivered_bytes.max(1) as f64
                ))
            );
        }
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
    if let Some(r) = results.iter().find(|r| r.delivers_batches()) {
        out!("every loader delivered {:.1} MB per epoch in total", r.delivered_bytes as f64 / 1e6);
    }
}
