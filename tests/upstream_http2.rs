//! `connections.upstream_protocol: http2`: requests reach the upstream over HTTP/2 (h2c
//! with prior knowledge, or TLS with ALPN `h2`) on few shared connections, and the
//! never-twice rule holds: only a request the upstream provably did not process (nothing
//! listening, `REFUSED_STREAM`) releases its key; a stream reset after the upstream read
//! it holds the key as outcome unknown.

#[path = "common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{post, send, start_proxy, start_upstream};
use http::{Method, StatusCode};

const ROUTES: &str = r#"
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
  - name: plain
    match: { path: "/plain/*" }
    idempotency: off
"#;

/// The config after `listen`/`upstream`: HTTP/2 upstream connections, an idle timeout no
/// pause in these tests reaches (so counted connections are reused, never expired).
fn h2(rest: &str) -> String {
    format!("connections:\n  upstream_protocol: http2\n  upstream_idle_timeout: 1h\n{rest}")
}

/// A TCP relay to `to` that counts the connections it accepts.
async fn counting_relay(to: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut down, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut up = tokio::net::TcpStream::connect(to).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
            });
        }
    });
    (addr, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reach_the_upstream_as_http2_when_configured_and_http11_by_default() {
    let upstream = start_upstream().await;
    let plain = start_proxy(upstream.addr, ROUTES).await;
    let seen = send(plain.addr, Method::GET, "/echo-headers", &[], "")
        .await
        .json();
    assert_eq!(seen["version"], "HTTP/1.1", "{seen}");

    let proxy = start_proxy(upstream.addr, &h2(ROUTES)).await;
    let host = proxy.addr.to_string();
    let asked = [
        ("connection", "keep-alive, x-private, te"),
        ("x-private", "1"),
        ("te", "trailers"),
    ];
    let seen = send(proxy.addr, Method::GET, "/echo-headers?a=1", &asked, "")
        .await
        .json();
    assert_eq!(seen["version"], "HTTP/2.0", "{seen}");
    // `:authority` carries what `Host` carries over HTTP/1.1; `X-Forwarded-*` as ever.
    assert_eq!(
        seen["uri"],
        format!("http://{host}/echo-headers?a=1"),
        "{seen}"
    );
    let headers = &seen["headers"];
    assert_eq!(headers["x-forwarded-host"][0], host.as_str(), "{seen}");
    assert_eq!(headers["x-forwarded-proto"][0], "http", "{seen}");
    assert_eq!(headers["x-forwarded-for"][0], "127.0.0.1", "{seen}");
    // The one connection-specific field HTTP/2 allows (gRPC needs it).
    assert_eq!(headers["te"][0], "trailers", "{seen}");
    for gone in [
        "host",
        "connection",
        "x-private",
        "transfer-encoding",
        "keep-alive",
    ] {
        assert!(headers.get(gone).is_none(), "{gone} forwarded: {seen}");
    }
    // A protected route's request too.
    let created = post(proxy.addr, "/orders", &[("idempotency-key", "v")], "{}").await;
    assert_eq!(created.status, StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_with_one_key_execute_once_over_h2() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &h2(ROUTES)).await;
    let headers = [("idempotency-key", "dup"), ("x-test-gate", "dup")];
    let sends: Vec<_> = (0..8)
        .map(|_| tokio::spawn(async move { post(proxy.addr, "/orders", &headers, "{}").await }))
        .collect();
    // The owner is held until the other seven wait on it, so each meets it in flight.
    upstream.arrived("dup", 1).await;
    proxy.metric_reaches("idemgate_waiting", 7.0).await;
    upstream.open("dup");
    let mut bodies = Vec::new();
    for send in sends {
        let answer = send.await.unwrap();
        assert_eq!(answer.status, StatusCode::CREATED);
        bodies.push(answer.body);
    }
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "one answer for all"
    );
    assert_eq!(upstream.executed_for("dup"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_one_connection_and_later_ones_reuse_it() {
    let upstream = start_upstream().await;
    let (relay, accepted) = counting_relay(upstream.addr).await;
    let proxy = start_proxy(relay, &h2(ROUTES)).await;
    let sends: Vec<_> = (0..6)
        .map(|i| {
            tokio::spawn(async move {
                let key = format!("k{i}");
                let headers = [("idempotency-key", key.as_str()), ("x-test-gate", "many")];
                post(proxy.addr, "/orders", &headers, "{}").await
            })
        })
        .collect();
    // All six are open on the upstream at once.
    upstream.arrived("many", 6).await;
    upstream.open("many");
    for send in sends {
        assert_eq!(send.await.unwrap().status, StatusCode::CREATED);
    }
    for i in 0..4 {
        let path = format!("/plain/{i}");
        assert_eq!(
            send(proxy.addr, Method::GET, &path, &[], "").await.status,
            200
        );
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "one HTTP/2 connection");
    assert_eq!(upstream.executed(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_not_listening_is_502_unreachable_and_releases_the_key() {
    let (dead, _held) = common::refusing_addr();
    let proxy = start_proxy(dead, &h2(ROUTES)).await;
    for _ in 0..2 {
        // Released, so the second is tried again (502 again), not held (409).
        let a = post(proxy.addr, "/orders", &[("idempotency-key", "dead")], "{}").await;
        assert_eq!(a.status, StatusCode::BAD_GATEWAY);
        assert_eq!(a.problem(), "urn:idemgate:problem:upstream-unreachable");
    }
}

/// The upstream reads the request, then resets its stream: it may have run it. The key is
/// held as outcome unknown and the retry never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_after_the_upstream_read_the_request_holds_the_key() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &h2(ROUTES)).await;
    let reset = [("idempotency-key", "reset"), ("x-test-reset", "1")];
    let broken = post(proxy.addr, "/orders", &reset, "{}").await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY);
    assert_eq!(broken.problem(), "urn:idemgate:problem:upstream-failed");
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "reset")], "{}").await;
    assert_eq!(retry.problem(), "urn:idemgate:problem:outcome-unknown");
    assert_eq!(upstream.executed(), 1);
    // The connection survives a reset stream: the next request is served.
    let next = post(proxy.addr, "/orders", &[("idempotency-key", "next")], "{}").await;
    assert_eq!(next.status, StatusCode::CREATED);
}

/// An HTTP/2 upstream (h2 itself) that refuses every stream with `REFUSED_STREAM`, which
/// RFC 9113 §8.7 says it did not process, until `accept` is set; then it answers 201.
async fn refusing_upstream(accept: Arc<std::sync::atomic::AtomicBool>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let accept = Arc::clone(&accept);
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(stream).await else {
                    return;
                };
                while let Some(Ok((_request, mut respond))) = conn.accept().await {
                    if accept.load(Ordering::SeqCst) {
                        let answer = http::Response::builder().status(201).body(()).unwrap();
                        let _ = respond.send_response(answer, true);
                    } else {
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_was_never_processed_and_releases_the_key() {
    let accept = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let upstream = refusing_upstream(Arc::clone(&accept)).await;
    let proxy = start_proxy(upstream, &h2(ROUTES)).await;
    let refused = post(proxy.addr, "/orders", &[("idempotency-key", "r")], "{}").await;
    assert_eq!(refused.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        refused.problem(),
        "urn:idemgate:problem:upstream-unreachable"
    );
    accept.store(true, Ordering::SeqCst);
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "r")], "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "released, so run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_body_streams_through_on_an_unprotected_route() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &h2(ROUTES)).await;
    let n = 3 << 20;
    let got = send(
        proxy.addr,
        Method::GET,
        &format!("/download?bytes={n}"),
        &[],
        "",
    )
    .await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body.len(), n);
    assert!(got.body == common::pattern_bytes(n), "byte for byte");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_to_an_http2_upstream_is_501() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &h2(ROUTES)).await;
    let answer = common::raw_exchange(
        proxy.addr,
        b"GET /plain/ws HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 501"), "{answer}");
    assert!(answer.contains("not-implemented"), "{answer}");
}

