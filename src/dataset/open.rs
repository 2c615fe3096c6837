//! A dataset opened in this process: its files' headers scanned ([`scan_file`]), checked
//! against each other, and each file's reader in its format ([`Dataset::open_reader`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(feature = "hdf5")]
use super::hdf5;
#[cfg(not(feature = "hdf5"))]
use super::header::hdf5_disabled;
use super::header::{FileInfo, FileStamp, Format};
use super::paths::{regular_file, resolve_paths, unusable};
use super::reader::{unchanged_then, FileReader, Opened};
use super::schema::Field;
use super::source::RowSource;
use super::{arrow, megatron, npy, nulls, pack, parquet, raw, schema, wds};
use crate::config::DatasetOptions;
use crate::error::{Error, Result};
use crate::types::SampleId;

/// Reads the header of one file: its sample count and fields.
pub fn scan_file(path: &Path, format: Format, options: &DatasetOptions) -> Result<FileInfo> {
    // The stamp is taken before the header is read: a change after this point (also one
    // during the scan) is found by the first read.
    let meta = std::fs::metadata(path).map_err(|e| unusable(path, e))?;
    regular_file(path, &meta)?;
    let (bytes, stamp) = (meta.len(), FileStamp::of(&meta));
    // Variable-length value sizes (Arrow), and whether values can be read in place.
    let (samples, fields, value_bytes, in_place) = match format {
        Format::Npy => {
            let (samples, fields) = npy::scan(path)?;
            (samples, fields, Vec::new(), true)
        }
        #[cfg(feature = "hdf5")]
        Format::Hdf5 => {
            let (samples, fields, contiguous) = hdf5::scan(path, options.hdf5_group.as_deref())?;
            (samples, fields, Vec::new(), contiguous)
        }
        #[cfg(not(feature = "hdf5"))]
        Format::Hdf5 => {
            let _ = options; // only HDF5 files have options (the group)
            return Err(hdf5_disabled(path));
        }
        Format::Arrow => arrow::scan(path, &nulls::ColumnChoice::of(options))?,
        Format::Raw => {
            let (samples, fields) = raw::scan(path)?;
            (samples, fields, Vec::new(), true)
        }
        Format::WebDataset => {
            let (samples, fields, values) = wds::scan(path)?;
            (samples, fields, values, true)
        }
        Format::Megatron => {
            let (samples, fields, values) = megatron::scan(path)?;
            (samples, fields, values, true)
        }
        Format::Parquet => {
            let (samples, fields, values) = parquet::scan(path, &nulls::ColumnChoice::of(options))?;
            (samples, fields, values, false)
        }
    };
    if let Some(reason) = schema::duplicate_name(&fields) {
        return Err(Error::file(path, reason));
    }
    let mut info = FileInfo {
        path: path.to_path_buf(),
        format,
        samples,
        fields,
        bytes,
        stamp,
        value_bytes,
        in_place,
        pack_tokens: None,
    };
    if let Some(spec) = &options.pack {
        // The documents' lengths, once, here; each reader's rank plans from them again.
        let packing = pack::Packing::resolve(spec, &info.fields)?;
        let mut reader = open_format(&info, options, &info.fields, &Parsed::default())?;
        let lengths = reader.list_lengths(info.samples, packing.column, packing.dtype.size())?;
        info.pack_tokens = Some(packing.stream_tokens(&lengths));
    }
    Ok(info)
}

/// Opens a reader of `info`'s file in its format, expecting `fields`.
fn open_format(
    info: &FileInfo,
    options: &DatasetOptions,
    fields: &[Field],
    parsed: &Parsed,
) -> Result<Box<dyn FileReader>> {
    Ok(match info.format {
        Format::Npy => Box::new(npy::open(&info.path, fields)?) as Box<dyn FileReader>,
        Format::Raw => Box::new(raw::open(&info.path, fields)?),
        #[cfg(feature = "hdf5")]
        Format::Hdf5 => Box::new(hdf5::Hdf5Reader::open(&info.path, options, fields)?),
        #[cfg(not(feature = "hdf5"))]
        Format::Hdf5 => {
            let _ = options;
            return Err(hdf5_disabled(&info.path));
        }
        Format::Arrow => Box::new(arrow::ArrowReader::open_cached(
            &info.path,
            fields,
            &parsed.arrow,
            &nulls::ColumnChoice::of(options),
        )?),
        Format::WebDataset => Box::new(wds::WdsReader::open_cached(&info.path, fields, &parsed.tar)?),
        Format::Megatron => Box::new(megatron::MegatronReader::open_cached(&info.path, fields, &parsed.megatron)?),
        Format::Parquet => {
            let limit = options.decode_limit();
            Box::new(parquet::ParquetReader::open_cached(
                &info.path,
                fields,
                &parsed.parquet,
                limit,
                &nulls::ColumnChoice::of(options),
            )?)
        }
    })
}

