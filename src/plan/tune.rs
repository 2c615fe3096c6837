//! The online tuner (`--tune auto`): window length, prefetch depth and reads in flight,
//! chosen from what the consumer waits and what a window costs to produce.
//!
//! Pure, like the rest of planning: every rank feeds it the same measures (each window's
//! maxima over the ranks, agreed with the window: [`Measure`]) and so takes the same
//! decisions at the same window. The runtime applies them from the next window it plans
//! ([`crate::loader`]). It is a hill climb in three stages, one setting at a time:
//!
//! 1. **prefetch**: where the consumer waits and windows are made on its own thread
//!    (`prefetch = 0`), a producer thread runs ahead ([`Limits::prefetch`]);
//! 2. **window**: the window grows [`GROWTH`] times while a step costs the consumer at
//!    least [`GAIN`] less time (waiting and computing) than at the length before —
//!    per-window costs, collectives, thread handoffs, file opens, spread over more steps;
//!    where a length gains less, twice the best length is tried once, and the best of
//!    them kept;
//! 3. **reads in flight**: where reading is a large part of a window's cost
//!    ([`READ_BOUND`]), the read queue depth doubles on the same rule.
//!
//! The consumer's time per step is what training sees: the producer's own cost where the
//! consumer waits for every window, less whatever a producer thread overlaps with its
//! steps.
//!
//! Each stage measures [`ROUND`] windows of the length under test, and at least
//! [`ROUND_S`] of them (windows of another length — planned before a change, or an
//! epoch's shorter last window — are not counted; the one or two windows already in the
//! pipeline when the prefetch or the reads in flight change are). Whenever a round shows
//! the consumer waiting less than [`KEEPS_UP`] of its time, the loader keeps up with
//! training and the tuner settles: more memory would buy nothing. It also settles at its
//! limits ([`Limits`]: the memory ceiling and the epoch's length) and after the last
//! stage. Settings never shrink below where they started, except a window undone to the
//! length before it, or cut to the ceiling a producer thread allows.
//!
//! Settled, the tuner keeps measuring rounds against the cost per step it settled at.
//! Where [`RETUNE_ROUNDS`] rounds in a row cost the consumer [`RETUNE`] more than that
//! while it waits (storage turned slower, a page cache evicted, a node's reads
//! throttled), the loader has become the bottleneck again and the stages run once more
//! from the settings in force. A rise in the training step's own time does not count:
//! the consumer then does not wait.

/// Windows measured at each setting under test: at least this many, and at least
/// [`ROUND_S`] of production or of the consumer's time.
pub const ROUND: u64 = 3;

/// The least time a round measures: shorter, noise decides (a loaded machine's
/// scheduling, storage that serves in bursts).
pub const ROUND_S: f64 = 0.2;

/// How much longer each window length tried is than the best so far.
pub const GROWTH: u64 = 4;

/// A step must cost the consumer at least this part less for a larger setting to stay.
pub const GAIN: f64 = 0.05;

/// A consumer that waits less than this part of its time has a loader that keeps up.
pub const KEEPS_UP: f64 = 0.05;

/// The most reads in flight the tuner moves to (unless more were given).
pub const MAX_READ_DEPTH: usize = 64;

/// Reading must be at least this part of a window's cost for more reads in flight to be
/// tried.
pub const READ_BOUND: f64 = 0.3;

/// A settled tuner tunes again where a step costs the consumer this part more than when it
/// settled, while the consumer waits ([`KEEPS_UP`]) ...
pub const RETUNE: f64 = 0.25;

/// ... in this many rounds in a row (one slow round is noise: a descheduled rank, a burst
/// of storage latency).
pub const RETUNE_ROUNDS: u32 = 2;

/// The settings the tuner moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub steps_per_window: u64,
    pub prefetch: usize,
    pub read_depth: usize,
}

/// What the tuner may choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The prefetch depth to move to from `prefetch = 0` (0: stay: the transport cannot
    /// run a producer thread, or one already runs).
    pub prefetch: usize,
    /// The most steps a window may hold at the starting prefetch, and at
    /// [`Limits::prefetch`]: the memory ceiling (`crate::plan::budget`) and the epoch.
    pub max_steps: u64,
    pub max_steps_prefetched: u64,
    /// Whether the window length may move (not with passes, whose windows fit them).
    pub window: bool,
    /// The most reads in flight.
    pub max_read_depth: usize,
}

