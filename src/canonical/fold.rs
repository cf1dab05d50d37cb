//! Names equal under case folding. Go's `encoding/json`, Json.NET, Jackson with
//! case-insensitive properties and ASP.NET's binders match member and parameter names
//! ignoring case and let the last one win, so two names that fold alike are one field to
//! them and two to a case-sensitive app: where such names differ in bytes, their order is
//! data.
//!
//! Folding here is per character lower, upper, then lower case again: it joins every pair
//! of characters that any of those libraries joins (simple or full mappings, the Kelvin
//! sign `K` with `k`, `ſ` with `s`, `ẞ` with `ß`), and more. Joining too much only keeps
//! an order that did not matter.

use super::ascii_lowercase_lanes;

/// Whether `a` and `b` differ in bytes but fold alike. Bytes that are not UTF-8 fold as
/// U+FFFD, which only ever joins more.
pub(crate) fn case_variants(a: &[u8], b: &[u8]) -> bool {
    if a == b {
        return false;
    }
    if a.is_ascii() && b.is_ascii() {
        return a.eq_ignore_ascii_case(b);
    }
    folded(a).eq(folded(b))
}

/// The first 8 bytes of `name` folded, big-endian and zero-padded: names that fold alike
/// have equal signatures. `prefix` is `name`'s own first 8 bytes laid out so (the JSON
/// parser's key prefix); when they are ASCII the signature is them in lower case.
pub(crate) fn fold_signature(name: &[u8], prefix: u64) -> u64 {
    if prefix & 0x8080_8080_8080_8080 == 0 {
        return ascii_lowercase_lanes(prefix);
    }
    let mut bytes = [0u8; 8];
    let mut len = 0;
    let mut utf8 = [0u8; 4];
    for c in folded(name) {
        for &b in c.encode_utf8(&mut utf8).as_bytes() {
            if len == 8 {
                return u64::from_be_bytes(bytes);
            }
            bytes[len] = b;
            len += 1;
        }
    }
    u64::from_be_bytes(bytes)
}

/// `name`'s first 8 bytes, big-endian and zero-padded.
pub(crate) fn prefix_of(name: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let len = name.len().min(8);
    bytes[..len].copy_from_slice(&name[..len]);
    u64::from_be_bytes(bytes)
}

/// Whether two of `count` names differ in bytes but fold alike; `name(i)` is the `i`th and
/// `signature(i)` its [`fold_signature`]. `scratch` is working memory.
pub(crate) fn any_case_variants<'n>(
    count: usize,
    name: impl Fn(usize) -> &'n [u8],
    signature: impl Fn(usize) -> u64,
    scratch: &mut Vec<u128>,
) -> bool {
    if count < 2 {
        return false;
    }
    // Most objects are small: every pair's signatures compared costs less than a sort,
    // and touches no memory but the stack.
    if count <= SMALL {
        let mut signatures = [0u64; SMALL];
        for (i, slot) in signatures[..count].iter_mut().enumerate() {
            *slot = signature(i);
        }
        for i in 0..count {
            for j in i + 1..count {
                if signatures[i] == signatures[j] && case_variants(name(i), name(j)) {
                    return true;
                }
            }
        }
        return false;
    }
    scratch.clear();
    scratch.extend((0..count).map(|i| u128::from(signature(i)) << 64 | i as u128));
    scratch.sort_unstable();
    let mut run = 0;
    while run < scratch.len() {
        let sig = scratch[run] >> 64;
        let mut end = run + 1;
        while end < scratch.len() && scratch[end] >> 64 == sig {
            end += 1;
        }
        // Names sharing a signature, sorted by their whole folded form, then their bytes:
        // variants, if any, end up side by side. Sorted rather than compared pair by pair,
        // since a body repeating one name (`{"a":0,"a":0,…}`) makes one run of all of them.
        let names = &mut scratch[run..end];
        if names.len() > 2 {
            let at = |entry: &u128| name(*entry as u64 as usize);
            names.sort_unstable_by(|x, y| {
                let (a, b) = (at(x), at(y));
                fold_cmp(a, b).then_with(|| a.cmp(b))
            });
        }
        for pair in names.windows(2) {
            let (a, b) = (pair[0] as u64 as usize, pair[1] as u64 as usize);
            if case_variants(name(a), name(b)) {
                return true;
            }
        }
        run = end;
    }
    false
}

