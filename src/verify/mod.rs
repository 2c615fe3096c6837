//! Verification of delivered data (`meshfeed run --verify`, `--dump`): collective checks
//! that every epoch delivered each sample exactly once, in the order of the epoch's
//! permutation, with the right contents; and the per-rank dump format ([`dump`]).
//!
//! * Order: row `j` of step `k` must be the sample at position `k·B + j` of `π(seed, epoch)`.
//! * Contents: when the dataset was written by `meshfeed gen` (its manifest is found),
//!   every delivered value is recomputed from its id and compared byte for byte.
//! * Exactly once: every rank sends the ids it received to their home ranks; each home
//!   rank counts deliveries of its ids (two bytes per id of its home range) and checks that
//!   ids at positions `< steps·B` arrived exactly once per receiving rank of their row block
//!   (replicas and tensor-parallel peers each receive their copy or slice) and the others
//!   (the dropped tail) never did.

pub mod dump;

use crate::dataset::gen::{self, Manifest};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::loader::Batch;
use crate::plan::{HomeRanges, Permutation, Placement, SharedOrder};
use crate::transport::{ReduceOp, Transport};
use crate::types::Epoch;

/// What one epoch's verification found, summed over ranks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub delivered: u64,
    pub missing: u64,
    pub duplicated: u64,
    pub unexpected: u64,
    pub out_of_order: u64,
    pub wrong_contents: u64,
    pub values_checked: u64,
}

impl Report {
    /// Whether nothing was wrong.
    pub fn ok(&self) -> bool {
        self.missing + self.duplicated + self.unexpected + self.out_of_order + self.wrong_contents == 0
    }
}

/// Per-rank verification state.
pub struct Verifier {
    batch_size: usize,
    /// Ranks receiving something, per row of the global batch.
    copies_per_row: Vec<u16>,
    /// The same for a partial last batch (step `last_step`), if the tail policy makes one.
    tail_copies_per_row: Option<Vec<u16>>,
    last_step: u64,
    /// The job's seed and the shared order it opted into, if any: the epoch's order.
    order: (u64, Option<SharedOrder>),
    manifest: Option<(Manifest, Vec<usize>)>,
    perm: Option<Permutation>,
    delivered: Vec<u64>,
    out_of_order: u64,
    wrong_contents: u64,
    values_checked: u64,
    first_problem: Option<String>,
}

impl Verifier {
    /// A verifier for `dataset`; `manifest` (when the data was generated) enables the
    /// content check.
    pub fn new(
        dataset: &Dataset,
        placement: &Placement,
        tail: Option<&Placement>,
        steps_per_epoch: u64,
        order: (u64, Option<SharedOrder>),
        manifest: Option<Manifest>,
    ) -> Result<Verifier> {
        let batch_size = placement.batch_size();
        let copies = |p: &Placement| -> Vec<u16> {
            (0..p.batch_size())
                .map(|r| p.block_of_row(r).receivers.iter().filter(|rc| !rc.parts.is_empty()).count() as u16)
                .collect()
        };
        let copies_per_row = copies(placement);
        let tail_copies_per_row = tail.map(copies);
        let manifest = match manifest {
            None => None,
            Some(m) => {
                if m.samples != dataset.len() {
                    return Err(Error::Verify(format!(
                        "the generator manifest says {} samples, the files hold {}",
                        m.samples,
                        dataset.len()
                    )));
                }
                let map = dataset
                    .fields()
                    .iter()
                    .map(|f| {
                        m.fields.iter().position(|g| g == f).ok_or_else(|| {
                            Error::Verify(format!("field '{}' ({}) is not in the generator manifest", f.name, f.kind))
                        })
                    })
                    .collect::<Result<Vec<usize>>>()?;
                Some((m, map))
            }
        };
        Ok(Verifier {
            batch_size,
            copies_per_row,
            tail_copies_per_row,
            last_step: steps_per_epoch.saturating_sub(1),
            order,
            manifest,
            perm: None,
            delivered: Vec::new(),
            out_of_order: 0,
            wrong_contents: 0,
            values_checked: 0,
            first_problem: None,
        })
    }

    /// Whether contents are checked (the dataset has a generator manifest).
    pub fn checks_contents(&self) -> bool {
        self.manifest.is_some()
    }

    fn problem(&mut self, what: String) {
        self.first_problem.get_or_insert(what);
    }

    /// Starts an epoch.
    pub fn begin_epoch(&mut self, n: u64, epoch: Epoch) {
        self.perm = Some(Permutation::of(n, self.order.0, self.order.1, epoch.0));
        self.delivered.clear();
        self.out_of_order = 0;
        self.wrong_contents = 0;
        self.values_checked = 0;
    }

