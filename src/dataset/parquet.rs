//! Parquet files, through arrow-rs's `parquet` crate: each top-level column is a field, of
//! the types an Arrow IPC column may have (primitives, fixed-size lists and binaries,
//! binary and text, lists of numbers).
//!
//! The footer is read once per dataset ([`MetaCache`]); reading rows reads only the row
//! groups they lie in, only the selected columns, and within a row group only the pages
//! that hold the rows where the file has a page index (a row selection). Pages are
//! decompressed (snappy, gzip, LZ4, zstd) and decoded by the crate; the rows' values are
//! copied out, so memory is the rows' values plus the pages being decoded. The crate
//! decodes a page whole, whatever rows of it are needed: before a column chunk is first
//! read its page headers are walked ([`super::parquet_pages`]) and a page whose declared
//! uncompressed size exceeds the reader's decode limit (the window budget) is refused,
//! naming the file, row group, column and page with the sizes.
//!
//! Only the columns a dataset reads are checked and read ([`super::nulls::choose`]): others
//! may be of any type (structs, lists of text, dictionaries) and hold nulls. Booleans are
//! delivered one byte per value. Nulls of a column read are refused, naming the column and
//! the row group, unless the job gives the column a null policy (`--nulls`): then a null
//! is delivered as the fill value, or as zeros with a validity field. Nulls inside a list's
//! values are refused.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use arrow_buffer::Buffer;
use arrow_data::ArrayData;
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use parquet::arrow::ProjectionMask;

use super::nulls::{Chosen, ColumnChoice, NullPolicy, Source};
use super::parquet_pages;
use super::rows::RowChunk;
use super::schema::Field;
use crate::error::{Error, Result};

/// A file's parsed footer (schema, row groups, page index where there is one).
pub type MetaCache = std::sync::OnceLock<ArrowReaderMetadata>;

fn load(file: &File, path: &Path) -> Result<ArrowReaderMetadata> {
    let options = ArrowReaderOptions::new().with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Optional);
    let loaded = unpanicked(path, "the footer", || ArrowReaderMetadata::load(file, options))?;
    loaded.map_err(|e| Error::file_caused(path, format!("not a readable Parquet file: {e}"), e))
}

/// Runs `decode`, turning a panic of the `parquet` crate into an error naming the file. The
/// crate panics on some corrupt input where it should return an error (arrow-rs issue
/// 11121, open in version 60: a BYTE_STREAM_SPLIT page declaring more values than it
/// holds indexes past its end); a damaged file must be its reader's error, not a crash.
fn unpanicked<T>(path: &Path, what: &str, decode: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode)).map_err(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("no message");
        Error::file(path, format!("corrupt Parquet file: the decoder failed on {what} ({why})"))
    })
}

/// Reads a Parquet footer: row count, the fields `choice` reads, and the (uncompressed)
/// bytes of each variable-length field's column chunks, for the window budget's mean value
/// size.
pub fn scan(path: &Path, choice: &ColumnChoice) -> Result<(u64, Vec<Field>, Vec<u64>)> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let meta = load(&file, path)?;
    // (A top-level field of the Arrow schema is a root column of the Parquet schema.)
    let chosen = super::arrow::fields_of(path, meta.schema(), choice)?;
    let fields = &chosen.fields;
    let md = meta.metadata();
    let rows = md.row_groups().iter().try_fold(0u64, |n, g| n.checked_add(u64::try_from(g.num_rows()).ok()?));
    let rows = rows.ok_or_else(|| Error::file(path, "corrupt Parquet file: bad row counts"))?;
    // Leaf columns of each top-level field.
    let schema = md.file_metadata().schema_descr();
    let mut value_bytes = vec![0u64; fields.len()];
    for (i, g) in md.row_groups().iter().enumerate() {
        for (leaf, column) in g.columns().iter().enumerate() {
            let Some(field) = chosen.field_of_column(schema.get_column_root_idx(leaf)) else { continue };
            // Nulls without a policy are refused here where the statistics count them (else
            // when read). A list's leaf counts its empty lists as nulls too: those are
            // checked when read.
            let repeated = schema.column(leaf).max_rep_level() > 0;
            let nulls = column.statistics().and_then(|s| s.null_count_opt()).is_some_and(|n| n > 0);
            if !repeated && nulls && chosen.nulls[field].is_none() {
                return Err(super::nulls::refused(path, &fields[field].name, &format!("row group {i}")));
            }
            if fields[field].fixed_bytes().is_none() {
                value_bytes[field] =
                    value_bytes[field].saturating_add(u64::try_from(column.uncompressed_size()).unwrap_or(0));
            }
        }
    }
    Ok((rows, chosen.fields, value_bytes))
}