/// An HTTP/1.1-only upstream (h2c not spoken): the dial fails on the missing SETTINGS,
/// before any request went out, so the key is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_does_not_speak_http2_is_unreachable() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let proxy = start_proxy(addr, &h2(ROUTES)).await;
    let a = post(proxy.addr, "/orders", &[("idempotency-key", "h1")], "{}").await;
    assert_eq!(a.problem(), "urn:idemgate:problem:upstream-unreachable");
}

/// A client that stops sending a pass-through upload gets the 408 it gets over an
/// HTTP/1.1 upstream, although hyper's HTTP/2 client reports only the stream it reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_to_an_http2_upstream_is_408() {
    let upstream = start_upstream().await;
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{}\n{}",
        upstream.addr,
        h2(ROUTES)
    );
    let proxy = common::start_proxy_tuned(&text, None, |p| {
        p.with_body_read_timeout(std::time::Duration::from_millis(300))
    })
    .await;
    let answer = common::raw_exchange(
        proxy.addr,
        b"POST /plain/up HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n0123456789",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body-timeout"), "{answer}");
}

/// A client's request trailers reach the upstream without the fields only a header section
/// may carry or that say where the request came from, over either protocol: over HTTP/1.1
/// hyper sends only the trailers the proxy declared, but its HTTP/2 client sends all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_trailers_lose_header_only_and_forwarding_fields_over_http2_too() {
    let upstream = start_upstream().await;
    let routes =
        "routes:\n  - name: echo\n    match: { path: /echo-headers }\n    idempotency: off\n";
    for protocol in ["http1", "http2"] {
        let config = format!("connections: {{ upstream_protocol: {protocol} }}\n{routes}");
        let proxy = start_proxy(upstream.addr, &config).await;
        let answer = common::raw_exchange(
            proxy.addr,
            b"POST /echo-headers HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\
              trailer: x-checksum, x-forwarded-for, authorization\r\nconnection: close\r\n\r\n\
              3\r\nabc\r\n0\r\nx-checksum: 1\r\nx-forwarded-for: 6.6.6.6\r\n\
              authorization: Bearer forged\r\n\r\n",
        )
        .await;
        let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
        let seen: serde_json::Value = serde_json::from_str(body).expect(&answer);
        assert_eq!(seen["body_len"], 3, "{protocol}: {seen}");
        let trailers = &seen["trailers"];
        assert_eq!(trailers["x-checksum"][0], "1", "{protocol}: {seen}");
        for refused in ["x-forwarded-for", "authorization"] {
            assert!(
                trailers.get(refused).is_none(),
                "{protocol}: {refused} forwarded: {seen}"
            );
        }
    }
}

