//! Issue 24: the classic request-smuggling and desync vectors, sent as raw bytes to a
//! running idemgate, with what crossed it seen on the wire by an upstream of this file's
//! own ([`start_wire`]), which parses HTTP/1.1 strictly and records every request.
//!
//! The corpus is data (the tables [`FRAMING`], [`HEAD`], [`CHUNKS`], [`PIPELINE`] and
//! [`REFUSED_BEFORE_THE_BODY`]): a name, the raw bytes, and the one outcome RFC 9112 asks for, so a
//! future parser can be run over the same tables. Each vector runs on a fresh proxy in
//! front of a fresh recorder, on the streamed route (`/stream`, `idempotency: off`), on
//! the protected route (`/orders`, `Idempotency-Key` required, body buffered up to
//! `max_body`), or on both. A loop test per table runs every vector and lists every one
//! that failed, by name, before it fails; another writes each vector byte by byte and at
//! seeded cut points and checks the verdict is the one-write verdict.

mod common;

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

// === The corpus ===

/// What the proxy must do with a vector; one outcome each.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// One answer with this status, and nothing reaches the upstream.
    Refused(u16),
    /// Exactly these requests reach the upstream, in order, each answered 201 to the
    /// client; nothing else does.
    Forwarded(&'static [Fwd]),
    /// No answer, the connection closed, and nothing reaches the upstream.
    Closed,
}

/// A request the upstream must receive, exactly: `$P` in `target` stands for the route's
/// path. `host` is the `Host` field it must carry.
#[derive(Debug, Clone, Copy)]
struct Fwd {
    method: &'static str,
    host: &'static str,
    target: &'static str,
    body: &'static [u8],
}

/// `POST $P` with `body`, `Host: a`.
const fn post(body: &'static [u8]) -> Fwd {
    Fwd {
        method: "POST",
        host: "a",
        target: "$P",
        body,
    }
}

/// Which route a vector runs on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum On {
    /// `/stream`: `idempotency: off`, the body streamed as it arrives.
    Open,
    /// `/orders`: `Idempotency-Key` required, the body buffered (`max_body: 64B`).
    Orders,
    /// Each of them, with the same expected outcome.
    Both,
}

/// One vector. In `raw`, `$P` is the route's path and each `$K` becomes the next
/// `Idempotency-Key: kN` field line (a unique key per request).
struct Vector {
    name: &'static str,
    on: On,
    raw: &'static [u8],
    expect: Expect,
}

const fn v(name: &'static str, on: On, raw: &'static [u8], expect: Expect) -> Vector {
    Vector {
        name,
        on,
        raw,
        expect,
    }
}

use Expect::{Closed, Forwarded, Refused};
use On::{Both, Open, Orders};

/// Group `framing`: `Transfer-Encoding` and `Content-Length`.
const FRAMING: &[Vector] = &[
    // The baselines: what a correct request does, so a broken harness shows here first.
    v(
        "baseline_content_length",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Forwarded(&[post(b"abc")]),
    ),
    v(
        "baseline_chunked",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        Forwarded(&[post(b"abc")]),
    ),
    // RFC 9112 §5.1: whitespace between a field name and the colon MUST be refused with 400.
    v(
        "te_space_before_colon",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding : chunked\r\nContent-Length: 3\r\nConnection: close\r\n\r\n0\r\n\r\n",
        Refused(400),
    ),
    // RFC 9110 §5.5: a field value is VCHAR, obs-text, SP and HTAB; a VT is none of them.
    // RFC 9112 §6.3 then applies to what is left: no chunked-final coding, 400.
    v(
        "te_vertical_tab_chunked",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: \x0bchunked\r\nContent-Length: 3\r\nConnection: close\r\n\r\n0\r\n\r\n",
        Refused(400),
    ),
    // RFC 9112 §6.3 (4): a request whose final coding is not chunked: 400, then close.
    v(
        "te_xchunked",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: xchunked\r\nContent-Length: 3\r\nConnection: close\r\n\r\n0\r\n\r\n",
        Refused(400),
    ),
    v(
        "te_chunked_then_identity",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked, identity\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        Refused(400),
    ),
    v(
        "te_chunked_field_then_identity_field",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        Refused(400),
    ),
    // RFC 9112 §6.1: chunked MUST NOT be applied twice; the body left after one decoding
    // is still coded, a coding the proxy does not forward: 501 (§6.1, "a transfer coding
    // it does not understand").
    v(
        "te_chunked_twice_in_one_field",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked, chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        Refused(501),
    ),
    v(
        "te_chunked_twice_in_two_fields",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        Refused(501),
    ),
    // RFC 9110 §5.6.1 lists and §7.1: the coding name is case-insensitive, OWS around it.
    v(
        "te_chunked_in_capitals_with_tab",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding:\tCHUNKED \r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        Forwarded(&[post(b"abc")]),
    ),
    // RFC 9112 §6.3 (3): with both, Transfer-Encoding decides, Content-Length is removed
    // before forwarding, and the connection MUST close after the answer. So: the chunked
    // body, and never the bytes after it as a request.
    v(
        "cl_then_te_body_is_the_chunked_one",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        Forwarded(&[post(b"abc")]),
    ),
    v(
        "te_then_cl_body_is_the_chunked_one",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        Forwarded(&[post(b"abc")]),
    ),
    // CL.TE: a front end reading Content-Length would take the smuggled request as body;
    // read by Transfer-Encoding it follows the body, and the connection must close first.
    v(
        "cl_te_smuggle_is_not_a_second_request",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 46\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nPOST /smuggled HTTP/1.1\r\nHost: a\r\n$K\r\n",
        Forwarded(&[post(b"")]),
    ),
    // TE.CL: a back end reading Content-Length would stop after "5\r\n" and take the
    // rest as a request; the upstream must get no Content-Length, only chunked framing.
    v(
        "te_cl_smuggle_is_not_a_second_request",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n24\r\nPOST /smuggled HTTP/1.1\r\nHost: a\r\n\r\n\r\n0\r\n\r\n",
        Forwarded(&[post(b"POST /smuggled HTTP/1.1\r\nHost: a\r\n\r\n")]),
    ),
    // RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing.
    v(
        "http10_with_chunked",
        Both,
        b"POST $P HTTP/1.0\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        Refused(400),
    ),
    // RFC 9110 §8.6: Content-Length = 1*DIGIT; "01" is one.
    v(
        "cl_leading_zero",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 01\r\nConnection: close\r\n\r\na",
        Forwarded(&[post(b"a")]),
    ),
    // RFC 9112 §6.3 (5): an invalid Content-Length is unrecoverable: 400, then close.
    v(
        "cl_plus_sign",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: +1\r\nConnection: close\r\n\r\na",
        Refused(400),
    ),
    v(
        "cl_negative",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: -1\r\nConnection: close\r\n\r\na",
        Refused(400),
    ),
    // RFC 9110 §8.6: "42, 42" MAY be refused or read as one 42; hyper refuses it.
    v(
        "cl_same_value_listed_twice",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 1,1\r\nConnection: close\r\n\r\na",
        Refused(400),
    ),
    v(
        "cl_two_values_in_one_field",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 1, 2\r\nConnection: close\r\n\r\nab",
        Refused(400),
    ),
    v(
        "cl_two_equal_fields",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 1\r\nContent-Length: 1\r\nConnection: close\r\n\r\na",
        Forwarded(&[post(b"a")]),
    ),
    v(
        "cl_two_different_fields",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nab",
        Refused(400),
    ),
    // RFC 9110 §5.5: OWS around a field value is not part of it.
    v(
        "cl_with_trailing_whitespace",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3 \t\r\nConnection: close\r\n\r\nabc",
        Forwarded(&[post(b"abc")]),
    ),
    v(
        "cl_empty",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: \r\nConnection: close\r\n\r\nabc",
        Refused(400),
    ),
    // RFC 9112 §6.3 (4): an empty Transfer-Encoding names no final chunked coding: 400,
    // whatever Content-Length says.
    v(
        "te_empty_with_content_length",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: \r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Refused(400),
    ),
    v(
        "cl_beyond_u64",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 99999999999999999999999\r\nConnection: close\r\n\r\na",
        Refused(400),
    ),
];

