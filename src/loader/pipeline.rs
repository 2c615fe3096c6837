//! The seam between the producer and the consumer: one place decides whether windows are
//! produced on the caller's thread (`prefetch = 0`) or by a background thread that runs up
//! to `prefetch` windows ahead into a bounded queue.
//!
//! ## Stopping a background producer without hanging any rank
//!
//! Producers of all ranks move in lockstep: every window is a sequence of collectives on
//! the loader's own communicator, and the only place a producer waits for its consumer is
//! the queue, *between* windows. So after every window each producer joins one more small
//! collective, the **continue agreement**: "does any rank stop here?" A producer says yes
//! when its consumer asked it to stop (a seek, or the loader was dropped) or went away.
//! Then every producer stops at the same window boundary, and none is left waiting in a
//! collective the others will never join.
//!
//! Consumers ask to stop at the same point of the stream, but not at the same moment, so
//! their producers may stop at different agreements: a rank whose consumer had not asked
//! yet (it still reads batches the others abandoned) ends its producer with an error in
//! its queue, behind the windows already made. If its consumer then repositions too, it
//! never reads that error, and restarts where the others did. Every producer's first
//! window begins with the **position agreement** ([`crate::transport::agree_position`]),
//! so where a rank went on instead, the others are not left waiting for it:
//!
//! * a rank that read on past the error (it really went on alone) joins the others'
//!   position agreement as "read on", and every rank fails naming each rank's position;
//! * a rank that closes its loader while the others expect it there joins it as "closed";
//! * a rank whose stop was not everyone's and that closes without restarting does too.
//!
//! A rank that closed its loader joins nothing more: the ranks still reading get an error
//! naming it.
//!
//! Stopping therefore waits until every rank's producer reaches the agreement, i.e. until
//! every rank consumes its queue or stops too: all ranks must seek, set the epoch and drop
//! their loaders at the same point of the stream (as they consume the same batches).
//!
//! ## Waiting interruptibly
//!
//! A consumer waits for the producer's next window and, when stopping, for the other
//! ranks. Given an [`Interrupt`] check (the Python package asks the interpreter for
//! pending signals), it waits in slices of [`POLL`] and gives up when the check says so;
//! the producer is then left where it is, and the process should end (the runtime does
//! not finalise MPI under it: [`crate::runtime::abandoned`]).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::engine::Engine;
use super::producer::Producer;
use super::stream::Position;
use super::window::Delivered;
use crate::error::{Error, ErrorKind, Result, ResultExt};
use crate::transport::{agree_position, ReduceOp, Transport};

/// How often a consumer that waits asks its interrupt check ([`Interrupt`]): a Ctrl-C
/// reaches a Python training loop within this.
pub(crate) const POLL: Duration = Duration::from_millis(100);

/// The consumer's check while it waits for the producer or the other ranks: `true` gives
/// the wait up (a signal arrived). The producer is then abandoned where it is — possibly
/// inside a collective the other ranks never join — and the loader cannot continue.
pub(crate) type Interrupt<'a> = Option<&'a mut (dyn FnMut() -> bool + Send + 'static)>;

/// The error of a wait given up by the interrupt check.
fn interrupted(what: &str) -> Error {
    crate::runtime::mark_abandoned();
    Error::Misuse(format!("interrupted while {what} (the loader's producer was left where it was)"))
}

// One per loader: the size of its largest variant does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Pipeline {
    /// Nothing runs; the engine waits for a start position.
    Idle(Engine),
    /// Windows are produced on the consumer's thread (`prefetch = 0`), or one at a time on
    /// a thread of their own while the consumer waits interruptibly.
    Inline(Producer),
    /// A producer thread runs ahead.
    Background(Background),
    /// The engine was lost (its thread panicked, could not start, or was abandoned).
    Lost,
}

/// What a producer thread hands back when it ends: its engine, and — when the stop was
/// not everyone's, and no rank closed its loader — a rank that expects this one at its next
/// position agreement ([`Pipeline::stop`]).
type Ended = (Engine, Option<usize>);

/// Why a consumer stops its producer ([`Background`]'s `stop` flag).
const RUNNING: u8 = 0;
const REPOSITION: u8 = 1;
const CLOSE: u8 = 2;

pub(crate) struct Background {
    windows: Receiver<Result<Delivered>>,
    stop: Arc<AtomicU8>,
    ended: Receiver<Ended>,
    thread: JoinHandle<()>,
}

