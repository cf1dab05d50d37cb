//! Bad input gets a clear problem+json answer, nothing reaches the upstream that should
//! not, and the proxy keeps serving the next good request.

mod common;

use common::{post, send, start_proxy, start_upstream, Answer};
use http::{Method, StatusCode};

const ROUTES: &str = r#"
defaults: { max_body: 64KiB, upstream_timeout: 1s }
routes:
  - name: create-order
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
  - name: callback
    match: { methods: [POST], path: /orders/callback }
    key: { fields: [/alipayNo, /paymentOrderNo] }
  - name: optional-callback
    match: { methods: [POST], path: /orders/optional-callback }
    key: { fields: [/alipayNo], required: false }
  - name: fingerprinted
    match: { methods: [POST, PUT], path: "/orders/{id}/notes" }
    key: { fingerprint: { body: true } }
  - name: fresh-header
    match: { methods: [POST], path: /orders/fresh }
    key: { header: Idempotency-Key }
    fresh: { header: X-Timestamp, max_age: 5m, skew: 30s }
  - name: fresh-field
    match: { methods: [POST], path: /orders/fresh-body }
    key: { fingerprint: { body: true } }
    fresh: { field: /ts, max_age: 5m, skew: 30s }
"#;

fn assert_problem(a: &Answer, status: StatusCode, kind: &str) {
    assert_eq!(a.status, status, "{}", String::from_utf8_lossy(&a.body));
    assert_eq!(a.headers["content-type"], "application/problem+json");
    let p = a.json();
    assert_eq!(p["type"], format!("urn:idemgate:problem:{kind}"));
    assert_eq!(p["status"], status.as_u16());
    assert!(p["title"].is_string() && p["detail"].is_string());
}

