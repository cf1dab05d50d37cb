//! The HTTP/2-to-HTTP/1.1 downgrade desync vectors: requests sent to idemgate over HTTP/2
//! (cleartext with prior knowledge, and TLS with ALPN h2) as hand-written frames, with what
//! crossed it seen by the strict HTTP/1.1 recorder of tests/desync_client
//! ([`wire::start_wire`], included unedited), which flags anything a lenient upstream
//! could read as two requests or another body.
//!
//! The corpus is data ([`corpus::FRAMING`], [`fields::FIELDS`], [`pseudo::PSEUDO`]): a
//! name, the fields and frames, and the one outcome RFC 9113 and hyper/h2 give it. Each
//! vector runs on a fresh proxy in front of a fresh recorder, on the protected route
//! (`/orders`), the streamed route (`/stream`, `idempotency: off`) or both; after it, a
//! plain request on the same connection must be served unless the proxy sent GOAWAY (a
//! stream error does not end the connection, RFC 9113 §5.4.2).
//!
//! One job per module: `corpus.rs` the vector types, routes and framing vectors,
//! `fields.rs` and `pseudo.rs` the other tables, `fields_seen.rs` the fields the upstream
//! reads, `frames.rs` HTTP/2 frames and HPACK by hand, `run.rs` running a vector and
//! judging it, `interleave.rs` several streams on one connection, `cut.rs` an upstream
//! that signals a body's first bytes, `tls.rs` the TLS client; the tests are here.

#[path = "../common/mod.rs"]
mod common;

mod corpus;
mod cut;
mod fields;
mod fields_seen;
mod frames;
mod interleave;
mod pseudo;
mod run;
mod tls;
#[path = "../desync_client/wire.rs"]
mod wire;

use std::sync::Arc;

use corpus::{Vector, FRAMING};
use fields::FIELDS;
use pseudo::PSEUDO;

use run::{expected, Verdict};

