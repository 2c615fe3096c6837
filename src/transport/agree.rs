//! Agreements: the collectives that keep every rank on the same path.
//!
//! * [`agree`], the failure agreement: after every fallible local phase, every rank learns
//!   whether any rank failed, and all fail alike, so that no rank goes on into a
//!   collective the others will never join (docs/design.md, "No hangs").
//! * [`agree_settings`]: every rank was given the same job (epochs, batch size, seed,
//!   mesh, ...). Ranks started with different options would otherwise wait forever in a
//!   collective, or exchange data the others did not plan for.
//! * [`agree_position`]: every rank's loader is at the same window (a loader repositioned
//!   differently on one rank is named, not met with a shorter segment than planned).

use std::collections::BTreeMap;

use super::api::{ReduceOp, Transport};
use crate::error::{Error, ErrorKind, Result, ResultExt};

/// Failure agreement: every rank calls this with the outcome of a local phase. If any rank
/// failed, every rank returns [`Error::Remote`] naming the first failing rank and its
/// message, so that no rank goes on into a collective the others will never join
/// (docs/design.md, "No hangs").
pub fn agree<T>(transport: &dyn Transport, local: Result<T>) -> Result<T> {
    agree_with(transport, local, 0).map(|(value, _)| value)
}

/// [`agree`], carrying a flag in the same reduction: returns the maximum of every rank's
/// `flag` with the value (a stop request rides on a window's agreement this way, with no
/// collective of its own).
pub fn agree_with<T>(transport: &dyn Transport, local: Result<T>, flag: u64) -> Result<(T, u64)> {
    let mut carried = [flag];
    agree_carrying(transport, local, &mut carried).map(|value| (value, carried[0]))
}

/// [`agree`], carrying numbers in the same reduction: on success each of `carried` is the
/// maximum over the ranks (a window's stop request and the tuner's measures ride on its
/// assembly agreement this way).
pub fn agree_carrying<T>(transport: &dyn Transport, local: Result<T>, carried: &mut [u64]) -> Result<T> {
    let mut failed = Vec::with_capacity(carried.len() + 1);
    failed.push(u64::from(local.is_err()));
    failed.extend_from_slice(carried);
    transport.all_reduce_u64(&mut failed, ReduceOp::Max)?;
    if failed[0] == 0 {
        carried.copy_from_slice(&failed[1..]);
        return local;
    }
    // Each failed rank sends its error's kind (one byte) and message; the others nothing.
    let message = match &local {
        Err(e @ Error::Remote { message, .. }) => [&[e.kind().code()], message.as_bytes()].concat(),
        Err(e) => [&[e.kind().code()], e.to_string().as_bytes()].concat(),
        Ok(_) => vec![],
    };
    let all = transport.all_gather(&message)?;
    if let Err(e @ Error::Remote { .. }) = local {
        // Already agreed (an earlier agreement failed on every rank alike): keep its
        // origin and text rather than attributing it again.
        return Err(e);
    }
    let failures: Vec<(usize, ErrorKind, String)> = all
        .into_iter()
        .enumerate()
        .filter_map(|(r, m)| {
            let (code, text) = m.split_first()?;
            Some((r, ErrorKind::from_code(*code), String::from_utf8_lossy(text).into_owned()))
        })
        .collect();
    let (rank, kind, mut message) =
        failures.first().cloned().unwrap_or((0, ErrorKind::Internal, "unknown failure".into()));
    if failures.len() == transport.size() && failures.len() > 1 && failures.iter().all(|(_, _, m)| *m == message) {
        message.push_str(" (on every rank)");
    } else if failures.len() > 1 {
        message.push_str(&format!(" (and {} more rank(s) failed)", failures.len() - 1));
    }
    Err(Error::Remote { rank, kind, message })
}

/// Checks that every rank holds the same value of every setting (collective). Each
/// setting that differs is named in the error, with the ranks holding each value, e.g.
/// `ranks disagree on epochs: 2 (ranks 0-1) vs 3 (rank 2)`; every rank returns the same
/// error, attributed to the lowest rank that differs from rank 0.
pub fn agree_settings(transport: &dyn Transport, settings: &[(String, String)]) -> Result<()> {
    match disagreements(&gather_settings(transport, settings)?) {
        None => Ok(()),
        Some((rank, message)) => Err(Error::Remote {
            rank,
            kind: ErrorKind::Config,
            message: format!("{message} (every rank must be given the same job)"),
        }),
    }
}

/// Checks that every rank's loader stands at the same position (collective: one small
/// all-reduce; an all-gather more when they differ). Ranks that set the epoch or sought
/// differently would otherwise exchange rows the others did not plan for; instead every
/// rank fails with the same [`ErrorKind::Misuse`] error naming each rank's position. A
/// rank that is at no position of the stream (it read on where the others repositioned,
/// or closed its loader) takes part with `standing` saying so, and `u64::MAX` for both
/// numbers, which no position has.
pub fn agree_position(transport: &dyn Transport, epoch: u64, step: u64, standing: Option<&str>) -> Result<()> {
    // The maximum of each value and of its complement: the minimum, in one reduction.
    let mut bounds = [epoch, step, !epoch, !step];
    transport.all_reduce_u64(&mut bounds, ReduceOp::Max)?;
    if bounds[0] == !bounds[2] && bounds[1] == !bounds[3] {
        return Ok(());
    }
    let here = standing.map_or_else(|| format!("epoch {epoch} step {step}"), str::to_string);
    let all = gather_settings(transport, &[("the loader's position".to_string(), here)])?;
    let (rank, message) = disagreements(&all).unwrap_or((0, "ranks disagree on the loader's position".into()));
    Err(Error::Remote {
        rank,
        kind: ErrorKind::Misuse,
        message: format!(
            "{message} (every rank must consume the same batches, and seek, set the epoch or close the loader at \
             the same point)"
        ),
    })
}

