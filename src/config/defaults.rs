//! The defaults that more than one option falls back to.

/// Default window budget: 64 MiB per rank.
pub const DEFAULT_WINDOW_BYTES: u64 = 64 << 20;
/// Default number of windows the background producer may run ahead.
pub const DEFAULT_PREFETCH: usize = 2;
