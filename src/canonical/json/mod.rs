//! Canonical JSON: a single streaming pass over the body bytes that validates strict JSON and
//! writes a normalized spelling of it, skipping ignored fields, without building a tree.
//!
//! The canonical form is itself compact, valid JSON:
//! - no insignificant whitespace; object members sorted by their unescaped key bytes (stable, so
//!   duplicate keys keep their input order); arrays keep their order;
//! - strings with escapes decoded and re-escaped minimally (only `"`, `\` and control characters,
//!   as `\n \r \t \b \f` or lower-hex `\u00xx`), so `"\u0041"` and `"A"` are the same;
//! - numbers as exact decimal scientific notation with no float conversion: an optional `-`, the
//!   significant digits without leading or trailing zeros, `e` and the exponent (`1.50` → `15e-1`,
//!   `100` → `1e2`), and every zero as `0`;
//! - `true`, `false` and `null` unchanged.

use std::fmt::Write as _;

use thiserror::Error;

use super::pointer::push_escaped_token;
use members::*;
use numbers::*;
use strings::*;

mod members;
mod numbers;
mod strings;
use super::{IgnoreSet, Ignored, JsonPointer};

/// How many objects and arrays may be nested inside each other.
pub const MAX_DEPTH: usize = 128;

/// Exponent literals of this magnitude or more are rejected: below it every exponent adjustment
/// stays exact in `i64`, so distinct numbers can never collapse onto the same canonical form.
const MAX_EXPONENT: i64 = 1_000_000_000_000_000;

/// Why a body is not canonicalizable JSON.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum JsonError {
    /// Not strict JSON (RFC 8259); the offset is where the problem was noticed.
    #[error("invalid JSON at byte {0}")]
    Invalid(usize),
    /// More than [`MAX_DEPTH`] objects and arrays nested inside each other.
    #[error("JSON nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
}

/// Appends the canonical form of `input` to `out`.
///
/// Members whose key is in `ignore` (at any depth) or whose path equals one of its pointers are
/// left out, though their values are still validated; when `ignored` is `Some`, the RFC 6901 path
/// of each one left out (`/items/0/ts`) is pushed to it. Array elements designated by a pointer are
/// left out the same way; paths use input indexes. A leading UTF-8 byte order mark is skipped.
/// Number exponents of 10^15 or more are rejected as [`JsonError::Invalid`].
///
/// On error `out` is restored to its length on entry.
///
/// ```rust
/// use idemgate::canonical::{canonical_json, IgnoreSet};
///
/// let mut out = Vec::new();
/// let mut ignored = Vec::new();
/// let body = br#"{ "b": [1.50, "\u00e9"], "a": {"TS": 1, "n": -0.0} }"#;
/// canonical_json(body, &IgnoreSet::defaults(), &mut out, Some(&mut ignored)).unwrap();
/// assert_eq!(out, r#"{"a":{"n":0},"b":[15e-1,"é"]}"#.as_bytes());
/// assert_eq!(ignored, ["/a/TS"]);
/// ```
pub fn canonical_json(
    input: &[u8],
    ignore: &IgnoreSet,
    out: &mut Vec<u8>,
    ignored: Ignored<'_>,
) -> Result<(), JsonError> {
    let mark = out.len();
    // The canonical form is rarely much longer than the input; reserving once up front spares
    // the growth steps a fresh buffer would otherwise take.
    out.reserve(input.len() + WINDOW);
    let mut parser = Parser::new(input, ignore, ignore.pointers(), None, ignored);
    let result = parser.document(out);
    parser.buffers.recycle();
    if result.is_err() {
        out.truncate(mark);
    }
    result
}

/// Canonicalizes `input` with nothing ignored, storing into `found[i]` the canonical form of the
/// value `pointers[i]` designates (the last one, when duplicate keys make it ambiguous).
pub(crate) fn extract_into(
    input: &[u8],
    pointers: &[JsonPointer],
    found: &mut [Option<Vec<u8>>],
) -> Result<(), JsonError> {
    let ignore = IgnoreSet::empty();
    let mut out = Vec::with_capacity(input.len());
    let mut parser = Parser::new(input, &ignore, pointers, Some(found), None);
    let result = parser.document(&mut out);
    parser.buffers.recycle();
    result
}

