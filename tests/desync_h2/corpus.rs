//! The corpus: the HTTP/2 downgrade vectors as data, one table per group (framing here;
//! `fields.rs` and `pseudo.rs` hold the others), each a name,
//! the fields and frames a client sends, and the one outcome RFC 9113 and hyper/h2 give
//! it. Codes: PROTOCOL_ERROR is 1 (RFC 9113 §7).

/// The proxy's routes: a protected one and an `idempotency: off` one that streams.
pub(crate) const CONFIG: &str = r#"
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
    max_body: 64B
  - name: open
    match: { path: /stream }
    idempotency: off
"#;

/// A route a vector runs on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Route {
    /// `/stream`: `idempotency: off`, the body streamed as it arrives.
    Open,
    /// `/orders`: `Idempotency-Key` required, the body buffered (`max_body: 64B`).
    Orders,
}

impl Route {
    pub(crate) fn path(self) -> &'static str {
        match self {
            Route::Open => "/stream",
            Route::Orders => "/orders",
        }
    }
}

/// Which routes a vector runs on, with the same expected outcome on each.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum On {
    Open,
    Orders,
    Both,
}

impl On {
    pub(crate) fn routes(self) -> &'static [Route] {
        match self {
            On::Open => &[Route::Open],
            On::Orders => &[Route::Orders],
            On::Both => &[Route::Open, Route::Orders],
        }
    }
}

type Fields = &'static [(&'static [u8], &'static [u8])];

/// A vector's header block. In values, `$P` is the route's path; a field named `$K` is
/// the stream's `idempotency-key`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Head {
    /// `:method POST`, `:scheme http`, `:authority a`, `:path $P`, the key, then these.
    Std(Fields),
    /// Exactly these fields, in this order.
    Raw(Fields),
}

impl Head {
    /// The fields for `route`, with `key` as the Idempotency-Key.
    pub(crate) fn fields(self, route: Route, key: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        let std: Fields = &[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", b"a"),
            (b":path", b"$P"),
            (b"$K", b""),
        ];
        let list: Vec<_> = match self {
            Head::Std(extra) => std.iter().chain(extra.iter()).collect(),
            Head::Raw(all) => all.iter().collect(),
        };
        list.into_iter()
            .map(|&(name, value)| {
                if name == b"$K" {
                    return (b"idempotency-key".to_vec(), key.as_bytes().to_vec());
                }
                let value = String::from_utf8_lossy(value)
                    .replace("$P", route.path())
                    .into_bytes();
                (name.to_vec(), value)
            })
            .collect()
    }
}

/// What follows the HEADERS frame.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Body {
    /// Nothing: END_STREAM on the HEADERS frame.
    End,
    /// These DATA frames, END_STREAM on the last.
    Data(&'static [&'static [u8]]),
    /// One DATA frame with END_STREAM, PADDED with this many bytes of padding.
    Padded(&'static [u8], u8),
    /// These DATA frames, then a trailer HEADERS frame with END_STREAM.
    Trailers(&'static [&'static [u8]], Fields),
}

/// The request the upstream must read, exactly; `$P` in `target` is the route's path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fwd {
    pub(crate) method: &'static str,
    pub(crate) target: &'static str,
    pub(crate) host: &'static str,
    pub(crate) body: &'static [u8],
}

/// `POST $P`, `Host: a`, with `body`.
pub(crate) const fn post(body: &'static [u8]) -> Fwd {
    Fwd {
        method: "POST",
        target: "$P",
        host: "a",
        body,
    }
}

/// What the proxy must do with a vector; one outcome each.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Expect {
    /// RST_STREAM with this code, and nothing reaches the upstream.
    Reset(u32),
    /// GOAWAY with this code, and nothing reaches the upstream.
    GoAway(u32),
    /// An answer with this status, and nothing reaches the upstream.
    Refused(u16),
    /// Answered 201, and the upstream reads exactly this request.
    Forwarded(Fwd),
}

/// One vector.
pub(crate) struct Vector {
    pub(crate) name: &'static str,
    pub(crate) on: On,
    pub(crate) head: Head,
    pub(crate) body: Body,
    /// The frames that carry the header block.
    pub(crate) head_frames: HeadFrames,
    pub(crate) expect: Expect,
}

pub(crate) const fn v(
    name: &'static str,
    on: On,
    head: Head,
    body: Body,
    expect: Expect,
) -> Vector {
    Vector {
        name,
        on,
        head,
        body,
        head_frames: HeadFrames::One,
        expect,
    }
}

/// How the header block is framed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum HeadFrames {
    /// One HEADERS frame.
    One,
    /// HEADERS with the first half, CONTINUATION with the rest.
    Continuation,
    /// One HEADERS frame, PADDED with this many bytes (RFC 9113 §6.2).
    Padded(u8),
    /// One HEADERS frame with the PRIORITY flag and its five bytes (§6.2, deprecated
    /// but still to be parsed).
    Priority,
}

/// [`v`] on both routes with its header block framed by `head_frames`.
pub(crate) const fn framed(
    name: &'static str,
    head_frames: HeadFrames,
    head: Head,
    body: Body,
    expect: Expect,
) -> Vector {
    Vector {
        name,
        on: On::Both,
        head,
        body,
        head_frames,
        expect,
    }
}

use Body::{Data, End, Padded};
use Expect::{Forwarded, Refused, Reset};
use Head::Std;
use On::{Both, Orders};

