//! `meshfeed run`: the distributed loading job, launched with `mpirun -np P` (or `meshfeed
//! launch` / Ray / Kubernetes for UCX).
//!
//! A thin client of [`meshfeed::loader::Loader`]: it consumes every batch (optionally
//! dumping and verifying it, optionally sleeping like a training step), shows a progress
//! bar on rank 0, stops at a step boundary all ranks agree on when SIGTERM/SIGINT arrive,
//! and prints a per-epoch summary reduced over all ranks (text, or JSON lines).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use meshfeed::config::{heading, Job};
use meshfeed::dataset::gen;
use meshfeed::error::ErrorKind;
use meshfeed::loader::{open_dataset, Loader, LoaderState, Position, MAX_EPOCH};
use meshfeed::runtime::{signal_name, Runtime, StopCheck, StopSignal, EXIT_STOPPED};
use meshfeed::transport::{agree, agree_settings, Transport};
use meshfeed::verify::dump::DumpWriter;
use meshfeed::verify::Verifier;
use meshfeed::{Error, Result};

use crate::job::{with_runtime, JobArgs};
use crate::output::{self, print_verify_report, EpochSummary, EpochTimes, ErrorStyle};
use crate::progress::{epoch_bar, heartbeat_text, Screen};

#[derive(clap::Args, Debug)]
#[command(after_long_help = "Exit codes: 0 done, 1 failed (every rank), 2 bad command line, 75 stopped by \
                              SIGTERM/SIGINT (resume it).")]
pub struct RunArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Check that every sample arrived exactly once, in order, intact.
    ///
    /// Checked collectively, each epoch, per receiving rank; the contents for datasets
    /// written by `meshfeed gen`.
    #[arg(long, help_heading = heading::OUTPUT)]
    pub verify: bool,
    /// Write the ids and CRC-32 of every delivered row, a file per rank.
    ///
    /// One `rank-<r>.jsonl` per rank, a line per step (docs/guarantees.md).
    #[arg(long, value_name = "DIR", help_heading = heading::OUTPUT)]
    pub dump: Option<PathBuf>,
    /// Print JSON lines on stdout: summaries, progress, errors.
    ///
    /// The per-epoch summary, the progress lines (--heartbeat; no bar is drawn) and,
    /// should the job fail, one error object a rank (`{"kind":"error",...}`; the cause is
    /// still printed on stderr).
    #[arg(long, help_heading = heading::OUTPUT)]
    pub json: bool,
    /// On a failure, every rank says why it stopped.
    ///
    /// Without it, the cause is printed once (by rank 0, naming the rank where it
    /// happened) and the other ranks print nothing.
    #[arg(short, long, help_heading = heading::OUTPUT)]
    pub verbose: bool,
    /// Resume a stream at EPOCH:STEP, or from a state file.
    ///
    /// The state file is one written by `--state`. The stream continues exactly, also on
    /// another number of ranks or mesh.
    #[arg(long, value_name = "EPOCH:STEP|FILE", help_heading = heading::RESUMPTION)]
    pub resume_from: Option<String>,
    /// Write the loader state here when stopped or at the end.
    ///
    /// The state (JSON) is written when the job is stopped by SIGTERM/SIGINT, and at the
    /// end.
    #[arg(long, value_name = "FILE", help_heading = heading::RESUMPTION)]
    pub state: Option<PathBuf>,
    /// Checkpoint the stream in this file: resume from it, save to it.
    ///
    /// As a job that may be stopped and started again wants: resume from the file when it
    /// exists, and write the state to it when stopped or at the end (`--resume-from FILE
    /// --state FILE`, or `--state FILE` before the first run).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["resume_from", "state"], help_heading = heading::RESUMPTION)]
    pub checkpoint: Option<PathBuf>,
    /// Simulate a training step of MS milliseconds after each batch.
    ///
    /// Each rank sleeps this long after each batch; the summary then reports time computing
    /// and time waiting for data.
    #[arg(long, default_value_t = 0.0, value_name = "MS", help_heading = heading::BATCHES, hide_short_help = true)]
    pub compute_ms: f64,
    /// Cap on bytes per MPI_Alltoallv round (larger exchanges are chunked); for testing.
    #[arg(long, hide = true, value_name = "BYTES")]
    pub max_round_bytes: Option<meshfeed::config::ByteSize>,
}