/// Reads rows of one Parquet file.
pub struct ParquetReader {
    file: File,
    path: PathBuf,
    meta: ArrowReaderMetadata,
    /// The fields read: columns (root indices) and validity fields.
    chosen: Chosen,
    /// First row of each row group, plus the total at the end.
    starts: Vec<u64>,
    /// The most bytes one page may declare uncompressed.
    max_page_bytes: u64,
    /// The column chunks (row group, leaf column) whose pages were checked.
    checked: std::collections::HashSet<(usize, usize)>,
}

impl ParquetReader {
    /// Opens `path` with the footer in `cache` (read if it is empty), checking that the
    /// fields `choice` reads are `expected`. Reads refuse a page declaring more than
    /// `max_page_bytes` uncompressed (the crate would decompress and decode it whole).
    pub fn open_cached(
        path: &Path,
        expected: &[Field],
        cache: &MetaCache,
        max_page_bytes: u64,
        choice: &ColumnChoice,
    ) -> Result<ParquetReader> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let meta = match cache.get() {
            Some(m) => m.clone(),
            None => {
                let m = load(&file, path)?;
                cache.get_or_init(|| m).clone()
            }
        };
        let chosen = super::arrow::fields_of(path, meta.schema(), choice)?;
        if chosen.fields != expected {
            return Err(Error::file(path, "fields changed since the dataset was scanned"));
        }
        let mut starts = vec![0u64];
        for g in meta.metadata().row_groups() {
            starts.push(starts.last().expect("non-empty") + u64::try_from(g.num_rows()).unwrap_or(0));
        }
        let checked = Default::default();
        Ok(ParquetReader { file, path: path.to_path_buf(), meta, chosen, starts, max_page_bytes, checked })
    }

    /// Checks the page headers of the column chunks of row group `g` that `columns` (top-level
    /// fields) read, once per chunk: no page may declare more than `max_page_bytes`.
    fn check_pages(&mut self, g: usize, columns: &[usize]) -> Result<()> {
        let md = self.meta.metadata();
        let schema = md.file_metadata().schema_descr();
        let group = &md.row_groups()[g];
        let file_len = self.file.metadata().map_err(|e| Error::io(&self.path, e))?.len();
        for (leaf, chunk) in group.columns().iter().enumerate() {
            let root = schema.get_column_root_idx(leaf);
            if !columns.contains(&root) || self.checked.contains(&(g, leaf)) {
                continue;
            }
            let name = chunk.column_path().string();
            let what = format!("row group {g}, column '{name}'");
            let start = chunk.dictionary_page_offset().unwrap_or(chunk.data_page_offset());
            let range = u64::try_from(start).ok().zip(u64::try_from(chunk.compressed_size()).ok());
            let range = range.and_then(|(s, n)| Some(s..s.checked_add(n)?)).filter(|r| r.end <= file_len);
            let range = range.ok_or_else(|| {
                Error::file(
                    &self.path,
                    format!(
                        "corrupt Parquet file: {what}: its column chunk ({} bytes at {start}) lies outside the file \
                         ({file_len} bytes)",
                        chunk.compressed_size()
                    ),
                )
            })?;
            let limit = self.max_page_bytes;
            parquet_pages::walk(&self.file, &self.path, &what, range, limit, |n, page| {
                if page.uncompressed <= limit {
                    return Ok(());
                }
                Err(Error::file(
                    &self.path,
                    format!(
                        "{what}: page {n} ({}) holds {} bytes uncompressed ({} compressed), more than the {limit} \
                         bytes a read may decode (the window budget, --window-bytes, or 1 MiB where that is less); \
                         write smaller pages (pyarrow: data_page_size) or give a larger window",
                        page.kind_name(),
                        page.uncompressed,
                        page.compressed
                    ),
                ))
            })?;
            self.checked.insert((g, leaf));
        }
        Ok(())
    }

    /// The root column field `field` is read from (a validity field: its column's).
    fn root(&self, field: usize) -> usize {
        match self.chosen.sources[field] {
            Source::Column(root) => root,
            Source::Valid(of) => self.root(of),
        }
    }

    /// Values of `local` rows (sorted) of row group `g`, fields `columns`, appended to
    /// `values` with their places in `locs[row][column]` (row indices from `first`). The
    /// crate may panic on a corrupt page: called through [`unpanicked`].
    fn read_group(
        &self,
        g: usize,
        local: &[u64],
        columns: &[usize],
        values: &mut Vec<u8>,
        locs: &mut [(usize, usize)],
        first: usize,
    ) -> Result<()> {
        let bad = |why: String| Error::file(&self.path, format!("row group {g}: {why}"));
        // Runs of selected and skipped rows.
        let mut selectors = Vec::new();
        let mut at = 0u64;
        for &r in local {
            if r > at {
                selectors.push(RowSelector::skip((r - at) as usize));
            }
            match selectors.last_mut() {
                Some(s) if !s.skip && r == at => s.row_count += 1,
                _ => selectors.push(RowSelector::select(1)),
            }
            at = r + 1;
        }
        let file = self.file.try_clone().map_err(|e| Error::io(&self.path, e))?;
        let roots: Vec<usize> = columns.iter().map(|&c| self.root(c)).collect();
        let mask = ProjectionMask::roots(self.meta.parquet_schema(), roots.iter().copied());
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.meta.clone())
            .with_row_groups(vec![g])
            .with_row_selection(RowSelection::from(selectors))
            .with_projection(mask)
            .with_batch_size(local.len().max(1))
            .build()
            .map_err(|e| bad(e.to_string()))?;
        // The projection keeps the file's column order: where is each asked-for column.
        let mut order: Vec<usize> = roots.clone();
        order.sort_unstable();
        order.dedup();
        let mut row = first;
        let mut places = Vec::new();
        for batch in reader {
            let batch = batch.map_err(|e| bad(format!("cannot be decoded: {e}")))?;
            for (c, &col) in columns.iter().enumerate() {
                let array = batch.column(order.binary_search(&roots[c]).expect("projected"));
                let field = &self.chosen.fields[col];
                let name = &field.name;
                places.clear();
                if let Source::Valid(_) = self.chosen.sources[col] {
                    for k in 0..array.len() {
                        places.push((values.len(), 1));
                        values.push(u8::from(array.is_valid(k)));
                    }
                } else {
                    append(array, values, &mut places).map_err(|why| {
                        Error::file_caused(&self.path, format!("row group {g}: column '{name}': {why}"), why)
                    })?;
                }
                if array.null_count() > 0 && matches!(self.chosen.sources[col], Source::Column(_)) {
                    let null = match &self.chosen.nulls[col] {
                        None => return Err(super::nulls::refused(&self.path, name, &format!("row group {g}"))),
                        Some(NullPolicy::Fill(v)) => super::nulls::fill_bytes(field, v)?,
                        Some(NullPolicy::Mask) => vec![0; field.fixed_bytes().unwrap_or(0)],
                    };
                    let at = values.len();
                    values.extend_from_slice(&null);
                    for (k, place) in places.iter_mut().enumerate() {
                        if array.is_null(k) {
                            *place = (at, null.len());
                        }
                    }
                }
                for (k, &place) in places.iter().enumerate() {
                    locs[(row + k) * columns.len() + c] = place;
                }
            }
            row += batch.num_rows();
        }
        if row - first != local.len() {
            return Err(bad(format!("{} rows decoded where {} were asked for", row - first, local.len())));
        }
        Ok(())
    }
}

