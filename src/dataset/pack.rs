//! Sequence packing (`--pack tokens:SEQ_LEN`): the documents of a token field, concatenated
//! in id order with an optional end-of-document token after each, cut into fixed-length
//! samples as GPT-style pretraining does.
//!
//! Each file is packed on its own: its documents form one token stream of `L` tokens, and
//! packed sample `j` of the file is the stream's tokens `[j·S, j·S + S + 1)`, delivered as
//! the inputs (the first `S`, under the token field's name) and the labels (the last `S`,
//! field `labels`). Consecutive samples share one token, the last input of one being the
//! first label of the next, so every token is predicted once; the file's last
//! `(L − 1) mod S` tokens, fewer than one sample, are left out. A packed sample is a
//! fixed-size sample with a global id like any other, so the shuffle, placement,
//! resumption and world-size invariance apply to it unchanged.
//!
//! The plan of a file ([`Plan`]) is where each document starts in its stream: one `u64` per
//! document, computed from the documents' lengths ([`super::FileReader::list_lengths`]:
//! Megatron's index holds them, other formats read their offsets or values once), never by
//! reading tokens twice a window. A packed sample reads only its own tokens of the
//! documents it overlaps ([`super::FileReader::read_list_pieces`]: Megatron's `.bin` and
//! uncompressed Arrow give any range of a document; other readers read whole documents), so
//! reads and memory follow the window, not the longest document.
//!
//! Optional fields, for attention that must not cross documents: `position_ids` (`i64`,
//! `[S]`: each input's position in its run of a document inside the sample, 0 at the
//! sample's first input and at every document start inside it, as Megatron-LM's
//! `reset_position_ids` gives them; with `position_ids=document`, its position in its whole
//! document) and `cu_seqlens` (`i32`, variable length: where each document's run of inputs
//! starts, then `S`, as flash-attention's variable-length kernels take them). The plain
//! positions restart exactly where `cu_seqlens` says a run starts.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use arrow_buffer::Buffer;

use super::reader::FileReader;
use super::rows::RowChunk;
use super::schema::{DType, Field, FieldKind};
pub use crate::config::{PackSpec, PositionIds, CU_SEQLENS, POSITION_IDS};
use crate::error::{Error, Result};

/// The field holding the labels (the inputs shifted by one token).
pub const LABELS: &str = "labels";

/// A pack spec resolved against a file's fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packing {
    pub spec: PackSpec,
    /// The token field's column among the file's fields.
    pub column: usize,
    /// The token type.
    pub dtype: DType,
    /// The end-of-document token as the token type's little-endian bytes.
    eos: Option<Vec<u8>>,
    /// What each packed sample delivers.
    pub fields: Vec<Field>,
}

/// The little-endian bytes of `v` as an integer of type `dtype`, if it fits.
fn int_bytes(dtype: DType, v: i64) -> Option<Vec<u8>> {
    Some(match dtype {
        DType::U8 => u8::try_from(v).ok()?.to_le_bytes().to_vec(),
        DType::I8 => i8::try_from(v).ok()?.to_le_bytes().to_vec(),
        DType::U16 => u16::try_from(v).ok()?.to_le_bytes().to_vec(),
        DType::I16 => i16::try_from(v).ok()?.to_le_bytes().to_vec(),
        DType::U32 => u32::try_from(v).ok()?.to_le_bytes().to_vec(),
        DType::I32 => i32::try_from(v).ok()?.to_le_bytes().to_vec(),
        DType::U64 => u64::try_from(v).ok()?.to_le_bytes().to_vec(),
        DType::I64 => v.to_le_bytes().to_vec(),
        _ => return None,
    })
}