impl RunArgs {
    /// `--checkpoint FILE` as what it stands for: `--state FILE`, and `--resume-from FILE`
    /// when the file exists (the ranks then agree on the resume point, so a file only some
    /// ranks see is an error naming the difference, not a split job).
    fn with_checkpoint(mut self) -> Result<RunArgs> {
        if let Some(file) = self.checkpoint.take() {
            // Resumed from when there is anything at the path: a link that leads nowhere is
            // then an error naming the file, and so is a path that cannot be looked at.
            let present = match std::fs::symlink_metadata(&file) {
                Ok(_) => true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => return Err(Error::file_caused(&file, format!("--checkpoint: {e}"), e)),
            };
            if present {
                let path = file
                    .to_str()
                    .ok_or_else(|| Error::Config(format!("--checkpoint {}: the path is not UTF-8", file.display())))?;
                self.resume_from = Some(path.to_string());
            }
            self.state = Some(file);
        }
        Ok(self)
    }
}

/// `meshfeed run`.
pub fn main(args: RunArgs) -> i32 {
    let style = ErrorStyle { verbose: args.verbose, json: args.json };
    let args = match args.with_checkpoint() {
        Ok(args) => args,
        Err(e) => {
            style.print(None, &e);
            return 1;
        }
    };
    let job = args.job.job();
    let kind = args.job.transport(&job);
    // Stop signals are caught from the start: a SIGTERM while the ranks meet (a pod
    // deleted as its job starts) is then a clean stop at the first step, exit 75, not a
    // death by signal that a scheduler counts as a failure.
    let stop = match StopSignal::install() {
        Ok(s) => s,
        Err(e) => {
            style.print(None, &e);
            return 1;
        }
    };
    with_runtime(kind, args.max_round_bytes.map(|b| b.0), style, |rt| run(&args, job, rt, &stop))
}

/// Where `--resume-from` says to continue: `EPOCH:STEP`, or a state file.
fn resume_state(loader: &Loader, s: &str) -> Result<LoaderState> {
    if let Some((e, k)) = s.split_once(':') {
        if let (Ok(epoch), Ok(step)) = (e.trim().parse::<u64>(), k.trim().parse::<u64>()) {
            return Ok(LoaderState { epoch, step, ..loader.state() });
        }
        if e.chars().chain(k.chars()).all(|c| c.is_ascii_digit()) && !e.is_empty() && !k.is_empty() {
            if e.trim().parse::<u64>().is_err() {
                return Err(meshfeed::loader::epoch_out_of_range(&e.trim()));
            }
            return Err(Error::Config(format!("--resume-from {s}: step {k} does not fit 64 bits")));
        }
    }
    // Only a path that is not there is taken for a mistyped EPOCH:STEP; any other failure
    // (a symbolic link loop, a denied directory) is the file's, as reading it reports it.
    if let Err(e) = std::fs::metadata(s) {
        if e.kind() == std::io::ErrorKind::NotFound {
            let message = format!("--resume-from '{s}': expected EPOCH:STEP or a state file ({e})");
            return Err(Error::caused(ErrorKind::Config, message, e));
        }
    }
    // A state of this dataset is its own state's size (the fingerprint names every file);
    // twice that, and a page, bounds what is read.
    let limit = 2 * loader.state().to_json().len() as u64 + 4096;
    LoaderState::read_file(Path::new(s), limit)
}

