//! The feeder's protocol: length-prefixed frames over one TCP connection per reader.
//!
//! A client opens with a [`Hello`] (the protocol's magic, the server's token, the dataset's
//! name, whether it wants the file headers); the server answers with the dataset's file
//! headers (where wanted; else the [`Share`] that lets a client on its host map its
//! memory, or nothing) or a refusal. Then, as often as the client likes, a [`Request`]
//! (one file's rows, sorted) and the server's [`Rows`] (their values, every field,
//! row-major), or [`Mapped`] (where those values lie in the server's shared memory, for a
//! client that mapped it), or [`via_ucx`] (the answer follows as a UCX message, for a
//! client that took the server's UCX offer), or an error message. Pure: encoding and
//! decoding only, no I/O but the frame helpers' reader and writer.

use std::io::{Read, Write};

/// What went wrong on the feeder's wire: a frame that does not decode, the other side's
/// error answer, or a connection that failed before an answer came. Each shows its
/// message as it is (no prefix): the callers add the feeder or the file, and a server's
/// refusal travels to the client as that text ([`answer`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A frame that is not the message it should be: cut short, bytes past its end, a
    /// count that disagrees with the frame, a bad flag or string.
    #[error("{0}")]
    Malformed(String),
    /// An error answer ([`answer`]): why a feeder refused a hello or could not serve a
    /// request, as it tells the client.
    #[error("{0}")]
    Refused(String),
    /// The connection failed before a whole answer came: closed, reset, silent past the
    /// timeout, or a UCX transfer that failed.
    #[error("{0}")]
    Connection(String),
}

/// A [`WireError::Malformed`] saying `why`.
fn malformed(why: impl Into<String>) -> WireError {
    WireError::Malformed(why.into())
}

/// First bytes of a hello: the protocol and its version.
pub const MAGIC: &[u8; 8] = b"MFEED\x004\n";

/// The most bytes a hello may hold: what a stranger can make the feeder allocate. Also
/// the bound of the other small frames: a reader's welcome, a UCX worker address, an
/// error message.
pub const MAX_HELLO: u64 = 64 << 10;

/// The most bytes a welcome holding the file headers may hold (JSON, a few hundred bytes
/// a file): what whoever answers at a feeder's address can make a client allocate before
/// it knows the dataset.
pub const MAX_WELCOME: u64 = 256 << 20;

/// The most bytes a request for `max_rows` rows of one file holds: no frame from a client
/// is read past the rows of the dataset's largest file.
pub fn request_bound(max_rows: u64) -> u64 {
    13u64.saturating_add(max_rows.saturating_mul(8))
}

/// The most bytes an answer to a request for `rows` rows of `fields` fields holds, where
/// their values hold at most `value_bytes`: the values with their lengths, or their
/// places ([`Mapped`]), or a message. No answer is read past what its request asked for.
pub fn answer_bound(rows: u64, fields: u64, value_bytes: u64) -> u64 {
    let values = rows.saturating_mul(fields);
    let with_values = 13u64.saturating_add(values.saturating_mul(8)).saturating_add(value_bytes);
    let with_places = 25u64.saturating_add(values.saturating_mul(16));
    with_values.max(with_places).max(MAX_HELLO)
}

/// What a client says first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub token: String,
    pub name: String,
    /// Whether the answer carries the file headers: one rank of a job asks for them
    /// when it attaches; its readers' connections do not.
    pub headers: bool,
    /// Whether the client can take answers over UCX: then, after the welcome, the server
    /// sends its UCX worker's address (empty: not offered) and the client its own (empty:
    /// declined), each in a frame of its own.
    pub ucx: bool,
}

/// A client's request for rows of one file: local row indices, sorted ascending, unique.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub file: u32,
    pub rows: Vec<u64>,
    /// Whether the client mapped the server's shared memory ([`Share`]): then the
    /// server may answer with where the values lie ([`Mapped`]) instead of the values.
    pub mapped: bool,
}

/// How a client on the server's host reaches its shared memory (the answer to a reader's
/// hello): the server's process, and one of its memory regions that holds `nonce`, which
/// the client reads to prove that it sees the server's memory (same host, same user, same
/// PID namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Share {
    pub pid: u32,
    pub fd: i32,
    pub nonce: [u8; 16],
}

/// The first byte of an answer that says where the values lie instead of holding them.
pub const MAPPED: u8 = 3;

/// The first byte of a frame that says the answer follows over UCX: then its length and
/// tag (u64 each).
pub const VIA_UCX: u8 = 4;

