//! The machine's limits for the job at hand: how fast the bytes a loader must move could
//! move at best, each measured alone.
//!
//! * `read-limit`: each rank reads its home range's share of every file's bytes with large
//!   sequential `pread`s (page cache warm after an untimed pass).
//! * `exchange-limit`: one epoch of meshfeed's loader (the job's exchange) is run first;
//!   its metrics record, per window, the bytes this rank sent to each rank
//!   (`Metrics::window_sends`). Those exact counts are then replayed window by window
//!   through the transport's bare `all_to_all_v` (rsmpi's `MPI_Alltoallv` under MPI), from
//!   send buffers filled before the clock starts.
//! * `memcpy-limit`: each rank copies the bytes delivered to it in that epoch, in
//!   window-sized chunks, between buffers larger than the caches (memory bandwidth, one
//!   copy: every delivered byte is copied at least once, into its batch, whether it
//!   crossed the exchange or was read where it is delivered).

use std::os::unix::fs::FileExt;

use meshfeed::config::Job;
use meshfeed::dataset::Dataset;
use meshfeed::plan::HomeRanges;
use meshfeed::transport::{agree, ReduceOp, Transport};
use meshfeed::types::Rank;
use meshfeed::{Error, Result};

use super::loader::{bytes_needed, run_epoch, warm_loader};
use super::record::{sum_u64, Record, Setting};
use super::timed_max;

/// Bytes per `pread` of the read limit.
const READ_CHUNK: usize = 8 << 20;

/// At most this much memory per buffer of the memcpy limit: beyond the caches, so that the
/// copy streams from memory as a loader's copies do.
const MEMCPY_SPAN: u64 = 256 << 20;

/// The byte ranges of the files that hold rank `r`'s home range: per file, the home rows'
/// share of the file's bytes (exact for npy and raw up to the header; for HDF5 and Arrow,
/// whose columns lie apart, the same number of bytes at the proportional place).
fn home_byte_ranges(dataset: &Dataset, home: std::ops::Range<u64>) -> Vec<(usize, u64, u64)> {
    let mut ranges = Vec::new();
    for (i, f) in dataset.files().iter().enumerate() {
        let (start, end) = (dataset.file_start(i), dataset.file_start(i + 1));
        let (lo, hi) = (home.start.max(start), home.end.min(end));
        if lo >= hi || f.samples == 0 {
            continue;
        }
        let at = |row: u64| (f.bytes as u128 * (row - start) as u128 / f.samples as u128) as u64;
        ranges.push((i, at(lo), at(hi)));
    }
    ranges
}

/// Reads the ranges, returns the bytes read.
fn read_ranges(dataset: &Dataset, ranges: &[(usize, u64, u64)], buf: &mut [u8]) -> Result<u64> {
    let mut total = 0;
    for &(i, from, to) in ranges {
        let path = &dataset.files()[i].path;
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let mut at = from;
        while at < to {
            let n = (to - at).min(buf.len() as u64) as usize;
            file.read_exact_at(&mut buf[..n], at).map_err(|e| Error::io(path, e))?;
            at += n as u64;
            total += n as u64;
        }
    }
    Ok(total)
}

pub fn read(t: &dyn Transport, dataset: &Dataset, job: &Job, setting: &Setting) -> Result<Record> {
    let home = HomeRanges::new(dataset.len(), t.size()).range(Rank(t.rank().0));
    let ranges = home_byte_ranges(dataset, home.clone());
    let mut buf = vec![0u8; READ_CHUNK];
    // One untimed pass warms the page cache (as the loaders' warm-up epoch does).
    agree(t, read_ranges(dataset, &ranges, &mut buf))?;
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..job.epochs.max(1) {
        let (s, b) = timed_max(t, || read_ranges(dataset, &ranges, &mut buf))?;
        times.push(s);
        bytes = b;
    }
    let [bytes, home_rows] = sum_u64(t, [bytes, home.end - home.start])?;
    let mut row = setting.record("read-limit", &times, home_rows);
    row.delivered_bytes = bytes;
    row.bytes_read = Some(bytes);
    row.bytes_needed = home_rows * setting.sample_bytes;
    row.gb_per_s = bytes as f64 / 1e9 / row.epoch_s_best.max(1e-9);
    Ok(row)
}

/// One epoch of the loader, as the exchange and memcpy limits replay it.
pub struct Reference {
    /// Per window, the bytes this rank sent to each rank.
    window_sends: Vec<Vec<usize>>,
    /// Bytes this rank received in the epoch.
    received: u64,
    /// Bytes delivered to this rank in the epoch.
    delivered: u64,
    windows: u64,
    /// All ranks' bytes sent, as the loader's metrics counted them.
    loader_bytes_sent: u64,
    steps: u64,
    rows: u64,
    bytes_needed: u64,
}

impl Reference {
    /// Runs one epoch (after a warm-up) of the job's loader and keeps what it exchanged.
    pub fn record(t: &dyn Transport, dataset: &Dataset, job: &Job, setting: &Setting) -> Result<Reference> {
        let mut loader = agree(t, warm_loader(t, dataset, job, None))?;
        loader.keep_window_sends(true);
        let delivered = run_epoch(&mut loader, 1, 0.0)?;
        let m = loader.take_metrics();
        let [loader_bytes_sent] = sum_u64(t, [m.bytes_sent])?;
        let steps = loader.steps_per_epoch();
        Ok(Reference {
            received: m.bytes_received,
            delivered,
            windows: m.windows,
            window_sends: m.window_sends,
            loader_bytes_sent,
            steps,
            rows: loader.rows_in_steps(0..steps),
            bytes_needed: bytes_needed(setting, &loader),
        })
    }
}

