//! Canonical `application/x-www-form-urlencoded`: URL queries and form bodies reduced to one
//! spelling, so parameter order and percent-encoding choices do not change a fingerprint.

use std::ops::Range;

use percent_encoding::{percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::{IgnoreSet, Ignored};

/// Everything but RFC 3986 unreserved characters (ALPHA DIGIT `-` `.` `_` `~`) is encoded, so
/// each byte string has exactly one encoded spelling.
const ENCODED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

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
/// and `%XX` to its byte, while a `%` not followed by two hex digits is kept literally (decoded
/// bytes need not be UTF-8). Pairs whose decoded name is in `ignore` (ASCII case-insensitive; its
/// pointers do not apply here) are dropped, and `query:<name>` is pushed to `ignored` for each.
/// The rest are sorted by name bytes, stably: the values of a repeated name keep their order,
/// since applications read them as an ordered list (`a[]=2&a[]=1` is not `a[]=1&a[]=2` to
/// Rails, PHP, servlets or `URLSearchParams.getAll`). They are re-emitted as `name=value`
/// joined by `&`, with every byte other than ALPHA DIGIT `-` `.` `_` `~` percent-encoded in
/// upper-case hex.
///
/// A piece without `=` is emitted as `name` alone: `a` and `a=` stay apart, since some
/// applications tell them apart (Rack and Rails read `nil` against `""`), and a request is
/// never taken for another on a guess. Nothing in this format can be invalid, so there is
/// no error case.
pub fn canonical_form(
    input: &[u8],
    ignore: &IgnoreSet,
    out: &mut Vec<u8>,
    mut ignored: Ignored<'_>,
) {
    // All decoded names and values live in one buffer; pairs are ranges into it.
    let mut decoded = Vec::with_capacity(input.len());
    // A value's range is `None` for a piece without `=`.
    let mut pairs: Vec<(Range<usize>, Option<Range<usize>>)> = Vec::new();
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
        let name_range = name_start..decoded.len();
        if ignore.ignores_name(&decoded[name_range.clone()]) {
            if let Some(list) = ignored.as_deref_mut() {
                let name = String::from_utf8_lossy(&decoded[name_range]);
                list.push(format!("query:{name}"));
            }
            decoded.truncate(name_start);
            continue;
        }
        let value = value.map(|value| {
            decode_component(value, &mut decoded);
            name_range.end..decoded.len()
        });
        pairs.push((name_range, value));
    }
    // By name only, and stable: a repeated name's values are a list whose order is data.
    pairs.sort_by(|a, b| decoded[a.0.clone()].cmp(&decoded[b.0.clone()]));
    for (i, (name, value)) in pairs.into_iter().enumerate() {
        if i > 0 {
            out.push(b'&');
        }
        encode_component(&decoded[name], out);
        if let Some(value) = value {
            out.push(b'=');
            encode_component(&decoded[value], out);
        }
    }
}

fn decode_component(raw: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => match (hex_value(raw.get(i + 1)), hex_value(raw.get(i + 2))) {
                (Some(high), Some(low)) => {
                    out.push(high << 4 | low);
                    i += 3;
                }
                _ => {
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

fn hex_value(digit: Option<&u8>) -> Option<u8> {
    let d = *digit?;
    char::from(d).to_digit(16).map(|v| v as u8)
}

fn encode_component(bytes: &[u8], out: &mut Vec<u8>) {
    for chunk in percent_encode(bytes, ENCODED) {
        out.extend_from_slice(chunk.as_bytes());
    }
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

    #[test]
    fn invalid_escapes_are_kept_literally() {
        assert_eq!(canon("a=%zz"), "a=%25zz");
        assert_eq!(canon("a=%"), "a=%25");
        assert_eq!(canon("a=%4"), "a=%254");
        assert_eq!(canon("a=%4g"), "a=%254g");
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
        for input in ["b=2&a=1", "q=a+b%2B%zz", "x&y=&=z", "k=%C3%A9&k=%e2%82%ac"] {
            let once = canon(input);
            assert_eq!(canon(&once), once, "{input}");
        }
    }
}
