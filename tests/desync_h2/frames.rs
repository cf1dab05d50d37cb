//! HTTP/2 by hand: the frames a vector is made of (the client preface, SETTINGS, HEADERS
//! with HPACK "literal without indexing, new name" fields, DATA, CONTINUATION), written
//! byte for byte so no client library can refuse or repair a malformed field, and just
//! enough reading to tell an answer's `:status` from RST_STREAM and GOAWAY.

pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub(crate) const DATA: u8 = 0x0;
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const RST_STREAM: u8 = 0x3;
pub(crate) const SETTINGS: u8 = 0x4;
pub(crate) const PING: u8 = 0x6;
pub(crate) const GOAWAY: u8 = 0x7;
pub(crate) const CONTINUATION: u8 = 0x9;

pub(crate) const END_STREAM: u8 = 0x1;
pub(crate) const ACK: u8 = 0x1;
pub(crate) const END_HEADERS: u8 = 0x4;
pub(crate) const PADDED: u8 = 0x8;
pub(crate) const PRIORITY: u8 = 0x20;

/// One frame: the 9-byte frame header, then `payload`.
pub(crate) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The client's SETTINGS: SETTINGS_HEADER_TABLE_SIZE 0, so the server's answers refer
/// to no dynamic table entry and [`status_of`] can read them without one.
pub(crate) fn client_settings() -> Vec<u8> {
    frame(SETTINGS, 0, 0, &[0x00, 0x01, 0, 0, 0, 0])
}

/// An HPACK integer with an `prefix`-bit prefix whose high bits are `first` (RFC 7541
/// §5.1).
fn integer(out: &mut Vec<u8>, first: u8, prefix: u32, mut n: usize) {
    let max = (1usize << prefix) - 1;
    if n < max {
        out.push(first | n as u8);
        return;
    }
    out.push(first | max as u8);
    n -= max;
    while n >= 128 {
        out.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    out.push(n as u8);
}

/// A header block of "literal without indexing, new name" fields, no Huffman (RFC 7541
/// §6.2.2): any bytes at all in a name or a value, pseudo-header fields included.
pub(crate) fn header_block(fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        integer(&mut out, 0, 7, name.len());
        out.extend_from_slice(name);
        integer(&mut out, 0, 7, value.len());
        out.extend_from_slice(value);
    }
    out
}

/// An HPACK integer with a `prefix`-bit prefix at `at`; advances `at`.
fn read_integer(block: &[u8], at: &mut usize, prefix: u32) -> Option<usize> {
    let max = (1usize << prefix) - 1;
    let mut n = usize::from(*block.get(*at)?) & max;
    *at += 1;
    if n < max {
        return Some(n);
    }
    let mut shift = 0;
    loop {
        let b = *block.get(*at)?;
        *at += 1;
        n += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 || shift > 28 {
            return Some(n);
        }
    }
}

/// The `:status` of an answer's header block: indexed from the static table (`0x88`
/// = 200 ... `0x8e` = 500), or a literal with the static `:status` name and a value in
/// plain text or Huffman-coded digits. `None` when it is anything else.
pub(crate) fn status_of(block: &[u8]) -> Option<u16> {
    let mut at = 0;
    // Dynamic table size updates (001xxxxx) may open the block.
    while block.get(at)? & 0xe0 == 0x20 {
        read_integer(block, &mut at, 5)?;
    }
    let first = *block.get(at)?;
    let name_index = if first & 0x80 != 0 {
        let index = read_integer(block, &mut at, 7)?;
        let statuses = [200, 204, 206, 304, 400, 404, 500];
        return index.checked_sub(8).and_then(|i| statuses.get(i)).copied();
    } else if first & 0xc0 == 0x40 {
        read_integer(block, &mut at, 6)?
    } else {
        read_integer(block, &mut at, 4)?
    };
    if !(8..=14).contains(&name_index) {
        return None;
    }
    let huffman = block.get(at)? & 0x80 != 0;
    let len = read_integer(block, &mut at, 7)?;
    let raw = block.get(at..at + len)?;
    let text = if huffman {
        huffman_digits(raw)?
    } else {
        String::from_utf8(raw.to_vec()).ok()?
    };
    text.parse().ok()
}

/// Decodes a Huffman-coded string of digits (RFC 7541 Appendix B: `0`-`2` are the 5-bit
/// codes 00000-00010, `3`-`9` the 6-bit codes 011001-011111), padding of ones at the end.
fn huffman_digits(raw: &[u8]) -> Option<String> {
    let bits: Vec<u8> = raw
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1))
        .collect();
    let value = |from: usize, n: usize| {
        bits.get(from..from + n)
            .map(|s| s.iter().fold(0u8, |v, &b| v << 1 | b))
    };
    let mut out = String::new();
    let mut at = 0;
    while at < bits.len() {
        let rest = &bits[at..];
        if rest.len() < 8 && rest.iter().all(|&b| b == 1) {
            break;
        }
        match value(at, 5)? {
            v @ 0..=2 => {
                out.push(char::from(b'0' + v));
                at += 5;
            }
            _ => match value(at, 6)? {
                v @ 0b011001..=0b011111 => {
                    out.push(char::from(b'3' + v - 0b011001));
                    at += 6;
                }
                _ => return None,
            },
        }
    }
    Some(out)
}

#[test]
fn statuses_decode_in_each_encoding() {
    // Indexed 200 and 400; 201 plain and Huffman-coded; 413 and 502 Huffman-coded.
    assert_eq!(status_of(&[0x88]), Some(200));
    assert_eq!(status_of(&[0x20, 0x8c]), Some(400));
    assert_eq!(status_of(&[0x08, 0x03, b'2', b'0', b'1']), Some(201));
    // 00010 00000 00001, one bit of padding.
    assert_eq!(status_of(&[0x48, 0x82, 0x10, 0x03]), Some(201));
    // 011010 00001 011001, seven bits of padding.
    assert_eq!(status_of(&[0x48, 0x83, 0x68, 0x2c, 0xff]), Some(413));
    // 011011 00000 00010: sixteen bits, no padding.
    assert_eq!(status_of(&[0x08, 0x82, 0x6c, 0x02]), Some(502));
    // Not a status.
    assert_eq!(status_of(&[0x82]), None);
}
