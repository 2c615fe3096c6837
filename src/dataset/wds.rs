//! WebDataset shards: POSIX tar files (`.tar`) whose members are grouped into samples by
//! key, as `webdataset.TarWriter` writes them: `000017.jpg`, `000017.cls`, `000017.json`
//! are the fields `jpg`, `cls` and `json` of sample `000017`. A member's key is its path up
//! to the first `.` of its file name, its field the rest (`a/b.seg.png`: key `a/b`, field
//! `seg.png`). Every field is variable-length bytes; decoding (JPEG, JSON, …) stays with
//! the user.
//!
//! The tar headers are walked once at open (ustar, GNU long names and pax `path` records;
//! directories and global pax headers are skipped) into an index of where each value lies,
//! so reads take only the bytes of the rows asked for, straight from the shard: nothing is
//! extracted. The members of a sample must be adjacent; every sample must have the fields
//! of the first one. A member that is not a regular file, a name without an extension, a
//! key seen again apart from its sample, a header whose checksum is wrong and a member cut
//! short by the end of the file are errors naming the file, the member and the byte. So is
//! a shard without the end-of-archive marker (two zero blocks), which every writer puts
//! there: one cut exactly between two members reads like a shorter shard otherwise. After
//! the marker only zeros may follow (the writers' padding to a record).

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::positional::{read_error, read_grouped, read_span, Positional};
use super::rows::RowChunk;
use super::schema::{Field, FieldKind};
use crate::error::{Error, Result};

/// A tar block.
const BLOCK: u64 = 512;
/// Headers are read in windows of this size (small members' headers come several a read).
const WINDOW: u64 = 64 << 10;

/// Where every value of a shard lies.
#[derive(Debug)]
pub struct Index {
    fields: Vec<Field>,
    /// `spans[row * fields + field]`: offset and length of the member's data.
    spans: Vec<(u64, u64)>,
    /// Per field, the bytes of all its values.
    value_bytes: Vec<u64>,
}

impl Index {
    fn rows(&self) -> u64 {
        (self.spans.len() / self.fields.len().max(1)) as u64
    }
}

/// The index of one shard, built by the first reader opened on it (see
/// [`super::arrow::LayoutCache`]).
pub type IndexCache = std::sync::OnceLock<Arc<Index>>;

/// Reads a shard's index: sample count, fields and the bytes of each field's values.
pub fn scan(path: &Path) -> Result<(u64, Vec<Field>, Vec<u64>)> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let index = read_index(&file, path)?;
    Ok((index.rows(), index.fields, index.value_bytes))
}

/// Headers read through a window of the file.
struct Headers<'a> {
    file: &'a File,
    path: &'a Path,
    len: u64,
    window: Vec<u8>,
    start: u64,
}

impl Headers<'_> {
    /// The `n` bytes at `at` (inside the file).
    fn bytes(&mut self, at: u64, n: u64) -> Result<&[u8]> {
        if at < self.start || at + n > self.start + self.window.len() as u64 {
            let len = WINDOW.max(n).min(self.len - at) as usize;
            self.window.resize(len, 0);
            self.file.read_exact_at(&mut self.window, at).map_err(|e| read_error(self.path, e, at, len))?;
            self.start = at;
        }
        let from = (at - self.start) as usize;
        Ok(&self.window[from..from + n as usize])
    }
}

/// A NUL-terminated (or full) text field of a header.
fn text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// An octal number of a header (or, with the high bit of the first byte set, GNU's
/// big-endian binary form for large sizes).
fn number(b: &[u8]) -> Option<u64> {
    if b.first().is_some_and(|&c| c & 0x80 != 0) {
        return b[1..].iter().try_fold(0u64, |n, &c| n.checked_mul(256)?.checked_add(u64::from(c)));
    }
    let s = text(b);
    let s = s.trim_matches(|c: char| c == ' ' || c == '\0');
    if s.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(s, 8).ok()
}

