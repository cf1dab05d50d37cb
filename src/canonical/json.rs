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

/// The first 8 bytes of `key` as a big-endian number, zero-padded. Comparing prefixes orders keys
/// exactly like comparing the bytes whenever the prefixes differ: a padding zero can only differ
/// from a real non-zero byte of a longer key, which sorts after it anyway.
#[inline]
fn key_prefix(src: &[u8], start: usize, end: usize) -> u64 {
    let len = end - start;
    // Keys are almost always followed by at least 8 more bytes (`":` and a value), so one load
    // and a mask usually do.
    if let Some(window) = src.get(start..).and_then(<[u8]>::first_chunk::<8>) {
        let word = u64::from_be_bytes(*window);
        return if len >= 8 {
            word
        } else {
            word & !(u64::MAX >> (8 * len))
        };
    }
    let mut prefix = 0;
    for (i, &b) in src[start..end].iter().take(8).enumerate() {
        prefix |= u64::from(b) << (56 - 8 * i);
    }
    prefix
}

/// Appends `src[start..end]` to `out`. Most copies here are a few bytes long, where a call to
/// `memcpy` costs more than the copy: those move a fixed 32-byte window instead and drop the
/// excess.
#[inline(always)]
fn append(out: &mut Vec<u8>, src: &[u8], start: usize, end: usize) {
    let len = end - start;
    if len <= WINDOW {
        if let Some(window) = src.get(start..).and_then(<[u8]>::first_chunk::<WINDOW>) {
            let keep = out.len() + len;
            out.extend_from_slice(window);
            out.truncate(keep);
            return;
        }
    }
    out.extend_from_slice(&src[start..end]);
}

/// Width of the fixed copies made by [`append`].
const WINDOW: usize = 32;

/// Puts into `order` the indexes of `members` stably sorted by key, unless they are in key
/// order already, which is reported by returning `true`.
fn key_order(
    input: &[u8],
    keys: &[u8],
    members: &[Member],
    order: &mut Vec<u64>,
    wide: &mut Vec<u128>,
    shape: &mut Shape,
) -> bool {
    let full_order = |a: Key, b: Key| {
        a.prefix
            .cmp(&b.prefix)
            .then_with(|| key_bytes(input, keys, a).cmp(key_bytes(input, keys, b)))
    };
    if members
        .windows(2)
        .all(|w| full_order(w[0].key, w[1].key).is_le())
    {
        return true;
    }
    order.clear();
    // Equal prefixes in the same sequence sort the same way: `shape` only ever holds sequences
    // whose order the prefixes alone decide (no two sharing their first 7 bytes).
    if shape.prefixes.len() == members.len()
        && members
            .iter()
            .zip(&shape.prefixes)
            .all(|(m, &p)| m.key.prefix == p)
    {
        order.extend_from_slice(&shape.order);
        return false;
    }
    if members.len() <= 256 {
        // Sort plain u64s: the first 7 key bytes above the member index, which breaks ties and
        // so makes the unstable sort stable. (Moving u128s instead stalls on store forwarding.)
        order.extend(
            members
                .iter()
                .enumerate()
                .map(|(i, m)| (m.key.prefix & !0xFF) | i as u64),
        );
        order.sort_unstable();
        let shared_prefix = order.windows(2).any(|w| (w[0] ^ w[1]) >> 8 == 0);
        for o in order.iter_mut() {
            *o &= 0xFF;
        }
        if !shared_prefix {
            if members.len() <= MAX_SHAPE {
                shape.prefixes.clear();
                shape.prefixes.extend(members.iter().map(|m| m.key.prefix));
                shape.order.clone_from(order);
            }
            return false;
        }
    } else {
        wide.clear();
        wide.extend(
            members
                .iter()
                .enumerate()
                .map(|(i, m)| u128::from(m.key.prefix) << 64 | i as u128),
        );
        wide.sort_unstable();
        order.extend(wide.iter().map(|&w| w as u64));
    }
    // Members sharing their first 7 bytes may still differ further on: order each such run by
    // full key. Equal keys already sit in input order within a run and the sort is stable, so
    // duplicates keep their order.
    let short_prefix = |order: &[u64], k: usize| members[order[k] as usize].key.prefix >> 8;
    let mut run = 0;
    while run < order.len() {
        let prefix = short_prefix(order, run);
        let mut end = run + 1;
        while end < order.len() && short_prefix(order, end) == prefix {
            end += 1;
        }
        if end - run > 1 {
            order[run..end].sort_by(|&a, &b| {
                let (a, b) = (members[a as usize].key, members[b as usize].key);
                key_bytes(input, keys, a).cmp(key_bytes(input, keys, b))
            });
        }
        run = end;
    }
    false
}

/// The generated values of one object, moved out of the output while it is rewritten.
struct Generated<'g> {
    bytes: &'g [u8],
    /// Where `bytes` started in the output, which `Value::Generated` offsets count from.
    offset: usize,
}

/// Writes member `m`, the `i`th in key order, to `out`.
#[inline(always)]
fn emit_member(
    out: &mut Vec<u8>,
    input: &[u8],
    keys: &[u8],
    generated: &Generated<'_>,
    i: usize,
    m: &Member,
) {
    if i > 0 {
        out.push(b',');
    }
    if m.compact {
        if let Value::Input { start, end } = m.value {
            if start == m.key.end + 2 {
                // `"key":value` spelled compactly in the input: one copy.
                append(out, input, m.key.start - 1, end);
                return;
            }
        }
        append(out, input, m.key.start - 1, m.key.end + 2);
    } else {
        write_key(out, input, keys, m.key);
        out.push(b':');
    }
    match m.value {
        Value::Input { start, end } => append(out, input, start, end),
        Value::Generated { start, end } => append(
            out,
            generated.bytes,
            start - generated.offset,
            end - generated.offset,
        ),
    }
}

fn write_key(out: &mut Vec<u8>, input: &[u8], keys: &[u8], key: Key) {
    if key.decoded {
        out.push(b'"');
        push_escaped(out, &keys[key.start..key.end]);
        out.push(b'"');
    } else {
        append(out, input, key.start - 1, key.end + 1);
    }
}

fn key_bytes<'k>(input: &'k [u8], keys: &'k [u8], key: Key) -> &'k [u8] {
    if key.decoded {
        &keys[key.start..key.end]
    } else {
        &input[key.start..key.end]
    }
}