/// Checks a resume point against the job: within an epoch (the loader checks the stream
/// and the step), and not past the end of the last epoch.
fn check_resume_point(at: Position, epochs: u64) -> Result<()> {
    if at > Position::new(epochs, 0) {
        return Err(Error::Config(format!(
            "cannot resume at epoch {} step {}: the job has {epochs} epoch(s) (--epochs); it ends at {epochs}:0",
            at.epoch, at.step
        )));
    }
    Ok(())
}

/// Checks, before the first step, that the state file can be written when the time comes:
/// its directory takes a new file (the state is written beside it and renamed over it), and
/// the path is not a directory.
fn check_state_path(path: &Path) -> Result<()> {
    if path.is_dir() {
        return Err(Error::file(path, "--state names a directory, not a file"));
    }
    // A FIFO or device there is no state file to replace: refused, never opened.
    if path.exists() && !path.is_file() {
        return Err(Error::file(path, "--state names something that is not a regular file"));
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let probe = dir.join(format!(".meshfeed-state-check-{}", std::process::id()));
    std::fs::write(&probe, b"")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| Error::file_caused(path, format!("the state file cannot be written ({e})"), e))
}

/// Rank 0 saves the state to `path`, if given; every rank learns whether it could.
fn save_state(world: &dyn Transport, rank: usize, path: Option<&Path>, state: &LoaderState) -> Result<()> {
    match path {
        Some(path) => agree(world, if rank == 0 { write_state(path, state) } else { Ok(()) }),
        None => Ok(()),
    }
}

/// Writes the state so that a reader never sees half of it: to a file beside it, then
/// renamed over it.
fn write_state(path: &Path, state: &LoaderState) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".meshfeed-state-{}", std::process::id()));
    std::fs::write(&tmp, state.to_json())
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| Error::file_caused(path, format!("cannot write the state: {e}"), e))
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

/// Runs the job: the agreed job opens a loader (resumed where asked), whose epochs are
/// consumed, checked and summarised one after another. Collective: every rank returns the
/// same result.
fn run(args: &RunArgs, job: Result<Job>, rt: &Runtime, stop: &StopSignal) -> Result<i32> {
    let world = rt.world();
    let job = agreed_job(args, job, rt)?;
    // Opening counts toward the first epoch: a loader that keeps its data starts streaming it here.
    let opening = Instant::now();
    let mut loader = open_loader(args, &job, world)?;
    let mut open_s = Some(opening.elapsed().as_secs_f64());
    let mut checks = Checks::open(args, &job, &loader, world)?;
    let screen = announce(args, &job, &mut loader, world)?;
    // Stop requests are agreed about every 50 ms of steps (every step when steps are
    // longer), so that all ranks stop after the same step.
    let mut stop_check = StopCheck::new(Duration::from_millis(50));
    let mut all_ok = true;
    for e in loader.position().epoch.0..job.epochs {
        let epoch = consume_epoch(args, &mut loader, &mut checks, screen, &mut stop_check, stop, world, e)?;
        // A stop agreed after the very last step changes nothing: the run is complete.
        let stopped = epoch.stopped.clone().filter(|_| loader.position() < Position::new(job.epochs, 0));
        if let Some(why) = &stopped {
            save_stopped_state(args, &loader, world, why)?;
        }
        all_ok &= summarise_epoch(args, &job, &mut loader, &mut checks, world, epoch, open_s.take())?;
        if stopped.is_some() {
            // Stopped at a step boundary (rank 0 reported where to resume): flush, exit 75.
            checks.finish(world)?;
            return Ok(EXIT_STOPPED);
        }
    }
    checks.finish(world)?;
    save_state(world, rt.rank(), args.state.as_deref(), &loader.state_at(Position::new(job.epochs, 0)))?;
    if rt.rank() == 0 && !args.json {
        let verified = if checks.verifier.is_some() && all_ok { ", verified" } else { "" };
        output::line(&format!("meshfeed: done: {} epoch(s) on {} ranks{verified}", job.epochs, world.size()));
    }
    Ok(0)
}

