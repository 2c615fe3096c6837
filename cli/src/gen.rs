//! `meshfeed gen`: write a synthetic dataset (contents are a function of the sample id).

use std::path::PathBuf;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;

use meshfeed::dataset::gen::{self, GenSpec};
use meshfeed::dataset::Format;
use meshfeed::{Error, Result};

#[derive(clap::Args, Debug)]
pub struct GenArgs {
    /// Output format: npy, hdf5, arrow or raw.
    #[arg(long)]
    pub format: String,
    /// Number of samples.
    #[arg(long)]
    pub samples: u64,
    /// Number of files (samples are spread evenly, remainder to the first files).
    #[arg(long, default_value_t = 1)]
    pub files: u64,
    /// A field as `name:dtype[:shape]`, e.g. `x:f32:3x32`, `y:i64`, `t:bytes` (Arrow only).
    #[arg(long = "field", required = true, value_name = "NAME:DTYPE[:SHAPE]")]
    pub fields: Vec<String>,
    /// Output directory (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Rows per Arrow record batch.
    #[arg(long, default_value_t = 1024)]
    pub arrow_batch_rows: u64,
}

pub fn run(args: GenArgs) -> Result<()> {
    let format = Format::parse(&args.format)
        .ok_or_else(|| Error::Config(format!("unknown --format '{}' (npy, hdf5, arrow, raw)", args.format)))?;
    let fields = args.fields.iter().map(|f| gen::parse_field(f)).collect::<Result<Vec<_>>>()?;
    let spec = GenSpec {
        format,
        samples: args.samples,
        files: args.files,
        fields,
        out: args.out,
        arrow_batch_rows: args.arrow_batch_rows,
    };
    spec.validate()?;
    std::fs::create_dir_all(&spec.out).map_err(|e| Error::io(&spec.out, e))?;

    let start = Instant::now();
    let bar = ProgressBar::new(spec.files).with_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} files {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix("gen");
    let bytes: u64 = (0..spec.files)
        .into_par_iter()
        .map(|i| {
            let b = gen::write_file(&spec, i);
            bar.inc(1);
            b
        })
        .collect::<Result<Vec<u64>>>()?
        .into_iter()
        .sum();
    gen::write_side_files(&spec)?;
    bar.finish_and_clear();
    out!(
        "wrote {} samples in {} {} file(s), {:.1} MB, to {} in {:.2} s",
        spec.samples,
        spec.files,
        format.extension(),
        bytes as f64 / 1e6,
        spec.out.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
