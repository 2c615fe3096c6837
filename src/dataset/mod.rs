//! Datasets: an ordered list of files whose samples form the global id space `[0, N)`.
//!
//! Global sample ids run in file order, then row order (docs/design.md, "Dataset"). This module
//! knows how to find the files of a dataset ([`resolve_paths`]), how to read the header of
//! one file ([`scan_file`]: sample count and fields, without reading the data), and how to
//! read rows of a file ([`FileReader`]). It has no communication in it: the collective
//! open, where each header is scanned by one rank and the results are shared, lives in
//! [`crate::loader`].
//!
//! Formats: NumPy `.npy` ([`npy`]), HDF5 `.h5`/`.hdf5` (`hdf5`, with the feature of that name), Arrow IPC files
//! `.arrow`/`.feather`/`.ipc` ([`arrow`]) and raw fixed-size records `.raw` with a
//! `schema.json` beside them ([`raw`]).

pub mod arrow;
pub mod gen;
#[cfg(feature = "hdf5")]
pub mod hdf5;
pub mod npy;
pub mod npy_header;
pub mod raw;
pub mod rows;
pub mod schema;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::types::SampleId;
pub use rows::RowChunk;
pub use schema::{DType, Field, FieldKind};

/// A file format meshfeed can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Npy,
    Hdf5,
    Arrow,
    Raw,
}

impl Format {
    /// The format a file name implies, from its extension.
    pub fn from_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "npy" => Some(Format::Npy),
            "h5" | "hdf5" => Some(Format::Hdf5),
            "arrow" | "feather" | "ipc" => Some(Format::Arrow),
            "raw" => Some(Format::Raw),
            _ => None,
        }
    }

    /// Parses a format name as given to `meshfeed gen --format`.
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "npy" => Some(Format::Npy),
            "hdf5" | "h5" => Some(Format::Hdf5),
            "arrow" => Some(Format::Arrow),
            "raw" => Some(Format::Raw),
            _ => None,
        }
    }

    /// File extension used when writing.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Npy => "npy",
            Format::Hdf5 => "h5",
            Format::Arrow => "arrow",
            Format::Raw => "raw",
        }
    }
}

/// Options that change how files are interpreted.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DatasetOptions {
    /// HDF5 group holding the datasets (default: the file root).
    pub hdf5_group: Option<String>,
}

/// What the header of one file says.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileInfo {
    pub path: PathBuf,
    pub format: Format,
    pub samples: u64,
    pub fields: Vec<Field>,
    /// Size of the file in bytes.
    pub bytes: u64,
}

/// Expands `--data` arguments into the ordered list of files.
///
/// A directory contributes every file of a supported format in it, in lexicographic
/// order of the names; a file is taken as given. A missing path, an empty directory or
/// a file of unknown format is an error naming the path.
pub fn resolve_paths(paths: &[PathBuf]) -> Result<Vec<(PathBuf, Format)>> {
    if paths.is_empty() {
        return Err(Error::Config("no dataset given (--data PATH...)".into()));
    }
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::file(path, "no such file or directory"),
            _ => Error::io(path, e),
        })?;
        if meta.is_dir() {
            let mut found: Vec<(PathBuf, Format)> = std::fs::read_dir(path)
                .map_err(|e| Error::io(path, e))?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .filter_map(|p| Format::from_path(&p).map(|f| (p, f)))
                .collect();
            if found.is_empty() {
                return Err(Error::file(path, "directory holds no .npy, .h5, .arrow or .raw files"));
            }
            found.sort_by(|a, b| a.0.file_name().cmp(&b.0.file_name()));
            files.extend(found);
        } else {
            let format = Format::from_path(path).ok_or_else(|| {
                Error::file(path, "unknown format (expected .npy, .h5/.hdf5, .arrow/.feather/.ipc or .raw)")
            })?;
            files.push((path.clone(), format));
        }
    }
    Ok(files)
}

