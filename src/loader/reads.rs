//! Reading a window's samples from this rank's home range: open readers, the optional
//! home-range cache, and the [`ReadSet`] that packing copies values out of.

use std::collections::HashMap;
use std::sync::Arc;

use super::exchange::ValueSource;
use super::metrics::Metrics;
use super::stream::Stream;
use crate::dataset::RowChunk;
use crate::error::{Error, Result};
use crate::types::SampleId;

/// The readers a producer keeps open, and the home-range cache.
#[derive(Default)]
pub(crate) struct Reads {
    readers: HashMap<usize, Box<dyn crate::dataset::FileReader>>,
    /// With the home-range cache: per file, this rank's home rows of it, once read.
    cache: HashMap<usize, Arc<RowChunk>>,
}

impl Reads {
    /// Reads the values of `ids` (sorted, all in this rank's home range).
    pub fn read(&mut self, stream: &Stream, ids: &[SampleId], metrics: &mut Metrics) -> Result<ReadSet> {
        let dataset = &stream.dataset;
        let mut chunks = Vec::new();
        let mut starts = Vec::new();
        let mut i = 0;
        while i < ids.len() {
            let (file, _) = dataset.locate(ids[i]);
            let end_id = dataset.file_start(file + 1);
            let j = i + ids[i..].partition_point(|id| id.0 < end_id);
            let file_start = dataset.file_start(file);
            starts.push(i);
            if stream.cache_home_range {
                // Serve from (or fill) the cache of this file's home rows.
                let home = stream.home.range(stream.rank);
                let first = home.start.max(file_start);
                if !self.cache.contains_key(&file) {
                    let rows: Vec<u64> = (first..home.end.min(end_id)).map(|id| id - file_start).collect();
                    let chunk = self.read_file_rows(stream, file, &rows, metrics)?;
                    self.cache.insert(file, Arc::new(chunk));
                }
                chunks.push(ReadChunk { chunk: self.cache[&file].clone(), first_id: Some(first) });
            } else {
                let rows: Vec<u64> = ids[i..j].iter().map(|id| id.0 - file_start).collect();
                let chunk = self.read_file_rows(stream, file, &rows, metrics)?;
                chunks.push(ReadChunk { chunk: Arc::new(chunk), first_id: None });
            }
            i = j;
        }
        Ok(ReadSet { ids: ids.to_vec(), starts, chunks })
    }

    /// Reads rows (sorted, local to the file) of file `file`.
    fn read_file_rows(
        &mut self,
        stream: &Stream,
        file: usize,
        rows: &[u64],
        metrics: &mut Metrics,
    ) -> Result<RowChunk> {
        let reader = match self.readers.entry(file) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(stream.dataset.open_reader(file)?),
        };
        let chunk = reader.read_rows(rows)?;
        if chunk.rows() != rows.len() {
            return Err(Error::file(
                &stream.dataset.files()[file].path,
                format!("reader returned {} of {} rows", chunk.rows(), rows.len()),
            ));
        }
        metrics.bytes_read += chunk.bytes_read();
        Ok(chunk)
    }
}

/// Values read for one window: chunk `k` holds the values of `ids[starts[k]..]`.
pub(crate) struct ReadSet {
    ids: Vec<SampleId>,
    starts: Vec<usize>,
    chunks: Vec<ReadChunk>,
}

/// Rows read for a window: exactly the ids asked for, or (from the home-range cache) all
/// home rows of a file starting at global id `first_id`.
struct ReadChunk {
    chunk: Arc<RowChunk>,
    first_id: Option<u64>,
}

impl ReadSet {
    /// The bytes of one value of a sample that was read.
    pub fn value(&self, id: SampleId, field: usize) -> &[u8] {
        let i = self.ids.binary_search(&id).expect("planned reads cover every sent id");
        let k = self.starts.partition_point(|&s| s <= i) - 1;
        let c = &self.chunks[k];
        match c.first_id {
            Some(first) => c.chunk.value((id.0 - first) as usize, field),
            None => c.chunk.value(i - self.starts[k], field),
        }
    }
}

/// Values for packing straight from the rows this rank read: window row `row` is sample
/// `ids[row]`.
pub(crate) struct FromReads<'a> {
    pub ids: &'a [SampleId],
    pub read: &'a ReadSet,
}

impl ValueSource for FromReads<'_> {
    fn value(&self, row: usize, field: usize) -> &[u8] {
        self.read.value(self.ids[row], field)
    }
}
