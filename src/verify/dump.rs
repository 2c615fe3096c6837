//! The `--dump DIR` format (docs/design.md, "Verifiability"): one `rank-<r>.jsonl` per
//! rank, one line per delivered step:
//!
//! ```text
//! {"epoch":0,"step":3,"ids":[17,4,88],"crc32":{"x":[3735928559,305419896,2596069104],"y":[...]}}
//! ```
//!
//! `ids` are the global sample ids of the rank's rows in row order; `crc32` holds, per
//! field, the zlib-compatible CRC-32 of each row's bytes. Field names are written in
//! sorted order so that the file does not depend on the input format's field order.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::loader::Batch;

/// Writes one rank's dump file.
pub struct DumpWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl DumpWriter {
    /// Creates `dir/rank-<rank>.jsonl` (and `dir`).
    pub fn create(dir: &Path, rank: usize) -> Result<DumpWriter> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let path = dir.join(format!("rank-{rank}.jsonl"));
        let file = File::create(&path).map_err(|e| Error::io(&path, e))?;
        Ok(DumpWriter { path, out: BufWriter::new(file) })
    }

    /// Appends the line of one delivered batch.
    pub fn write(&mut self, batch: &Batch) -> Result<()> {
        let line = line(batch);
        self.out.write_all(line.as_bytes()).map_err(|e| Error::io(&self.path, e))
    }

    /// Flushes the file.
    pub fn finish(mut self) -> Result<()> {
        self.out.flush().map_err(|e| Error::io(&self.path, e))
    }
}

/// The dump line of a batch, with its trailing newline.
pub fn line(batch: &Batch) -> String {
    let ids: Vec<String> = batch.ids().iter().map(|id| id.0.to_string()).collect();
    let mut fields: Vec<_> = batch.fields().iter().collect();
    fields.sort_by(|a, b| a.field().name.cmp(&b.field().name));
    let crcs: Vec<String> = fields
        .iter()
        .map(|f| {
            let values: Vec<String> = (0..f.rows()).map(|r| crc32fast::hash(f.row(r)).to_string()).collect();
            format!("{}:[{}]", serde_json::to_string(&f.field().name).expect("string"), values.join(","))
        })
        .collect();
    format!(
        "{{\"epoch\":{},\"step\":{},\"ids\":[{}],\"crc32\":{{{}}}}}\n",
        batch.epoch(),
        batch.step(),
        ids.join(","),
        crcs.join(",")
    )
}