/// The `path` record of a pax extended header (`"<len> path=<name>\n"` records).
fn pax_path(data: &[u8]) -> Option<String> {
    let mut rest = data;
    while !rest.is_empty() {
        let space = rest.iter().position(|&c| c == b' ')?;
        let len: usize = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
        let record = rest.get(space + 1..len)?;
        if let Some(value) = record.strip_prefix(b"path=") {
            return Some(String::from_utf8_lossy(value.strip_suffix(b"\n").unwrap_or(value)).into_owned());
        }
        rest = &rest[len..];
    }
    None
}

/// Walks the headers of a shard and groups its members into samples.
fn read_index(file: &File, path: &Path) -> Result<Index> {
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let corrupt = |at: u64, why: String| Error::file(path, format!("corrupt tar file: {why} (header at byte {at})"));
    let mut headers = Headers { file, path, len, window: Vec::new(), start: 0 };
    // (name, data offset, size) of each regular member, in order.
    let mut members: Vec<(String, u64, u64)> = Vec::new();
    let mut long_name: Option<String> = None;
    let mut at = 0u64;
    while at < len {
        if len - at < BLOCK {
            return Err(Error::file(path, format!("truncated: a tar header at byte {at} is cut short")));
        }
        let h = headers.bytes(at, BLOCK)?.to_vec();
        if h.iter().all(|&c| c == 0) {
            end_of_archive(&mut headers, at)?;
            return group(path, members);
        }
        let stored = number(&h[148..156]);
        let sum: u64 =
            h.iter().enumerate().map(|(i, &c)| if (148..156).contains(&i) { 32 } else { u64::from(c) }).sum();
        if stored != Some(sum) {
            return Err(if at == 0 {
                Error::file(path, "not a tar file (the first header's checksum does not match)")
            } else {
                corrupt(at, "checksum mismatch".into())
            });
        }
        let size = number(&h[124..136]).ok_or_else(|| corrupt(at, "bad size".into()))?;
        let mut name = text(&h[0..100]);
        if &h[257..262] == b"ustar" {
            let prefix = text(&h[345..500]);
            if !prefix.is_empty() {
                name = format!("{prefix}/{name}");
            }
        }
        let data = at + BLOCK;
        if size > len - data {
            return Err(Error::file(
                path,
                format!("truncated: member '{name}' ({size} bytes at byte {data}) lies past the end of the file ({len} bytes)"),
            ));
        }
        match h[156] {
            b'0' | 0 | b'7' => members.push((long_name.take().unwrap_or(name), data, size)),
            b'L' => long_name = Some(text(headers.bytes(data, size)?)),
            b'x' => long_name = pax_path(headers.bytes(data, size)?).or(long_name),
            b'g' | b'5' => {}
            t => {
                return Err(Error::file(
                    path,
                    format!(
                        "member '{name}' is a tar entry of type '{}' (a link, device or FIFO): a WebDataset shard holds regular files",
                        char::from(t)
                    ),
                ));
            }
        }
        at = data + size.div_ceil(BLOCK) * BLOCK;
    }
    // Writers end an archive with two zero blocks: a shard without them was cut, maybe
    // exactly between two members, where every header before the cut still reads.
    let after = members.last().map_or(String::new(), |(name, _, _)| format!(" after member '{name}'"));
    Err(Error::file(
        path,
        format!(
            "truncated: the shard ends at byte {len}{after} without the end-of-archive marker (two zero blocks): it \
             was cut short"
        ),
    ))
}

/// Checks the end of an archive whose first zero block is at `at`: a second zero block
/// follows, and nothing but zeros after it (GNU tar and Python's `tarfile` pad the archive
/// to a record of 10 KiB; a file cut inside that padding has lost nothing). A zero block
/// where a header belongs with data after it is a damaged header (or archives
/// concatenated, whose later members `tar` itself does not read without `-i`).
fn end_of_archive(headers: &mut Headers<'_>, at: u64) -> Result<()> {
    let len = headers.len;
    if len - at < 2 * BLOCK {
        return Err(Error::file(
            headers.path,
            format!(
                "truncated: the end-of-archive marker at byte {at} is cut short ({} of {} bytes)",
                len - at,
                2 * BLOCK
            ),
        ));
    }
    let mut from = at + BLOCK;
    while from < len {
        let n = WINDOW.min(len - from);
        if let Some(k) = headers.bytes(from, n)?.iter().position(|&c| c != 0) {
            return Err(Error::file(
                headers.path,
                format!(
                    "corrupt tar file: a zero block at byte {at} ends the archive, but data follows at byte {} (a \
                     damaged header, or archives concatenated)",
                    from + k as u64
                ),
            ));
        }
        from += n;
    }
    Ok(())
}