/// Whether a pointer token names array element `index`: decimal, no leading zeros.
fn token_is_index(token: &[u8], index: usize) -> bool {
    if token.is_empty() || (token.len() > 1 && token[0] == b'0') {
        return false;
    }
    let mut value: usize = 0;
    for &d in token {
        if !d.is_ascii_digit() {
            return false;
        }
        value = match value
            .checked_mul(10)
            .and_then(|v| v.checked_add(usize::from(d - b'0')))
        {
            Some(v) => v,
            None => return false,
        };
    }
    value == index
}

/// Returns the offset of the first non-digit at or after `i`.
#[inline(always)]
fn skip_digits(input: &[u8], mut i: usize) -> usize {
    // Eight bytes at a time: the digit count of a typical number is found without a loop whose
    // exit the branch predictor would have to guess per digit.
    while let Some(chunk) = input.get(i..).and_then(<[u8]>::first_chunk::<8>) {
        let word = u64::from_le_bytes(*chunk);
        let low7 = word & !HIGHS;
        let at_least_0 = low7.wrapping_add(ONES * (0x80 - b'0' as u64));
        let past_9 = low7.wrapping_add(ONES * (0x80 - b':' as u64));
        let non_digit = !(at_least_0 & !past_9 & !word) & HIGHS;
        if non_digit != 0 {
            return i + (non_digit.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while input.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    i
}

#[inline]
fn push_exponent(out: &mut Vec<u8>, value: i64) {
    // Most exponents are a single digit.
    match value {
        0..=9 => out.push(b'0' + value as u8),
        -9..=-1 => out.extend_from_slice(&[b'-', b'0' + value.unsigned_abs() as u8]),
        _ => push_i64(out, value),
    }
}

fn push_i64(out: &mut Vec<u8>, value: i64) {
    if value < 0 {
        out.push(b'-');
    }
    let mut n = value.unsigned_abs();
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[at..]);
}

/// Bytes that may appear raw inside a string and need no attention: printable ASCII except `"`
/// and `\`.
static PLAIN: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0x20;
    while b < 0x80 {
        table[b] = b != b'"' as usize && b != b'\\' as usize;
        b += 1;
    }
    table
};

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// High bit set in each byte lane of `v` that is `"`, `\`, a control character or non-ASCII.
/// Borrows in the arithmetic can only flag lanes above a genuine hit, so the lowest flag is exact.
#[inline]
fn special_lanes(v: u64) -> u64 {
    let quote = v ^ (ONES * u64::from(b'"'));
    let backslash = v ^ (ONES * u64::from(b'\\'));
    let zero_quote = quote.wrapping_sub(ONES) & !quote;
    let zero_backslash = backslash.wrapping_sub(ONES) & !backslash;
    let control = v.wrapping_sub(ONES * 0x20) & !v;
    (zero_quote | zero_backslash | control | v) & HIGHS
}

/// Scans string content from `i` to the first `"` or `\`, validating UTF-8 and rejecting raw
/// control characters; returns that byte's offset.
///
/// The all-ASCII case, nearly every key and most values, runs inline 8 bytes at a time; a
/// string longer than that goes to [`scan_plain_ascii_run`].
#[inline(always)]
fn scan_plain(input: &[u8], i: usize) -> Result<usize, JsonError> {
    if let Some(chunk) = input.get(i..).and_then(<[u8]>::first_chunk::<8>) {
        let lanes = special_lanes(u64::from_le_bytes(*chunk));
        if lanes == 0 {
            return scan_plain_ascii_run(input, i + 8);
        }
        let stop = i + (lanes.trailing_zeros() / 8) as usize;
        if matches!(input[stop], b'"' | b'\\') {
            return Ok(stop);
        }
        return scan_plain_long(input, stop);
    }
    scan_plain_long(input, i)
}

/// [`scan_plain`] for a long string (a note, a description, base64): finds the end with
/// memchr's SIMD search, then checks the run before it for control characters and non-ASCII
/// in one pass the compiler vectorizes. About three times fewer instructions per byte than the
/// 8-byte loop; a run that is not plain ASCII is scanned again by [`scan_plain_long`].
#[inline(never)]
fn scan_plain_ascii_run(input: &[u8], i: usize) -> Result<usize, JsonError> {
    let Some(len) = memchr::memchr2(b'"', b'\\', &input[i..]) else {
        return scan_plain_long(input, i);
    };
    let run = &input[i..i + len];
    // One pass without early exit, so it vectorizes: a byte outside 0x20..=0x7F (a control
    // character or part of a non-ASCII one) sets the flag.
    let special = run.iter().fold(0u8, |seen, &b| {
        seen | u8::from(b.wrapping_sub(0x20) >= 0x60)
    });
    if special == 0 {
        Ok(i + len)
    } else {
        scan_plain_long(input, i)
    }
}

/// [`scan_plain`] from a non-ASCII or control byte, or from the last few bytes of the input.
#[inline(never)]
fn scan_plain_long(input: &[u8], mut i: usize) -> Result<usize, JsonError> {
    loop {
        let b = loop {
            if let Some(chunk) = input.get(i..).and_then(<[u8]>::first_chunk::<8>) {
                let lanes = special_lanes(u64::from_le_bytes(*chunk));
                if lanes != 0 {
                    i += (lanes.trailing_zeros() / 8) as usize;
                    break input[i];
                }
                i += 8;
            } else {
                while input.get(i).is_some_and(|&b| PLAIN[usize::from(b)]) {
                    i += 1;
                }
                match input.get(i) {
                    Some(&b) => break b,
                    None => return Err(JsonError::Invalid(input.len())),
                }
            }
        };
        match b {
            b'"' | b'\\' => return Ok(i),
            0x80.. => i = skip_utf8(input, i)?,
            _ => return Err(JsonError::Invalid(i)),
        }
    }
}

/// Validates the multi-byte UTF-8 sequence starting at `i`; returns the offset after it.
#[inline]
fn skip_utf8(input: &[u8], i: usize) -> Result<usize, JsonError> {
    // Second-byte ranges exclude overlong forms, surrogates and code points above U+10FFFF.
    let (width, low, high) = match input[i] {
        0xC2..=0xDF => (2, 0x80, 0xBF),
        0xE0 => (3, 0xA0, 0xBF),
        0xE1..=0xEC | 0xEE..=0xEF => (3, 0x80, 0xBF),
        0xED => (3, 0x80, 0x9F),
        0xF0 => (4, 0x90, 0xBF),
        0xF1..=0xF3 => (4, 0x80, 0xBF),
        0xF4 => (4, 0x80, 0x8F),
        _ => return Err(JsonError::Invalid(i)),
    };
    match input.get(i + 1) {
        Some(&b) if (low..=high).contains(&b) => {}
        _ => return Err(JsonError::Invalid(i)),
    }
    for k in 2..width {
        match input.get(i + k) {
            Some(&b) if (0x80..=0xBF).contains(&b) => {}
            _ => return Err(JsonError::Invalid(i)),
        }
    }
    Ok(i + width)
}

/// Decodes string content from the backslash at `i` to the closing quote, appending it to `buf`
/// either canonically escaped (`canonical`) or fully unescaped; returns the offset after the quote.
fn decode_escaped(
    input: &[u8],
    mut i: usize,
    buf: &mut Vec<u8>,
    canonical: bool,
) -> Result<usize, JsonError> {
    loop {
        // Here input[i] is a backslash.
        let escape_start = i;
        let c = match input.get(i + 1) {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                let (c, next) = decode_unicode_escape(input, i)?;
                i = next - 2;
                c
            }
            _ => return Err(JsonError::Invalid(escape_start)),
        };
        i += 2;
        if canonical {
            push_escaped_char(buf, c);
        } else {
            let mut utf8 = [0u8; 4];
            buf.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
        }
        let stop = scan_plain(input, i)?;
        buf.extend_from_slice(&input[i..stop]);
        i = stop;
        if input[i] == b'"' {
            return Ok(i + 1);
        }
    }
}

