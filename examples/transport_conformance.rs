//! The transport conformance suite: every collective of [`Transport`] on the world of the
//! chosen transport, checked on every rank — uneven and zero-length segments, messages
//! larger than one UCX piece, chunked rounds (MPI with a small `--max-round-bytes`), the
//! non-blocking all-to-all-v with collectives issued while it is in flight, all-gather of
//! empty and uneven contributions, reductions, invalid count tables, sub-communicators
//! (split, nested split), and a duplicate used from another thread while the parent runs
//! collectives (what a loader's producer does).
//!
//! ```sh
//! mpirun -np 4 target/release/examples/transport_conformance mpi [MAX_ROUND_BYTES]
//! meshfeed launch -n 4 --exe target/release/examples/transport_conformance -- ucx
//! ```

use meshfeed::config::TransportKind;
use meshfeed::runtime::Runtime;
use meshfeed::transport::{ReduceOp, Transport};
use meshfeed::{Error, Result};

/// The bytes rank `src` sends rank `dst` in exchange `tag`: `len` of them, a function of
/// all four, so that a misplaced, short or stale segment is caught.
fn segment(tag: u8, src: usize, dst: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64 * 31 + src as u64 * 7 + dst as u64 * 13 + tag as u64 * 101) as u8).collect()
}

/// An all-to-all-v in which rank `src` sends `len(src, dst)` bytes to `dst`.
fn send_buffer(t: &dyn Transport, tag: u8, len: &dyn Fn(usize, usize) -> usize) -> (Vec<u8>, Vec<usize>) {
    let me = t.rank().0;
    let counts: Vec<usize> = (0..t.size()).map(|d| len(me, d)).collect();
    let send = (0..t.size()).flat_map(|d| segment(tag, me, d, counts[d])).collect();
    (send, counts)
}

/// Checks what an all-to-all-v built by [`send_buffer`] delivered.
fn check_received(
    t: &dyn Transport,
    what: &str,
    tag: u8,
    len: &dyn Fn(usize, usize) -> usize,
    (recv, counts): (Vec<u8>, Vec<usize>),
) -> Result<()> {
    let me = t.rank().0;
    let want_counts: Vec<usize> = (0..t.size()).map(|s| len(s, me)).collect();
    if counts != want_counts {
        return Err(Error::Verify(format!("{what}: received counts {counts:?}, expected {want_counts:?}")));
    }
    let want: Vec<u8> = (0..t.size()).flat_map(|s| segment(tag, s, me, want_counts[s])).collect();
    if recv != want {
        let at = recv.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(recv.len().min(want.len()));
        return Err(Error::Verify(format!("{what}: received bytes differ from byte {at} on")));
    }
    Ok(())
}

fn exchange(t: &dyn Transport, what: &str, tag: u8, len: &dyn Fn(usize, usize) -> usize) -> Result<()> {
    let (send, counts) = send_buffer(t, tag, len);
    let received = t.all_to_all_v(send, &counts)?;
    check_received(t, what, tag, len, received)
}

fn gather(t: &dyn Transport, what: &str, len: impl Fn(usize) -> usize) -> Result<()> {
    let me = t.rank().0;
    let all = t.all_gather(&segment(9, me, 0, len(me)))?;
    for (r, got) in all.iter().enumerate() {
        if *got != segment(9, r, 0, len(r)) {
            return Err(Error::Verify(format!("{what}: rank {r}'s contribution arrived wrong ({} bytes)", got.len())));
        }
    }
    Ok(())
}

fn reduce(t: &dyn Transport, what: &str) -> Result<()> {
    let (me, n) = (t.rank().0 as u64, t.size() as u64);
    for (op, want) in [(ReduceOp::Sum, n * (n - 1) / 2), (ReduceOp::Max, n - 1), (ReduceOp::Min, 0)] {
        let mut v = [me, 7, u64::MAX - me];
        t.all_reduce_u64(&mut v, op)?;
        let want_last = match op {
            ReduceOp::Sum => (0..n).fold(0u64, |a, r| a.wrapping_add(u64::MAX - r)),
            ReduceOp::Max => u64::MAX,
            ReduceOp::Min => u64::MAX - (n - 1),
        };
        let want_7 = if op == ReduceOp::Sum { 7 * n } else { 7 };
        if v != [want, want_7, want_last] {
            return Err(Error::Verify(format!("{what}: all-reduce {op:?} gave {v:?}")));
        }
    }
    Ok(())
}

