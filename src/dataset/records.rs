//! Files of fixed-size records after a header (`.npy` and `.raw`): their layout and reader.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use arrow_buffer::Buffer;

use super::positional::{coalesce, Positional, RECORD_GAP_BYTES};
use super::reader::FileReader;
use super::rows::RowChunk;
use crate::error::{Error, Result};

/// Where the records of a `.npy` or `.raw` file are and what they hold.
#[derive(Debug)]
pub struct RecordLayout {
    pub samples: u64,
    /// Byte offset of the first record.
    pub data_offset: u64,
    pub record_bytes: u64,
    pub fields: Vec<super::schema::Field>,
    /// Byte range of each field inside a record, in field order.
    pub ranges: Vec<Range<usize>>,
}

impl RecordLayout {
    /// Opens the file for reading rows, checking that its fields are still `expected`.
    pub fn open(self, path: &Path, expected: &[super::schema::Field]) -> Result<RecordFile> {
        if self.fields != expected {
            return Err(Error::file(path, "fields changed since the dataset was scanned"));
        }
        RecordFile::open(path, self.samples, self.data_offset, self.record_bytes, self.ranges)
    }
}

/// A file of fixed-size records after a header: `.npy` and `.raw`.
pub struct RecordFile {
    file: File,
    path: PathBuf,
    /// Records the header promises (checked against the file size when it was scanned).
    samples: u64,
    data_offset: u64,
    record_bytes: u64,
    /// Byte range of each field inside a record, in field order.
    field_ranges: Vec<Range<usize>>,
}

impl RecordFile {
    /// Opens a record file whose layout was validated by the scan.
    pub fn open(
        path: &Path,
        samples: u64,
        data_offset: u64,
        record_bytes: u64,
        field_ranges: Vec<Range<usize>>,
    ) -> Result<RecordFile> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        Ok(RecordFile { file, path: path.to_path_buf(), samples, data_offset, record_bytes, field_ranges })
    }
}

impl FileReader for RecordFile {
    fn value_range(&self, row: u64, field: usize) -> Option<Range<u64>> {
        let f = self.field_ranges.get(field)?;
        let start = (row < self.samples).then(|| self.data_offset + row * self.record_bytes + f.start as u64)?;
        Some(start..start + f.len() as u64)
    }

    fn positional(&self) -> Option<Positional<'_>> {
        Some(Positional { file: &self.file, path: &self.path })
    }

    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let mut chunk = RowChunk::new(self.field_ranges.len());
        // Rows past the header's count would size a read beyond the file.
        if let Some(&last) = rows.last().filter(|&&r| r >= self.samples) {
            return Err(Error::file(
                &self.path,
                format!("row {last} is past the end of the file ({} rows)", self.samples),
            ));
        }
        let mut next = rows.iter().peekable();
        for span in coalesce(rows, self.record_bytes, RECORD_GAP_BYTES) {
            let len = ((span.end - span.start) * self.record_bytes) as usize;
            let mut buf = vec![0u8; len];
            let at = self.data_offset + span.start * self.record_bytes;
            self.file.read_exact_at(&mut buf, at).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Error::file(
                    &self.path,
                    format!("truncated: rows {}..{} end past the end of the file", span.start, span.end),
                ),
                _ => Error::io(&self.path, e),
            })?;
            let b = chunk.add_buffer(Buffer::from_vec(buf));
            while let Some(&&r) = next.peek() {
                if r >= span.end {
                    break;
                }
                let base = ((r - span.start) * self.record_bytes) as usize;
                for fr in &self.field_ranges {
                    chunk.push_value(b, base + fr.start, fr.len());
                }
                next.next();
            }
        }
        Ok(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSliceMut;

    #[test]
    fn record_file_reads_requested_rows_and_reports_truncation() {
        use crate::dataset::reader::FileReader;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.raw");
        // header of 3 bytes, then 5 records of 4 bytes: [i, i, 100 + i, 100 + i]
        let mut bytes = vec![9u8, 9, 9];
        for i in 0..5u8 {
            bytes.extend([i, i, 100 + i, 100 + i]);
        }
        std::fs::write(&p, &bytes).unwrap();
        // The header promises 6 records; the file holds 5.
        let mut f = RecordFile::open(&p, 6, 3, 4, vec![0..2, 2..4]).unwrap();
        let c = f.read_rows(&[0, 3, 4]).unwrap();
        assert_eq!(c.rows(), 3);
        assert_eq!(c.value(1, 0), &[3, 3]);
        assert_eq!(c.value(2, 1), &[104, 104]);
        let err = f.read_rows(&[5]).unwrap_err().to_string();
        assert!(err.contains("r.raw") && err.contains("truncated"), "{err}");
        let err = f.read_rows(&[1, 7]).unwrap_err().to_string();
        assert!(err.contains("r.raw") && err.contains("row 7 is past the end of the file (6 rows)"), "{err}");
        // One read scattered into several places: record 1's fields, then record 2's first.
        let (mut a, mut b, mut c) = ([0u8; 2], [0u8; 2], [0u8; 2]);
        let mut bufs = [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b), IoSliceMut::new(&mut c)];
        let at = f.positional().unwrap();
        at.read_vectored_at(f.value_range(1, 0).unwrap().start, &mut bufs).unwrap();
        assert_eq!((a, b, c), ([1, 1], [101, 101], [2, 2]));
        // Record 5 is promised but missing.
        let (mut a, mut b) = ([0u8; 2], [0u8; 2]);
        let mut bufs = [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)];
        let err = at.read_vectored_at(f.value_range(4, 1).unwrap().start, &mut bufs).unwrap_err().to_string();
        assert!(err.contains("r.raw") && err.contains("truncated: bytes 21..25"), "{err}");
    }
}