/// Group `head`: line endings, field syntax, targets and `Host`.
const HEAD: &[Vector] = &[
    // RFC 9112 §2.2: a recipient MAY take a bare LF as a line end; hyper does, and the
    // upstream gets the head re-written with CRLF.
    v(
        "bare_lf_line_endings",
        Both,
        b"POST $P HTTP/1.1\nHost: a\n$KContent-Length: 3\nConnection: close\n\nabc",
        Forwarded(&[post(b"abc")]),
    ),
    // RFC 9112 §2.2: a bare CR makes the element invalid (or is replaced by SP).
    v(
        "bare_cr_in_a_field_value",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KX-A: 1\rContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Refused(400),
    ),
    v(
        "bare_cr_as_a_line_end",
        Both,
        b"POST $P HTTP/1.1\rHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Refused(400),
    ),
    // RFC 9110 §5.5: NUL MUST be refused or replaced by SP; hyper refuses.
    v(
        "nul_in_a_field_value",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KX-A: 1\x002\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Refused(400),
    ),
    // RFC 9110 §5.5: obs-text is a valid field value byte.
    v(
        "obs_text_in_a_field_value",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KX-A: caf\xe9 \xff\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Forwarded(&[post(b"abc")]),
    ),
    // RFC 9112 §5.2: obs-fold in a request: 400, or each fold replaced by SP.
    v(
        "obs_fold",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KX-A: 1\r\n 2\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Refused(400),
    ),
    v(
        "obs_fold_of_transfer_encoding",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nTransfer-Encoding: identity\r\n chunked\r\nConnection: close\r\n\r\n0\r\n\r\n",
        Refused(400),
    ),
    // RFC 9112 §2.2: whitespace before the first field line: refuse, or drop the line.
    v(
        "whitespace_before_the_first_field",
        Both,
        b"POST $P HTTP/1.1\r\n Transfer-Encoding: chunked\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Refused(400),
    ),
    // RFC 9110 §5.1: a field name is a token; a space is not in it.
    v(
        "space_in_a_field_name",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer Encoding: chunked\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Refused(400),
    ),
    // RFC 9112 §2.2: a server SHOULD ignore at least one empty line before a request line.
    v(
        "empty_line_before_the_request_line",
        Both,
        b"\r\nPOST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Forwarded(&[post(b"abc")]),
    ),
    // RFC 9112 §3.2.2: an absolute-form target is forwarded in origin form.
    v(
        "absolute_form_target",
        Both,
        b"POST http://a$P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Forwarded(&[post(b"abc")]),
    ),
    // RFC 9112 §3: the request line is three words split by single spaces; hyper does
    // not take the lenient reading §3 allows.
    v(
        "request_line_with_two_spaces",
        Both,
        b"POST  $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Refused(400),
    ),
    // RFC 9112 §3.2: a request without Host, or with more than one, MUST get a 400.
    v(
        "host_missing",
        Both,
        b"POST $P HTTP/1.1\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Refused(400),
    ),
    v(
        "host_twice",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\nHost: b\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Refused(400),
    ),
    // A head that never ends: nothing to answer; the connection closes when the proxy's
    // header read timeout (here [`QUIET`]) ends it.
    v(
        "head_that_never_ends",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\n",
        Closed,
    ),
    // hyper's `http::Uri` holds at most 65534 bytes: a longer target is a 414 (RFC 9112
    // §3: "a server that receives a request-target longer than any URI it wishes to parse
    // MUST respond with a 414").
    v("request_line_too_long", Both, b"$LONG_TARGET", Refused(414)),
    // RFC 6585 §5: a header section larger than the server will process: 431.
    v("header_section_too_long", Both, b"$LONG_HEAD", Refused(431)),
    v(
        "get_with_a_chunked_body_then_a_pipelined_request",
        Open,
        b"GET $P HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET $P?second HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Forwarded(&[
            Fwd {
                method: "GET",
                host: "a",
                target: "$P",
                body: b"hello",
            },
            Fwd {
                method: "GET",
                host: "a",
                target: "$P?second",
                body: b"",
            },
        ]),
    ),
    // RFC 9112 §3.2.2: with an absolute-form target, Host is ignored for the target's
    // authority, and a proxy MUST send a Host made from the target.
    v(
        "host_conflicting_with_absolute_form",
        Both,
        b"POST http://b$P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Forwarded(&[Fwd {
            method: "POST",
            host: "b",
            target: "$P",
            body: b"abc",
        }]),
    ),
];

