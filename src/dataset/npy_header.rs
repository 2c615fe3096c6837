//! Parser for the preamble of the NumPy `.npy` file format, versions 1.0, 2.0
//! and 3.0.
//!
//! Layout of the preamble:
//!
//! | bytes          | content                                                  |
//! |----------------|----------------------------------------------------------|
//! | 6              | magic `b"\x93NUMPY"`                                     |
//! | 1 + 1          | major, minor version                                     |
//! | 2 or 4         | header length `HEADER_LEN`: `u16` LE for 1.x, `u32` LE for 2.x/3.x |
//! | `HEADER_LEN`   | header text: a Python dict literal, padded with spaces and ending with `'\n'` |
//!
//! The header text is latin1 for versions 1.0 and 2.0 and UTF-8 for 3.0. It
//! holds the keys `'descr'`, `'fortran_order'` and `'shape'`, e.g.
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (5, 3, 4), }`.
//! The array data starts right after the header text.
//!
//! The input is untrusted: every length read from the file is bound-checked
//! (against [`MAX_HEADER_LEN`] and against the bytes actually supplied) before
//! it is used, and the literal parser limits nesting depth so hostile input
//! cannot exhaust the stack. Nothing here panics on any input.

use std::fmt;

/// Longest header text accepted. NumPy itself writes headers of a few hundred
/// bytes; a larger limit only exists for huge structured dtypes, and a bound is
/// needed so a corrupt length field cannot make the caller read gigabytes.
pub const MAX_HEADER_LEN: usize = 1 << 20;

/// Longest possible preamble (magic + version + 4-byte length + header text).
/// Passing `min(file_len, MAX_PREAMBLE_LEN)` bytes to [`parse_preamble`] is
/// always enough: a 2.x/3.x header of exactly [`MAX_HEADER_LEN`] bytes ends at
/// `12 + MAX_HEADER_LEN`, two bytes past `10 + MAX_HEADER_LEN`.
pub const MAX_PREAMBLE_LEN: usize = 12 + MAX_HEADER_LEN;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Smallest possible preamble (version 1.0 with an empty header); reported as
/// the needed size when the input ends before the version and length fields.
const MIN_PREAMBLE_LEN: u64 = 10;

/// Maximum container nesting accepted by the literal parser. Real structured
/// dtypes nest a handful of levels; the limit keeps the recursive parser's
/// stack use bounded on hostile input.
const MAX_DEPTH: usize = 32;

/// A value of the small subset of Python literal syntax used by `.npy` headers.
#[derive(Clone, Debug, PartialEq)]
pub enum PyValue {
    Str(String),
    Int(i128),
    Bool(bool),
    None,
    Tuple(Vec<PyValue>),
    List(Vec<PyValue>),
    /// Entries in source order; duplicates are kept (the caller decides).
    Dict(Vec<(PyValue, PyValue)>),
}

/// Parses a Python literal: strings (single or double quotes, optional `u`
/// prefix, escapes `\\ \' \" \n \r \t \a \b \f \v \ooo \xNN \uNNNN
/// \UNNNNNNNN`), integers with an optional sign, `True`/`False`/`None`,
/// tuples (including `()` and `(3,)`), lists and dicts, with arbitrary
/// whitespace and trailing commas. Errors name what was expected and the byte
/// offset into `s`.
pub fn parse_py_literal(s: &str) -> Result<PyValue, LiteralError> {
    parse_literal(s, false)
}

/// Why a Python literal does not parse ([`parse_py_literal`]); each names the byte offset
/// into the text where it went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiteralError {
    /// Something else than `what` at byte `at`; `at_end` where the text ended there.
    Expected { what: String, at: usize, at_end: bool },
    /// A container opened at byte `at` deeper than [`MAX_DEPTH`] levels.
    TooDeep { at: usize },
    /// A string opened at byte `start` that does not close on its line.
    Unterminated { start: usize },
    /// A backslash escape Python does not know, at byte `at`.
    UnknownEscape { escape: char, at: usize },
    /// A `\x`, `\u` or `\U` escape at byte `at` naming no character.
    InvalidCodePoint { at: usize },
    /// An integer starting at byte `at` past what 128 bits hold.
    TooLarge { at: usize },
    /// A number starting at byte `at` written in a syntax headers do not use (a float,
    /// hex, underscores).
    UnsupportedNumber { at: usize },
}

impl fmt::Display for LiteralError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LiteralError::Expected { what, at, at_end } => {
                let at_end = if *at_end { " (end of input)" } else { "" };
                write!(f, "expected {what} at byte {at}{at_end}")
            }
            LiteralError::TooDeep { at } => write!(f, "nesting deeper than {MAX_DEPTH} levels at byte {at}"),
            LiteralError::Unterminated { start } => write!(f, "unterminated string starting at byte {start}"),
            LiteralError::UnknownEscape { escape, at } => {
                write!(f, "unknown escape '\\{}' at byte {at}", escape.escape_debug())
            }
            LiteralError::InvalidCodePoint { at } => write!(f, "invalid code point in escape at byte {at}"),
            LiteralError::TooLarge { at } => write!(f, "integer too large at byte {at}"),
            LiteralError::UnsupportedNumber { at } => write!(f, "unsupported number syntax at byte {at}"),
        }
    }
}

