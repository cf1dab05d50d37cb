//! Object members in canonical order: keys compared by an 8-byte prefix first, a stable
//! sort only when the input was not in order already, and members written back in order.

use super::*;

/// An object key: either borrowed from the input (no escapes) or decoded into `Buffers::keys`.
#[derive(Clone, Copy)]
pub(super) struct Key {
    /// The first 8 key bytes, big-endian and zero-padded: orders most keys without a memcmp.
    pub(super) prefix: u64,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) decoded: bool,
}

/// Where a member's canonical value is, until its object is written out in key order.
#[derive(Clone, Copy)]
pub(super) enum Value {
    /// Spelled canonically in the input already (plain strings, literals): copied from there.
    Input { start: usize, end: usize },
    /// Written to the output while parsing (numbers, escaped strings, objects, arrays).
    Generated { start: usize, end: usize },
}

/// One parsed member awaiting its object's closing brace.
#[derive(Clone, Copy)]
pub(super) struct Member {
    pub(super) key: Key,
    /// The input spells the key as `"key":` with no escapes or whitespace, ready to copy.
    pub(super) compact: bool,
    pub(super) value: Value,
}

/// The first 8 bytes of `key` as a big-endian number, zero-padded. Comparing prefixes orders keys
/// exactly like comparing the bytes whenever the prefixes differ: a padding zero can only differ
/// from a real non-zero byte of a longer key, which sorts after it anyway.
#[inline]
pub(super) fn key_prefix(src: &[u8], start: usize, end: usize) -> u64 {
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
pub(super) fn append(out: &mut Vec<u8>, src: &[u8], start: usize, end: usize) {
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
pub(super) const WINDOW: usize = 32;

/// Puts into `order` the indexes of `members` stably sorted by key, unless they are in key
/// order already, which is reported by returning `true`.
pub(super) fn key_order(
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
pub(super) struct Generated<'g> {
    pub(super) bytes: &'g [u8],
    /// Where `bytes` started in the output, which `Value::Generated` offsets count from.
    pub(super) offset: usize,
}

/// Writes member `m`, the `i`th in key order, to `out`.
#[inline(always)]
pub(super) fn emit_member(
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

pub(super) fn write_key(out: &mut Vec<u8>, input: &[u8], keys: &[u8], key: Key) {
    if key.decoded {
        out.push(b'"');
        push_escaped(out, &keys[key.start..key.end]);
        out.push(b'"');
    } else {
        append(out, input, key.start - 1, key.end + 1);
    }
}

pub(super) fn key_bytes<'k>(input: &'k [u8], keys: &'k [u8], key: Key) -> &'k [u8] {
    if key.decoded {
        &keys[key.start..key.end]
    } else {
        &input[key.start..key.end]
    }
}

/// Whether a pointer token names array element `index`: decimal, no leading zeros.
pub(super) fn token_is_index(token: &[u8], index: usize) -> bool {
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