/// Group `refused before the body`: a request refused for its head, before its body was
/// read, with a request pipelined behind it. The answer closes the connection (`Connection:
/// close`, RFC 9112 §9.6) and nothing after it is read: whether the pipelined request would
/// be served must not depend on how much of the refused body had arrived when the proxy
/// answered, and the client, told the connection closes, knows the request behind was not
/// processed and may send it again.
const REFUSED_BEFORE_THE_BODY: &[Vector] = &[
    // `chunked` twice (refused, 501) without `Connection: close`, a request pipelined
    // behind it.
    v(
        "te_chunked_twice_then_a_pipelined_request",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nPOST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\ndef",
        Refused(501),
    ),
    // A second Host (refused, 400, RFC 9112 §3.2), a body that holds a request, and a
    // request pipelined behind it.
    v(
        "refused_request_then_a_pipelined_request",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\nHost: b\r\n$KContent-Length: 36\r\n\r\nPOST /smuggled HTTP/1.1\r\nHost: a\r\n\r\nPOST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\ndef",
        Refused(400),
    ),
];

/// Group `chunks`: the chunked body itself.
const CHUNKS: &[Vector] = &[
    // RFC 9112 §7.1.1: extensions are ignored; the upstream gets the data alone.
    v(
        "chunk_extension",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3;ext=1\r\nabc\r\n0\r\n\r\n",
        Forwarded(&[post(b"abc")]),
    ),
    // A body that is not a chunked body is invalid framing: 400 (RFC 9110 §15.5.1), and
    // the connection closes (RFC 9112 §6.3: the rest of the stream cannot be trusted).
    // hyper bounds the extensions of a body at 16 KiB.
    v("chunk_extension_too_long", Both, b"$LONG_EXT", Refused(400)),
    // RFC 9112 §7.1: chunk-size is HEX digits; one beyond u64 frames nothing.
    v(
        "chunk_size_beyond_u64",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n1ffffffffffffffff\r\nabc\r\n0\r\n\r\n",
        Refused(400),
    ),
    // A chunk over `max_body` (64 B), data sent in full: 413, nothing upstream.
    v(
        "chunk_larger_than_max_body",
        Orders,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n41\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\r\n0\r\n\r\n",
        Refused(413),
    ),
    // A chunk declared over `max_body` whose data stalls: hyper does not show the
    // declared size, so the proxy counts what arrives and answers 408 when the client
    // stalls; nothing upstream either way.
    v(
        "chunk_declared_larger_than_max_body_then_stalled",
        Orders,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\nffff\r\nabc",
        Refused(408),
    ),
    // RFC 9112 §7.1: the last chunk and the end of the trailer section end with CRLF.
    v(
        "last_chunk_with_bare_lf",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\n\n",
        Refused(400),
    ),
    v(
        "chunk_size_with_0x",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
        Refused(400),
    ),
    v(
        "chunk_size_negative",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n-3\r\nabc\r\n0\r\n\r\n",
        Refused(400),
    ),
    // RFC 9112 §7.1.2: trailers follow the last chunk; the body is the chunks' data.
    v(
        "trailers_after_the_last_chunk",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n",
        Forwarded(&[post(b"abc")]),
    ),
    // RFC 9112 §7.1: chunk-data is followed by CRLF; anything else is not a chunked body.
    v(
        "chunk_data_without_its_crlf",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
        Refused(400),
    ),
    // The same without `Connection: close`, a request pipelined behind it: after a
    // framing error the connection closes (RFC 9112 §6.3), the next request is not read.
    v(
        "chunk_data_without_its_crlf_then_a_pipelined_request",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\nPOST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\ndef",
        Refused(400),
    ),
    // RFC 9112 §6.3 and §7.1: the body the client promised never comes whole: no request
    // reaches the upstream with a shorter body. The proxy answers 408 once the client
    // has sent nothing for its body read timeout (here [`QUIET`]).
    v(
        "content_length_longer_than_the_body",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 10\r\nConnection: close\r\n\r\nabc",
        Refused(408),
    ),
    v(
        "chunked_body_without_its_last_chunk",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n",
        Refused(408),
    ),
];

