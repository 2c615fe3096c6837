//! The passes strategy ([`crate::plan::io`]): when a rank's home range does not fit its
//! memory budget, each epoch streams it several times, each pass keeping only the rows
//! the next stretch of windows needs. The epoch's order is known ahead (the home index
//! inverts the permutation), so a pass knows its rows before it reads anything, and every
//! read is a large sequential one.
//!
//! A pass covers the windows from the one that needs it to a K-th of the epoch further on
//! (a seek starts a new pass where it lands). A row a window needs that its pass does not
//! hold — the few a padded last batch takes from the start of the epoch — is read on its
//! own.
//!
//! With a spill directory, the home range is streamed once to the spill file and the
//! passes stream that file instead of the shared storage ([`fill_spilled`]), once it holds
//! the whole range; until then the windows read their spilled rows one by one.

use std::ops::Range;
use std::os::unix::fs::FileExt;

use arrow_buffer::Buffer;

use super::store::StoreView;
use crate::dataset::RowLayout;
use crate::dataset::{Dataset, FileReader, RowChunk};
use crate::error::{Error, Result};
use crate::plan::io::Tier;
use crate::plan::io::STREAM_READ_BYTES;
use crate::types::SampleId;

/// The rows one pass keeps.
pub(crate) struct PassBuffer {
    pub epoch: u64,
    /// Steps of the epoch the pass serves.
    pub steps: Range<u64>,
    /// Which ids are kept, and where.
    kept: Kept,
    rows: Rows,
}

/// The ids a pass keeps and the position of each among them: one bit per id of the span
/// from the first to the last kept id, and the number of kept ids before each 64-bit
/// word, so that finding a kept row is a word load and a popcount. Every value filled in
/// from a pass is found here (a binary search over the half a million ids of a 256-byte
/// sample pass cost about a microsecond a sample); 2 bits per id of the span.
struct Kept {
    start: u64,
    words: Vec<u64>,
    before: Vec<usize>,
}

impl Kept {
    /// The index of `ids` (sorted, unique).
    fn new(ids: &[u64]) -> Kept {
        let start = ids.first().copied().unwrap_or(0);
        let span = ids.last().map_or(0, |&last| last - start + 1);
        let mut words = vec![0u64; span.div_ceil(64) as usize];
        for &id in ids {
            let at = id - start;
            words[(at / 64) as usize] |= 1 << (at % 64);
        }
        let before = words
            .iter()
            .scan(0usize, |n, w| {
                let here = *n;
                *n += w.count_ones() as usize;
                Some(here)
            })
            .collect();
        Kept { start, words, before }
    }

    /// The position of `id` among the kept ids, if it is kept.
    fn position(&self, id: u64) -> Option<usize> {
        let at = id.checked_sub(self.start)?;
        let (word, bit) = ((at / 64) as usize, at % 64);
        let w = *self.words.get(word)?;
        (w >> bit & 1 == 1).then(|| self.before[word] + (w & ((1u64 << bit) - 1)).count_ones() as usize)
    }
}

enum Rows {
    /// One record per kept id (fixed-size fields).
    Records { layout: RowLayout, bytes: Vec<u8> },
    /// Values as read (variable-length fields).
    Values(RowChunk),
}

impl PassBuffer {
    /// Whether the pass serves step `step` of `epoch`.
    pub fn covers(&self, epoch: u64, step: u64) -> bool {
        self.epoch == epoch && self.steps.contains(&step)
    }

    /// Whether the pass holds sample `id`.
    pub fn holds(&self, id: SampleId) -> bool {
        self.kept.position(id.0).is_some()
    }

    /// The value of `field` of sample `id`, if the pass holds it.
    pub fn value(&self, id: SampleId, field: usize) -> Option<&[u8]> {
        let i = self.kept.position(id.0)?;
        Some(match &self.rows {
            Rows::Records { layout, bytes } => &bytes[i * layout.record..][layout.fields[field].clone()],
            Rows::Values(chunk) => chunk.value(i, field),
        })
    }

    /// Bytes the pass holds.
    pub fn bytes(&self) -> usize {
        match &self.rows {
            Rows::Records { bytes, .. } => bytes.len(),
            Rows::Values(c) => c.bytes_read() as usize,
        }
    }
}