impl Packing {
    /// Resolves `spec` against `fields`: the token field must be a variable-length list of
    /// integers and the end-of-document token must be one of its values.
    pub fn resolve(spec: &PackSpec, fields: &[Field]) -> Result<Packing> {
        let bad = |why: String| Error::Config(format!("--pack {spec}: {why}"));
        let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
        let column = names
            .iter()
            .position(|&n| n == spec.field)
            .ok_or_else(|| bad(format!("unknown field '{}' (fields: {})", spec.field, names.join(", "))))?;
        let dtype = match &fields[column].kind {
            FieldKind::Bytes { elem: Some(d), .. } if int_bytes(*d, 0).is_some() => *d,
            other => return Err(bad(format!("field '{}' is {other}, not a list of integer tokens", spec.field))),
        };
        let eos = spec
            .eos
            .map(|e| int_bytes(dtype, e).ok_or_else(|| bad(format!("eos token {e} is not a {dtype} value"))))
            .transpose()?;
        let s = spec.seq_len as usize;
        let mut out = vec![Field::tensor(spec.field.clone(), dtype, vec![s]), Field::tensor(LABELS, dtype, vec![s])];
        if spec.position_ids.is_some() {
            out.push(Field::tensor(POSITION_IDS, DType::I64, vec![s]));
        }
        if spec.cu_seqlens {
            out.push(Field { name: CU_SEQLENS.into(), kind: FieldKind::Bytes { utf8: false, elem: Some(DType::I32) } });
        }
        if let Some(reason) = super::schema::duplicate_name(&out) {
            return Err(bad(reason));
        }
        Ok(Packing { spec: spec.clone(), column, dtype, eos, fields: out })
    }

    /// Packed samples of a stream of `tokens` tokens.
    pub fn samples(&self, tokens: u64) -> u64 {
        tokens.saturating_sub(1) / self.spec.seq_len
    }

    /// Tokens of the stream of documents of these lengths (end-of-document tokens included).
    pub fn stream_tokens(&self, lengths: &[u64]) -> u64 {
        lengths.iter().sum::<u64>() + if self.eos.is_some() { lengths.len() as u64 } else { 0 }
    }

    /// The plan of a file whose documents have these lengths.
    pub fn plan(&self, lengths: &[u64]) -> Plan {
        let step = u64::from(self.eos.is_some());
        let mut starts = Vec::with_capacity(lengths.len() + 1);
        let mut at = 0u64;
        for &n in lengths {
            starts.push(at);
            at += n + step;
        }
        starts.push(at);
        Plan { starts, eos: step }
    }

    /// Mean bytes of a `cu_seqlens` value over files of `documents` documents packed into
    /// `samples` samples: a run per document overlapping a sample, plus the end.
    pub fn mean_cu_seqlens_bytes(&self, documents: u64, samples: u64) -> u64 {
        4 * (documents.div_ceil(samples.max(1)) + 2)
    }
}

/// Where each document of one file starts in the file's token stream.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// `starts[d]`: the stream offset of document `d`'s first token; `starts[D]` is the
    /// stream's length.
    starts: Vec<u64>,
    /// 1 where an end-of-document token follows each document.
    eos: u64,
}

impl Plan {
    /// Tokens in the stream.
    pub fn stream_tokens(&self) -> u64 {
        *self.starts.last().expect("starts has D + 1 entries")
    }

    /// Tokens of document `d` (without its end-of-document token).
    fn len(&self, d: usize) -> u64 {
        self.starts[d + 1] - self.starts[d] - self.eos
    }

    /// The documents that have a token (or their end-of-document token) in `range`.
    fn documents(&self, range: &Range<u64>) -> Range<usize> {
        // The first document ending after range.start, up to the last starting before range.end.
        let first = self.starts[1..].partition_point(|&end| end <= range.start);
        let last = self.starts.partition_point(|&s| s < range.end);
        first..last.max(first)
    }
}

/// The plan of one file, computed by its first packed reader and kept for the others.
pub type PlanCache = std::sync::OnceLock<Arc<Plan>>;

/// Reads packed samples of one file from a reader of its documents.
pub struct PackedReader {
    inner: Box<dyn FileReader>,
    packing: Arc<Packing>,
    plan: Arc<Plan>,
    path: std::path::PathBuf,
}