/// Working memory of one parse. It is recycled per thread so that canonicalizing a typical body
/// allocates nothing beyond the caller's output buffer.
#[derive(Default)]
struct Buffers {
    /// Stack of pointer indexes; each nesting level owns one `Frame` of it.
    live: Vec<usize>,
    /// Stack of path steps, maintained only while skipped paths are being reported.
    path: Vec<Seg>,
    /// Stack of members of all objects currently open; each object owns a tail of it.
    members: Vec<Member>,
    /// Decoded keys that contained escapes, stacked like `members`.
    keys: Vec<u8>,
    /// Holds one object's generated values while its members are written out in key order.
    scratch: Vec<u8>,
    /// One object's member indexes, sorted into key order.
    order: Vec<u64>,
    /// Members of objects too large for `order`'s packing, as `prefix << 64 | index`.
    wide: Vec<u128>,
    /// The last out-of-order key sequence seen at each nesting level, with its sorted order.
    /// Arrays of like objects, and successive bodies sent to one endpoint, repeat their key
    /// sequences, and reusing the order skips the sort. Kept across parses on purpose; its size
    /// is bounded by `MAX_DEPTH` × `MAX_SHAPE`.
    shapes: Vec<Shape>,
}

/// A key sequence, as key prefixes, and the order that sorts it.
#[derive(Default)]
struct Shape {
    prefixes: Vec<u64>,
    order: Vec<u64>,
}

/// Objects with more members than this are not remembered as shapes.
const MAX_SHAPE: usize = 64;

/// Buffers grown beyond this many bytes by an unusually large body are freed rather than kept
/// for the next parse.
const MAX_RETAINED_BYTES: usize = 256 * 1024;

thread_local! {
    static RECYCLED: std::cell::Cell<Buffers> = std::cell::Cell::new(Buffers::default());
}

impl Buffers {
    fn take() -> Self {
        let mut buffers = RECYCLED.with(std::cell::Cell::take);
        // A parse that failed midway leaves its stacks as they were.
        buffers.live.clear();
        buffers.path.clear();
        buffers.members.clear();
        buffers.keys.clear();
        buffers.scratch.clear();
        buffers.order.clear();
        buffers.wide.clear();
        buffers
    }

    /// Hands the buffers back to this thread for the next parse.
    fn recycle(&mut self) {
        fn bounded<T>(vec: &mut Vec<T>) {
            if vec.capacity() * std::mem::size_of::<T>() > MAX_RETAINED_BYTES {
                *vec = Vec::new();
            }
        }
        let mut buffers = std::mem::take(self);
        bounded(&mut buffers.live);
        bounded(&mut buffers.path);
        bounded(&mut buffers.members);
        bounded(&mut buffers.keys);
        bounded(&mut buffers.scratch);
        bounded(&mut buffers.order);
        bounded(&mut buffers.wide);
        RECYCLED.with(|cell| cell.set(buffers));
    }
}

/// An object key: either borrowed from the input (no escapes) or decoded into `Buffers::keys`.
#[derive(Clone, Copy)]
struct Key {
    /// The first 8 key bytes, big-endian and zero-padded: orders most keys without a memcmp.
    prefix: u64,
    start: usize,
    end: usize,
    decoded: bool,
}

/// Where a member's canonical value is, until its object is written out in key order.
#[derive(Clone, Copy)]
enum Value {
    /// Spelled canonically in the input already (plain strings, literals): copied from there.
    Input { start: usize, end: usize },
    /// Written to the output while parsing (numbers, escaped strings, objects, arrays).
    Generated { start: usize, end: usize },
}