/// The protected POST's answer is cut short by an HTTP/2 upstream that ran it: `200`,
/// 40 bytes of body (of `content_length`, when the head names one), then `RST_STREAM`
/// with `NO_ERROR` before any `END_STREAM`. hyper's client ends such a body as if it were
/// whole (RFC 9113 §8.1 allows `NO_ERROR` only after a complete answer), so the proxy
/// must itself see that the stream never ended: the owner's client gets a 502, the
/// duplicate that waited on it and the later retry the outcome-unknown 409, and no
/// truncated answer is stored or replayed.
async fn an_answer_cut_by_a_no_error_reset_is_never_stored(content_length: Option<usize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (arrived, arrival) = tokio::sync::oneshot::channel();
    let (open, gate) = tokio::sync::oneshot::channel::<()>();
    let ran = Arc::new(AtomicUsize::new(0));
    let runs = Arc::clone(&ran);
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let ran = async move {
            runs.fetch_add(1, Ordering::SeqCst);
            arrived.send(()).unwrap();
            gate.await.unwrap();
        };
        common::answer_cut_by_a_reset(stream, content_length, &[b'x'; 40], 0, ran).await;
    });
    let proxy = start_proxy(addr, &h2(ROUTES)).await;
    let key = [("idempotency-key", "cut")];
    let owner = tokio::spawn(async move { post(proxy.addr, "/orders", &key, "{}").await });
    arrival.await.unwrap();
    let waiter = tokio::spawn(async move { post(proxy.addr, "/orders", &key, "{}").await });
    proxy.metric_reaches("idemgate_waiting", 1.0).await;
    open.send(()).unwrap();

    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::BAD_GATEWAY, "{owner:?}");
    assert_eq!(owner.problem(), "urn:idemgate:problem:upstream-failed");
    let waiter = waiter.await.unwrap();
    assert_eq!(waiter.status, StatusCode::CONFLICT, "{waiter:?}");
    assert_eq!(waiter.problem(), "urn:idemgate:problem:outcome-unknown");
    let retry = post(proxy.addr, "/orders", &key, "{}").await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
    assert_eq!(retry.problem(), "urn:idemgate:problem:outcome-unknown");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "run once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_cut_short_of_its_length_by_a_no_error_reset_is_never_stored() {
    an_answer_cut_by_a_no_error_reset_is_never_stored(Some(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_a_length_cut_by_a_no_error_reset_is_never_stored() {
    an_answer_cut_by_a_no_error_reset_is_never_stored(None).await;
}

/// RFC 9113 §8.1: an upstream may answer whole (`END_STREAM`) before it read the request's
/// body, then reset the stream with `NO_ERROR` to stop the upload. That answer is complete:
/// the owner's client gets it and the retry its replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_then_a_no_error_reset_is_stored_and_replayed() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        common::answer_early_then_reset(stream, b"{\"early\":true}").await;
    });
    let proxy = start_proxy(addr, &h2(ROUTES)).await;
    // More than the 64 KiB window a server that never reads the body leaves the client.
    let body = format!("\"{}\"", "b".repeat(200 << 10));
    let key = [("idempotency-key", "early")];
    let first = post(proxy.addr, "/orders", &key, &body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.body, "{\"early\":true}");
    let again = post(proxy.addr, "/orders", &key, &body).await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.body, "{\"early\":true}");
}