/// The job every rank runs, `auto` transport as it resolved (what the settings check and
/// the telemetry record): every difference between ranks, and every option no rank can
/// run, is an agreed error before anything starts.
fn agreed_job(args: &RunArgs, job: Result<Job>, rt: &Runtime) -> Result<Job> {
    let world = rt.world();
    let job = Job { transport: rt.transport_kind(), ..agree(world, job)? };
    let mut settings = job.settings();
    settings.extend(job.loader.settings());
    settings.extend([("verify".into(), args.verify.to_string()), ("dump".into(), args.dump.is_some().to_string())]);
    agree_settings(world, &settings)?;
    if job.epochs > MAX_EPOCH + 1 {
        let e = Error::Config(format!("--epochs {}: epochs run from 0 to {MAX_EPOCH} (2^53 - 1)", job.epochs));
        agree(world, Err::<(), _>(e))?;
    }
    if !(args.compute_ms >= 0.0 && args.compute_ms.is_finite()) {
        // Agreed, although every rank finds it: the job's failure is then printed once.
        let e = Error::Config(format!("--compute-ms {}: expected a non-negative number", args.compute_ms));
        agree(world, Err::<(), _>(e))?;
    }
    // What rank 0 writes at the end must be writable from the start.
    if let Some(path) = &args.state {
        agree(world, if rt.rank() == 0 { check_state_path(path) } else { Ok(()) })?;
    }
    Ok(job)
}

/// The job's loader, at the position `--resume-from` gives (agreed by every rank).
fn open_loader(args: &RunArgs, job: &Job, world: &dyn Transport) -> Result<Loader> {
    let dataset = open_dataset(world, &job.data, job.dataset.clone())?;
    let mut loader = Loader::new(world, dataset, job.loader.clone())?;
    if let Some(from) = &args.resume_from {
        let resumed = resume_state(&loader, from).and_then(|state| {
            check_resume_point(Position::new(state.epoch, state.step), job.epochs)?;
            loader.seek(&state)
        });
        agree(world, resumed)?;
        let at = loader.position();
        agree_settings(world, &[("resume point".into(), format!("{}:{}", at.epoch, at.step))])?;
    }
    Ok(loader)
}

/// What checks and keeps the delivered batches: `--verify`'s verifier, `--dump`'s writer.
struct Checks {
    verifier: Option<Verifier>,
    dump: Option<DumpWriter>,
}

impl Checks {
    fn open(args: &RunArgs, job: &Job, loader: &Loader, world: &dyn Transport) -> Result<Checks> {
        let verifier = match args.verify {
            true => Some(agree(
                world,
                // Through a feeder, the manifest (where the files are `meshfeed gen`'s) came with
                // its welcome: contents are checked wherever a job on the files would check them.
                match loader.dataset().row_source() {
                    Some(rows) => Ok(rows.manifest().cloned()),
                    None => gen::find_manifest(&job.data),
                }
                .and_then(|m| {
                    let order = (job.loader.seed, job.loader.shared_order);
                    let steps = loader.steps_per_epoch();
                    Verifier::new(loader.dataset(), loader.placement(), loader.tail_placement(), steps, order, m)
                }),
            )?),
            false => None,
        };
        let dump = match &args.dump {
            Some(dir) => Some(agree(world, DumpWriter::create(dir, world.rank().0))?),
            None => None,
        };
        Ok(Checks { verifier, dump })
    }

    /// Flushes the dump (collective: a failure on one rank fails every rank).
    fn finish(&mut self, world: &dyn Transport) -> Result<()> {
        match self.dump.take() {
            Some(d) => agree(world, d.finish()),
            None => Ok(()),
        }
    }
}