/// Decodes `\uXXXX` (and its low-surrogate partner) at `i`; returns the char and the offset after.
fn decode_unicode_escape(input: &[u8], i: usize) -> Result<(char, usize), JsonError> {
    let high = hex4(input, i + 2).ok_or(JsonError::Invalid(i))?;
    let (code, next) = match high {
        0xD800..=0xDBFF => {
            if input.get(i + 6) != Some(&b'\\') || input.get(i + 7) != Some(&b'u') {
                return Err(JsonError::Invalid(i));
            }
            let low = hex4(input, i + 8).ok_or(JsonError::Invalid(i + 6))?;
            if !(0xDC00..=0xDFFF).contains(&low) {
                return Err(JsonError::Invalid(i + 6));
            }
            (0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00), i + 12)
        }
        0xDC00..=0xDFFF => return Err(JsonError::Invalid(i)),
        _ => (high, i + 6),
    };
    let c = char::from_u32(code).ok_or(JsonError::Invalid(i))?;
    Ok((c, next))
}

fn hex4(input: &[u8], i: usize) -> Option<u32> {
    let digits = input.get(i..i + 4)?;
    let mut value = 0;
    for &d in digits {
        value = value * 16 + char::from(d).to_digit(16)?;
    }
    Some(value)
}

fn push_escaped_char(out: &mut Vec<u8>, c: char) {
    if c.is_ascii() {
        push_escaped_byte(out, c as u8);
    } else {
        let mut utf8 = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
    }
}

#[inline]
fn push_escaped_byte(out: &mut Vec<u8>, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    match b {
        b'"' => out.extend_from_slice(b"\\\""),
        b'\\' => out.extend_from_slice(b"\\\\"),
        b'\n' => out.extend_from_slice(b"\\n"),
        b'\r' => out.extend_from_slice(b"\\r"),
        b'\t' => out.extend_from_slice(b"\\t"),
        0x08 => out.extend_from_slice(b"\\b"),
        0x0C => out.extend_from_slice(b"\\f"),
        0..=0x1F => out.extend_from_slice(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[usize::from(b >> 4)],
            HEX[usize::from(b & 0xF)],
        ]),
        _ => out.push(b),
    }
}

