//! The page headers of a Parquet column chunk, walked to bound what reading it decodes.
//!
//! The `parquet` crate decompresses and decodes a page whole, into a buffer of the size its
//! header declares, even to deliver two of its rows: a 16 KB file holding one zstd page of
//! 256 MiB of zeros took 553 MB to read two rows (issue 41). The crate keeps page headers
//! to itself, so a reader walks them here first (a header is a Thrift compact-protocol
//! struct before each page: its type, uncompressed and compressed sizes are its fields 1,
//! 2 and 3, <https://github.com/apache/parquet-format/blob/master/src/main/thrift/parquet.thrift>)
//! and refuses a column chunk holding a page larger than it may decode. Every length is
//! checked against the chunk before it is used; the walk reads headers only.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{Error, Result};

/// What a page header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageHeader {
    /// Parquet's page type: 0 data, 1 index, 2 dictionary, 3 data (v2).
    pub kind: i32,
    pub uncompressed: u64,
    pub compressed: u64,
    /// Bytes of the header itself.
    pub header_len: u64,
}

impl PageHeader {
    /// The page's kind in words.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            2 => "dictionary page",
            1 => "index page",
            _ => "data page",
        }
    }
}

/// Why a header could not be read from the bytes given.
#[derive(Debug, PartialEq, Eq)]
enum Short {
    /// The header goes on past the bytes given: this many are needed at least.
    Need(usize),
    /// Not a page header.
    Bad(&'static str),
}

/// A reader of Thrift's compact protocol over a byte slice.
struct Compact<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// Nesting deeper than this is corrupt (a page header nests three levels).
const MAX_DEPTH: u32 = 16;

impl Compact<'_> {
    fn skip(&mut self, n: u64) -> std::result::Result<(), Short> {
        let end = usize::try_from(n).ok().and_then(|n| self.at.checked_add(n)).ok_or(Short::Bad("length overflows"))?;
        if end > self.bytes.len() {
            return Err(Short::Need(end));
        }
        self.at = end;
        Ok(())
    }

    fn byte(&mut self) -> std::result::Result<u8, Short> {
        let b = *self.bytes.get(self.at).ok_or(Short::Need(self.at + 1))?;
        self.at += 1;
        Ok(b)
    }

    fn varint(&mut self) -> std::result::Result<u64, Short> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f).checked_shl(shift).ok_or(Short::Bad("bad varint"))?;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Short::Bad("bad varint"))
    }

    fn zigzag_i32(&mut self) -> std::result::Result<i32, Short> {
        let v = self.varint()?;
        let v = i64::try_from(v >> 1).map_err(|_| Short::Bad("bad integer"))? ^ -((v & 1) as i64);
        i32::try_from(v).map_err(|_| Short::Bad("integer out of range"))
    }

    /// Skips a value of compact type `ty` (booleans of a struct field carry no payload).
    fn skip_value(&mut self, ty: u8, depth: u32) -> std::result::Result<(), Short> {
        if depth > MAX_DEPTH {
            return Err(Short::Bad("nested too deeply"));
        }
        match ty {
            1 | 2 => Ok(()),
            3 => self.skip(1),
            4..=6 => self.varint().map(drop),
            7 => self.skip(8),
            8 => {
                let n = self.varint()?;
                self.skip(n)
            }
            9 | 10 => {
                let head = self.byte()?;
                let mut n = u64::from(head >> 4);
                if n == 15 {
                    n = self.varint()?;
                }
                // Every element takes a byte at least: a count past the bytes runs out.
                for _ in 0..n {
                    match head & 0x0f {
                        1 | 2 => self.skip(1)?,
                        t => self.skip_value(t, depth + 1)?,
                    }
                }
                Ok(())
            }
            11 => {
                let n = self.varint()?;
                if n > 0 {
                    let kv = self.byte()?;
                    for _ in 0..n {
                        for t in [kv >> 4, kv & 0x0f] {
                            match t {
                                1 | 2 => self.skip(1)?,
                                t => self.skip_value(t, depth + 1)?,
                            }
                        }
                    }
                }
                Ok(())
            }
            12 => self.fields(depth + 1, |_, _, _| Ok(false)),
            13 => self.skip(16),
            _ => Err(Short::Bad("unknown field type")),
        }
    }

    /// Walks a struct's fields to its end: `read(self, id, type)` reads a field it wants
    /// (returning `true`), the others are skipped.
    fn fields(
        &mut self,
        depth: u32,
        mut read: impl FnMut(&mut Self, i16, u8) -> std::result::Result<bool, Short>,
    ) -> std::result::Result<(), Short> {
        let mut id = 0i16;
        loop {
            let head = self.byte()?;
            if head == 0 {
                return Ok(());
            }
            let (delta, ty) = (head >> 4, head & 0x0f);
            id = if delta == 0 {
                let v = self.varint()?;
                i16::try_from((v >> 1) as i64 ^ -((v & 1) as i64)).map_err(|_| Short::Bad("bad field id"))?
            } else {
                id.checked_add(i16::from(delta)).ok_or(Short::Bad("bad field id"))?
            };
            if !read(self, id, ty)? {
                self.skip_value(ty, depth)?;
            }
        }
    }
}