/// Streams the home rows `ids` (sorted; repeats are kept once) need, file by file, in reads of about
/// [`STREAM_READ_BYTES`] (gaps shorter than a read are read through, longer ones skipped),
/// keeping exactly those rows. `open` gives a reader of a file. Returns the pass and the
/// bytes read.
pub(crate) fn fill(
    dataset: &Dataset,
    epoch: u64,
    steps: Range<u64>,
    mut ids: Vec<u64>,
    open: &mut dyn FnMut(usize) -> Result<Box<dyn FileReader>>,
) -> Result<(PassBuffer, u64)> {
    ids.dedup();
    let fields = dataset.fields().len();
    let sizes = crate::plan::budget::value_sizes(dataset.fields(), &dataset.mean_value_bytes());
    let rows_per_read = (STREAM_READ_BYTES / crate::plan::budget::sample_bytes(&sizes).max(1)).max(1);
    let layout = RowLayout::of(dataset.fields());
    let mut records = Vec::with_capacity(layout.as_ref().map_or(0, |l| l.record * ids.len()));
    let mut values = Vec::new();
    let mut locs: Vec<(usize, usize)> = Vec::new();
    let mut bytes_read = 0u64;
    let mut i = 0;
    while i < ids.len() {
        let (file, _) = dataset.locate(SampleId(ids[i]));
        let start = dataset.file_start(file);
        let end = dataset.file_start(file + 1);
        let mut reader = open(file)?;
        // A pass streams more than memory holds: what it brings into the page cache would
        // be gone before the next pass wants it, so it leaves behind the stream (pages
        // cached before stay).
        let last_needed = ids[i..].partition_point(|&id| id < end) + i - 1;
        let cold = super::store::stream_is_cold(&*reader, ids[i] - start..ids[last_needed] - start + 1);
        // The pages behind the stream leave the page cache one read late: a read's last
        // pages hold the start of the next one's (an Arrow record batch's other columns, a
        // page two rows share), and dropping them at once had the next read bring them in
        // again (Arrow passes read 1.23× the bytes they asked for, npy 1.05×). Rows from
        // `kept` on are still cached.
        let (mut kept, mut read_to) = (ids[i] - start, ids[i] - start);
        while i < ids.len() && ids[i] < end {
            // A read from the next needed row, as long as a streaming read and no further
            // than the last row needed of this file (past it lie other ranks' rows).
            let first = ids[i] - start;
            let last = (first + rows_per_read).min(ids[last_needed] - start + 1);
            let list: Vec<u64> = (first..last).collect();
            let chunk = reader.read_rows(&list)?;
            if cold {
                super::store::drop_behind(&*reader, kept..first);
                (kept, read_to) = (first, last);
            }
            if chunk.rows() != list.len() {
                return Err(Error::file(
                    &dataset.files()[file].path,
                    format!("reader returned {} of {} rows", chunk.rows(), list.len()),
                ));
            }
            bytes_read += chunk.bytes_read();
            while i < ids.len() && ids[i] < start + last {
                let row = (ids[i] - start - first) as usize;
                match &layout {
                    Some(l) => {
                        for f in 0..fields {
                            let v = chunk.value(row, f);
                            debug_assert_eq!(v.len(), l.fields[f].len());
                            records.extend_from_slice(v);
                        }
                    }
                    None => {
                        for f in 0..fields {
                            let v = chunk.value(row, f);
                            locs.push((values.len(), v.len()));
                            values.extend_from_slice(v);
                        }
                    }
                }
                i += 1;
            }
        }
        if cold {
            super::store::drop_behind(&*reader, kept..read_to);
        }
    }
    let rows = match layout {
        Some(layout) => Rows::Records { layout, bytes: records },
        None => {
            let mut chunk = RowChunk::new(fields);
            let b = chunk.add_buffer(Buffer::from_vec(values));
            for (offset, len) in locs {
                chunk.push_value(b, offset, len);
            }
            Rows::Values(chunk)
        }
    };
    Ok((PassBuffer { epoch, steps, kept: Kept::new(&ids), rows }, bytes_read))
}

