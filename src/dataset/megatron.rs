//! Megatron-LM / NeMo indexed datasets: a `.idx` file (the index) beside a `.bin` file (the
//! tokens), as `megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder` writes them.
//! Each sequence (a document, for most corpora) is one sample with one field, `tokens`: a
//! variable-length list of the index's token type.
//!
//! The index (`MMIDIDX\0\0` version 1) holds the token type, the sequence count, the
//! document count, then each sequence's length (`i32`, in tokens), each sequence's byte
//! offset in the `.bin` (`i64`) and the document indices (`i64`). It is read whole at open
//! (12 bytes a sequence); a sequence's tokens are then read straight from the `.bin`,
//! only those of the rows asked for. The `.idx` is the file `--data` lists (a `.bin`
//! alone is not a dataset file); every length and offset is checked against the `.bin`'s
//! size before it is used.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::positional::{push_grouped, read_span, Positional};
use super::rows::RowChunk;
use super::schema::{DType, Field, FieldKind};
use crate::error::{Error, Result};

const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";

/// The field every sample has.
pub const FIELD: &str = "tokens";

/// What an index says: where each sequence's tokens lie in the `.bin`.
#[derive(Debug)]
pub struct Index {
    dtype: DType,
    /// Byte offset and token count of each sequence.
    sequences: Vec<(u64, u64)>,
    /// Where the last byte of any sequence ends: the `.bin` holds at least this much.
    end: u64,
}

/// The index of one dataset, read by the first reader opened on it.
pub type IndexCache = std::sync::OnceLock<Arc<Index>>;

/// The `.bin` beside an `.idx`.
pub fn bin_path(idx: &Path) -> PathBuf {
    idx.with_extension("bin")
}

/// Megatron's token type codes.
fn dtype_of(code: u8) -> Option<DType> {
    Some(match code {
        1 => DType::U8,
        2 => DType::I8,
        3 => DType::I16,
        4 => DType::I32,
        5 => DType::I64,
        6 => DType::F64,
        7 => DType::F32,
        8 => DType::U16,
        _ => return None,
    })
}

fn fields(dtype: DType) -> Vec<Field> {
    vec![Field { name: FIELD.into(), kind: FieldKind::Bytes { utf8: false, elem: Some(dtype) } }]
}