    /// Checks one delivered batch.
    pub fn check(&mut self, batch: &Batch, dataset: &Dataset) {
        let perm = self.perm.as_ref().expect("begin_epoch first");
        let base = batch.step().0 * self.batch_size as u64 + batch.rows().start as u64;
        let mut wrong_order = Vec::new();
        for (r, id) in batch.ids().iter().enumerate() {
            self.delivered.push(id.0);
            let want = perm.apply((base + r as u64) % perm.len());
            if id.0 != want {
                wrong_order.push((r, id.0, want));
            }
        }
        for (r, got, want) in wrong_order {
            self.out_of_order += 1;
            self.problem(format!(
                "step {} row {}: got sample {got}, the permutation says {want}",
                batch.step(),
                batch.rows().start + r
            ));
        }
        let Some((manifest, map)) = &self.manifest else {
            return;
        };
        let mut full = Vec::new();
        let mut expected = Vec::new();
        let mut bad = Vec::new();
        for fd in batch.fields() {
            let fi = dataset
                .fields()
                .iter()
                .position(|f| f.name == fd.field().name)
                .expect("batch fields come from the dataset");
            for (r, id) in batch.ids().iter().enumerate() {
                full.clear();
                expected.clear();
                gen::value(&manifest.fields, id.0, map[fi], &mut full);
                fd.part().copy(fd.field(), &full, &mut expected);
                self.values_checked += 1;
                if fd.row(r) != expected.as_slice() {
                    bad.push(format!(
                        "sample {} field '{}': delivered bytes differ from the generated value",
                        id.0,
                        fd.field().name
                    ));
                }
            }
        }
        self.wrong_contents += bad.len() as u64;
        if let Some(first) = bad.into_iter().next() {
            self.problem(first);
        }
    }

    /// Ends the epoch: the collective exactly-once check. Every rank gets the same report.
    pub fn finish_epoch(
        &mut self,
        transport: &dyn Transport,
        home: &HomeRanges,
        delivered_positions: std::ops::Range<u64>,
    ) -> Result<(Report, Option<String>)> {
        let world = transport.size();
        let me = transport.rank();
        let perm = self.perm.as_ref().expect("begin_epoch first");
        // Send each delivered id to its home rank.
        let mut by_owner: Vec<Vec<u8>> = vec![Vec::new(); world];
        for &id in &self.delivered {
            by_owner[home.owner(crate::types::SampleId(id)).0].extend(id.to_le_bytes());
        }
        let counts: Vec<usize> = by_owner.iter().map(Vec::len).collect();
        let send: Vec<u8> = by_owner.concat();
        let (recv, _) = transport.all_to_all_v(send, &counts)?;
        let range = home.range(me);
        let mut seen = vec![0u16; (range.end - range.start) as usize];
        let mut r = Report { delivered: self.delivered.len() as u64, ..Default::default() };
        for id in recv.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))) {
            match id.checked_sub(range.start).filter(|&o| o < seen.len() as u64) {
                Some(o) => seen[o as usize] = seen[o as usize].saturating_add(1),
                None => r.unexpected += 1,
            }
        }
        let n = perm.len();
        let b = self.batch_size as u64;
        // Ranks that receive position q: by the placement of q's step (the tail policy's
        // partial last batch has its own), zero past its rows.
        let copies_at = |q: u64| -> u16 {
            let row = (q % b) as usize;
            let per_row = match &self.tail_copies_per_row {
                Some(t) if q / b == self.last_step => t,
                _ => &self.copies_per_row,
            };
            per_row.get(row).copied().unwrap_or(0)
        };
        for (o, &count) in seen.iter().enumerate() {
            let id = range.start + o as u64;
            let position = perm.invert(id);
            // Padding wraps positions past N to the start, so an id can sit at p and p + N.
            let copies: u16 = (0..)
                .map(|k| position + k * n)
                .take_while(|&q| q < delivered_positions.end)
                .filter(|q| delivered_positions.contains(q))
                .map(copies_at)
                .sum();
            let expected = copies > 0;
            match (expected, count) {
                (true, 0) => {
                    r.missing += 1;
                    self.first_problem.get_or_insert(format!("sample {id} was never delivered"));
                }
                (true, c) if c == copies => {}
                (false, 0) => {}
                (true, c) if c < copies => {
                    r.missing += 1;
                    self.first_problem.get_or_insert(format!("sample {id} reached {c} of its {copies} ranks"));
                }
                (true, _) => {
                    r.duplicated += 1;
                    self.first_problem
                        .get_or_insert(format!("sample {id} was delivered {count} times, to {copies} ranks"));
                }
                (false, _) => {
                    r.unexpected += 1;
                    self.first_problem.get_or_insert(format!(
                        "sample {id} (position {position}) was delivered but is outside the steps delivered"
                    ));
                }
            }
        }
        r.out_of_order = self.out_of_order;
        r.wrong_contents = self.wrong_contents;
        r.values_checked = self.values_checked;
        let mut sums =
            [r.delivered, r.missing, r.duplicated, r.unexpected, r.out_of_order, r.wrong_contents, r.values_checked];
        transport.all_reduce_u64(&mut sums, ReduceOp::Sum)?;
        let total = Report {
            delivered: sums[0],
            missing: sums[1],
            duplicated: sums[2],
            unexpected: sums[3],
            out_of_order: sums[4],
            wrong_contents: sums[5],
            values_checked: sums[6],
        };
        // Share the first problem any rank saw, so every rank can name it.
        let mine = self.first_problem.take().map(|p| format!("rank {me}: {p}")).unwrap_or_default();
        let first = transport
            .all_gather(mine.as_bytes())?
            .into_iter()
            .find(|m| !m.is_empty())
            .map(|m| String::from_utf8_lossy(&m).into_owned());
        Ok((total, first))
    }
}