/// The frame announcing an answer of `len` bytes sent over UCX tagged `tag`.
pub fn via_ucx(len: usize, tag: u64) -> Vec<u8> {
    [&[VIA_UCX][..], &(len as u64).to_le_bytes(), &tag.to_le_bytes()].concat()
}

/// Reads a [`via_ucx`] frame: the answer's length (at most `max`) and tag.
pub fn parse_via_ucx(frame: &[u8], max: u64) -> Result<(usize, u64), WireError> {
    let mut at = Cursor(frame.strip_prefix(&[VIA_UCX]).ok_or_else(|| malformed("not a UCX announcement"))?);
    let (len, tag) = (at.u64()?, at.u64()?);
    at.end()?;
    if len > max {
        return Err(malformed(format!("an answer of {len} bytes announced, at most {max} for the rows asked for")));
    }
    Ok((len as usize, tag))
}

/// An answer for a client that mapped the server's memory: the rows' values, every field,
/// row-major, lie at `places` (offset, length) of the server's region `fd`, of `len`
/// bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapped {
    pub fields: u32,
    pub fd: i32,
    pub len: u64,
    pub places: Vec<(u64, u64)>,
}

/// Where the values of an answer holding rows lie: `lens[row * fields + field]` bytes
/// each, one after another from byte `values_at` of the payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rows {
    pub fields: u32,
    pub lens: Vec<u64>,
    pub values_at: usize,
}

/// Writes one frame: its length (u64, little-endian), then `payload`.
pub fn write_frame(w: &mut impl Write, payload: &[u8]) -> std::io::Result<()> {
    w.write_all(&(payload.len() as u64).to_le_bytes())?;
    w.write_all(payload)?;
    w.flush()
}

/// Reads one frame of at most `max` bytes; `Ok(None)` where the peer closed the connection
/// before a frame began.
pub fn read_frame(r: &mut impl Read, max: u64) -> std::io::Result<Option<Vec<u8>>> {
    match read_frame_len(r)? {
        Some(len) => read_payload(r, len, max).map(Some),
        None => Ok(None),
    }
}

