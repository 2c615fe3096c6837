//! # meshfeed-analysis
//!
//! Measurement and modelling on meshfeed's records, apart from the loader and the command
//! line: what `meshfeed report` computes from runs' telemetry ([`report`]: per run and
//! epoch, the skew between ranks, the stragglers, a what-if estimate, the scaling table),
//! the cost model it fits and predicts with ([`model`]), the benchmark's results and the
//! suite's table ([`bench`](mod@bench)), and the plots of both.
//!
//! It reads the library's typed records ([`meshfeed::telemetry`]) and weighs the exchange
//! with the library's own cost function ([`meshfeed::plan::cost`]), so that the report,
//! the model and `--exchange auto` agree. Nothing here prints: the command line
//! (`meshfeed-cli`) parses arguments, calls this and presents the results.

pub mod bench;
pub mod input;
pub mod model;
pub mod report;
