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
//! collective the others will never join. A rank whose consumer did not ask to stop — it
//! still reads batches the others abandoned — gets an error naming the rank that stopped,
//! instead of a hang.
//!
//! Stopping therefore waits until every rank's producer reaches the agreement, i.e. until
//! every rank consumes its queue or stops too: all ranks must seek, set the epoch and drop
//! their loaders at the same point of the stream (as they consume the same batches).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::engine::Engine;
use super::producer::Producer;
use super::stream::Position;
use super::window::Window;
use crate::error::{Error, Result};
use crate::transport::{ReduceOp, Transport};

pub(crate) enum Pipeline {
    /// Nothing runs; the engine waits for a start position.
    Idle(Engine),
    /// Windows are produced on the consumer's thread (`prefetch = 0`).
    Inline(Producer),
    /// A producer thread runs ahead.
    Background(Background),
    /// The engine was lost (its thread panicked, or could not start).
    Lost,
}

pub(crate) struct Background {
    windows: Receiver<Result<Window>>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Engine>,
}

impl Pipeline {
    /// The next window of the stream. When nothing runs, a producer starts at `from`;
    /// otherwise `from` must be where the running producer is (the loader keeps both in
    /// step).
    pub fn next_window(&mut self, from: Position, prefetch: usize) -> Result<Window> {
        if matches!(self, Pipeline::Idle(_)) {
            self.start(from, prefetch)?;
        }
        match self {
            Pipeline::Inline(producer) => producer.next_window(),
            Pipeline::Background(b) => b.windows.recv().unwrap_or_else(|_| {
                Err(Error::Internal("the loader's producer thread ended without a word (did it panic?)".into()))
            }),
            Pipeline::Idle(_) | Pipeline::Lost => Err(Error::Internal("the loader's producer was lost".into())),
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
        let stop = Arc::new(AtomicBool::new(false));
        let producer = Producer::new(engine, from, true);
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("meshfeed-producer-{rank}"))
            .spawn(move || produce(producer, tx, flag))
            .map_err(|e| Error::Internal(format!("cannot start the loader's producer thread: {e}")))?;
        *self = Pipeline::Background(Background { windows: rx, stop, thread });
        Ok(())
    }

    /// Stops a running producer and keeps its engine. For a background producer this is
    /// the collective stop described in the module docs.
    pub fn stop(&mut self) {
        *self = match std::mem::replace(self, Pipeline::Lost) {
            Pipeline::Background(b) => {
                b.stop.store(true, Ordering::Release);
                drop(b.windows); // unblocks a producer waiting to deliver
                b.thread.join().map_or(Pipeline::Lost, Pipeline::Idle)
            }
            Pipeline::Inline(producer) => Pipeline::Idle(producer.into_engine()),
            other => other,
        };
    }
}

/// The producer thread: windows into the queue, and the continue agreement after each.
fn produce(mut producer: Producer, windows: SyncSender<Result<Window>>, stop: Arc<AtomicBool>) -> Engine {
    loop {
        let window = producer.next_window();
        let failed = window.is_err();
        let delivered = windows.send(window).is_ok();
        if failed {
            // Errors are agreed (or fatal to the job): every rank's producer ends here.
            break;
        }
        let stop_here = !delivered || stop.load(Ordering::Acquire);
        match first_to_stop(producer.transport(), stop_here) {
            Ok(None) => {}
            Ok(Some(rank)) => {
                if !stop_here {
                    let _ = windows.send(Err(Error::Misuse(format!(
                        "rank {rank} stopped or repositioned its loader while this rank still reads from it \
                         (every rank must consume the same batches, and seek, set the epoch or drop the loader \
                         at the same point)"
                    ))));
                }
                break;
            }
            Err(e) => {
                let _ = windows.send(Err(e));
                break;
            }
        }
    }
    producer.into_engine()
}

/// The continue agreement: the lowest rank that stops here, if any.
fn first_to_stop(transport: &dyn Transport, stop: bool) -> Result<Option<usize>> {
    let mut lowest = [if stop { transport.rank().0 as u64 } else { u64::MAX }];
    transport.all_reduce_u64(&mut lowest, ReduceOp::Min)?;
    Ok((lowest[0] != u64::MAX).then_some(lowest[0] as usize))
}