/// Runs every vector of `groups` on each of its routes over `transport`, at most 8 at
/// once, and fails listing every vector whose verdict is not the expected one or after
/// which the follow-up request on the same connection was not served.
async fn check_over(groups: &[&'static [Vector]], transport: run::Transport) {
    let transport = Arc::new(transport);
    let mut runs = tokio::task::JoinSet::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(8));
    for vector in groups.iter().copied().flatten() {
        for &route in vector.on.routes() {
            let (slots, transport) = (Arc::clone(&slots), Arc::clone(&transport));
            runs.spawn(async move {
                let _slot = slots.acquire_owned().await.unwrap();
                let (seen, served) = run::run_over(vector, route, &transport).await;
                (vector, route, seen, served)
            });
        }
    }
    let mut failures = Vec::new();
    while let Some(done) = runs.join_next().await {
        let (vector, route, seen, served) = done.unwrap();
        let want = expected(vector.expect, route);
        // A GOAWAY ends the connection: no follow-up then. Otherwise it must be served.
        let want_served = (!matches!(want, Verdict::GoAway(_))).then_some(true);
        if seen != want || served != want_served {
            failures.push(format!(
                "{} on {}:\n    expected {want}, then served {want_served:?}\n    got      {seen}, then served {served:?}",
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

/// [`check_over`] on cleartext HTTP/2 (prior knowledge).
async fn check_group(group: &'static [Vector]) {
    check_over(&[group], run::Transport::Cleartext).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framing_vectors_get_their_one_outcome() {
    check_group(FRAMING).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_vectors_get_their_one_outcome() {
    check_group(FIELDS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pseudo_header_vectors_get_their_one_outcome() {
    check_group(PSEUDO).await;
}

/// Runs every case of `cases` and fails listing each one where the request was not
/// answered 201 and read once with exactly the listed values of its field.
async fn check_seen(cases: &'static [fields_seen::Seen]) {
    let mut failures = Vec::new();
    for case in cases {
        for &route in case.vector.on.routes() {
            let (outcome, values) = fields_seen::run_seen(case, route).await;
            let want: Vec<Vec<String>> = vec![case.values.iter().map(|v| v.to_string()).collect()];
            if outcome != run::Outcome::Answered(201) || values != want {
                failures.push(format!(
                    "{} on {}: expected 201 and {} {want:?}, got {outcome:?} and {values:?}",
                    case.vector.name,
                    route.path(),
                    case.field
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The fields the upstream reads: one Host from `:authority`, one Cookie, no `te`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_reads_the_fields_rfc_9113_asks_for() {
    check_seen(fields_seen::SEEN).await;
}

/// Four requests on one connection, two protected and two on the open route, their DATA
/// frames interleaved three bytes at a time: each is executed once, with its own body,
/// and each stream gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_streams_each_get_their_own_request_and_answer() {
    use interleave::{run_interleaved, Req};
    let reqs = [
        Req {
            stream: 1,
            path: "/orders",
            key: Some("i1"),
            body: b"one-one-one-one",
        },
        Req {
            stream: 3,
            path: "/orders/open",
            key: None,
            body: b"three-three",
        },
        Req {
            stream: 5,
            path: "/orders",
            key: Some("i5"),
            body: b"five-five-five-five-five",
        },
        Req {
            stream: 7,
            path: "/orders/open",
            key: None,
            body: b"seven",
        },
    ];
    let (answers, upstream) = run_interleaved(&reqs, 3).await;
    let want: Vec<(Option<u16>, Option<String>)> = reqs
        .iter()
        .map(|r| (Some(201), Some(String::from_utf8(r.body.to_vec()).unwrap())))
        .collect();
    assert_eq!(answers, want);
    assert_eq!(upstream.executed(), 4);
}

/// Two streams on one connection with the same key and body, interleaved: executed
/// once, and both get that one answer (the second waits for or replays the first's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_duplicates_execute_once_and_share_the_answer() {
    use interleave::{run_interleaved, Req};
    let reqs = [
        Req {
            stream: 1,
            path: "/orders",
            key: Some("dup"),
            body: b"the-same-body",
        },
        Req {
            stream: 3,
            path: "/orders",
            key: Some("dup"),
            body: b"the-same-body",
        },
    ];
    let (answers, upstream) = run_interleaved(&reqs, 2).await;
    let one = (Some(201), Some("the-same-body".to_owned()));
    assert_eq!(answers, vec![one.clone(), one]);
    assert_eq!(upstream.executed_for("dup"), 1);
}

/// A client that resets its stream half-way through the body (RST_STREAM CANCEL), with
/// or without a content-length: no
/// whole request reaches the upstream (the streamed route may leave one cut off mid-body,
/// which no upstream can act on), the connection serves the next stream, and on the
/// protected route the key is free again: the request never went out (SPEC: a request
/// that provably never reached the upstream releases its key), so a retry with the same
/// key and the whole body executes, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_client_resets_mid_body_reaches_nothing_and_frees_its_key() {
    use corpus::{Body, Expect, Head, On, Route, CONFIG};
    use frames::{frame, header_block, DATA, END_HEADERS, HEADERS, RST_STREAM};
    const CANCEL: u32 = 8;
    let whole = Vector {
        name: "whole",
        on: On::Both,
        head: Head::Std(&[(b"content-length", b"6")]),
        body: Body::Data(&[b"abcdef"]),
        head_frames: crate::corpus::HeadFrames::One,
        expect: Expect::Reset(0),
    };
    let mut failures = Vec::new();
    // With a content-length the upstream is sent one; without, chunks, and the proxy must
    // then not send the last chunk that would end the body short.
    let cases = [
        (Route::Open, true),
        (Route::Open, false),
        (Route::Orders, true),
        (Route::Orders, false),
    ];
    for (route, with_length) in cases {
        let (wire, log) = wire::start_wire().await;
        let text = format!("listen: 127.0.0.1:0\nupstream: http://{wire}\n{CONFIG}");
        let proxy = common::start_proxy_from(&text, None).await;
        let started = std::time::Instant::now();
        let mut h2 = run::H2::open(proxy.addr).await;
        let head = if with_length {
            whole.head
        } else {
            Head::Std(&[])
        };
        let fields = head.fields(route, "k1");
        let mut cut = frame(HEADERS, END_HEADERS, 1, &header_block(&fields));
        cut.extend(frame(DATA, 0, 1, b"abc"));
        cut.extend(frame(RST_STREAM, 0, 1, &CANCEL.to_be_bytes()));
        h2.send(&cut).await;
        h2.send(&run::follow_up(route)).await;
        let next = h2.outcome(3).await;
        // The retry: same key, the whole body.
        h2.send(&run::frames_of(&whole, route, 5, "k1")).await;
        let retry = h2.outcome(5).await;
        proxy.proxy.owners().finished(started + run::HANG).await;
        let seen: Vec<String> = log
            .events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                wire::Event::Request(w) => Some(format!(
                    "{} {} {:?}",
                    w.method,
                    w.target,
                    String::from_utf8_lossy(&w.body)
                )),
                // A request cut off mid-body on the streamed route: nothing to act on.
                wire::Event::Partial { .. } if route == Route::Open => None,
                other => Some(format!("{other:?}")),
            })
            .collect();
        let p = route.path();
        let want = vec![
            format!("POST {p}?next \"next\""),
            format!("POST {p} \"abcdef\""),
        ];
        let got = (next, retry, seen);
        let expected = (
            run::Outcome::Answered(201),
            run::Outcome::Answered(201),
            want,
        );
        if got != expected {
            failures.push(format!(
                "{p}, content-length {with_length}: expected {expected:?}\n    got {got:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every vector of every table gets the same outcome over TLS (ALPN h2) as over h2c: the
/// proxy's HTTP/2 is one path whatever carries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectors_over_tls_get_the_same_outcome() {
    let tls = run::Transport::Tls(tls::TlsClient::new());
    check_over(&[FRAMING, FIELDS, PSEUDO], tls).await;
}

/// On the streamed route the head and the first body bytes go upstream before the body
/// ends; a client that then resets its stream (RST_STREAM CANCEL) must leave the upstream
/// a request it cannot take for a whole one: the proxy closes the upstream connection
/// with the body short of its Content-Length, or with no last chunk, never ending the
/// body early (the upstream would run a request with a body the client never sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_after_its_head_went_upstream_leaves_no_whole_request() {
    use corpus::{Head, Route, CONFIG};
    use frames::{frame, header_block, DATA, END_HEADERS, HEADERS, RST_STREAM};
    const CANCEL: u32 = 8;
    let cases: [(Head, &[u8]); 2] = [
        (Head::Std(&[(b"content-length", b"6")]), b"\r\n\r\nabc"),
        (Head::Std(&[]), b"\r\n\r\n3\r\nabc\r\n"),
    ];
    for (head, until) in cases {
        let upstream = cut::start_cut_upstream(until).await;
        let text = format!(
            "listen: 127.0.0.1:0\nupstream: http://{}\n{CONFIG}",
            upstream.addr
        );
        let proxy = common::start_proxy_from(&text, None).await;
        let mut h2 = run::H2::open(proxy.addr).await;
        let fields = head.fields(Route::Open, "k1");
        let mut start = frame(HEADERS, END_HEADERS, 1, &header_block(&fields));
        start.extend(frame(DATA, 0, 1, b"abc"));
        h2.send(&start).await;
        cut::signal(upstream.arrived, "the head and `abc` reached the upstream").await;
        h2.send(&frame(RST_STREAM, 0, 1, &CANCEL.to_be_bytes()))
            .await;
        let got = cut::signal(upstream.closed, "the proxy closed the upstream connection").await;
        let got = String::from_utf8_lossy(&got).into_owned();
        assert!(
            got.starts_with("POST /stream HTTP/1.1\r\n")
                && got.ends_with(std::str::from_utf8(until).unwrap()),
            "the upstream got more than the head and `abc`, or something else: {got:?}"
        );
    }
}
