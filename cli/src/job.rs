//! The job description at the edge: flags and the `--config` TOML file, merged (flags
//! win) into the library's typed [`Job`]; and the runtime a ranked command runs in.

use std::path::{Path, PathBuf};

use meshfeed::config::{Job, JobFile, TransportKind, JOB_FILE_LIMIT};
use meshfeed::runtime::Runtime;
use meshfeed::{Error, Result};

use meshfeed::config::read_small_file;

use crate::output::ErrorStyle;

/// What to load and how: shared by `run` and `bench`. The flags are the job description's
/// keys ([`JobFile`], declared once in the library), each overriding the `--config` file's.
#[derive(clap::Args, Debug)]
pub struct JobArgs {
    /// TOML job file: dataset, loader options, mesh, specs, stages. Flags override it.
    #[arg(long, value_name = "FILE", help_heading = meshfeed::config::heading::DATA)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub flags: JobFile,
}

impl JobArgs {
    /// Merges the config file (if any) and the flags into a job; flags win.
    pub fn job(&self) -> Result<Job> {
        self.job_over(JobFile::default())
    }

    /// As [`JobArgs::job`], over a command's own defaults: the job file, then the flags,
    /// override `defaults`.
    pub fn job_over(&self, defaults: JobFile) -> Result<Job> {
        let file = match &self.config {
            Some(path) => defaults.overlay(read_job_file(path)?)?,
            None => defaults,
        };
        file.overlay(self.flags.clone())?.into_job()
    }

    /// The transport the job asks for, even when the job is invalid (its error is then
    /// reported over that transport, on every rank).
    pub fn transport(&self, job: &Result<Job>) -> TransportKind {
        match job {
            Ok(job) => job.transport,
            Err(_) => self.flags.transport.unwrap_or_default(),
        }
    }
}

/// Reads a TOML job file (a regular file of at most [`JOB_FILE_LIMIT`] bytes: a FIFO in its
/// place is refused, not waited on); relative dataset paths are relative to the file.
fn read_job_file(path: &Path) -> Result<JobFile> {
    let text = read_small_file(path, JOB_FILE_LIMIT)?;
    let file: JobFile =
        toml::from_str(&text).map_err(|e| Error::file(path, format!("invalid job file: {}", e.message())))?;
    Ok(file.relative_to(path.parent().unwrap_or(Path::new("."))))
}

/// Joins the job over `kind`, runs `job` on this rank, prints any error as `style` says
/// (an agreed failure once per job) and returns the exit code; MPI (if meshfeed initialised
/// it) is finalised after `job`.
pub fn with_runtime(
    kind: TransportKind,
    max_round_bytes: Option<u64>,
    style: ErrorStyle,
    job: impl FnOnce(&Runtime) -> Result<i32>,
) -> i32 {
    let runtime = Runtime::join(kind, max_round_bytes.map(|b| b.clamp(1, i32::MAX as u64) as usize));
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            style.print(std::env::var("RANK").ok().and_then(|r| r.parse().ok()), &e);
            return 1;
        }
    };
    runtime.abort_on_panic();
    let rank = runtime.rank();
    let result = job(&runtime);
    if let (true, Err(Error::Remote { .. })) = (rank != 0, &result) {
        // A failure all ranks agreed on is printed by rank 0. The others, quiet, would
        // exit at once, and a launcher that ends a job at its first failed rank (mpirun)
        // would put its own report before rank 0's line, or stop rank 0 before it wrote
        // it: they leave rank 0 a moment to print and exit first. Every rank still exits 1.
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    style.exit_code(Some(rank), result)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};
    use meshfeed::config::{Balance, ReadStrategy};

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        job: JobArgs,
    }

    /// Every key of the job description is a flag of the same name (`batch_size` is
    /// `--batch-size`), and the flags are exactly the keys and `--config`.
    #[test]
    fn the_flags_are_the_job_keys() {
        let mut flags: Vec<String> = Cli::command()
            .get_arguments()
            .filter_map(|a| a.get_long())
            .filter(|l| *l != "config")
            .map(|l| l.replace('-', "_"))
            .collect();
        flags.sort();
        assert_eq!(flags, JobFile::keys());
    }

    /// The option table in docs/cli.md lists exactly the job description's keys.
    #[test]
    fn the_documented_options_are_the_job_keys() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
        let text = std::fs::read_to_string(&path).unwrap();
        let section = text.split("## Job options").nth(1).expect("docs/cli.md has a Job options section");
        let mut keys: Vec<String> = section
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split_once('`'))
            .map(|(k, _)| k.to_string())
            .collect();
        keys.sort();
        assert_eq!(keys, JobFile::keys());
    }

    #[test]
    fn flags_override_the_job_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("job.toml");
        std::fs::write(&file, "data = [\"d\"]\nbatch_size = 8\nseed = 1\n[shard]\nx = \"dp\"\ny = \"dp\"\n").unwrap();
        let cli = Cli::try_parse_from([
            "meshfeed",
            "--config",
            file.to_str().unwrap(),
            "--seed",
            "4",
            "--shard",
            "y=dp,-",
            "--read-strategy",
            "passes",
            "--memory-budget",
            "2G",
        ])
        .unwrap();
        let job = cli.job.job().unwrap();
        assert_eq!((job.data, job.loader.batch_size, job.loader.seed), (vec![dir.path().join("d")], 8, 4));
        let shard: Vec<String> = job.loader.layout.shard.iter().map(|(f, s)| format!("{f}={s}")).collect();
        assert_eq!(shard, ["x=dp", "y=dp,-"]);
        assert_eq!((job.loader.read.strategy, job.loader.read.memory_budget), (ReadStrategy::Passes, Some(2 << 30)));
        let bad = Cli::try_parse_from(["meshfeed", "--read-strategy", "often"]).err().unwrap().to_string();
        assert!(bad.contains("[possible values: auto, resident, passes, random]"), "{bad}");
    }

    /// A command's own defaults (bench keeps the ranges equal) give way to the job file,
    /// which gives way to the flags.
    #[test]
    fn a_commands_defaults_give_way_to_the_job_file_and_the_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("job.toml");
        std::fs::write(&file, "data = [\"d\"]\nbatch_size = 8\nbalance = \"auto\"\n").unwrap();
        let off = || JobFile { balance: Some(Balance::Off), epochs: Some(3), ..JobFile::default() };
        let parse = |args: &[&str]| Cli::try_parse_from([&["meshfeed"], args].concat()).unwrap().job;
        let plain = parse(&["--data", "d", "--batch-size", "8"]);
        assert_eq!(plain.job().unwrap().loader.balance, Balance::Auto);
        let job = plain.job_over(off()).unwrap();
        assert_eq!((job.loader.balance, job.epochs), (Balance::Off, 3));
        let job = parse(&["--config", file.to_str().unwrap()]).job_over(off()).unwrap();
        assert_eq!((job.loader.balance, job.epochs, job.data), (Balance::Auto, 3, vec![dir.path().join("d")]));
        let job = parse(&["--data", "d", "--batch-size", "8", "--balance", "auto"]).job_over(off()).unwrap();
        assert_eq!(job.loader.balance, Balance::Auto);
    }
}
