//! Unit tests of the UCX transport: the pure pieces (configuration, reduction, tags), and
//! the collectives among ranks that are threads of this process (each with its own
//! transport, bootstrapped through memory), which also shows that transports move
//! between threads.

use std::sync::{Barrier, Mutex};
use std::time::Duration;

use super::*;

#[test]
fn config_defaults_and_parsing() {
    assert_eq!(UcxConfig::parse(None, None).unwrap(), UcxConfig::default());
    assert_eq!(UcxConfig::default(), UcxConfig { tls: None, peer_timeout: DEFAULT_PEER_TIMEOUT, peer_errors: false });
    let c = UcxConfig::parse(Some("4"), Some("1")).unwrap();
    assert_eq!((c.peer_timeout, c.peer_errors, c.tls), (Duration::from_secs(4), true, None));
    assert_eq!(UcxConfig::parse(Some(" 0.25 "), None).unwrap().peer_timeout, Duration::from_millis(250));
    assert_eq!(UcxConfig::parse(Some("1e9"), None).unwrap().peer_timeout, Duration::from_secs(1_000_000_000));
    for off in ["0", ""] {
        assert!(!UcxConfig::parse(None, Some(off)).unwrap().peer_errors);
    }
}

#[test]
fn config_rejects_bad_timeouts_naming_the_variable() {
    for bad in ["0", "-0", "-1", "-inf", "abc", "", "nan", "NaN", "1e-12", "1e-300", "4s"] {
        let e = UcxConfig::parse(Some(bad), None).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{bad}: {e}");
        assert_eq!(
            e.to_string(),
            format!("invalid configuration: MESHFEED_PEER_TIMEOUT='{bad}' is not a positive number of seconds")
        );
    }
    for huge in ["inf", "infinity", "1e10", "1.0000001e9"] {
        let e = UcxConfig::parse(Some(huge), None).unwrap_err().to_string();
        assert!(e.contains(&format!("MESHFEED_PEER_TIMEOUT='{huge}' is too large")), "{e}");
    }
    let e = UcxConfig::parse(None, Some("yes")).unwrap_err().to_string();
    assert!(e.contains("MESHFEED_UCX_PEER_ERRORS='yes' must be 1 (on) or 0 (off)"), "{e}");
}