/// One parsed member awaiting its object's closing brace.
#[derive(Clone, Copy)]
struct Member {
    key: Key,
    /// The input spells the key as `"key":` with no escapes or whitespace, ready to copy.
    compact: bool,
    value: Value,
}

/// One step of the current path, kept only when skipped paths are being reported.
#[derive(Clone, Copy)]
enum Seg {
    Key(Key),
    Index(usize),
}

/// A range of `Buffers::live`: the pointers still matching the path of the value being parsed.
#[derive(Clone, Copy)]
struct Frame {
    start: usize,
    end: usize,
}

impl Frame {
    const NONE: Frame = Frame { start: 0, end: 0 };

    fn is_empty(self) -> bool {
        self.start == self.end
    }
}

struct Parser<'a, 'r> {
    input: &'a [u8],
    pos: usize,
    ignore: &'a IgnoreSet,
    pointers: &'a [JsonPointer],
    /// When set, pointer matches are extracted into it; otherwise they are skipped.
    extract: Option<&'r mut [Option<Vec<u8>>]>,
    ignored: Option<&'r mut Vec<String>>,
    buffers: Buffers,
    /// How many skipped members enclose the current position; inside them nothing is reported.
    skipping: usize,
}

impl<'a, 'r> Parser<'a, 'r> {
    fn new(
        input: &'a [u8],
        ignore: &'a IgnoreSet,
        pointers: &'a [JsonPointer],
        extract: Option<&'r mut [Option<Vec<u8>>]>,
        ignored: Ignored<'r>,
    ) -> Self {
        Self {
            input,
            pos: 0,
            ignore,
            pointers,
            extract,
            ignored,
            buffers: Buffers::take(),
            skipping: 0,
        }
    }

    fn document(&mut self, out: &mut Vec<u8>) -> Result<(), JsonError> {
        if self.input.starts_with(b"\xEF\xBB\xBF") {
            self.pos = 3;
        }
        // The root frame holds every pointer: all of them match the empty path so far.
        self.buffers.live.extend(0..self.pointers.len());
        let root = Frame {
            start: 0,
            end: self.buffers.live.len(),
        };
        self.skip_ws();
        let start = out.len();
        self.value(out, 0, root)?;
        self.skip_ws();
        if self.pos != self.input.len() {
            return Err(JsonError::Invalid(self.pos));
        }
        self.store_extracted(&out[start..], root, 0);
        Ok(())
    }