/// What the first reader of a file parsed of it (footer, headers, index), by format: the
/// readers opened after it (each pass reopens the files) take it from here instead of
/// reading it again.
#[derive(Debug, Default)]
struct Parsed {
    arrow: arrow::LayoutCache,
    tar: wds::IndexCache,
    megatron: megatron::IndexCache,
    parquet: parquet::MetaCache,
    plan: pack::PlanCache,
}

/// An ordered list of files with identical fields.
#[derive(Clone, Debug)]
pub struct Dataset {
    files: Vec<FileInfo>,
    /// Every field of the files (`fields` is what is delivered of them).
    file_fields: Vec<Field>,
    /// The file field of each delivered field, where a selection leaves some out.
    columns: Option<Arc<[usize]>>,
    /// What each file's reader parsed of it, kept for the readers after it (shared by clones).
    parsed: Arc<[Parsed]>,
    /// With sequence packing, how the files' documents are packed (`fields` are then the
    /// packed fields and `starts` count packed samples).
    packing: Option<Arc<pack::Packing>>,
    fields: Vec<Field>,
    /// `starts[i]` is the global id of the first sample of file `i`; `starts[len]` is N.
    starts: Vec<u64>,
    options: DatasetOptions,
    /// Where the rows come from, where they are not read from the files here (a feeder).
    rows: Option<Arc<dyn RowSource>>,
}

impl Dataset {
    /// Builds a dataset from scanned file headers, checking that all files have the
    /// fields of the first one.
    pub fn from_files(mut files: Vec<FileInfo>, options: DatasetOptions) -> Result<Dataset> {
        let first = files.first().ok_or_else(|| Error::Config("the dataset has no files".into()))?;
        // `scan_file` refuses these already; headers built by hand come through here.
        if let Some(reason) = schema::duplicate_name(&first.fields) {
            return Err(Error::file(&first.path, reason));
        }
        for other in &files[1..] {
            if let Some(reason) = schema::describe_mismatch(&first.fields, &other.fields) {
                return Err(Error::SchemaMismatch { first: first.path.clone(), second: other.path.clone(), reason });
            }
        }
        let packing = options.pack.as_ref().map(|spec| pack::Packing::resolve(spec, &first.fields)).transpose()?;
        let mut starts = Vec::with_capacity(files.len() + 1);
        let mut total = 0u64;
        for f in &files {
            starts.push(total);
            let samples = match &packing {
                None => f.samples,
                Some(p) => p.samples(f.pack_tokens.ok_or_else(|| {
                    Error::Internal(format!("{} was scanned without the pack spec", f.path.display()))
                })?),
            };
            total = total.checked_add(samples).ok_or_else(|| Error::file(&f.path, "sample count overflows u64"))?;
        }
        starts.push(total);
        let file_fields = first.fields.clone();
        let delivered = packing.as_ref().map_or(&file_fields, |p| &p.fields);
        // A masked field's validity field comes with it, right after it.
        let names = options.fields.as_ref().map(|names| {
            let mut with = Vec::with_capacity(names.len());
            for n in names {
                with.push(n.clone());
                let valid = nulls::valid_field(n);
                if options.nulls.get(n) == Some(&nulls::NullPolicy::Mask) && !names.contains(&valid) {
                    with.push(valid);
                }
            }
            with
        });
        let columns = select(delivered, names.as_deref())?;
        let fields: Vec<Field> = match &columns {
            Some(c) => c.iter().map(|&i| delivered[i].clone()).collect(),
            None => delivered.clone(),
        };
        check_null_policies(&files, &options, &fields)?;
        // Packed values are made from documents, never read in place.
        if packing.is_some() {
            files.iter_mut().for_each(|f| f.in_place = false);
        }
        let parsed = files.iter().map(|_| Parsed::default()).collect();
        let packing = packing.map(Arc::new);
        Ok(Dataset { fields, file_fields, columns, files, parsed, packing, starts, options, rows: None })
    }

