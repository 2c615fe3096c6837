//! `meshfeed inspect`: files, sample counts, fields and sizes of a dataset.

use std::path::PathBuf;

use meshfeed::dataset::{Dataset, DatasetOptions};
use meshfeed::Result;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// Dataset files or directories (all supported files in a directory, in name order).
    #[arg(long, num_args = 1.., required = true, value_name = "PATH")]
    pub data: Vec<PathBuf>,
    /// HDF5 group that holds the datasets (default: the file root).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: InspectArgs) -> Result<()> {
    let ds = Dataset::open_local(&args.data, DatasetOptions { hdf5_group: args.group })?;
    let total_bytes: u64 = ds.files().iter().map(|f| f.bytes).sum();
    if args.json {
        let v = serde_json::json!({
            "samples": ds.len(),
            "bytes": total_bytes,
            "files": ds.files(),
            "fields": ds.fields(),
        });
        println!("{v}");
        return Ok(());
    }
    println!("{} file(s), {} samples, {} bytes", ds.files().len(), ds.len(), total_bytes);
    println!("\nfiles:");
    for (i, f) in ds.files().iter().enumerate() {
        println!(
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
    println!("\nfields:");
    for f in ds.fields() {
        let per = f.fixed_bytes().map_or("variable".to_string(), |b| format!("{b} bytes/sample"));
        println!("  {:<16} {:<24} {}", f.name, f.kind.to_string(), per);
    }
    Ok(())
}