    #[inline]
    fn skip_ws(&mut self) {
        // Bodies are usually compact: the next byte is rarely whitespace, which is all <= ' '.
        if self.input.get(self.pos).is_some_and(|&b| b > b' ') {
            return;
        }
        while let Some(&b) = self.input.get(self.pos) {
            if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                break;
            }
            self.pos += 1;
        }
    }

    #[inline]
    fn invalid<T>(&self) -> Result<T, JsonError> {
        Err(JsonError::Invalid(self.pos))
    }

    /// Parses the value at `self.pos`, enclosed by `level` objects and arrays.
    ///
    /// Inlined into the container loops so that scalars, most values, cost no call; only nested
    /// containers recurse.
    #[inline(always)]
    fn value(&mut self, out: &mut Vec<u8>, level: usize, frame: Frame) -> Result<(), JsonError> {
        match self.input.get(self.pos) {
            Some(b'"') => self.string_value(out),
            Some(b'{') => self.object(out, level + 1, frame),
            Some(b'[') => self.array(out, level + 1, frame),
            Some(b'-' | b'0'..=b'9') => self.number(out),
            Some(b't') => self.literal(out, b"true"),
            Some(b'f') => self.literal(out, b"false"),
            Some(b'n') => self.literal(out, b"null"),
            _ => self.invalid(),
        }
    }

    #[inline(always)]
    fn literal<const N: usize>(
        &mut self,
        out: &mut Vec<u8>,
        word: &[u8; N],
    ) -> Result<(), JsonError> {
        if self.input[self.pos..].first_chunk() != Some(word) {
            return self.invalid();
        }
        self.pos += N;
        out.extend_from_slice(word);
        Ok(())
    }

    #[inline(always)]
    fn string_value(&mut self, out: &mut Vec<u8>) -> Result<(), JsonError> {
        let input = self.input;
        let start = self.pos + 1;
        let stop = scan_plain(input, start)?;
        if input[stop] == b'"' {
            // Without escapes the input spelling is already canonical: quotes, backslashes and
            // control characters cannot appear raw, and everything else is emitted raw.
            append(out, input, self.pos, stop + 1);
            self.pos = stop + 1;
        } else {
            out.push(b'"');
            out.extend_from_slice(&input[start..stop]);
            self.pos = decode_escaped(input, stop, out, true)?;
            out.push(b'"');
        }
        Ok(())
    }

    /// Parses the key at `self.pos` (an opening quote) without writing it anywhere.
    #[inline(always)]
    fn key(&mut self) -> Result<Key, JsonError> {
        let input = self.input;
        let start = self.pos + 1;
        let stop = scan_plain(input, start)?;
        if input[stop] == b'"' {
            self.pos = stop + 1;
            return Ok(Key {
                prefix: key_prefix(input, start, stop),
                start,
                end: stop,
                decoded: false,
            });
        }
        let keys = &mut self.buffers.keys;
        let decoded_start = keys.len();
        keys.extend_from_slice(&input[start..stop]);
        self.pos = decode_escaped(input, stop, keys, false)?;
        Ok(Key {
            prefix: key_prefix(keys, decoded_start, keys.len()),
            start: decoded_start,
            end: keys.len(),
            decoded: true,
        })
    }

    #[inline]
    fn ignores_key(&self, key: Key) -> bool {
        let len = key.end - key.start;
        if len <= 8 {
            // The prefix holds the whole key; no need to look at the bytes again.
            self.ignore.ignores_short(len, key.prefix)
        } else {
            self.ignore
                .ignores_name(key_bytes(self.input, &self.buffers.keys, key))
        }
    }

    /// Narrows `frame` to the pointers that continue through step `level - 1` of the path, pushing
    /// them as a new frame; also says whether one of them ends exactly there.
    fn narrow(&mut self, frame: Frame, level: usize, step: Seg) -> (Frame, bool) {
        let start = self.buffers.live.len();
        let mut exact = false;
        for i in frame.start..frame.end {
            let p = self.buffers.live[i];
            let tokens = self.pointers[p].tokens();
            if tokens.len() < level {
                continue;
            }
            let token = tokens[level - 1].as_bytes();
            let hit = match step {
                Seg::Key(key) => token == key_bytes(self.input, &self.buffers.keys, key),
                Seg::Index(index) => token_is_index(token, index),
            };
            if hit {
                self.buffers.live.push(p);
                exact |= tokens.len() == level;
            }
        }
        (
            Frame {
                start,
                end: self.buffers.live.len(),
            },
            exact,
        )
    }

    /// Stores the canonical `value` for every pointer of `frame` that ends at path length `len`.
    fn store_extracted(&mut self, value: &[u8], frame: Frame, len: usize) {
        if let Some(found) = self.extract.as_deref_mut() {
            for &p in &self.buffers.live[frame.start..frame.end] {
                if self.pointers[p].tokens().len() == len {
                    found[p] = Some(value.to_vec());
                }
            }
        }
    }

    /// Whether skipped paths must be reported at this position.
    #[inline]
    fn reporting(&self) -> bool {
        self.ignored.is_some() && self.skipping == 0
    }

    /// Reports the path of the current container followed by `last` as skipped.
    #[cold]
    fn report(&mut self, last: Seg) {
        let mut path = String::new();
        for seg in self.buffers.path.iter().chain(std::iter::once(&last)) {
            path.push('/');
            match *seg {
                Seg::Key(key) => push_escaped_token(
                    &mut path,
                    &String::from_utf8_lossy(key_bytes(self.input, &self.buffers.keys, key)),
                ),
                Seg::Index(index) => {
                    let _ = write!(path, "{index}");
                }
            }
        }
        if let Some(ignored) = self.ignored.as_deref_mut() {
            ignored.push(path);
        }
    }

    /// Validates the value at `self.pos` and discards its output.
    fn skip_value(&mut self, out: &mut Vec<u8>, level: usize) -> Result<(), JsonError> {
        let mark = out.len();
        self.skipping += 1;
        self.value(out, level, Frame::NONE)?;
        self.skipping -= 1;
        out.truncate(mark);
        Ok(())
    }

    #[inline(never)]
    fn object(&mut self, out: &mut Vec<u8>, level: usize, frame: Frame) -> Result<(), JsonError> {
        if level > MAX_DEPTH {
            return Err(JsonError::TooDeep);
        }
        self.pos += 1;
        out.push(b'{');
        self.skip_ws();
        if self.input.get(self.pos) == Some(&b'}') {
            self.pos += 1;
            out.push(b'}');
            return Ok(());
        }
        // Members are only parsed here; `finish_object` writes them in key order. Until then
        // `out[body_start..]` holds just the values that had to be generated.
        let body_start = out.len();
        let members_base = self.buffers.members.len();
        let keys_base = self.buffers.keys.len();
        let check_names = self.ignore.has_names() && self.skipping == 0;
        let reporting = self.reporting();
        loop {
            if self.input.get(self.pos) != Some(&b'"') {
                return self.invalid();
            }
            let key = self.key()?;
            let compact = !key.decoded && self.input.get(self.pos) == Some(&b':');
            if !compact {
                self.skip_ws();
                if self.input.get(self.pos) != Some(&b':') {
                    return self.invalid();
                }
            }
            self.pos += 1;
            self.skip_ws();

            let live_mark = self.buffers.live.len();
            let (child, exact) = if frame.is_empty() {
                (Frame::NONE, false)
            } else {
                self.narrow(frame, level, Seg::Key(key))
            };
            let skip = (exact && self.extract.is_none()) || (check_names && self.ignores_key(key));
            if skip {
                if reporting {
                    self.report(Seg::Key(key));
                }
                self.skip_value(out, level)?;
            } else {
                if reporting {
                    self.buffers.path.push(Seg::Key(key));
                }
                let value = self.member_value(out, level, child)?;
                if reporting {
                    self.buffers.path.pop();
                }
                if exact {
                    let input = self.input;
                    let bytes = match value {
                        Value::Input { start, end } => &input[start..end],
                        Value::Generated { start, end } => &out[start..end],
                    };
                    self.store_extracted(bytes, child, level);
                }
                self.buffers.members.push(Member {
                    key,
                    compact,
                    value,
                });
            }
            self.buffers.live.truncate(live_mark);

            self.skip_ws();
            match self.input.get(self.pos) {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_ws();
                }
                Some(b'}') => {
                    self.pos += 1;
                    break;
                }
                _ => return self.invalid(),
            }
        }
        self.finish_object(out, level, body_start, members_base);
        self.buffers.members.truncate(members_base);
        self.buffers.keys.truncate(keys_base);
        out.push(b'}');
        Ok(())
    }

    /// Parses a member's value, leaving it in the input when it is canonical there already.
    #[inline(always)]
    fn member_value(
        &mut self,
        out: &mut Vec<u8>,
        level: usize,
        frame: Frame,
    ) -> Result<Value, JsonError> {
        let input = self.input;
        let start = self.pos;
        let literal = match input.get(start) {
            Some(b'"') => {
                let stop = scan_plain(input, start + 1)?;
                if input[stop] == b'"' {
                    // Without escapes the input spelling is already canonical: quotes,
                    // backslashes and control characters cannot appear raw.
                    self.pos = stop + 1;
                    return Ok(Value::Input {
                        start,
                        end: self.pos,
                    });
                }
                None
            }
            // Fixed-length comparisons compile to one load each, unlike `starts_with`.
            Some(b't') => Some(input[start..].first_chunk() == Some(b"true")),
            Some(b'f') => Some(input[start..].first_chunk() == Some(b"false")),
            Some(b'n') => Some(input[start..].first_chunk() == Some(b"null")),
            _ => None,
        };
        if let Some(valid) = literal {
            if !valid {
                return self.invalid();
            }
            self.pos += if input[start] == b'f' { 5 } else { 4 };
            return Ok(Value::Input {
                start,
                end: self.pos,
            });
        }
        let generated = out.len();
        self.value(out, level, frame)?;
        Ok(Value::Generated {
            start: generated,
            end: out.len(),
        })
    }

    /// Writes the members `members[base..]` to `out` in key order, comma-separated, in place of
    /// the generated values held at `out[body_start..]`.
    fn finish_object(&mut self, out: &mut Vec<u8>, level: usize, body_start: usize, base: usize) {
        let Buffers {
            keys,
            members,
            scratch,
            order,
            wide,
            shapes,
            ..
        } = &mut self.buffers;
        let input = self.input;
        let members = &members[base..];
        if shapes.len() <= level {
            shapes.resize_with(level + 1, Shape::default);
        }
        let in_order = key_order(input, keys, members, order, wide, &mut shapes[level]);
        scratch.clear();
        if out.len() > body_start {
            scratch.extend_from_slice(&out[body_start..]);
            // Padding lets `append` copy every short value with a fixed-size window.
            scratch.extend_from_slice(&[0; WINDOW]);
            out.truncate(body_start);
        }
        let generated = Generated {
            bytes: scratch,
            offset: body_start,
        };
        if in_order {
            for (i, m) in members.iter().enumerate() {
                emit_member(out, input, keys, &generated, i, m);
            }
        } else {
            for (i, &m) in order.iter().enumerate() {
                emit_member(out, input, keys, &generated, i, &members[m as usize]);
            }
        }
    }

    #[inline(never)]
    fn array(&mut self, out: &mut Vec<u8>, level: usize, frame: Frame) -> Result<(), JsonError> {
        if level > MAX_DEPTH {
            return Err(JsonError::TooDeep);
        }
        self.pos += 1;
        out.push(b'[');
        self.skip_ws();
        if self.input.get(self.pos) == Some(&b']') {
            self.pos += 1;
            out.push(b']');
            return Ok(());
        }
        let mut index = 0;
        let mut emitted = false;
        loop {
            let live_mark = self.buffers.live.len();
            let (child, exact) = if frame.is_empty() {
                (Frame::NONE, false)
            } else {
                self.narrow(frame, level, Seg::Index(index))
            };
            if exact && self.extract.is_none() && self.skipping == 0 {
                if self.reporting() {
                    self.report(Seg::Index(index));
                }
                self.skip_value(out, level)?;
            } else {
                if emitted {
                    out.push(b',');
                }
                emitted = true;
                let start = out.len();
                let reporting = self.reporting();
                if reporting {
                    self.buffers.path.push(Seg::Index(index));
                }
                self.value(out, level, child)?;
                if reporting {
                    self.buffers.path.pop();
                }
                if exact {
                    self.store_extracted(&out[start..], child, level);
                }
            }
            self.buffers.live.truncate(live_mark);
            index += 1;

            self.skip_ws();
            match self.input.get(self.pos) {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_ws();
                }
                Some(b']') => {
                    self.pos += 1;
                    break;
                }
                _ => return self.invalid(),
            }
        }
        out.push(b']');
        Ok(())
    }

    fn number(&mut self, out: &mut Vec<u8>) -> Result<(), JsonError> {
        let input = self.input;
        let mut i = self.pos;
        let negative = input[i] == b'-';
        if negative {
            i += 1;
        }
        let int_start = i;
        match input.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => i = skip_digits(input, i + 1),
            _ => return Err(JsonError::Invalid(i)),
        }
        let int_end = i;
        let mut frac_start = i;
        if input.get(i) == Some(&b'.') {
            frac_start = i + 1;
            i = skip_digits(input, frac_start);
            if i == frac_start {
                return Err(JsonError::Invalid(i));
            }
        }
        let frac_end = i;
        let mut exponent: i64 = 0;
        if matches!(input.get(i), Some(b'e' | b'E')) {
            i += 1;
            let negative_exponent = match input.get(i) {
                Some(b'-') => {
                    i += 1;
                    true
                }
                Some(b'+') => {
                    i += 1;
                    false
                }
                _ => false,
            };
            let digits_start = i;
            while let Some(&d @ b'0'..=b'9') = input.get(i) {
                exponent = exponent * 10 + i64::from(d - b'0');
                if exponent >= MAX_EXPONENT {
                    return Err(JsonError::Invalid(i));
                }
                i += 1;
            }
            if i == digits_start {
                return Err(JsonError::Invalid(i));
            }
            if negative_exponent {
                exponent = -exponent;
            }
        }
        self.pos = i;

        // value = (int digits ++ frac digits) × 10^(exponent - frac length). Strict JSON gives the
        // integer part a leading zero only when it is exactly "0", so any further leading zeros
        // sit at the start of the fraction. Significant digits are copied straight from the input.
        let int_is_zero = input[int_start] == b'0';
        let mut frac_last = frac_end;
        while frac_last > frac_start && input[frac_last - 1] == b'0' {
            frac_last -= 1;
        }
        if frac_last > frac_start {
            exponent -= (frac_last - frac_start) as i64;
            if negative {
                out.push(b'-');
            }
            if int_is_zero {
                let mut first = frac_start;
                while input[first] == b'0' {
                    first += 1;
                }
                append(out, input, first, frac_last);
            } else {
                append(out, input, int_start, int_end);
                append(out, input, frac_start, frac_last);
            }
        } else if int_is_zero {
            out.push(b'0');
            return Ok(());
        } else {
            // The integer part starts with a non-zero digit, so this stops inside it.
            let mut int_last = int_end;
            while input[int_last - 1] == b'0' {
                int_last -= 1;
            }
            exponent += (int_end - int_last) as i64;
            if negative {
                out.push(b'-');
            }
            append(out, input, int_start, int_last);
        }
        out.push(b'e');
        push_exponent(out, exponent);
        Ok(())
    }
}

