//! Reading: how a rank gets the rows of its home range off the storage and into each
//! window's sends.
//!
//! Where to start, in the order a loader meets them:
//!
//! * The **read plan** ([`plan()`], file `plan.rs`) is decided collectively when the
//!   loader is built: each host's memory budget, the storage probe where the choice depends
//!   on it, and the strategy [`crate::plan::io::choose`] picks — stream the home range once
//!   into memory and keep it (*resident*), stream it in several passes per epoch, or keep
//!   part of it and read the rest at random, optionally spilled to node-local storage.
//! * The **probe** (`probe.rs`) measures the storage: how fast it streams and how many
//!   random reads of one sample it serves, as every rank of a host sees it at once.
//! * The **home store** (`store.rs`, started by [`start_stores`]) keeps a rank's home
//!   rows off the shared storage — a prefix in memory, the rest in a spill file — filled
//!   by a thread of its own and mapped by the other ranks of the host.
//! * The **passes** ([`passes`]) stream the home range, or its spill file, several times
//!   an epoch, each pass keeping the rows the next stretch of windows needs.
//! * The **queue** (`queue.rs`) runs a window's positional reads, many in flight, each
//!   value read straight into its place.
//! * The **sends** ([`Reads`], file `sends.rs`) fill a window's sends: each value from
//!   the store, the pass, the spill file or the files, whichever holds it; and the rows a
//!   same-host receiver copies straight from its owner.
//!
//! Where each home row is — its *tier* ([`crate::plan::io::Tier`]) — is a pure function of the read plan,
//! so an owner and a receiver always agree on it.

pub(super) mod passes;
mod plan;
mod probe;
mod queue;
mod sends;
mod store;

pub(crate) use plan::{plan, start_stores};
pub(crate) use sends::{FromReads, Reads};