/// Groups members into samples by key; the first sample's fields are every sample's.
fn group(path: &Path, members: Vec<(String, u64, u64)>) -> Result<Index> {
    let split = |name: &str| -> Result<(String, String)> {
        let base = name.rfind('/').map_or(0, |i| i + 1);
        match name[base..].find('.') {
            Some(dot) if dot > 0 => Ok((name[..base + dot].to_string(), name[base + dot + 1..].to_string())),
            _ => Err(Error::file(
                path,
                format!("member '{name}' has no extension: a WebDataset member is <key>.<field>"),
            )),
        }
    };
    // Samples as (key, [(field, offset, size)]).
    let mut samples: Vec<(String, Vec<(String, u64, u64)>)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (name, offset, size) in members {
        let (key, field) = split(&name)?;
        match samples.last_mut() {
            Some((k, values)) if *k == key => {
                if values.iter().any(|(f, _, _)| *f == field) {
                    return Err(Error::file(path, format!("sample '{key}' has two '{field}' members")));
                }
                values.push((field, offset, size));
            }
            _ => {
                if !seen.insert(key.clone()) {
                    return Err(Error::file(
                        path,
                        format!("sample '{key}' appears again after other samples: its members must be adjacent"),
                    ));
                }
                samples.push((key, vec![(field, offset, size)]));
            }
        }
    }
    let mut names: Vec<String> =
        samples.first().map(|(_, v)| v.iter().map(|(f, _, _)| f.clone()).collect()).unwrap_or_default();
    names.sort();
    let fields: Vec<Field> =
        names.iter().map(|n| Field { name: n.clone(), kind: FieldKind::Bytes { utf8: false, elem: None } }).collect();
    let mut spans = Vec::with_capacity(samples.len() * fields.len());
    let mut value_bytes = vec![0u64; fields.len()];
    for (key, values) in &samples {
        let mut got: Vec<&str> = values.iter().map(|(f, _, _)| f.as_str()).collect();
        got.sort_unstable();
        if got != names.iter().map(String::as_str).collect::<Vec<_>>() {
            return Err(Error::file(
                path,
                format!(
                    "sample '{key}' has the fields [{}] where the first sample has [{}]",
                    got.join(", "),
                    names.join(", ")
                ),
            ));
        }
        for (f, name) in names.iter().enumerate() {
            let &(_, offset, size) = values.iter().find(|(n, _, _)| n == name).expect("checked above");
            spans.push((offset, size));
            value_bytes[f] += size;
        }
    }
    Ok(Index { fields, spans, value_bytes })
}

/// Reads rows of one shard: only the bytes of the values asked for.
pub struct WdsReader {
    file: File,
    path: PathBuf,
    index: Arc<Index>,
}

impl WdsReader {
    /// Opens `path` with the index in `cache`, building it if it is empty, checking that
    /// its fields are `expected`.
    pub fn open_cached(path: &Path, expected: &[Field], cache: &IndexCache) -> Result<WdsReader> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let index = match cache.get() {
            Some(index) => index.clone(),
            None => {
                let index = read_index(&file, path)?;
                cache.get_or_init(|| Arc::new(index)).clone()
            }
        };
        if index.fields != expected {
            return Err(Error::file(path, "fields changed since the dataset was scanned"));
        }
        Ok(WdsReader { file, path: path.to_path_buf(), index })
    }
}

