//! The `meshfeed` command line: `gen`, `inspect` and `run`.
//!
//! Parsing (clap) and validation into real configuration are separate steps; `main` only
//! calls [`main_with_args`], which prints errors in one place and picks the exit code.

pub mod bench;
pub mod dump;
pub mod gen;
pub mod inspect;
pub mod launch;
pub mod run;
pub mod verify;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::error::{Error, Result};

/// Exact global shuffle and device-mesh placement of training data over MPI.
#[derive(Parser, Debug)]
#[command(name = "meshfeed", version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("MESHFEED_GIT_REV"), ")"))]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Write a synthetic dataset whose contents are a function of the sample id.
    Gen(gen::GenArgs),
    /// Print the files, sample counts and fields of a dataset.
    Inspect(inspect::InspectArgs),
    /// Load a dataset with a global shuffle (launch with mpirun -np P).
    Run(run::RunArgs),
    /// Compare the fused and two-phase exchanges with a naive single-loader baseline.
    Bench(bench::BenchArgs),
    /// Start N ranks on this host with the rendezvous environment (for --transport ucx).
    Launch(launch::LaunchArgs),
}

/// Dataset arguments shared by `inspect` and `run`.
#[derive(clap::Args, Debug, Clone)]
pub struct DataArgs {
    /// Dataset files or directories (all supported files in a directory, in name order).
    #[arg(long, num_args = 1.., required = true, value_name = "PATH")]
    pub data: Vec<PathBuf>,
    /// HDF5 group that holds the datasets (default: the file root).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
}

impl DataArgs {
    /// The dataset options these arguments give.
    pub fn options(&self) -> crate::dataset::DatasetOptions {
        crate::dataset::DatasetOptions { hdf5_group: self.group.clone() }
    }
}

/// Parses a byte size: a number with an optional K/M/G/T suffix (powers of 1024).
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix in '{s}' (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is not a byte size (e.g. 65536, 64M, 1G)"))
}

/// Runs the command line; returns the process exit code. Errors are printed here, once.
pub fn main_with_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    let result: Result<()> = match cli.command {
        Command::Gen(a) => gen::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Run(a) => return run::main(a),
        Command::Bench(a) => return bench::main(a),
        Command::Launch(a) => match launch::run(a) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            print_error(None, &e);
            1
        }
    }
}

/// Prints an error with its source chain on one line, prefixed by the rank when known.
///
/// A failure all ranks agreed on ([`Error::Remote`]) is printed in full once, by rank 0;
/// the other ranks print one short line saying why they stop (so per-rank logs still
/// explain every exit) instead of N copies of the same message.
pub fn print_error(rank: Option<usize>, e: &Error) {
    if let (Some(r), Error::Remote { rank: origin, .. }) = (rank, e) {
        if r != 0 {
            let line = format!("meshfeed: rank {r} stopped: rank {origin} failed (the error is printed by rank 0)\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            return;
        }
    }
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(&format!(": {text}"));
        }
        source = s.source();
    }
    let line = match rank {
        Some(r) => format!("meshfeed: error on rank {r}: {msg}\n"),
        None => format!("meshfeed: error: {msg}\n"),
    };
    // One write call: ranks share the launcher's stderr pipe, and eprintln! would write
    // the line in pieces that interleave with other ranks' lines.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        assert!(parse_bytes("12Q").is_err());
        assert!(parse_bytes("M").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }
}
