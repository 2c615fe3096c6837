//! `meshfeed run`: the distributed loading job, launched with `mpirun -np P` (or `meshfeed
//! launch` / Ray / Kubernetes for UCX).
//!
//! A thin client of [`meshfeed::loader::Loader`]: it consumes every batch (optionally
//! dumping and verifying it, optionally sleeping like a training step), shows a progress
//! bar on rank 0, stops at a step boundary all ranks agree on when SIGTERM/SIGINT arrive,
//! and prints a per-epoch summary reduced over all ranks (text, or JSON lines).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use meshfeed::config::Job;
use meshfeed::dataset::gen;
use meshfeed::loader::{open_dataset, Loader, LoaderState, Position};
use meshfeed::runtime::{signal_name, Runtime, StopCheck, StopSignal, EXIT_STOPPED};
use meshfeed::transport::agree;
use meshfeed::verify::dump::DumpWriter;
use meshfeed::verify::Verifier;
use meshfeed::{Error, Result};

use crate::job::{with_runtime, JobArgs};
use crate::report::{print_verify_report, progress_bar, EpochSummary, EpochTimes};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Check collectively that every sample arrived exactly once (per receiving rank), in
    /// order, with the right contents (contents: for datasets written by `meshfeed gen`).
    #[arg(long)]
    pub verify: bool,
    /// Write one rank-<r>.jsonl per rank: ids and CRC-32 of every delivered row.
    #[arg(long, value_name = "DIR")]
    pub dump: Option<PathBuf>,
    /// Print the per-epoch summary as JSON lines on stdout.
    #[arg(long)]
    pub json: bool,
    /// Resume a stream: `EPOCH:STEP`, or a state file written by `--state`. The stream
    /// continues exactly, also on another number of ranks or mesh.
    #[arg(long, value_name = "EPOCH:STEP|FILE")]
    pub resume_from: Option<String>,
    /// Write the loader state here (JSON) when stopped by SIGTERM/SIGINT or at the end.
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// Simulate a training step: sleep this many milliseconds after each batch (the
    /// summary then reports time computing and time waiting for data).
    #[arg(long, default_value_t = 0.0, value_name = "MS")]
    pub compute_ms: f64,
    /// Cap on bytes per MPI_Alltoallv round (larger exchanges are chunked); for testing.
    #[arg(long, hide = true, value_name = "BYTES")]
    pub max_round_bytes: Option<meshfeed::config::ByteSize>,
}

/// `meshfeed run`.
pub fn main(args: RunArgs) -> i32 {
    let job = args.job.job();
    let kind = args.job.transport(&job);
    with_runtime(kind, args.max_round_bytes.map(|b| b.0), |rt| run(&args, job, rt))
}

/// Where `--resume-from` says to continue: `EPOCH:STEP`, or a state file.
fn resume_state(loader: &Loader, s: &str) -> Result<LoaderState> {
    if let Some((e, k)) = s.split_once(':') {
        if let (Ok(e), Ok(k)) = (e.parse(), k.parse()) {
            return Ok(loader.state_at(Position::new(e, k)));
        }
    }
    let text = std::fs::read_to_string(s)
        .map_err(|e| Error::Config(format!("--resume-from '{s}': expected EPOCH:STEP or a state file ({e})")))?;
    LoaderState::from_json(&text).map_err(|e| Error::file(s, e.to_string()))
}

/// Writes the `--state` file whole or not at all (a temporary file renamed over it), so
/// that a process killed while writing it never leaves half a state behind.
fn write_state(path: &std::path::Path, json: &str) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, json).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// A simulated training step of `ms` milliseconds; returns how long it took.
fn compute(ms: f64) -> Duration {
    if ms <= 0.0 {
        return Duration::ZERO;
    }
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(ms / 1e3));
    start.elapsed()
}

