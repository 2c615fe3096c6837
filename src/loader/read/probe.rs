//! A short probe of the storage (a few hundred milliseconds): how fast it streams and how
//! many random reads of one sample it serves per second, measured by every rank of a host
//! at once on its own home range, so that the figures are the host's share of a shared
//! device. A region already in the page cache says nothing about the storage: such a rank
//! reports that the data is cached instead.

use std::fs::File;
use std::io::IoSliceMut;
use std::ops::Range;
use std::time::{Duration, Instant};

use super::queue::{self, ReadOp};
use crate::dataset::positional::{advise_dontneed, cached_fraction};
use crate::dataset::Dataset;
use crate::types::SampleId;

/// Sequential reads of this size.
const SEQUENTIAL_READ: usize = 4 << 20;
/// At most this much is streamed.
const SEQUENTIAL_BYTES: u64 = 32 << 20;
/// Random reads made (at most).
const RANDOM_READS: usize = 256;
/// The random reads of one round go into one buffer of at most this size.
const ROUND_BYTES: usize = 8 << 20;
/// Each half of the probe stops after this long.
const PROBE_TIME: Duration = Duration::from_millis(250);

/// What one rank measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Probe {
    pub seq_bytes: u64,
    pub seq_secs: f64,
    pub reads: u64,
    pub read_secs: f64,
    /// The probed region was mostly in the page cache.
    pub cached: bool,
}

impl Probe {
    pub fn to_bytes(self) -> Vec<u8> {
        let mut v = Vec::with_capacity(33);
        v.extend(self.seq_bytes.to_le_bytes());
        v.extend(self.seq_secs.to_le_bytes());
        v.extend(self.reads.to_le_bytes());
        v.extend(self.read_secs.to_le_bytes());
        v.push(self.cached as u8);
        v
    }

    pub fn from_bytes(b: &[u8]) -> Option<Probe> {
        let word = |i: usize| b.get(i * 8..i * 8 + 8).map(|s| <[u8; 8]>::try_from(s).expect("8 bytes"));
        Some(Probe {
            seq_bytes: u64::from_le_bytes(word(0)?),
            seq_secs: f64::from_le_bytes(word(1)?),
            reads: u64::from_le_bytes(word(2)?),
            read_secs: f64::from_le_bytes(word(3)?),
            cached: *b.get(32)? != 0,
        })
    }
}

/// Probes the storage behind this rank's home range `home` with reads of `sample_bytes`
/// (at least 4 KiB) and `depth` reads in flight. Best effort: a file that cannot be read
/// here gives an empty probe (the loader's own reads report it properly).
pub(crate) fn probe(dataset: &Dataset, home: Range<u64>, sample_bytes: u64, depth: usize) -> Probe {
    let Some((file, region)) = region(dataset, home) else { return Probe::default() };
    let Ok(f) = File::open(&dataset.files()[file].path) else { return Probe::default() };
    if cached_fraction(&f, region.clone()) > 0.5 {
        return Probe { cached: true, ..Probe::default() };
    }
    // Sequential, from the region's start.
    let mut buf = vec![0u8; SEQUENTIAL_READ];
    let seq_end = region.end.min(region.start + SEQUENTIAL_BYTES);
    let start = Instant::now();
    let mut at = region.start;
    while at < seq_end && start.elapsed() < PROBE_TIME {
        let n = (seq_end - at).min(SEQUENTIAL_READ as u64) as usize;
        if std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf[..n], at).is_err() {
            break;
        }
        at += n as u64;
    }
    let (seq_bytes, seq_secs) = (at - region.start, start.elapsed().as_secs_f64());
    advise_dontneed(&f, region.start..at);
    drop(buf);
    // Random reads of one sample each, past what was streamed where there is room.
    let size = sample_bytes.clamp(4096, SEQUENTIAL_READ as u64);
    let pool = if region.end.saturating_sub(at) >= 64 * size { at..region.end } else { region.clone() };
    let slots = ((pool.end - pool.start) / size).max(1);
    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ home_seed(dataset, file);
    let offsets: Vec<u64> = (0..RANDOM_READS)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            pool.start + (rng % slots) * size
        })
        .filter(|&o| o + size <= pool.end.max(pool.start + size))
        .collect();
    let start = Instant::now();
    let mut reads = 0u64;
    // In rounds of `depth × 4`, so that a slow device stops the probe in time, all into
    // one round's buffer (at most ROUND_BYTES unless `depth` samples take more: the probe
    // is outside the window budget, and 256 large samples would be hundreds of MB).
    let round = (depth * 4).min((ROUND_BYTES / size as usize).max(depth)).max(1);
    let mut bufs = vec![0u8; size as usize * round.min(offsets.len().max(1))];
    for offsets in offsets.chunks(round) {
        if start.elapsed() >= PROBE_TIME {
            break;
        }
        let ops = offsets
            .iter()
            .zip(bufs.chunks_mut(size as usize))
            .map(|(&offset, dst)| ReadOp { source: 0, file: &f, offset, bufs: vec![IoSliceMut::new(dst)] })
            .collect();
        match queue::run(ops, depth) {
            Ok(_) => reads += offsets.len() as u64,
            Err(_) => break,
        }
    }
    let read_secs = start.elapsed().as_secs_f64();
    for &o in &offsets {
        advise_dontneed(&f, o..o + size);
    }
    Probe { seq_bytes, seq_secs, reads, read_secs, cached: false }
}

