//! Stop requests: SIGTERM (Slurm sends it before preempting a job) and SIGINT end a run
//! at a step boundary that every rank agrees on ([`StopCheck`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::error::{ErrorKind, Result, ResultExt};
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
                .context(ErrorKind::Internal, format_args!("cannot install a handler for signal {sig}"))?;
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

/// Handlers that record stop signals into a loader's flag while the value lives
/// ([`crate::loader::Loader::stop_requested`]). They chain to a handler the program
/// installed before. Where a signal had its default action (termination) before, it gets
/// it back when the last such value is dropped: signal-hook keeps its own handler installed
/// after its actions are removed, and would otherwise leave the signal ignored.
#[derive(Debug)]
pub struct StopHandlers {
    ids: Vec<signal_hook::SigId>,
}

/// The live [`StopHandlers`], and the condition under which the signals that had their
/// default action before take it again (none live).
static HOLDERS: Mutex<usize> = Mutex::new(0);
static DEFAULT_AGAIN: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Whether `sig`'s disposition is the default action (asked without changing it).
fn has_default_action(sig: i32) -> bool {
    // SAFETY: sigaction with a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL
    }
}

impl StopHandlers {
    /// Records `signals` into `flag` (the signal's number) from now until the value is dropped.
    pub fn install(signals: &[i32], flag: Arc<AtomicUsize>) -> Result<StopHandlers> {
        let mut holders = HOLDERS.lock().unwrap_or_else(|p| p.into_inner());
        let again = DEFAULT_AGAIN.get_or_init(|| {
            let again = Arc::new(AtomicBool::new(false));
            // Before signal-hook first touches them: which ones terminated the process.
            for &sig in signals.iter().filter(|&&s| has_default_action(s)) {
                let _ = signal_hook::flag::register_conditional_default(sig, again.clone());
            }
            again
        });
        let mut ids = Vec::with_capacity(signals.len());
        for &sig in signals {
            match signal_hook::flag::register_usize(sig, flag.clone(), sig as usize) {
                Ok(id) => ids.push(id),
                Err(e) => {
                    for id in ids {
                        signal_hook::low_level::unregister(id);
                    }
                    return Err(e)
                        .context(ErrorKind::Internal, format_args!("cannot install a handler for signal {sig}"));
                }
            }
        }
        *holders += 1;
        again.store(false, Ordering::SeqCst);
        Ok(StopHandlers { ids })
    }
}

impl Drop for StopHandlers {
    fn drop(&mut self) {
        let mut holders = HOLDERS.lock().unwrap_or_else(|p| p.into_inner());
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
        *holders -= 1;
        if *holders == 0 {
            if let Some(again) = DEFAULT_AGAIN.get() {
                again.store(true, Ordering::SeqCst);
            }
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

/// The most steps between two stop agreements.
const MAX_STEPS_BETWEEN_CHECKS: u64 = 1024;

/// Agrees, every few steps, whether any rank was asked to stop, so that all ranks stop
/// after the same step.
///
/// Agreeing is a collective, and a collective at every step costs more than short steps
/// do (ranks spin in it while the loader's producer needs the cores). So the agreement is
/// made every `k` steps, `k` chosen so that agreements are about `interval` apart in time:
/// at every agreement each rank also contributes how long its last `k` steps took, and all
/// derive the next `k` from the slowest rank's time — the same `k` on every rank, so the
/// agreements stay collective. With steps longer than `interval`, every step is checked.
#[derive(Debug)]
pub struct StopCheck {
    interval: Duration,
    every: u64,
    steps: u64,
    since: Instant,
}

impl StopCheck {
    /// Agreements about `interval` apart (the first after the first step).
    pub fn new(interval: Duration) -> StopCheck {
        StopCheck { interval, every: 1, steps: 0, since: Instant::now() }
    }

    /// Call after every delivered step, on every rank. Collective at the steps where the
    /// ranks agree; returns a signal some rank received when all stop after this step.
    pub fn after_step(&mut self, transport: &dyn Transport, signal: &StopSignal) -> Result<Option<i32>> {
        self.steps += 1;
        if self.steps % self.every != 0 {
            return Ok(None);
        }
        let took = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let mut agreed = [signal.received().map_or(0, |s| s.max(1) as u64), took];
        transport.all_reduce_u64(&mut agreed, ReduceOp::Max)?;
        self.every = next_interval(self.every, agreed[1], self.interval);
        self.steps = 0;
        self.since = Instant::now();
        Ok((agreed[0] != 0).then_some(agreed[0] as i32))
    }

    /// Steps until the next agreement is made.
    pub fn every(&self) -> u64 {
        self.every
    }
}

/// Steps between agreements so that they are about `interval` apart, when the last
/// `every` steps took `took_ns` on the slowest rank.
fn next_interval(every: u64, took_ns: u64, interval: Duration) -> u64 {
    let per_step = (took_ns / every.max(1)).max(1);
    let want = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX) / per_step;
    want.clamp(1, MAX_STEPS_BETWEEN_CHECKS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreements_are_spaced_by_time() {
        let ms = Duration::from_millis;
        // 1 ms steps, 50 ms apart: every 50 steps; slow steps: every step.
        assert_eq!(next_interval(1, 1_000_000, ms(50)), 50);
        assert_eq!(next_interval(50, 50_000_000, ms(50)), 50);
        assert_eq!(next_interval(50, 500_000_000, ms(50)), 5);
        assert_eq!(next_interval(1, 200_000_000, ms(50)), 1);
        // Bounded both ways, whatever the clock says.
        assert_eq!(next_interval(1, 0, ms(50)), MAX_STEPS_BETWEEN_CHECKS);
        assert_eq!(next_interval(1024, u64::MAX, ms(50)), 1);
    }

    #[test]
    fn a_stop_is_agreed_at_a_check() {
        let t = crate::transport::LocalTransport::new();
        let received = Arc::new(AtomicUsize::new(0));
        let signal = StopSignal { received: received.clone() };
        let mut check = StopCheck::new(Duration::from_secs(3600));
        assert_eq!(check.after_step(&t, &signal).unwrap(), None);
        assert!(check.every() > 1, "fast steps are checked less often");
        received.store(libc::SIGTERM as usize, Ordering::SeqCst);
        let stopped_after = (1..=check.every()).find(|_| check.after_step(&t, &signal).unwrap().is_some());
        assert!(stopped_after.is_some(), "the stop is agreed within one interval");
    }
}