impl PackedReader {
    /// Packs the `documents` documents `inner` reads (the file's own fields), with the plan from `cache`
    /// (computed if it is empty). The plan must give the stream length the scan found
    /// (`tokens`): else the file changed.
    pub fn open(
        mut inner: Box<dyn FileReader>,
        path: &Path,
        documents: u64,
        packing: Arc<Packing>,
        tokens: u64,
        cache: &PlanCache,
    ) -> Result<PackedReader> {
        let plan = match cache.get() {
            Some(plan) => plan.clone(),
            None => {
                let lengths = inner.list_lengths(documents, packing.column, packing.dtype.size())?;
                cache.get_or_init(|| Arc::new(packing.plan(&lengths))).clone()
            }
        };
        if plan.stream_tokens() != tokens {
            return Err(Error::file(
                path,
                format!("holds {} tokens to pack, {tokens} when it was scanned: it changed", plan.stream_tokens()),
            ));
        }
        Ok(PackedReader { inner, packing, plan, path: path.to_path_buf() })
    }

    /// The tokens of document `d` inside stream range `window`, as a range of the
    /// document's tokens (empty where only its end-of-document token is inside).
    fn tokens_in(&self, d: usize, window: &Range<u64>) -> Range<u64> {
        let (start, len) = (self.plan.starts[d], self.plan.len(d));
        let from = window.start.saturating_sub(start).min(len);
        from..window.end.saturating_sub(start).min(len).max(from)
    }

    /// Appends one packed sample's bytes to `out` and returns where each of its values lies
    /// there (offset, length), in field order. The S + 1 tokens are written once: the inputs
    /// are their first S, the labels their last S, from the documents' tokens in `read`.
    fn pack(&self, j: u64, read: &Pieces, out: &mut Vec<u8>) -> Result<Vec<(usize, usize)>> {
        let s = self.packing.spec.seq_len;
        let size = self.packing.dtype.size();
        let window = j * s..j * s + s + 1;
        let at = out.len();
        let mut positions: Vec<i64> = Vec::new();
        let mut cu: Vec<i32> = vec![0];
        for d in self.plan.documents(&window) {
            let tokens = self.tokens_in(d, &window);
            out.extend_from_slice(read.tokens(self, d, tokens)?);
            let doc = self.plan.starts[d]..self.plan.starts[d + 1];
            let (from, to) = (doc.start.max(window.start), doc.end.min(window.end));
            if let Some(eos) = self.packing.eos.as_deref().filter(|_| to == doc.end) {
                out.extend_from_slice(eos);
            }
            let inputs_end = to.min(window.start + s);
            if from < inputs_end {
                if from > window.start && from == doc.start {
                    cu.push((from - window.start) as i32);
                }
                // Counted from the run's first input (the sample's or the document's first)
                // or from the document's first token.
                let first = match self.packing.spec.position_ids {
                    Some(PositionIds::Document) => doc.start,
                    _ => from,
                };
                positions.extend((from - first..inputs_end - first).map(|p| p as i64));
            }
        }
        let row = s as usize * size;
        if out.len() - at != row + size {
            return Err(Error::Internal(format!("packed sample {j} has {} token bytes", out.len() - at)));
        }
        cu.push(s as i32);
        let mut values = vec![(at, row), (at + size, row)];
        if self.packing.spec.position_ids.is_some() {
            values.push((out.len(), positions.len() * 8));
            out.extend(positions.iter().flat_map(|p| p.to_le_bytes()));
        }
        if self.packing.spec.cu_seqlens {
            values.push((out.len(), cu.len() * 4));
            out.extend(cu.iter().flat_map(|c| c.to_le_bytes()));
        }
        Ok(values)
    }
}

/// The parts of documents read for some packed samples: `pieces[k]` (document, token
/// range) is row `k` of `chunk`, and its document held `lengths[k]` tokens.
struct Pieces {
    pieces: Vec<(u64, Range<u64>)>,
    chunk: RowChunk,
    lengths: Vec<u64>,
}

