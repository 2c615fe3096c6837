//! The `meshfeed` command line: `gen`, `inspect`, `run`, `bench`, `launch`, `report` and `serve`.
//!
//! [`main_with_args`] (the `meshfeed` binary's `main`, and the Python package's `meshfeed`
//! console script) is thin: parse (clap), run the command, print the error chain in one
//! place and pick the exit code. Parsing the command line and validating it into a job (the
//! library's typed [`meshfeed::config::Job`]) are two steps ([`job`]); everything a
//! loading job does beyond presenting results is the library's.

/// `println!` that never panics: when stdout is closed (`meshfeed inspect ... | head -1`),
/// the output ends, not the program (nor, under MPI, the job).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::line(&format!($($arg)*))
    };
}

mod bench;
mod gen;
#[cfg(test)]
mod help_checks;
mod inspect;
mod job;
mod launch;
mod output;
mod progress;
mod report;
mod run;
mod serve;

use std::ffi::OsString;

use clap::{Parser, Subcommand};

/// Exact global shuffle and device-mesh placement of training data over MPI or UCX.
#[derive(Parser, Debug)]
#[command(name = "meshfeed", version = meshfeed::VERSION)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write a synthetic dataset whose contents are a function of the sample id.
    Gen(gen::GenArgs),
    /// Print the files, sample counts and fields of a dataset.
    Inspect(inspect::InspectArgs),
    /// Load a dataset with a global shuffle (launch with mpirun -np P, or meshfeed launch).
    Run(run::RunArgs),
    /// Measure the loader against the machine's limits and the usual baselines (fused,
    /// two-phase, broadcast, random access; read, exchange and memcpy limits), and the
    /// overlap with a simulated training step; `bench report` draws the suite's table and
    /// plots from the results (bench/run.sh runs the whole suite).
    Bench(bench::BenchArgs),
    /// Start N ranks on this host with the rendezvous environment (UCX: `run`'s default
    /// --transport auto picks it there).
    Launch(launch::LaunchArgs),
    /// Summarise runs' telemetry (`run --telemetry DIR`): per run and epoch, time per
    /// phase, skew between ranks, the slowest ranks and hosts and why, and what the epoch
    /// would have taken had every rank been as fast as the median.
    Report(report::ReportArgs),
    /// Hold a dataset in memory, read once, and serve its rows to any number of jobs: a
    /// job gives the rendezvous file (or meshfeed://HOST:PORT/NAME) as its data path.
    Serve(serve::ServeArgs),
}

/// Runs the command line on `args` (the program's name first, as `std::env::args_os` gives
/// them) and returns the process's exit code.
pub fn main_with_args(args: Vec<OsString>) -> i32 {
    main_relaunched_by(args, None)
}

/// [`main_with_args`] for a host process that is not the `meshfeed` binary (the Python
/// package's console script, where the current executable is the interpreter): `relaunch`
/// is the command that runs this command line again (e.g. `[python, -m, meshfeed]`), which
/// `launch` starts for each rank. Stdout and stderr are flushed before it returns: the
/// host's exit does not flush Rust's buffers.
pub fn main_relaunched_by(args: Vec<OsString>, relaunch: Option<Vec<OsString>>) -> i32 {
    let code = command_line(args, relaunch.as_deref());
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let _ = std::io::Write::flush(&mut std::io::stderr());
    code
}

fn command_line(args: Vec<OsString>, relaunch: Option<&[OsString]>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    match cli.command {
        Command::Gen(a) => output::exit_code(None, gen::run(a).map(|()| 0)),
        Command::Inspect(a) => output::exit_code(None, inspect::run(a).map(|()| 0)),
        Command::Run(a) => run::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Launch(a) => output::exit_code(None, launch::run(a, relaunch)),
        Command::Report(a) => output::exit_code(None, report::run(a).map(|()| 0)),
        Command::Serve(a) => serve::main(a),
    }
}
