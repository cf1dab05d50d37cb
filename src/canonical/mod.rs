//! Canonical forms of request bodies and queries: the byte strings idemgate fingerprints, so that
//! requests differing only in spelling (key order, whitespace, number notation, escapes,
//! percent-encoding) or in volatile fields (send timestamps, the sender's coordinates) get the same fingerprint.
//!
//! - [`json`]: canonical JSON, streaming, with fields skipped by name or pointer.
//! - [`query`]: canonical `application/x-www-form-urlencoded` (URL queries and form bodies).
//! - [`pointer`](mod@pointer): RFC 6901 pointers and extraction of selected fields.
//!
//! Fingerprinting is hashing the canonical form:
//!
//! ```rust
//! use idemgate::canonical::{canonical_json, IgnoreSet};
//! use sha2::{Digest, Sha256};
//!
//! let ignore = IgnoreSet::defaults();
//! let fingerprint = |body: &[u8]| {
//!     let mut canonical = Vec::new();
//!     canonical_json(body, &ignore, &mut canonical, None).expect("valid JSON");
//!     Sha256::digest(&canonical)
//! };
//! let a = fingerprint(br#"{"qty": 1.0, "sku": "A", "ts": 1700000000}"#);
//! let b = fingerprint(br#"{ "sku":"\u0041", "qty":10e-1, "ts":1700000099 }"#);
//! assert_eq!(a, b);
//! assert_ne!(a, fingerprint(br#"{"qty": 2, "sku": "A"}"#));
//! ```

mod fold;
pub mod json;
pub mod pointer;
pub mod query;

pub use json::{canonical_json, extract_fields, JsonError, MAX_DEPTH};
pub use pointer::{JsonPointer, PointerError};
pub use query::{canonical_form, canonical_query};

/// Fields skipped by default (lower-case): names that can only say when or where a request
/// was sent, which a retry or double submit changes while the business request stays the
/// same. Words a business payload uses for its own data (`date`, `time`, `datetime`,
/// `location`, `long`, `nonce`, `geo`, `accuracy`) are deliberately absent: two bookings
/// for different dates are two bookings.
pub const DEFAULT_IGNORED_FIELDS: &[&str] = &[
    "timestamp",
    "ts",
    "request_time",
    "request_timestamp",
    "requested_at",
    "client_time",
    "client_timestamp",
    "sent_at",
    "send_time",
    "lat",
    "lng",
    "lon",
    "latitude",
    "longitude",
];

/// Names of this many bytes or more share the last length bucket.
const LONG_NAME: usize = 31;

/// What to skip while canonicalizing: field names at any depth (ASCII case-insensitive) and exact
/// JSON pointers.
///
/// Names apply to JSON object keys (after JSON unescaping) and to query/form parameter names
/// (after percent-decoding). Pointers apply to JSON only; they designate object members or array
/// elements, and the root pointer `""` never matches (the document itself cannot be skipped).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IgnoreSet {
    /// Lower-cased names, sorted by length so that each length is one contiguous run.
    names: Vec<Box<[u8]>>,
    /// `buckets[len]` is the range of `names` having that length (`LONG_NAME` holds the rest).
    buckets: [(u32, u32); LONG_NAME + 1],
    /// Names of up to 8 bytes packed by `pack_lowercase`, parallel to `names` (0 for longer ones):
    /// short names are then matched by comparing one integer.
    packed: Vec<u64>,
    /// Bit `len` set when some name has that length; rejects some keys with one test.
    len_mask: u64,
    pointers: Vec<JsonPointer>,
}

impl IgnoreSet {
    /// Builds a set from field names (matched case-insensitively at any depth) and pointers.
    ///
    /// Duplicate names are collapsed.
    pub fn new<N: AsRef<str>>(
        names: impl IntoIterator<Item = N>,
        pointers: Vec<JsonPointer>,
    ) -> Self {
        let mut names: Vec<Box<[u8]>> = names
            .into_iter()
            .map(|n| {
                n.as_ref()
                    .to_ascii_lowercase()
                    .into_bytes()
                    .into_boxed_slice()
            })
            .collect();
        names.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        names.dedup();
        // A config listing over 4 billion names could not have been loaded in the first place.
        let index = |i: usize| u32::try_from(i).unwrap_or(u32::MAX);
        let mut buckets = [(0u32, 0u32); LONG_NAME + 1];
        let mut len_mask = 0u64;
        for (i, name) in names.iter().enumerate() {
            let b = name.len().min(LONG_NAME);
            if buckets[b].1 == 0 {
                buckets[b].0 = index(i);
            }
            buckets[b].1 = index(i + 1);
            len_mask |= 1 << b;
        }
        let packed = names
            .iter()
            .map(|n| pack_lowercase(n).unwrap_or(0))
            .collect();
        Self {
            names,
            buckets,
            packed,
            len_mask,
            pointers,
        }
    }

