//! What fields the upstream gets for an HTTP/2 request: cookie crumbs joined into one
//! `Cookie`, one `Host` from `:authority`, no HTTP/2-only field passed on. Seen by
//! `common::start_recorder`, a hyper upstream that records each request's fields.

use crate::common;
use crate::corpus::Body::Data;
use crate::corpus::Expect::Reset;
use crate::corpus::Head::{Raw, Std};
use crate::corpus::On::Both;
use crate::corpus::{Route, Vector, CONFIG};
use crate::run::{frames_of, Outcome, H2};

/// A vector forwarded as is, and the values the upstream must see for one field name, in
/// order (none: the field is not forwarded).
pub(crate) struct Seen {
    pub(crate) vector: Vector,
    pub(crate) field: &'static str,
    pub(crate) values: &'static [&'static str],
}

const fn seen(
    name: &'static str,
    head: crate::corpus::Head,
    field: &'static str,
    values: &'static [&'static str],
) -> Seen {
    Seen {
        vector: Vector {
            name,
            on: Both,
            head,
            body: Data(&[b"abc"]),
            head_frames: crate::corpus::HeadFrames::One,
            // Unused here: the request must be answered 201 (checked below).
            expect: Reset(0),
        },
        field,
        values,
    }
}

pub(crate) const SEEN: &[Seen] = &[
    seen(
        "one_cookie",
        Std(&[(b"cookie", b"a=1")]),
        "cookie",
        &["a=1"],
    ),
    // §8.3.1: :authority is the host; the upstream reads one Host, the one the request
    // was routed by.
    seen("host_from_authority", Std(&[]), "host", &["a"]),
    seen(
        "host_conflicting_with_authority",
        Std(&[(b"host", b"b")]),
        "host",
        &["a"],
    ),
    seen(
        "host_without_authority",
        Raw(&[
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"$P"),
            (b"host", b"b"),
            (b"$K", b""),
        ]),
        "host",
        &["b"],
    ),
    // The client's `TE` is for its hop; asking for trailers, it has the proxy ask with its
    // own (RFC 9110 §10.1.4), since the proxy passes them on.
    seen(
        "te_trailers",
        Std(&[(b"te", b"trailers")]),
        "te",
        &["trailers"],
    ),
    // RFC 9113 §8.2.3: cookie crumbs "MUST be concatenated into a single octet string
    // using the two-octet delimiter of 0x3b, 0x20 ("; ") before being passed into a
    // non-HTTP/2 context, such as an HTTP/1.1 connection"; RFC 6265 §5.4 lets a request
    // carry one Cookie field.
    seen(
        "cookie_crumbs",
        Std(&[(b"cookie", b"a=1"), (b"cookie", b"b=2")]),
        "cookie",
        &["a=1; b=2"],
    ),
];

/// Runs `case` on `route`: the client's outcome, and the values of the field the upstream
/// saw.
pub(crate) async fn run_seen(case: &Seen, route: Route) -> (Outcome, Vec<Vec<String>>) {
    let recorder = common::start_recorder().await;
    let proxy = common::start_proxy(recorder.addr, CONFIG).await;
    let mut h2 = H2::open(proxy.addr).await;
    h2.send(&frames_of(&case.vector, route, 1, "k1")).await;
    let outcome = h2.outcome(1).await;
    let values = recorder
        .seen()
        .iter()
        .map(|s| {
            s.headers
                .get_all(case.field)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect()
        })
        .collect();
    (outcome, values)
}