/// Why a column's decoded values cannot be delivered: the column (and the file) are named
/// by the caller.
#[derive(Debug, thiserror::Error)]
enum ValuesError {
    /// Nulls inside a list's values (only whole values may be null).
    #[error("nulls inside its values are not supported (--nulls delivers nulls of whole values)")]
    NullsInside,
    /// Values of a type with no fixed width where one is needed.
    #[error("unsupported type {0}")]
    UnsupportedType(DataType),
    /// Arrays that do not hold what their type says (`what` is missing or short).
    #[error("{0}")]
    Malformed(&'static str),
}

use ValuesError::Malformed;

/// The bytes of a fixed-width array's values from its row 0, and their width.
fn fixed(data: &ArrayData) -> std::result::Result<(&[u8], usize), ValuesError> {
    match data.data_type() {
        DataType::FixedSizeList(_, n) => {
            let child = data.child_data().first().ok_or(Malformed("a list without values"))?;
            if child.null_count() > 0 {
                return Err(ValuesError::NullsInside);
            }
            let (bytes, w) = fixed(child)?;
            let width = w * usize::try_from(*n).map_err(|_| Malformed("bad list size"))?;
            Ok((bytes.get(data.offset() * width..).ok_or(Malformed("short values"))?, width))
        }
        DataType::FixedSizeBinary(n) => {
            let width = usize::try_from(*n).map_err(|_| Malformed("bad width"))?;
            let buf = data.buffers().first().ok_or(Malformed("no values"))?;
            Ok((buf.as_slice().get(data.offset() * width..).ok_or(Malformed("short values"))?, width))
        }
        dt => {
            let width = dt.primitive_width().ok_or_else(|| ValuesError::UnsupportedType(dt.clone()))?;
            let buf = data.buffers().first().ok_or(Malformed("no values"))?;
            Ok((buf.as_slice().get(data.offset() * width..).ok_or(Malformed("short values"))?, width))
        }
    }
}

/// Pushes the bytes of every row of list array `l` (of 32- or 64-bit offsets), whose
/// values are fixed-size and without nulls.
fn list_values<O: arrow_array::OffsetSizeTrait>(
    l: &arrow_array::GenericListArray<O>,
    push: &mut impl FnMut(&[u8]),
) -> std::result::Result<(), ValuesError> {
    let child = l.values().to_data();
    if child.null_count() > 0 {
        return Err(ValuesError::NullsInside);
    }
    let (bytes, w) = fixed(&child)?;
    for i in 0..l.len() {
        let (s, e) = (l.value_offsets()[i].as_usize(), l.value_offsets()[i + 1].as_usize());
        push(bytes.get(s * w..e * w).ok_or(Malformed("short list values"))?);
    }
    Ok(())
}

/// Appends the bytes of every row of `array`, as meshfeed delivers its field, to `out`,
/// with each row's place (offset, length) to `places`.
fn append(
    array: &ArrayRef,
    out: &mut Vec<u8>,
    places: &mut Vec<(usize, usize)>,
) -> std::result::Result<(), ValuesError> {
    let n = array.len();
    let mut push = |v: &[u8]| {
        places.push((out.len(), v.len()));
        out.extend_from_slice(v);
    };
    match array.data_type() {
        DataType::Binary => (0..n).for_each(|i| push(array.as_binary::<i32>().value(i))),
        DataType::LargeBinary => (0..n).for_each(|i| push(array.as_binary::<i64>().value(i))),
        DataType::Utf8 => (0..n).for_each(|i| push(array.as_string::<i32>().value(i).as_bytes())),
        DataType::LargeUtf8 => (0..n).for_each(|i| push(array.as_string::<i64>().value(i).as_bytes())),
        DataType::BinaryView => (0..n).for_each(|i| push(array.as_binary_view().value(i))),
        DataType::Utf8View => (0..n).for_each(|i| push(array.as_string_view().value(i).as_bytes())),
        DataType::Boolean => {
            let b = array.as_boolean();
            (0..n).for_each(|i| push(&[u8::from(b.value(i))]))
        }
        DataType::List(_) => list_values(array.as_list::<i32>(), &mut push)?,
        DataType::LargeList(_) => list_values(array.as_list::<i64>(), &mut push)?,
        _ => {
            let data = array.to_data();
            let (bytes, w) = fixed(&data)?;
            for i in 0..n {
                push(bytes.get(i * w..(i + 1) * w).ok_or(Malformed("short values"))?);
            }
        }
    }
    Ok(())
}

impl super::reader::FileReader for ParquetReader {
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let all: Vec<usize> = (0..self.chosen.fields.len()).collect();
        self.read_columns(rows, &all)
    }