/// A pass over this rank's spill file: keeps the spilled home rows of `ids` (sorted; ids
/// kept in memory are left out) for `steps` of `epoch`, reading the file in reads of about
/// [`STREAM_READ_BYTES`] from each next needed row. `home_start` is the first id of the
/// home range. Returns the pass and the bytes read.
pub(crate) fn fill_spilled(
    view: &StoreView,
    home_start: u64,
    epoch: u64,
    steps: Range<u64>,
    mut ids: Vec<u64>,
) -> Result<(PassBuffer, u64)> {
    let (Some(layout), Some(file)) = (view.layout.clone(), view.spill.as_deref()) else {
        return Err(Error::Internal("a pass over the spill file of a store without one".into()));
    };
    ids.dedup();
    ids.retain(|&id| view.tier(id - home_start) == Tier::Spill);
    let record = layout.record as u64;
    let rows_per_read = (STREAM_READ_BYTES / record.max(1)).max(1);
    let mut records = Vec::with_capacity(ids.len() * layout.record);
    let mut buf = Vec::new();
    let mut bytes_read = 0u64;
    let mut i = 0;
    while i < ids.len() {
        // Rows of the spill file, from the next needed one, as long as a streaming read
        // and no further than the last needed.
        let first = ids[i] - home_start - view.resident;
        let last = (first + rows_per_read).min(ids[ids.len() - 1] - home_start - view.resident + 1);
        let span = first * record..last * record;
        buf.resize((span.end - span.start) as usize, 0);
        file.read_exact_at(&mut buf, span.start).map_err(|e| Error::Io { path: "(spill file)".into(), source: e })?;
        // The pass holds the rows now; the file's pages would only crowd the page cache.
        crate::dataset::positional::advise_dontneed(file, span.clone());
        bytes_read += span.end - span.start;
        while i < ids.len() && ids[i] - home_start - view.resident < last {
            let at = ((ids[i] - home_start - view.resident - first) * record) as usize;
            records.extend_from_slice(&buf[at..at + layout.record]);
            i += 1;
        }
    }
    let rows = Rows::Records { layout, bytes: records };
    Ok((PassBuffer { epoch, steps, kept: Kept::new(&ids), rows }, bytes_read))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{gen, DType, Field, FieldKind, Format};

    #[test]
    fn kept_ids_are_found_at_their_position() {
        for ids in [vec![], vec![5], vec![0, 63, 64, 65, 127, 128, 1000], (300..700).step_by(3).collect::<Vec<u64>>()] {
            let kept = Kept::new(&ids);
            for id in 0..1100u64 {
                assert_eq!(kept.position(id), ids.iter().position(|&x| x == id), "{id} in {ids:?}");
            }
            assert_eq!(kept.position(u64::MAX), None);
        }
    }

    #[test]
    fn a_pass_keeps_exactly_the_rows_asked_for() {
        for (format, fields) in [
            (Format::Npy, vec![Field::tensor("x", DType::U16, vec![3]), Field::tensor("y", DType::I64, vec![])]),
            (Format::Arrow, vec![Field { name: "t".into(), kind: FieldKind::Bytes { utf8: false, elem: None } }]),
        ] {
            let (dir, _) = gen::GenSpec::write_temp(format, 200, 3, 9, fields);
            let ds = Dataset::open_local(&[dir.path().into()], Default::default()).unwrap();
            let ids: Vec<u64> = (20..180).filter(|i| i % 3 != 0).collect();
            let (pass, bytes) = fill(&ds, 4, 10..20, ids.clone(), &mut |f| ds.open_reader(f)).unwrap();
            assert!(pass.covers(4, 10) && pass.covers(4, 19) && !pass.covers(4, 20) && !pass.covers(3, 10));
            assert!(bytes > 0);
            if format == Format::Npy {
                // 14 bytes a row, each file from its first row needed to its last: rows
                // 20..66 (row 66 is not needed), 67..134 and 134..180 (the file goes on
                // to row 200).
                assert_eq!(bytes, (46 + 67 + 46) * 14);
            }
            for id in 0..200u64 {
                let (file, row) = ds.locate(SampleId(id));
                let want = ds.open_reader(file).unwrap().read_rows(&[row]).unwrap();
                for f in 0..ds.fields().len() {
                    let got = pass.value(SampleId(id), f);
                    assert_eq!(pass.holds(SampleId(id)), ids.contains(&id));
                    if ids.contains(&id) {
                        assert_eq!(got, Some(want.value(0, f)), "{format:?} id {id}");
                    } else {
                        assert_eq!(got, None, "{format:?} id {id} is not kept");
                    }
                }
            }
        }
    }

    /// A pass over the spill file keeps exactly the spilled rows asked for (not those in
    /// memory), reading the file from the first needed row to the last.
    #[test]
    fn a_pass_over_the_spill_file_keeps_the_spilled_rows_asked_for() {
        let fields = vec![Field::tensor("x", DType::U16, vec![3]), Field::tensor("y", DType::I64, vec![])];
        let (dir, _) = gen::GenSpec::write_temp(Format::Npy, 200, 3, 9, fields);
        let ds = std::sync::Arc::new(Dataset::open_local(&[dir.path().into()], Default::default()).unwrap());
        let spill = tempfile::tempdir().unwrap();
        // Home rows 50..190: 30 in memory, 110 spilled (across the files' ends).
        let store = super::super::store::HomeStore::start(ds.clone(), 50..190, 30, Some(spill.path())).unwrap();
        store.wait_for(140).unwrap();
        assert!(store.is_filled());
        let ids: Vec<u64> = (50..190).filter(|i| i % 4 != 1).collect();
        let (pass, bytes) = fill_spilled(&store.view(), 50, 2, 0..5, ids.clone()).unwrap();
        assert!(pass.covers(2, 4) && !pass.covers(2, 5));
        // 14 bytes a record, from the first spilled id asked for (80) to the last (188).
        assert_eq!(bytes, (188 - 80 + 1) * 14);
        for id in 0..200u64 {
            let spilled_and_asked = (80..190).contains(&id) && ids.contains(&id);
            assert_eq!(pass.holds(SampleId(id)), spilled_and_asked, "id {id}");
            if spilled_and_asked {
                let (file, row) = ds.locate(SampleId(id));
                let want = ds.open_reader(file).unwrap().read_rows(&[row]).unwrap();
                for f in 0..2 {
                    assert_eq!(pass.value(SampleId(id), f), Some(want.value(0, f)), "id {id} field {f}");
                }
            }
        }
    }
}