/// Parses the page header at the start of `bytes`.
fn parse(bytes: &[u8]) -> std::result::Result<PageHeader, Short> {
    let mut c = Compact { bytes, at: 0 };
    let (mut kind, mut uncompressed, mut compressed) = (None, None, None);
    c.fields(0, |c, id, ty| {
        let slot = match (id, ty) {
            (1, 5) => &mut kind,
            (2, 5) => &mut uncompressed,
            (3, 5) => &mut compressed,
            _ => return Ok(false),
        };
        *slot = Some(c.zigzag_i32()?);
        Ok(true)
    })?;
    let size =
        |v: Option<i32>| v.and_then(|v| u64::try_from(v).ok()).ok_or(Short::Bad("a size is missing or negative"));
    Ok(PageHeader {
        kind: kind.ok_or(Short::Bad("no page type"))?,
        uncompressed: size(uncompressed)?,
        compressed: size(compressed)?,
        header_len: c.at as u64,
    })
}

/// Bytes read for a header at first (headers are tens of bytes; statistics make them more).
const FIRST_READ: u64 = 4 << 10;

/// Walks the pages of the column chunk at bytes `chunk` of `file`, calling `page(n, header)`
/// for each in order. A header that does not parse, or a page past the chunk, is an error
/// naming `what` (the row group and column) and the byte. Headers larger than `max_header`
/// bytes are refused (they would be decoded whole too).
pub fn walk(
    file: &File,
    path: &Path,
    what: &str,
    chunk: std::ops::Range<u64>,
    max_header: u64,
    mut page: impl FnMut(usize, &PageHeader) -> Result<()>,
) -> Result<()> {
    let corrupt = |at: u64, why: &str| {
        Error::file(path, format!("corrupt Parquet file: {what}: page header at byte {at}: {why}"))
    };
    let mut buf = Vec::new();
    let (mut at, mut n) = (chunk.start, 0usize);
    while at < chunk.end {
        let mut want = FIRST_READ;
        let header = loop {
            let len = want.min(chunk.end - at);
            buf.resize(len as usize, 0);
            file.read_exact_at(&mut buf, at).map_err(|e| super::positional::read_error(path, e, at, buf.len()))?;
            match parse(&buf) {
                Ok(h) => break h,
                Err(Short::Bad(why)) => return Err(corrupt(at, why)),
                Err(Short::Need(need)) if (need as u64) > chunk.end - at => {
                    return Err(corrupt(at, "it runs past the end of its column chunk"))
                }
                Err(Short::Need(need)) if (need as u64) > max_header => {
                    return Err(Error::file(
                        path,
                        format!("{what}: the page header at byte {at} takes more than {max_header} bytes"),
                    ))
                }
                Err(Short::Need(need)) => want = (need as u64).max(want * 4).min(max_header),
            }
        };
        page(n, &header)?;
        let next = at.checked_add(header.header_len).and_then(|a| a.checked_add(header.compressed));
        at = next.filter(|&e| e <= chunk.end).ok_or_else(|| {
            corrupt(at, &format!("its page of {} bytes runs past the end of its column chunk", header.compressed))
        })?;
        n += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn i32_field(delta: u8, v: i32, out: &mut Vec<u8>) {
        out.push(delta << 4 | 5);
        varint(((v << 1) ^ (v >> 31)) as u32 as u64, out);
    }

    #[test]
    fn headers_parse_skipping_fields_they_do_not_need() {
        let mut h = Vec::new();
        i32_field(1, 0, &mut h); // type: data page
        i32_field(1, 1 << 28, &mut h); // uncompressed
        i32_field(1, 300, &mut h); // compressed
        i32_field(1, -5, &mut h); // crc
                                  // data_page_header: a struct with an i32, a binary in a nested struct, a list.
        h.push(1 << 4 | 12);
        i32_field(1, 7, &mut h);
        h.push(1 << 4 | 12);
        h.push(1 << 4 | 8);
        varint(3, &mut h);
        h.extend(b"abc");
        h.push(0);
        h.push(1 << 4 | 9);
        h.push(2 << 4 | 5);
        varint(2, &mut h);
        varint(4, &mut h);
        h.push(1 << 4 | 1); // a boolean field: no payload
        h.push(0);
        h.push(0);
        let parsed = parse(&h).unwrap();
        assert_eq!(parsed, PageHeader { kind: 0, uncompressed: 1 << 28, compressed: 300, header_len: h.len() as u64 });
        // Every cut is "need more", never a wrong header.
        for cut in 0..h.len() {
            assert!(matches!(parse(&h[..cut]), Err(Short::Need(n)) if n > cut), "cut at {cut}");
        }
        // A binary claiming more bytes than there are, an unknown type, a negative size.
        let mut long = Vec::new();
        i32_field(1, 0, &mut long);
        long.push(4 << 4 | 8);
        varint(1 << 40, &mut long);
        assert!(matches!(parse(&long), Err(Short::Need(n)) if n > 1 << 39));
        assert_eq!(parse(&[1 << 4 | 14]), Err(Short::Bad("unknown field type")));
        let mut neg = Vec::new();
        i32_field(1, 0, &mut neg);
        i32_field(1, -1, &mut neg);
        i32_field(1, 3, &mut neg);
        neg.push(0);
        assert_eq!(parse(&neg), Err(Short::Bad("a size is missing or negative")));
    }
}