fn le(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn reduction_of_contributions() {
    let all = vec![le(&[1, 9, u64::MAX]), le(&[2, 3, 2]), le(&[4, 5, 0])];
    let ranks = [0, 1, 2];
    assert_eq!(reduce_u64(&all, &ranks, 3, ReduceOp::Sum).unwrap(), [7, 17, 1]);
    assert_eq!(reduce_u64(&all, &ranks, 3, ReduceOp::Max).unwrap(), [4, 9, u64::MAX]);
    assert_eq!(reduce_u64(&all, &ranks, 3, ReduceOp::Min).unwrap(), [1, 3, 0]);
    assert_eq!(reduce_u64(&[le(&[]), le(&[])], &ranks, 0, ReduceOp::Sum).unwrap(), Vec::<u64>::new());
}

#[test]
fn a_short_or_long_contribution_is_an_error_naming_the_rank() {
    // Group ranks 0, 1, 2 are world ranks 4, 7, 9.
    let ranks = [4, 7, 9];
    let mut all = vec![le(&[1, 2]), le(&[3, 4]), le(&[5, 6])];
    all[1].truncate(4);
    let e = reduce_u64(&all, &ranks, 2, ReduceOp::Sum).unwrap_err();
    assert!(matches!(e, Error::Transport(_)));
    assert_eq!(e.to_string(), "transport: rank 7 sent a 4-byte contribution to an all-reduce of 2 values (16 bytes)");
    all[1] = le(&[3, 4, 5]);
    let e = reduce_u64(&all, &ranks, 2, ReduceOp::Max).unwrap_err().to_string();
    assert!(e.contains("rank 7 sent a 24-byte contribution"), "{e}");
    all[1].clear();
    assert!(reduce_u64(&all, &ranks, 2, ReduceOp::Min).is_err());
}

#[test]
fn tags_keep_their_fields_apart() {
    let t = tag(SEQ_MASK, 0xfff, MAX_RANKS - 1);
    assert_eq!(t, !ABORT_BIT, "the widest collective tag fills every bit but the abort bit");
    assert_eq!(tag(SEQ_MASK + 1, 0, 0), tag(0, 0, 0), "sequence numbers wrap at 31 bits");
    assert_ne!(tag(1, 0, 0), tag(0, 1, 0));
    assert_ne!(tag(0, 1, 0), tag(0, 0, 1));
    assert_eq!(abort_tag(5) & ABORT_BIT, ABORT_BIT);
    assert_eq!(segments(&[2, 0, 3]), [0..2, 2..2, 2..5]);
}

/// Runs `f` on `n` ranks, threads of this process, each with its own transport.
fn ranks<R: Send>(n: usize, config: &UcxConfig, f: impl Fn(UcxTransport) -> R + Sync) -> Vec<R> {
    let table = Mutex::new(vec![Vec::new(); n]);
    let all_published = Barrier::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (table, all_published, f) = (&table, &all_published, &f);
                s.spawn(move || {
                    let t = UcxTransport::connect(r, n, config, |address| {
                        table.lock().unwrap()[r] = address;
                        all_published.wait();
                        Ok(table.lock().unwrap().clone())
                    })
                    .unwrap_or_else(|e| panic!("rank {r}: {e}"));
                    f(t)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank `r`'s segment for rank `d`: `len(r, d)` bytes of a pattern of both.
fn segment(r: usize, d: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (r * 31 + d * 7 + i) as u8).collect()
}

/// One all-to-all-v in which rank 0 sends rank 1 a message of several pieces, and some
/// segments are empty; checks what this rank receives.
fn check_all_to_all(t: &UcxTransport, overlapped: bool) {
    let (n, r) = (t.size(), t.rank().0);
    let len = |src: usize, dst: usize| match (src, dst) {
        (0, 1) => 2 * CHUNK + 5,
        (s, d) if (s + d) % 3 == 0 => 0,
        (s, d) => 10 * s + d + 1,
    };
    let counts: Vec<usize> = (0..n).map(|d| len(r, d)).collect();
    let send: Vec<u8> = (0..n).flat_map(|d| segment(r, d, len(r, d))).collect();
    let (recv, recv_counts) = if overlapped {
        let mut during = Vec::new();
        let got = t
            .all_to_all_v_overlapped(send, &counts, &mut || {
                // Collectives of their own on the same transport while the exchange is in
                // flight.
                during.push(t.all_gather(&[r as u8; 3]).map(|all| all.concat()));
                let mut v = [r as u64 + 1];
                during.push(t.all_reduce_u64(&mut v, ReduceOp::Sum).map(|()| v[0].to_le_bytes().to_vec()));
            })
            .unwrap();
        let want_gather: Vec<u8> = (0..n).flat_map(|s| [s as u8; 3]).collect();
        assert_eq!(during[0].as_ref().unwrap(), &want_gather);
        assert_eq!(during[1].as_ref().unwrap(), &((n * (n + 1) / 2) as u64).to_le_bytes());
        got
    } else {
        t.all_to_all_v(send, &counts).unwrap()
    };
    assert_eq!(recv_counts, (0..n).map(|s| len(s, r)).collect::<Vec<_>>());
    let want: Vec<u8> = (0..n).flat_map(|s| segment(s, r, len(s, r))).collect();
    assert!(recv == want, "rank {r} received other bytes");
}

#[test]
fn collectives_among_threads() {
    let n = 3;
    ranks(n, &UcxConfig::default(), |t| {
        let r = t.rank().0;
        assert_eq!(t.size(), n);
        check_all_to_all(&t, false);
        check_all_to_all(&t, true);
        let all = t.all_gather(&vec![r as u8; r]).unwrap();
        assert_eq!(all, (0..n).map(|s| vec![s as u8; s]).collect::<Vec<_>>());
        for (op, want) in [(ReduceOp::Sum, [3u64, 3]), (ReduceOp::Max, [2, 2]), (ReduceOp::Min, [0, 0])] {
            let mut v = [r as u64, 2 - r as u64];
            t.all_reduce_u64(&mut v, op).unwrap();
            assert_eq!(v, want, "{op:?}");
        }
        t.barrier().unwrap();
    });
}

#[test]
fn splits_and_dups_are_independent_and_move_to_other_threads() {
    let n = 4;
    ranks(n, &UcxConfig::default(), |t| {
        let r = t.rank().0;
        // Ranks 0 and 2, 1 and 3.
        let half = t.new_group((r % 2) as u64).unwrap();
        assert_eq!((half.size(), half.rank().0, half.members.clone()), (2, r / 2, vec![r % 2, r % 2 + 2]));
        let dup = t.new_group(0).unwrap();
        assert_eq!((dup.size(), dup.rank().0), (n, r));
        // The dup and the half move to a thread of their own and run collectives while
        // this thread runs others on the parent: nothing is shared among them.
        std::thread::scope(|s| {
            let other = s.spawn(move || {
                for _ in 0..20 {
                    check_all_to_all(&dup, false);
                    let mut v = [r as u64];
                    half.all_reduce_u64(&mut v, ReduceOp::Sum).unwrap();
                    assert_eq!(v[0], if r % 2 == 0 { 2 } else { 4 });
                }
                (dup, half)
            });
            for _ in 0..20 {
                let all = t.all_gather(&[r as u8]).unwrap();
                assert_eq!(all.concat(), [0, 1, 2, 3]);
                check_all_to_all(&t, true);
            }
            let (dup, half) = other.join().unwrap();
            // And back on this thread.
            dup.barrier().unwrap();
            half.barrier().unwrap();
        });
        t.barrier().unwrap();
    });
}

#[test]
fn a_silent_peer_is_reported_lost_and_told_why() {
    let config = UcxConfig { peer_timeout: Duration::from_millis(300), ..UcxConfig::default() };
    let (timed_out, told) = (Barrier::new(2), &Mutex::new(None));
    let errors = ranks(2, &config, |t| {
        if t.rank().0 == 0 {
            let e = t.barrier().unwrap_err().to_string();
            timed_out.wait();
            // The transport stays failed, with the same error, at once.
            let again = t.all_gather(b"x").unwrap_err().to_string();
            assert_eq!(again, e);
            e
        } else {
            // Rank 1 joins only after rank 0 gave up on it, and is told why.
            timed_out.wait();
            let e = t.barrier().unwrap_err();
            *told.lock().unwrap() = Some(matches!(e, Error::Remote { rank: 0, .. }));
            e.to_string()
        }
    });
    assert_eq!(errors[0], "transport: lost rank(s) [1]: no progress for 0.3 s (peer timeout, MESHFEED_PEER_TIMEOUT)");
    assert_eq!(told.lock().unwrap().take(), Some(true), "{}", errors[1]);
    assert_eq!(errors[1], format!("rank 0: {}", errors[0]));
}

#[test]
fn a_short_or_long_message_is_an_error_not_garbage() {
    // Rank 1 sends rank 0 4 or 16 bytes where rank 0 expects 8 (collectives out of step).
    for (sent, want) in [
        (4, "transport: rank 1 sent 4 bytes where 8 were expected (collectives out of step?)"),
        (16, "transport: rank 1 sent more than the 8 bytes expected (collectives out of step?)"),
    ] {
        let errors = ranks(2, &UcxConfig::default(), |t| {
            if t.rank().0 == 0 {
                t.exchange(Vec::new(), vec![0..0, 0..0], vec![0, 8]).map(|_| ()).map_err(|e| e.to_string())
            } else {
                t.exchange(vec![7; sent], vec![0..sent, 0..0], vec![0, 0]).map(|_| ()).map_err(|e| e.to_string())
            }
        });
        assert_eq!(errors[0].as_ref().unwrap_err(), want, "{sent} bytes sent");
    }
}

#[test]
fn a_malformed_worker_address_fails_the_connect_naming_its_rank() {
    let config = UcxConfig::default();
    let peer = Worker::new(None).unwrap();
    let good = address::frame(&peer.address().unwrap(), raw::ucx_version());
    let mut wrong_version = peer.address().unwrap();
    wrong_version[0] = (wrong_version[0] & 0xf0) | 0x0a; // UCX 1.13 aborts on this one
    let mut truncated = good.clone();
    truncated.truncate(good.len() - 3);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"GET / HTTP/1.1".to_vec(), "not a meshfeed worker address"),
        (vec![0xff; 300], "not a meshfeed worker address"),
        (truncated, "truncated"),
        (address::frame(&wrong_version, (1, 13)), "address format version 10"),
        (address::frame(&[0x20, 1, 2], (1, 13)), "shorter than"),
        (good.clone(), "the same address as rank 1"),
    ];
    for (bad, needle) in cases {
        let table = |mine: Vec<u8>| Ok(vec![mine, good.clone(), bad.clone()]);
        match UcxTransport::connect(0, 3, &config, table) {
            Ok(_) => panic!("a table with {bad:?} was accepted"),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("rank 2 published an invalid UCX worker address") && e.contains(needle), "{e}");
            }
        }
    }
    // A bootstrap that does not hand this rank its own address back.
    let e = match UcxTransport::connect(0, 2, &config, |_| Ok(vec![good.clone(), good.clone()])) {
        Ok(_) => panic!("accepted another worker's address as its own"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("did not return rank 0's own UCX worker address"), "{e}");
}
