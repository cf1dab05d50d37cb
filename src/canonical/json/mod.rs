//! Canonical JSON: a single streaming pass over the body bytes that validates strict JSON and
//! writes a normalized spelling of it, skipping ignored fields, without building a tree.
//!
//! The canonical form is itself compact, valid JSON:
//! - no insignificant whitespace; object members sorted by their unescaped key bytes (stable, so
//!   duplicate keys keep their input order); arrays keep their order;
//! - except an object holding two names that differ in bytes but are equal under case folding
//!   (`"Amount"`, `"amount"`; see `fold`): Go, Json.NET and case-insensitive Jackson read them
//!   as one member, the last one winning, so its members keep their input order, and its
//!   `{` is followed by a space, which no sorted object has (`{ "amount":2e0,"Amount":1e0}`);
//! - strings with escapes decoded and re-escaped minimally (only `"`, `\` and control characters,
//!   as `\n \r \t \b \f` or lower-hex `\u00xx`), so `"\u0041"` and `"A"` are the same;
//! - numbers as exact decimal scientific notation with no float conversion: an optional `-`, the
//!   significant digits without leading or trailing zeros, `e` and the exponent (`1.50` → `15e-1`,
//!   `100` → `1e2`), and every zero as `0`;
//! - `true`, `false` and `null` unchanged.

use thiserror::Error;

use super::fold::{any_case_variants, fold_signature};
use super::{IgnoreSet, Ignored, JsonPointer};
use buffers::*;
use members::*;
use paths::*;
use strings::*;

mod buffers;
mod containers;
mod members;
mod numbers;
mod paths;
mod strings;

/// How many objects and arrays may be nested inside each other.
pub const MAX_DEPTH: usize = 128;

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
/// value `pointers[i]` designates (every one, `,`-joined, when duplicate keys make it ambiguous).
pub(crate) fn extract_into(
    input: &[u8],
    pointers: &[JsonPointer],
    found: &mut [Option<Vec<u8>>],
) -> Result<(), JsonError> {
    let ignore = IgnoreSet::empty();
    let mut out = Vec::with_capacity(input.len());
    let mut parser = Parser::new(input, &ignore, pointers, Some(found), None);
    parser.exact_found = vec![false; pointers.len()];
    let result = parser.document(&mut out);
    parser.buffers.recycle();
    // Only missing entries, or only names equal but for case, which a case-sensitive app
    // does not read: absent, as a single object without the field is.
    let exact_found = std::mem::take(&mut parser.exact_found);
    drop(parser);
    for (value, exact) in found.iter_mut().zip(exact_found) {
        if !exact {
            *value = None;
        }
    }
    result
}

/// One parse: the input, where it is, what to skip or extract, and its working memory.
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
    /// When extracting, whether each pointer had an occurrence reached by exact names only.
    exact_found: Vec<bool>,
    /// When extracting, each pointer reached by a member or element still being parsed
    /// that continues deeper (its live entry: pointer and case-variant bit), with whether and
    /// how long its result was before that value.
    pending: Vec<(usize, bool, usize)>,
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
            exact_found: Vec::new(),
            pending: Vec::new(),
        }
    }

    fn document(&mut self, out: &mut Vec<u8>) -> Result<(), JsonError> {
        if self.input.starts_with(b"\xEF\xBB\xBF") {
            self.pos = 3;
        }
        // The root frame holds every pointer: all of them match the empty path so far, by
        // exact names (see `Frame`).
        self.buffers
            .live
            .extend((0..self.pointers.len()).map(|p| p << 1));
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
}

/// Canonical JSON of the value each pointer designates (`None` when absent), found in one pass
/// without building a tree.
///
/// Array indexes are decimal tokens without leading zeros (`"0"`, `"12"`; `"01"` and `"-"` match
/// nothing). The whole document is validated with the same rules and depth limit as
/// [`canonical_json`]: invalid JSON anywhere is an error even when every
/// pointer was already found. Extracted values use the canonical form with nothing ignored. When a
/// duplicate key makes a pointer ambiguous, every occurrence is kept, in input order and joined
/// by `,`: parsers disagree on which one counts (most take the last, some the first), so a key
/// made of one of them could take two different requests for one. So when a parent on the
/// path repeats, each of its occurrences yields its result, one without the field an empty
/// entry (`{"o":{"id":1},"o":{}}` gives `1e0,` for `/o/id`); and a name equal but for case
/// (`PaymentOrderNo` for `/paymentOrderNo`, which Go and Json.NET match) is another
/// occurrence, marked `~` (`"PO-1",~"PO-2"`). A pointer none of whose occurrences is
/// reached by exact names only is absent. A body without repeated names, or names equal
/// but for case, gets a single value as it always did.
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