/// The file holding most of `home`, and the byte range of its home rows: the span of the
/// largest field's values where the format stores them in place (the one a sample's read
/// is mostly made of: in HDF5 and Arrow each field has its own region), else a share of
/// the file proportional to the rows.
fn region(dataset: &Dataset, home: Range<u64>) -> Option<(usize, Range<u64>)> {
    if home.is_empty() {
        return None;
    }
    let (first, _) = dataset.locate(SampleId(home.start));
    let (last, _) = dataset.locate(SampleId(home.end - 1));
    let overlap =
        |f: usize| home.end.min(dataset.file_start(f + 1)).saturating_sub(home.start.max(dataset.file_start(f)));
    let file = (first..=last).max_by_key(|&f| overlap(f))?;
    let (start, end) = (dataset.file_start(file), dataset.file_start(file + 1));
    let rows = home.start.max(start) - start..home.end.min(end) - start;
    let info = &dataset.files()[file];
    let largest = (0..dataset.fields().len()).max_by_key(|&f| dataset.fields()[f].fixed_bytes().unwrap_or(0))?;
    let in_place = dataset.open_reader(file).ok().and_then(|r| {
        let a = r.value_range(rows.start, largest)?;
        let b = r.value_range(rows.end - 1, largest)?;
        Some(a.start..b.end)
    });
    let total = (end - start).max(1);
    Some((file, in_place.unwrap_or(info.bytes * rows.start / total..info.bytes * rows.end / total)))
}

/// A seed that differs between the ranks' regions.
fn home_seed(dataset: &Dataset, file: usize) -> u64 {
    (file as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D) ^ dataset.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{gen, DType, Field, Format};

    #[test]
    fn probes_round_trip_and_measure_a_home_range() {
        let p = Probe { seq_bytes: 7, seq_secs: 0.5, reads: 3, read_secs: 0.25, cached: true };
        assert_eq!(Probe::from_bytes(&p.to_bytes()), Some(p));
        let (dir, _) =
            gen::GenSpec::write_temp(Format::Npy, 2048, 2, 4, vec![Field::tensor("x", DType::U8, vec![8192])]);
        let ds = Dataset::open_local(&[dir.path().into()], Default::default()).unwrap();
        // Rows 100..1500: most of them in the first file (rows 0..1024).
        let (file, r) = region(&ds, 100..1500).unwrap();
        assert_eq!(file, 0);
        assert_eq!(r.end - r.start, 924 * 8192);
        // Just written: the pages are cached, and the probe says so.
        let f = File::open(&ds.files()[0].path).unwrap();
        advise_dontneed(&f, 0..u64::MAX / 2);
        let cold = cached_fraction(&f, r.clone());
        let p = probe(&ds, 100..1500, 8192, 4);
        // Whatever the machine, a cold region is measured and a warm one is not.
        if cold < 0.5 {
            assert!(!p.cached && p.seq_bytes > 0 && p.reads > 0, "{p:?}");
        }
        let _ = std::fs::read(&ds.files()[0].path).unwrap();
        assert!(cached_fraction(&f, r) > 0.9);
        assert!(probe(&ds, 100..1500, 8192, 4).cached);
    }

    /// HDF5 and Arrow keep each field in a region of its own: the probe reads the largest
    /// field's (it once read the 8-byte labels' 2 KiB and measured no storage at all).
    #[test]
    fn the_probed_region_is_the_largest_fields() {
        for format in [Format::Hdf5, Format::Arrow] {
            let fields = vec![Field::tensor("label", DType::I64, vec![]), Field::tensor("x", DType::U8, vec![8192])];
            let (dir, _) = gen::GenSpec::write_temp(format, 2048, 2, 64, fields);
            let ds = Dataset::open_local(&[dir.path().into()], Default::default()).unwrap();
            let (file, r) = region(&ds, 100..1500).unwrap();
            assert_eq!(file, 0, "{format:?}");
            let span = r.end - r.start;
            // Arrow's span holds the batches' other buffers too.
            assert!((924 * 8192..924 * 8192 + 924 * 64).contains(&span), "{format:?}: {span}");
        }
    }
}