impl Pieces {
    /// The bytes of tokens `tokens` of document `d`, from the piece holding them; a
    /// document whose length is not the plan's is an error (the file changed).
    fn tokens(&self, reader: &PackedReader, d: usize, tokens: Range<u64>) -> Result<&[u8]> {
        let size = reader.packing.dtype.size() as u64;
        let d64 = d as u64;
        let k = self.pieces.partition_point(|(pd, r)| (*pd, r.start) <= (d64, tokens.start));
        let found = k.checked_sub(1).filter(|&k| {
            let (pd, r) = &self.pieces[k];
            *pd == d64 && r.start <= tokens.start && tokens.end <= r.end
        });
        let k = found.ok_or_else(|| Error::Internal(format!("tokens {tokens:?} of document {d} were not read")))?;
        let (len, piece) = (reader.plan.len(d), &self.pieces[k].1);
        let value = self.chunk.value(k, 0);
        if self.lengths[k] != len || value.len() as u64 != (piece.end - piece.start) * size {
            return Err(Error::file(
                &reader.path,
                format!(
                    "document {d} holds {} bytes, {len} tokens when it was indexed: it changed",
                    self.lengths[k] * size
                ),
            ));
        }
        let from = ((tokens.start - piece.start) * size) as usize;
        Ok(&value[from..from + ((tokens.end - tokens.start) * size) as usize])
    }
}