fn run(args: &RunArgs, job: Result<Job>, rt: &Runtime) -> Result<i32> {
    let world = rt.world();
    let rank = rt.rank();
    let stop = StopSignal::install()?;
    let job = agree(world, job)?;
    if !(args.compute_ms >= 0.0 && args.compute_ms.is_finite()) {
        return Err(Error::Config(format!("--compute-ms {}: expected a non-negative number", args.compute_ms)));
    }
    let dataset = open_dataset(world, &job.data, job.dataset.clone())?;
    let mut loader = Loader::new(world, dataset, job.loader.clone())?;
    let n = loader.dataset().len();
    let steps = loader.steps_per_epoch();
    if let Some(from) = &args.resume_from {
        agree(world, resume_state(&loader, from).and_then(|s| loader.seek(&s)))?;
    }
    let start_at = loader.position();
    if rank == 0 && !args.json && start_at != Position::default() {
        println!("meshfeed: resuming at epoch {} step {}", start_at.epoch, start_at.step);
    }

    let mut verifier = match args.verify {
        true => Some(agree(
            world,
            gen::find_manifest(&job.data).and_then(|m| {
                let seed = job.loader.seed;
                Verifier::new(loader.dataset(), loader.placement(), loader.tail_placement(), steps, seed, m)
            }),
        )?),
        false => None,
    };
    let mut dump = match &args.dump {
        Some(dir) => Some(agree(world, DumpWriter::create(dir, rank))?),
        None => None,
    };
    if rank == 0 && !args.json {
        println!(
            "meshfeed: {} samples, {} field(s), {} ranks, mesh {}, {} exchange; batch {} → {} steps/epoch ({} dropped), {} steps per window, prefetch {}",
            n,
            loader.dataset().fields().len(),
            world.size(),
            loader.mesh(),
            loader.exchange_mode(),
            job.loader.batch_size,
            steps,
            loader.dropped_per_epoch(),
            loader.steps_per_window(),
            job.loader.prefetch,
        );
    }

    // Stop requests are agreed about every 50 ms of steps (every step when steps are
    // longer), so that all ranks stop after the same step.
    let mut stop_check = StopCheck::new(Duration::from_millis(50));
    let mut all_ok = true;
    for e in start_at.epoch.0..job.epochs {
        let first = loader.position().step.0;
        let bar = progress_bar(rank == 0 && !args.json, steps, e);
        bar.set_position(first);
        if let Some(v) = verifier.as_mut() {
            v.begin_epoch(n, meshfeed::types::Epoch(e));
        }
        let start = Instant::now();
        let (mut delivered, mut computing) = (0u64, Duration::ZERO);
        // A local failure while consuming (e.g. the dump disk is full) must not stop this
        // rank from taking part in the remaining windows: remember it, agree at the end.
        let mut local: Result<()> = Ok(());
        let mut stopped = None;
        while let Some(batch) = loader.next_batch()? {
            delivered += batch.fields().iter().map(|f| f.bytes().len() as u64).sum::<u64>();
            if let Some(v) = verifier.as_mut() {
                v.check(&batch, loader.dataset());
            }
            if let (Some(d), Ok(())) = (dump.as_mut(), &local) {
                local = d.write(&batch);
            }
            bar.inc(1);
            drop(batch);
            computing += compute(args.compute_ms);
            if let Some(signal) = stop_check.after_step(world, &stop)? {
                stopped = Some(signal_name(signal));
                break;
            }
        }
        agree(world, local)?;
        // A stop agreed after the very last step changes nothing: the run is complete.
        let stopped = stopped.filter(|_| loader.position() < Position::new(job.epochs, 0));
        if let Some(why) = &stopped {
            // The state and the resume line come first, before the summary, verification
            // and dump flushing: the launcher may not wait long. OpenMPI's mpirun, told to
            // stop, SIGKILLs the ranks one second after it sent them SIGTERM.
            let mut written = Ok(());
            if rank == 0 {
                let state = loader.state();
                if let Some(path) = &args.state {
                    written = write_state(path, &state.to_json());
                }
                eprintln!(
                    "meshfeed: stopped by {why} at epoch {} step {} (earlier steps were delivered); resume with --resume-from {}:{}",
                    state.epoch, state.step, state.epoch, state.step
                );
            }
            // Every rank learns whether the state was saved, and all fail together if not.
            agree(world, written)?;
        }
        bar.finish_and_clear();
        let end = match loader.position() {
            p if p.epoch.0 == e => p.step.0,
            _ => steps,
        };
        let times = EpochTimes {
            epoch: e,
            samples: loader.rows_in_steps(first..end),
            steps: end - first,
            seconds: start.elapsed().as_secs_f64(),
            compute_s: computing.as_secs_f64(),
            delivered,
        };
        let metrics = loader.take_metrics().reduce(world)?;
        let mut summary = EpochSummary::reduce(world, &times, &metrics)?;
        if let Some(v) = verifier.as_mut() {
            let b = job.loader.batch_size as u64;
            let (report, first_problem) = v.finish_epoch(world, &loader.home_ranges(), first * b..end * b)?;
            summary.verified = Some(report.ok());
            all_ok &= report.ok();
            if rank == 0 && !args.json {
                print_verify_report(e, summary.samples, n, &report, v.checks_contents(), first_problem.as_deref());
            }
            if !report.ok() {
                if rank == 0 && args.json {
                    summary.print_json();
                }
                return Err(Error::Verify(format!(
                    "epoch {e}: {}",
                    first_problem.unwrap_or_else(|| "see report".into())
                )));
            }
        }
        if rank == 0 {
            if args.json {
                summary.print_json();
            } else {
                summary.print();
            }
        }
        if stopped.is_some() {
            // Stopped at a step boundary (rank 0 reported where to resume): flush, exit 75.
            if let Some(d) = dump.take() {
                agree(world, d.finish())?;
            }
            return Ok(EXIT_STOPPED);
        }
    }
    if let Some(d) = dump.take() {
        agree(world, d.finish())?;
    }
    if rank == 0 {
        if let Some(path) = &args.state {
            let state = loader.state_at(Position::new(job.epochs, 0));
            write_state(path, &state.to_json())?;
        }
        if !args.json {
            let verified = if verifier.is_some() && all_ok { ", verified" } else { "" };
            println!("meshfeed: done: {} epoch(s) on {} ranks{verified}", job.epochs, world.size());
        }
    }
    Ok(0)
}
