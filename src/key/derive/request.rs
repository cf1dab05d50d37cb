//! The canonical request a fingerprint hashes: operation, path, query and body, each part
//! in canonical form, and the body read as the app would by its media type.

use http::{header, HeaderMap};

use crate::canonical::query::canonical_form;
use crate::canonical::{canonical_json, canonical_query, IgnoreSet};

/// How an app reads a body, by its `Content-Type` (the first one, as Go's `Header.Get` and
/// Node read it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BodyType<'h> {
    /// `application/json` or any `*/*+json`.
    Json,
    /// `application/x-www-form-urlencoded`.
    Form,
    /// Anything else, as sent (empty when absent): an app that parses JSON only when it is
    /// typed so (Express's `express.json()`) leaves such a body unread.
    Other(&'h [u8]),
}

impl<'h> BodyType<'h> {
    pub(super) fn of(headers: &'h HeaderMap) -> Self {
        let Some(value) = headers.get(header::CONTENT_TYPE) else {
            return Self::Other(b"");
        };
        let bytes = value.as_bytes();
        let essence = bytes.split(|&b| b == b';').next().unwrap_or_default();
        let essence = essence.trim_ascii();
        if essence.eq_ignore_ascii_case(b"application/x-www-form-urlencoded") {
            return Self::Form;
        }
        let json = essence.eq_ignore_ascii_case(b"application/json")
            || essence.len() > 5
                && essence[essence.len() - 5..].eq_ignore_ascii_case(b"+json")
                && essence.contains(&b'/');
        if json {
            Self::Json
        } else {
            Self::Other(bytes)
        }
    }
}

/// Writes `method path\nquery\nbody` in canonical form (`operation`: the method with any
/// override the request sends, see [`super::method::operation`]): query and form bodies
/// sorted, JSON canonicalized, anything else (or invalid JSON) as raw bytes. Each part
/// carries a tag so a raw body can never collide with a canonical one.
///
/// A non-empty body typed neither JSON nor form is preceded by `\ntype:` and its
/// `Content-Type` as sent (a field value holds no newline): the same bytes typed as JSON
/// are another request to an app that parses JSON by its type. JSON- and form-typed bodies,
/// and empty ones, which every app reads alike, are written as they always were.
pub(super) fn write_canonical_request(
    req: &super::RequestView<'_>,
    operation: &[u8],
    query: bool,
    body: bool,
    ignore: &IgnoreSet,
    out: &mut Vec<u8>,
    mut ignored: Option<&mut Vec<String>>,
) {
    out.extend_from_slice(operation);
    out.push(b' ');
    out.extend_from_slice(req.path.as_bytes());
    out.extend_from_slice(b"\nquery:");
    if query {
        if let Some(q) = req.query {
            canonical_query(q, ignore, out, ignored.as_deref_mut());
        }
    }
    if !body {
        return;
    }
    match BodyType::of(req.headers) {
        BodyType::Form => {
            out.extend_from_slice(b"\nform:");
            canonical_form(req.body, ignore, out, ignored.as_deref_mut());
            return;
        }
        BodyType::Other(media_type) if !req.body.is_empty() => {
            out.extend_from_slice(b"\ntype:");
            out.extend_from_slice(media_type);
        }
        BodyType::Json | BodyType::Other(_) => {}
    }
    let start = out.len();
    out.extend_from_slice(b"\njson:");
    let mut skipped = Vec::new();
    let collect = ignored.is_some().then_some(&mut skipped);
    match canonical_json(req.body, ignore, out, collect) {
        Ok(()) => {
            if let Some(list) = ignored {
                list.extend(skipped);
            }
        }
        Err(_) => {
            out.truncate(start);
            out.extend_from_slice(b"\nraw:");
            out.extend_from_slice(req.body);
        }
    }
}
