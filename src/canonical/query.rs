//! Canonical `application/x-www-form-urlencoded`: URL queries and form bodies reduced to one
//! spelling, so parameter order and percent-encoding choices do not change a fingerprint.

use std::ops::Range;

use super::fold::{any_case_variants, fold_signature, prefix_of};
use super::{IgnoreSet, Ignored};

/// Canonical form of an `application/x-www-form-urlencoded` string (a URL query, without the `?`).
///
/// Same as [`canonical_form`] on the string's bytes.
///
/// ```rust
/// use idemgate::canonical::{canonical_query, IgnoreSet};
///
/// let ignore = IgnoreSet::defaults();
/// let mut a = Vec::new();
/// let mut b = Vec::new();
/// canonical_query("b=x+y&a=%31&ts=1700000000", &ignore, &mut a, None);
/// canonical_query("a=1&b=x%20y", &ignore, &mut b, None);
/// assert_eq!(a, b);
/// assert_eq!(a, b"a=1&b=x%20y");
/// ```
pub fn canonical_query(input: &str, ignore: &IgnoreSet, out: &mut Vec<u8>, ignored: Ignored<'_>) {
    canonical_form(input.as_bytes(), ignore, out, ignored);
}

/// Appends the canonical form of an `application/x-www-form-urlencoded` byte string (a query or a
/// form body) to `out`.
///
/// Pairs are split on `&` (empty pieces dropped) and each at its first `=`; `+` decodes to a space
/// and `%XX` to its byte (decoded bytes need not be UTF-8). Pairs whose decoded name is in
/// `ignore` (ASCII case-insensitive; its pointers do not apply here) are dropped, and
/// `query:<name>` is pushed to `ignored` for each. The rest are sorted by name bytes, stably:
/// the values of a repeated name keep their order, since applications read them as an ordered
/// list (`a[]=2&a[]=1` is not `a[]=1&a[]=2` to Rails, PHP, servlets or
/// `URLSearchParams.getAll`). They are re-emitted as `name=value` joined by `&`, with every
/// byte other than ALPHA DIGIT `-` `.` `_` `~` percent-encoded in upper-case hex.
///
/// A piece without `=` is emitted as `name` alone: `a` and `a=` stay apart, since some
/// applications tell them apart (Rack and Rails read `nil` against `""`), and a request is
/// never taken for another on a guess. Nothing in this format can be invalid, so there is
/// no error case. Where parsers disagree, the spellings they may read apart stay apart:
///
/// - A `%` that starts no escape (`%zz`) is a `%` to lenient decoders and an error to strict
///   ones, so it is not the escaped `%25`: it is written bare, and a hex digit right after
///   it escaped, so that it never reads as an escape.
/// - A literal `;` splits pairs to Rack 2, older Python and Go, and is data to others: a
///   string holding one keeps its pieces as sent, in input order, nothing ignored, its `;`
///   and `=` bare (so never the string that escapes them, `%3B` `%3D`); no other form has a
///   bare `;`.
/// - Names equal but for case (`Amount`, `amount`; [`super::fold`]) are one parameter to
///   ASP.NET's binders, the last one winning: when the kept pairs hold such names, they are
///   emitted in input order after a leading `&`, which no sorted form starts with.
pub fn canonical_form(
    input: &[u8],
    ignore: &IgnoreSet,
    out: &mut Vec<u8>,
    mut ignored: Ignored<'_>,
) {
    if input.contains(&b';') {
        let pieces = input.split(|&b| b == b'&').filter(|p| !p.is_empty());
        for (i, piece) in pieces.enumerate() {
            if i > 0 {
                out.push(b'&');
            }
            encode_raw(piece, b";=", out);
        }
        return;
    }
    // Decoded names, for matching and sorting; each pair is emitted from its raw spelling.
    let mut decoded = Vec::with_capacity(input.len());
    let mut pairs: Vec<Pair<'_>> = Vec::new();
    for piece in input.split(|&b| b == b'&') {
        if piece.is_empty() {
            continue;
        }
        let (name, value) = match piece.iter().position(|&b| b == b'=') {
            Some(eq) => (&piece[..eq], Some(&piece[eq + 1..])),
            None => (piece, None),
        };
        let name_start = decoded.len();
        decode_component(name, &mut decoded);
        let decoded_name = name_start..decoded.len();
        if ignore.ignores_name(&decoded[decoded_name.clone()]) {
            if let Some(list) = ignored.as_deref_mut() {
                let name = String::from_utf8_lossy(&decoded[decoded_name]);
                list.push(format!("query:{name}"));
            }
            decoded.truncate(name_start);
            continue;
        }
        pairs.push(Pair {
            decoded_name,
            name,
            value,
        });
    }
    let name = |i: usize| &decoded[pairs[i].decoded_name.clone()];
    let signature = |i: usize| fold_signature(name(i), prefix_of(name(i)));
    let mut scratch = Vec::new();
    if any_case_variants(pairs.len(), name, signature, &mut scratch) {
        out.push(b'&');
    } else {
        // By name only, and stable: a repeated name's values are a list whose order is data.
        pairs.sort_by(|a, b| decoded[a.decoded_name.clone()].cmp(&decoded[b.decoded_name.clone()]));
    }
    for (i, pair) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(b'&');
        }
        encode_raw(pair.name, b"", out);
        if let Some(value) = pair.value {
            out.push(b'=');
            encode_raw(value, b"", out);
        }
    }
}