/// Every rank's settings, in rank order (collective: one all-gather).
fn gather_settings(transport: &dyn Transport, settings: &[(String, String)]) -> Result<Vec<Vec<(String, String)>>> {
    let mine = serde_json::to_vec(settings).context(ErrorKind::Internal, "settings do not serialise")?;
    transport
        .all_gather(&mine)?
        .iter()
        .map(|bytes| serde_json::from_slice(bytes))
        .collect::<std::result::Result<_, _>>()
        .context(ErrorKind::Transport, "bad settings from a peer")
}

/// What differs between the ranks' settings (`all[r]` is rank `r`'s): the first rank that
/// differs from rank 0, and the message; `None` when all agree.
fn disagreements(all: &[Vec<(String, String)>]) -> Option<(usize, String)> {
    let mut names: Vec<&str> = Vec::new();
    for (name, _) in all.iter().flatten() {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    let value = |r: usize, name: &str| -> String {
        all[r].iter().find(|(n, _)| n == name).map_or_else(|| "(not given)".to_string(), |(_, v)| v.clone())
    };
    let mut first = usize::MAX;
    let mut parts = Vec::new();
    for name in names {
        let mut by_value: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for r in 0..all.len() {
            by_value.entry(value(r, name)).or_default().push(r);
        }
        if by_value.len() > 1 {
            let reference = value(0, name);
            first = first.min((0..all.len()).find(|&r| value(r, name) != reference).unwrap_or(0));
            let mut groups: Vec<(String, Vec<usize>)> = by_value.into_iter().collect();
            groups.sort_by_key(|(_, ranks)| ranks[0]);
            let held: Vec<String> =
                groups.iter().map(|(v, ranks)| format!("{} ({})", shown(v), ranks_text(ranks))).collect();
            parts.push(format!("{name}: {}", held.join(" vs ")));
        }
    }
    (!parts.is_empty()).then(|| (first, format!("ranks disagree on {}", parts.join("; "))))
}

fn shown(v: &str) -> String {
    if v.is_empty() {
        "\"\"".into()
    } else {
        v.to_string()
    }
}

/// `rank 2`, `ranks 0-1`, `ranks 0-2, 5`.
fn ranks_text(ranks: &[usize]) -> String {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for &r in ranks {
        match spans.last_mut() {
            Some((_, end)) if *end + 1 == r => *end = r,
            _ => spans.push((r, r)),
        }
    }
    let text: Vec<String> =
        spans.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
    format!("{} {}", if ranks.len() == 1 { "rank" } else { "ranks" }, text.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::LocalTransport;

    #[test]
    fn agree_passes_success_and_names_the_failing_rank() {
        let t = LocalTransport::new();
        assert_eq!(agree(&t, Ok(5)).unwrap(), 5);
        let err = agree::<()>(&t, Err(Error::file("/d/x.npy", "truncated"))).unwrap_err();
        assert_eq!(err.to_string(), "rank 0: /d/x.npy: truncated");
        assert_eq!(err.kind(), ErrorKind::Data);
        let err = agree::<()>(&t, Err(Error::Config("bad".into()))).unwrap_err();
        assert_eq!((err.kind(), err.to_string().as_str()), (ErrorKind::Config, "rank 0: invalid configuration: bad"));
        // Agreeing on an agreed failure keeps it as it is.
        let again =
            agree::<()>(&t, Err(Error::Remote { rank: 3, kind: ErrorKind::Data, message: "m".into() })).unwrap_err();
        assert_eq!(again.to_string(), "rank 3: m");
    }

    #[test]
    fn disagreements_name_the_setting_and_the_ranks() {
        let s = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
        };
        let same = s(&[("epochs", "2"), ("seed", "1")]);
        assert_eq!(disagreements(&[same.clone(), same.clone(), same.clone()]), None);
        let other = s(&[("epochs", "3"), ("seed", "1")]);
        let (rank, msg) = disagreements(&[same.clone(), same.clone(), other, same.clone()]).unwrap();
        assert_eq!(rank, 2);
        assert_eq!(msg, "ranks disagree on epochs: 2 (ranks 0-1, 3) vs 3 (rank 2)");
        let (_, msg) = disagreements(&[same.clone(), s(&[("epochs", "2"), ("seed", "9"), ("mesh", "dp=2")])]).unwrap();
        assert!(msg.contains("seed: 1 (rank 0) vs 9 (rank 1); mesh: (not given) (rank 0) vs dp=2 (rank 1)"), "{msg}");
        assert_eq!(ranks_text(&[0, 1, 2, 5, 7, 8]), "ranks 0-2, 5, 7-8");
        // One rank: nothing to disagree with.
        agree_settings(&LocalTransport::new(), &[("epochs".into(), "2".into())]).unwrap();
        agree_position(&LocalTransport::new(), u64::MAX, 0, None).unwrap();
    }
}