    /// A set that skips nothing.
    pub fn empty() -> Self {
        Self::default()
    }

    /// The default set: [`DEFAULT_IGNORED_FIELDS`] and no pointers.
    pub fn defaults() -> Self {
        Self::new(DEFAULT_IGNORED_FIELDS, Vec::new())
    }

    /// Whether nothing is skipped.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.pointers.is_empty()
    }

    /// Whether a field called `name` is skipped (ASCII case-insensitive); never allocates.
    #[inline]
    pub fn ignores_name(&self, name: &[u8]) -> bool {
        let b = name.len().min(LONG_NAME);
        if self.len_mask & (1 << b) == 0 {
            return false;
        }
        let (start, end) = (self.buckets[b].0 as usize, self.buckets[b].1 as usize);
        // Within a bucket of short names all lengths are equal, so equal packings mean equal names.
        if let Some(packed) = pack_lowercase(name) {
            return self.packed[start..end].contains(&packed);
        }
        self.names[start..end]
            .iter()
            .any(|n| n.len() == name.len() && n.eq_ignore_ascii_case(name))
    }

    /// [`Self::ignores_name`] for a name of `len` ≤ 8 bytes given as its first 8 bytes,
    /// big-endian and zero-padded (as `u64::from_be_bytes` of the zero-padded name).
    #[inline]
    pub(crate) fn ignores_short(&self, len: usize, prefix: u64) -> bool {
        debug_assert!(len <= 8);
        if self.len_mask & (1 << len) == 0 {
            return false;
        }
        let (start, end) = (self.buckets[len].0 as usize, self.buckets[len].1 as usize);
        self.packed[start..end].contains(&ascii_lowercase_lanes(prefix))
    }

    /// Whether any field names are skipped.
    pub fn has_names(&self) -> bool {
        !self.names.is_empty()
    }

    /// The lower-cased field names, shortest first.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        // Names were built from `&str` and only ASCII-lowercased, so they stay valid UTF-8.
        self.names
            .iter()
            .map(|n| std::str::from_utf8(n).unwrap_or_default())
    }

    /// The pointers whose values are skipped.
    pub fn pointers(&self) -> &[JsonPointer] {
        &self.pointers
    }
}

/// Packs a name of at most 8 bytes, ASCII-lowercased, big-endian and zero-padded: the same
/// layout as the JSON parser's key prefixes, so it can match keys without rereading them.
#[inline]
fn pack_lowercase(name: &[u8]) -> Option<u64> {
    if name.len() > 8 {
        return None;
    }
    let mut packed = 0;
    for (i, &b) in name.iter().enumerate() {
        packed |= u64::from(b) << (56 - 8 * i);
    }
    Some(ascii_lowercase_lanes(packed))
}

/// ASCII-lowercases the 8 bytes of `word` at once, leaving other bytes alone.
#[inline]
fn ascii_lowercase_lanes(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // Adding to the low 7 bits never carries into the next lane; the lane's top bit then says
    // whether the byte reached 'A' (0x41) and whether it passed 'Z' (0x5A).
    let low7 = word & !HIGHS;
    let at_least_a = low7 + ONES * (0x80 - 0x41);
    let past_z = low7 + ONES * (0x80 - 0x5B);
    let upper = at_least_a & !past_z & !word & HIGHS;
    word | (upper >> 2)
}

