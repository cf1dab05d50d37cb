//! Numbers: parsed strictly and written in their exact decimal exponent form (digit runs
//! found 8 bytes at a time, no float conversion).

use super::*;

/// Exponent literals of this magnitude or more are rejected: below it every exponent adjustment
/// stays exact in `i64`, so distinct numbers can never collapse onto the same canonical form.
const MAX_EXPONENT: i64 = 1_000_000_000_000_000;

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

impl Parser<'_, '_> {
    pub(super) fn number(&mut self, out: &mut Vec<u8>) -> Result<(), JsonError> {
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
