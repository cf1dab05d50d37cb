//! Numbers: digit runs and the exact decimal exponent form canonical numbers are written in.

use super::*;

/// Returns the offset of the first non-digit at or after `i`.
#[inline(always)]
pub(super) fn skip_digits(input: &[u8], mut i: usize) -> usize {
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
pub(super) fn push_exponent(out: &mut Vec<u8>, value: i64) {
    // Most exponents are a single digit.
    match value {
        0..=9 => out.push(b'0' + value as u8),
        -9..=-1 => out.extend_from_slice(&[b'-', b'0' + value.unsigned_abs() as u8]),
        _ => push_i64(out, value),
    }
}

pub(super) fn push_i64(out: &mut Vec<u8>, value: i64) {
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
