//! RFC 6901 JSON pointers: parsing them once at config load, printing them back, and pulling
//! the canonical form of the values they designate out of a body in a single streaming pass.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use super::json::{self, JsonError};

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

/// Canonical JSON of the value each pointer designates (`None` when absent), found in one pass
/// without building a tree.
///
/// Array indexes are decimal tokens without leading zeros (`"0"`, `"12"`; `"01"` and `"-"` match
/// nothing). The whole document is validated with the same rules and depth limit as
/// [`canonical_json`](super::canonical_json): invalid JSON anywhere is an error even when every
/// pointer was already found. Extracted values use the canonical form with nothing ignored. When a
/// duplicate key makes a pointer ambiguous, the last occurrence wins, as in most JSON parsers.
///
/// ```rust
/// use idemgate::canonical::{extract_fields, JsonPointer};
///
/// let body = br#"{"order": {"id": 7, "lines": [{"b": 1, "a": 2.0}]}, "ts": 1}"#;
/// let pointers = [
///     JsonPointer::parse("/order/lines/0").unwrap(),
///     JsonPointer::parse("/order/id").unwrap(),
///     JsonPointer::parse("/missing").unwrap(),
/// ];
/// let found = extract_fields(body, &pointers).unwrap();
/// assert_eq!(found[0].as_deref(), Some(&br#"{"a":2e0,"b":1e0}"#[..]));
/// assert_eq!(found[1].as_deref(), Some(&b"7e0"[..]));
/// assert_eq!(found[2], None);
/// ```
pub fn extract_fields(
    input: &[u8],
    pointers: &[JsonPointer],
) -> Result<Vec<Option<Vec<u8>>>, JsonError> {
    let mut found = vec![None; pointers.len()];
    json::extract_into(input, pointers, &mut found)?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptr(s: &str) -> JsonPointer {
        JsonPointer::parse(s).unwrap()
    }

    fn extract_one(body: &str, pointer: &str) -> Option<String> {
        let found = extract_fields(body.as_bytes(), &[ptr(pointer)]).unwrap();
        found
            .into_iter()
            .next()
            .unwrap()
            .map(|v| String::from_utf8(v).unwrap())
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

    #[test]
    fn extracts_nested_object_values_in_canonical_form() {
        let body = r#"{"order": {"customer": {"name": "Ann", "id": 10.0}, "total": 1.50}}"#;
        assert_eq!(
            extract_one(body, "/order/customer").as_deref(),
            Some(r#"{"id":1e1,"name":"Ann"}"#)
        );
        assert_eq!(extract_one(body, "/order/total").as_deref(), Some("15e-1"));
        assert_eq!(
            extract_one(body, "/order/customer/name").as_deref(),
            Some(r#""Ann""#)
        );
    }

    #[test]
    fn extracts_array_elements_by_index() {
        let body = r#"{"items": [{"sku": "a"}, {"sku": "b", "qty": 2}], "tags": ["x", ["y"]]}"#;
        assert_eq!(extract_one(body, "/items/1/sku").as_deref(), Some(r#""b""#));
        assert_eq!(
            extract_one(body, "/items/1").as_deref(),
            Some(r#"{"qty":2e0,"sku":"b"}"#)
        );
        assert_eq!(extract_one(body, "/tags/1/0").as_deref(), Some(r#""y""#));
        assert_eq!(extract_one(body, "/items/2"), None);
        // Leading zeros and "-" never name an existing element.
        assert_eq!(extract_one(body, "/items/01"), None);
        assert_eq!(extract_one(body, "/items/-"), None);
        assert_eq!(extract_one(r#"{"0": 1}"#, "/0").as_deref(), Some("1e0"));
    }

    #[test]
    fn missing_paths_yield_none() {
        let body = r#"{"a": {"b": [1, 2]}, "c": "str"}"#;
        assert_eq!(extract_one(body, "/x"), None);
        assert_eq!(extract_one(body, "/a/x"), None);
        assert_eq!(extract_one(body, "/a/b/5"), None);
        assert_eq!(extract_one(body, "/c/0"), None);
        assert_eq!(extract_one(body, "/a/b/0/x"), None);
    }

    #[test]
    fn escaped_tokens_match_keys_containing_slash_and_tilde() {
        let body = r#"{"a/b": 1, "c~d": {"e": 2}, "a": {"b": 3}}"#;
        assert_eq!(extract_one(body, "/a~1b").as_deref(), Some("1e0"));
        assert_eq!(extract_one(body, "/c~0d/e").as_deref(), Some("2e0"));
        assert_eq!(extract_one(body, "/a/b").as_deref(), Some("3e0"));
    }

    #[test]
    fn pointer_tokens_match_keys_after_json_unescaping() {
        let body = r#"{"k\u00e9y": {"\"q\"": true}}"#;
        assert_eq!(extract_one(body, "/kéy/\"q\"").as_deref(), Some("true"));
    }

    #[test]
    fn root_pointer_extracts_the_canonical_document() {
        assert_eq!(
            extract_one(r#" {"b": [1.0], "a": null} "#, "").as_deref(),
            Some(r#"{"a":null,"b":[1e0]}"#)
        );
    }

    #[test]
    fn several_pointers_are_answered_in_order() {
        let body = r#"{"x": 1, "y": {"z": [true, false]}}"#;
        let found = extract_fields(
            body.as_bytes(),
            &[ptr("/y/z/1"), ptr("/nope"), ptr("/x"), ptr("/x")],
        )
        .unwrap();
        assert_eq!(
            found,
            vec![
                Some(b"false".to_vec()),
                None,
                Some(b"1e0".to_vec()),
                Some(b"1e0".to_vec())
            ]
        );
    }

    #[test]
    fn duplicate_keys_resolve_to_the_last_occurrence() {
        assert_eq!(
            extract_one(r#"{"a": 1, "a": 2}"#, "/a").as_deref(),
            Some("2e0")
        );
    }

    #[test]
    fn invalid_json_after_the_match_is_still_an_error() {
        let err = extract_fields(br#"{"a": 1, "b": tru}"#, &[ptr("/a")]).unwrap_err();
        assert!(matches!(err, JsonError::Invalid(_)));
        assert_eq!(
            extract_fields(br#"{"a": 1} x"#, &[ptr("/a")]),
            Err(JsonError::Invalid(9))
        );
    }

    #[test]
    fn extraction_enforces_the_depth_limit() {
        let deep = "[".repeat(10_000);
        assert_eq!(
            extract_fields(deep.as_bytes(), &[ptr("/0")]),
            Err(JsonError::TooDeep)
        );
    }

    #[test]
    fn no_pointers_still_validates() {
        assert_eq!(extract_fields(b"[1, 2]", &[]), Ok(vec![]));
        assert!(extract_fields(b"[1, 2,]", &[]).is_err());
    }
}
