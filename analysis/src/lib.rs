//! # meshfeed-analysis
//!
//! Measurement and modelling on meshfeed's records, apart from the loader and the command
//! line: what `meshfeed report` computes from runs' telemetry ([`report`]: per run and
//! epoch, the skew between ranks, the stragglers, a what-if estimate — step by step where
//! a training job recorded its steps ([`steps`]) — the scaling table),
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
pub mod steps;

/// The median of some measurements: the middle one, or the mean of the two middle ones of
/// an even count (0 for none).
///
/// The one median of the analysis: the report's per-phase and own-work medians over ranks
/// (its what-if and skew), the model's fit (rates, latencies, spread), a bench record's
/// `epoch_s` over its timed epochs and the medians of `meshfeed bench --compute-ms`'s
/// interleaved blocks. The PyTorch baseline's records (`bench/torch_loader.py`) take the
/// same rule.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn median_of_none_odd_and_even_counts() {
        assert_eq!(super::median(vec![]), 0.0);
        assert_eq!(super::median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(vec![3.0, 1.0, 2.0, 10.0]), 2.5);
    }
}
