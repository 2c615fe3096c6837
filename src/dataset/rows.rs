//! Rows read from one file: a [`RowChunk`] keeps the buffers a reader filled (file bytes,
//! decoded Arrow buffers) and, for each requested row and field, where that value's bytes
//! are. The loader copies values from here straight into its send buffer: one copy from
//! read buffer to send buffer (docs/design.md, "The pipeline").

use std::ops::Range;

use arrow_buffer::Buffer;

/// Where one value lives inside a [`RowChunk`].
#[derive(Clone, Copy, Debug)]
struct Loc {
    buffer: u32,
    offset: usize,
    len: usize,
}

/// Values of some rows of one file, for every field.
#[derive(Debug, Default)]
pub struct RowChunk {
    buffers: Vec<Buffer>,
    /// `locs[row * fields + field]`.
    locs: Vec<Loc>,
    fields: usize,
    bytes_read: u64,
}

impl RowChunk {
    /// An empty chunk for values with `fields` fields.
    pub fn new(fields: usize) -> RowChunk {
        RowChunk { fields, ..Default::default() }
    }

    /// Adds a buffer and returns its index for [`RowChunk::push_value`].
    pub fn add_buffer(&mut self, buffer: Buffer) -> u32 {
        self.bytes_read += buffer.len() as u64;
        self.buffers.push(buffer);
        (self.buffers.len() - 1) as u32
    }

    /// Adds a buffer the reader made in memory rather than read (not counted as read).
    pub fn add_made_buffer(&mut self, buffer: Buffer) -> u32 {
        self.buffers.push(buffer);
        (self.buffers.len() - 1) as u32
    }

    /// Counts bytes a reader brought into memory for this chunk but did not keep (e.g. the
    /// offsets of variable-length values), so that [`RowChunk::bytes_read`] stays true.
    pub fn add_bytes_read(&mut self, bytes: u64) {
        self.bytes_read += bytes;
    }

    /// Records the next value (row-major over rows, then fields).
    pub fn push_value(&mut self, buffer: u32, offset: usize, len: usize) {
        debug_assert!(offset + len <= self.buffers[buffer as usize].len());
        self.locs.push(Loc { buffer, offset, len });
    }

    /// Number of fields of each row.
    pub fn fields(&self) -> usize {
        self.fields
    }

    /// Number of rows in the chunk.
    pub fn rows(&self) -> usize {
        self.locs.len().checked_div(self.fields).unwrap_or(0)
    }

    /// The bytes of one value.
    pub fn value(&self, row: usize, field: usize) -> &[u8] {
        let loc = self.locs[row * self.fields + field];
        &self.buffers[loc.buffer as usize].as_slice()[loc.offset..loc.offset + loc.len]
    }

    /// Where one value lies: its buffer's index, its offset there and its length.
    pub fn location(&self, row: usize, field: usize) -> (u32, usize, usize) {
        let loc = self.locs[row * self.fields + field];
        (loc.buffer, loc.offset, loc.len)
    }

    /// The same rows with only fields `fields` (in that order), sharing the buffers.
    pub fn project(&self, fields: &[usize]) -> RowChunk {
        let rows = self.rows();
        let mut locs = Vec::with_capacity(rows * fields.len());
        for r in 0..rows {
            locs.extend(fields.iter().map(|&f| self.locs[r * self.fields + f]));
        }
        RowChunk { buffers: self.buffers.clone(), locs, fields: fields.len(), bytes_read: self.bytes_read }
    }

    /// A chunk of one field whose row `k` is bytes `parts[k].1` of this chunk's value
    /// `(parts[k].0, field)`, sharing its buffers and its count of bytes read.
    pub fn slices(&self, field: usize, parts: &[(usize, Range<usize>)]) -> RowChunk {
        let locs = parts
            .iter()
            .map(|(row, bytes)| {
                let loc = self.locs[row * self.fields + field];
                debug_assert!(bytes.start <= bytes.end && bytes.end <= loc.len);
                Loc { buffer: loc.buffer, offset: loc.offset + bytes.start, len: bytes.end - bytes.start }
            })
            .collect();
        RowChunk { buffers: self.buffers.clone(), locs, fields: 1, bytes_read: self.bytes_read }
    }

    /// Buffers the chunk's values lie in: for readers that read into buffers of their own,
    /// the reads that brought them in.
    pub fn buffers(&self) -> usize {
        self.buffers.len()
    }

    /// Bytes the reader brought into memory for this chunk.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// Reorders values pushed field-major (all rows of field 0, then field 1, ...) into
    /// the row-major order [`RowChunk::value`] expects.
    pub fn transpose_from_field_major(&mut self, rows: usize) {
        let fields = self.fields;
        let old = std::mem::take(&mut self.locs);
        debug_assert_eq!(old.len(), rows * fields);
        self.locs = (0..rows * fields).map(|i| old[(i % fields) * rows + i / fields]).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_reorders_field_major_values() {
        let mut c = RowChunk::new(2);
        let b = c.add_buffer(Buffer::from_vec(vec![10u8, 11, 12, 20, 21, 22]));
        for off in 0..6 {
            c.push_value(b, off, 1);
        }
        c.transpose_from_field_major(3);
        assert_eq!(c.rows(), 3);
        assert_eq!((c.value(0, 0), c.value(0, 1)), (&[10u8][..], &[20u8][..]));
        assert_eq!((c.value(2, 0), c.value(2, 1)), (&[12u8][..], &[22u8][..]));
    }
}