pub fn exchange(t: &dyn Transport, reference: &Reference, job: &Job, setting: &Setting) -> Result<Record> {
    // The same number of windows on every rank, or the replay would hang.
    let mut windows = [reference.window_sends.len() as u64, reference.window_sends.len() as u64];
    t.all_reduce_u64(&mut windows[..1], ReduceOp::Min)?;
    t.all_reduce_u64(&mut windows[1..], ReduceOp::Max)?;
    if windows[0] != windows[1] {
        return Err(Error::Internal(format!(
            "exchange-limit: ranks recorded {}..{} windows of sends in one epoch",
            windows[0], windows[1]
        )));
    }
    let fill = (t.rank().0 % 251) as u8 + 1;
    let mut times = Vec::new();
    let mut moved = 0u64;
    for _ in 0..job.epochs.max(1) + 1 {
        // Send buffers filled (touched) before the clock starts: only the exchange is timed.
        let sends: Vec<Vec<u8>> =
            reference.window_sends.iter().map(|counts| vec![fill; counts.iter().sum::<usize>()]).collect();
        let (s, bytes) = timed_max(t, || {
            let mut bytes = 0u64;
            for (send, counts) in sends.into_iter().zip(&reference.window_sends) {
                bytes += send.len() as u64;
                let (recv, _) = t.all_to_all_v(send, counts)?;
                std::hint::black_box(&recv);
            }
            Ok(bytes)
        })?;
        times.push(s);
        moved = bytes;
    }
    times.remove(0); // the first replay warms the connections and the allocator
    let [moved] = sum_u64(t, [moved])?;
    if moved != reference.loader_bytes_sent {
        return Err(Error::Internal(format!(
            "exchange-limit: the replay moved {moved} bytes, the loader's epoch {}",
            reference.loader_bytes_sent
        )));
    }
    let mut row = setting.record("exchange-limit", &times, reference.rows);
    row.steps_per_epoch = reference.steps;
    row.delivered_bytes = moved;
    row.total_sent = moved;
    row.bytes_needed = reference.bytes_needed;
    row.gb_per_s = moved as f64 / 1e9 / row.epoch_s_best.max(1e-9);
    row.exchange_s = row.epoch_s;
    row.exchange_gb_per_s = row.gb_per_s;
    let mut most = [reference.window_sends.iter().flatten().sum::<usize>() as u64, reference.received];
    t.all_reduce_u64(&mut most, ReduceOp::Max)?;
    row.max_sent_per_rank = most[0];
    row.max_received_per_rank = most[1];
    Ok(row)
}

pub fn memcpy(t: &dyn Transport, reference: &Reference, job: &Job, setting: &Setting) -> Result<Record> {
    let total = reference.delivered;
    let chunk = total.div_ceil(reference.windows.max(1)).max(1);
    let span = total.clamp(1, MEMCPY_SPAN.max(chunk)) as usize;
    let src = vec![1u8; span];
    let mut dst = vec![2u8; span];
    let copy_all = |dst: &mut [u8]| -> Result<u64> {
        let (mut done, mut at) = (0u64, 0usize);
        while done < total {
            let n = (total - done).min(chunk) as usize;
            if at + n > span {
                at = 0;
            }
            let n = n.min(span);
            dst[at..at + n].copy_from_slice(&src[at..at + n]);
            std::hint::black_box(&dst[at]);
            at += n;
            done += n as u64;
        }
        Ok(done)
    };
    copy_all(&mut dst)?;
    let mut times = Vec::new();
    let mut copied = 0;
    for _ in 0..job.epochs.max(1) {
        let (s, b) = timed_max(t, || copy_all(&mut dst))?;
        times.push(s);
        copied = b;
    }
    let [copied] = sum_u64(t, [copied])?;
    let mut row = setting.record("memcpy-limit", &times, reference.rows);
    row.steps_per_epoch = reference.steps;
    row.delivered_bytes = copied;
    row.bytes_needed = reference.bytes_needed;
    row.gb_per_s = copied as f64 / 1e9 / row.epoch_s_best.max(1e-9);
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshfeed::dataset::{gen, DType, Field, Format};

    #[test]
    fn home_byte_ranges_cover_each_file_once_across_ranks() {
        let dir = tempfile::tempdir().unwrap();
        let spec = gen::GenSpec {
            format: Format::Npy,
            samples: 103,
            files: 3,
            out: dir.path().into(),
            arrow_batch_rows: 16,
            fields: vec![Field::tensor("x", DType::U8, vec![100])],
        };
        for i in 0..3 {
            gen::write_file(&spec, i).unwrap();
        }
        let ds = Dataset::open_local(&[dir.path().into()], Default::default()).unwrap();
        for p in [1, 2, 4, 7] {
            let home = HomeRanges::new(ds.len(), p);
            let mut per_file = vec![0u64; 3];
            for r in 0..p {
                for (i, from, to) in home_byte_ranges(&ds, home.range(Rank(r))) {
                    per_file[i] += to - from;
                }
            }
            let sizes: Vec<u64> = ds.files().iter().map(|f| f.bytes).collect();
            assert_eq!(per_file, sizes, "{p} ranks");
        }
    }
}