    /// The same dataset, its rows read from `rows` (a feeder) rather than from its files
    /// (which need not exist here): nothing is read in place.
    pub fn served_by(mut self, rows: Arc<dyn RowSource>) -> Dataset {
        // (A packed dataset cannot be served: its files' headers carry no token counts, so
        // `from_files` refused it before; `open_dataset` says why.)
        self.files.iter_mut().for_each(|f| f.in_place = false);
        self.rows = Some(rows);
        self
    }

    /// Where the rows come from when not from the files here (a feeder), if anywhere.
    pub fn row_source(&self) -> Option<&dyn RowSource> {
        self.rows.as_deref()
    }

    /// Resolves and scans every file in this process (no communication).
    pub fn open_local(paths: &[PathBuf], options: DatasetOptions) -> Result<Dataset> {
        let files =
            resolve_paths(paths)?.into_iter().map(|(p, f)| scan_file(&p, f, &options)).collect::<Result<Vec<_>>>()?;
        Dataset::from_files(files, options)
    }

    /// Number of samples `N`.
    pub fn len(&self) -> u64 {
        *self.starts.last().expect("starts has len + 1 entries")
    }

    /// Whether the dataset has no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Per field, the mean bytes of a variable-length value where every file tells its
    /// values' size ([`FileInfo::value_bytes`]); `None` for fixed-size fields and where a
    /// file does not say.
    pub fn mean_value_bytes(&self) -> Vec<Option<u64>> {
        (0..self.fields.len())
            .map(|f| {
                if self.fields[f].fixed_bytes().is_some() || self.is_empty() {
                    return None;
                }
                if let Some(p) = &self.packing {
                    // cu_seqlens, the one variable-length packed field.
                    let documents = self.files.iter().map(|f| f.samples).sum();
                    return Some(p.mean_cu_seqlens_bytes(documents, self.len()));
                }
                let column = self.columns.as_ref().map_or(f, |c| c[f]);
                let total = self.files.iter().try_fold(0u64, |sum, file| {
                    let bytes = *file.value_bytes.get(column)?;
                    sum.checked_add(bytes)
                })?;
                Some(total.div_ceil(self.len()))
            })
            .collect()
    }

    /// The fields of every sample.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// The files, in id order.
    pub fn files(&self) -> &[FileInfo] {
        &self.files
    }

    /// The options the dataset was opened with.
    pub fn options(&self) -> &DatasetOptions {
        &self.options
    }

    /// Global id of the first sample of file `i` (`i == files().len()` gives N).
    pub fn file_start(&self, i: usize) -> u64 {
        self.starts[i]
    }

    /// The file holding a sample and the row within it.
    pub fn locate(&self, id: SampleId) -> (usize, u64) {
        debug_assert!(id.0 < self.len());
        // `starts` is sorted; the file is the last one starting at or before `id`
        // (empty files share a start with their successor and are skipped).
        let file = self.starts.partition_point(|&s| s <= id.0) - 1;
        (file, id.0 - self.starts[file])
    }

    /// Opens file `i` for reading rows. The reader checks after opening and after every
    /// read that the file is still the one scanned ([`FileInfo::check_unchanged`]): a file
    /// that changes under a running job is an error naming what changed, never stale or
    /// zero-filled rows.
    pub fn open_reader(&self, i: usize) -> Result<Box<dyn FileReader>> {
        let info = &self.files[i];
        // A row source's reader checks nothing here: the file is the source's.
        let (inner, local) = match &self.rows {
            Some(rows) => (rows.reader(i, info)?, false),
            None => (unchanged_then(info, self.open_file(i))?, true),
        };
        let (columns, info) = (self.columns.clone(), local.then(|| info.clone()));
        Ok(if columns.is_none() && info.is_none() { inner } else { Box::new(Opened { inner, columns, info }) })
    }

    /// A reader of local file `i` in its format, packed where the dataset packs.
    fn open_file(&self, i: usize) -> Result<Box<dyn FileReader>> {
        let info = &self.files[i];
        let reader = open_format(info, &self.options, &self.file_fields, &self.parsed[i])?;
        let Some(packing) = &self.packing else { return Ok(reader) };
        let tokens = info.pack_tokens.ok_or_else(|| Error::Internal("a packed file without its token count".into()))?;
        let packed =
            pack::PackedReader::open(reader, &info.path, info.samples, packing.clone(), tokens, &self.parsed[i].plan)?;
        Ok(Box::new(packed))
    }
}