/// One window's measures, each the maximum over the ranks (agreed with the window, so every
/// rank holds the same): its steps, and seconds of its production, of its reading (and
/// packing), of the consumer's waiting and of wall time since the window before.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measure {
    pub steps: u64,
    pub produce_s: f64,
    pub read_s: f64,
    pub wait_s: f64,
    pub wall_s: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Stage {
    Prefetch,
    /// Window lengths: `best` is the best length so far and its cost per step (`None`:
    /// the starting length is measured first); `halfway`: the length under test is twice
    /// `best`, tried after [`GROWTH`] times did not gain.
    Window {
        best: Option<(u64, f64)>,
        halfway: bool,
    },
    Depth {
        best: Option<(usize, f64)>,
    },
    /// Settled at a cost per step of `reference`; `above`: rounds in a row that cost more
    /// by [`RETUNE`] while the consumer waited.
    Settled {
        reference: f64,
        above: u32,
    },
}

/// The tuner's state: the settings in force, and the round being measured.
#[derive(Clone, Debug)]
pub struct Tuner {
    limits: Limits,
    settings: Settings,
    stage: Stage,
    round: Measure,
    windows: u64,
}

impl Tuner {
    pub fn new(start: Settings, limits: Limits) -> Tuner {
        let mut limits = limits;
        limits.max_steps = limits.max_steps.max(start.steps_per_window);
        limits.max_steps_prefetched = limits.max_steps_prefetched.max(1);
        limits.max_read_depth = limits.max_read_depth.max(start.read_depth);
        Tuner { limits, settings: start, stage: Stage::Prefetch, round: Measure::default(), windows: 0 }
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// Whether the tuner has settled (and only watches for the loader to fall behind).
    pub fn settled(&self) -> bool {
        matches!(self.stage, Stage::Settled { .. })
    }

    /// Takes one window's measures; returns the new settings where they change (from the
    /// next window planned on).
    pub fn observe(&mut self, m: Measure) -> Option<Settings> {
        if m.steps != self.settings.steps_per_window {
            return None;
        }
        self.round.steps += m.steps;
        self.round.produce_s += m.produce_s;
        self.round.read_s += m.read_s;
        self.round.wait_s += m.wait_s;
        self.round.wall_s += m.wall_s;
        self.windows += 1;
        if self.windows < ROUND || self.round.produce_s.max(self.round.wall_s) < ROUND_S {
            return None;
        }
        let round = std::mem::take(&mut self.round);
        self.windows = 0;
        let before = self.settings;
        self.decide(&round);
        (self.settings != before).then_some(self.settings)
    }

    fn decide(&mut self, round: &Measure) {
        let cost = round.wall_s / round.steps.max(1) as f64;
        let waits = round.wall_s <= 0.0 || round.wait_s >= KEEPS_UP * round.wall_s;
        let settle = |reference: f64| Stage::Settled { reference, above: 0 };
        match self.stage {
            Stage::Settled { reference, above } => {
                let above = if waits && cost > reference * (1.0 + RETUNE) { above + 1 } else { 0 };
                if above < RETUNE_ROUNDS {
                    self.stage = Stage::Settled { reference, above };
                    return;
                }
                // Fallen behind: the stages again, from the settings in force.
                self.stage = Stage::Prefetch;
            }
            _ if !waits => {
                self.stage = settle(cost);
                return;
            }
            _ => {}
        }
        let s = &mut self.settings;
        loop {
            match self.stage {
                Stage::Prefetch => {
                    self.stage = Stage::Window { best: None, halfway: false };
                    if s.prefetch == 0 && self.limits.prefetch > 0 {
                        s.prefetch = self.limits.prefetch;
                        s.steps_per_window = s.steps_per_window.min(self.limits.max_steps_prefetched);
                        return;
                    }
                }
                Stage::Window { best, halfway } => {
                    let max = if s.prefetch > 0 && self.limits.prefetch > 0 {
                        self.limits.max_steps_prefetched
                    } else {
                        self.limits.max_steps
                    };
                    let here = (s.steps_per_window, cost);
                    let best = match best {
                        // The length under test gained: it is the best so far.
                        Some((_, c)) if cost <= c * (1.0 - GAIN) => {
                            if halfway {
                                self.stage = Stage::Depth { best: None };
                                continue;
                            }
                            here
                        }
                        // It did not: halfway to it, once, else back to the best, and on.
                        Some((steps, c)) => {
                            let mid = steps * 2;
                            if !halfway && mid < s.steps_per_window {
                                s.steps_per_window = mid;
                                self.stage = Stage::Window { best: Some((steps, c)), halfway: true };
                            } else {
                                s.steps_per_window = steps;
                                self.stage = Stage::Depth { best: None };
                            }
                            return;
                        }
                        None => here,
                    };
                    let next = best.0.saturating_mul(GROWTH).min(max);
                    if !self.limits.window || next <= best.0 {
                        self.stage = Stage::Depth { best: None };
                        continue;
                    }
                    s.steps_per_window = next;
                    self.stage = Stage::Window { best: Some(best), halfway: false };
                    return;
                }
                Stage::Depth { best } => {
                    let here = (s.read_depth, cost);
                    let best = match best {
                        Some((depth, c)) if cost > c * (1.0 - GAIN) => {
                            s.read_depth = depth;
                            self.stage = settle(c);
                            return;
                        }
                        Some(_) => here,
                        // Reading too small a part of the cost for more of it in flight to matter.
                        None if round.read_s < READ_BOUND * round.produce_s => {
                            self.stage = settle(cost);
                            return;
                        }
                        None => here,
                    };
                    let next = (best.0 * 2).min(self.limits.max_read_depth);
                    if next <= best.0 {
                        self.stage = settle(best.1);
                        return;
                    }
                    s.read_depth = next;
                    self.stage = Stage::Depth { best: Some(best) };
                    return;
                }
                Stage::Settled { .. } => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model loader: a window costs `fixed` seconds plus `per_step` per step, its reads
    /// `read` of that, divided by the reads in flight up to `useful_depth`; the consumer
    /// computes `compute` per step, overlapped with production only with a producer thread.
    struct Model {
        fixed: f64,
        per_step: f64,
        read: f64,
        useful_depth: usize,
        compute: f64,
        /// Besides, `squared` × steps² a window.
        squared: f64,
    }

    impl Model {
        fn window(&self, s: Settings) -> Measure {
            let steps = s.steps_per_window;
            let base = self.fixed + self.per_step * steps as f64 + self.squared * (steps * steps) as f64;
            let reading = base * self.read;
            let read_s = reading / s.read_depth.min(self.useful_depth) as f64;
            let produce_s = base - reading + read_s;
            let compute = self.compute * steps as f64;
            let (wait_s, wall_s) = if s.prefetch == 0 {
                (produce_s, produce_s + compute)
            } else {
                ((produce_s - compute).max(0.0), produce_s.max(compute))
            };
            Measure { steps, produce_s, read_s, wait_s, wall_s }
        }

        /// Runs the tuner for `windows` windows; the settings it ends at, and how many
        /// windows it took to get there.
        fn tune(&self, start: Settings, limits: Limits, windows: usize) -> (Settings, usize, Tuner) {
            let mut tuner = Tuner::new(start, limits);
            let last = self.feed(&mut tuner, windows);
            (tuner.settings(), last, tuner)
        }

        /// Feeds `tuner` `windows` windows; after how many its settings last changed.
        fn feed(&self, tuner: &mut Tuner, windows: usize) -> usize {
            let mut last = 0;
            for w in 0..windows {
                if tuner.observe(self.window(tuner.settings())).is_some() {
                    last = w + 1;
                }
            }
            last
        }
    }

    const LIMITS: Limits =
        Limits { prefetch: 2, max_steps: 256, max_steps_prefetched: 64, window: true, max_read_depth: 64 };
    const BAD: Settings = Settings { steps_per_window: 1, prefetch: 0, read_depth: 16 };

    #[test]
    fn from_a_tiny_window_without_prefetch_the_tuner_reaches_the_cheap_window_and_a_producer_thread() {
        // Windows cost 200 ms plus 10 ms a step: a step costs 210 ms at one step, 13 ms at 64.
        let loader_bound =
            Model { fixed: 0.2, per_step: 0.01, read: 0.2, useful_depth: 16, compute: 0.0, squared: 0.0 };
        let (s, took, tuner) = loader_bound.tune(BAD, LIMITS, 200);
        assert_eq!(s, Settings { steps_per_window: 64, prefetch: 2, read_depth: 16 });
        assert!(tuner.settled());
        // Prefetch, then 1 → 4 → 16 → 64, each measured over a round; then a round at the
        // read depth, which reading (a fifth) is too small a part of to try.
        assert_eq!(took, (ROUND * 4) as usize);
        let cost = |s: Settings| loader_bound.window(s).produce_s / s.steps_per_window as f64;
        let best = (1..=64).map(|n| cost(Settings { steps_per_window: n, ..s })).fold(f64::MAX, f64::min);
        assert!(cost(s) <= best * 1.01, "{} vs {best}", cost(s));
    }

    #[test]
    fn growth_stops_where_a_longer_window_gains_too_little() {
        // Per-window costs of 20 ms against 100 ms a step: 1 → 4 steps gains 12.5 %, 4 → 16
        // only 3.6 % and 4 → 8 2.4 %; the tuner keeps 4.
        let per_step_bound =
            Model { fixed: 0.02, per_step: 0.1, read: 0.0, useful_depth: 1, compute: 0.0, squared: 0.0 };
        let (s, _, tuner) = per_step_bound.tune(BAD, LIMITS, 100);
        assert_eq!((s.steps_per_window, s.prefetch, s.read_depth), (4, 2, 16));
        // Where 4 → 16 gains too little (0.9 %) but 4 → 8 enough (8 %), 8 it is.
        // (A window's cost grows with the square of its length: caches overflow.)
        let halfway = Model { fixed: 0.2, per_step: 0.1, read: 0.0, useful_depth: 1, compute: 0.0, squared: 0.003 };
        let (s, _, _) = halfway.tune(BAD, LIMITS, 100);
        assert_eq!(s.steps_per_window, 8);
        assert!(tuner.settled());
    }

    #[test]
    fn a_loader_that_keeps_up_is_left_alone() {
        // Training takes 100 ms a step, the loader a fifth of that: on the consumer's thread
        // it is waited for (18 % of the time); once a producer thread runs ahead nothing
        // is, and nothing else changes.
        let compute_bound =
            Model { fixed: 0.01, per_step: 0.02, read: 0.5, useful_depth: 64, compute: 0.1, squared: 0.0 };
        let start = Settings { steps_per_window: 4, prefetch: 0, read_depth: 16 };
        let (s, took, tuner) = compute_bound.tune(start, LIMITS, 100);
        assert_eq!((s, took), (Settings { prefetch: 2, ..start }, ROUND as usize));
        assert!(tuner.settled());
        // Started with a producer thread, it changes nothing at all.
        let (s, took, _) = compute_bound.tune(Settings { prefetch: 2, ..start }, LIMITS, 100);
        assert_eq!((s, took), (Settings { prefetch: 2, ..start }, 0));
    }

    #[test]
    fn reads_in_flight_double_where_reading_is_the_cost_and_more_of_them_help() {
        // Reading is 90 % of a window, and 64 reads in flight serve it faster than 16.
        let iops_bound = Model { fixed: 0.1, per_step: 0.1, read: 0.9, useful_depth: 64, compute: 0.0, squared: 0.0 };
        let (s, _, _) = iops_bound.tune(BAD, Limits { max_steps_prefetched: 8, ..LIMITS }, 200);
        assert_eq!((s.steps_per_window, s.prefetch, s.read_depth), (8, 2, 64));
        // Past what the storage serves at once, the depth is undone to the last that helped.
        let served_at_32 = Model { useful_depth: 32, ..iops_bound };
        let (s, _, _) = served_at_32.tune(BAD, Limits { max_steps_prefetched: 8, ..LIMITS }, 200);
        assert_eq!(s.read_depth, 32);
    }

    #[test]
    fn a_settled_tuner_tunes_again_once_the_loader_falls_behind_and_not_for_noise_or_training() {
        // Settled at 4 steps (as above: per-window costs of 20 ms against 100 ms a step).
        let fast = Model { fixed: 0.02, per_step: 0.1, read: 0.0, useful_depth: 1, compute: 0.0, squared: 0.0 };
        let (settled, _, mut tuner) = fast.tune(BAD, LIMITS, 100);
        assert_eq!((settled.steps_per_window, tuner.settled()), (4, true));
        // One slow round (a window of 100× the cost, then two normal ones) is noise.
        let spike = Measure { produce_s: 2.0, wait_s: 2.0, wall_s: 2.0, ..fast.window(settled) };
        assert_eq!(tuner.observe(spike), None);
        assert_eq!(fast.feed(&mut tuner, 30), 0);
        assert_eq!(tuner.settings(), settled);
        // Storage turns slow: each window now pays 2 s before its first byte. Two rounds
        // later the stages run again from 4 steps, and the window grows to the ceiling.
        let slow = Model { fixed: 2.0, ..fast };
        let took = slow.feed(&mut tuner, 100);
        assert_eq!(tuner.settings(), Settings { steps_per_window: 64, ..settled });
        assert!(tuner.settled());
        // (Two rounds above the settled cost, the second of which moves to 16 steps, and a
        // round at 16 that moves to 64.)
        assert!(took <= (ROUND * (RETUNE_ROUNDS as u64 + 1)) as usize, "{took}");
        // A training step that turns slower is not the loader falling behind: a consumer
        // with a producer thread ahead of it does not wait, and nothing is retuned.
        let compute_bound =
            Model { fixed: 0.01, per_step: 0.02, read: 0.5, useful_depth: 64, compute: 0.1, squared: 0.0 };
        let start = Settings { steps_per_window: 4, prefetch: 2, read_depth: 16 };
        let (_, _, mut tuner) = compute_bound.tune(start, LIMITS, 10);
        assert!(tuner.settled());
        let slower_training = Model { compute: 0.5, ..compute_bound };
        assert_eq!(slower_training.feed(&mut tuner, 100), 0);
        assert_eq!(tuner.settings(), start);
    }

    #[test]
    fn limits_bound_every_setting() {
        let loader_bound =
            Model { fixed: 0.2, per_step: 0.01, read: 0.95, useful_depth: 1024, compute: 0.0, squared: 0.0 };
        // No producer thread possible, a ceiling of 16 steps, reads in flight up to 32.
        let limits = Limits { prefetch: 0, max_steps: 16, max_steps_prefetched: 16, window: true, max_read_depth: 32 };
        let (s, _, tuner) = loader_bound.tune(BAD, limits, 200);
        assert_eq!(s, Settings { steps_per_window: 16, prefetch: 0, read_depth: 32 });
        assert!(tuner.settled());
        // The window may not move (passes): prefetch and depth still do.
        let fixed_window = Limits { window: false, ..LIMITS };
        let (s, _, _) = loader_bound.tune(BAD, fixed_window, 200);
        assert_eq!((s.steps_per_window, s.prefetch, s.read_depth), (1, 2, 64));
        // A window planned before a change, or an epoch's short last one, is not counted.
        let mut tuner = Tuner::new(BAD, LIMITS);
        let short = Measure { steps: 5, produce_s: 1.0, wait_s: 1.0, wall_s: 1.0, read_s: 0.0 };
        assert!((0..10).all(|_| tuner.observe(short).is_none()));
        // Rounds of windows too quick to measure take as many windows as make ROUND_S.
        let quick = Measure { steps: 1, produce_s: 0.0101, wait_s: 0.0101, wall_s: 0.0101, read_s: 0.0 };
        let decided = (1..=60).find(|_| tuner.observe(quick).is_some());
        assert_eq!(decided, Some(20));
    }
}
