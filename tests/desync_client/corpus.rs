//! The corpus: the desync vectors as data, one table per group, each vector a name, the
//! raw bytes and the one outcome RFC 9112 asks for.

/// What the proxy must do with a vector; one outcome each.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Expect {
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
pub(crate) struct Fwd {
    pub(crate) method: &'static str,
    pub(crate) host: &'static str,
    pub(crate) target: &'static str,
    pub(crate) body: &'static [u8],
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
pub(crate) enum On {
    /// `/stream`: `idempotency: off`, the body streamed as it arrives.
    Open,
    /// `/orders`: `Idempotency-Key` required, the body buffered (`max_body: 64B`).
    Orders,
    /// Each of them, with the same expected outcome.
    Both,
}

/// One vector. In `raw`, `$P` is the route's path and each `$K` becomes the next
/// `Idempotency-Key: kN` field line (a unique key per request).
pub(crate) struct Vector {
    pub(crate) name: &'static str,
    pub(crate) on: On,
    pub(crate) raw: &'static [u8],
    pub(crate) expect: Expect,
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
pub(crate) const FRAMING: &[Vector] = &[
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
pub(crate) const HEAD: &[Vector] = &[
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
    // header read timeout (here [`run::QUIET`]) ends it.
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
    // What an HTTP/1.1 connection reads of a head is bounded by the proxy (128 KiB), not
    // left to hyper's default (about 400 KiB): every connection may hold that much.
    v("header_section_over_the_buffer", Both, b"$BIG_HEAD", Refused(431)),
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
    // RFC 9112 §3.2.4: the asterisk form is for OPTIONS only; a POST to `*` is refused
    // before routing, never forwarded as `POST *` (the route is not in the target here).
    v(
        "asterisk_target_on_post",
        Both,
        b"POST * HTTP/1.1\r\nHost: a\r\n$KContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        Refused(400),
    ),
];

/// Group `refused before the body`: a request refused for its head, before its body was
/// read, with a request pipelined behind it. The answer closes the connection (`Connection:
/// close`, RFC 9112 §9.6) and nothing after it is read: whether the pipelined request would
/// be served must not depend on how much of the refused body had arrived when the proxy
/// answered, and the client, told the connection closes, knows the request behind was not
/// processed and may send it again.
pub(crate) const REFUSED_BEFORE_THE_BODY: &[Vector] = &[
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
pub(crate) const CHUNKS: &[Vector] = &[
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
    // has sent nothing for its body read timeout (here [`run::QUIET`]).
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
pub(crate) const PIPELINE: &[Vector] = &[
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
