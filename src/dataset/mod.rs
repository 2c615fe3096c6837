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
mod arrow_write;
pub mod gen;
#[cfg(feature = "hdf5")]
pub mod hdf5;
pub mod header;
pub mod megatron;
pub mod npy;
pub mod npy_header;
pub mod nulls;
mod open;
pub mod pack;
pub mod parquet;
mod parquet_pages;
pub mod paths;
pub mod positional;
pub mod raw;
pub mod reader;
pub mod records;
pub mod rows;
pub mod schema;
pub mod source;
pub mod wds;

pub use crate::config::{DatasetOptions, MIN_DECODE_LIMIT};
pub use header::{FileInfo, FileStamp, Format};
pub use open::{scan_file, Dataset};
pub use paths::resolve_paths;
pub use reader::FileReader;
pub use rows::RowChunk;
pub use schema::{DType, Field, FieldKind, RowLayout};
pub use source::RowSource;