async fn still_serving(addr: std::net::SocketAddr, tag: &str) {
    let a = post(addr, "/orders", &[("idempotency-key", tag)], "{}").await;
    assert_eq!(
        a.status,
        StatusCode::CREATED,
        "the next good request still works"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_too_large_is_413_without_calling_upstream() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(70 * 1024));
    let a = post(proxy.addr, "/orders", &[("idempotency-key", "big")], &big).await;
    assert_problem(&a, StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large");
    assert_eq!(upstream.executed(), 0);
    still_serving(proxy.addr, "after-413").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_over_the_limit_is_413() {
    // No Content-Length: the limit must hold while reading.
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let chunk = "y".repeat(32 * 1024);
    let mut req = String::from("POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: chunky\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n");
    for _ in 0..3 {
        req.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    req.push_str("0\r\n\r\n");
    let _ = stream.write_all(req.as_bytes()).await;
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
    assert_eq!(upstream.executed(), 0);
    still_serving(proxy.addr, "after-chunked-413").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_missing_keys_are_400() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    for bad in ["\"unterminated", "has space", "a,b", &"k".repeat(256)] {
        let a = post(proxy.addr, "/orders", &[("idempotency-key", bad)], "{}").await;
        assert_problem(&a, StatusCode::BAD_REQUEST, "key-invalid");
    }
    let missing = post(proxy.addr, "/orders", &[], "{}").await;
    assert_problem(&missing, StatusCode::BAD_REQUEST, "key-invalid");
    let repeated = send(
        proxy.addr,
        Method::POST,
        "/orders",
        &[("idempotency-key", "a"), ("idempotency-key", "b")],
        "{}",
    )
    .await;
    assert_problem(&repeated, StatusCode::BAD_REQUEST, "key-invalid");
    assert_eq!(upstream.executed(), 0);
    still_serving(proxy.addr, "after-400").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_json_on_a_fields_route_is_400_and_on_a_fingerprint_route_is_hashed_raw() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let a = post(proxy.addr, "/orders/callback", &[], "{not json").await;
    assert_problem(&a, StatusCode::BAD_REQUEST, "body-invalid-json");
    let missing = post(proxy.addr, "/orders/callback", &[], r#"{"alipayNo":"A"}"#).await;
    assert_problem(&missing, StatusCode::BAD_REQUEST, "key-field-missing");
    assert!(missing.json()["detail"]
        .as_str()
        .unwrap()
        .contains("/paymentOrderNo"));
    assert_eq!(upstream.executed(), 0);

    let raw1 = post(proxy.addr, "/orders/7/notes", &[], "{not json").await;
    let raw2 = post(proxy.addr, "/orders/7/notes", &[], "{not json").await;
    assert_eq!(raw1.status, StatusCode::CREATED);
    assert!(raw2.replayed(), "identical raw bytes are one request");
    let raw3 = post(proxy.addr, "/orders/7/notes", &[], "{not  json").await;
    assert!(!raw3.replayed(), "raw bytes are compared exactly");
    assert_eq!(upstream.executed(), 2);
    still_serving(proxy.addr, "after-json").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_deep_nesting_is_answered_and_the_proxy_survives() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let deep_obj = format!("{}1{}", r#"{"a":"#.repeat(10_000), "}".repeat(10_000));
    // A fields route must parse: too deep is a 400.
    let a = post(proxy.addr, "/orders/callback", &[], &deep_obj).await;
    assert_problem(&a, StatusCode::BAD_REQUEST, "body-invalid-json");
    // A fingerprint route hashes what it cannot canonicalize as raw bytes.
    let b = post(proxy.addr, "/orders/1/notes", &[], &deep).await;
    assert_eq!(b.status, StatusCode::CREATED);
    let c = post(proxy.addr, "/orders/1/notes", &[], &deep).await;
    assert!(c.replayed());
    // Unmatched POSTs go through the default fingerprint key the same way.
    let d = post(proxy.addr, "/elsewhere/orders", &[], &deep_obj).await;
    assert_eq!(d.status, StatusCode::OK);
    still_serving(proxy.addr, "after-deep").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_is_protected_only_where_a_route_lists_it() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let put = |path: &'static str| send(proxy.addr, Method::PUT, path, &[], "{\"x\":1}");
    assert_eq!(put("/orders/5/notes").await.status, StatusCode::CREATED);
    assert!(put("/orders/5/notes").await.replayed());
    // Another id in the same pattern is another request.
    assert!(!put("/orders/6/notes").await.replayed());
    assert_eq!(upstream.executed(), 2);
    // PUT on a path no route lists is passed through, every time.
    put("/orders/plain").await;
    put("/orders/plain").await;
    assert_eq!(upstream.executed(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_upstream_is_502_and_releases_the_key() {
    let (dead, _held) = common::refusing_addr();
    let proxy = start_proxy(dead, ROUTES).await;
    let a = post(proxy.addr, "/orders", &[("idempotency-key", "k")], "{}").await;
    assert_problem(&a, StatusCode::BAD_GATEWAY, "upstream-unreachable");
    assert!(!String::from_utf8_lossy(&a.body).contains(&dead.port().to_string()));
    // Never sent, so released: the retry is tried again (another 502), not held (409).
    let key_state = post(proxy.addr, "/orders", &[("idempotency-key", "k")], "{}").await;
    assert_problem(&key_state, StatusCode::BAD_GATEWAY, "upstream-unreachable");
    let pass = send(proxy.addr, Method::GET, "/anything", &[], "").await;
    assert_problem(&pass, StatusCode::BAD_GATEWAY, "upstream-unreachable");
}

/// A client that stops sending a protected request's body gets a 408 problem once the
/// body read timeout passes without a byte, nothing reaches the upstream, the key was
/// never claimed, and the proxy keeps serving. (Which timeout does not matter to the
/// result: only that the proxy gives up at all; the hang guard is far beyond it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_is_408_and_nothing_executes() {
    let upstream = start_upstream().await;
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{}\n{ROUTES}",
        upstream.addr
    );
    let proxy = common::start_proxy_tuned(&text, None, |p| {
        p.with_body_read_timeout(std::time::Duration::from_millis(300))
    })
    .await;
    let answer = common::raw_exchange(
        proxy.addr,
        b"POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: stalled\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"half\":",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("urn:idemgate:problem:body-timeout"),
        "{answer}"
    );
    assert_eq!(upstream.executed(), 0);
    // The key is free: the same key with a whole body executes.
    let a = post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "stalled")],
        "{}",
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert!(!a.replayed());
    still_serving(proxy.addr, "after-408").await;
}

/// A client that sends part of a request head and then nothing (slowloris) is disconnected
/// without an answer once the head timeout passes (30 s by default, nginx's
/// `client_header_timeout`; checked below, then shortened to 1 s so the test does not wait
/// 30 s for the same close); meanwhile other connections are served, and the stalled
/// request never reaches the upstream. The connection's watchdog (`src/server/watchdog.rs`)
/// bounds a head begun after a kept-alive answer by the head timeout alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_head_is_closed_without_an_answer_after_the_head_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = start_upstream().await;
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{}\n{ROUTES}",
        upstream.addr
    );
    let proxy = common::start_proxy_tuned(&text, None, |p| {
        assert_eq!(p.idle_timeout(), std::time::Duration::from_secs(30));
        p.with_idle_timeout(std::time::Duration::from_secs(1))
    })
    .await;
    let mut stalled = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    // A first request on the connection, then a second head that stops halfway: the
    // timer of a kept-alive connection is the one re-armed lazily.
    stalled
        .write_all(b"POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: first\r\nContent-Length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stalled.read_exact(&mut head).await.unwrap();
    assert_eq!(&head[..9], b"HTTP/1.1 ");
    let mut rest = [0u8; 4096];
    let _ = stalled.read(&mut rest).await.unwrap();
    stalled
        .write_all(b"POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: stalled\r\n")
        .await
        .unwrap();

    let other = post(proxy.addr, "/orders", &[("idempotency-key", "other")], "{}").await;
    assert_eq!(other.status, StatusCode::CREATED, "{other:?}");
    assert!(!other.replayed());

    let mut answer = Vec::new();
    let ended = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        stalled.read_to_end(&mut answer),
    )
    .await
    .expect("hang guard: the stalled connection was never closed");
    // hyper ends a connection whose head timed out with a FIN and no answer (nginx logs a
    // 408 and does the same): the read sees a clean end, not a reset, and no bytes.
    let read = ended.expect("the stalled connection ends cleanly, not with a reset");
    assert_eq!(read, 0, "{:?}", String::from_utf8_lossy(&answer));
    assert_eq!(upstream.executed_for("stalled"), 0);
    assert_eq!(upstream.executed_for("first"), 1);
    still_serving(proxy.addr, "after-stall").await;
}

/// RFC 9112 §3.2: an HTTP/1.1 request with two `Host` fields, none, or one that is not a
/// host, is a 400. Routing by one `Host` while the upstream reads the other would let a
/// request past a route scoped to a host. Requests with a length and chunked ones alike
/// are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_host_fields_none_or_a_malformed_one_are_400_and_nothing_executes() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        r#"
routes:
  - name: pay
    match: { methods: [POST], path: /orders, host: pay.example }
    key: { header: Idempotency-Key, required: true }
"#,
    )
    .await;
    let plain = "content-length: 2\r\nconnection: close\r\n\r\n{}";
    let chunked = "transfer-encoding: chunked\r\nconnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
    for (hosts, framing) in [
        ("host: other.example\r\nhost: pay.example\r\n", plain),
        ("host: other.example\r\nhost: pay.example\r\n", chunked),
        ("host: pay.example\r\nhost: other.example\r\n", plain),
        ("", plain),
        ("", chunked),
        // One field, but not a host: routes would read it differently from the upstream.
        ("host: pay.example, other.example\r\n", plain),
        ("host: user@pay.example\r\n", chunked),
    ] {
        let request = format!("POST /orders HTTP/1.1\r\n{hosts}{framing}");
        let answer = common::raw_exchange(proxy.addr, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{request:?}: {answer}");
        assert!(
            answer.contains("urn:idemgate:problem:bad-request"),
            "{answer}"
        );
    }
    assert_eq!(upstream.executed(), 0);
    // One Host on the scoped route, with or without a fully qualified name's trailing dot:
    // the key rule applies (here: the key is missing).
    for host in ["pay.example", "pay.example.", "PAY.example.:80"] {
        let one = format!("POST /orders HTTP/1.1\r\nhost: {host}\r\n{plain}");
        let answer = common::raw_exchange(proxy.addr, one.as_bytes()).await;
        assert!(
            answer.contains("urn:idemgate:problem:key-invalid"),
            "{host}: {answer}"
        );
    }
}

/// A transfer coding this proxy does not decode (RFC 9112 §6.1) is a 501: forwarding the
/// body de-chunked but still gzip-coded, as if it were plain, would hand the upstream (and
/// a fingerprint) different content from what the client sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_coding_other_than_chunked_is_501_and_nothing_executes() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    for coding in ["gzip, chunked", "deflate,chunked", "chunked, chunked"] {
        let request = format!(
            "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: coded\r\n\
             transfer-encoding: {coding}\r\nconnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        );
        let answer = common::raw_exchange(proxy.addr, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 501"), "{coding}: {answer}");
        assert!(
            answer.contains("urn:idemgate:problem:not-implemented"),
            "{answer}"
        );
    }
    assert_eq!(upstream.executed(), 0);
    still_serving(proxy.addr, "after-501").await;
}

/// A transfer coding list that does not end in `chunked` (`gzip`, `chunked, gzip`) leaves
/// the body without a length (RFC 9112 §6.3): hyper refuses the request itself with a
/// bare 400, no problem body, and closes the connection. Nothing executes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_coding_list_not_ending_in_chunked_is_a_bare_400_and_nothing_executes() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    for coding in ["gzip", "chunked, gzip"] {
        let request = format!(
            "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: coded\r\n\
             transfer-encoding: {coding}\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        );
        // Read to the end: the connection is closed although the request did not ask so.
        let answer = common::raw_exchange(proxy.addr, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{coding}: {answer}");
        assert_eq!(common::content_length_of(&answer), 0, "{coding}: {answer}");
        assert!(answer.ends_with("\r\n\r\n"), "{coding}: {answer}");
    }
    assert_eq!(upstream.executed(), 0);
    still_serving(proxy.addr, "after-400").await;
}

/// `Expect: 100-continue` with a declared length over `max_body`: the 413 comes at once,
/// never preceded by `100 Continue`, so the client does not send a body only to have it
/// refused. The test reads before it sends any body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_length_over_max_body_gets_413_without_100_continue() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: expect-big\r\n\
         content-type: application/json\r\nexpect: 100-continue\r\ncontent-length: {}\r\n\r\n",
        70 * 1024
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // The first answer head, byte by byte (the 10 s bound is a hang guard only).
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while !answer.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).await.unwrap();
            answer.push(byte[0]);
        }
    })
    .await
    .expect("hang guard: no answer before the body");
    let head = String::from_utf8_lossy(&answer).into_owned();
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    let mut body = vec![0u8; common::content_length_of(&head)];
    stream.read_exact(&mut body).await.unwrap();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], "urn:idemgate:problem:payload-too-large");
    assert_eq!(upstream.executed(), 0);
}

