//! `meshfeed inspect`: files, sample counts, fields and sizes of a dataset.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use meshfeed::dataset::{Dataset, DatasetOptions};
use meshfeed::Result;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// Dataset files or directories (all supported files in a directory and its
    /// subdirectories, in path order).
    #[arg(long, num_args = 1.., required = true, value_name = "PATH")]
    pub data: Vec<PathBuf>,
    /// HDF5 group that holds the datasets (default: the file root).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// Print one JSON object instead of text (a file name that is not UTF-8 appears with
    /// U+FFFD for its invalid bytes in `path`, and exactly in `path_bytes`).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: InspectArgs) -> Result<()> {
    let ds = Dataset::open_local(&args.data, DatasetOptions { hdf5_group: args.group, ..Default::default() })?;
    let total_bytes: u64 = ds.files().iter().map(|f| f.bytes).sum();
    if args.json {
        // File names need not be UTF-8 and JSON strings must be: `path` is the name with
        // invalid bytes replaced by U+FFFD, and only then `path_bytes` gives the exact
        // bytes (an array of numbers).
        let files: Vec<serde_json::Value> = ds
            .files()
            .iter()
            .map(|f| {
                let mut v = serde_json::json!({
                    "path": f.path.to_string_lossy(),
                    "format": f.format,
                    "samples": f.samples,
                    "fields": f.fields,
                    "bytes": f.bytes,
                });
                if f.path.to_str().is_none() {
                    v["path_bytes"] = serde_json::json!(f.path.as_os_str().as_bytes());
                }
                v
            })
            .collect();
        let v = serde_json::json!({
            "samples": ds.len(),
            "bytes": total_bytes,
            "files": files,
            "fields": ds.fields(),
        });
        out!("{v}");
        return Ok(());
    }
    out!("{} file(s), {} samples, {} bytes", ds.files().len(), ds.len(), total_bytes);
    out!("\nfiles:");
    for (i, f) in ds.files().iter().enumerate() {
        out!(
            "  {:>4}  {:<6} {:>10} samples  ids {:>10}..{:<10} {:>12} bytes  {}",
            i,
            format!("{:?}", f.format).to_lowercase(),
            f.samples,
            ds.file_start(i),
            ds.file_start(i + 1),
            f.bytes,
            f.path.display()
        );
    }
    out!("\nfields:");
    for f in ds.fields() {
        let per = f.fixed_bytes().map_or("variable".to_string(), |b| format!("{b} bytes/sample"));
        out!("  {:<16} {:<24} {}", f.name, f.kind.to_string(), per);
    }
    Ok(())
}