/// Everything on one communicator; returns the names of the checks run.
fn suite(t: &dyn Transport, name: &str) -> Result<Vec<String>> {
    let mut done = Vec::new();
    let mut step = |check: &str, r: Result<()>| -> Result<()> {
        r.map_err(|e| Error::Verify(format!("{name}: {check}: {e}")))?;
        done.push(format!("{name}: {check}"));
        Ok(())
    };
    let uneven = |s: usize, d: usize| ((s * 7 + d * 3) % 5) * 997;
    step("uneven and zero-length segments", exchange(t, "uneven", 1, &uneven))?;
    step("nothing at all", exchange(t, "empty", 2, &|_, _| 0))?;
    // Larger than one UCX piece (4 MiB), to one neighbour only.
    let n = t.size();
    let big = move |s: usize, d: usize| if d == (s + 1) % n { (5 << 20) + 3 * s } else { 0 };
    step("a 5 MiB segment to a neighbour", exchange(t, "big", 3, &big))?;
    // The non-blocking exchange, with collectives of its own issued while it is in flight.
    step(
        "overlapped exchange with collectives during it",
        (|| {
            let (send, counts) = send_buffer(t, 4, &uneven);
            let mut inner: Result<()> = Ok(());
            let mut ran = false;
            let outer = t.all_to_all_v_overlapped(send, &counts, &mut || {
                ran = true;
                inner = reduce(t, "during").and_then(|()| exchange(t, "during", 5, &|s, d| (s + d) % 3 * 101));
            })?;
            inner?;
            if !ran {
                return Err(Error::Verify("`during` never ran".into()));
            }
            check_received(t, "overlapped", 4, &uneven, outer)
        })(),
    )?;
    step("all-gather, uneven with empty", gather(t, "all-gather", |r| (r % 3) * 1000))?;
    step("all-gather of nothing", gather(t, "all-gather empty", |_| 0))?;
    step("all-reduce sum, max, min", reduce(t, "all-reduce"))?;
    step(
        "count tables are checked before communicating",
        match t.all_to_all_v(vec![0u8; 3], &vec![1; n + 1]) {
            Err(e) if e.to_string().contains("count table") => Ok(()),
            other => Err(Error::Verify(format!("a table of {} entries for {n} ranks gave {other:?}", n + 1))),
        },
    )?;
    step("barrier", t.barrier())?;
    Ok(done)
}

fn run(runtime: &Runtime) -> Result<Vec<String>> {
    let world = runtime.world();
    let (me, n) = (world.rank().0, world.size());
    let mut done = suite(world, "world")?;
    // Sub-communicators: even and odd ranks, and a nested split of each.
    let half = world.split(me % 2)?;
    let want = (n + 1 - me % 2) / 2;
    if half.size() != want || half.rank().0 != me / 2 {
        return Err(Error::Verify(format!(
            "split: rank {} of {} in my half, expected {} of {want}",
            half.rank(),
            half.size(),
            me / 2
        )));
    }
    done.extend(suite(&*half, "split")?);
    let quarter = half.split(half.rank().0 % 2)?;
    done.extend(suite(&*quarter, "nested split")?);
    // A duplicate on another thread while the parent keeps running collectives: what a
    // loader's producer thread does next to its program.
    let dup = world.dup()?;
    if !world.concurrent() {
        return Err(Error::Verify("the world cannot run a duplicate on another thread".into()));
    }
    let other = std::thread::spawn(move || {
        (0..3).try_fold(Vec::new(), |mut v, i| {
            v.extend(suite(&*dup, &format!("dup on a thread, round {i}"))?);
            Ok::<_, Error>(v)
        })
    });
    for i in 0..3 {
        done.extend(suite(world, &format!("world alongside, round {i}"))?);
    }
    done.extend(other.join().map_err(|_| Error::Internal("the dup's thread panicked".into()))??);
    Ok(done)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let kind: TransportKind = args.first().map_or(Ok(TransportKind::Mpi), |k| k.parse()).unwrap_or_else(|e| {
        eprintln!("usage: transport_conformance [mpi|ucx|auto] [MAX_ROUND_BYTES]: {e}");
        std::process::exit(2);
    });
    let cap: Option<usize> = args.get(1).and_then(|c| c.parse().ok());
    let runtime = Runtime::join(kind, cap).unwrap_or_else(|e| {
        eprintln!("transport_conformance: {e}");
        std::process::exit(1);
    });
    runtime.abort_on_panic();
    let code = match run(&runtime) {
        Ok(done) => {
            if runtime.rank() == 0 {
                println!(
                    "transport_conformance: {kind} on {} ranks: {} checks passed",
                    runtime.world().size(),
                    done.len()
                );
            }
            0
        }
        Err(e) => {
            eprintln!("transport_conformance: rank {}: FAILED: {e}", runtime.rank());
            1
        }
    };
    drop(runtime);
    std::process::exit(code);
}