/// Starts the job's telemetry and progress and says what runs: rank 0 draws a progress
/// bar where a person is looking (the screen returned); elsewhere (a batch job, a pipe)
/// it prints a progress line on stdout, every 30 s unless the job says otherwise: text for
/// a log, JSON with --json.
fn announce(args: &RunArgs, job: &Job, loader: &mut Loader, world: &dyn Transport) -> Result<Option<Screen>> {
    let rank = world.rank().0;
    loader.record_telemetry(world, job)?;
    let screen = if rank == 0 && !args.json { Screen::find() } else { None };
    let every = job.heartbeat.unwrap_or(30.0);
    if every > 0.0 && screen.is_none() {
        let every = Duration::from_secs_f64(every);
        match args.json {
            true => loader.heartbeat(every, output::line),
            false => loader.heartbeat(every, |beat| output::line(&heartbeat_text(beat))),
        }
    }
    if rank == 0 && !args.json {
        let start_at = Loader::position(loader);
        if start_at != Position::default() {
            out!("meshfeed: resuming at epoch {} step {}", start_at.epoch, start_at.step);
        }
        out!(
            "meshfeed: {} samples, {} field(s), {} ranks, mesh {}, {} exchange; batch {} → {} steps/epoch ({} dropped), {} steps per window, prefetch {}",
            loader.dataset().len(),
            loader.dataset().fields().len(),
            world.size(),
            loader.mesh(),
            loader.exchange_mode(),
            job.loader.batch_size,
            loader.steps_per_epoch(),
            loader.dropped_per_epoch(),
            loader.steps_per_window(),
            job.loader.prefetch,
        );
        out!("meshfeed: reads: {}", describe_reads(loader));
    }
    Ok(screen)
}

/// One epoch as this rank consumed it.
struct EpochRun {
    epoch: u64,
    /// The steps consumed: from the epoch's (or the resume point's) first to before `end`.
    first: u64,
    start: Instant,
    delivered: u64,
    computing: Duration,
    /// The signal the ranks agreed to stop on, if they stopped within the epoch.
    stopped: Option<String>,
}

/// Consumes epoch `e`'s batches (verified, dumped, a simulated training step each) until it
/// ends or the ranks agree to stop.
#[allow(clippy::too_many_arguments)]
fn consume_epoch(
    args: &RunArgs,
    loader: &mut Loader,
    checks: &mut Checks,
    screen: Option<Screen>,
    stop_check: &mut StopCheck,
    stop: &StopSignal,
    world: &dyn Transport,
    e: u64,
) -> Result<EpochRun> {
    let first = Loader::position(loader).step.0;
    let bar = epoch_bar(screen, loader.steps_per_epoch(), e);
    bar.set_position(first);
    if let Some(v) = checks.verifier.as_mut() {
        v.begin_epoch(loader.dataset().len(), meshfeed::types::Epoch(e));
    }
    let mut run =
        EpochRun { epoch: e, first, start: Instant::now(), delivered: 0, computing: Duration::ZERO, stopped: None };
    // A local failure while consuming (e.g. the dump disk is full) must not stop this
    // rank from taking part in the remaining windows: remember it, agree at the end.
    let mut local: Result<()> = Ok(());
    while let Some(batch) = loader.next_batch()? {
        run.delivered += batch.fields().iter().map(|f| f.bytes().len() as u64).sum::<u64>();
        if let Some(v) = checks.verifier.as_mut() {
            v.check(&batch, loader.dataset());
        }
        if let (Some(d), Ok(())) = (checks.dump.as_mut(), &local) {
            local = d.write(&batch);
        }
        bar.inc(1);
        drop(batch);
        run.computing += compute(args.compute_ms);
        if let Some(signal) = stop_check.after_step(world, stop)? {
            run.stopped = Some(signal_name(signal));
            break;
        }
    }
    // Cleared before anything else is printed: on a terminal, a line printed while the
    // bar stands would be drawn over, or the bar in the middle of it.
    bar.finish_and_clear();
    agree(world, local)?;
    Ok(run)
}

