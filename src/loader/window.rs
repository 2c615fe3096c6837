//! What one window is on its way through the producer: filled (read, and ready to
//! exchange), received, delivered; and the route it takes. Shared by the engine and the
//! exchange variants ([`super::two_phase`], [`super::broadcast`]).

use super::batch::Batch;
use super::marshal::Receipt;
use super::metrics::Metrics;
use super::stream::{Stream, WindowSpec};
use crate::plan::Placement;
use crate::types::SampleId;

/// A window as the producer delivers it: this rank's batches, and what producing them
/// cost on this rank.
pub(crate) struct Delivered {
    pub spec: WindowSpec,
    pub batches: Vec<Batch>,
    pub metrics: Metrics,
    /// A stop the ranks agreed on with this window ([`crate::loader::Loader::stop_requested`]):
    /// the signal number some rank received, or [`super::engine::STOP_REQUESTED`].
    pub stop: Option<i32>,
    /// The tuned settings in force after this window's agreement (`None`: not tuned); the
    /// consumer starts a producer thread where their prefetch asks for one.
    pub tuned: Option<crate::plan::tune::Settings>,
}

/// How a window is exchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Fused,
    /// Fused, with every rank on one host and local reads: no row crosses the exchange,
    /// so the window skips it (and the read agreement); the assembly agreement remains.
    Local,
    TwoPhase,
    Broadcast,
}

/// A window read and filled: ready to exchange.
pub(crate) struct Filled {
    pub spec: WindowSpec,
    pub route: Route,
    /// The home ranges the window was read with (they move between epochs where the
    /// stream balances them).
    pub home: std::sync::Arc<crate::plan::HomeRanges>,
    /// Sample id of every window row.
    pub ids: Vec<SampleId>,
    pub send: Vec<u8>,
    pub counts: Vec<usize>,
    pub metrics: Metrics,
    /// An error of a [`Route::Local`] window, agreed at its assembly.
    pub deferred: Option<crate::error::Error>,
}

/// A window after its exchange: the bytes this rank received.
pub(crate) struct Received {
    pub spec: WindowSpec,
    pub route: Route,
    /// The home ranges the window was read with (they move between epochs where the
    /// stream balances them).
    pub home: std::sync::Arc<crate::plan::HomeRanges>,
    pub ids: Vec<SampleId>,
    pub recv: Vec<u8>,
    pub recv_counts: Vec<usize>,
    pub metrics: Metrics,
    pub deferred: Option<crate::error::Error>,
}

/// What this rank receives of each global batch under `placement`, for
/// [`super::marshal::assemble`].
pub(crate) fn receipt<'a>(
    stream: &'a Stream,
    placement: &'a Placement,
    spec: &WindowSpec,
    ids: &'a [SampleId],
) -> Receipt<'a> {
    let (rows, parts) = match placement.receiver(stream.rank) {
        Some((block, rc)) => (block.rows.clone(), &rc.parts[..]),
        None => (0..0, &[][..]),
    };
    Receipt {
        epoch: spec.epoch,
        steps: spec.steps.clone(),
        batch_size: stream.options.batch_size,
        ids,
        rows,
        parts,
        coords: &stream.coords,
    }
}