/// Group `pipeline`: more than one request on a connection, and bodies that look like
/// requests.
const PIPELINE: &[Vector] = &[
    // RFC 9112 §9.3.2: pipelined requests are answered in the order received.
    v(
        "two_pipelined_requests_in_one_write",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\n\r\nabcPOST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\ndef",
        Forwarded(&[post(b"abc"), post(b"def")]),
    ),
    v(
        "a_body_holding_a_request_is_a_body",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 36\r\nConnection: close\r\n\r\nPOST /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
        Forwarded(&[post(b"POST /smuggled HTTP/1.1\r\nHost: a\r\n\r\n")]),
    ),
    v(
        "a_chunked_body_holding_a_request_is_a_body",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n24\r\nPOST /smuggled HTTP/1.1\r\nHost: a\r\n\r\n\r\n0\r\n\r\n",
        Forwarded(&[post(b"POST /smuggled HTTP/1.1\r\nHost: a\r\n\r\n")]),
    ),
    // RFC 9112 §9.6: after `Connection: close` the server reads no further request.
    v(
        "bytes_after_connection_close_are_not_read",
        Both,
        b"POST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\nabcPOST $P HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\n\r\ndef",
        Forwarded(&[post(b"abc")]),
    ),
    // RFC 9110 §9.3.1: a GET body has no semantics, but its framing still holds (RFC 9112
    // §6.3): the body is not the next request.
    v(
        "get_with_a_body_then_a_pipelined_request",
        Open,
        b"GET $P HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET $P?second HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        Forwarded(&[
            Fwd {
                method: "GET",
                host: "a",
                target: "$P",
                body: b"hello",
            },
            Fwd {
                method: "GET",
                host: "a",
                target: "$P?second",
                body: b"",
            },
        ]),
    ),
];

// === Building a vector's bytes ===

const CONFIG: &str = r#"
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
    max_body: 64B
  - name: open
    match: { path: /stream }
    idempotency: off
"#;

/// A route a vector runs on: its path.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Route {
    Open,
    Orders,
}

impl Route {
    fn path(self) -> &'static str {
        match self {
            Route::Open => "/stream",
            Route::Orders => "/orders",
        }
    }
}

impl On {
    fn routes(self) -> &'static [Route] {
        match self {
            On::Open => &[Route::Open],
            On::Orders => &[Route::Orders],
            On::Both => &[Route::Open, Route::Orders],
        }
    }
}

/// The bytes of `raw` for `route`: `$P` and `$K` filled in, and the generated vectors
/// (too long to write out) built.
fn build(raw: &[u8], route: Route) -> Vec<u8> {
    let path = route.path();
    let generated = match raw {
        b"$LONG_TARGET" => Some(format!(
            "POST {path}?{} HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\nabc",
            "q".repeat(70_000)
        )),
        // Far over hyper's 400 KiB read buffer for a head.
        b"$LONG_HEAD" => Some(format!(
            "POST {path} HTTP/1.1\r\nHost: a\r\n$KX-Long: {}\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
            "h".repeat(512 * 1024)
        )),
        b"$LONG_EXT" => Some(format!(
            "POST {path} HTTP/1.1\r\nHost: a\r\n$KTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3;ext={}\r\nabc\r\n0\r\n\r\n",
            "e".repeat(64 * 1024)
        )),
        _ => None,
    };
    let raw = generated.as_ref().map_or(raw, |g| g.as_bytes());
    let mut out = Vec::with_capacity(raw.len() + 64);
    let mut keys = 0;
    let mut i = 0;
    while i < raw.len() {
        match &raw[i..] {
            [b'$', b'P', ..] => {
                out.extend_from_slice(path.as_bytes());
                i += 2;
            }
            [b'$', b'K', ..] => {
                keys += 1;
                out.extend_from_slice(format!("Idempotency-Key: k{keys}\r\n").as_bytes());
                i += 2;
            }
            [b, ..] => {
                out.push(*b);
                i += 1;
            }
            [] => unreachable!(),
        }
    }
    out
}

// === The wire recorder: a strict HTTP/1.1 upstream ===

/// A request the recorder read whole.
#[derive(Debug, Clone, PartialEq)]
struct Wire {
    conn: usize,
    method: String,
    target: String,
    host: Option<String>,
    body: Vec<u8>,
}

/// What crossed to the upstream.
#[derive(Debug, Clone)]
enum Event {
    /// A whole request.
    Request(Wire),
    /// A request framed in a way a strict reader rejects (both framings, a coding besides
    /// chunked, a bad length, a bad line): what a lenient upstream could read otherwise.
    Malformed { conn: usize, why: String },
    /// The connection ended in the middle of a request: bytes went out that no one can
    /// act on.
    Partial { conn: usize, bytes: usize },
}

#[derive(Default)]
struct WireLog {
    events: Mutex<Vec<Event>>,
}

impl WireLog {
    fn push(&self, event: Event) {
        self.events.lock().unwrap().push(event);
    }
}

/// Starts the recorder on 127.0.0.1:0: every request it reads whole is logged, then
/// answered `201` with a two-byte body.
async fn start_wire() -> (SocketAddr, Arc<WireLog>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log: Arc<WireLog> = Arc::default();
    let events = Arc::clone(&log);
    tokio::spawn(async move {
        for conn in 1.. {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(serve_wire(stream, conn, Arc::clone(&events)));
        }
    });
    (addr, log)
}

