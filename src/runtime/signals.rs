//! Stop requests: SIGTERM (Slurm sends it before preempting a job) and SIGINT end a run
//! at a step boundary that every rank agrees on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::transport::{ReduceOp, Transport};

/// Records SIGTERM and SIGINT instead of dying on them. The flag lives in this value (a
/// handler registered with `signal-hook` stores the signal number into it); nothing
/// process-global of meshfeed's own.
#[derive(Clone, Debug)]
pub struct StopSignal {
    received: Arc<AtomicUsize>,
}

impl StopSignal {
    /// Installs the handlers.
    pub fn install() -> Result<StopSignal> {
        let received = Arc::new(AtomicUsize::new(0));
        for sig in [libc::SIGTERM, libc::SIGINT] {
            signal_hook::flag::register_usize(sig, received.clone(), sig as usize)
                .map_err(|e| Error::Internal(format!("cannot install a handler for signal {sig}: {e}")))?;
        }
        Ok(StopSignal { received })
    }

    /// The last stop signal received, if any.
    pub fn received(&self) -> Option<i32> {
        match self.received.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i32),
        }
    }
}

/// `SIGTERM`, `SIGINT`, or the number.
pub fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGINT => "SIGINT".into(),
        s => format!("signal {s}"),
    }
}

/// Collective: whether any rank asks to stop, given the stop signal this rank received
/// (if any); returns a signal some rank received (the same on every rank). Every rank calls
/// it at the same step; all then stop there together.
pub fn any_rank_stops(transport: &dyn Transport, received: Option<i32>) -> Result<Option<i32>> {
    let mut signal = [received.map_or(0, |s| s.max(1) as u64)];
    transport.all_reduce_u64(&mut signal, ReduceOp::Max)?;
    Ok((signal[0] != 0).then_some(signal[0] as i32))
}