/// Appends already-unescaped string bytes with canonical (minimal) escaping.
fn push_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'"' || b == b'\\' || b < 0x20 {
            out.extend_from_slice(&bytes[run..i]);
            push_escaped_byte(out, b);
            run = i + 1;
        }
    }
    out.extend_from_slice(&bytes[run..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon_with(input: &[u8], ignore: &IgnoreSet) -> Result<String, JsonError> {
        let mut out = Vec::new();
        canonical_json(input, ignore, &mut out, None)?;
        Ok(String::from_utf8(out).expect("canonical output is UTF-8"))
    }

    fn canon(input: &str) -> String {
        canon_with(input.as_bytes(), &IgnoreSet::empty())
            .unwrap_or_else(|e| panic!("{e} in {input:?}"))
    }

    fn err(input: &[u8]) -> JsonError {
        canon_with(input, &IgnoreSet::empty()).unwrap_err()
    }

    fn ptr(s: &str) -> JsonPointer {
        JsonPointer::parse(s).unwrap()
    }

    fn explain(input: &str, ignore: &IgnoreSet) -> (String, Vec<String>) {
        let mut out = Vec::new();
        let mut ignored = Vec::new();
        canonical_json(input.as_bytes(), ignore, &mut out, Some(&mut ignored)).unwrap();
        (String::from_utf8(out).unwrap(), ignored)
    }

    #[test]
    fn key_order_does_not_change_canonical_form() {
        let a = canon(r#"{"b":1,"a":{"y":true,"x":null},"c":[3,2]}"#);
        let b = canon(r#"{"c":[3,2],"a":{"x":null,"y":true},"b":1}"#);
        assert_eq!(a, b);
        assert_eq!(a, r#"{"a":{"x":null,"y":true},"b":1e0,"c":[3e0,2e0]}"#);
    }

    #[test]
    fn whitespace_does_not_change_canonical_form() {
        let pretty = "\r\n{\n\t\"a\" :  [ 1 , {\"b\"\t:\"x y\" } ] ,\"c\":{ } , \"d\" : [ ]\n}\n ";
        assert_eq!(canon(pretty), r#"{"a":[1e0,{"b":"x y"}],"c":{},"d":[]}"#);
        assert_eq!(
            canon(pretty),
            canon(r#"{"a":[1,{"b":"x y"}],"c":{},"d":[]}"#)
        );
    }

    #[test]
    fn array_order_is_significant() {
        assert_ne!(canon("[1,2]"), canon("[2,1]"));
    }

    #[test]
    fn number_spellings_of_one_value_are_equal() {
        for spelling in [
            "1", "1.0", "10e-1", "1E0", "1e+0", "1e-0", "0.1e1", "100e-2", "1.000",
        ] {
            assert_eq!(canon(spelling), "1e0", "{spelling}");
        }
    }

    #[test]
    fn numbers_normalize_to_significant_digits_and_exponent() {
        let cases = [
            ("1.50", "15e-1"),
            ("100", "1e2"),
            ("1e0", "1e0"),
            ("10E-1", "1e0"),
            ("-2.5e+3", "-25e2"),
            ("0.001", "1e-3"),
            ("0.0010", "1e-3"),
            ("120.0300", "12003e-2"),
            ("-7", "-7e0"),
            ("1e007", "1e7"),
            (
                "123456789012345678901234567890",
                "12345678901234567890123456789e1",
            ),
            ("0.000000000000000000000000000001", "1e-30"),
            ("2.5e-400", "25e-401"),
            ("1e999999999999999", "1e999999999999999"),
            ("1.5e-999999999999999", "15e-1000000000000000"),
        ];
        for (input, expected) in cases {
            assert_eq!(canon(input), expected, "{input}");
        }
    }

    #[test]
    fn every_zero_is_plain_zero() {
        for spelling in ["0", "-0", "0.0", "-0.000", "0e5", "0E-7", "-0.0e+3"] {
            assert_eq!(canon(spelling), "0", "{spelling}");
        }
    }

    #[test]
    fn distinct_numbers_stay_distinct() {
        let distinct = ["1", "-1", "1.1", "10", "0.1", "11", "1e1000", "1e-1000"];
        for (i, a) in distinct.iter().enumerate() {
            for b in &distinct[i + 1..] {
                assert_ne!(canon(a), canon(b), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn absurd_exponents_are_rejected_rather_than_saturated() {
        assert_eq!(err(b"1e1000000000000000"), JsonError::Invalid(17));
        assert!(matches!(
            err(b"[1e-99999999999999999999]"),
            JsonError::Invalid(_)
        ));
    }

    #[test]
    fn number_grammar_is_strict() {
        for bad in [
            "01",
            "-01",
            "00",
            ".5",
            "+1",
            "1.",
            "-",
            "-a",
            "1e",
            "1e+",
            "1E-",
            "NaN",
            "Infinity",
            "-Infinity",
            "0x10",
            "1.5.2",
            "--1",
            "1.e5",
            "[1,-]",
            "[.1]",
        ] {
            assert!(
                matches!(err(bad.as_bytes()), JsonError::Invalid(_)),
                "{bad} should be invalid"
            );
        }
    }

    #[test]
    fn unicode_escapes_equal_their_characters() {
        assert_eq!(canon(r#""\u0041""#), canon(r#""A""#));
        assert_eq!(canon(r#""\u00e9\u00E9""#), "\"éé\"");
        assert_eq!(canon(r#""\ud83d\ude00""#), "\"😀\"");
        assert_eq!(canon(r#""\uD83D\uDE00""#), canon("\"😀\""));
        assert_eq!(canon(r#""a\/b""#), "\"a/b\"");
        assert_eq!(canon(r#""\u20ac""#), "\"€\"");
    }

    #[test]
    fn strings_are_re_escaped_minimally() {
        assert_eq!(canon(r#""\u000a\u000D\u0009""#), r#""\n\r\t""#);
        assert_eq!(canon(r#""\u0008\u000c""#), r#""\b\f""#);
        assert_eq!(canon(r#""\u0001\u001F""#), r#""\u0001\u001f""#);
        assert_eq!(canon(r#""\u0022\u005C""#), r#""\"\\""#);
        assert_eq!(canon(r#""\"\\""#), r#""\"\\""#);
        assert_eq!(canon(r#""\u007f""#), "\"\u{7f}\"");
        assert_eq!(canon(r#""x\ty""#), r#""x\ty""#);
    }

    #[test]
    fn strings_without_escapes_are_copied_verbatim() {
        let s = "\"plain ASCII, ünïcødé, 😀 and DEL \u{7f} — long enough to cross several words\"";
        assert_eq!(canon(s), s);
    }

    /// Long strings take the memchr path: a raw control character, a non-ASCII character,
    /// bad UTF-8, an escape or a missing quote must be found at every position there as in
    /// the 8-byte loop.
    #[test]
    fn long_strings_are_checked_at_every_position() {
        let ok =
            |doc: &[u8]| canonical_json(doc, &IgnoreSet::default(), &mut Vec::new(), None).is_ok();
        for len in [9, 15, 16, 17, 31, 32, 33, 100] {
            for at in 0..len {
                let plain = "a".repeat(len);
                let quoted = format!("\"{plain}\"");
                assert_eq!(canon(&quoted), quoted);
                assert!(!ok(&quoted.as_bytes()[..len + 1]), "unterminated, {len}");

                for control in [0x00, 0x09, 0x0a, 0x1f] {
                    let mut doc = quoted.clone().into_bytes();
                    doc[1 + at] = control;
                    assert!(!ok(&doc), "raw {control:#x} at {at} of {len}");
                }

                let accented = format!("\"{}é{}\"", &plain[..at], &plain[at + 1..]);
                assert_eq!(canon(&accented), accented);
                let mut broken = accented.clone().into_bytes();
                broken[2 + at] = b'a'; // the lead byte 0xC3 followed by ASCII
                assert!(!ok(&broken), "bad UTF-8 at {at} of {len}");

                let escaped = format!("\"{}\\u0041{}\"", &plain[..at], &plain[at..]);
                let expected = format!("\"{}A{}\"", &plain[..at], &plain[at..]);
                assert_eq!(canon(&escaped), expected);
            }
        }
    }

    #[test]
    fn keys_are_unescaped_before_comparison_and_sorting() {
        assert_eq!(canon(r#"{"\u0062":1,"a":2}"#), r#"{"a":2e0,"b":1e0}"#);
        // Unescaped '"' (0x22) sorts before '#' (0x23) even though its escape '\' (0x5C) would not.
        assert_eq!(canon(r#"{"a#":1,"a\"":2}"#), r#"{"a\"":2e0,"a#":1e0}"#);
        assert_eq!(
            canon(r#"{"\u00e9":1,"z":2,"\n":3}"#),
            r#"{"\n":3e0,"z":2e0,"é":1e0}"#
        );
    }

    #[test]
    fn keys_sort_by_bytes_not_by_length_or_case() {
        assert_eq!(
            canon(r#"{"b":0,"B":0,"aa":0,"a":0,"":0}"#),
            r#"{"":0,"B":0,"a":0,"aa":0,"b":0}"#
        );
    }

    #[test]
    fn duplicate_keys_are_kept_in_input_order() {
        assert_eq!(
            canon(r#"{"a":2,"b":0,"a":1}"#),
            r#"{"a":2e0,"a":1e0,"b":0}"#
        );
        assert_ne!(canon(r#"{"a":1,"a":2}"#), canon(r#"{"a":2,"a":1}"#));
    }

    #[test]
    fn large_duplicate_runs_keep_their_order() {
        let mut input = String::from("{");
        for i in 0..2000 {
            if i > 0 {
                input.push(',');
            }
            input.push_str(&format!(r#""k":{i},"j":{i}"#));
        }
        input.push('}');
        let mut expected = String::from("{");
        for key in ["j", "k"] {
            for i in 0..2000 {
                if expected.len() > 1 {
                    expected.push(',');
                }
                let n = canon(&i.to_string());
                expected.push_str(&format!(r#""{key}":{n}"#));
            }
        }
        expected.push('}');
        assert_eq!(canon(&input), expected);
    }

    #[test]
    fn nested_objects_are_sorted_independently() {
        assert_eq!(
            canon(r#"{"z":{"d":1,"c":{"f":1,"e":2}},"y":[{"b":1,"a":2},{"d":1,"c":2}]}"#),
            r#"{"y":[{"a":2e0,"b":1e0},{"c":2e0,"d":1e0}],"z":{"c":{"e":2e0,"f":1e0},"d":1e0}}"#
        );
    }

    #[test]
    fn literals_and_top_level_scalars_are_kept() {
        assert_eq!(canon("true"), "true");
        assert_eq!(canon(" false "), "false");
        assert_eq!(canon("null"), "null");
        assert_eq!(canon(r#""s""#), r#""s""#);
        assert_eq!(canon("[true,false,null]"), "[true,false,null]");
    }

    #[test]
    fn leading_byte_order_mark_is_skipped() {
        assert_eq!(
            canon_with(b"\xEF\xBB\xBF{\"a\":1}", &IgnoreSet::empty()).unwrap(),
            r#"{"a":1e0}"#
        );
    }

    #[test]
    fn ignored_names_are_skipped_at_any_depth_and_case_insensitively() {
        let input =
            r#"{"a":{"b":[{"TimeStamp":1,"x":2}]},"ts":3,"GEO":{"lat":1},"keep":{"LNG":1}}"#;
        assert_eq!(
            canon_with(input.as_bytes(), &IgnoreSet::defaults()).unwrap(),
            r#"{"a":{"b":[{"x":2e0}]},"keep":{}}"#
        );
    }

    #[test]
    fn ignored_names_match_escaped_keys_after_unescaping() {
        assert_eq!(
            canon_with(br#"{"t\u0073":1,"a":2}"#, &IgnoreSet::defaults()).unwrap(),
            r#"{"a":2e0}"#
        );
    }

    #[test]
    fn ignoring_a_field_makes_requests_that_differ_only_there_equal() {
        let ignore = IgnoreSet::defaults();
        let a = canon_with(br#"{"sku":"x","timestamp":"2024-01-01"}"#, &ignore).unwrap();
        let b = canon_with(br#"{"timestamp":"2025-12-31","sku":"x"}"#, &ignore).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn ignored_values_are_still_validated() {
        let ignore = IgnoreSet::defaults();
        assert!(canon_with(br#"{"ts":[1,],"a":1}"#, &ignore).is_err());
        assert!(canon_with(br#"{"ts":"\ud800","a":1}"#, &ignore).is_err());
        let deep = format!(r#"{{"ts":{}}}"#, "[".repeat(10_000));
        assert_eq!(
            canon_with(deep.as_bytes(), &ignore),
            Err(JsonError::TooDeep)
        );
    }

    #[test]
    fn ignore_by_pointer_applies_only_at_that_path() {
        let ignore = IgnoreSet::new(Vec::<String>::new(), vec![ptr("/a/id")]);
        assert_eq!(
            canon_with(
                br#"{"a":{"id":1,"b":{"id":2}},"id":3,"c":{"a":{"id":4}}}"#,
                &ignore
            )
            .unwrap(),
            r#"{"a":{"b":{"id":2e0}},"c":{"a":{"id":4e0}},"id":3e0}"#
        );
    }

    #[test]
    fn ignore_by_pointer_matches_escaped_tokens_and_array_elements() {
        let ignore = IgnoreSet::new(
            Vec::<String>::new(),
            vec![ptr("/a~1b"), ptr("/items/1"), ptr("/items/2/x")],
        );
        assert_eq!(
            canon_with(
                br#"{"a/b":1,"a":{"b":2},"items":[{"x":0},{"x":1},{"x":2,"y":2}]}"#,
                &ignore
            )
            .unwrap(),
            r#"{"a":{"b":2e0},"items":[{"x":0},{"y":2e0}]}"#
        );
    }

    #[test]
    fn root_pointer_never_skips_the_document() {
        let ignore = IgnoreSet::new(Vec::<String>::new(), vec![ptr("")]);
        assert_eq!(canon_with(b"[1]", &ignore).unwrap(), "[1e0]");
    }

    #[test]
    fn ignored_list_names_each_skipped_path_in_input_order() {
        let ignore = IgnoreSet::new(
            DEFAULT_NAMES_FOR_TESTS.iter().copied(),
            vec![ptr("/meta/request~1id"), ptr("/items/1")],
        );
        let input = r#"{
            "items": [{"sku": "a", "ts": 1}, {"sku": "b"}, {"sku": "c", "Lat": 2}],
            "meta": {"request/id": "r1", "geo": {"lat": 1, "lng": 2}},
            "a~b": {"nonce": 5},
            "TIME": 0
        }"#;
        let (out, ignored) = explain(input, &ignore);
        assert_eq!(
            out,
            r#"{"a~b":{},"items":[{"sku":"a"},{"sku":"c"}],"meta":{}}"#
        );
        assert_eq!(
            ignored,
            [
                "/items/0/ts",
                "/items/1",
                "/items/2/Lat",
                "/meta/request~1id",
                "/meta/geo",
                "/a~0b/nonce",
                "/TIME"
            ]
        );
    }

    const DEFAULT_NAMES_FOR_TESTS: &[&str] = crate::canonical::DEFAULT_IGNORED_FIELDS;

    #[test]
    fn reporting_ignored_fields_does_not_change_the_output() {
        let ignore = IgnoreSet::new(["ts"], vec![ptr("/a/0")]);
        let input = r#"{"a":[{"ts":1},2],"b":{"ts":{"x":1}},"c":"\u0041"}"#;
        let (explained, _) = explain(input, &ignore);
        assert_eq!(canon_with(input.as_bytes(), &ignore).unwrap(), explained);
    }

    #[test]
    fn invalid_json_is_rejected() {
        let cases: &[&[u8]] = &[
            b"",
            b"   ",
            b"{\"a\":1,}",
            b"[1,2,]",
            b"[,1]",
            b"{'a':1}",
            b"['a']",
            b"01",
            b"\"unterminated",
            b"{\"a\":\"unterminated}",
            b"\"\\ud800\"",
            b"\"\\udc00\"",
            b"\"\\ud800\\u0041\"",
            b"\"\\ud800x\"",
            b"\"tab\there\"",
            b"\"nl\nhere\"",
            b"{\"a\":1} x",
            b"{\"a\":1}}",
            b"[1]]",
            b"1 2",
            b"{\"a\" 1}",
            b"{\"a\":1 \"b\":2}",
            b"{a:1}",
            b"{\"a\"}",
            b"{\"a\":}",
            b"\"\\x\"",
            b"\"\\u12\"",
            b"\"\\u12g4\"",
            b"\"\\",
            b"tru",
            b"nul",
            b"True",
            b"[",
            b"{",
            b"\"\xff\"",
            b"\"\xc0\x80\"",
            b"\"\xed\xa0\x80\"",
            b"\"\xe2\x82\"",
            b"\"\xf4\x90\x80\x80\"",
            b"\"\x80\"",
            b"[1]\x00",
        ];
        for &input in cases {
            assert!(
                matches!(err(input), JsonError::Invalid(_)),
                "{:?} should be invalid",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn invalid_reports_the_offending_offset() {
        assert_eq!(err(b"[1,]"), JsonError::Invalid(3));
        assert_eq!(err(b"{\"a\":1} x"), JsonError::Invalid(8));
        assert_eq!(err(b"\"ab\x01\""), JsonError::Invalid(3));
        assert_eq!(err(b"\"abc"), JsonError::Invalid(4));
        assert_eq!(err(b""), JsonError::Invalid(0));
    }

    #[test]
    fn output_is_appended_and_restored_on_error() {
        let mut out = b"prefix:".to_vec();
        canonical_json(b"[1]", &IgnoreSet::empty(), &mut out, None).unwrap();
        assert_eq!(out, b"prefix:[1e0]");
        let before = out.clone();
        assert!(canonical_json(b"{\"a\":[1,2", &IgnoreSet::empty(), &mut out, None).is_err());
        assert_eq!(out, before);
    }

    #[test]
    fn nesting_up_to_max_depth_is_accepted() {
        let input = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(canon(&input), input);
        let mut objects = String::new();
        for _ in 0..MAX_DEPTH {
            objects.push_str("{\"a\":");
        }
        objects.push('1');
        objects.push_str(&"}".repeat(MAX_DEPTH));
        assert!(canon_with(objects.as_bytes(), &IgnoreSet::empty()).is_ok());
    }

    #[test]
    fn nesting_beyond_max_depth_is_too_deep() {
        let input = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(err(input.as_bytes()), JsonError::TooDeep);
        let mut objects = String::new();
        for _ in 0..=MAX_DEPTH {
            objects.push_str("{\"a\":");
        }
        assert_eq!(err(objects.as_bytes()), JsonError::TooDeep);
    }

    #[test]
    fn ten_thousand_deep_array_is_too_deep_without_crashing() {
        let input = "[".repeat(10_000);
        assert_eq!(err(input.as_bytes()), JsonError::TooDeep);
        let closed = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert_eq!(err(closed.as_bytes()), JsonError::TooDeep);
    }

    #[test]
    fn max_depth_nesting_fits_in_a_small_thread_stack() {
        // Recursion is bounded by MAX_DEPTH; this pins down that its frames stay small enough
        // for worker threads (tokio's default stack is 2 MiB). Unoptimized, as tests run, the
        // full depth needs about 400 KiB; optimized, under 48 KiB.
        let mut input = String::new();
        for i in 0..MAX_DEPTH {
            input.push_str(if i % 2 == 0 { "{\"k\":" } else { "[" });
        }
        input.push('1');
        for i in (0..MAX_DEPTH).rev() {
            input.push(if i % 2 == 0 { '}' } else { ']' });
        }
        let worker = std::thread::Builder::new()
            .stack_size(1024 * 1024)
            .spawn(move || {
                let deeper = format!("[{input}]");
                (canon(&input), err(deeper.as_bytes()))
            })
            .unwrap();
        let (ok, too_deep) = worker.join().unwrap();
        assert!(ok.starts_with(r#"{"k":[{"k":"#) && ok.contains("[1e0]"));
        assert_eq!(too_deep, JsonError::TooDeep);
    }

    #[test]
    fn token_index_requires_plain_decimal() {
        assert!(token_is_index(b"0", 0));
        assert!(token_is_index(b"12", 12));
        assert!(!token_is_index(b"012", 12));
        assert!(!token_is_index(b"", 0));
        assert!(!token_is_index(b"-", 0));
        assert!(!token_is_index(b"1a", 1));
        assert!(!token_is_index(b"99999999999999999999999", 0));
    }

    /// Renders `members` the way the canonical form must: stably sorted by key bytes.
    fn reference_object(members: &[(String, u32)]) -> String {
        let mut sorted: Vec<&(String, u32)> = members.iter().collect();
        sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let body: Vec<String> = sorted
            .iter()
            .map(|(k, v)| format!("\"{k}\":{}", canon(&v.to_string())))
            .collect();
        format!("{{{}}}", body.join(","))
    }

    fn render_object(members: &[(String, u32)]) -> String {
        let body: Vec<String> = members
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        format!("{{{}}}", body.join(","))
    }

    #[test]
    fn member_order_matches_a_reference_stable_sort() {
        // Keys from a tiny alphabet share long prefixes, collide, repeat and run past 8 bytes,
        // which exercises the prefix sort, its refinement and the remembered shapes.
        let mut rng = Rng(7);
        for round in 0..300 {
            let size = match round % 4 {
                0 => rng.below(4) as usize,
                1 => rng.below(20) as usize,
                2 => rng.below(70) as usize,
                _ => 250 + rng.below(60) as usize,
            };
            let members: Vec<(String, u32)> = (0..size)
                .map(|i| {
                    let len = rng.below(12) as usize;
                    let key: String = (0..len)
                        .map(|_| ['a', 'b', '0'][rng.below(3) as usize])
                        .collect();
                    (key, i as u32)
                })
                .collect();
            let expected = reference_object(&members);
            let input = render_object(&members);
            assert_eq!(canon(&input), expected, "{input}");
            // Again, and as several like objects in an array: the remembered order must hold.
            assert_eq!(canon(&input), expected, "{input}");
            let array = format!("[{input},{input},{input}]");
            assert_eq!(canon(&array), format!("[{expected},{expected},{expected}]"));
        }
    }

    #[test]
    fn remembered_order_is_not_reused_for_keys_differing_past_eight_bytes() {
        let first = canon(r#"[{"zzzzzzzzB":1,"zzzzzzzzA":2},{"zzzzzzzzA":3,"zzzzzzzzB":4}]"#);
        assert_eq!(
            first,
            r#"[{"zzzzzzzzA":2e0,"zzzzzzzzB":1e0},{"zzzzzzzzA":3e0,"zzzzzzzzB":4e0}]"#
        );
        // Same 8-byte prefixes in the same positions as a remembered shape, other tails.
        assert_eq!(canon(r#"{"b":1,"a":2}"#), r#"{"a":2e0,"b":1e0}"#);
        assert_eq!(canon(r#"{"b1":1,"a":2}"#), r#"{"a":2e0,"b1":1e0}"#);
        assert_eq!(canon(r#"{"b":1,"a1":2}"#), r#"{"a1":2e0,"b":1e0}"#);
    }

    #[test]
    fn remembered_order_needs_every_prefix_byte_and_member_count_to_match() {
        // Keys differing in one late byte: the first object's order is remembered, and the
        // second, out of order differently, must not borrow it.
        for (a, b, c) in [
            ("xxxxxxa", "xxxxxxb", "xxxxxxc"),
            ("xxxxxxxa", "xxxxxxxb", "xxxxxxxc"),
            ("a", "b", "c"),
        ] {
            let input = format!(r#"[{{"{c}":1,"{a}":2,"{b}":3}},{{"{b}":4,"{c}":5,"{a}":6}}]"#);
            let expected =
                format!(r#"[{{"{a}":2e0,"{b}":3e0,"{c}":1e0}},{{"{a}":6e0,"{b}":4e0,"{c}":5e0}}]"#);
            assert_eq!(canon(&input), expected);
        }
        assert_eq!(
            canon(r#"[{"ab":1,"aa":2},{"aa":3,"ab":4}]"#),
            r#"[{"aa":2e0,"ab":1e0},{"aa":3e0,"ab":4e0}]"#
        );
        assert_eq!(
            canon(r#"[{"b":1,"a":2,"c":3},{"b":1,"a":2},{"b":1,"a":2,"c":3,"d":4}]"#),
            r#"[{"a":2e0,"b":1e0,"c":3e0},{"a":2e0,"b":1e0},{"a":2e0,"b":1e0,"c":3e0,"d":4e0}]"#
        );
    }

    #[test]
    fn keys_with_nul_bytes_sort_after_their_prefixes() {
        assert_eq!(
            canon(r#"{"a\u0000":1,"a":2,"a\u0000\u0000":3}"#),
            r#"{"a":2e0,"a\u0000":1e0,"a\u0000\u0000":3e0}"#
        );
    }

    #[test]
    fn fresh_output_buffer_gets_the_same_bytes() {
        let input = r#"{"b":[1,2,{"d":"x","c":null}],"a":"y"}"#;
        let mut reused = Vec::with_capacity(4);
        canonical_json(input.as_bytes(), &IgnoreSet::empty(), &mut reused, None).unwrap();
        assert_eq!(reused, canon(input).as_bytes());
    }

    /// Hand-written documents covering the grammar; none has duplicate keys or numbers beyond f64
    /// precision, so serde_json can serve as an independent reference.
    const DOCS: &[&str] = &[
        "null",
        "true",
        "0",
        "-0.0",
        "3.14159",
        "1e300",
        "-2.5E-7",
        "123456789",
        r#""""#,
        r#""plain""#,
        r#""esc \" \\ \/ \b \f \n \r \t""#,
        r#""\u0000\u001f\u007f\u0080\uffff""#,
        r#""\ud834\udd1e and 𝄞""#,
        "\"ünïcødé ✓ 中文\"",
        "[]",
        "{}",
        "[[], {}, [[]], {\"\": {}}]",
        r#"{"b": 1, "a": 2, "c": 3}"#,
        r#"{"nested": {"z": [1, 2, {"y": null, "x": false}], "a": "s"}}"#,
        r#"[1, 1.0, 10e-1, 0.1e1, 100, 1e2, 0.001, -0]"#,
        r#"{"\u00e9": 1, "e": 2, "\u0065\u0301": 3}"#,
        r#"{"a\"b": 1, "a#b": 2, "a!b": 3, "a\\b": 4}"#,
        r#"{"order": {"id": "o-1", "items": [{"sku": "A", "qty": 2, "price": 9.99}], "total": 19.98}}"#,
        r#"{"k": "\n", "K": "\t", "kk": "\u2028\u2029"}"#,
        "  {  \"spaced\"  :  [  1  ,  2  ]  }  ",
        r#"[{"a": [{"b": [{"c": [{"d": []}]}]}]}]"#,
        r#"{"num": 6.02214076e23, "small": 1.25e-10, "neg": -273.15}"#,
        r#"{"": "", " ": " ", "  ": "  "}"#,
        r#"["\/", "/", "\u002f"]"#,
        r#"{"emoji": "😀", "escaped": "\ud83d\ude00"}"#,
        r#"{"z": 0, "y": 0.0, "x": -0, "w": 0e10}"#,
        r#"[true, false, null, "true", "null"]"#,
        "{\"big\": [1e-300, 9007199254740993, 18446744073709551615]}",
    ];

    /// serde_json (without `arbitrary_precision`) rounds such numbers through `f64`; we don't.
    fn beyond_f64(doc: &str) -> bool {
        doc.contains("9007199254740993")
    }

    #[test]
    fn canonical_form_is_idempotent() {
        for doc in DOCS {
            let once = canon(doc);
            assert_eq!(canon(&once), once, "{doc}");
        }
    }

    #[test]
    fn canonical_output_is_valid_json_for_serde() {
        for doc in DOCS {
            let once = canon(doc);
            let value: serde_json::Value = serde_json::from_str(&once)
                .unwrap_or_else(|e| panic!("{once} rejected by serde_json: {e}"));
            if beyond_f64(doc) {
                continue;
            }
            // Re-canonicalizing serde_json's own spelling of our output lands on our output again.
            assert_eq!(canon(&value.to_string()), once, "{doc}");
        }
    }

    #[test]
    fn serde_json_spelling_of_the_input_has_the_same_canonical_form() {
        for doc in DOCS {
            let value: serde_json::Value = serde_json::from_str(doc).unwrap();
            if beyond_f64(doc) {
                continue;
            }
            assert_eq!(canon(&value.to_string()), canon(doc), "{doc}");
        }
    }

    #[test]
    fn serde_json_agrees_on_what_is_valid() {
        let mut inputs: Vec<Vec<u8>> = DOCS.iter().map(|d| d.as_bytes().to_vec()).collect();
        for bad in [
            "[1,]",
            "{\"a\" 1}",
            "01",
            "\"\\ud800\"",
            "[1] 2",
            "{\"a\":1,}",
            "\"\t\"",
        ] {
            inputs.push(bad.as_bytes().to_vec());
        }
        for input in inputs {
            let ours = canon_with(&input, &IgnoreSet::empty()).is_ok();
            let theirs = serde_json::from_slice::<serde_json::Value>(&input).is_ok();
            assert_eq!(ours, theirs, "{}", String::from_utf8_lossy(&input));
        }
    }

    /// Deterministic generator of documents and of different spellings of the same document.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % n
        }

        fn chance(&mut self, in_n: u64) -> bool {
            self.below(in_n) == 0
        }
    }

    enum Node {
        Null,
        Bool(bool),
        Num {
            negative: bool,
            digits: u64,
            exponent: i64,
        },
        Str(String),
        Arr(Vec<Node>),
        Obj(Vec<(String, Node)>),
    }

    const CHARS: &[char] = &[
        'a', 'b', 'Z', '0', ' ', '"', '\\', '/', '\n', '\t', '\u{1}', '\u{1f}', '\u{7f}', 'é', '€',
        '😀', '\u{2028}',
    ];

    fn gen_string(rng: &mut Rng) -> String {
        (0..rng.below(6))
            .map(|_| CHARS[rng.below(CHARS.len() as u64) as usize])
            .collect()
    }

    fn gen_node(rng: &mut Rng, depth: u32) -> Node {
        let kinds = if depth >= 4 { 4 } else { 6 };
        match rng.below(kinds) {
            0 => Node::Null,
            1 => Node::Bool(rng.chance(2)),
            2 => {
                let digits = match rng.below(3) {
                    0 => 0,
                    1 => rng.below(1000),
                    _ => rng.below(u64::MAX >> 12),
                };
                // Trailing zeros belong to the exponent, so each value has one representation.
                let digits = if digits % 10 == 0 && digits != 0 {
                    digits + 1
                } else {
                    digits
                };
                Node::Num {
                    negative: rng.chance(2),
                    digits,
                    exponent: rng.below(41) as i64 - 20,
                }
            }
            3 => Node::Str(gen_string(rng)),
            4 => Node::Arr(
                (0..rng.below(5))
                    .map(|_| gen_node(rng, depth + 1))
                    .collect(),
            ),
            _ => {
                let mut members: Vec<(String, Node)> = Vec::new();
                for _ in 0..rng.below(6) {
                    let key = gen_string(rng);
                    if members.iter().all(|(k, _)| *k != key) {
                        members.push((key, gen_node(rng, depth + 1)));
                    }
                }
                Node::Obj(members)
            }
        }
    }

    fn ws(rng: &mut Rng, out: &mut String) {
        for _ in 0..rng.below(3) {
            out.push([' ', '\n', '\t', '\r'][rng.below(4) as usize]);
        }
    }

    fn spell_string(rng: &mut Rng, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            let must_escape = c == '"' || c == '\\' || (c as u32) < 0x20;
            if !must_escape && rng.chance(2) {
                out.push(c);
                continue;
            }
            match c {
                '"' if rng.chance(2) => out.push_str("\\\""),
                '\\' if rng.chance(2) => out.push_str("\\\\"),
                '/' if rng.chance(2) => out.push_str("\\/"),
                '\n' if rng.chance(2) => out.push_str("\\n"),
                '\t' if rng.chance(2) => out.push_str("\\t"),
                _ => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        if rng.chance(2) {
                            out.push_str(&format!("\\u{unit:04x}"));
                        } else {
                            out.push_str(&format!("\\u{unit:04X}"));
                        }
                    }
                }
            }
        }
        out.push('"');
    }

    fn spell_number(rng: &mut Rng, negative: bool, digits: u64, exponent: i64, out: &mut String) {
        if negative && (digits != 0 || rng.chance(2)) {
            out.push('-');
        }
        if digits == 0 {
            out.push('0');
            if rng.chance(2) {
                out.push_str(&".000"[..2 + rng.below(3) as usize]);
            }
            if rng.chance(2) {
                out.push_str(&format!("e{}", rng.below(20)));
            }
            return;
        }
        let zeros = rng.below(3) as usize;
        let mut all = digits.to_string();
        all.push_str(&"0".repeat(zeros));
        let mut exponent = exponent - zeros as i64;
        if rng.chance(3) {
            // 0.000ddd form.
            let lead = rng.below(3) as usize;
            out.push_str("0.");
            out.push_str(&"0".repeat(lead));
            out.push_str(&all);
            exponent += (lead + all.len()) as i64;
        } else {
            let point = 1 + rng.below(all.len() as u64) as usize;
            out.push_str(&all[..point]);
            if point < all.len() {
                out.push('.');
                out.push_str(&all[point..]);
            }
            exponent += (all.len() - point) as i64;
        }
        if exponent != 0 || rng.chance(2) {
            out.push(if rng.chance(2) { 'e' } else { 'E' });
            if exponent >= 0 && rng.chance(2) {
                out.push('+');
            }
            out.push_str(&exponent.to_string());
        }
    }

    fn spell(rng: &mut Rng, node: &Node, out: &mut String) {
        ws(rng, out);
        match node {
            Node::Null => out.push_str("null"),
            Node::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Node::Num {
                negative,
                digits,
                exponent,
            } => spell_number(rng, *negative, *digits, *exponent, out),
            Node::Str(s) => spell_string(rng, s, out),
            Node::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    spell(rng, item, out);
                }
                ws(rng, out);
                out.push(']');
            }
            Node::Obj(members) => {
                let mut order: Vec<usize> = (0..members.len()).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.below(i as u64 + 1) as usize);
                }
                out.push('{');
                for (n, &i) in order.iter().enumerate() {
                    if n > 0 {
                        out.push(',');
                    }
                    ws(rng, out);
                    spell_string(rng, &members[i].0, out);
                    ws(rng, out);
                    out.push(':');
                    spell(rng, &members[i].1, out);
                }
                ws(rng, out);
                out.push('}');
            }
        }
        ws(rng, out);
    }

    #[test]
    fn random_spellings_of_one_document_canonicalize_equal() {
        let mut rng = Rng(42);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..400 {
            let doc = gen_node(&mut rng, 0);
            let mut first = String::new();
            spell(&mut rng, &doc, &mut first);
            let canonical = canon(&first);
            for _ in 0..4 {
                let mut other = String::new();
                spell(&mut rng, &doc, &mut other);
                assert_eq!(canon(&other), canonical, "{first}\n{other}");
            }
            assert_eq!(canon(&canonical), canonical);
            assert!(serde_json::from_str::<serde_json::Value>(&canonical).is_ok());
            seen.insert(canonical);
        }
        // Different documents must not collapse together (the generator does repeat small ones).
        assert!(seen.len() > 200, "only {} distinct forms", seen.len());
    }
}
