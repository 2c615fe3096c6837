//! The exchange's cost: one function, used both to choose between the fused and the
//! two-phase exchange (`--exchange auto`, [`crate::loader::layout`]) and by the model
//! that `meshfeed report --predict` fits to measured windows. The constants it weighs
//! ([`ExchangeCosts`]) are the ones that fit produces, so the choice and the prediction
//! can never disagree about what a byte or a peer costs.

use crate::config::ExchangeCosts;

/// Seconds one rank spends in one all-to-all: a latency per peer it exchanges a message
/// with (`peers`: the world size less one in a full exchange), `on_host_bytes` — the bytes
/// it sends to *and* receives from ranks on its own host — over the on-host bandwidth,
/// and `link_bytes` — the larger of what its host's ranks together send to and receive
/// from other hosts (the link is full duplex, shared by the host's ranks) — over the
/// link's bandwidth. Both the choice and the fit pass these quantities, so a fitted
/// `intra` is the bandwidth of bytes in and out (`meshfeed_analysis::model`, which sees
/// a window's sends, takes the link's out for its larger side).
pub fn all_to_all_seconds(costs: &ExchangeCosts, peers: usize, on_host_bytes: f64, link_bytes: f64) -> f64 {
    let latency = costs.latency_ns as f64 * 1e-9;
    latency * peers as f64
        + on_host_bytes / costs.intra_bytes_per_s.max(1) as f64
        + link_bytes / costs.inter_bytes_per_s.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_bytes_on_the_host_and_on_the_link_each_cost_their_constant() {
        let c =
            ExchangeCosts { latency_ns: 20_000, intra_bytes_per_s: 4_000_000_000, inter_bytes_per_s: 1_000_000_000 };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(all_to_all_seconds(&c, 0, 0.0, 0.0), 0.0));
        assert!(close(all_to_all_seconds(&c, 3, 0.0, 0.0), 60e-6));
        assert!(close(all_to_all_seconds(&c, 0, 4e9, 0.0), 1.0));
        assert!(close(all_to_all_seconds(&c, 0, 0.0, 1e9), 1.0));
        assert!(close(all_to_all_seconds(&c, 1, 4e6, 1e6), 20e-6 + 1e-3 + 1e-3));
        // A zero bandwidth is a slow one, never a division by zero.
        let zero = ExchangeCosts { intra_bytes_per_s: 0, inter_bytes_per_s: 0, ..c };
        assert!(all_to_all_seconds(&zero, 0, 1.0, 1.0).is_finite());
    }
}