/// Reads and checks an index against its `.bin` (of `bin_len` bytes).
fn read_index(idx: &Path, bin_len: u64) -> Result<Index> {
    let bytes = std::fs::read(idx).map_err(|e| Error::io(idx, e))?;
    let corrupt = |why: String| Error::file(idx, format!("corrupt Megatron index: {why}"));
    if bytes.len() < 34 || &bytes[..9] != MAGIC {
        return Err(Error::file(idx, "not a Megatron indexed dataset index (no MMIDIDX header)"));
    }
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let version = u64_at(9);
    if version != 1 {
        return Err(Error::file(idx, format!("Megatron index version {version} is not supported (1 is)")));
    }
    let dtype = dtype_of(bytes[17]).ok_or_else(|| corrupt(format!("unknown token type code {}", bytes[17])))?;
    let (count, documents) = (u64_at(18), u64_at(26));
    // Lengths (i32), pointers (i64), document indices (i64).
    let need =
        count.checked_mul(12).and_then(|n| n.checked_add(documents.checked_mul(8)?)).and_then(|n| n.checked_add(34));
    if need != Some(bytes.len() as u64) {
        return Err(corrupt(format!(
            "{count} sequences and {documents} documents need {} bytes, the file has {}",
            need.map_or("too many".into(), |n| n.to_string()),
            bytes.len()
        )));
    }
    let count = count as usize;
    let (lengths, pointers) = (&bytes[34..34 + 4 * count], &bytes[34 + 4 * count..34 + 12 * count]);
    let size = dtype.size() as u64;
    let mut sequences = Vec::with_capacity(count);
    let mut end = 0;
    for i in 0..count {
        let len = i32::from_le_bytes(lengths[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        let at = i64::from_le_bytes(pointers[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let (Ok(len), Ok(at)) = (u64::try_from(len), u64::try_from(at)) else {
            return Err(corrupt(format!("sequence {i}: negative length {len} or offset {at}")));
        };
        let seq_end = len.checked_mul(size).and_then(|n| n.checked_add(at));
        if seq_end.is_none_or(|e| e > bin_len) {
            return Err(Error::file(
                bin_path(idx),
                format!("truncated: sequence {i} ({len} tokens at byte {at}) lies past its end ({bin_len} bytes)"),
            ));
        }
        sequences.push((at, len));
        end = end.max(seq_end.unwrap_or(0));
    }
    Ok(Index { dtype, sequences, end })
}

fn bin_len(idx: &Path) -> Result<u64> {
    let bin = bin_path(idx);
    std::fs::metadata(&bin)
        .map(|m| m.len())
        .map_err(|e| Error::file_caused(&bin, format!("the tokens of {} cannot be read: {e}", idx.display()), e))
}

/// Reads an index: sequence count, fields, and the bytes of all tokens.
pub fn scan(idx: &Path) -> Result<(u64, Vec<Field>, Vec<u64>)> {
    let index = read_index(idx, bin_len(idx)?)?;
    let bytes = index.sequences.iter().map(|&(_, n)| n * index.dtype.size() as u64).sum();
    Ok((index.sequences.len() as u64, fields(index.dtype), vec![bytes]))
}

/// Reads sequences of one indexed dataset: only the tokens of the rows asked for.
pub struct MegatronReader {
    bin: File,
    path: PathBuf,
    index: Arc<Index>,
}

impl MegatronReader {
    /// Opens the `.bin` of index `idx` with the index in `cache` (read if it is empty),
    /// checking that its field is `expected`.
    pub fn open_cached(idx: &Path, expected: &[Field], cache: &IndexCache) -> Result<MegatronReader> {
        let path = bin_path(idx);
        let bin = File::open(&path).map_err(|e| Error::io(&path, e))?;
        let len = bin.metadata().map_err(|e| Error::io(&path, e))?.len();
        let index = match cache.get() {
            Some(index) => index.clone(),
            None => {
                let index = read_index(idx, len)?;
                cache.get_or_init(|| Arc::new(index)).clone()
            }
        };
        if fields(index.dtype) != expected {
            return Err(Error::file(idx, "fields changed since the dataset was scanned"));
        }
        // A .bin cut short since the index was checked against it.
        if index.end > len {
            return Err(Error::file(&path, format!("truncated: {len} bytes, the index needs {}", index.end)));
        }
        Ok(MegatronReader { bin, path, index })
    }
}

impl super::reader::FileReader for MegatronReader {
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let n = self.index.sequences.len() as u64;
        if let Some(&last) = rows.last().filter(|&&r| r >= n) {
            return Err(Error::file(&self.path, format!("row {last} is past the end of the dataset ({n} sequences)")));
        }
        let ranges: Vec<Range<u64>> = rows.iter().map(|&r| self.value_range(r, 0).expect("inside")).collect();
        let mut chunk = RowChunk::new(1);
        // Rows are sorted and sequences lie in order in the .bin: ranges are in file order
        // (where not, they are read apart).
        push_grouped(&mut chunk, &ranges, |g, _| read_span(&self.bin, &self.path, g))?;
        Ok(chunk)
    }

    /// Only the pieces' tokens, from where the index puts each sequence in the `.bin`.
    fn read_list_pieces(
        &mut self,
        _field: usize,
        _elem: usize,
        pieces: &[(u64, Range<u64>)],
    ) -> Result<(RowChunk, Vec<u64>)> {
        let n = self.index.sequences.len() as u64;
        if let Some((last, _)) = pieces.iter().find(|(r, _)| *r >= n) {
            return Err(Error::file(&self.path, format!("row {last} is past the end of the dataset ({n} sequences)")));
        }
        let size = self.index.dtype.size() as u64;
        let (mut ranges, mut lengths) = (Vec::with_capacity(pieces.len()), Vec::with_capacity(pieces.len()));
        for (row, range) in pieces {
            // Inside the .bin: checked against its size when the index was read.
            let (at, len) = self.index.sequences[*row as usize];
            let bytes = super::reader::piece_bytes(range, len, size);
            ranges.push(at + bytes.start..at + bytes.end);
            lengths.push(len);
        }
        let mut chunk = RowChunk::new(1);
        push_grouped(&mut chunk, &ranges, |g, _| read_span(&self.bin, &self.path, g))?;
        Ok((chunk, lengths))
    }

    /// From the index: no token is read.
    fn list_lengths(&mut self, _rows: u64, _field: usize, _elem: usize) -> Result<Vec<u64>> {
        Ok(self.index.sequences.iter().map(|&(_, n)| n).collect())
    }

    fn value_range(&self, row: u64, field: usize) -> Option<Range<u64>> {
        let &(at, n) = self.index.sequences.get(usize::try_from(row).ok()?).filter(|_| field == 0)?;
        Some(at..at + n * self.index.dtype.size() as u64)
    }

    fn positional(&self) -> Option<Positional<'_>> {
        Some(Positional { file: &self.bin, path: &self.path })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::dataset::reader::FileReader;

    /// Writes `seqs` as an indexed dataset of i32 tokens at `dir/d.{idx,bin}`.
    pub(crate) fn write(dir: &Path, seqs: &[Vec<i32>]) -> PathBuf {
        let mut bin = Vec::new();
        let (mut lengths, mut pointers) = (Vec::new(), Vec::new());
        for s in seqs {
            pointers.extend((bin.len() as i64).to_le_bytes());
            lengths.extend((s.len() as i32).to_le_bytes());
            bin.extend(s.iter().flat_map(|t| t.to_le_bytes()));
        }
        let mut idx = MAGIC.to_vec();
        idx.extend(1u64.to_le_bytes());
        idx.push(4);
        idx.extend((seqs.len() as u64).to_le_bytes());
        idx.extend((seqs.len() as u64 + 1).to_le_bytes());
        idx.extend(lengths);
        idx.extend(pointers);
        idx.extend((0..=seqs.len() as i64).flat_map(|d| d.to_le_bytes()));
        std::fs::write(dir.join("d.bin"), bin).unwrap();
        std::fs::write(dir.join("d.idx"), idx).unwrap();
        dir.join("d.idx")
    }

    #[test]
    fn sequences_are_read_from_the_bin_and_bad_indexes_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let seqs = vec![vec![1, 2, 3], vec![], vec![7; 1000], vec![42]];
        let idx = write(dir.path(), &seqs);
        let (n, f, bytes) = scan(&idx).unwrap();
        assert_eq!((n, bytes), (4, vec![4 * 1004]));
        let mut r = MegatronReader::open_cached(&idx, &f, &IndexCache::new()).unwrap();
        let chunk = r.read_rows(&[0, 1, 3]).unwrap();
        let tokens = |k: usize| -> Vec<i32> {
            chunk.value(k, 0).chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
        };
        assert_eq!((tokens(0), tokens(1), tokens(2)), (vec![1, 2, 3], vec![], vec![42]));
        // Only what is asked for: not the 4000 bytes of sequence 2.
        assert!(chunk.bytes_read() < 100, "{}", chunk.bytes_read());
        // A .bin shorter than the index says, a bad magic, a missing .bin.
        let bin = std::fs::read(dir.path().join("d.bin")).unwrap();
        std::fs::write(dir.path().join("d.bin"), &bin[..bin.len() - 1]).unwrap();
        let e = scan(&idx).unwrap_err().to_string();
        assert!(e.contains("d.bin") && e.contains("truncated: sequence 3"), "{e}");
        std::fs::write(dir.path().join("d.bin"), &bin).unwrap();
        let mut bad = std::fs::read(&idx).unwrap();
        bad[0] = b'X';
        std::fs::write(dir.path().join("x.idx"), &bad).unwrap();
        std::fs::copy(dir.path().join("d.bin"), dir.path().join("x.bin")).unwrap();
        assert!(scan(&dir.path().join("x.idx")).unwrap_err().to_string().contains("no MMIDIDX header"));
        std::fs::write(dir.path().join("y.idx"), std::fs::read(&idx).unwrap()).unwrap();
        let e = scan(&dir.path().join("y.idx")).unwrap_err().to_string();
        assert!(e.contains("y.bin") && e.contains("cannot be read: No such file or directory"), "{e}");
        // Pieces of sequences read only their tokens (clamped to the sequence), with each
        // sequence's length.
        let mut r = MegatronReader::open_cached(&idx, &f, &IndexCache::new()).unwrap();
        let (chunk, lengths) = r.read_list_pieces(0, 4, &[(0, 1..3), (2, 10..12), (2, 998..1200), (3, 5..9)]).unwrap();
        assert_eq!(lengths, [3, 1000, 1000, 1]);
        let tokens = |k: usize| -> Vec<i32> {
            chunk.value(k, 0).chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
        };
        assert_eq!((tokens(0), tokens(1), tokens(2), tokens(3)), (vec![2, 3], vec![7; 2], vec![7; 2], vec![]));
        assert!(chunk.bytes_read() < 100, "{}", chunk.bytes_read());
        let mut short = std::fs::read(&idx).unwrap();
        short.truncate(short.len() - 8);
        std::fs::write(dir.path().join("x.idx"), &short).unwrap();
        assert!(scan(&dir.path().join("x.idx")).unwrap_err().to_string().contains("corrupt Megatron index"));
    }
}