/// Where the caller wants to hear what was skipped (for an `explain` command); `None` on the hot
/// path costs nothing.
///
/// Entries are JSON pointers like `/items/0/ts` (JSON) or `query:ts` (query and form), in the
/// order the skipped fields appear in the input.
pub type Ignored<'a> = Option<&'a mut Vec<String>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_set_ignores_time_and_geo_names_in_any_case() {
        let set = IgnoreSet::defaults();
        for name in DEFAULT_IGNORED_FIELDS {
            assert!(set.ignores_name(name.as_bytes()), "{name}");
            assert!(
                set.ignores_name(name.to_ascii_uppercase().as_bytes()),
                "{name}"
            );
        }
        assert!(set.ignores_name(b"TimeStamp"));
        assert!(set.ignores_name(b"Requested_At"));
    }

    /// Business words that happen to be about time or place are data: ignoring them would
    /// merge two bookings for different dates, or two shipments to different places.
    #[test]
    fn default_set_keeps_business_time_and_place_words() {
        let set = IgnoreSet::defaults();
        for name in [
            "date", "time", "datetime", "location", "long", "nonce", "geo", "accuracy", "altitude",
            "gps",
        ] {
            assert!(!set.ignores_name(name.as_bytes()), "{name}");
        }
    }

    #[test]
    fn default_set_keeps_business_fields() {
        let set = IgnoreSet::defaults();
        for name in [
            "sku",
            "qty",
            "price",
            "amount",
            "id",
            "t",
            "tss",
            "timestamps",
            "",
            "lats",
        ] {
            assert!(!set.ignores_name(name.as_bytes()), "{name}");
        }
    }

    #[test]
    fn configured_names_are_lowercased_and_matched_case_insensitively() {
        let set = IgnoreSet::new(["Request-ID", "X"], Vec::new());
        assert!(set.ignores_name(b"request-id"));
        assert!(set.ignores_name(b"REQUEST-ID"));
        assert!(set.ignores_name(b"x"));
        assert!(!set.ignores_name(b"request_id"));
        assert_eq!(set.names().collect::<Vec<_>>(), ["x", "request-id"]);
    }

    #[test]
    fn long_names_share_a_bucket_but_still_match_exactly() {
        let long = "a".repeat(40);
        let longer = "a".repeat(50);
        let set = IgnoreSet::new([long.as_str(), "b"], Vec::new());
        assert!(set.ignores_name(long.as_bytes()));
        assert!(set.ignores_name(long.to_uppercase().as_bytes()));
        assert!(!set.ignores_name(longer.as_bytes()));
        assert!(!set.ignores_name(&long.as_bytes()[..32]));
    }

    #[test]
    fn non_ascii_names_match_only_byte_for_byte_outside_ascii() {
        let set = IgnoreSet::new(["Zeitstempel-ä"], Vec::new());
        assert!(set.ignores_name("ZEITSTEMPEL-ä".as_bytes()));
        assert!(!set.ignores_name("zeitstempel-Ä".as_bytes()));
    }

    #[test]
    fn empty_set_is_empty_and_ignores_nothing() {
        let set = IgnoreSet::empty();
        assert!(set.is_empty());
        assert!(!set.has_names());
        assert!(!set.ignores_name(b"ts"));
        assert!(!set.ignores_name(b""));
        let with_pointer = IgnoreSet::new(
            Vec::<String>::new(),
            vec![JsonPointer::parse("/a").unwrap()],
        );
        assert!(!with_pointer.is_empty());
        assert_eq!(with_pointer.pointers().len(), 1);
    }

    #[test]
    fn lowercasing_eight_bytes_at_once_matches_per_byte() {
        for lane in 0..8 {
            for b in 0..=255u8 {
                // Neighbours chosen to provoke carries: 0x5A/0x5B and 0x40/0x41 straddle A-Z.
                let mut bytes = [0x5A, 0x41, 0xFF, 0x40, 0x5B, 0x80, 0x7F, 0x00];
                bytes[lane] = b;
                let expected = bytes.map(|c| c.to_ascii_lowercase());
                let word = ascii_lowercase_lanes(u64::from_be_bytes(bytes));
                assert_eq!(word.to_be_bytes(), expected, "lane {lane} byte {b:#04x}");
            }
        }
    }

    #[test]
    fn duplicate_names_are_collapsed() {
        let set = IgnoreSet::new(["ts", "TS", "ts"], Vec::new());
        assert_eq!(set.names().count(), 1);
    }
}
