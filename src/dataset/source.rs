//! Where a dataset's rows come from when they are not read from its files here: a
//! [`RowSource`] handed to the dataset ([`super::Dataset::served_by`]). The dataset knows
//! only this seam; the feeder's client ([`crate::feed::client::Feed`]) is one.

use std::any::Any;
use std::fmt;

use super::gen::Manifest;
use super::header::FileInfo;
use super::reader::FileReader;
use crate::error::Result;

/// Rows of a dataset's files, served from elsewhere than the files in place.
pub trait RowSource: Send + Sync + fmt::Debug {
    /// A reader of file `file` (`info`: its header). Its reads are checked by the source,
    /// not against the file here (which need not exist).
    fn reader(&self, file: usize, info: &FileInfo) -> Result<Box<dyn FileReader>>;

    /// Where the rows come from, for messages (a feeder's `meshfeed://HOST:PORT/NAME`).
    fn describe(&self) -> String;

    /// The generator's manifest, where the source serves `meshfeed gen`'s files (so that
    /// `--verify` checks contents as it does on the files).
    fn manifest(&self) -> Option<&Manifest> {
        None
    }

    /// The source itself, for the layers that know its type.
    fn as_any(&self) -> &dyn Any;
}
