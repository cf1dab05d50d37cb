//! The answer head, sans IO: [`parse_head`] takes one status line and header section off
//! the front of the bytes read from the upstream and says where the body ends
//! ([`Framing`], RFC 9112 §6.3) and whether the connection may carry another request.
//!
//! It accepts and refuses what hyper's client (`hyper::proto::h1::role::Client`) does, with
//! its limits, so that switching `connections.upstream_http1` changes no outcome; where
//! hyper hands on an answer that `request::check_answer` then refuses (both framings, a
//! coding besides `chunked`), it refuses it here already, with the same 502.

use std::io;
use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};

use crate::proxy::headers::{connection_has, is_chunked_alone, parse_length};

/// The largest answer head read: hyper's default read buffer limit (8 KiB + 100 × 4 KiB).
pub(crate) const MAX_HEAD: usize = 8192 + 4096 * 100;
/// Header lines per answer head: hyper's default.
pub(crate) const MAX_HEADERS: usize = 100;
/// The largest `Content-Length` taken: hyper's (`DecodedLength`), which keeps the two
/// values above it to mean "chunked" and "until close".
const MAX_LENGTH: u64 = u64::MAX - 2;

/// How an answer's body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body: an answer to `HEAD`, `1xx`, `204`, `304`, or `Content-Length: 0`.
    Empty,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the upstream closes the connection.
    Close,
    /// `101 Switching Protocols`: the connection now carries another protocol.
    Upgrade,
}

/// An answer head as read from the upstream.
#[derive(Debug)]
pub(crate) struct Head {
    /// Status, version and every field as the upstream sent them (hyper's client too
    /// hands them on whole; the caller strips hop-by-hop fields).
    pub parts: http::response::Parts,
    /// Where the body ends.
    pub framing: Framing,
    /// Whether the connection may carry another request after this answer's body: the
    /// upstream lets it (HTTP/1.1 without `close`, or HTTP/1.0 with `keep-alive`) and the
    /// body's end is marked by its framing rather than by a close.
    pub keep_alive: bool,
}

/// Why a head was refused: the upstream broke the protocol.
pub(crate) fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Parses one answer head to `method` off the front of `read`. `Ok(None)`: the head is not
/// complete yet, and `read` is left as it was. `Ok(Some)`: the head's bytes are consumed
/// and `read` starts with the body's. An error: the head is malformed or ambiguous (the
/// caller must not use the connection again); `read` is left as it was.
pub(crate) fn parse_head(read: &mut BytesMut, method: &Method) -> io::Result<Option<Head>> {
    // Uninitialised slots: zeroing a hundred of them costs more than parsing a typical head.
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        read,
        &mut fields,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if read.len() >= MAX_HEAD => {
            return Err(invalid("the upstream's answer head is too large"))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(invalid("the upstream's answer has too many headers"))
        }
        Err(_) => return Err(invalid("the upstream's answer head is malformed")),
    };
    if len > MAX_HEAD {
        return Err(invalid("the upstream's answer head is too large"));
    }
    let status = response
        .code
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or_else(|| invalid("the upstream's answer has an invalid status"))?;
    let version = if response.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // Values are slices of one copy of the head rather than a copy each.
    let bytes = Bytes::copy_from_slice(&read[..len]);
    let base = read.as_ptr() as usize;
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    let mut transfer_encoded = false;
    let mut has_length = false;
    for field in response.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| invalid("the upstream sent an invalid header name"))?;
        let start = field.value.as_ptr() as usize - base;
        let value = HeaderValue::from_maybe_shared(bytes.slice(start..start + field.value.len()))
            .map_err(|_| invalid("the upstream sent an invalid header value"))?;
        transfer_encoded |= name == TRANSFER_ENCODING;
        has_length |= name == CONTENT_LENGTH;
        headers.append(name, value);
    }
    let framing = framing(
        method,
        status,
        version,
        &headers,
        transfer_encoded,
        has_length,
    )?;
    read.advance(len);
    let keep_alive = framing != Framing::Close
        && super::super::request::keeps_alive(version, &headers)
        // hyper reads `Connection` only where it is visible ASCII (`HeaderValue::to_str`),
        // as `connection_has` does: to it an HTTP/1.0 `keep-alive` beside obs-text is
        // none, so it closes the connection. This side reuses none hyper would close.
        && (version == Version::HTTP_11 || connection_has(&headers, "keep-alive"));
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = version;
    parts.headers = headers;
    Ok(Some(Head {
        parts,
        framing,
        keep_alive,
    }))
}

/// Where the body of an answer with this head ends (RFC 9112 §6.3, in its order).
fn framing(
    method: &Method,
    status: StatusCode,
    version: Version,
    headers: &HeaderMap,
    transfer_encoded: bool,
    has_length: bool,
) -> io::Result<Framing> {
    // Rule 1 (and 2 for 101): these end at their head whatever their fields say; hyper
    // reads neither field on them, and `check_answer` drops a length that is no number.
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Ok(Framing::Upgrade);
    }
    if *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::Empty);
    }
    if transfer_encoded {
        // RFC 9112 §6.1: HTTP/1.0 has no transfer codings; hyper refuses it so.
        if version == Version::HTTP_10 {
            return Err(invalid("the upstream sent Transfer-Encoding in HTTP/1.0"));
        }
        // Rule 3: both framings may be an attempt to desynchronise and "ought to be
        // handled as an error"; rule 4: a coding besides chunked would reach the client
        // unmarked. A 502 either way, never a guess.
        let codings = headers.get_all(TRANSFER_ENCODING);
        if has_length || !is_chunked_alone(codings.iter().map(HeaderValue::as_bytes)) {
            return Err(invalid(
                "the upstream's answer is framed both ways or coded besides chunked",
            ));
        }
        return Ok(Framing::Chunked);
    }
    if !has_length {
        // Rule 8.
        return Ok(Framing::Close);
    }
    // Rule 5: `5, 5` and repeated equal values are one length; anything else is invalid.
    let mut length: Option<u64> = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        for item in value.as_bytes().split(|&b| b == b',') {
            let n = parse_length(item)
                .filter(|&n| n <= MAX_LENGTH)
                .ok_or_else(|| invalid("the upstream sent an invalid Content-Length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(invalid("the upstream sent conflicting Content-Lengths"));
            }
            length = Some(n);
        }
    }
    Ok(match length {
        Some(0) | None => Framing::Empty,
        Some(n) => Framing::Length(n),
    })
}

#[cfg(test)]
#[path = "head/tests.rs"]
mod tests;