impl FileReader for PackedReader {
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let n = self.packing.samples(self.plan.stream_tokens());
        if let Some(&bad) = rows.iter().find(|&&r| r >= n) {
            return Err(Error::file(
                &self.path,
                format!("packed sample {bad} is past the end of the file ({n} samples)"),
            ));
        }
        let s = self.packing.spec.seq_len;
        let fields = self.packing.fields.len();
        let mut chunk = RowChunk::new(fields);
        let mut bytes = Vec::new();
        let mut values = Vec::with_capacity(rows.len() * fields);
        // Rows close together share documents: read each run of rows' documents at once.
        let mut i = 0;
        while i < rows.len() {
            let docs_of = |r: u64| self.plan.documents(&(r * s..r * s + s + 1));
            let mut span = docs_of(rows[i]);
            let mut k = i + 1;
            while k < rows.len() {
                let next = docs_of(rows[k]);
                if next.start < span.start || next.start > span.end {
                    break;
                }
                span.end = span.end.max(next.end);
                k += 1;
            }
            // Each sample's tokens of each document it overlaps; one piece per document
            // where consecutive samples' pieces meet (they share a token).
            let mut pieces: Vec<(u64, Range<u64>)> = Vec::new();
            for &r in &rows[i..k] {
                let window = r * s..r * s + s + 1;
                for d in self.plan.documents(&window) {
                    let t = self.tokens_in(d, &window);
                    match pieces.last_mut() {
                        Some((pd, p)) if *pd == d as u64 && t.start <= p.end => p.end = p.end.max(t.end),
                        _ => pieces.push((d as u64, t)),
                    }
                }
            }
            let size = self.packing.dtype.size();
            let (docs, lengths) = self.inner.read_list_pieces(self.packing.column, size, &pieces)?;
            chunk.add_bytes_read(docs.bytes_read());
            let read = Pieces { pieces, chunk: docs, lengths };
            for &r in &rows[i..k] {
                values.extend(self.pack(r, &read, &mut bytes)?);
            }
            i = k;
        }
        // The packed bytes were made here, not read: only the documents count as read.
        let b = chunk.add_made_buffer(Buffer::from_vec(bytes));
        for (at, len) in values {
            chunk.push_value(b, at, len);
        }
        Ok(chunk)
    }

    fn check(&self) -> Result<()> {
        self.inner.check()
    }

    /// The documents' file: the advice about this reader's reads (random access) is given
    /// on it. Packed values lie nowhere in it ([`FileReader::value_range`] is `None`).
    fn positional(&self) -> Option<super::positional::Positional<'_>> {
        self.inner.positional()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens_field() -> Vec<Field> {
        vec![
            Field { name: "text".into(), kind: FieldKind::Bytes { utf8: true, elem: None } },
            Field { name: "tokens".into(), kind: FieldKind::Bytes { utf8: false, elem: Some(DType::I32) } },
        ]
    }

    /// Documents as a reader of one list field.
    struct Docs(Vec<Vec<i32>>);

    impl FileReader for Docs {
        fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
            let mut chunk = RowChunk::new(2);
            for &r in rows {
                let bytes: Vec<u8> = self.0[r as usize].iter().flat_map(|t| t.to_le_bytes()).collect();
                let n = bytes.len();
                let b = chunk.add_buffer(Buffer::from_vec(bytes));
                chunk.push_value(b, 0, 0);
                chunk.push_value(b, 0, n);
            }
            Ok(chunk)
        }
    }

    fn ints<T: Copy>(bytes: &[u8], size: usize, f: impl Fn(&[u8]) -> T) -> Vec<T> {
        bytes.chunks(size).map(f).collect()
    }

    /// One packed sample written out the plain way: its S + 1 tokens, its positions (each
    /// input's in its run of a document inside the sample, then in its whole document) and
    /// its cu_seqlens.
    struct Want {
        stream: Vec<i32>,
        sample_pos: Vec<i64>,
        document_pos: Vec<i64>,
        cu: Vec<i32>,
    }

    /// The packing written out the plain way: concatenate, cut, shift. The sample positions
    /// count from 0 at the window's first input and at every stream offset where a document
    /// starts; the document positions count from each document's first token.
    fn reference(docs: &[Vec<i32>], s: usize, eos: Option<i32>) -> Vec<Want> {
        let mut stream = Vec::new();
        let (mut pos, mut starts) = (Vec::new(), Vec::new());
        for d in docs {
            if !d.is_empty() || eos.is_some() {
                starts.push(stream.len());
            }
            stream.extend(d);
            pos.extend(0..d.len() as i64);
            if let Some(e) = eos {
                pos.push(d.len() as i64);
                stream.push(e);
            }
        }
        (0..stream.len().saturating_sub(1) / s)
            .map(|j| {
                let w = j * s;
                let mut cu = vec![0];
                cu.extend(starts.iter().filter(|&&st| st > w && st < w + s).map(|&st| (st - w) as i32));
                cu.push(s as i32);
                let mut sample_pos: Vec<i64> = Vec::with_capacity(s);
                for i in 0..s {
                    let restart = i == 0 || starts.contains(&(w + i));
                    sample_pos.push(if restart { 0 } else { sample_pos[i - 1] + 1 });
                }
                Want { stream: stream[w..w + s + 1].to_vec(), sample_pos, document_pos: pos[w..w + s].to_vec(), cu }
            })
            .collect()
    }

    /// Megatron-LM's `reset_position_ids` on one sample's inputs (`_get_ltor_masks_and_position_ids`
    /// in megatron-core's gpt_dataset.py): positions count up from 0 and restart at 0 after
    /// every input equal to the end-of-document token.
    fn megatron_positions(inputs: &[i32], eod: i32) -> Vec<i64> {
        let mut out: Vec<i64> = Vec::with_capacity(inputs.len());
        for i in 0..inputs.len() {
            out.push(if i == 0 || inputs[i - 1] == eod { 0 } else { out[i - 1] + 1 });
        }
        out
    }

    /// Reads `rows` of `docs` packed by `spec` and checks each against `want`: inputs,
    /// labels, positions (`positions` picks which of `want`'s) and cu_seqlens.
    fn check_rows(
        docs: &[Vec<i32>],
        spec: &PackSpec,
        want: &[Want],
        positions: fn(&Want) -> &Vec<i64>,
    ) -> PackedReader {
        let s = spec.seq_len as usize;
        let packing = Arc::new(Packing::resolve(spec, &tokens_field()).unwrap());
        let lengths: Vec<u64> = docs.iter().map(|d| d.len() as u64).collect();
        let tokens = packing.stream_tokens(&lengths);
        assert_eq!(packing.samples(tokens), want.len() as u64, "{spec}");
        let mut r = PackedReader::open(
            Box::new(Docs(docs.to_vec())),
            Path::new("f"),
            docs.len() as u64,
            packing,
            tokens,
            &PlanCache::new(),
        )
        .unwrap();
        // All rows, and rows apart.
        let all: Vec<u64> = (0..want.len() as u64).collect();
        let some: Vec<u64> = all.iter().copied().filter(|r| r % 3 != 1).collect();
        for rows in [all, some] {
            let chunk = r.read_rows(&rows).unwrap();
            for (k, &j) in rows.iter().enumerate() {
                let w = &want[j as usize];
                let i32s = |b: &[u8]| i32::from_le_bytes(b.try_into().unwrap());
                assert_eq!(ints(chunk.value(k, 0), 4, i32s), w.stream[..s], "{spec} sample {j}: inputs");
                assert_eq!(ints(chunk.value(k, 1), 4, i32s), w.stream[1..], "{spec} sample {j}: labels");
                let i64s = |b: &[u8]| i64::from_le_bytes(b.try_into().unwrap());
                assert_eq!(&ints(chunk.value(k, 2), 8, i64s), positions(w), "{spec} sample {j}: positions");
                assert_eq!(&ints(chunk.value(k, 3), 4, i32s), &w.cu, "{spec} sample {j}: cu_seqlens");
            }
        }
        r
    }

    #[test]
    fn packed_samples_equal_a_plain_concatenation_cut_into_windows() {
        let docs = vec![vec![1, 2, 3], vec![], vec![10; 9], vec![7], vec![20, 21, 22, 23, 24], vec![]];
        for (s, eos) in [(4, Some(0)), (4, None), (1, Some(-1)), (3, None), (30, Some(5)), (8, Some(9))] {
            let want = reference(&docs, s, eos);
            for (option, document) in [("position_ids", false), ("position_ids=document", true)] {
                let mut spec: PackSpec = format!("tokens:{s},{option},cu_seqlens").parse().unwrap();
                spec.eos = eos.map(i64::from);
                let pick: fn(&Want) -> &Vec<i64> = if document { |w| &w.document_pos } else { |w| &w.sample_pos };
                let mut r = check_rows(&docs, &spec, &want, pick);
                assert!(r.read_rows(&[want.len() as u64]).unwrap_err().to_string().contains("past the end"));
            }
        }
    }

    /// Plain `position_ids` restart at every sample and at every document start inside it,
    /// where cu_seqlens says a run starts, and stay below S; with an end-of-document token
    /// no document holds, they are Megatron's `reset_position_ids` of the same inputs. Over
    /// documents longer than 2·S and documents ending exactly at a sample's end.
    #[test]
    fn plain_positions_restart_at_each_sample_and_document_as_megatron_resets_them() {
        let (mut long, mut at_boundary) = (0, 0);
        for s in [1usize, 2, 3, 4, 5, 8, 13] {
            // Lengths around S and its multiples, with empty documents between.
            let lens = [s - 1, 2 * s + 3, 0, s, 1, 3 * s, s + 1, 2, 0, 5 * s - 1, s - 1, 7, 2 * s];
            let docs: Vec<Vec<i32>> = lens
                .iter()
                .enumerate()
                .map(|(d, &n)| (0..n as i32).map(|t| 100 * d as i32 + t + 1).collect())
                .collect();
            for eos in [Some(0), None] {
                let want = reference(&docs, s, eos);
                let mut spec: PackSpec = format!("tokens:{s},position_ids,cu_seqlens").parse().unwrap();
                spec.eos = eos.map(i64::from);
                check_rows(&docs, &spec, &want, |w| &w.sample_pos);
                long += lens.iter().filter(|&&n| n > 2 * s).count();
                // A document (with its end-of-document token) ending where a sample's inputs end.
                let mut end = 0;
                for &n in &lens {
                    end += n + usize::from(eos.is_some());
                    at_boundary += usize::from(n > 0 && end % s == 0 && end / s <= want.len());
                }
                for (j, w) in want.iter().enumerate() {
                    assert!(w.sample_pos.iter().all(|&p| (0..s as i64).contains(&p)), "S {s} sample {j}");
                    // Each run of cu_seqlens counts 0, 1, 2, ...
                    let runs: Vec<i64> =
                        w.cu.windows(2).flat_map(|r| (0..(r[1] - r[0]) as i64).collect::<Vec<_>>()).collect();
                    assert_eq!(runs, w.sample_pos, "S {s} eos {eos:?} sample {j}");
                    if let Some(e) = eos {
                        assert_eq!(megatron_positions(&w.stream[..s], e), w.sample_pos, "S {s} sample {j}");
                    }
                }
            }
        }
        assert!(long > 0 && at_boundary > 0, "{long} long documents, {at_boundary} ending at a sample's end");
    }

    /// A packed sample reads its own tokens of the documents it overlaps, not the documents:
    /// from a Megatron `.bin` and from uncompressed Arrow lists, one document of 1M tokens
    /// packed into samples of 2048 reads about 8 KiB a sample (and the same samples as the
    /// whole document would give).
    #[test]
    fn packed_samples_of_a_long_document_read_their_tokens_not_the_document() {
        use arrow_array::{types::Int32Type, ListArray, RecordBatch};
        let dir = tempfile::tempdir().unwrap();
        let docs: Vec<Vec<i32>> = vec![(0..1_000_000).map(|t| t * 7 % 50_000).collect(), vec![9; 5000], vec![3]];
        // Megatron: i32 tokens.
        let idx = crate::dataset::megatron::tests::write(dir.path(), &docs);
        // Arrow: a List<Int32> column, one record batch.
        let arrow = dir.path().join("a.arrow");
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(
            docs.iter().map(|d| Some(d.iter().map(|&t| Some(t)).collect::<Vec<_>>())),
        );
        let batch = RecordBatch::try_from_iter([("tokens", Arc::new(list) as arrow_array::ArrayRef)]).unwrap();
        let mut w =
            arrow_ipc::writer::FileWriter::try_new(std::fs::File::create(&arrow).unwrap(), &batch.schema()).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        let open = |format: crate::dataset::header::Format, path: &Path| -> (Box<dyn FileReader>, Vec<Field>) {
            let f = match format {
                crate::dataset::header::Format::Megatron => crate::dataset::megatron::scan(path).unwrap().1,
                _ => crate::dataset::arrow::scan(path, &Default::default()).unwrap().1,
            };
            let reader: Box<dyn FileReader> = match format {
                crate::dataset::header::Format::Megatron => Box::new(
                    crate::dataset::megatron::MegatronReader::open_cached(path, &f, &Default::default()).unwrap(),
                ),
                _ => Box::new(crate::dataset::arrow::ArrowReader::open(path, &f).unwrap()),
            };
            (reader, f)
        };
        for (format, path) in
            [(crate::dataset::header::Format::Megatron, &idx), (crate::dataset::header::Format::Arrow, &arrow)]
        {
            let (reader, f) = open(format, path);
            let spec: PackSpec = "tokens:2048,eos=-1,position_ids".parse().unwrap();
            let packing = Arc::new(Packing::resolve(&spec, &f).unwrap());
            let lengths: Vec<u64> = docs.iter().map(|d| d.len() as u64).collect();
            let tokens = packing.stream_tokens(&lengths);
            let mut r = PackedReader::open(reader, path, 3, packing.clone(), tokens, &PlanCache::new()).unwrap();
            let want = reference(&docs, 2048, Some(-1));
            // Samples inside the long document, at its end (with its end-of-document token
            // and the next documents), and apart.
            let rows = [0u64, 1, 2, 300, 487, 488, 489, want.len() as u64 - 1];
            let chunk = r.read_rows(&rows).unwrap();
            for (k, &j) in rows.iter().enumerate() {
                let i32s = |b: &[u8]| i32::from_le_bytes(b.try_into().unwrap());
                let w = &want[j as usize];
                assert_eq!(ints(chunk.value(k, 0), 4, i32s), w.stream[..2048], "{format:?} sample {j}");
                assert_eq!(ints(chunk.value(k, 1), 4, i32s), w.stream[1..], "{format:?} sample {j}");
                let i64s = |b: &[u8]| i64::from_le_bytes(b.try_into().unwrap());
                assert_eq!(ints(chunk.value(k, 2), 8, i64s), w.sample_pos, "{format:?} sample {j}");
            }
            // 2049 tokens of 4 bytes a sample (less where samples share one), plus two
            // offsets per piece (Arrow): the 4 MB document is not read.
            let bound = rows.len() as u64 * (2049 * 4 + 64);
            assert!(chunk.bytes_read() <= bound, "{format:?}: {} bytes read, at most {bound}", chunk.bytes_read());
        }
    }

    #[test]
    fn a_file_whose_documents_changed_is_an_error() {
        let spec: PackSpec = "tokens:2".parse().unwrap();
        let packing = Arc::new(Packing::resolve(&spec, &tokens_field()).unwrap());
        let e = PackedReader::open(
            Box::new(Docs(vec![vec![1, 2, 3]])),
            Path::new("f"),
            1,
            packing.clone(),
            4,
            &PlanCache::new(),
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("holds 3 tokens to pack, 4 when it was scanned"), "{e}");
        // The plan says 5 tokens in document 0; the file now holds 3.
        let cache = PlanCache::new();
        cache.get_or_init(|| Arc::new(packing.plan(&[5])));
        let mut r =
            PackedReader::open(Box::new(Docs(vec![vec![1, 2, 3]])), Path::new("f"), 1, packing, 5, &cache).unwrap();
        let e = r.read_rows(&[0]).unwrap_err().to_string();
        assert!(e.contains("document 0 holds 12 bytes, 5 tokens when it was indexed"), "{e}");
    }

    #[test]
    fn specs_parse_print_and_resolve_with_clear_errors() {
        let spec: PackSpec = "tokens:2048,eos=0,position_ids,cu_seqlens".parse().unwrap();
        assert_eq!(spec.to_string(), "tokens:2048,eos=0,position_ids,cu_seqlens");
        assert_eq!((spec.seq_len, spec.eos, spec.position_ids), (2048, Some(0), Some(PositionIds::Sample)));
        let spec: PackSpec = "tokens:16, position_ids = document".parse().unwrap();
        assert_eq!(spec.position_ids, Some(PositionIds::Document));
        assert_eq!(spec.to_string(), "tokens:16,position_ids=document");
        assert_eq!(spec.to_string().parse::<PackSpec>().unwrap(), spec);
        assert_eq!("tokens:16".parse::<PackSpec>().unwrap().position_ids, None);
        let err = |s: &str| s.parse::<PackSpec>().unwrap_err().to_string();
        assert!(err("tokens").contains("no sequence length"), "{}", err("tokens"));
        assert!(err("tokens:0").contains("bad sequence length"));
        assert!(err("tokens:8,eos=x").contains("bad eos token id"));
        assert!(err("tokens:8,masks").contains("unknown option 'masks'"));
        let e = err("tokens:8,position_ids=doc");
        assert!(e.contains("unknown position_ids 'doc' (position_ids or position_ids=document)"), "{e}");
        assert!(e.contains("[,position_ids[=document]]"), "{e}");
        let resolve = |s: &str| Packing::resolve(&s.parse().unwrap(), &tokens_field()).unwrap_err().to_string();
        assert!(resolve("ids:8").contains("unknown field 'ids' (fields: text, tokens)"));
        assert!(
            resolve("text:8").contains("field 'text' is utf8 (variable length), not a list of integer tokens"),
            "{}",
            resolve("text:8")
        );
        let mut u8_field = tokens_field();
        u8_field[1].kind = FieldKind::Bytes { utf8: false, elem: Some(DType::U8) };
        let e = Packing::resolve(&"tokens:8,eos=300".parse().unwrap(), &u8_field).unwrap_err().to_string();
        assert!(e.contains("eos token 300 is not a u8 value"), "{e}");
        let mut labels = tokens_field();
        labels[1].name = LABELS.into();
        assert!(Packing::resolve(&"labels:8".parse().unwrap(), &labels).is_err());
    }
}