async fn serve_wire(mut stream: TcpStream, conn: usize, log: Arc<WireLog>) {
    let mut buf = Vec::new();
    loop {
        match read_request(&mut stream, &mut buf).await {
            Ok(None) => return,
            Ok(Some((method, target, host, body))) => {
                log.push(Event::Request(Wire {
                    conn,
                    method,
                    target,
                    host,
                    body,
                }));
                let answer = b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok";
                if stream.write_all(answer).await.is_err() {
                    return;
                }
            }
            Err(Broken::Eof(bytes)) => {
                log.push(Event::Partial { conn, bytes });
                return;
            }
            Err(Broken::Malformed(why)) => {
                log.push(Event::Malformed { conn, why });
                return;
            }
        }
    }
}

enum Broken {
    /// The connection ended after this many bytes of a request.
    Eof(usize),
    Malformed(String),
}

type Parsed = (String, String, Option<String>, Vec<u8>);

/// Reads one request strictly (RFC 9112: CRLF lines, token names, no whitespace before
/// the colon, one framing); `Ok(None)` at a clean end between requests.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Option<Parsed>, Broken> {
    let bad = |why: &str| Broken::Malformed(why.to_owned());
    let mut taken = 0;
    let head_end = loop {
        if let Some(at) = find(buf, b"\r\n\r\n") {
            break at;
        }
        if !fill(stream, buf).await {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(Broken::Eof(buf.len()))
            };
        }
    };
    let head = buf[..head_end].to_vec();
    taken += head_end + 4;
    if head.contains(&b'\0') {
        return Err(bad("NUL in the head"));
    }
    let mut lines = split_crlf(&head).map_err(|e| bad(&e))?.into_iter();
    let line = lines.next().unwrap_or_default();
    let parts: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let [method, target, b"HTTP/1.1"] = parts[..] else {
        return Err(bad(&format!(
            "request line {:?}",
            String::from_utf8_lossy(&line)
        )));
    };
    let (mut lengths, mut codings, mut host) = (Vec::new(), Vec::new(), None);
    for line in lines {
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(|| bad("no colon"))?;
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if name.is_empty()
            || !name
                .iter()
                .all(|&b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
        {
            return Err(bad(&format!(
                "field name {:?}",
                String::from_utf8_lossy(name)
            )));
        }
        if value.iter().any(|&b| b < 0x20 && b != b'\t' || b == 0x7f) {
            return Err(bad("a control byte in a field value"));
        }
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        match name.as_str() {
            "content-length" => lengths.push(value.to_vec()),
            "transfer-encoding" => codings.push(value.to_vec()),
            "host" if host.is_some() => return Err(bad("two Host fields")),
            "host" => host = Some(String::from_utf8_lossy(value).into_owned()),
            _ => {}
        }
    }
    if !lengths.is_empty() && !codings.is_empty() {
        return Err(bad("both Content-Length and Transfer-Encoding"));
    }
    let body = if !codings.is_empty() {
        if codings.len() != 1 || !codings[0].eq_ignore_ascii_case(b"chunked") {
            return Err(bad("a transfer coding besides one chunked"));
        }
        let mut body = Vec::new();
        loop {
            let line = take_line(stream, buf, &mut taken).await?;
            let size = line.split(|&b| b == b';').next().unwrap_or_default();
            let size = std::str::from_utf8(size)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|s| usize::from_str_radix(s, 16).ok())
                .ok_or_else(|| bad("chunk size"))?;
            if size == 0 {
                // Trailer fields, up to the empty line.
                while !take_line(stream, buf, &mut taken).await?.is_empty() {}
                break;
            }
            while buf.len() < taken + size + 2 {
                if !fill(stream, buf).await {
                    return Err(Broken::Eof(buf.len()));
                }
            }
            body.extend_from_slice(&buf[taken..taken + size]);
            if &buf[taken + size..taken + size + 2] != b"\r\n" {
                return Err(bad("chunk data without its CRLF"));
            }
            taken += size + 2;
        }
        body
    } else if let Some(first) = lengths.first() {
        if lengths.len() != 1 || first.is_empty() || !first.iter().all(u8::is_ascii_digit) {
            return Err(bad("Content-Length"));
        }
        let n: usize = std::str::from_utf8(first)
            .unwrap()
            .parse()
            .map_err(|_| bad("Content-Length"))?;
        while buf.len() < taken + n {
            if !fill(stream, buf).await {
                return Err(Broken::Eof(buf.len()));
            }
        }
        taken += n;
        buf[taken - n..taken].to_vec()
    } else {
        Vec::new()
    };
    buf.drain(..taken);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Ok(Some((text(method), text(target), host, body)))
}

/// The next CRLF-ended line at `taken` in `buf`, reading more as needed.
async fn take_line(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    taken: &mut usize,
) -> Result<Vec<u8>, Broken> {
    loop {
        if let Some(at) = find(&buf[*taken..], b"\r\n") {
            let line = buf[*taken..*taken + at].to_vec();
            if line.contains(&b'\r') || line.contains(&b'\n') {
                return Err(Broken::Malformed(
                    "a bare CR or LF in the body framing".into(),
                ));
            }
            *taken += at + 2;
            return Ok(line);
        }
        if !fill(stream, buf).await {
            return Err(Broken::Eof(buf.len()));
        }
    }
}