impl super::reader::FileReader for WdsReader {
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let all: Vec<usize> = (0..self.index.fields.len()).collect();
        self.read_columns(rows, &all)
    }

    fn read_columns(&mut self, rows: &[u64], columns: &[usize]) -> Result<RowChunk> {
        let (n, fields) = (self.index.rows(), self.index.fields.len());
        if let Some(&last) = rows.last().filter(|&&r| r >= n) {
            return Err(Error::file(&self.path, format!("row {last} is past the end of the file ({n} samples)")));
        }
        // Every value wanted, in file order, then read in grouped reads.
        let mut wanted: Vec<(Range<u64>, usize)> = Vec::with_capacity(rows.len() * columns.len());
        for (k, &r) in rows.iter().enumerate() {
            for (c, &f) in columns.iter().enumerate() {
                let (offset, size) = self.index.spans[r as usize * fields + f];
                wanted.push((offset..offset + size, k * columns.len() + c));
            }
        }
        wanted.sort_by_key(|(r, _)| r.start);
        let ranges: Vec<Range<u64>> = wanted.iter().map(|(r, _)| r.clone()).collect();
        let mut chunk = RowChunk::new(columns.len());
        let places = read_grouped(&mut chunk, &ranges, |g, _| read_span(&self.file, &self.path, g))?;
        let mut locs = vec![(0u32, 0usize, 0usize); rows.len() * columns.len()];
        for (&(_, slot), place) in wanted.iter().zip(places) {
            locs[slot] = place;
        }
        for (b, offset, len) in locs {
            chunk.push_value(b, offset, len);
        }
        Ok(chunk)
    }

    fn value_range(&self, row: u64, field: usize) -> Option<Range<u64>> {
        let fields = self.index.fields.len();
        let &(offset, size) =
            self.index.spans.get(usize::try_from(row).ok()? * fields + field).filter(|_| field < fields)?;
        Some(offset..offset + size)
    }

    fn positional(&self) -> Option<Positional<'_>> {
        Some(Positional { file: &self.file, path: &self.path })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::reader::FileReader;

    /// A ustar header for `name` of `size` bytes and type `kind`, with its checksum.
    fn header(name: &str, size: u64, kind: u8) -> Vec<u8> {
        let mut h = vec![0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000644");
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        let sum: u64 =
            h.iter().enumerate().map(|(i, &c)| if (148..156).contains(&i) { 32 } else { u64::from(c) }).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        h
    }

    fn tar(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut t = Vec::new();
        for (name, data) in members {
            t.extend(header(name, data.len() as u64, b'0'));
            t.extend_from_slice(data);
            t.resize(t.len().div_ceil(512) * 512, 0);
        }
        t.extend([0u8; 1024]);
        t
    }

    #[test]
    fn members_are_grouped_by_key_and_read_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar");
        let big = vec![7u8; 3000];
        std::fs::write(
            &path,
            tar(&[
                ("a/000.jpg", &big),
                ("a/000.cls", b"3"),
                ("a/001.cls", b"14"),
                ("a/001.jpg", b"jpeg!"),
                ("a/002.jpg", b""),
                ("a/002.cls", b"0"),
            ]),
        )
        .unwrap();
        let (rows, fields, bytes) = scan(&path).unwrap();
        assert_eq!(rows, 3);
        assert_eq!(fields.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["cls", "jpg"]);
        assert_eq!(bytes, vec![4, 3005]);
        let mut r = WdsReader::open_cached(&path, &fields, &IndexCache::new()).unwrap();
        let chunk = r.read_rows(&[0, 1, 2]).unwrap();
        assert_eq!((chunk.value(0, 0), chunk.value(0, 1)), (&b"3"[..], &big[..]));
        assert_eq!((chunk.value(1, 0), chunk.value(1, 1)), (&b"14"[..], &b"jpeg!"[..]));
        assert_eq!((chunk.value(2, 0), chunk.value(2, 1)), (&b"0"[..], &b""[..]));
        // Only the column asked for: not the 3000-byte image.
        let chunk = r.read_columns(&[0, 2], &[0]).unwrap();
        assert_eq!((chunk.value(0, 0), chunk.value(1, 0)), (&b"3"[..], &b"0"[..]));
        assert!(chunk.bytes_read() < 3000, "{}", chunk.bytes_read());
        let v = r.value_range(1, 1).unwrap();
        assert_eq!(std::fs::read(&path).unwrap()[v.start as usize..v.end as usize], *b"jpeg!");
    }

    #[test]
    fn damaged_or_irregular_shards_are_errors_naming_the_member() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar");
        let fails = |bytes: Vec<u8>, needle: &str| {
            std::fs::write(&path, bytes).unwrap();
            let e = scan(&path).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("s.tar"), "{e}");
        };
        let good = tar(&[("0.cls", b"1"), ("0.txt", b"a"), ("1.cls", b"2"), ("1.txt", b"b")]);
        fails(good[..good.len() - 1024 - 600].to_vec(), "truncated");
        let mut flipped = good.clone();
        flipped[512 * 2 + 3] ^= 1;
        fails(flipped, "checksum mismatch (header at byte 1024)");
        fails(b"not a tar file at all".repeat(40), "not a tar file");
        fails(tar(&[("0.cls", b"1"), ("1.cls", b"2"), ("0.txt", b"a")]), "sample '0' appears again");
        fails(
            tar(&[("0.cls", b"1"), ("0.txt", b"a"), ("1.cls", b"2")]),
            "sample '1' has the fields [cls] where the first sample has [cls, txt]",
        );
        fails(tar(&[("README", b"x")]), "member 'README' has no extension");
        // Cut exactly between two members, inside a member's padding, inside the marker.
        let at_member = good.len() - 1024 - 2 * 1024;
        fails(
            good[..at_member].to_vec(),
            "truncated: the shard ends at byte 2048 after member '0.txt' without the end-of-archive marker",
        );
        fails(
            good[..good.len() - 1024 - 100].to_vec(),
            "ends at byte 3996 after member '1.txt' without the end-of-archive marker",
        );
        fails(
            good[..good.len() - 400].to_vec(),
            "truncated: the end-of-archive marker at byte 4096 is cut short (624 of 1024 bytes)",
        );
        fails(good[..good.len() - 600].to_vec(), "truncated: a tar header at byte 4096 is cut short");
        fails(Vec::new(), "truncated: the shard ends at byte 0 without the end-of-archive marker");
        // A zeroed header (or a second archive) before more members.
        let mut zeroed = good.clone();
        zeroed[1024..1536].fill(0);
        fails(zeroed, "a zero block at byte 1024 ends the archive, but data follows at byte 1536");
        let mut link = tar(&[("0.cls", b"1")]);
        link.splice(0..512, header("0.lnk", 0, b'2'));
        fails(link, "a tar entry of type '2'");
    }

    #[test]
    fn the_padding_after_the_end_of_archive_marker_may_be_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar");
        let mut t = tar(&[("0.cls", b"1"), ("1.cls", b"2")]);
        // Padded to a 10 KiB record, as GNU tar and Python's tarfile write it.
        t.resize(10240, 0);
        for cut in [t.len(), 2048 + 1024, 2048 + 1024 + 1] {
            std::fs::write(&path, &t[..cut]).unwrap();
            assert_eq!(scan(&path).unwrap().0, 2, "cut at {cut}");
        }
    }

    #[test]
    fn long_names_from_gnu_and_pax_headers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar");
        let long = format!("{}/000.cls", "d".repeat(120));
        let mut t = Vec::new();
        t.extend(header("././@LongLink", long.len() as u64 + 1, b'L'));
        t.extend(long.as_bytes());
        t.push(0);
        t.resize(t.len().div_ceil(512) * 512, 0);
        t.extend(header("short.cls", 1, b'0'));
        t.push(b'5');
        t.resize(t.len().div_ceil(512) * 512, 0);
        let record = format!("path={}/001.cls\n", "e".repeat(120));
        let record = format!("{} {record}", record.len() + 4);
        t.extend(header("PaxHeader", record.len() as u64, b'x'));
        t.extend(record.as_bytes());
        t.resize(t.len().div_ceil(512) * 512, 0);
        t.extend(header("short2.cls", 1, b'0'));
        t.push(b'6');
        t.resize(t.len().div_ceil(512) * 512, 0);
        t.extend([0u8; 1024]);
        std::fs::write(&path, &t).unwrap();
        let index = read_index(&File::open(&path).unwrap(), &path).unwrap();
        assert_eq!(index.rows(), 2, "two samples, keyed by their long names");
    }
}