impl std::error::Error for LiteralError {}

/// The parsed preamble of a `.npy` file.
#[derive(Clone, Debug, PartialEq)]
pub struct NpyPreamble {
    /// (major, minor); one of (1, 0), (2, 0), (3, 0).
    pub version: (u8, u8),
    /// The dtype description: a string such as `'<f4'`, or a list of field
    /// tuples for structured dtypes. Interpreting it is left to the caller.
    pub descr: PyValue,
    pub fortran_order: bool,
    /// Dimensions; empty for a 0-d array. The product is not checked for
    /// overflow here.
    pub shape: Vec<u64>,
    /// Byte offset of the array data from the start of the file.
    pub data_offset: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PreambleError {
    /// The input does not start with the `.npy` magic.
    NotNpy,
    /// The input ends before the preamble does. `have` is the number of bytes
    /// given, which is the file length when the caller followed the contract
    /// of [`parse_preamble`].
    Truncated {
        needed: u64,
        have: u64,
    },
    UnsupportedVersion(u8, u8),
    /// The header length field exceeds [`MAX_HEADER_LEN`].
    HeaderTooLong(u64),
    /// The header text is not a Python literal.
    Dict(LiteralError),
    /// The header text is not a valid `.npy` header dict.
    Invalid(String),
}

impl fmt::Display for PreambleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PreambleError::NotNpy => write!(f, "not a .npy file (bad magic)"),
            PreambleError::Truncated { needed, have } => {
                write!(f, "truncated header: needs {needed} bytes, file has {have}")
            }
            PreambleError::UnsupportedVersion(major, minor) => {
                write!(f, "unsupported .npy version {major}.{minor}")
            }
            PreambleError::HeaderTooLong(len) => {
                write!(f, "header length {len} exceeds the {MAX_HEADER_LEN}-byte limit")
            }
            PreambleError::Dict(e) => write!(f, "invalid header: header dict: {e}"),
            PreambleError::Invalid(reason) => write!(f, "invalid header: {reason}"),
        }
    }
}

impl std::error::Error for PreambleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PreambleError::Dict(e) => Some(e),
            _ => None,
        }
    }
}

/// Parses the preamble at the start of `bytes`, a prefix of a `.npy` file.
///
/// Pass at least `min(file_len, MAX_PREAMBLE_LEN)` bytes; with fewer, a
/// complete header may be reported as [`PreambleError::Truncated`].
pub fn parse_preamble(bytes: &[u8]) -> Result<NpyPreamble, PreambleError> {
    let have = bytes.len() as u64;

    // A short input that matches the magic so far is a truncated file, not a
    // foreign one; anything else that differs from the magic is foreign.
    let magic_have = bytes.len().min(MAGIC.len());
    if bytes[..magic_have] != MAGIC[..magic_have] {
        return Err(PreambleError::NotNpy);
    }
    let (major, minor) = match bytes.get(6..8) {
        Some(&[major, minor]) => (major, minor),
        _ => {
            return Err(PreambleError::Truncated { needed: MIN_PREAMBLE_LEN, have });
        }
    };

    // Version decides the width of the length field and the header encoding.
    let (len_width, utf8) = match (major, minor) {
        (1, 0) => (2, false),
        (2, 0) => (4, false),
        (3, 0) => (4, true),
        _ => return Err(PreambleError::UnsupportedVersion(major, minor)),
    };
    let text_start = 8 + len_width;
    let len_bytes = bytes.get(8..text_start).ok_or(PreambleError::Truncated { needed: text_start as u64, have })?;
    let header_len = len_bytes.iter().rev().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));

    // Checked before truncation: callers pass at most MAX_PREAMBLE_LEN bytes,
    // so an oversized length would otherwise masquerade as a truncated file.
    if header_len > MAX_HEADER_LEN as u64 {
        return Err(PreambleError::HeaderTooLong(header_len));
    }
    // Cannot overflow: header_len <= MAX_HEADER_LEN was checked above.
    let data_offset = text_start as u64 + header_len;
    let raw =
        bytes.get(text_start..data_offset as usize).ok_or(PreambleError::Truncated { needed: data_offset, have })?;

    let text = if utf8 {
        std::str::from_utf8(raw)
            .map_err(|e| PreambleError::Invalid(format!("header is not valid UTF-8 at byte {}", e.valid_up_to())))?
            .to_owned()
    } else {
        // latin1 maps each byte to the code point of the same value.
        raw.iter().map(|&b| char::from(b)).collect()
    };

    // Headers written by Python 2 (only possible for versions 1.0 and 2.0)
    // may carry `L` suffixes on integers, e.g. `'shape': (3L, 4L)`; NumPy
    // strips them when reading, so do we.
    let dict = parse_literal(&text, !utf8).map_err(PreambleError::Dict)?;
    let (descr, fortran_order, shape) = check_header_dict(dict)?;

    Ok(NpyPreamble { version: (major, minor), descr, fortran_order, shape, data_offset })
}

fn invalid(reason: impl Into<String>) -> PreambleError {
    PreambleError::Invalid(reason.into())
}

