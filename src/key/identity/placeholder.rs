//! Values that name no one: what a client sends in place of a credential it does not have.
//! Every anonymous client of an app sends the same one, so keyed by it they would all be
//! one caller. Taking a real value for one of these only makes a caller fall back to a
//! tier that holds more (its address), which at worst runs a retry again.

/// Values a logged-out client sends for a token it does not have, by formatting a missing
/// one into `Bearer {token}`: JavaScript's `null`, `undefined`, `NaN`, `false` and the
/// `[object …]` spellings, Python's `None`, Ruby's and Lua's `nil`, Go's `<nil>`. Shared by
/// every anonymous caller that sends them, as is any of them in quotes (`"undefined"`).
const PLACEHOLDERS: &[&[u8]] = &[
    b"null",
    b"undefined",
    b"[object Object]",
    b"[object Undefined]",
    b"[object Null]",
    b"None",
    b"nil",
    b"<nil>",
    b"false",
    b"NaN",
];

/// Whether `value` names no one: empty, a script's placeholder ([`PLACEHOLDERS`], any
/// case) or a template nobody filled in ([`is_template`]), bare or in one pair of quotes.
pub(super) fn is_placeholder(value: &[u8]) -> bool {
    let value = unquote(value.trim_ascii());
    value.is_empty()
        || PLACEHOLDERS.iter().any(|p| p.eq_ignore_ascii_case(value))
        || is_template(value)
}

/// `value` without one pair of matching quotes around it (a JSON string's, a shell's).
fn unquote(value: &[u8]) -> &[u8] {
    match value {
        [open @ (b'"' | b'\''), inner @ .., close] if open == close => inner.trim_ascii(),
        _ => value,
    }
}

/// Whether `value` is a template's slot left as written: `{{token}}` (Postman, Mustache),
/// `${token}` (a shell, a JavaScript template string), `{token}` (Python's format),
/// `<token>` (documentation's), `%s` (printf's). Only a name goes inside, so a JSON value
/// (`{"a":1}`) or an opaque token with such a character is still a value.
fn is_template(value: &[u8]) -> bool {
    let slot = |open: &[u8], close: &[u8]| {
        value
            .strip_prefix(open)
            .and_then(|v| v.strip_suffix(close))
            .is_some_and(|name| {
                name.iter()
                    .all(|&b| b.is_ascii_alphanumeric() || b"_-. ".contains(&b))
            })
    };
    let printf = matches!(value, [b'%', rest @ ..]
        if (1..=2).contains(&rest.len()) && rest.iter().all(|&b| b.is_ascii_alphabetic() || b == b'@'));
    slot(b"{{", b"}}") || slot(b"${", b"}") || slot(b"{", b"}") || slot(b"<", b">") || printf
}

/// Whether the credentials of a `Basic` scheme are a pair with no one in it: base64 (with
/// or without its padding) of `:`, an empty user and password, or of placeholders
/// (`undefined:undefined`, what `btoa(user + ":" + pass)` makes of two missing values). A
/// user with an empty password, or a password alone, is someone's; a value that is not
/// base64 is an opaque one.
pub(super) fn is_empty_basic_pair(credentials: &[u8]) -> bool {
    // Anything longer holds more than two placeholders: decoded only when short enough.
    if credentials.len() > 64 {
        return false;
    }
    let Some(decoded) = decode_base64(credentials) else {
        return false;
    };
    match decoded.iter().position(|&b| b == b':') {
        Some(colon) => is_placeholder(&decoded[..colon]) && is_placeholder(&decoded[colon + 1..]),
        None => is_placeholder(&decoded),
    }
}

/// Standard base64, its `=` padding optional; `None` for any other character.
fn decode_base64(text: &[u8]) -> Option<Vec<u8>> {
    let text = text
        .strip_suffix(b"==")
        .or_else(|| text.strip_suffix(b"="))
        .unwrap_or(text);
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in text {
        let sextet = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(sextet);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}
