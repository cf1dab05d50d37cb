//! Strings: the scan for the end of plain content (8 bytes at a time, or memchr for long
//! runs), UTF-8 validation, escape decoding and minimal re-escaping.

use super::*;

/// Bytes that may appear raw inside a string and need no attention: printable ASCII except `"`
/// and `\`.
pub(super) static PLAIN: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0x20;
    while b < 0x80 {
        table[b] = b != b'"' as usize && b != b'\\' as usize;
        b += 1;
    }
    table
};

pub(super) const ONES: u64 = 0x0101_0101_0101_0101;
pub(super) const HIGHS: u64 = 0x8080_8080_8080_8080;

/// High bit set in each byte lane of `v` that is `"`, `\`, a control character or non-ASCII.
/// Borrows in the arithmetic can only flag lanes above a genuine hit, so the lowest flag is exact.
#[inline]
pub(super) fn special_lanes(v: u64) -> u64 {
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
pub(super) fn scan_plain(input: &[u8], i: usize) -> Result<usize, JsonError> {
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
/// in one pass the compiler vectorizes, cheaper per byte than the 8-byte loop; a run that
/// is not plain ASCII is scanned again by [`scan_plain_long`].
#[inline(never)]
pub(super) fn scan_plain_ascii_run(input: &[u8], i: usize) -> Result<usize, JsonError> {
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
pub(super) fn scan_plain_long(input: &[u8], mut i: usize) -> Result<usize, JsonError> {
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
pub(super) fn skip_utf8(input: &[u8], i: usize) -> Result<usize, JsonError> {
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
pub(super) fn decode_escaped(
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
pub(super) fn decode_unicode_escape(input: &[u8], i: usize) -> Result<(char, usize), JsonError> {
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

pub(super) fn hex4(input: &[u8], i: usize) -> Option<u32> {
    let digits = input.get(i..i + 4)?;
    let mut value = 0;
    for &d in digits {
        value = value * 16 + char::from(d).to_digit(16)?;
    }
    Some(value)
}

pub(super) fn push_escaped_char(out: &mut Vec<u8>, c: char) {
    if c.is_ascii() {
        push_escaped_byte(out, c as u8);
    } else {
        let mut utf8 = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
    }
}

#[inline]
pub(super) fn push_escaped_byte(out: &mut Vec<u8>, b: u8) {
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
pub(super) fn push_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
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

impl Parser<'_, '_> {
    #[inline(always)]
    pub(super) fn string_value(&mut self, out: &mut Vec<u8>) -> Result<(), JsonError> {
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
    pub(super) fn key(&mut self) -> Result<Key, JsonError> {
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
}