/// Lines of a head split at CRLF; a bare CR or LF is an error.
fn split_crlf(head: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut lines = Vec::new();
    let mut rest = head;
    loop {
        let end = find(rest, b"\r\n").unwrap_or(rest.len());
        let line = &rest[..end];
        if line.contains(&b'\r') || line.contains(&b'\n') {
            return Err("a bare CR or LF in the head".into());
        }
        lines.push(line.to_vec());
        if end == rest.len() {
            return Ok(lines);
        }
        rest = &rest[end + 2..];
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads more into `buf`; false at the end of the stream (or an error).
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

// === Running a vector ===

/// What a run showed: the answers the client got and what the upstream received.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    Refused(u16),
    /// A refusal, then forwarded requests: no vector expects it (a refusal ends the
    /// connection), so it shows a request pipelined behind a refusal that got through.
    RefusedThenForwarded(u16, Vec<Wire>),
    Forwarded(Vec<Wire>),
    Closed,
    /// Anything else, said in words.
    Other(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Refused(status) => write!(f, "refused {status}"),
            Verdict::RefusedThenForwarded(status, requests) => {
                write!(f, "refused {status}, then ")?;
                Verdict::Forwarded(requests.clone()).fmt(f)
            }
            Verdict::Closed => write!(f, "closed"),
            Verdict::Other(what) => write!(f, "{what}"),
            Verdict::Forwarded(requests) => {
                write!(f, "forwarded [")?;
                for (i, r) in requests.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(
                        f,
                        "{sep}{} {} host={:?} body={:?} conn={}",
                        r.method,
                        r.target,
                        r.host,
                        String::from_utf8_lossy(&r.body),
                        r.conn
                    )?;
                }
                write!(f, "]")
            }
        }
    }
}

/// `expect` for `route`, as a [`Verdict`] to compare with; the upstream connection of a
/// forwarded request is not part of it (set from what was seen).
fn expected(expect: Expect, route: Route, seen: &Verdict) -> Verdict {
    match expect {
        Expect::Refused(status) => Verdict::Refused(status),
        Expect::Closed => Verdict::Closed,
        Expect::Forwarded(list) => Verdict::Forwarded(wires(list, route, seen)),
    }
}

/// The requests `list` names, on `route`, on the upstream connections they were seen on.
fn wires(list: &[Fwd], route: Route, seen: &Verdict) -> Vec<Wire> {
    let conns: Vec<usize> = match seen {
        Verdict::Forwarded(got) | Verdict::RefusedThenForwarded(_, got) => {
            got.iter().map(|w| w.conn).collect()
        }
        _ => vec![],
    };
    list.iter()
        .enumerate()
        .map(|(i, f)| Wire {
            conn: conns.get(i).copied().unwrap_or(0),
            method: f.method.into(),
            target: f.target.replace("$P", route.path()),
            host: Some(f.host.into()),
            body: f.body.to_vec(),
        })
        .collect()
}

/// How long a client connection may stay open with nothing to do (the proxy's idle and
/// body-read timeouts here): only bounds a run whose request never ends; each vector's
/// last request says `Connection: close`, so a run normally ends on the proxy's close.
const QUIET: Duration = Duration::from_secs(1);

/// Hang guard for one run.
const HANG: Duration = Duration::from_secs(10);

/// Runs `bytes` on a fresh proxy in front of a fresh recorder, written in pieces cut at
/// `cuts` (sorted offsets), and says what happened.
async fn run(bytes: &[u8], route: Route, cuts: &[usize]) -> Verdict {
    run_paced(bytes, route, cuts, false).await
}

/// [`run`]; with `after_an_answer`, each piece after the first is written only once the
/// client has read a whole answer (the signal that the proxy answered before the rest
/// arrived).
async fn run_paced(bytes: &[u8], route: Route, cuts: &[usize], after_an_answer: bool) -> Verdict {
    let (wire, log) = start_wire().await;
    let text = format!("listen: 127.0.0.1:0\nupstream: http://{wire}\n{CONFIG}");
    let proxy = common::start_proxy_tuned(&text, None, |p| {
        p.with_idle_timeout(QUIET).with_body_read_timeout(QUIET)
    })
    .await;
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let mut pieces = Vec::new();
    let mut from = 0;
    for &cut in cuts.iter().chain([&bytes.len()]) {
        pieces.push(bytes[from..cut].to_vec());
        from = cut;
    }
    // How many whole answers the client has read so far.
    let (answered_tx, mut answered) = tokio::sync::watch::channel(0usize);
    // Written from its own task, so a proxy that answers before reading everything
    // cannot stall the run; a write the proxy no longer reads may fail, which is fine.
    let writing = tokio::spawn(async move {
        for (i, piece) in pieces.into_iter().enumerate() {
            if after_an_answer && i > 0 && answered.wait_for(|&n| n > 0).await.is_err() {
                return writer;
            }
            if writer.write_all(&piece).await.is_err() || writer.flush().await.is_err() {
                return writer;
            }
        }
        writer
    });
    let mut answer = Vec::new();
    let started = Instant::now();
    let read = tokio::time::timeout(HANG, async {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    answer.extend_from_slice(&chunk[..n]);
                    // A partial answer behind whole ones reads as an error: counts only rise.
                    let whole = statuses(&answer).map_or(0, |s| s.len());
                    answered_tx.send_if_modified(|n| std::mem::replace(n, whole.max(*n)) < whole);
                }
            }
        }
    })
    .await;
    if read.is_err() {
        return Verdict::Other(format!(
            "hang guard: the proxy neither answered nor closed within {HANG:?}"
        ));
    }
    // Kept until the proxy closed: dropping it would close our side first.
    let _writer = writing.await;
    // Protected owners outlive their client connection (SPEC: a client that leaves does
    // not cancel the upstream call): wait until none runs before looking at the upstream.
    proxy.proxy.owners().finished(started + HANG).await;
    if !proxy.proxy.owners().is_empty() {
        return Verdict::Other("hang guard: an owner still runs".into());
    }
    let events = log.events.lock().unwrap().clone();
    judge(&answer, &events, route)
}

