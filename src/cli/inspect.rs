//! `meshfeed inspect`: files, sample counts, fields and sizes of a dataset.

use crate::dataset::Dataset;
use crate::error::Result;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    pub data: super::DataArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: InspectArgs) -> Result<()> {
    let ds = Dataset::open_local(&args.data.data, args.data.options())?;
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