/// `a` and `b` ordered by their folded forms.
fn fold_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    if a.is_ascii() && b.is_ascii() {
        let (a, b) = (a.iter(), b.iter());
        return a
            .map(u8::to_ascii_lowercase)
            .cmp(b.map(u8::to_ascii_lowercase));
    }
    folded(a).cmp(folded(b))
}

/// Up to this many names, [`any_case_variants`] compares every pair.
const SMALL: usize = 16;

fn folded(name: &[u8]) -> impl Iterator<Item = char> + '_ {
    name.utf8_chunks().flat_map(|chunk| {
        let invalid = (!chunk.invalid().is_empty()).then_some(char::REPLACEMENT_CHARACTER);
        chunk.valid().chars().chain(invalid).flat_map(|c| {
            c.to_lowercase()
                .flat_map(char::to_uppercase)
                .flat_map(char::to_lowercase)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_equal_but_for_case_are_variants() {
        for (a, b) in [
            ("Amount", "amount"),
            ("paymentOrderNo", "PaymentOrderNo"),
            ("\u{212A}ey", "key"),
            ("\u{17F}ku", "SKU"),
            ("stra\u{DF}e", "STRA\u{1E9E}E"),
            ("\u{C9}t\u{E9}", "\u{E9}T\u{C9}"),
        ] {
            assert!(case_variants(a.as_bytes(), b.as_bytes()), "{a} {b}");
            let sig = |s: &str| fold_signature(s.as_bytes(), prefix_of(s.as_bytes()));
            assert_eq!(sig(a), sig(b), "{a} {b}");
        }
        for (a, b) in [("a", "a"), ("a", "b"), ("ab", "a"), ("id", "ids"), ("", "")] {
            assert!(!case_variants(a.as_bytes(), b.as_bytes()), "{a} {b}");
        }
    }

    /// A body repeating one name (`{"a":0,"a":0,…}`, a form `a&a&…`) makes one run of all
    /// of them: compared pair by pair, a 1 MiB body would cost minutes of CPU before it is
    /// forwarded. Sorted, its names are read a few times each.
    #[test]
    fn a_run_of_one_repeated_name_is_not_compared_pair_by_pair() {
        let count = 4096;
        let reads = std::cell::Cell::new(0usize);
        let name = |_: usize| {
            reads.set(reads.get() + 1);
            &b"a"[..]
        };
        let sig = |_: usize| prefix_of(b"a");
        assert!(!any_case_variants(count, name, sig, &mut Vec::new()));
        assert!(
            reads.get() < 64 * count,
            "{} reads of {count} names",
            reads.get()
        );
        let names: Vec<&[u8]> = (0..count)
            .map(|i| if i == count - 7 { &b"A"[..] } else { &b"a"[..] })
            .collect();
        let sig = |i: usize| fold_signature(names[i], prefix_of(names[i]));
        assert!(any_case_variants(count, |i| names[i], sig, &mut Vec::new()));
    }

    #[test]
    fn only_names_that_fold_alike_are_found() {
        let names: [&[u8]; 4] = [b"shippingAddress", b"shippingMethod", b"id", b"ids"];
        let sig = |i: usize| fold_signature(names[i], prefix_of(names[i]));
        let mut scratch = Vec::new();
        assert!(!any_case_variants(4, |i| names[i], sig, &mut scratch));
        let names: [&[u8]; 4] = [b"shippingAddress", b"id", b"ShippingADDRESS", b"x"];
        let sig = |i: usize| fold_signature(names[i], prefix_of(names[i]));
        assert!(any_case_variants(4, |i| names[i], sig, &mut scratch));
        // Repeated names are not variants.
        let names: [&[u8]; 3] = [b"id", b"id", b"x"];
        let sig = |i: usize| fold_signature(names[i], prefix_of(names[i]));
        assert!(!any_case_variants(3, |i| names[i], sig, &mut scratch));
    }
}