/// The verdict from the client's bytes and the upstream's events.
fn judge(answer: &[u8], events: &[Event], route: Route) -> Verdict {
    let statuses = match statuses(answer) {
        Ok(statuses) => statuses,
        Err(e) => return Verdict::Other(format!("unreadable answer: {e}")),
    };
    let mut requests = Vec::new();
    let mut noise = Vec::new();
    let mut partial = Vec::new();
    for event in events {
        match event {
            Event::Request(w) => requests.push(w.clone()),
            Event::Malformed { conn, why } => {
                noise.push(format!("malformed on conn {conn}: {why}"))
            }
            Event::Partial { conn, bytes } => {
                partial.push(format!("partial request ({bytes} bytes) on conn {conn}"))
            }
        }
    }
    // The streamed route sends the head on as soon as it is read (whether it has by the
    // time the body turns out broken is a matter of timing): a refused request may leave
    // the upstream one cut off mid-body, which no upstream can take for a whole one (the
    // strict reader checked it was a valid beginning). Nowhere else: the protected route
    // buffers the body first, and a run that forwarded anything must have nothing cut.
    if route != Route::Open || !requests.is_empty() {
        noise.extend(partial);
    }
    if !noise.is_empty() {
        return Verdict::Other(format!(
            "upstream saw {noise:?}; answers {statuses:?}; requests {}",
            Verdict::Forwarded(requests)
        ));
    }
    match (&statuses[..], requests.is_empty()) {
        ([], true) => Verdict::Closed,
        ([status], true) if *status >= 400 => Verdict::Refused(*status),
        (s, false) if s.len() == requests.len() && s.iter().all(|&s| s == 201) => {
            Verdict::Forwarded(requests)
        }
        ([first, rest @ ..], false)
            if *first >= 400 && rest.len() == requests.len() && rest.iter().all(|&s| s == 201) =>
        {
            Verdict::RefusedThenForwarded(*first, requests)
        }
        _ => Verdict::Other(format!(
            "answers {statuses:?}, upstream {}",
            Verdict::Forwarded(requests)
        )),
    }
}

/// The statuses of the answers in `raw`, in order, each read to its end by its framing.
fn statuses(raw: &[u8]) -> Result<Vec<u16>, String> {
    let mut out = Vec::new();
    let mut rest = raw;
    while !rest.is_empty() {
        let end = find(rest, b"\r\n\r\n").ok_or("a head without its end")?;
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        rest = &rest[end + 4..];
        let status: u16 = head
            .strip_prefix("HTTP/1.1 ")
            .and_then(|s| s.get(..3))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("status line of {head:?}"))?;
        out.push(status);
        let field = |name: &str| {
            head.lines().skip(1).find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
        };
        if let Some(len) = field("content-length") {
            let len: usize = len.parse().map_err(|_| format!("length in {head:?}"))?;
            rest = rest.get(len..).ok_or("a body cut short")?;
        } else if field("transfer-encoding").is_some() {
            loop {
                let at = find(rest, b"\r\n").ok_or("a chunk cut short")?;
                let size = std::str::from_utf8(&rest[..at]).unwrap_or("");
                let size = usize::from_str_radix(size.split(';').next().unwrap_or(""), 16)
                    .map_err(|_| "a chunk size")?;
                rest = &rest[at + 2..];
                if size == 0 {
                    let end = find(rest, b"\r\n").ok_or("a trailer cut short")?;
                    rest = &rest[end + 2..];
                    break;
                }
                rest = rest.get(size + 2..).ok_or("a chunk cut short")?;
            }
        }
    }
    Ok(out)
}

// === The tests ===

