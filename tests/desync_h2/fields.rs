//! Vectors on field names and values: connection-specific fields, bytes no field may
//! carry, and request trailers. Types and the refusal rules: `corpus.rs`.

use crate::corpus::Body::{Data, Trailers};
use crate::corpus::Expect::{Forwarded, GoAway, Reset};
use crate::corpus::Head::Std;
use crate::corpus::On::{Both, Open};
use crate::corpus::{framed, post, v, HeadFrames, Vector, ABC, PROTOCOL_ERROR};

/// Field names and values: connection-specific fields (RFC 9113 §8.2.2) and bytes no
/// field may carry (§8.2.1), hand-encoded so no client library repairs them.
pub(crate) const FIELDS: &[Vector] = &[
    v(
        "connection_close",
        Both,
        Std(&[(b"connection", b"close")]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "connection_keep_alive",
        Both,
        Std(&[(b"connection", b"keep-alive")]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "keep_alive",
        Both,
        Std(&[(b"keep-alive", b"timeout=5")]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "proxy_connection",
        Both,
        Std(&[(b"proxy-connection", b"keep-alive")]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "upgrade",
        Both,
        Std(&[(b"upgrade", b"websocket")]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "te_gzip",
        Both,
        Std(&[(b"te", b"gzip")]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    // §8.2.2: te may be present with the value "trailers" alone.
    v(
        "te_trailers",
        Both,
        Std(&[(b"te", b"trailers")]),
        ABC,
        Forwarded(post(b"abc")),
    ),
    v(
        "value_with_cr",
        Both,
        Std(&[(b"x-a", b"1\rGET /smuggled HTTP/1.1")]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    v(
        "value_with_lf",
        Both,
        Std(&[(b"x-a", b"1\nGET /smuggled HTTP/1.1")]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    v(
        "value_with_crlf_and_a_field",
        Both,
        Std(&[(b"x-a", b"1\r\ntransfer-encoding: chunked")]),
        Data(&[b"0\r\n\r\n"]),
        GoAway(PROTOCOL_ERROR),
    ),
    v(
        "value_with_nul",
        Both,
        Std(&[(b"x-a", b"1\0")]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    // §8.2.1 makes a value with leading whitespace malformed; h2 does not check, and the
    // proxy forwards it: harmless, as an HTTP/1.1 reader strips the whitespace around a
    // field value (RFC 9112 §5.1) and reads the same request.
    v(
        "value_leading_space",
        Both,
        Std(&[(b"x-a", b" 1")]),
        ABC,
        Forwarded(post(b"abc")),
    ),
    v(
        "name_with_cr",
        Both,
        Std(&[(b"x-a\rb", b"1")]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    v(
        "name_with_lf",
        Both,
        Std(&[(b"x-a\nb", b"1")]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    v(
        "name_with_nul",
        Both,
        Std(&[(b"x-a\0", b"1")]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    v(
        "name_uppercase",
        Both,
        Std(&[(b"X-Upper", b"1")]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    v(
        "name_uppercase_content_length",
        Both,
        Std(&[(b"Content-Length", b"5")]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    v(
        "name_with_space",
        Both,
        Std(&[(b"x a", b"1")]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    v(
        "name_with_colon",
        Both,
        Std(&[(b"x:a", b"1")]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    v(
        "name_empty",
        Both,
        Std(&[(b"", b"1")]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    v(
        "name_content_length_with_a_space",
        Both,
        Std(&[(b"content-length ", b"40")]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    framed(
        "value_with_crlf_across_continuation",
        HeadFrames::Continuation,
        Std(&[(b"x-a", b"1\r\ntransfer-encoding: chunked"), (b"x-b", b"2")]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    // Request trailers (RFC 9113 §8.1): on the streamed route they end the body; the
    // upstream reads the body the DATA frames carried.
    v(
        "trailers",
        Open,
        Std(&[]),
        Trailers(&[b"abc"], &[(b"x-trailer", b"1")]),
        Forwarded(post(b"abc")),
    ),
    v(
        "trailers_with_content_length",
        Open,
        Std(&[(b"content-length", b"3")]),
        Trailers(&[b"abc"], &[(b"x-trailer", b"1")]),
        Forwarded(post(b"abc")),
    ),
    v(
        "trailer_with_transfer_encoding",
        Open,
        Std(&[]),
        Trailers(&[b"abc"], &[(b"transfer-encoding", b"chunked")]),
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "trailer_with_crlf",
        Open,
        Std(&[]),
        Trailers(
            &[b"abc"],
            &[(b"x-trailer", b"1\r\n\r\nGET /smuggled HTTP/1.1")],
        ),
        GoAway(PROTOCOL_ERROR),
    ),
];