/// A protected request whose chunked body is badly framed (a chunk size that is not hex)
/// gets `400 body-unreadable` and a closed connection, nothing reaches the upstream, the
/// key stays free, and the proxy keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_badly_framed_chunked_body_is_400_body_unreadable_and_nothing_executes() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let answer = common::raw_exchange(
        proxy.addr,
        b"POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: framed\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\nzz\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("urn:idemgate:problem:body-unreadable"),
        "{answer}"
    );
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    assert_eq!(upstream.executed(), 0);
    let a = post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "framed")],
        "{}",
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert!(!a.replayed());
    still_serving(proxy.addr, "after-body-unreadable").await;
}

/// With `required: false` a `fields` route lets a body that is not JSON through
/// unprotected, as it does one without the fields: the route asked for no refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_json_passes_a_fields_route_that_does_not_require_them() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    for body in ["not json", "not json", "{}"] {
        let a = post(proxy.addr, "/orders/optional-callback", &[], body).await;
        assert_eq!(a.status, StatusCode::CREATED, "{body}");
        assert!(!a.replayed());
    }
    assert_eq!(upstream.executed(), 3);
}

/// A timestamp beyond any clock (the smallest 128-bit integer, or a number whose float
/// value only a saturating cast can hold) is stale like any other: a `400 stale-request`,
/// nothing executed, the proxy serving on. Reading one must not overflow the arithmetic of
/// the freshness window, which would end the connection without an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timestamp_past_any_clock_is_400_stale_request_and_nothing_executes() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let extremes = [
        "-170141183460469231731687303715884105728",
        "-99999999999999999999999999999999999999999999",
        "-1e300",
        "170141183460469231731687303715884105727",
        "1e300",
    ];
    for (i, ts) in extremes.iter().enumerate() {
        let key = format!("extreme-{i}");
        let a = post(
            proxy.addr,
            "/orders/fresh",
            &[("idempotency-key", &key), ("x-timestamp", ts)],
            "{}",
        )
        .await;
        assert_problem(&a, StatusCode::BAD_REQUEST, "stale-request");
        let body = format!(r#"{{"ts": {ts}}}"#);
        let a = post(proxy.addr, "/orders/fresh-body", &[], &body).await;
        assert_problem(&a, StatusCode::BAD_REQUEST, "stale-request");
    }
    assert_eq!(upstream.executed(), 0);
    still_serving(proxy.addr, "after-extreme-timestamps").await;
}
