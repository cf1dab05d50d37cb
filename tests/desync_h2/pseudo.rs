//! Vectors on the pseudo-header fields and `:authority` against `host`, and the known
//! bugs. Types and the refusal rules: `corpus.rs`.

use crate::corpus::Expect::{Forwarded, GoAway, Refused, Reset};
use crate::corpus::Head::{Raw, Std};
use crate::corpus::On::Both;
use crate::corpus::{post, v, Vector, ABC, PROTOCOL_ERROR};

/// The pseudo-header fields (RFC 9113 §8.3.1) and `:authority` against `host`.
pub(crate) const PSEUDO: &[Vector] = &[
    v(
        "path_with_space",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"$P x"),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "path_with_crlf",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"$P HTTP/1.1\r\nhost: a\r\n\r\nGET /smuggled"),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "path_empty",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b""),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "path_without_slash",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"x$P"),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "path_absolute_form",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"http://b$P"),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "method_with_space",
        Both,
        Raw(&[
            (b":method", b"POST /x"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"$P"),
            (b"$K", b""),
        ]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    v(
        "method_missing",
        Both,
        Raw(&[
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"$P"),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "scheme_missing",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":authority", b"a"),
            (b":path", b"$P"),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "path_missing",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "path_twice",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"$P"),
            (b":path", b"/smuggled"),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "method_twice",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":method", b"GET"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"$P"),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "authority_twice",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":authority", b"b"),
            (b":path", b"$P"),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "pseudo_after_regular",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b"$K", b""),
            (b":path", b"$P"),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "pseudo_unknown",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"$P"),
            (b":foo", b"1"),
            (b"$K", b""),
        ]),
        ABC,
        GoAway(PROTOCOL_ERROR),
    ),
    // §8.3.1: no userinfo in :authority for http; h2 accepts it, the proxy's admission
    // refuses it as not a host.
    v(
        "authority_with_userinfo",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"user@a"),
            (b":path", b"$P"),
            (b"$K", b""),
        ]),
        ABC,
        Refused(400),
    ),
    v(
        "authority_with_crlf",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"a\r\nx: y"),
            (b":path", b"$P"),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    // §8.3.1: the proxy forwards :authority as the one Host.
    v(
        "host_conflicts_with_authority",
        Both,
        Std(&[(b"host", b"b")]),
        ABC,
        Forwarded(post(b"abc")),
    ),
    v(
        "host_without_authority",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"$P"),
            (b"host", b"a"),
            (b"$K", b""),
        ]),
        ABC,
        Forwarded(post(b"abc")),
    ),
    // CONNECT (RFC 9113 §8.5) is a tunnel, not a request to forward: the proxy answers
    // 501, and the DATA never reach the upstream as bytes after a request head.
    v(
        "connect_with_a_request_in_data",
        Both,
        Raw(&[
            (b":method", b"CONNECT"),
            (b":authority", b"a:80"),
            (b"$K", b""),
        ]),
        crate::corpus::Body::Data(&[b"GET /smuggled HTTP/1.1\r\nhost: a\r\n\r\n"]),
        Refused(501),
    ),
    v(
        "connect_protocol_websocket",
        Both,
        Raw(&[
            (b":method", b"CONNECT"),
            (b":protocol", b"websocket"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"$P"),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "protocol_on_a_post",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":protocol", b"websocket"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"$P"),
            (b"$K", b""),
        ]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    // A GET with a body is a request with a body: the upstream reads it framed, and the
    // request inside it stays body.
    v(
        "get_with_a_request_in_its_body",
        Both,
        Raw(&[
            (b":method", b"GET"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"$P"),
            (b"$K", b""),
        ]),
        crate::corpus::Body::Data(&[b"GET /smuggled HTTP/1.1\r\nhost: a\r\n\r\n"]),
        Forwarded(crate::corpus::Fwd {
            method: "GET",
            target: "$P",
            host: "a",
            body: b"GET /smuggled HTTP/1.1\r\nhost: a\r\n\r\n",
        }),
    ),
    // RFC 9113 §8.3.1: `*` is a :path only for OPTIONS; a POST with it is malformed. h2
    // hands it on; the proxy's admission refuses it (400), as it refuses other malformed
    // targets (`authority_with_userinfo`), so it never reaches the upstream as `POST *`
    // (asterisk-form, which RFC 9112 §3.2.4 allows for OPTIONS only).
    v(
        "path_asterisk",
        Both,
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"*"),
            (b"$K", b""),
        ]),
        ABC,
        Refused(400),
    ),
];