/// One kept `name[=value]` piece: its decoded name, as a range of the decoded names, and
/// its raw parts.
struct Pair<'a> {
    decoded_name: Range<usize>,
    name: &'a [u8],
    value: Option<&'a [u8]>,
}

fn decode_component(raw: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => match escape_at(raw, i) {
                Some(byte) => {
                    out.push(byte);
                    i += 3;
                }
                None => {
                    out.push(b'%');
                    i += 1;
                }
            },
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
}

/// The byte a `%XX` escape at `raw[i]` stands for, if it is one.
fn escape_at(raw: &[u8], i: usize) -> Option<u8> {
    let high = hex_value(raw.get(i + 1))?;
    let low = hex_value(raw.get(i + 2))?;
    Some(high << 4 | low)
}

fn hex_value(digit: Option<&u8>) -> Option<u8> {
    let d = *digit?;
    char::from(d).to_digit(16).map(|v| v as u8)
}

/// Writes the raw component `raw` decoded and re-encoded: each decoded byte as itself when
/// unreserved, else as `%XX` in upper-case hex; literal bytes in `bare` as themselves; a `%`
/// that starts no escape bare, with a hex digit right after it escaped.
fn encode_raw(raw: &[u8], bare: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    let mut after_bare_percent = false;
    while i < raw.len() {
        let (byte, literal, len) = match raw[i] {
            b'+' => (b' ', false, 1),
            b'%' => match escape_at(raw, i) {
                Some(byte) => (byte, false, 3),
                None => {
                    out.push(b'%');
                    i += 1;
                    after_bare_percent = true;
                    continue;
                }
            },
            b => (b, true, 1),
        };
        let keep_bare = literal && bare.contains(&byte);
        let escape_digit = after_bare_percent && byte.is_ascii_hexdigit();
        if keep_bare || (!escape_digit && is_unreserved(byte)) {
            out.push(byte);
        } else {
            out.extend_from_slice(&[
                b'%',
                HEX[usize::from(byte >> 4)],
                HEX[usize::from(byte & 15)],
            ]);
        }
        after_bare_percent = false;
        i += len;
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// RFC 3986 unreserved characters (ALPHA DIGIT `-` `.` `_` `~`), the only ones written
/// unescaped, so that each byte string has exactly one encoded spelling.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::JsonPointer;

    fn canon(input: &str) -> String {
        let mut out = Vec::new();
        canonical_query(input, &IgnoreSet::empty(), &mut out, None);
        String::from_utf8(out).unwrap()
    }

    fn canon_with(input: &str, ignore: &IgnoreSet) -> (String, Vec<String>) {
        let mut out = Vec::new();
        let mut ignored = Vec::new();
        canonical_query(input, ignore, &mut out, Some(&mut ignored));
        (String::from_utf8(out).unwrap(), ignored)
    }

    #[test]
    fn parameter_order_does_not_change_canonical_form() {
        assert_eq!(canon("a=1&b=2"), "a=1&b=2");
        assert_eq!(canon("b=2&a=1"), "a=1&b=2");
    }

    #[test]
    fn percent_encoding_choices_do_not_change_canonical_form() {
        assert_eq!(canon("a=%31&b=2"), "a=1&b=2");
        assert_eq!(canon("%61=1&b=%32"), "a=1&b=2");
        assert_eq!(canon("k=%e2%82%ac"), canon("k=%E2%82%AC"));
        assert_eq!(canon("k=A-z.0_~"), "k=A-z.0_~");
        assert_eq!(canon("k=%41%2D%7E"), "k=A-~");
    }

    #[test]
    fn plus_and_percent_twenty_are_both_a_space() {
        assert_eq!(canon("q=a+b"), "q=a%20b");
        assert_eq!(canon("q=a%20b"), "q=a%20b");
    }

    #[test]
    fn encoded_plus_stays_a_literal_plus() {
        assert_eq!(canon("q=a%2Bb"), "q=a%2Bb");
        assert_ne!(canon("q=a%2Bb"), canon("q=a+b"));
    }

    #[test]
    fn reserved_and_non_ascii_bytes_are_encoded_in_upper_case_hex() {
        assert_eq!(canon("k=a/b?c"), "k=a%2Fb%3Fc");
        assert_eq!(canon("k=é"), "k=%C3%A9");
        assert_eq!(canon("k=%ff"), "k=%FF");
    }

    #[test]
    fn empty_pieces_are_dropped() {
        assert_eq!(canon("&&a=1&&b=2&"), "a=1&b=2");
        assert_eq!(canon(""), "");
        assert_eq!(canon("&"), "");
    }

    #[test]
    fn name_without_equals_is_not_an_empty_value() {
        assert_eq!(canon("flag"), "flag");
        assert_eq!(canon("flag="), "flag=");
        assert_ne!(canon("flag"), canon("flag="));
        assert_eq!(canon("b&a=&c"), "a=&b&c");
        assert_eq!(canon("=v"), "=v");
    }

    #[test]
    fn pieces_split_at_the_first_equals_only() {
        assert_eq!(canon("a=b=c"), "a=b%3Dc");
    }

    /// A `%` that starts no escape is a literal `%` to lenient decoders and an error to
    /// strict ones (Go, Java's `URLDecoder`), while `%25` is a `%` to all: the two stay
    /// apart. A bare `%` is written bare, and a hex digit after it escaped, so that it
    /// never reads as an escape itself.
    #[test]
    fn invalid_escapes_are_not_escaped_percents() {
        assert_eq!(canon("a=%zz"), "a=%zz");
        assert_eq!(canon("a=%"), "a=%");
        assert_eq!(canon("a=%4"), "a=%%34");
        assert_eq!(canon("a=%4g"), "a=%%34g");
        assert_ne!(canon("a=%zz"), canon("a=%25zz"));
        assert_ne!(canon("a=%"), canon("a=%25"));
        // A bare `%` before `FF` is not the byte 0xFF.
        assert_ne!(canon("a=%F%46"), canon("a=%FF"));
        assert_eq!(canon("a=%25zz"), "a=%25zz");
    }

    /// Rack 2, older Python and Go split pairs on `;` as on `&`, others take it as data:
    /// a query with a literal `;` keeps its pairs as sent, in order, its `;` and `=` bare,
    /// so it is never the query that escapes them.
    #[test]
    fn a_literal_semicolon_is_not_an_escaped_one() {
        assert_ne!(canon("a=1;b=2"), canon("a=1%3Bb%3D2"));
        assert_ne!(canon("a=1;b=2"), canon("a=1;b%3D2"));
        assert_ne!(canon("a=1;b=2"), canon("a=1%3Bb=2"));
        assert_eq!(canon("a=1;b=2"), "a=1;b=2");
        // Read split, `b` is a list whose order is data wherever the pieces stand.
        assert_ne!(canon("b=0&a;b=1"), canon("a;b=1&b=0"));
        assert_eq!(canon("x=%41;y&&z"), "x=A;y&z");
        // Without a literal `;` an escaped one changes nothing, and `=` in a value is a
        // `=` to every parser.
        assert_eq!(canon("b=1%3Bc&a=x=y"), "a=x%3Dy&b=1%3Bc");
        assert_eq!(canon("a=x%3Dy"), canon("a=x=y"));
    }

    /// ASP.NET binds parameters ignoring case and lets the last win: names equal but for
    /// case keep their input order.
    #[test]
    fn names_equal_but_for_case_keep_their_order() {
        assert_ne!(canon("Amount=1&amount=2"), canon("amount=2&Amount=1"));
        // The Kelvin sign folds to `k`.
        assert_ne!(canon("%E2%84%AA=1&k=2"), canon("k=2&%E2%84%AA=1"));
        assert_eq!(canon("b=1&Amount=1&amount=2"), "&b=1&Amount=1&amount=2");
        // Names differing otherwise still sort.
        assert_eq!(canon("b=1&B=2&a=3"), "&b=1&B=2&a=3");
        assert_eq!(canon("b=1&Bb=2&a=3"), "Bb=2&a=3&b=1");
    }

    #[test]
    fn pairs_sort_by_name_and_duplicates_are_kept() {
        assert_eq!(canon("a=2&a=1&a=1"), "a=2&a=1&a=1");
        assert_eq!(canon("b=1&a=z&ab=0"), "a=z&ab=0&b=1");
        assert_ne!(canon("a=1&a=1"), canon("a=1"));
    }

    /// A repeated name is an ordered list to the applications that read it: a reordered
    /// list is another request, wherever the other names stand.
    #[test]
    fn a_repeated_name_keeps_its_values_in_order() {
        assert_ne!(canon("pos=b&pos=a"), canon("pos=a&pos=b"));
        assert_eq!(canon("pos=b&x=1&pos=a"), "pos=b&pos=a&x=1");
        assert_eq!(canon("x=1&pos=b&pos=a"), canon("pos=b&x=1&pos=a"));
    }

    #[test]
    fn ignored_names_are_dropped_case_insensitively_and_reported() {
        let (out, ignored) = canon_with("ts=1&a=2&TS=3&Sent_At=x", &IgnoreSet::defaults());
        assert_eq!(out, "a=2");
        assert_eq!(ignored, ["query:ts", "query:TS", "query:Sent_At"]);
    }

    #[test]
    fn names_are_matched_after_decoding() {
        let (out, ignored) = canon_with("t%73=1&b=2", &IgnoreSet::defaults());
        assert_eq!(out, "b=2");
        assert_eq!(ignored, ["query:ts"]);
    }

    #[test]
    fn pointers_do_not_apply_to_queries() {
        let ignore = IgnoreSet::new(
            Vec::<String>::new(),
            vec![JsonPointer::parse("/a").unwrap()],
        );
        assert_eq!(canon_with("a=1", &ignore).0, "a=1");
    }

    #[test]
    fn form_bodies_may_hold_non_utf8_bytes() {
        let mut out = Vec::new();
        canonical_form(b"b=\xff&a=%FE", &IgnoreSet::empty(), &mut out, None);
        assert_eq!(out, b"a=%FE&b=%FF");
    }

    #[test]
    fn output_is_appended_after_existing_bytes() {
        let mut out = b"GET /x?".to_vec();
        canonical_query("b=1&a=2", &IgnoreSet::empty(), &mut out, None);
        assert_eq!(out, b"GET /x?a=2&b=1");
    }

    #[test]
    fn canonical_form_is_idempotent() {
        for input in [
            "b=2&a=1",
            "q=a+b%2B%zz",
            "x&y=&=z",
            "k=%C3%A9&k=%e2%82%ac",
            "a=%4%31",
            "a=1;b=%3D&c",
            "B=1&b=2",
        ] {
            let once = canon(input);
            assert_eq!(canon(&once), once, "{input}");
        }
    }
}