/// Canonical JSON of the value each pointer designates (`None` when absent), found in one pass
/// without building a tree.
///
/// Array indexes are decimal tokens without leading zeros (`"0"`, `"12"`; `"01"` and `"-"` match
/// nothing). The whole document is validated with the same rules and depth limit as
/// [`canonical_json`]: invalid JSON anywhere is an error even when every
/// pointer was already found. Extracted values use the canonical form with nothing ignored. When a
/// duplicate key makes a pointer ambiguous, the last occurrence wins, as in most JSON parsers.
///
/// ```rust
/// use idemgate::canonical::{extract_fields, JsonPointer};
///
/// let body = br#"{"order": {"id": 7, "lines": [{"b": 1, "a": 2.0}]}, "ts": 1}"#;
/// let pointers = [
///     JsonPointer::parse("/order/lines/0").unwrap(),
///     JsonPointer::parse("/order/id").unwrap(),
///     JsonPointer::parse("/missing").unwrap(),
/// ];
/// let found = extract_fields(body, &pointers).unwrap();
/// assert_eq!(found[0].as_deref(), Some(&br#"{"a":2e0,"b":1e0}"#[..]));
/// assert_eq!(found[1].as_deref(), Some(&b"7e0"[..]));
/// assert_eq!(found[2], None);
/// ```
pub fn extract_fields(
    input: &[u8],
    pointers: &[JsonPointer],
) -> Result<Vec<Option<Vec<u8>>>, JsonError> {
    let mut found = vec![None; pointers.len()];
    extract_into(input, pointers, &mut found)?;
    Ok(found)
}

#[cfg(test)]
mod tests;