/// Reads a frame's length, its first 8 bytes; `Ok(None)` where the peer closed the
/// connection before a frame began.
pub fn read_frame_len(r: &mut impl Read) -> std::io::Result<Option<u64>> {
    let mut len = [0u8; 8];
    match r.read_exact(&mut len) {
        Ok(()) => Ok(Some(u64::from_le_bytes(len))),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads the `len` bytes of a frame past its length, refusing (an error of kind
/// `InvalidData`, before anything is allocated) a length past `max`.
pub fn read_payload(r: &mut impl Read, len: u64, max: u64) -> std::io::Result<Vec<u8>> {
    if len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes (at most {max} here)"),
        ));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok(payload)
}

/// The first byte of a frame the feeder sends, every half second, while the answer to a
/// request waits for its file to be read: then the bytes this feeder rank has read from
/// storage so far (u64). A client waits on only while that number grows.
pub const STILL_READING: u8 = 2;

/// A [`STILL_READING`] frame reporting `progress` bytes read.
pub fn still_reading(progress: u64) -> Vec<u8> {
    [&[STILL_READING][..], &progress.to_le_bytes()].concat()
}

/// Reads a [`still_reading`] frame: the bytes read it reports.
pub fn parse_still_reading(frame: &[u8]) -> Result<u64, WireError> {
    let mut at = Cursor(frame.strip_prefix(&[STILL_READING]).ok_or_else(|| malformed("not a keep-alive"))?);
    let progress = at.u64()?;
    at.end()?;
    Ok(progress)
}

/// An answer: `Ok` with its payload, or the error's message (which the other side reads
/// as a [`WireError::Refused`]).
pub fn answer(result: Result<Vec<u8>, WireError>) -> Vec<u8> {
    match result {
        Ok(payload) => [&[0u8][..], &payload].concat(),
        Err(e) => [&[1u8][..], e.to_string().as_bytes()].concat(),
    }
}

/// Reads an [`answer`] (or a [`Mapped`] one): its payload (the frame past its first
/// byte), or the message.
pub fn parse_answer(frame: &[u8]) -> Result<&[u8], WireError> {
    match frame.split_first() {
        Some((&tag, payload)) if tag == 0 || tag == MAPPED => Ok(payload),
        Some((1, message)) => Err(WireError::Refused(String::from_utf8_lossy(message).into_owned())),
        _ => Err(malformed("a malformed answer")),
    }
}

/// An answer holding rows, built in one buffer (each value copied once): `values` are
/// the rows' values, row-major, each row `fields` of them.
pub fn rows_answer(fields: u32, values: &[&[u8]]) -> Vec<u8> {
    let bytes: usize = values.iter().map(|v| v.len()).sum();
    let mut out = Vec::with_capacity(13 + 8 * values.len() + bytes);
    out.push(0);
    out.extend_from_slice(&fields.to_le_bytes());
    out.extend_from_slice(&(values.len() as u64).to_le_bytes());
    values.iter().for_each(|v| out.extend_from_slice(&(v.len() as u64).to_le_bytes()));
    values.iter().for_each(|v| out.extend_from_slice(v));
    out
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        put_str(&mut out, &self.token);
        put_str(&mut out, &self.name);
        out.push(u8::from(self.headers));
        out.push(u8::from(self.ucx));
        out
    }

    pub fn decode(frame: &[u8]) -> Result<Hello, WireError> {
        let rest = frame
            .strip_prefix(MAGIC.as_slice())
            .ok_or_else(|| malformed("not a meshfeed client (or another protocol version)"))?;
        let mut at = Cursor(rest);
        let (token, name) = (at.string()?, at.string()?);
        let (headers, ucx) = (at.flag()?, at.flag()?);
        let hello = Hello { token, name, headers, ucx };
        at.end()?;
        Ok(hello)
    }
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(13 + 8 * self.rows.len());
        out.extend_from_slice(&self.file.to_le_bytes());
        out.extend_from_slice(&(self.rows.len() as u64).to_le_bytes());
        self.rows.iter().for_each(|r| out.extend_from_slice(&r.to_le_bytes()));
        out.push(u8::from(self.mapped));
        out
    }

    pub fn decode(frame: &[u8]) -> Result<Request, WireError> {
        let mut at = Cursor(frame);
        let file = at.u32()?;
        let n = at.u64()?;
        if n > at.0.len() as u64 / 8 {
            return Err(malformed(format!("a request for {n} rows in {} bytes", frame.len())));
        }
        let rows = (0..n).map(|_| at.u64()).collect::<Result<Vec<_>, _>>()?;
        let mapped = at.flag()?;
        at.end()?;
        if rows.windows(2).any(|w| w[0] >= w[1]) {
            return Err(malformed("rows not sorted ascending and unique"));
        }
        Ok(Request { file, rows, mapped })
    }
}

impl Share {
    pub fn encode(&self) -> Vec<u8> {
        [&self.pid.to_le_bytes()[..], &self.fd.to_le_bytes(), &self.nonce].concat()
    }

    pub fn decode(payload: &[u8]) -> Result<Share, WireError> {
        let mut at = Cursor(payload);
        let (pid, fd) = (at.u32()?, at.u32()? as i32);
        let nonce = at.take(16)?.try_into().expect("16 bytes");
        at.end()?;
        Ok(Share { pid, fd, nonce })
    }
}

impl Mapped {
    /// The whole answer frame, its first byte [`MAPPED`].
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(25 + 16 * self.places.len());
        out.push(MAPPED);
        out.extend_from_slice(&self.fields.to_le_bytes());
        out.extend_from_slice(&self.fd.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&(self.places.len() as u64).to_le_bytes());
        for (offset, len) in &self.places {
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
        out
    }

    /// Reads a mapped answer's payload (past its first byte), checking that it places
    /// `rows` rows and that every place lies inside the region.
    pub fn decode(payload: &[u8], rows: usize) -> Result<Mapped, WireError> {
        let mut at = Cursor(payload);
        let (fields, fd, len) = (at.u32()?, at.u32()? as i32, at.u64()?);
        let n = at.u64()?;
        if n != rows as u64 * u64::from(fields) {
            return Err(malformed(format!("{n} values for {rows} rows of {fields} fields")));
        }
        if n > at.0.len() as u64 / 16 {
            return Err(malformed(format!("{n} places in {} bytes", payload.len())));
        }
        let places = (0..n).map(|_| Ok((at.u64()?, at.u64()?))).collect::<Result<Vec<_>, WireError>>()?;
        at.end()?;
        if let Some((o, l)) = places.iter().find(|(o, l)| o.checked_add(*l).is_none_or(|end| end > len)) {
            return Err(malformed(format!("a value of {l} bytes at {o}, past the region's {len} bytes")));
        }
        Ok(Mapped { fields, fd, len, places })
    }
}