/// Says where a stopped job resumes and writes its state. This comes first, before the
/// summary, verification and dump flushing: a launcher may not wait long (OpenMPI's
/// mpirun, told to stop, SIGKILLs the ranks one second after it sent them SIGTERM). The
/// line comes before the write, so that it is said even if the write fails.
fn save_stopped_state(args: &RunArgs, loader: &Loader, world: &dyn Transport, why: &str) -> Result<()> {
    let state = loader.state();
    let rank = world.rank().0;
    if rank == 0 {
        output::line_err(&format!(
            "meshfeed: stopped by {why} at epoch {} step {} (earlier steps were delivered); resume with --resume-from {}:{}",
            state.epoch, state.step, state.epoch, state.step
        ));
    }
    save_state(world, rank, args.state.as_deref(), &state)
}

/// The epoch's summary over every rank, its verification (a failed one fails the job,
/// agreed) and its telemetry on disk; rank 0 prints the summary. Returns whether the
/// epoch verified (true when not verifying). Collective.
fn summarise_epoch(
    args: &RunArgs,
    job: &Job,
    loader: &mut Loader,
    checks: &mut Checks,
    world: &dyn Transport,
    run: EpochRun,
    open_s: Option<f64>,
) -> Result<bool> {
    let rank = world.rank().0;
    let (e, first) = (run.epoch, run.first);
    let end = match Loader::position(loader) {
        p if p.epoch.0 == e => p.step.0,
        _ => loader.steps_per_epoch(),
    };
    let times = EpochTimes {
        epoch: e,
        samples: loader.rows_in_steps(first..end),
        steps: end - first,
        seconds: run.start.elapsed().as_secs_f64(),
        compute_s: run.computing.as_secs_f64(),
        delivered: run.delivered,
    };
    let metrics = loader.take_metrics().reduce(world)?;
    let mut summary = EpochSummary::reduce(world, &times, &metrics, loader.read_plan())?;
    summary.open_s = open_s;
    let mut ok = true;
    if let Some(v) = checks.verifier.as_mut() {
        let b = job.loader.batch_size as u64;
        let n = loader.dataset().len();
        let (report, first_problem) = v.finish_epoch(world, loader.home_ranges(), first * b..end * b)?;
        summary.verified = Some(report.ok());
        loader.set_epoch_verified(report.ok());
        ok = report.ok();
        if rank == 0 && !args.json {
            print_verify_report(e, summary.samples, n, &report, v.checks_contents(), first_problem.as_deref());
        }
        if !report.ok() {
            if rank == 0 && args.json {
                summary.print_json();
            }
            // Every rank holds the collective report: the failure is agreed, so that it
            // is printed once, not by every rank.
            let problem = first_problem.unwrap_or_else(|| "see report".into());
            agree(world, Err::<(), _>(Error::Verify(format!("epoch {e}: {problem}"))))?;
        }
    }
    // The epoch's telemetry is on disk (an error writing it fails the run here).
    loader.flush_telemetry();
    agree(world, loader.take_telemetry_error().map_or(Ok(()), Err))?;
    if rank == 0 {
        if args.json {
            summary.print_json();
        } else {
            summary.print();
        }
    }
    Ok(ok)
}

/// The read strategy in a line: `passes (5 per epoch): <why>`.
pub fn describe_reads(loader: &Loader) -> String {
    let io = loader.read_plan();
    let what = match io.strategy {
        meshfeed::plan::Strategy::Passes { passes } => format!("passes ({passes} per epoch)"),
        meshfeed::plan::Strategy::Random if io.spill => "random, the rest spilled".to_string(),
        s => s.name().to_string(),
    };
    let shared = if loader.shares_stores() { "; same-host ranks copy each other's kept rows" } else { "" };
    format!("{what} — {}{shared}", io.reason)
}
