//! `meshfeed bench report`: JSON lines in, the suite's table of ratios and plots out (what
//! they say: [`meshfeed_analysis::bench`]).

use std::path::PathBuf;

use meshfeed::{Error, Result};
use meshfeed_analysis::bench::{plots, suite};

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// JSON lines written by `meshfeed bench --out` and bench/torch_loader.py.
    #[arg(long = "in", required = true, num_args = 1.., value_name = "FILE")]
    pub inputs: Vec<PathBuf>,
    /// Directory for report.md and the plots (PNG and SVG); created if missing.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Only the table: no plots.
    #[arg(long)]
    pub no_plots: bool,
}

pub fn run(args: ReportArgs) -> Result<()> {
    let (grid, machine) = suite::read_grid(&args.inputs)?;
    std::fs::create_dir_all(&args.out).map_err(|e| Error::io(&args.out, e))?;
    let table = suite::markdown(&grid, machine.as_ref());
    let path = args.out.join("report.md");
    std::fs::write(&path, &table).map_err(|e| Error::io(&path, e))?;
    out!("{table}");
    if args.no_plots {
        return Ok(());
    }
    let written = plots::draw_all(&grid, &args.out)?;
    out!("bench report: {} and {} plot files in {}", path.display(), written.len(), args.out.display());
    Ok(())
}
