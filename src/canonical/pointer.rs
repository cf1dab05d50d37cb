//! RFC 6901 JSON pointers: parsing them once at config load and printing them back. The JSON
//! parser (`json`) matches them while it streams a body, to skip or extract the values they
//! designate; it imports this module, never the other way round.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// An RFC 6901 JSON pointer, parsed once at config load.
///
/// The reference tokens are kept unescaped (`~1` already turned into `/`, `~0` into `~`) so that
/// matching against decoded object keys is a plain byte comparison.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JsonPointer {
    tokens: Vec<String>,
}

/// Why a string is not a JSON pointer.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PointerError {
    /// A non-empty pointer must begin with `/`.
    #[error("JSON pointer must be empty or start with '/'")]
    MissingSlash,
    /// A `~` not followed by `0` or `1`.
    #[error("invalid escape at byte {0} of JSON pointer: '~' must be followed by '0' or '1'")]
    BadEscape(usize),
}

impl JsonPointer {
    /// Parses an RFC 6901 pointer such as `/items/0/sku` or `/a~1b` (the key `a/b`).
    ///
    /// The empty string designates the whole document.
    pub fn parse(s: &str) -> Result<Self, PointerError> {
        if s.is_empty() {
            return Ok(Self::root());
        }
        let rest = s.strip_prefix('/').ok_or(PointerError::MissingSlash)?;
        let mut tokens = Vec::new();
        // Byte offsets in errors refer to the original string, so track where each token starts.
        let mut offset = 1;
        for raw in rest.split('/') {
            tokens.push(unescape_token(raw, offset)?);
            offset += raw.len() + 1;
        }
        Ok(Self { tokens })
    }

    /// The pointer to the whole document (`""`).
    pub fn root() -> Self {
        Self { tokens: Vec::new() }
    }

    /// Builds a pointer from already-unescaped reference tokens.
    pub fn from_tokens<T: Into<String>>(tokens: impl IntoIterator<Item = T>) -> Self {
        Self {
            tokens: tokens.into_iter().map(Into::into).collect(),
        }
    }

    /// The unescaped reference tokens, outermost first.
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// Whether this pointer designates the whole document.
    pub fn is_root(&self) -> bool {
        self.tokens.is_empty()
    }
}

fn unescape_token(raw: &str, offset: usize) -> Result<String, PointerError> {
    if !raw.contains('~') {
        return Ok(raw.to_owned());
    }
    let mut token = String::with_capacity(raw.len());
    let mut chars = raw.char_indices();
    while let Some((i, c)) = chars.next() {
        if c != '~' {
            token.push(c);
            continue;
        }
        match chars.next() {
            Some((_, '0')) => token.push('~'),
            Some((_, '1')) => token.push('/'),
            _ => return Err(PointerError::BadEscape(offset + i)),
        }
    }
    Ok(token)
}

/// Appends `token` with RFC 6901 escaping (`~` → `~0`, `/` → `~1`).
pub(crate) fn push_escaped_token(out: &mut String, token: &str) {
    for c in token.chars() {
        match c {
            '~' => out.push_str("~0"),
            '/' => out.push_str("~1"),
            c => out.push(c),
        }
    }
}

impl FromStr for JsonPointer {
    type Err = PointerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        for token in &self.tokens {
            s.push('/');
            push_escaped_token(&mut s, token);
        }
        f.write_str(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptr(s: &str) -> JsonPointer {
        JsonPointer::parse(s).unwrap()
    }

    #[test]
    fn empty_pointer_is_the_whole_document() {
        let p = ptr("");
        assert!(p.is_root());
        assert!(p.tokens().is_empty());
        assert_eq!(p.to_string(), "");
    }

    #[test]
    fn tokens_are_split_on_slashes_and_unescaped() {
        assert_eq!(ptr("/a/b").tokens(), ["a", "b"]);
        assert_eq!(ptr("/a~1b/c~0d").tokens(), ["a/b", "c~d"]);
        // ~01 is "~1" literally, not "/": unescaping is a single left-to-right pass.
        assert_eq!(ptr("/~01").tokens(), ["~1"]);
        assert_eq!(ptr("/").tokens(), [""]);
        assert_eq!(ptr("//").tokens(), ["", ""]);
        assert_eq!(ptr("/é/ü").tokens(), ["é", "ü"]);
    }

    #[test]
    fn pointer_without_leading_slash_is_rejected() {
        assert_eq!(JsonPointer::parse("a/b"), Err(PointerError::MissingSlash));
        assert_eq!(JsonPointer::parse("#/a"), Err(PointerError::MissingSlash));
    }

    #[test]
    fn tilde_must_be_followed_by_zero_or_one() {
        assert_eq!(JsonPointer::parse("/a~2"), Err(PointerError::BadEscape(2)));
        assert_eq!(JsonPointer::parse("/ab/~"), Err(PointerError::BadEscape(4)));
        assert_eq!(JsonPointer::parse("/x~é"), Err(PointerError::BadEscape(2)));
    }

    #[test]
    fn display_round_trips_through_parse() {
        for s in [
            "",
            "/",
            "/a",
            "/a~1b",
            "/m~0n",
            "/items/0/sku",
            "//x/",
            "/~01/~10",
        ] {
            let p: JsonPointer = s.parse().unwrap();
            assert_eq!(p.to_string(), s);
            assert_eq!(JsonPointer::parse(&p.to_string()).unwrap(), p);
        }
    }

    #[test]
    fn from_tokens_escapes_on_display() {
        let p = JsonPointer::from_tokens(["a/b", "c~d"]);
        assert_eq!(p.to_string(), "/a~1b/c~0d");
        assert_eq!(ptr("/a~1b/c~0d"), p);
    }
}
