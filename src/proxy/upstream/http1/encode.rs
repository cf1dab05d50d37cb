//! The request head, sans IO: the request line and header section of a request that
//! `request::prepare` made ready (origin form, fields cleaned, `X-Forwarded-*` set), with
//! the framing field of the body actually sent, chosen as hyper's client chooses it
//! ([`BodyFraming::of`]).

use bytes::{BufMut, BytesMut};
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::HeaderMap;
use http_body::Body;

use crate::proxy::body::ProxyBody;
use crate::proxy::headers::parse_length;

/// How a request body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFraming {
    /// No body, and no framing field.
    None,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

impl BodyFraming {
    /// The framing of `body` under `headers`, as hyper's client picks it: the field
    /// `request::prepare` set (`Transfer-Encoding: chunked` for a body of unknown length,
    /// `Content-Length: 0` for an empty `POST`, `PUT` or `PATCH`), else the body's exact
    /// length, else chunks.
    pub(crate) fn of(headers: &HeaderMap, body: &ProxyBody) -> Self {
        if headers.contains_key(TRANSFER_ENCODING) {
            return Self::Chunked;
        }
        if let Some(length) = headers.get(CONTENT_LENGTH) {
            return parse_length(length.as_bytes()).map_or(Self::Chunked, Self::Length);
        }
        if body.is_end_stream() {
            return Self::None;
        }
        body.size_hint().exact().map_or(Self::Chunked, Self::Length)
    }

    /// Whether `headers` lack the field that says this framing (it is added then).
    fn unsaid(self, headers: &HeaderMap) -> bool {
        match self {
            Self::None => false,
            Self::Length(_) => !headers.contains_key(CONTENT_LENGTH),
            Self::Chunked => !headers.contains_key(TRANSFER_ENCODING),
        }
    }
}

/// Writes the request line (HTTP/1.1, origin form) and the header section of `parts`,
/// with the framing field of `framing` if `parts` lacks it, into a buffer with `spare`
/// bytes of room left (a small body that goes out in the same write).
pub(crate) fn encode_head(
    parts: &http::request::Parts,
    framing: BodyFraming,
    spare: usize,
) -> BytesMut {
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut head = BytesMut::with_capacity(64 + target.len() + parts.headers.len() * 48 + spare);
    head.put_slice(parts.method.as_str().as_bytes());
    head.put_u8(b' ');
    head.put_slice(target.as_bytes());
    head.put_slice(b" HTTP/1.1\r\n");
    for (name, value) in &parts.headers {
        // `HeaderName` and `HeaderValue` hold no CR or LF: a field cannot end early.
        write_field(&mut head, name.as_str().as_bytes(), value.as_bytes());
    }
    if framing.unsaid(&parts.headers) {
        match framing {
            BodyFraming::Length(n) => {
                write_field(&mut head, b"content-length", n.to_string().as_bytes());
            }
            BodyFraming::Chunked => write_field(&mut head, b"transfer-encoding", b"chunked"),
            BodyFraming::None => {}
        }
    }
    head.put_slice(b"\r\n");
    head
}

/// `name: value` and CRLF.
pub(crate) fn write_field(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.reserve(name.len() + value.len() + 4);
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// The line that opens a chunk of `len` bytes.
pub(crate) fn chunk_line(len: usize) -> BytesMut {
    let mut line = BytesMut::with_capacity(18);
    line.put_slice(format!("{len:X}\r\n").as_bytes());
    line
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::Method;

    use super::*;

    fn parts(request: http::request::Builder) -> http::request::Parts {
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn request_heads_carry_the_framing_of_the_body_sent() {
        let mut post = parts(
            http::Request::post("/orders?x=1")
                .header("host", "shop.example")
                .header("x-forwarded-for", "10.0.0.1"),
        );
        let body = ProxyBody::full(Bytes::from_static(b"{}"));
        let framing = BodyFraming::of(&post.headers, &body);
        assert_eq!(framing, BodyFraming::Length(2));
        assert_eq!(
            encode_head(&post, framing, 2),
            "POST /orders?x=1 HTTP/1.1\r\nhost: shop.example\r\nx-forwarded-for: 10.0.0.1\r\n\
             content-length: 2\r\n\r\n"
        );
        // The field prepare set is not said twice.
        post.headers
            .insert(TRANSFER_ENCODING, "chunked".parse().unwrap());
        let framing = BodyFraming::of(&post.headers, &body);
        assert_eq!(framing, BodyFraming::Chunked);
        let head = encode_head(&post, framing, 0);
        assert_eq!(
            String::from_utf8_lossy(&head)
                .matches("transfer-encoding")
                .count(),
            1
        );
        let mut get = parts(http::Request::get("/").header("host", "h"));
        get.method = Method::GET;
        let framing = BodyFraming::of(&get.headers, &ProxyBody::empty());
        assert_eq!(framing, BodyFraming::None);
        assert_eq!(
            encode_head(&get, framing, 0),
            "GET / HTTP/1.1\r\nhost: h\r\n\r\n"
        );
    }

    #[test]
    fn chunk_lines_are_hex() {
        assert_eq!(chunk_line(255), "FF\r\n");
        assert_eq!(chunk_line(1), "1\r\n");
    }
}