impl Pipeline {
    /// The next window of the stream. When nothing runs, a producer starts at `from`;
    /// otherwise `from` must be where the running producer is (the loader keeps both in
    /// step). With `interrupt`, waiting can be given up (see [`Interrupt`]).
    pub fn next_window(&mut self, from: Position, prefetch: usize, mut interrupt: Interrupt<'_>) -> Result<Delivered> {
        if matches!(self, Pipeline::Idle(_)) {
            self.start(from, prefetch)?;
        }
        match self {
            Pipeline::Inline(producer) if interrupt.is_some() && producer.transport().concurrent() => {
                self.produce_aside(interrupt)
            }
            Pipeline::Inline(producer) => producer.next_window(),
            Pipeline::Background(b) => match wait(&b.windows, &mut interrupt) {
                Waited::Got(window) => window,
                Waited::Gone => {
                    Err(Error::Internal("the loader's producer thread ended without a word (did it panic?)".into()))
                }
                Waited::Interrupted => {
                    self.abandon();
                    Err(interrupted("waiting for the next window"))
                }
            },
            Pipeline::Idle(_) | Pipeline::Lost => Err(Error::Internal("the loader's producer was lost".into())),
        }
    }

    /// One window of an inline producer on a thread of its own, waited for
    /// interruptibly: a collective blocks its thread, and a consumer blocked in one could
    /// not be interrupted.
    fn produce_aside(&mut self, mut interrupt: Interrupt<'_>) -> Result<Delivered> {
        let Pipeline::Inline(mut producer) = std::mem::replace(self, Pipeline::Lost) else {
            unreachable!("called on an inline pipeline");
        };
        let (tx, rx) = sync_channel(1);
        std::thread::Builder::new()
            .name("meshfeed-window".into())
            .spawn(move || {
                let window = producer.next_window();
                let _ = tx.send((producer, window));
            })
            .context(ErrorKind::Internal, "cannot start a thread for the loader's window")?;
        match wait(&rx, &mut interrupt) {
            Waited::Got((producer, window)) => {
                *self = Pipeline::Inline(producer);
                window
            }
            Waited::Gone => {
                Err(Error::Internal("the loader's window thread ended without a word (did it panic?)".into()))
            }
            Waited::Interrupted => Err(interrupted("waiting for the next window")),
        }
    }

    fn start(&mut self, from: Position, prefetch: usize) -> Result<()> {
        let Pipeline::Idle(engine) = std::mem::replace(self, Pipeline::Lost) else {
            unreachable!("start is only called on an idle pipeline");
        };
        if prefetch == 0 {
            *self = Pipeline::Inline(Producer::new(engine, from, false));
            return Ok(());
        }
        let rank = engine.stream.rank;
        // The channel holds `prefetch` windows; the producer works on the next ones.
        let (tx, rx) = sync_channel(prefetch);
        let (ended_tx, ended) = sync_channel(1);
        let stop = Arc::new(AtomicU8::new(RUNNING));
        let producer = Producer::new(engine, from, true);
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("meshfeed-producer-{rank}"))
            .spawn(move || {
                let _ = ended_tx.send(produce(producer, tx, flag));
            })
            .context(ErrorKind::Internal, "cannot start the loader's producer thread")?;
        *self = Pipeline::Background(Background { windows: rx, stop, ended, thread });
        Ok(())
    }

    /// Stops a running producer and keeps its engine (`close`: for good, else to restart
    /// elsewhere). For a background producer this is the collective stop described in the
    /// module docs; it returns a rank that expects this one at its next position agreement
    /// (the stop was not everyone's): the next window's agreement meets it, or else
    /// [`Pipeline::agree_gone`] must. It fails when `interrupt` gives the wait up.
    pub fn stop(&mut self, mut interrupt: Interrupt<'_>, close: bool) -> Result<Option<usize>> {
        match std::mem::replace(self, Pipeline::Lost) {
            Pipeline::Background(b) => {
                b.stop.store(if close { CLOSE } else { REPOSITION }, Ordering::Release);
                drop(b.windows); // unblocks a producer waiting to deliver
                match wait(&b.ended, &mut interrupt) {
                    Waited::Got((engine, expected_by)) => {
                        let _ = b.thread.join();
                        *self = Pipeline::Idle(engine);
                        return Ok(expected_by);
                    }
                    Waited::Gone => {} // the thread panicked: the engine is lost
                    Waited::Interrupted => {
                        return Err(interrupted("waiting for the other ranks to stop the loader's producer"));
                    }
                }
            }
            Pipeline::Inline(producer) => *self = Pipeline::Idle(producer.into_engine()),
            other => *self = other,
        }
        Ok(None)
    }

    /// Joins the other ranks' next position agreement as not being anywhere in the
    /// stream (`standing`: what this rank did instead, e.g. "read on"): they fail,
    /// naming it, instead of waiting for a window this rank will never make; so does this
    /// rank (the agreed error). Collective; a no-op without an engine.
    pub fn agree_gone(&mut self, standing: &str) -> Result<()> {
        match self {
            Pipeline::Idle(engine) => agree_position(&*engine.transport, u64::MAX, u64::MAX, Some(standing)),
            _ => Ok(()),
        }
    }

    /// Leaves a background producer where it is (its thread is detached; it ends at its
    /// next continue agreement, if the other ranks ever reach it).
    fn abandon(&mut self) {
        crate::runtime::mark_abandoned();
        if let Pipeline::Background(b) = std::mem::replace(self, Pipeline::Lost) {
            b.stop.store(CLOSE, Ordering::Release);
        }
    }

    /// Leaves everything as it is, freeing nothing: for a process that is not the one
    /// the loader was made in (a forked child), where the producer thread does not exist
    /// and the communicators belong to the parent.
    pub fn forget(&mut self) {
        std::mem::forget(std::mem::replace(self, Pipeline::Lost));
    }
}