/// An HTTP/2 upstream that answers `204` and `304` with DATA anyway (and a length for it):
/// those answers end at their head (RFC 9110 §15.3.5, §15.4.5), as the HTTP/1.1 clients
/// frame them, so their body is neither stored nor sent on. Kept, it reached clients over
/// HTTP/2 as content of a 204, in the owner's answer and in every replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_204_or_304_from_an_http2_upstream_keeps_no_body() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(stream).await else {
                    return;
                };
                while let Some(Ok((request, mut respond))) = conn.accept().await {
                    let status = request.headers()["x-status"].to_str().unwrap().to_owned();
                    let answer = http::Response::builder()
                        .status(status.as_str())
                        .header("content-length", "5")
                        .body(())
                        .unwrap();
                    let mut body = respond.send_response(answer, false).unwrap();
                    body.send_data(bytes::Bytes::from_static(b"stray"), true)
                        .unwrap();
                }
            });
        }
    });
    let proxy = start_proxy(addr, &h2(ROUTES)).await;
    let h2_client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    // A 304 is not replayed by default: only its owner's answer is checked.
    for (status, attempts) in [("204", &["owner", "replay"][..]), ("304", &["owner"])] {
        let key = format!("bodiless-{status}");
        let fields = [("idempotency-key", key.as_str()), ("x-status", status)];
        for attempt in attempts {
            let answer = common::send_with(
                &h2_client,
                proxy.addr,
                Method::POST,
                "/orders",
                &fields,
                "{}",
            )
            .await;
            assert_eq!(answer.status.as_str(), status, "{attempt}: {answer:?}");
            assert_eq!(answer.body, "", "{attempt} of {status}: {answer:?}");
        }
    }
}

