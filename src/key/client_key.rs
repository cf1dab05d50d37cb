//! The client-supplied `Idempotency-Key` header: an RFC 8941 sf-string (`"..."`) or a bare
//! token, as the IETF httpapi draft and Stripe's API accept it.

use http::header::{HeaderMap, HeaderName};

/// Longest key accepted, in bytes after unquoting (Stripe's limit).
pub const MAX_KEY_LEN: usize = 255;

/// Why a client key was refused; each ends up as a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientKeyError {
    /// The header is absent.
    #[error("the {0} header is missing")]
    Missing(String),
    /// The header appears more than once, so which one counts would be ambiguous.
    #[error("the {0} header appears more than once")]
    Repeated(String),
    /// The value is empty, too long, or has characters outside the allowed set.
    #[error("the {header} header is malformed: {reason}")]
    Malformed {
        /// Header name.
        header: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Reads and validates the key header; returns the key's bytes (unquoted).
///
/// ```
/// use http::{HeaderMap, HeaderValue, header::HeaderName};
/// use idemgate::key::client_key::read_client_key;
/// let name = HeaderName::from_static("idempotency-key");
/// let mut headers = HeaderMap::new();
/// headers.insert(&name, HeaderValue::from_static("\"8e03978e-40d5-43e8-bc93-6894a57f9324\""));
/// assert_eq!(&*read_client_key(&headers, &name).unwrap(), b"8e03978e-40d5-43e8-bc93-6894a57f9324");
/// ```
pub fn read_client_key<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<std::borrow::Cow<'h, [u8]>, ClientKeyError> {
    let mut values = headers.get_all(name).iter();
    let value = values
        .next()
        .ok_or_else(|| ClientKeyError::Missing(name.to_string()))?;
    if values.next().is_some() {
        return Err(ClientKeyError::Repeated(name.to_string()));
    }
    parse_key(value.as_bytes()).map_err(|reason| ClientKeyError::Malformed {
        header: name.to_string(),
        reason,
    })
}

fn parse_key(raw: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, &'static str> {
    let raw = raw.trim_ascii();
    if raw.is_empty() {
        return Err("the key is empty");
    }
    let key = if raw[0] == b'"' {
        parse_sf_string(raw)?
    } else {
        if !raw.iter().all(|&b| is_bare_key_byte(b)) {
            return Err("a bare key may hold only letters, digits and !#$%&'*+-.^_`|~:/=");
        }
        std::borrow::Cow::Borrowed(raw)
    };
    if key.is_empty() {
        return Err("the key is empty");
    }
    if key.len() > MAX_KEY_LEN {
        return Err("the key is longer than 255 bytes");
    }
    Ok(key)
}

/// RFC 8941 §3.3.3: printable ASCII inside quotes, `\"` and `\\` the only escapes.
fn parse_sf_string(raw: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, &'static str> {
    const UNTERMINATED: &str = "a quoted key must end with a closing quote and nothing after it";
    let inner = &raw[1..];
    let mut out: Option<Vec<u8>> = None;
    let mut i = 0;
    while i < inner.len() {
        match inner[i] {
            b'"' => {
                if i + 1 != inner.len() {
                    return Err(UNTERMINATED);
                }
                return Ok(match out {
                    Some(owned) => std::borrow::Cow::Owned(owned),
                    None => std::borrow::Cow::Borrowed(&inner[..i]),
                });
            }
            b'\\' => {
                let next = *inner.get(i + 1).ok_or(UNTERMINATED)?;
                if next != b'"' && next != b'\\' {
                    return Err("only \\\" and \\\\ may be escaped in a quoted key");
                }
                out.get_or_insert_with(|| inner[..i].to_vec()).push(next);
                i += 2;
            }
            b @ 0x20..=0x7e => {
                if let Some(owned) = out.as_mut() {
                    owned.push(b);
                }
                i += 1;
            }
            _ => return Err("a quoted key may hold only printable ASCII"),
        }
    }
    Err(UNTERMINATED)
}

fn is_bare_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/=".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn read(values: &[&str]) -> Result<Vec<u8>, ClientKeyError> {
        let name = HeaderName::from_static("idempotency-key");
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(&name, HeaderValue::from_str(v).unwrap());
        }
        read_client_key(&headers, &name).map(|k| k.into_owned())
    }

    #[test]
    fn bare_tokens_and_uuids_are_accepted() {
        assert_eq!(read(&["abc-123"]).unwrap(), b"abc-123");
        assert_eq!(
            read(&["123e4567-e89b-12d3-a456-426614174000"]).unwrap(),
            b"123e4567-e89b-12d3-a456-426614174000"
        );
        assert_eq!(read(&["dGVzdA=="]).unwrap(), b"dGVzdA==");
    }

    #[test]
    fn quoted_strings_are_unquoted_and_unescaped() {
        assert_eq!(read(&["\"a b\""]).unwrap(), b"a b");
        assert_eq!(read(&[r#""q\"x\\y""#]).unwrap(), br#"q"x\y"#);
        assert_eq!(read(&["\"abc\""]).unwrap(), read(&["abc"]).unwrap());
    }

    #[test]
    fn malformed_keys_are_refused() {
        for bad in [
            "",
            "\"\"",
            "\"open",
            "\"a\"b",
            r#""bad\n""#,
            "a b",
            "a,b",
            "key;param=1",
        ] {
            assert!(
                matches!(read(&[bad]), Err(ClientKeyError::Malformed { .. })),
                "{bad:?}"
            );
        }
        assert!(read(&[&"k".repeat(256)]).is_err());
        assert!(read(&[&"k".repeat(255)]).is_ok());
    }

    #[test]
    fn missing_and_repeated_headers_are_refused() {
        assert!(matches!(read(&[]), Err(ClientKeyError::Missing(_))));
        assert!(matches!(
            read(&["a", "b"]),
            Err(ClientKeyError::Repeated(_))
        ));
    }
}