/// Extracts and type-checks the three header keys.
fn check_header_dict(dict: PyValue) -> Result<(PyValue, bool, Vec<u64>), PreambleError> {
    let PyValue::Dict(entries) = dict else {
        return Err(invalid("header is not a dict"));
    };

    let mut descr = None;
    let mut fortran_order = None;
    let mut shape = None;
    for (key, value) in entries {
        let PyValue::Str(name) = key else {
            return Err(invalid("header dict has a non-string key"));
        };
        let slot = match name.as_str() {
            "descr" => &mut descr,
            "fortran_order" => &mut fortran_order,
            "shape" => &mut shape,
            // NumPy rejects extra keys too; ignoring one could misread data if
            // a future format revision uses it to change the layout.
            _ => return Err(invalid(format!("unexpected key '{}'", name.escape_debug()))),
        };
        // Python would silently keep the last duplicate; a writer producing
        // duplicates is broken, so refuse rather than guess.
        if slot.replace(value).is_some() {
            return Err(invalid(format!("duplicate key '{name}'")));
        }
    }

    let descr = match descr {
        Some(d @ (PyValue::Str(_) | PyValue::List(_))) => d,
        Some(_) => return Err(invalid("'descr' must be a string or a list")),
        None => return Err(invalid("missing key 'descr'")),
    };
    let fortran_order = match fortran_order {
        Some(PyValue::Bool(b)) => b,
        Some(_) => return Err(invalid("'fortran_order' must be True or False")),
        None => return Err(invalid("missing key 'fortran_order'")),
    };
    let shape = match shape {
        Some(PyValue::Tuple(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                PyValue::Int(n) if *n < 0 => Err(invalid(format!("'shape' entry {i} is negative ({n})"))),
                PyValue::Int(n) => {
                    u64::try_from(*n).map_err(|_| invalid(format!("'shape' entry {i} is too large ({n})")))
                }
                _ => Err(invalid(format!("'shape' entry {i} is not an integer"))),
            })
            .collect::<Result<Vec<u64>, _>>()?,
        Some(_) => return Err(invalid("'shape' must be a tuple")),
        None => return Err(invalid("missing key 'shape'")),
    };
    Ok((descr, fortran_order, shape))
}

/// Parses a complete literal; `allow_long_suffix` accepts Python 2 `123L`.
fn parse_literal(s: &str, allow_long_suffix: bool) -> Result<PyValue, LiteralError> {
    let mut parser = Parser { s, pos: 0, allow_long_suffix };
    let value = parser.value(0)?;
    parser.skip_ws();
    if parser.pos != s.len() {
        return Err(parser.expected("end of input"));
    }
    Ok(value)
}