    fn read_columns(&mut self, rows: &[u64], columns: &[usize]) -> Result<RowChunk> {
        let total = *self.starts.last().expect("non-empty");
        if let Some(&last) = rows.last().filter(|&&r| r >= total) {
            return Err(Error::file(&self.path, format!("row {last} is past the end of the file ({total} rows)")));
        }
        let mut values = Vec::new();
        let mut locs = vec![(0usize, 0usize); rows.len() * columns.len()];
        let mut i = 0;
        while i < rows.len() {
            let g = self.starts.partition_point(|&s| s <= rows[i]) - 1;
            let j = i + rows[i..].partition_point(|&r| r < self.starts[g + 1]);
            let local: Vec<u64> = rows[i..j].iter().map(|r| r - self.starts[g]).collect();
            let roots: Vec<usize> = columns.iter().map(|&c| self.root(c)).collect();
            self.check_pages(g, &roots)?;
            let read = || self.read_group(g, &local, columns, &mut values, &mut locs, i);
            unpanicked(&self.path, &format!("row group {g}"), read)??;
            i = j;
        }
        let mut chunk = RowChunk::new(columns.len());
        let b = chunk.add_buffer(Buffer::from_vec(values));
        for (offset, len) in locs {
            chunk.push_value(b, offset, len);
        }
        Ok(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::reader::FileReader;
    use arrow_array::{Int64Array, RecordBatch, StringArray};
    use std::sync::Arc;

    fn write(path: &Path, y: Vec<Option<i64>>, s: Vec<&str>, rows_per_group: usize) {
        let batch = RecordBatch::try_from_iter([
            ("y", Arc::new(Int64Array::from(y)) as ArrayRef),
            ("s", Arc::new(StringArray::from(s)) as ArrayRef),
        ])
        .unwrap();
        let props = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(rows_per_group))
            .build();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    #[test]
    fn rows_of_row_groups_are_read_and_nulls_and_damage_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.parquet");
        let texts: Vec<String> = (0..50).map(|i| "w".repeat(i % 7)).collect();
        write(&path, (0..50).map(Some).collect(), texts.iter().map(String::as_str).collect(), 8);
        let (n, fields, _) = scan(&path, &ColumnChoice::default()).unwrap();
        assert_eq!(n, 50);
        let mut r =
            ParquetReader::open_cached(&path, &fields, &MetaCache::new(), 1 << 20, &ColumnChoice::default()).unwrap();
        let rows = [0u64, 7, 8, 9, 31, 49];
        let chunk = r.read_rows(&rows).unwrap();
        for (k, &id) in rows.iter().enumerate() {
            assert_eq!(chunk.value(k, 0), &(id as i64).to_le_bytes());
            assert_eq!(chunk.value(k, 1), texts[id as usize].as_bytes());
        }
        // Only the text column, in the order asked.
        let chunk = r.read_columns(&[3, 40], &[1]).unwrap();
        assert_eq!((chunk.value(0, 0), chunk.value(1, 0)), (texts[3].as_bytes(), texts[40].as_bytes()));
        // Nulls name the column and the row group (the statistics count them).
        let nulls = dir.path().join("n.parquet");
        write(&nulls, vec![Some(1), None, Some(3)], vec!["a", "b", "c"], 8);
        let e = scan(&nulls, &ColumnChoice::default()).unwrap_err().to_string();
        assert!(e.contains("column 'y' has nulls in row group 0"), "{e}");
        // A cut file is not a Parquet file any more.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let e = scan(&path, &ColumnChoice::default()).unwrap_err().to_string();
        assert!(e.contains("a.parquet") && e.contains("not a readable Parquet file"), "{e}");
    }

    /// Only the columns read are checked: a struct and a nullable column beside them are
    /// no error; booleans are one byte; nulls are refused without a policy, filled or
    /// masked with one, and checked when read where no statistics count them.
    #[test]
    fn only_the_columns_read_are_checked_and_booleans_and_nulls_are_delivered() {
        use arrow_array::builder::{Int32Builder, StructBuilder};
        use arrow_array::BooleanArray;
        let dir = tempfile::tempdir().unwrap();
        let mut st = StructBuilder::from_fields(vec![arrow_schema::Field::new("a", DataType::Int32, true)], 20);
        for i in 0..20 {
            st.field_builder::<Int32Builder>(0).unwrap().append_value(i);
            st.append(true);
        }
        let batch = RecordBatch::try_from_iter([
            ("s", Arc::new(st.finish()) as ArrayRef),
            ("flag", Arc::new(BooleanArray::from_iter((0..20).map(|i| Some(i % 3 == 0))))),
            ("y", Arc::new(Int64Array::from_iter((0..20i64).map(|i| (i % 4 != 1).then_some(i * 10))))),
        ])
        .unwrap();
        for stats in [true, false] {
            let path = dir.path().join(format!("h{stats}.parquet"));
            let level = if stats {
                parquet::file::properties::EnabledStatistics::Page
            } else {
                parquet::file::properties::EnabledStatistics::None
            };
            let props = parquet::file::properties::WriterProperties::builder()
                .set_max_row_group_row_count(Some(8))
                .set_statistics_enabled(level)
                .build();
            let mut w = parquet::arrow::ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), Some(props))
                .unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
            let choice = |names: &[&str], nulls: &[(&str, &str)]| ColumnChoice {
                names: Some(names.iter().map(|n| n.to_string()).collect()),
                nulls: nulls.iter().map(|(k, v)| (k.to_string(), v.parse().unwrap())).collect(),
            };
            let e = scan(&path, &ColumnChoice::default()).unwrap_err().to_string();
            assert!(
                e.contains("column 's' has unsupported type Struct") && e.contains("--fields can leave it out"),
                "{e}"
            );
            let c = choice(&["flag"], &[]);
            let (n, fields, _) = scan(&path, &c).unwrap();
            assert_eq!(
                (n, fields.clone()),
                (20, vec![Field::tensor("flag", crate::dataset::schema::DType::Bool, vec![])])
            );
            let mut r = ParquetReader::open_cached(&path, &fields, &MetaCache::new(), 1 << 20, &c).unwrap();
            let chunk = r.read_rows(&[0, 1, 3, 19]).unwrap();
            let got: Vec<&[u8]> = (0..4).map(|k| chunk.value(k, 0)).collect();
            assert_eq!(got, [&[1u8][..], &[0], &[1], &[0]]);
            // Without a policy: at the scan where statistics count the nulls, else when read.
            let c = choice(&["y"], &[]);
            let refused = match scan(&path, &c) {
                Err(e) => e.to_string(),
                Ok((_, fields, _)) => {
                    assert!(!stats, "the statistics count the nulls");
                    let mut r = ParquetReader::open_cached(&path, &fields, &MetaCache::new(), 1 << 20, &c).unwrap();
                    r.read_rows(&[0, 1]).unwrap_err().to_string()
                }
            };
            assert!(
                refused.contains("column 'y' has nulls in row group 0") && refused.contains("--nulls y=mask"),
                "{refused}"
            );
            for (policy, null) in [("mask", 0i64), ("fill:-3", -3)] {
                let c = choice(&["y"], &[("y", policy)]);
                let (_, fields, _) = scan(&path, &c).unwrap();
                assert_eq!(fields.len(), if policy == "mask" { 2 } else { 1 });
                let mut r = ParquetReader::open_cached(&path, &fields, &MetaCache::new(), 1 << 20, &c).unwrap();
                let rows = [0u64, 1, 5, 9, 12, 17];
                let chunk = r.read_rows(&rows).unwrap();
                for (k, &i) in rows.iter().enumerate() {
                    let want = if i % 4 == 1 { null } else { i as i64 * 10 };
                    assert_eq!(chunk.value(k, 0), &want.to_le_bytes(), "{policy}: row {i}");
                    if policy == "mask" {
                        assert_eq!(chunk.value(k, 1), &[u8::from(i % 4 != 1)], "row {i}: y_valid");
                    }
                }
            }
        }
    }

    /// A page is decoded whole (the crate cannot decode part of one): one declaring more
    /// than the reader's limit is refused before it is read, naming the row group, column
    /// and page with its sizes, whatever rows are asked for; within the limit it reads.
    #[test]
    fn a_page_larger_than_the_decode_limit_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("z.parquet");
        // 4 MiB of zeros in one zstd page of a few hundred bytes, after a small column.
        let batch = RecordBatch::try_from_iter([
            ("s", Arc::new(StringArray::from(vec!["a"; 1 << 19])) as ArrayRef),
            ("y", Arc::new(Int64Array::from(vec![0i64; 1 << 19])) as ArrayRef),
        ])
        .unwrap();
        let props = parquet::file::properties::WriterProperties::builder()
            .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
            .set_dictionary_enabled(false)
            .set_data_page_size_limit(64 << 20)
            .set_data_page_row_count_limit(1 << 20)
            .set_write_batch_size(1 << 20)
            .build();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() < 64 << 10);
        let (_, fields, _) = scan(&path, &ColumnChoice::default()).unwrap();
        let mut r =
            ParquetReader::open_cached(&path, &fields, &MetaCache::new(), 1 << 20, &ColumnChoice::default()).unwrap();
        let e = r.read_rows(&[0, 1]).unwrap_err().to_string();
        assert!(e.contains("z.parquet") && e.contains("row group 0, column 's': page 0 (data page) holds"), "{e}");
        assert!(e.contains(&format!("holds {} bytes uncompressed", 5 << 19)), "{e}");
        assert!(e.contains("more than the 1048576 bytes a read may decode"), "{e}");
        // The column asked for is the one checked: 'y' alone is refused on its own page.
        let e = r.read_columns(&[5], &[1]).unwrap_err().to_string();
        assert!(e.contains("column 'y': page 0 (data page) holds 4194304 bytes uncompressed"), "{e}");
        let mut r =
            ParquetReader::open_cached(&path, &fields, &MetaCache::new(), 8 << 20, &ColumnChoice::default()).unwrap();
        let chunk = r.read_rows(&[0, 1]).unwrap();
        assert_eq!((chunk.value(1, 0), chunk.value(1, 1)), (&b"a"[..], &[0u8; 8][..]));
    }

    #[test]
    fn every_bit_flip_of_a_byte_stream_split_file_reads_or_is_its_error() {
        // At parquet 60.1, seven of these flips make the crate panic: the BYTE_STREAM_SPLIT
        // decoder indexing past a page that declares more values than it holds (a flipped
        // bit of the page header's value count), a data page claiming a dictionary, a
        // negative column start. Each must be an error naming the file.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.parquet");
        let batch =
            RecordBatch::try_from_iter([("y", Arc::new(Int64Array::from_iter_values(0..20)) as ArrayRef)]).unwrap();
        let props = parquet::file::properties::WriterProperties::builder()
            .set_dictionary_enabled(false)
            .set_encoding(parquet::basic::Encoding::BYTE_STREAM_SPLIT)
            .build();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let good = std::fs::read(&path).unwrap();
        let read = |bytes: &[u8]| -> Result<Vec<Vec<u8>>> {
            std::fs::write(&path, bytes).unwrap();
            let (n, fields, _) = scan(&path, &ColumnChoice::default())?;
            let rows: Vec<u64> = (0..n.min(64)).collect();
            let chunk =
                ParquetReader::open_cached(&path, &fields, &MetaCache::new(), 1 << 20, &ColumnChoice::default())?
                    .read_rows(&rows)?;
            Ok((0..rows.len()).map(|k| chunk.value(k, 0).to_vec()).collect())
        };
        let values = read(&good).unwrap();
        assert_eq!(values, (0..20i64).map(|v| v.to_le_bytes().to_vec()).collect::<Vec<_>>());
        let mut bytes = good.clone();
        for at in 0..good.len() {
            for bit in 0..8 {
                bytes[at] ^= 1 << bit;
                if let Err(e) = read(&bytes) {
                    assert!(e.to_string().contains("b.parquet"), "bit {bit} of byte {at}: {e}");
                }
                bytes[at] ^= 1 << bit;
            }
        }
    }
}