/// Refuses a null policy (`--nulls`) naming a field that is not delivered, one of packed
/// fields, or one of a file format without nulls: a policy must never be silently unused.
fn check_null_policies(files: &[FileInfo], options: &DatasetOptions, fields: &[Field]) -> Result<()> {
    let Some(name) = options.nulls.keys().next() else { return Ok(()) };
    if options.pack.is_some() {
        return Err(Error::Config(format!("--nulls {name}=...: null policies do not apply to packed fields (--pack)")));
    }
    for name in options.nulls.keys() {
        if !fields.iter().any(|f| &f.name == name) {
            let all: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
            return Err(Error::Config(format!(
                "--nulls names field '{name}', which is not delivered (fields: {})",
                all.join(", ")
            )));
        }
    }
    if let Some(f) = files.iter().find(|f| !matches!(f.format, Format::Arrow | Format::Parquet)) {
        return Err(Error::file(
            &f.path,
            format!("--nulls {name}=...: only Arrow and Parquet columns have nulls; this file is {:?}", f.format),
        ));
    }
    Ok(())
}

/// The file field of each field `names` selects, or `None` for every field in file order.
/// An unknown or repeated name, or an empty list, is an error.
fn select(fields: &[Field], names: Option<&[String]>) -> Result<Option<Arc<[usize]>>> {
    let Some(names) = names else { return Ok(None) };
    if names.is_empty() {
        return Err(Error::Config("--fields selects no field".into()));
    }
    let mut columns = Vec::with_capacity(names.len());
    for name in names {
        let i = fields.iter().position(|f| &f.name == name).ok_or_else(|| {
            let all: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
            Error::Config(format!("--fields names unknown field '{name}' (fields: {})", all.join(", ")))
        })?;
        if columns.contains(&i) {
            return Err(Error::Config(format!("--fields names '{name}' twice")));
        }
        columns.push(i);
    }
    Ok(Some(columns.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::gen;
    use crate::dataset::schema::DType;
    use crate::dataset::schema::FieldKind;

    fn info(name: &str, samples: u64) -> FileInfo {
        FileInfo {
            path: name.into(),
            format: Format::Npy,
            samples,
            fields: vec![Field::tensor("data", DType::F32, vec![2])],
            bytes: 0,
            stamp: FileStamp::default(),
            value_bytes: vec![],
            in_place: true,
            pack_tokens: None,
        }
    }

    #[test]
    fn locate_maps_ids_to_files_skipping_empty_ones() {
        let ds = Dataset::from_files(vec![info("a", 3), info("b", 0), info("c", 2)], Default::default()).unwrap();
        assert_eq!(ds.len(), 5);
        let got: Vec<_> = (0..5).map(|i| ds.locate(SampleId(i))).collect();
        assert_eq!(got, vec![(0, 0), (0, 1), (0, 2), (2, 0), (2, 1)]);
    }

    #[test]
    fn schema_mismatch_names_both_files() {
        let mut b = info("b.npy", 2);
        b.fields[0] = Field::tensor("data", DType::I32, vec![2]);
        let err = Dataset::from_files(vec![info("a.npy", 1), b], Default::default()).unwrap_err().to_string();
        assert!(err.contains("a.npy") && err.contains("b.npy") && err.contains("'data'"), "{err}");
    }

    #[test]
    fn missing_path_and_unknown_format_are_errors() {
        let err = resolve_paths(&["/nonexistent/meshfeed".into()]).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/meshfeed: No such file or directory (os error 2)"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("x.csv");
        std::fs::write(&odd, "1").unwrap();
        assert!(resolve_paths(&[odd]).unwrap_err().to_string().contains("unknown format"));
        assert!(resolve_paths(&[dir.path().into()]).unwrap_err().to_string().contains("holds no"));
    }

    #[test]
    fn unusable_directory_entries_and_special_files_are_errors() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.npy"), "").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "").unwrap();
        // Entries of unsupported extensions stay ignored, also unusable ones.
        std::os::unix::fs::symlink("missing", dir.path().join("z.txt")).unwrap();
        assert_eq!(resolve_paths(&[dir.path().into()]).unwrap().len(), 1);
        let fails = |setup: &dyn Fn(&Path) -> PathBuf, needle: &str| {
            let d = tempfile::tempdir().unwrap();
            std::fs::write(d.path().join("a.npy"), "").unwrap();
            let bad = setup(d.path());
            let err = resolve_paths(&[d.path().into()]).unwrap_err().to_string();
            assert!(err.contains(bad.to_str().unwrap()) && err.contains(needle), "{err}");
            if !bad.is_dir() {
                // Given directly, the same path is the same error.
                let err = resolve_paths(std::slice::from_ref(&bad)).unwrap_err().to_string();
                assert!(err.contains(bad.to_str().unwrap()) && err.contains(needle), "{err}");
            }
        };
        fails(
            &|d| {
                let p = d.join("b.npy");
                std::os::unix::fs::symlink(d.join("gone.npy"), &p).unwrap();
                p
            },
            "dangling symbolic link",
        );
        fails(
            &|d| {
                let p = d.join("loop.arrow");
                std::os::unix::fs::symlink(&p, &p).unwrap();
                p
            },
            "symbolic link loop",
        );
        fails(
            &|d| {
                let p = d.join("sub.npy");
                std::fs::create_dir(&p).unwrap();
                p
            },
            "is a directory, not a regular file",
        );
        fails(
            &|d| {
                let p = d.join("pipe.h5");
                let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
                // SAFETY: a valid NUL-terminated path; mkfifo only reads it.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
                p
            },
            "is a FIFO (named pipe)",
        );
        fails(
            &|d| {
                let p = d.join("sock.raw");
                let listener = std::os::unix::net::UnixListener::bind(&p).unwrap();
                std::mem::forget(listener);
                p
            },
            "is a socket",
        );
        let err = resolve_paths(&["/dev/null".into()]).unwrap_err().to_string();
        assert!(err.contains("/dev/null") && err.contains("character device"), "{err}");
    }

    #[test]
    fn a_file_that_changes_after_its_scan_is_an_error_naming_the_change() {
        let (dir, _) = gen::GenSpec::write_temp(Format::Npy, 100, 1, 16, vec![Field::tensor("x", DType::U8, vec![10])]);
        let ds = Dataset::open_local(&[dir.path().into()], Default::default()).unwrap();
        let info = &ds.files()[0];
        info.check_unchanged().unwrap();
        let mut reader = ds.open_reader(0).unwrap();
        reader.read_rows(&[0, 50, 99]).unwrap();
        // Past the file system's timestamp granularity (a clock tick), so that the
        // rewrite below gets another modification time.
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Truncated in place: the size differs (rows still inside the file read fine,
        // and are refused all the same).
        let file = std::fs::OpenOptions::new().write(true).open(&info.path).unwrap();
        file.set_len(info.bytes - 100).unwrap();
        for err in [
            reader.read_rows(&[0]).unwrap_err(),
            reader.read_rows(&[99]).unwrap_err(),
            ds.open_reader(0).err().unwrap(),
        ] {
            let err = err.to_string();
            let want = format!("changed since the dataset was opened: {} → {} bytes", info.bytes, info.bytes - 100);
            assert!(err.contains(info.path.to_str().unwrap()) && err.contains(&want), "{err}");
        }
        // Same size, rewritten: the modification time differs.
        file.set_len(info.bytes).unwrap();
        let err = reader.read_rows(&[0]).unwrap_err().to_string();
        assert!(err.contains("changed since the dataset was opened: modified (mtime"), "{err}");
        // Replaced by another file of the same size and time: the inode differs.
        let other = dir.path().join("other");
        std::fs::copy(&info.path, &other).unwrap();
        std::fs::rename(&other, &info.path).unwrap();
        let mut moved = info.clone();
        moved.stamp.modified_ns = FileStamp::of(&std::fs::metadata(&info.path).unwrap()).modified_ns;
        let err = moved.check_unchanged().unwrap_err().to_string();
        assert!(err.contains("replaced by another file (inode"), "{err}");
        // Scanned on another host, whose inode numbers may differ from this one's (sshfs):
        // the inode is not compared there.
        let mut elsewhere = moved.clone();
        elsewhere.stamp.host ^= 1;
        elsewhere.check_unchanged().unwrap();
        // Removed.
        std::fs::remove_file(&info.path).unwrap();
        let err = info.check_unchanged().unwrap_err().to_string();
        assert!(err.contains("can no longer be read"), "{err}");
    }

    #[test]
    fn duplicate_field_names_are_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        // A structured .npy whose header repeats a member name (numpy refuses to write one).
        let p = dir.path().join("dup.npy");
        let mut bytes = npy::header(&[Field::tensor("a", DType::U8, vec![]), Field::tensor("b", DType::U8, vec![])], 3);
        let at = bytes.windows(5).position(|w| w == b"('b',").unwrap();
        bytes[at + 2] = b'a';
        bytes.extend([0u8; 6]);
        std::fs::write(&p, &bytes).unwrap();
        let err = scan_file(&p, Format::Npy, &Default::default()).unwrap_err().to_string();
        assert!(err.contains("dup.npy") && err.contains("two fields are named 'a'"), "{err}");
        // Headers built by hand are checked too.
        let mut i = info("hand.npy", 2);
        i.fields.push(i.fields[0].clone());
        let err = Dataset::from_files(vec![i], Default::default()).unwrap_err().to_string();
        assert!(err.contains("hand.npy") && err.contains("'data'"), "{err}");
    }

    #[test]
    fn directories_are_listed_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["b.npy", "a.npy", "c.txt", "10.npy"] {
            std::fs::write(dir.path().join(n), "").unwrap();
        }
        let got: Vec<String> = resolve_paths(&[dir.path().into()])
            .unwrap()
            .into_iter()
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(got, vec!["10.npy", "a.npy", "b.npy"]);
    }

    /// An Arrow file's footer and batch headers are parsed by its first reader and shared
    /// by the later ones (a pass reopens each file; a header is one small read per batch).
    #[test]
    fn arrow_layouts_are_parsed_once_per_dataset() {
        let (dir, _) =
            gen::GenSpec::write_temp(Format::Arrow, 100, 2, 10, vec![Field::tensor("x", DType::U8, vec![4])]);
        let ds = Dataset::open_local(&[dir.path().into()], Default::default()).unwrap();
        assert!(ds.parsed.iter().all(|p| p.arrow.get().is_none()));
        let mut a = ds.open_reader(1).unwrap();
        let layout = ds.parsed[1].arrow.get().expect("parsed by the first reader").clone();
        let mut b = ds.clone().open_reader(1).unwrap();
        // The cache, the test's handle and the two readers.
        assert_eq!(Arc::strong_count(&layout), 4);
        assert!(ds.parsed[0].arrow.get().is_none());
        assert_eq!(a.read_rows(&[7, 42]).unwrap().value(1, 0), b.read_rows(&[42]).unwrap().value(0, 0));
    }

    /// `fields` delivers those fields in the order given; HDF5 and Arrow read only their
    /// bytes, npy the whole records; value ranges follow the selection.
    #[test]
    fn a_field_selection_reads_and_delivers_only_those_fields() {
        let fields = vec![
            Field::tensor("a", DType::U8, vec![1000]),
            Field::tensor("b", DType::I64, vec![]),
            Field::tensor("c", DType::U16, vec![3]),
        ];
        for format in [Format::Npy, Format::Hdf5, Format::Arrow] {
            let (dir, _) = gen::GenSpec::write_temp(format, 50, 1, 10, fields.clone());
            let open = |names: Option<Vec<&str>>| {
                let options = DatasetOptions {
                    fields: names.map(|n| n.into_iter().map(String::from).collect()),
                    ..Default::default()
                };
                Dataset::open_local(&[dir.path().into()], options)
            };
            let all = open(None).unwrap();
            let ds = open(Some(vec!["c", "b"])).unwrap();
            assert_eq!(ds.fields(), &[fields[2].clone(), fields[1].clone()], "{format:?}");
            let rows = [3u64, 4, 30];
            let whole = all.open_reader(0).unwrap().read_rows(&rows).unwrap();
            let mut r = ds.open_reader(0).unwrap();
            let some = r.read_rows(&rows).unwrap();
            for k in 0..rows.len() {
                assert_eq!(some.value(k, 0), whole.value(k, 2), "{format:?}");
                assert_eq!(some.value(k, 1), whole.value(k, 1), "{format:?}");
            }
            if format != Format::Npy {
                // Not the 1000-byte values of `a`.
                assert!(some.bytes_read() < 1000, "{format:?}: {} bytes", some.bytes_read());
            }
            let full = all.open_reader(0).unwrap();
            if let Some(v) = full.value_range(4, 2) {
                assert_eq!(r.value_range(4, 0), Some(v), "{format:?}");
            }
            assert_eq!(r.value_range(4, 2), None, "{format:?}: no third field");
            for (names, needle) in [
                (vec!["d"], "unknown field 'd' (fields: a, b, c)"),
                (vec!["a", "a"], "names 'a' twice"),
                (vec![], "selects no field"),
            ] {
                let e = open(Some(names)).unwrap_err().to_string();
                assert!(e.contains(needle), "{e}");
            }
        }
    }

    /// Subdirectories are walked where their names come, at any depth, hidden ones not;
    /// a symbolic link back into the tree is an error, not the same files twice.
    #[test]
    fn subdirectories_are_walked_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["b/deep", "c", ".cache", "empty"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        for n in ["a.npy", "b/x.npy", "b/deep/y.npy", "b/z.npy", "c/a.npy", "d.npy", ".cache/hidden.npy", "b/notes.txt"]
        {
            std::fs::write(d.join(n), "").unwrap();
        }
        let got: Vec<String> = resolve_paths(&[d.into()])
            .unwrap()
            .into_iter()
            .map(|(p, _)| p.strip_prefix(d).unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(got, vec!["a.npy", "b/deep/y.npy", "b/x.npy", "b/z.npy", "c/a.npy", "d.npy"]);
        // A tree whose only dataset files are deep inside is a dataset; one with none is not.
        assert_eq!(resolve_paths(&[d.join("b")]).unwrap().len(), 3);
        let err = resolve_paths(&[d.join("empty")]).unwrap_err().to_string();
        assert!(err.contains("holds no") && err.contains("empty"), "{err}");
        // A link back up: named, never followed round.
        std::os::unix::fs::symlink(d, d.join("c/loop")).unwrap();
        let err = resolve_paths(&[d.into()]).unwrap_err().to_string();
        assert!(err.contains("c/loop") && err.contains("reached twice"), "{err}");
    }

    /// Every format `meshfeed gen` writes round-trips: the bytes read back equal the
    /// generator's bytes.
    #[test]
    fn every_format_round_trips() {
        for format in [Format::Npy, Format::Raw, Format::Hdf5, Format::Arrow] {
            let mut fields = vec![
                Field::tensor("x", DType::F32, vec![2, 3]),
                Field::tensor("y", DType::I64, vec![]),
                Field::tensor("z", DType::U8, vec![5]),
            ];
            if format == Format::Arrow {
                fields.push(Field { name: "t".into(), kind: FieldKind::Bytes { utf8: false, elem: None } });
            }
            let (dir, spec) = gen::GenSpec::write_temp(format, 23, 3, 4, fields.clone());
            spec.validate().unwrap();
            gen::write_side_files(&spec).unwrap();
            let ds = Dataset::open_local(&[dir.path().into()], Default::default()).unwrap();
            assert_eq!(ds.len(), 23, "{format:?}");
            // HDF5 lists datasets by name; compare by name.
            let mut names: Vec<_> = ds.fields().iter().map(|f| f.name.clone()).collect();
            names.sort();
            let mut want: Vec<_> = fields.iter().map(|f| f.name.clone()).collect();
            want.sort();
            assert_eq!(names, want);
            for file in 0..3 {
                let mut r = ds.open_reader(file).unwrap();
                let n = ds.files()[file].samples;
                let rows: Vec<u64> = (0..n).filter(|r| r % 2 == 0 || *r == n - 1).collect();
                let chunk = r.read_rows(&rows).unwrap();
                for (i, &row) in rows.iter().enumerate() {
                    let id = ds.file_start(file) + row;
                    for (fi, f) in ds.fields().iter().enumerate() {
                        let gi = fields.iter().position(|g| g.name == f.name).unwrap();
                        let mut want = Vec::new();
                        gen::value(&fields, id, gi, &mut want);
                        assert_eq!(chunk.value(i, fi), &want[..], "{format:?} id {id} field {}", f.name);
                    }
                }
            }
            assert_eq!(gen::find_manifest(&[dir.path().into()]).unwrap().unwrap().samples, 23);
        }
    }
}