/// Recursive-descent parser over `s`. `pos` is a byte offset that only ever
/// advances by whole characters, so it always lies on a char boundary.
struct Parser<'a> {
    s: &'a str,
    pos: usize,
    allow_long_suffix: bool,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.pos).copied()
    }

    fn peek_char(&self) -> Option<char> {
        self.s.get(self.pos..).and_then(|rest| rest.chars().next())
    }

    fn eat(&mut self, byte: u8) -> bool {
        let hit = self.peek() == Some(byte);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r' | b'\x0c') = self.peek() {
            self.pos += 1;
        }
    }

    fn expected(&self, what: &str) -> LiteralError {
        LiteralError::Expected { what: what.into(), at: self.pos, at_end: self.pos >= self.s.len() }
    }

    /// Parses one value; `depth` is the number of enclosing containers.
    fn value(&mut self, depth: usize) -> Result<PyValue, LiteralError> {
        self.skip_ws();
        let next = self.s.as_bytes().get(self.pos + 1).copied();
        match self.peek() {
            Some(b'\'' | b'"') => self.string(),
            // Python 3 accepts (and ignores) the `u` prefix; Python 2 writers
            // emitted it for unicode field names.
            Some(b'u' | b'U') if matches!(next, Some(b'\'' | b'"')) => {
                self.pos += 1;
                self.string()
            }
            Some(b'(') => self.sequence(depth, b')'),
            Some(b'[') => self.sequence(depth, b']'),
            Some(b'{') => self.dict(depth),
            Some(b'-' | b'+' | b'0'..=b'9') => self.int(),
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => self.keyword(),
            _ => Err(self.expected("a value")),
        }
    }

    /// Consumes a container's opening bracket, enforcing the depth limit
    /// before recursing any further.
    fn open(&mut self, depth: usize) -> Result<usize, LiteralError> {
        if depth >= MAX_DEPTH {
            return Err(LiteralError::TooDeep { at: self.pos });
        }
        self.pos += 1;
        Ok(depth + 1)
    }

    /// Parses a list (`close == b']'`) or a tuple / parenthesised expression
    /// (`close == b')'`).
    fn sequence(&mut self, depth: usize, close: u8) -> Result<PyValue, LiteralError> {
        let depth = self.open(depth)?;
        let is_tuple = close == b')';
        let mut items = Vec::new();
        let mut saw_comma = false;
        loop {
            self.skip_ws();
            if self.eat(close) {
                break;
            }
            items.push(self.value(depth)?);
            self.skip_ws();
            if self.eat(b',') {
                saw_comma = true;
            } else if self.eat(close) {
                break;
            } else {
                let what = if is_tuple { "',' or ')'" } else { "',' or ']'" };
                return Err(self.expected(what));
            }
        }
        if !is_tuple {
            return Ok(PyValue::List(items));
        }
        // `(x)` is just `x` in Python; only a comma (or `()`) makes a tuple.
        match items.pop() {
            Some(only) if items.is_empty() && !saw_comma => Ok(only),
            Some(last) => {
                items.push(last);
                Ok(PyValue::Tuple(items))
            }
            None => Ok(PyValue::Tuple(items)),
        }
    }

    fn dict(&mut self, depth: usize) -> Result<PyValue, LiteralError> {
        let depth = self.open(depth)?;
        let mut entries = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(b'}') {
                break;
            }
            let key = self.value(depth)?;
            self.skip_ws();
            if !self.eat(b':') {
                return Err(self.expected("':'"));
            }
            let value = self.value(depth)?;
            entries.push((key, value));
            self.skip_ws();
            if !self.eat(b',') {
                if self.eat(b'}') {
                    break;
                }
                return Err(self.expected("',' or '}'"));
            }
        }
        Ok(PyValue::Dict(entries))
    }

    fn string(&mut self) -> Result<PyValue, LiteralError> {
        let start = self.pos;
        let quote = self.peek_char();
        self.pos += 1;
        let unterminated = || LiteralError::Unterminated { start };
        let mut out = String::new();
        loop {
            let c = self.peek_char().ok_or_else(unterminated)?;
            self.pos += c.len_utf8();
            match c {
                _ if Some(c) == quote => return Ok(PyValue::Str(out)),
                // A raw line break ends a single-quoted Python string with a
                // syntax error.
                '\n' | '\r' => return Err(unterminated()),
                '\\' => {
                    let escape_start = self.pos - 1;
                    let e = self.peek_char().ok_or_else(unterminated)?;
                    self.pos += e.len_utf8();
                    let decoded = match e {
                        '\\' => '\\',
                        '\'' => '\'',
                        '"' => '"',
                        'n' => '\n',
                        'r' => '\r',
                        't' => '\t',
                        'a' => '\x07',
                        'b' => '\x08',
                        'f' => '\x0c',
                        'v' => '\x0b',
                        // Backslash-newline is a line continuation: no output.
                        '\n' => continue,
                        '0'..='7' => self.octal_escape(e),
                        'x' => self.hex_escape(2, escape_start)?,
                        'u' => self.hex_escape(4, escape_start)?,
                        'U' => self.hex_escape(8, escape_start)?,
                        _ => {
                            return Err(LiteralError::UnknownEscape { escape: e, at: escape_start });
                        }
                    };
                    out.push(decoded);
                }
                _ => out.push(c),
            }
        }
    }

    /// Python's `\ooo`: up to three octal digits, the first already consumed.
    fn octal_escape(&mut self, first: char) -> char {
        let mut value = u32::from(first) - u32::from('0');
        for _ in 0..2 {
            match self.peek() {
                Some(d @ b'0'..=b'7') => {
                    value = value * 8 + u32::from(d - b'0');
                    self.pos += 1;
                }
                _ => break,
            }
        }
        // At most 0o777 = 511, always a valid scalar value.
        char::from_u32(value).unwrap_or(char::REPLACEMENT_CHARACTER)
    }

    /// Reads exactly `digits` hex digits as a code point.
    fn hex_escape(&mut self, digits: usize, escape_start: usize) -> Result<char, LiteralError> {
        let mut value = 0u32;
        for _ in 0..digits {
            let d = self
                .peek()
                .and_then(|b| char::from(b).to_digit(16))
                .ok_or_else(|| self.expected(&format!("{digits} hex digits")))?;
            // At most 8 digits, so this stays within u32.
            value = value * 16 + d;
            self.pos += 1;
        }
        char::from_u32(value).ok_or(LiteralError::InvalidCodePoint { at: escape_start })
    }

    fn int(&mut self) -> Result<PyValue, LiteralError> {
        let start = self.pos;
        let negative = self.peek() == Some(b'-');
        if self.eat(b'-') || self.eat(b'+') {
            // A unary sign may be separated from its operand, as in Python.
            self.skip_ws();
        }
        let digits_start = self.pos;
        let mut value: i128 = 0;
        while let Some(d @ b'0'..=b'9') = self.peek() {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(i128::from(d - b'0')))
                .ok_or(LiteralError::TooLarge { at: start })?;
            self.pos += 1;
        }
        if self.pos == digits_start {
            return Err(self.expected("digits"));
        }
        if self.allow_long_suffix && matches!(self.peek(), Some(b'L' | b'l')) {
            self.pos += 1;
        }
        // Floats, hex, underscores etc. are not needed for headers; reject them
        // instead of silently stopping at the first non-digit.
        if matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'_' || c == b'.') {
            return Err(LiteralError::UnsupportedNumber { at: start });
        }
        Ok(PyValue::Int(if negative { -value } else { value }))
    }

    fn keyword(&mut self) -> Result<PyValue, LiteralError> {
        let start = self.pos;
        while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'_') {
            self.pos += 1;
        }
        match &self.s.as_bytes()[start..self.pos] {
            b"True" => Ok(PyValue::Bool(true)),
            b"False" => Ok(PyValue::Bool(false)),
            b"None" => Ok(PyValue::None),
            _ => {
                self.pos = start;
                Err(self.expected("a value (string, integer, True, False, None, or bracket)"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Headers below were produced by NumPy 2.4 (`np.save` unless noted) and
    // copied byte for byte, padding included. The comment gives the expression
    // saved and the total file size (header + data).

    // np.zeros((5, 3, 4), dtype=np.float32); file size 368.
    const F32_3D: &[u8] = b"\x93NUMPY\x01\x00\x76\x00{'descr': '<f4', 'fortran_order': False, 'shape': (5, 3, 4), }                                                       \n";
    // np.zeros((7,), dtype=np.int64); file size 184.
    const I64_1D: &[u8] = b"\x93NUMPY\x01\x00\x76\x00{'descr': '<i8', 'fortran_order': False, 'shape': (7,), }                                                            \n";
    // np.array(1.5); file size 136.
    const F64_0D: &[u8] = b"\x93NUMPY\x01\x00\x76\x00{'descr': '<f8', 'fortran_order': False, 'shape': (), }                                                              \n";
    // np.zeros((2,), dtype=[('x','<f4',(4,)),('y','<i8'),('z','u1',(2,3))]);
    // file size 252.
    const STRUCTURED: &[u8] = b"\x93NUMPY\x01\x00\xb6\x00{'descr': [('x', '<f4', (4,)), ('y', '<i8'), ('z', '|u1', (2, 3))], 'fortran_order': False, 'shape': (2,), }                                                                         \n";
    // np.lib.format.write_array(f, np.zeros((2, 3), dtype='<u2'), version=(2, 0));
    // file size 140.
    const V2_U16: &[u8] = b"\x93NUMPY\x02\x00\x74\x00\x00\x00{'descr': '<u2', 'fortran_order': False, 'shape': (2, 3), }                                                        \n";
    // np.zeros((4,), dtype=[('\u00e9\u20ac', '<f4')]); NumPy picks version 3.0
    // because the field name is not latin1. File size 144.
    const V3_UTF8: &[u8] = b"\x93NUMPY\x03\x00\x74\x00\x00\x00{'descr': [('\xc3\xa9\xe2\x82\xac', '<f4')], 'fortran_order': False, 'shape': (4,), }                                             \n";
    // np.zeros((4,), dtype=[('\u00e9', '<f4')]); version 1.0, latin1 byte 0xe9.
    const V1_LATIN1: &[u8] = b"\x93NUMPY\x01\x00\x76\x00{'descr': [('\xe9', '<f4')], 'fortran_order': False, 'shape': (4,), }                                                   \n";
    // np.zeros((3, 2), dtype='>i2', order='F'); file size 140.
    const FORTRAN: &[u8] = b"\x93NUMPY\x01\x00\x76\x00{'descr': '>i2', 'fortran_order': True, 'shape': (3, 2), }                                                           \n";

    fn s(v: &str) -> PyValue {
        PyValue::Str(v.to_owned())
    }

    fn tuple(items: &[PyValue]) -> PyValue {
        PyValue::Tuple(items.to_vec())
    }

    /// A version 1.0 preamble around arbitrary header text.
    fn v1(text: &str) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
        out
    }

    fn invalid_reason(bytes: &[u8]) -> String {
        match parse_preamble(bytes) {
            Err(PreambleError::Invalid(reason)) => reason,
            Err(PreambleError::Dict(e)) => format!("header dict: {e}"),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn numpy_float32_3d() {
        let p = parse_preamble(F32_3D).unwrap();
        assert_eq!(
            p,
            NpyPreamble {
                version: (1, 0),
                descr: s("<f4"),
                fortran_order: false,
                shape: vec![5, 3, 4],
                data_offset: 128,
            }
        );
        // Data size implied by the real file: 368 - 128 = 5 * 3 * 4 * 4.
        assert_eq!(368 - p.data_offset, 5 * 3 * 4 * 4);
    }

    #[test]
    fn numpy_int64_1d() {
        let p = parse_preamble(I64_1D).unwrap();
        assert_eq!(p.descr, s("<i8"));
        assert_eq!(p.shape, vec![7]);
        assert_eq!(p.data_offset, 128);
        assert_eq!(184 - p.data_offset, 7 * 8);
    }

    #[test]
    fn numpy_0d_array() {
        let p = parse_preamble(F64_0D).unwrap();
        assert_eq!(p.descr, s("<f8"));
        assert_eq!(p.shape, Vec::<u64>::new());
        assert_eq!(136 - p.data_offset, 8);
    }

    #[test]
    fn numpy_structured_dtype() {
        let p = parse_preamble(STRUCTURED).unwrap();
        let i = PyValue::Int;
        assert_eq!(
            p.descr,
            PyValue::List(vec![
                tuple(&[s("x"), s("<f4"), tuple(&[i(4)])]),
                tuple(&[s("y"), s("<i8")]),
                tuple(&[s("z"), s("|u1"), tuple(&[i(2), i(3)])]),
            ])
        );
        assert_eq!(p.shape, vec![2]);
        assert_eq!(p.data_offset, 192);
        // Item size 16 + 8 + 6 = 30 bytes, two items.
        assert_eq!(252 - p.data_offset, 2 * 30);
    }

    #[test]
    fn numpy_version_2() {
        let p = parse_preamble(V2_U16).unwrap();
        assert_eq!(p.version, (2, 0));
        assert_eq!(p.descr, s("<u2"));
        assert_eq!(p.shape, vec![2, 3]);
        // 12-byte fixed part + 0x74 header bytes.
        assert_eq!(p.data_offset, 128);
        assert_eq!(140 - p.data_offset, 2 * 3 * 2);
    }

    #[test]
    fn numpy_version_3_is_utf8() {
        let p = parse_preamble(V3_UTF8).unwrap();
        assert_eq!(p.version, (3, 0));
        assert_eq!(p.descr, PyValue::List(vec![tuple(&[s("\u{e9}\u{20ac}"), s("<f4")])]));
        assert_eq!(144 - p.data_offset, 4 * 4);
    }

    #[test]
    fn numpy_version_1_is_latin1() {
        let p = parse_preamble(V1_LATIN1).unwrap();
        assert_eq!(p.descr, PyValue::List(vec![tuple(&[s("\u{e9}"), s("<f4")])]));
    }

    #[test]
    fn version_3_rejects_invalid_utf8() {
        // Replace the first byte of the UTF-8 field name (text offset 13) with
        // 0xff, which never occurs in UTF-8.
        let mut bytes = V3_UTF8.to_vec();
        assert_eq!(bytes[12 + 13], 0xc3);
        bytes[12 + 13] = 0xff;
        assert_eq!(invalid_reason(&bytes), "header is not valid UTF-8 at byte 13");
    }

    #[test]
    fn numpy_fortran_order() {
        let p = parse_preamble(FORTRAN).unwrap();
        assert!(p.fortran_order);
        assert_eq!(p.descr, s(">i2"));
        assert_eq!(p.shape, vec![3, 2]);
    }

    #[test]
    fn data_after_header_is_ignored() {
        let mut bytes = F32_3D.to_vec();
        bytes.extend_from_slice(&[0xab; 240]);
        assert_eq!(parse_preamble(&bytes).unwrap().data_offset, 128);
    }

    #[test]
    fn python2_long_suffix_accepted_in_header_only() {
        let p = parse_preamble(&v1("{'descr': u'<f4', 'fortran_order': False, 'shape': (3L, 4L), }\n")).unwrap();
        assert_eq!(p.shape, vec![3, 4]);
        assert_eq!(p.descr, s("<f4"));
        assert!(parse_py_literal("3L").is_err());
    }

    #[test]
    fn err_bad_magic() {
        assert_eq!(parse_preamble(b"PK\x03\x04 zip file here"), Err(PreambleError::NotNpy));
        assert_eq!(parse_preamble(b"\x93NUMPx\x01\x00"), Err(PreambleError::NotNpy));
        // Short, but already not a prefix of the magic.
        assert_eq!(parse_preamble(b"\x93X"), Err(PreambleError::NotNpy));
    }

    #[test]
    fn err_truncated_before_header_length() {
        let t = |needed, have| Err(PreambleError::Truncated { needed, have });
        assert_eq!(parse_preamble(b""), t(10, 0));
        assert_eq!(parse_preamble(b"\x93NUM"), t(10, 4));
        assert_eq!(parse_preamble(&F32_3D[..7]), t(10, 7));
        // Version known: the length field width decides what is needed.
        assert_eq!(parse_preamble(&F32_3D[..9]), t(10, 9));
        assert_eq!(parse_preamble(&V2_U16[..11]), t(12, 11));
    }

    #[test]
    fn err_header_longer_than_data() {
        assert_eq!(parse_preamble(&F32_3D[..100]), Err(PreambleError::Truncated { needed: 128, have: 100 }));
        assert_eq!(parse_preamble(&V2_U16[..127]), Err(PreambleError::Truncated { needed: 128, have: 127 }));
    }

    #[test]
    fn err_header_too_long() {
        let mut bytes = b"\x93NUMPY\x02\x00".to_vec();
        bytes.extend_from_slice(&(MAX_HEADER_LEN as u32 + 1).to_le_bytes());
        // Reported even though the header bytes are absent: the length alone
        // is enough to refuse.
        assert_eq!(parse_preamble(&bytes), Err(PreambleError::HeaderTooLong(MAX_HEADER_LEN as u64 + 1)));
        bytes[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(parse_preamble(&bytes), Err(PreambleError::HeaderTooLong(u64::from(u32::MAX))));
    }

    #[test]
    fn header_of_exactly_max_len_fits_in_max_preamble() {
        let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }";
        let mut bytes = b"\x93NUMPY\x02\x00".to_vec();
        bytes.extend_from_slice(&(MAX_HEADER_LEN as u32).to_le_bytes());
        bytes.extend_from_slice(dict.as_bytes());
        bytes.resize(MAX_PREAMBLE_LEN - 1, b' ');
        bytes.push(b'\n');
        let p = parse_preamble(&bytes).unwrap();
        assert_eq!(p.data_offset, MAX_PREAMBLE_LEN as u64);
        assert_eq!(p.shape, vec![1]);
    }

    #[test]
    fn err_unsupported_version() {
        let mut bytes = F32_3D.to_vec();
        bytes[6] = 4;
        assert_eq!(parse_preamble(&bytes), Err(PreambleError::UnsupportedVersion(4, 0)));
        bytes[6] = 1;
        bytes[7] = 1;
        assert_eq!(parse_preamble(&bytes), Err(PreambleError::UnsupportedVersion(1, 1)));
    }

    #[test]
    fn err_garbage_dict() {
        let reason = invalid_reason(&v1("{'descr': '<f4', 'fortran_order': False, 'shape': (5, 3) @@@\n"));
        assert!(reason.contains("expected ',' or '}' at byte 57"), "{reason}");
        assert!(invalid_reason(&v1("")).contains("expected a value at byte 0"));
        assert!(invalid_reason(&v1("[1, 2]\n")).contains("not a dict"));
        let mut binary = F32_3D.to_vec();
        binary[10..20].copy_from_slice(&[0; 10]);
        assert!(invalid_reason(&binary).contains("expected a value at byte 0"));
    }

    #[test]
    fn err_missing_keys() {
        assert_eq!(invalid_reason(&v1("{'descr': '<f4', 'fortran_order': False}\n")), "missing key 'shape'");
        assert_eq!(invalid_reason(&v1("{'descr': '<f4', 'shape': ()}\n")), "missing key 'fortran_order'");
        assert_eq!(invalid_reason(&v1("{'fortran_order': False, 'shape': ()}\n")), "missing key 'descr'");
    }

    #[test]
    fn err_wrong_types_name_the_key() {
        let cases = [
            ("{'descr': 4, 'fortran_order': False, 'shape': ()}", "'descr'"),
            ("{'descr': '<f4', 'fortran_order': 0, 'shape': ()}", "'fortran_order'"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': [3]}", "'shape'"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': ('3',)}", "'shape'"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'extra': 1}", "'extra'"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'shape': (4,)}", "duplicate key 'shape'"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (18446744073709551616,)}", "too large"),
        ];
        for (text, needle) in cases {
            let reason = invalid_reason(&v1(text));
            assert!(reason.contains(needle), "{text} -> {reason}");
        }
    }

    #[test]
    fn err_negative_shape() {
        assert_eq!(
            invalid_reason(&v1("{'descr': '<f4', 'fortran_order': False, 'shape': (3, -1)}\n")),
            "'shape' entry 1 is negative (-1)"
        );
    }

    #[test]
    fn err_deeply_nested_brackets() {
        // Far deeper than any stack could take without the limit.
        let deep = "[".repeat(100_000);
        let err = parse_py_literal(&deep).unwrap_err();
        assert_eq!(err, LiteralError::TooDeep { at: 32 });
        assert_eq!(err.to_string(), "nesting deeper than 32 levels at byte 32");
        let header = format!("{{'descr': {deep}");
        assert!(invalid_reason(&v1(&header)).contains("nesting deeper than 32"));
        // Exactly at the limit is fine; one more is not.
        let ok = format!("{}{}", "(".repeat(32), ")".repeat(32));
        assert!(parse_py_literal(&ok).is_ok());
        let too_deep = format!("{}{}", "{".repeat(33), "}".repeat(33));
        assert!(parse_py_literal(&too_deep).is_err());
    }

    #[test]
    fn err_unterminated_string() {
        // The string opened at byte 10 runs into the newline padding.
        let reason = invalid_reason(&v1("{'descr': '<f4, }   \n"));
        assert_eq!(reason, "header dict: unterminated string starting at byte 10");
        assert_eq!(parse_py_literal("'abc").unwrap_err().to_string(), "unterminated string starting at byte 0");
        assert_eq!(parse_py_literal("  \"ab\\\"").unwrap_err().to_string(), "unterminated string starting at byte 2");
        assert!(parse_py_literal("'a\nb'").is_err());
    }

    #[test]
    fn literal_scalars() {
        assert_eq!(parse_py_literal("42"), Ok(PyValue::Int(42)));
        assert_eq!(parse_py_literal(" -7 "), Ok(PyValue::Int(-7)));
        assert_eq!(parse_py_literal("+0"), Ok(PyValue::Int(0)));
        assert_eq!(parse_py_literal("- 3"), Ok(PyValue::Int(-3)));
        assert_eq!(parse_py_literal("-170141183460469231731687303715884105727"), Ok(PyValue::Int(-i128::MAX)));
        assert!(parse_py_literal("170141183460469231731687303715884105728")
            .unwrap_err()
            .to_string()
            .contains("too large"));
        assert_eq!(parse_py_literal("True"), Ok(PyValue::Bool(true)));
        assert_eq!(parse_py_literal("False"), Ok(PyValue::Bool(false)));
        assert_eq!(parse_py_literal("None"), Ok(PyValue::None));
        for bad in ["Truex", "true", "1.5", "0x10", "1e3", "-", "nan", "", "   "] {
            assert!(parse_py_literal(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn literal_strings_and_escapes() {
        assert_eq!(parse_py_literal("'abc'"), Ok(s("abc")));
        assert_eq!(parse_py_literal("\"a'b\""), Ok(s("a'b")));
        assert_eq!(parse_py_literal("'a\"b'"), Ok(s("a\"b")));
        assert_eq!(parse_py_literal("u'x'"), Ok(s("x")));
        assert_eq!(
            parse_py_literal(r#"'\\ \' \" \n \t \r \x41\xe9 \u20ac \U0001F600 \101 \0'"#),
            Ok(s("\\ ' \" \n \t \r A\u{e9} \u{20ac} \u{1F600} A \0"))
        );
        assert_eq!(parse_py_literal("'a\\\nb'"), Ok(s("ab")));
        assert_eq!(parse_py_literal("'\u{e9}\u{20ac}'"), Ok(s("\u{e9}\u{20ac}")));
        assert_eq!(parse_py_literal(r"'ab\q'").unwrap_err().to_string(), r"unknown escape '\q' at byte 3");
        assert_eq!(parse_py_literal(r"'\x4'").unwrap_err().to_string(), "expected 2 hex digits at byte 4");
        assert!(parse_py_literal(r"'\UFFFFFFFF'").is_err());
        assert!(parse_py_literal(r"'\ud800'").is_err());
        assert!(parse_py_literal("b'x'").is_err());
    }

    #[test]
    fn literal_containers() {
        let i = PyValue::Int;
        assert_eq!(parse_py_literal("()"), Ok(tuple(&[])));
        assert_eq!(parse_py_literal("( )"), Ok(tuple(&[])));
        assert_eq!(parse_py_literal("(3,)"), Ok(tuple(&[i(3)])));
        // Parentheses alone do not make a tuple.
        assert_eq!(parse_py_literal("(3)"), Ok(i(3)));
        assert_eq!(parse_py_literal("((3))"), Ok(i(3)));
        assert_eq!(parse_py_literal("(1, 2, 3)"), Ok(tuple(&[i(1), i(2), i(3)])));
        assert_eq!(parse_py_literal("(1, 2, 3,)"), Ok(tuple(&[i(1), i(2), i(3)])));
        assert_eq!(parse_py_literal("[]"), Ok(PyValue::List(vec![])));
        assert_eq!(parse_py_literal("[1,]"), Ok(PyValue::List(vec![i(1)])));
        assert_eq!(parse_py_literal("{}"), Ok(PyValue::Dict(vec![])));
        assert_eq!(
            parse_py_literal(" {\n\t'a' :\r\n [ (1 , ) , None ] ,\n 2: {'b': True} , } \n"),
            Ok(PyValue::Dict(vec![
                (s("a"), PyValue::List(vec![tuple(&[i(1)]), PyValue::None])),
                (i(2), PyValue::Dict(vec![(s("b"), PyValue::Bool(true))])),
            ]))
        );
        let errors = [
            ("(,)", "expected a value at byte 1"),
            ("[1,,]", "expected a value at byte 3"),
            ("[1 2]", "expected ',' or ']' at byte 3"),
            ("(1 2)", "expected ',' or ')' at byte 3"),
            ("{'a' 1}", "expected ':' at byte 5"),
            ("{'a': 1", "expected ',' or '}' at byte 7 (end of input)"),
            ("[1] x", "expected end of input at byte 4"),
            ("[1)", "expected ',' or ']' at byte 2"),
        ];
        for (text, message) in errors {
            assert_eq!(parse_py_literal(text).unwrap_err().to_string(), message, "{text:?}");
        }
    }

    #[test]
    fn display_messages() {
        let cases = [
            (PreambleError::NotNpy, "not a .npy file (bad magic)"),
            (PreambleError::Truncated { needed: 128, have: 100 }, "truncated header: needs 128 bytes, file has 100"),
            (PreambleError::UnsupportedVersion(4, 0), "unsupported .npy version 4.0"),
            (PreambleError::HeaderTooLong(2_000_000), "header length 2000000 exceeds the 1048576-byte limit"),
            (PreambleError::Invalid("missing key 'shape'".into()), "invalid header: missing key 'shape'"),
            (
                PreambleError::Dict(LiteralError::Unterminated { start: 10 }),
                "invalid header: header dict: unterminated string starting at byte 10",
            ),
        ];
        for (err, text) in cases {
            assert_eq!(err.to_string(), text);
        }
    }

    /// xorshift64: deterministic, dependency-free randomness for the
    /// no-panic test.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn random_inputs_never_panic() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let seeds = [F32_3D, I64_1D, F64_0D, STRUCTURED, V2_U16, V3_UTF8, FORTRAN];
        // Characters that exercise every branch of the literal grammar.
        let alphabet = b"()[]{}'\",: -+0123456789LuTrueFalsNon\\xU\n\t\xc3\xa9";
        for _ in 0..20_000 {
            // 1. A real header with a few random byte edits, truncated at a
            //    random point: reaches every stage of parse_preamble.
            let seed = seeds[rng.below(seeds.len())];
            let mut bytes = seed.to_vec();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(bytes.len());
                bytes[at] = match rng.below(3) {
                    0 => rng.next() as u8,
                    _ => alphabet[rng.below(alphabet.len())],
                };
            }
            bytes.truncate(rng.below(bytes.len() + 1));
            if let Ok(p) = parse_preamble(&bytes) {
                assert!(p.data_offset <= bytes.len() as u64);
            }

            // 2. Pure random bytes behind a valid magic and version.
            let mut bytes = b"\x93NUMPY".to_vec();
            bytes.push(1 + rng.below(3) as u8);
            bytes.push(0);
            for _ in 0..rng.below(64) {
                bytes.push(rng.next() as u8);
            }
            let _ = parse_preamble(&bytes);

            // 3. Random literal-ish text.
            let text: Vec<u8> = (0..rng.below(48)).map(|_| alphabet[rng.below(alphabet.len())]).collect();
            let _ = parse_py_literal(&String::from_utf8_lossy(&text));
        }
    }
}