pub(crate) const ABC: Body = Data(&[b"abc"]);
pub(crate) const PROTOCOL_ERROR: u32 = 1;

/// Body framing: `content-length` against the DATA frames, `transfer-encoding`.
pub(crate) const FRAMING: &[Vector] = &[
    // The baselines, so a broken harness shows here first.
    v(
        "baseline_no_length",
        Both,
        Std(&[]),
        ABC,
        Forwarded(post(b"abc")),
    ),
    v(
        "baseline_content_length",
        Both,
        Std(&[(b"content-length", b"3")]),
        ABC,
        Forwarded(post(b"abc")),
    ),
    v(
        "baseline_two_data_frames",
        Both,
        Std(&[(b"content-length", b"3")]),
        Data(&[b"ab", b"c"]),
        Forwarded(post(b"abc")),
    ),
    v(
        "baseline_no_body",
        Both,
        Std(&[]),
        End,
        Forwarded(post(b"")),
    ),
    framed(
        "baseline_continuation",
        HeadFrames::Continuation,
        Std(&[(b"content-length", b"3")]),
        ABC,
        Forwarded(post(b"abc")),
    ),
    // RFC 9113 §8.1.1: a content-length that does not equal the sum of the DATA
    // frames' lengths is malformed: a stream error of type PROTOCOL_ERROR.
    v(
        "content_length_larger_than_data",
        Both,
        Std(&[(b"content-length", b"5")]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "content_length_smaller_than_data",
        Both,
        Std(&[(b"content-length", b"2")]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "content_length_with_no_data",
        Both,
        Std(&[(b"content-length", b"3")]),
        End,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "content_length_zero_with_data",
        Both,
        Std(&[(b"content-length", b"0")]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    // The same length twice: h2 checks the DATA against it, and the upstream reads one
    // Content-Length (the strict recorder flags two).
    v(
        "content_length_twice",
        Both,
        Std(&[(b"content-length", b"3"), (b"content-length", b"3")]),
        ABC,
        Forwarded(post(b"abc")),
    ),
    v(
        "content_length_two_values",
        Both,
        Std(&[(b"content-length", b"3"), (b"content-length", b"5")]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "content_length_two_values_other_order",
        Both,
        Std(&[(b"content-length", b"5"), (b"content-length", b"3")]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "content_length_as_a_list",
        Both,
        Std(&[(b"content-length", b"3, 3")]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "content_length_not_a_number",
        Both,
        Std(&[(b"content-length", b"3x")]),
        ABC,
        Reset(PROTOCOL_ERROR),
    ),
    // RFC 9113 §8.2.2: transfer-encoding is connection-specific: malformed. The DATA
    // looks chunked, so an upstream reading both framings would see a second request.
    v(
        "transfer_encoding_chunked",
        Both,
        Std(&[(b"transfer-encoding", b"chunked")]),
        Data(&[b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nhost: a\r\n\r\n"]),
        Reset(PROTOCOL_ERROR),
    ),
    v(
        "transfer_encoding_chunked_with_content_length",
        Both,
        Std(&[
            (b"content-length", b"5"),
            (b"transfer-encoding", b"chunked"),
        ]),
        Data(&[b"0\r\n\r\n"]),
        Reset(PROTOCOL_ERROR),
    ),
    // Padding is not body (RFC 9113 §6.1): the upstream reads the data alone, and h2
    // checks the content-length against it.
    v(
        "padded_data",
        Both,
        Std(&[(b"content-length", b"3")]),
        Padded(b"abc", 5),
        Forwarded(post(b"abc")),
    ),
    v(
        "padded_data_length_counting_the_padding",
        Both,
        Std(&[(b"content-length", b"9")]),
        Padded(b"abc", 5),
        Reset(PROTOCOL_ERROR),
    ),
    // A request inside the body is body: the upstream reads one request whose body
    // carries it, by the length or chunks the proxy framed it with.
    v(
        "request_in_the_body",
        Both,
        Std(&[]),
        Data(&[b"GET /smuggled HTTP/1.1\r\nhost: a\r\n\r\n"]),
        Forwarded(post(b"GET /smuggled HTTP/1.1\r\nhost: a\r\n\r\n")),
    ),
    v(
        "chunked_looking_body_without_transfer_encoding",
        Both,
        Std(&[]),
        Data(&[b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nhost: a\r\n\r\n"]),
        Forwarded(post(b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nhost: a\r\n\r\n")),
    ),
    // The protected route buffers up to `max_body` (64 B): a longer body is refused
    // whether or not a content-length announced it, and nothing is forwarded.
    v(
        "body_over_max_body",
        Orders,
        Std(&[]),
        Data(&[&[b'x'; 40], &[b'x'; 40]]),
        Refused(413),
    ),
    v(
        "content_length_over_max_body",
        Orders,
        Std(&[(b"content-length", b"80")]),
        Data(&[&[b'x'; 40], &[b'x'; 40]]),
        Refused(413),
    ),
    framed(
        "headers_padded",
        HeadFrames::Padded(7),
        Std(&[(b"content-length", b"3")]),
        ABC,
        Forwarded(post(b"abc")),
    ),
    framed(
        "headers_with_priority",
        HeadFrames::Priority,
        Std(&[(b"content-length", b"3")]),
        ABC,
        Forwarded(post(b"abc")),
    ),
];