/// Without the `hdf5` feature, an HDF5 file is a clear error naming it.
#[cfg(not(feature = "hdf5"))]
pub(crate) fn hdf5_disabled(path: &Path) -> Error {
    Error::feature_disabled("hdf5", format!("HDF5 file {}", path.display()))
}

/// Reads the header of one file: its sample count and fields.
pub fn scan_file(path: &Path, format: Format, options: &DatasetOptions) -> Result<FileInfo> {
    let bytes = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
    let (samples, fields) = match format {
        Format::Npy => npy::scan(path)?,
        #[cfg(feature = "hdf5")]
        Format::Hdf5 => hdf5::scan(path, options.hdf5_group.as_deref())?,
        #[cfg(not(feature = "hdf5"))]
        Format::Hdf5 => {
            let _ = options; // only HDF5 files have options (the group)
            return Err(hdf5_disabled(path));
        }
        Format::Arrow => arrow::scan(path)?,
        Format::Raw => raw::scan(path)?,
    };
    Ok(FileInfo { path: path.to_path_buf(), format, samples, fields, bytes })
}

/// Reads rows of one file.
pub trait FileReader: Send {
    /// Reads the given rows of this file: local row indices, sorted ascending, unique.
    /// The returned chunk holds them in the same order.
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk>;
}

/// An ordered list of files with identical fields.
#[derive(Clone, Debug)]
pub struct Dataset {
    files: Vec<FileInfo>,
    fields: Vec<Field>,
    /// `starts[i]` is the global id of the first sample of file `i`; `starts[len]` is N.
    starts: Vec<u64>,
    options: DatasetOptions,
}

impl Dataset {
    /// Builds a dataset from scanned file headers, checking that all files have the
    /// fields of the first one.
    pub fn from_files(files: Vec<FileInfo>, options: DatasetOptions) -> Result<Dataset> {
        let first = files.first().ok_or_else(|| Error::Config("the dataset has no files".into()))?;
        for other in &files[1..] {
            if let Some(reason) = schema::describe_mismatch(&first.fields, &other.fields) {
                return Err(Error::SchemaMismatch { first: first.path.clone(), second: other.path.clone(), reason });
            }
        }
        let mut starts = Vec::with_capacity(files.len() + 1);
        let mut total = 0u64;
        for f in &files {
            starts.push(total);
            total = total.checked_add(f.samples).ok_or_else(|| Error::file(&f.path, "sample count overflows u64"))?;
        }
        starts.push(total);
        Ok(Dataset { fields: first.fields.clone(), files, starts, options })
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

    /// Opens file `i` for reading rows.
    pub fn open_reader(&self, i: usize) -> Result<Box<dyn FileReader>> {
        let info = &self.files[i];
        Ok(match info.format {
            Format::Npy => Box::new(npy::open(&info.path, &self.fields)?),
            Format::Raw => Box::new(raw::open(&info.path, &self.fields)?),
            #[cfg(feature = "hdf5")]
            Format::Hdf5 => Box::new(hdf5::Hdf5Reader::open(&info.path, &self.options, &self.fields)?),
            #[cfg(not(feature = "hdf5"))]
            Format::Hdf5 => return Err(hdf5_disabled(&info.path)),
            Format::Arrow => Box::new(arrow::ArrowReader::open(&info.path, &self.fields)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, samples: u64) -> FileInfo {
        FileInfo {
            path: name.into(),
            format: Format::Npy,
            samples,
            fields: vec![Field::tensor("data", DType::F32, vec![2])],
            bytes: 0,
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
        assert!(err.contains("/nonexistent/meshfeed") && err.contains("no such file"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("x.csv");
        std::fs::write(&odd, "1").unwrap();
        assert!(resolve_paths(&[odd]).unwrap_err().to_string().contains("unknown format"));
        assert!(resolve_paths(&[dir.path().into()]).unwrap_err().to_string().contains("holds no"));
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
}