/// Runs every vector of `group` on each of its routes in one write, at most 8 at once,
/// and fails listing every vector whose verdict is not the expected one.
async fn check_group(group: &'static [Vector]) {
    let mut runs = tokio::task::JoinSet::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(8));
    for vector in group {
        for &route in vector.on.routes() {
            let slots = Arc::clone(&slots);
            runs.spawn(async move {
                let _slot = slots.acquire_owned().await.unwrap();
                let seen = run(&build(vector.raw, route), route, &[]).await;
                (vector, route, seen)
            });
        }
    }
    let mut failures = Vec::new();
    while let Some(done) = runs.join_next().await {
        let (vector, route, seen) = done.unwrap();
        let want = expected(vector.expect, route, &seen);
        if seen != want {
            failures.push(format!(
                "{} on {}:\n    expected {want}\n    got      {seen}",
                vector.name,
                route.path()
            ));
        }
    }
    failures.sort();
    assert!(
        failures.is_empty(),
        "{} failing vectors:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framing_vectors_get_their_one_outcome() {
    check_group(FRAMING).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_vectors_get_their_one_outcome() {
    check_group(HEAD).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_before_the_body_vectors_get_their_one_outcome() {
    check_group(REFUSED_BEFORE_THE_BODY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_vectors_get_their_one_outcome() {
    check_group(CHUNKS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_vectors_get_their_one_outcome() {
    check_group(PIPELINE).await;
}

/// Where a split run cuts a vector: every byte its own write for a vector of up to
/// [`BYTE_BY_BYTE`] bytes, then a few sets of cut points drawn from a generator seeded by
/// the vector's name, so a failure reruns the same cuts.
fn cut_sets(name: &str, len: usize) -> Vec<Vec<usize>> {
    let mut sets = Vec::new();
    if len <= BYTE_BY_BYTE {
        sets.push((1..len).collect());
    }
    let mut state = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..RANDOM_SPLITS {
        let mut cuts: Vec<usize> = (0..1 + next() % 3)
            .map(|_| 1 + (next() as usize) % (len - 1))
            .collect();
        cuts.sort_unstable();
        cuts.dedup();
        sets.push(cuts);
    }
    sets
}

/// Vectors up to this long are also written one byte per write.
const BYTE_BY_BYTE: usize = 1024;

/// How many seeded sets of cut points each vector is written with.
const RANDOM_SPLITS: usize = 3;

/// Every vector reaches the same verdict written in pieces as in one write: the proxy's
/// reading does not depend on where reads end. The verdict compared is what the one-write
/// run showed, whether or not it is the expected one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_do_not_depend_on_how_the_bytes_are_split() {
    let mut runs = tokio::task::JoinSet::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(16));
    let groups = [FRAMING, HEAD, CHUNKS, PIPELINE, REFUSED_BEFORE_THE_BODY];
    for vector in groups.into_iter().flatten() {
        for &route in vector.on.routes() {
            let slots = Arc::clone(&slots);
            runs.spawn(async move {
                let bytes = build(vector.raw, route);
                let whole = {
                    let _slot = slots.acquire().await.unwrap();
                    run(&bytes, route, &[]).await
                };
                let mut differ = Vec::new();
                for cuts in cut_sets(vector.name, bytes.len()) {
                    let _slot = slots.acquire().await.unwrap();
                    let split = run(&bytes, route, &cuts).await;
                    if split != whole {
                        let shown = if cuts.len() + 1 == bytes.len() {
                            "every byte".to_owned()
                        } else {
                            format!("{cuts:?}")
                        };
                        differ.push(format!(
                            "{} on {} cut at {shown}:\n    one write {whole}\n    split     {split}",
                            vector.name,
                            route.path()
                        ));
                    }
                }
                differ
            });
        }
    }
    let mut failures = Vec::new();
    while let Some(done) = runs.join_next().await {
        failures.extend(done.unwrap());
    }
    failures.sort();
    assert!(
        failures.is_empty(),
        "{} split runs differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The recorder itself: what the corpus relies on it to see. A request framed both ways
/// or coded twice, a bare LF or a second request behind a body is what a lenient upstream
/// could misread, so the recorder must flag it rather than read it one way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recorder_flags_what_a_lenient_upstream_could_misread() {
    let cases: [(&[u8], &str); 6] = [
        (
            b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "malformed: both Content-Length and Transfer-Encoding",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            "malformed: a transfer coding besides one chunked",
        ),
        (
            b"POST /x HTTP/1.1\nHost: a\r\nContent-Length: 0\r\n\r\n",
            "malformed: a bare CR or LF in the head",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
            "malformed: chunk data without its CRLF",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabcGET /y HTTP/1.1\r\nHost: a\r\n\r\n",
            "POST /x \"abc\"; GET /y \"\"",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nab",
            "partial: 50 bytes",
        ),
    ];
    for (bytes, want) in cases {
        let (wire, log) = start_wire().await;
        let mut stream = TcpStream::connect(wire).await.unwrap();
        stream.write_all(bytes).await.unwrap();
        stream.shutdown().await.unwrap();
        let mut answers = Vec::new();
        tokio::time::timeout(HANG, stream.read_to_end(&mut answers))
            .await
            .expect("hang guard: the recorder did not close")
            .unwrap();
        // The recorder logs before it answers or closes: its close is the signal.
        let seen: Vec<String> = log
            .events
            .lock()
            .unwrap()
            .iter()
            .map(|e| match e {
                Event::Request(w) => {
                    format!(
                        "{} {} {:?}",
                        w.method,
                        w.target,
                        String::from_utf8_lossy(&w.body)
                    )
                }
                Event::Malformed { why, .. } => format!("malformed: {why}"),
                Event::Partial { bytes, .. } => format!("partial: {bytes} bytes"),
            })
            .collect();
        assert_eq!(
            seen.join("; "),
            want,
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
}

/// A request refused before its body was read, with a request pipelined behind it: the
/// verdict is the same when the rest of the body and the next request are written only
/// once the refusal has been read, so the proxy cannot have had them when it answered.
/// hyper keeps a connection whose handler answered with the body unread only if the rest
/// of the body was already buffered; the proxy's `Connection: close` on such refusals
/// makes the outcome one (refused, and nothing after it read) however the bytes arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_the_body_was_read_closes_however_the_body_arrives() {
    let mut failures = Vec::new();
    for vector in REFUSED_BEFORE_THE_BODY {
        for &route in vector.on.routes() {
            let bytes = build(vector.raw, route);
            // One byte of the refused request's body goes with its head; the rest after
            // the answer.
            let cut = find(&bytes, b"\r\n\r\n").unwrap() + 5;
            let seen = run_paced(&bytes, route, &[cut], true).await;
            let want = expected(vector.expect, route, &seen);
            if seen != want {
                failures.push(format!(
                    "{} on {}:\n    expected {want}\n    got      {seen}",
                    vector.name,
                    route.path()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