impl Rows {
    /// Reads the head of a [`rows_answer`]'s payload, checking that it holds `rows` rows
    /// and that the lengths add up to the rest of it.
    pub fn decode(payload: &[u8], rows: usize) -> Result<Rows, WireError> {
        let mut at = Cursor(payload);
        let fields = at.u32()?;
        let n = at.u64()?;
        if n != rows as u64 * u64::from(fields) {
            return Err(malformed(format!("{n} values for {rows} rows of {fields} fields")));
        }
        if n > at.0.len() as u64 / 8 {
            return Err(malformed(format!("{n} values in {} bytes", payload.len())));
        }
        let lens = (0..n).map(|_| at.u64()).collect::<Result<Vec<_>, _>>()?;
        let total =
            lens.iter().try_fold(0u64, |a, &l| a.checked_add(l)).ok_or_else(|| malformed("value lengths overflow"))?;
        if total != at.0.len() as u64 {
            return Err(malformed(format!("values of {total} bytes in {} bytes", at.0.len())));
        }
        Ok(Rows { fields, lens, values_at: payload.len() - at.0.len() })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Reads little-endian integers and strings off the front of a frame.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], WireError> {
        if self.0.len() < n {
            return Err(malformed(format!("a frame cut short ({} bytes left, {n} wanted)", self.0.len())));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// A byte that is 0 (false) or 1 (true).
    fn flag(&mut self) -> Result<bool, WireError> {
        match self.take(1)? {
            [0] => Ok(false),
            [1] => Ok(true),
            [b] => Err(malformed(format!("a flag byte of {b} (0 or 1)"))),
            _ => unreachable!("take(1) is one byte"),
        }
    }

    fn string(&mut self) -> Result<String, WireError> {
        let n = self.u64()?;
        let n = usize::try_from(n).map_err(|_| malformed(format!("a string of {n} bytes")))?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| malformed("a string that is not UTF-8"))
    }

    fn end(&self) -> Result<(), WireError> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(malformed(format!("{n} bytes past the end of a message"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        for (headers, ucx) in [(false, false), (true, false), (false, true)] {
            let hello = Hello { token: "0123abcd".into(), name: "imagenet".into(), headers, ucx };
            assert_eq!(Hello::decode(&hello.encode()).unwrap(), hello);
        }
        assert_eq!(parse_via_ucx(&via_ucx(1 << 20, 42), 1 << 20), Ok((1 << 20, 42)));
        assert_eq!(parse_still_reading(&still_reading(1 << 33)), Ok(1 << 33));
        for mapped in [false, true] {
            let request = Request { file: 3, rows: vec![0, 7, 1 << 40], mapped };
            assert_eq!(Request::decode(&request.encode()).unwrap(), request);
        }
        let share = Share { pid: 4242, fd: 17, nonce: *b"0123456789abcdef" };
        assert_eq!(Share::decode(&share.encode()).unwrap(), share);
        let mapped = Mapped { fields: 2, fd: 9, len: 100, places: vec![(0, 3), (3, 0), (90, 10), (50, 1)] };
        let frame = mapped.encode();
        assert_eq!(frame[0], MAPPED);
        assert_eq!(Mapped::decode(parse_answer(&frame).unwrap(), 2).unwrap(), mapped);
        let rows_frame = rows_answer(2, &[b"abc", b"", b"d", b"ef"]);
        let payload = parse_answer(&rows_frame).unwrap();
        let rows = Rows::decode(payload, 2).unwrap();
        assert_eq!((rows.fields, rows.lens.as_slice()), (2, [3, 0, 1, 2].as_slice()));
        assert_eq!(&payload[rows.values_at..], b"abcdef");
        assert_eq!(parse_answer(&answer(Ok(b"x".to_vec()))), Ok(b"x".as_slice()));
        let refusal = WireError::Refused("no".into());
        assert_eq!(parse_answer(&answer(Err(refusal.clone()))), Err(refusal));
        assert_eq!(parse_answer(&[]), Err(WireError::Malformed("a malformed answer".into())));
        let mut wire = Vec::new();
        write_frame(&mut wire, b"frame").unwrap();
        let mut r = wire.as_slice();
        assert_eq!(read_frame(&mut r, MAX_HELLO).unwrap().as_deref(), Some(b"frame".as_slice()));
        assert_eq!(read_frame(&mut r, MAX_HELLO).unwrap(), None);
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        assert!(Hello::decode(b"GET / HTTP/1.1\r\n").unwrap_err().to_string().contains("not a meshfeed client"));
        let mut hello = Hello { token: "t".into(), name: "n".into(), headers: true, ucx: false }.encode();
        for cut in 0..hello.len() {
            assert!(Hello::decode(&hello[..cut]).is_err(), "cut at {cut}");
        }
        *hello.last_mut().unwrap() = 2;
        assert!(Hello::decode(&hello).unwrap_err().to_string().contains("0 or 1"));
        let unsorted = Request { file: 0, rows: vec![5, 5], mapped: false }.encode();
        assert_eq!(Request::decode(&unsorted).unwrap_err().to_string(), "rows not sorted ascending and unique");
        // A count of rows the frame cannot hold is refused before anything is allocated.
        let mut huge = 0u32.to_le_bytes().to_vec();
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(Request::decode(&huge).unwrap_err().to_string().contains("rows in"));
        let rows_frame = rows_answer(1, &[b"ab", b"cd"]);
        let rows = &rows_frame[1..];
        assert!(Rows::decode(rows, 3).unwrap_err().to_string().contains("2 values for 3 rows"));
        assert!(Rows::decode(&rows[..rows.len() - 1], 2).unwrap_err().to_string().contains("values of 4 bytes in 3"));
        // A mapped answer never places a value outside the region, however it overflows.
        let bad = |places| Mapped { fields: 1, fd: 3, len: 10, places }.encode();
        let err = Mapped::decode(&bad(vec![(8, 3)])[1..], 1).unwrap_err();
        assert_eq!(err.to_string(), "a value of 3 bytes at 8, past the region's 10 bytes");
        assert!(Mapped::decode(&bad(vec![(u64::MAX, 2)])[1..], 1).unwrap_err().to_string().contains("past the region"));
        assert!(Mapped::decode(&bad(vec![(0, 1)])[1..], 2).unwrap_err().to_string().contains("1 values for 2 rows"));
        assert!(Share::decode(&[0; 23]).unwrap_err().to_string().contains("cut short"));
        assert!(parse_via_ucx(&via_ucx(1, 2)[..16], 1).unwrap_err().to_string().contains("cut short"));
        // An announced answer is no longer than the rows asked for can be.
        let err = parse_via_ucx(&via_ucx(1 << 36, 2), 1 << 20).unwrap_err();
        assert!(matches!(err, WireError::Malformed(_)), "{err:?}");
        assert_eq!(err.to_string(), "an answer of 68719476736 bytes announced, at most 1048576 for the rows asked for");
        assert!(parse_still_reading(&[STILL_READING]).unwrap_err().to_string().contains("cut short"));
        assert!(parse_still_reading(&[STILL_READING; 10]).unwrap_err().to_string().contains("past the end"));
        let mut wire = 10u64.to_le_bytes().to_vec();
        wire.extend_from_slice(b"short");
        assert!(read_frame(&mut wire.as_slice(), MAX_HELLO).is_err());
        // A stranger's huge length is refused before anything is allocated.
        let err = read_frame(&mut (MAX_HELLO + 1).to_le_bytes().as_slice(), MAX_HELLO).unwrap_err();
        assert!(err.to_string().contains("a frame of 65537 bytes"), "{err}");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    }

    #[test]
    fn frames_are_bounded_by_what_was_asked() {
        // A request: its file, its count, 8 bytes a row, its flag.
        let request = Request { file: 1, rows: (0..1000).collect(), mapped: true }.encode();
        assert_eq!(request.len() as u64, request_bound(1000));
        assert_eq!(request_bound(u64::MAX), u64::MAX, "saturates, never wraps");
        // An answer: the values with their lengths, or their places, or a message.
        let values: Vec<&[u8]> = vec![b"abcd"; 6];
        let answer = rows_answer(2, &values);
        assert_eq!(answer.len() as u64, 13 + 6 * 8 + 24);
        assert!(answer.len() as u64 <= answer_bound(3, 2, 24));
        let places = Mapped { fields: 2, fd: 3, len: 1 << 30, places: vec![(0, 4); 6000] }.encode();
        assert_eq!(places.len() as u64, answer_bound(3000, 2, 0));
        assert_eq!(answer_bound(1, 1, 1), MAX_HELLO, "a message fits any answer");
        assert_eq!(answer_bound(u64::MAX, 3, u64::MAX), u64::MAX);
    }
}