/// An HTTP/2 upstream that sends its `204` head first and ends its stream only later, as
/// Go's server does for a handler that flushes the head and is still committing its work.
/// The proxy reads that stream to its `END_STREAM`: dropped at the head, it was reset
/// (`CANCEL`), which cancels such a handler, and a rolled-back handler's 204 stored and
/// replayed claims work that was never done. The owner's answer, and with it the
/// settlement, wait for that end: a duplicate meanwhile waits on the owner, then gets the
/// 204 (no body), as a later retry does from the store; the upstream ran it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_204_head_from_an_http2_upstream_is_read_to_its_end_not_reset() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (sent, head_sent) = tokio::sync::oneshot::channel();
    let (open, gate) = tokio::sync::oneshot::channel::<()>();
    let (ended, reset) = tokio::sync::oneshot::channel();
    let ran = Arc::new(AtomicUsize::new(0));
    let runs = Arc::clone(&ran);
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let head = move || {
            runs.fetch_add(1, Ordering::SeqCst);
            sent.send(()).unwrap();
        };
        let returned = async {
            let _ = gate.await;
        };
        let on_end = |reset| {
            let _ = ended.send(reset);
        };
        common::no_content_ended_later(stream, head, returned, on_end).await;
    });
    let proxy = start_proxy(addr, &h2(ROUTES)).await;
    let key = [("idempotency-key", "flushed")];
    let mut owner = tokio::spawn(async move { post(proxy.addr, "/orders", &key, "{}").await });
    head_sent.await.unwrap();
    let mut waiter = tokio::spawn(async move { post(proxy.addr, "/orders", &key, "{}").await });
    // The owner is still reading the upstream's stream, so the duplicate waits on it; an
    // answer before the upstream ended its stream is what this test pins.
    tokio::select! {
        () = proxy.metric_reaches("idemgate_waiting", 1.0) => {}
        owner = &mut owner => panic!("the owner answered before the stream ended: {owner:?}"),
        waiter = &mut waiter => panic!("the duplicate answered before it ended: {waiter:?}"),
    }
    open.send(()).unwrap();
    let reset = reset.await.unwrap();
    assert_eq!(
        reset, None,
        "the proxy reset the stream (code {reset:?}) before its end"
    );

    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::NO_CONTENT, "{owner:?}");
    assert_eq!(owner.body, "", "{owner:?}");
    assert!(!owner.replayed(), "{owner:?}");
    let waiter = waiter.await.unwrap();
    assert_eq!(waiter.status, StatusCode::NO_CONTENT, "{waiter:?}");
    assert_eq!(waiter.body, "", "{waiter:?}");
    let retry = post(proxy.addr, "/orders", &key, "{}").await;
    assert_eq!(retry.status, StatusCode::NO_CONTENT, "{retry:?}");
    assert_eq!(retry.body, "", "{retry:?}");
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "run once");
}

/// The same upstream on an unprotected route, its answer passed through to an HTTP/1.1
/// client: that client has the whole 204 at its head (hyper's server drops the body of a
/// 204 unread), and the stream is still read to its end, not reset under the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_204_head_passed_through_is_answered_at_once_and_its_stream_read_to_its_end() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (open, gate) = tokio::sync::oneshot::channel::<()>();
    let (ended, reset) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let returned = async {
            let _ = gate.await;
        };
        let on_end = |reset| {
            let _ = ended.send(reset);
        };
        common::no_content_ended_later(stream, || {}, returned, on_end).await;
    });
    let proxy = start_proxy(addr, &h2(ROUTES)).await;
    let answer = send(proxy.addr, Method::POST, "/plain/x", &[], "").await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT, "{answer:?}");
    assert_eq!(answer.body, "", "{answer:?}");
    assert!(answer.headers.get("content-length").is_none(), "{answer:?}");
    open.send(()).unwrap();
    let reset = reset.await.unwrap();
    assert_eq!(
        reset, None,
        "the proxy reset the stream (code {reset:?}) before its end"
    );
}

/// An HTTP/2 upstream that follows its `204` head with more stray DATA than the proxy
/// reads of it (64 KiB) is taken for a hostile one: the owner's client gets a 502 and its
/// retry the outcome-unknown 409, nothing stored, rather than the proxy reading on forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_data_after_a_204_from_an_http2_upstream_is_never_stored() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut conn = h2::server::handshake(stream).await.unwrap();
        while let Some(Ok((_, mut respond))) = conn.accept().await {
            let answer = http::Response::builder().status(204).body(()).unwrap();
            let mut body = respond.send_response(answer, false).unwrap();
            body.send_data(vec![b's'; 100 << 10].into(), true).unwrap();
        }
    });
    let proxy = start_proxy(addr, &h2(ROUTES)).await;
    let key = [("idempotency-key", "stray")];
    let owner = post(proxy.addr, "/orders", &key, "{}").await;
    assert_eq!(owner.status, StatusCode::BAD_GATEWAY, "{owner:?}");
    assert_eq!(owner.problem(), "urn:idemgate:problem:upstream-failed");
    let retry = post(proxy.addr, "/orders", &key, "{}").await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
    assert_eq!(retry.problem(), "urn:idemgate:problem:outcome-unknown");
}

/// An answer to HEAD from an HTTP/2 upstream keeps its head (its `Content-Length` too) and
/// no body, and ends with its stream: nothing is left to read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_to_head_from_an_http2_upstream_keeps_its_length_and_no_body() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &h2(ROUTES)).await;
    for _ in 0..2 {
        let answer = send(proxy.addr, Method::HEAD, "/plain/x", &[], "").await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.body, "", "{answer:?}");
        assert!(answer.headers.contains_key("content-length"), "{answer:?}");
    }
}