/// What a wait ended with.
enum Waited<T> {
    Got(T),
    /// The sender went away without sending.
    Gone,
    Interrupted,
}

/// Waits for `rx`'s next value, asking `interrupt` (if any) every [`POLL`].
fn wait<T>(rx: &Receiver<T>, interrupt: &mut Interrupt<'_>) -> Waited<T> {
    let Some(check) = interrupt else {
        return rx.recv().map_or(Waited::Gone, Waited::Got);
    };
    loop {
        match rx.recv_timeout(POLL) {
            Ok(value) => return Waited::Got(value),
            Err(RecvTimeoutError::Disconnected) => return Waited::Gone,
            Err(RecvTimeoutError::Timeout) if check() => return Waited::Interrupted,
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

/// The producer thread: windows into the queue, and the continue agreement after each.
/// Returns the engine, and a rank that expects this one at its next position agreement.
fn produce(mut producer: Producer, windows: SyncSender<Result<Delivered>>, stop: Arc<AtomicU8>) -> Ended {
    let mut expected_by = None;
    loop {
        let window = producer.next_window();
        let failed = window.is_err();
        let delivered = windows.send(window).is_ok();
        if failed {
            // Errors are agreed (or fatal to the job): every rank's producer ends here.
            break;
        }
        let why = match stop.load(Ordering::Acquire) {
            // The consumer went away without a word: it will not restart.
            RUNNING if !delivered => CLOSE,
            why => why,
        };
        let start = std::time::Instant::now();
        let agreed = continue_agreement(producer.transport(), why);
        producer.waited_between(start.elapsed());
        match agreed {
            Ok(None) => {}
            Ok(Some(Stops { repositioned, closed, reading })) => {
                match (why, closed) {
                    // Reading on: a rank that closed will join nothing more.
                    (RUNNING, Some(rank)) => {
                        let _ = windows.send(Err(Error::Misuse(format!(
                            "rank {rank} closed its loader while this rank still reads from it (every rank must \
                             consume the same batches, and seek, set the epoch or close the loader at the same \
                             point)"
                        ))));
                    }
                    // Reading on where others repositioned: they expect this rank at their
                    // next window. (Behind the windows made, this error is read only by a
                    // consumer that reads past the point where they repositioned.)
                    (RUNNING, None) => {
                        let rank = repositioned.expect("a rank stopped");
                        let _ = windows.send(Err(Error::Misuse(format!(
                            "rank {rank} repositioned its loader while this rank still reads from it"
                        ))));
                        expected_by = Some(rank);
                    }
                    // Repositioned while some rank read on, none closed: it will restart
                    // here too, or must say where it went instead.
                    (REPOSITION, None) => expected_by = reading,
                    _ => {}
                }
                break;
            }
            Err(e) => {
                let _ = windows.send(Err(e));
                break;
            }
        }
    }
    (producer.into_engine(), expected_by)
}

/// Who stops at a continue agreement: the lowest rank that repositions, that closes its
/// loader, and that reads on (each if any).
struct Stops {
    repositioned: Option<usize>,
    closed: Option<usize>,
    reading: Option<usize>,
}

/// The continue agreement (one all-reduce of three numbers): `None` when no rank stops
/// here.
fn continue_agreement(transport: &dyn Transport, why: u8) -> Result<Option<Stops>> {
    let me = transport.rank().0 as u64;
    let mut lowest = [u64::MAX; 3];
    lowest[match why {
        REPOSITION => 0,
        CLOSE => 1,
        _ => 2,
    }] = me;
    transport.all_reduce_u64(&mut lowest, ReduceOp::Min)?;
    let rank = |r: u64| (r != u64::MAX).then_some(r as usize);
    let stops = Stops { repositioned: rank(lowest[0]), closed: rank(lowest[1]), reading: rank(lowest[2]) };
    Ok((stops.repositioned.is_some() || stops.closed.is_some()).then_some(stops))
}
