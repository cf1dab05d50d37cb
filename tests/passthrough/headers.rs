//! Headers per RFC 9110: hop-by-hop fields stripped and forwarded fields added,
//! `Expect: 100-continue` on both paths, and trailers stripped of the fields that may only
//! be headers.

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioExecutor;

use crate::common::{self, send, start_proxy, start_upstream};
use crate::{raw_answering, raw_exchange, ROUTES};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_are_stripped_and_forwarded_headers_added() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let a = send(
        proxy.addr,
        Method::GET,
        "/echo-headers",
        &[
            ("host", "shop.example:8443"),
            ("connection", "x-drop-me, keep-alive"),
            ("x-drop-me", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "deflate, trailers"),
            ("proxy-authorization", "Basic abc"),
            ("x-forwarded-for", "203.0.113.9"),
            ("x-kept", "yes"),
        ],
        "",
    )
    .await;
    let seen = &a.json()["headers"];
    for gone in [
        "x-drop-me",
        "keep-alive",
        "proxy-authorization",
        "transfer-encoding",
    ] {
        assert!(
            seen.get(gone).is_none(),
            "{gone} must not reach the upstream: {seen}"
        );
    }
    // The client's `TE` is for its hop; the proxy asks for the trailers it can pass on
    // with its own, named in `Connection` as RFC 9110 §10.1.4 requires.
    assert_eq!(seen["te"], serde_json::json!(["trailers"]), "{seen}");
    assert_eq!(seen["connection"], serde_json::json!(["te"]), "{seen}");
    assert_eq!(seen["host"][0], "shop.example:8443", "Host is kept");
    assert_eq!(seen["x-kept"][0], "yes");
    assert_eq!(seen["x-forwarded-for"][0], "203.0.113.9, 127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"][0], "http");
    assert_eq!(seen["x-forwarded-host"][0], "shop.example:8443");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_works_on_both_paths() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let body = b"{\"expect\":true}";
    let head = |path: &str, extra: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n",
            body.len()
        )
    };
    let streamed = raw_exchange(proxy.addr, &head("/upload", ""), body).await;
    assert!(streamed.contains("200 OK"), "{streamed}");
    assert!(streamed.contains(&format!("{} ", body.len())), "{streamed}");
    let protected = raw_exchange(
        proxy.addr,
        &head("/orders", "idempotency-key: cont\r\n"),
        body,
    )
    .await;
    assert!(protected.contains("201 Created"), "{protected}");
    assert_eq!(upstream.executed(), 1);
}

/// A request's trailers go on without the fields only a header section may carry: a second
/// `Host` or a length in the trailers, or a forged client address, would be taken as the
/// request's own by an upstream that merges trailers into its headers. (Trailers go on
/// when the request declares them in `Trailer`, as RFC 9110 §6.6.2 asks of a sender; the
/// forbidden names are declared here too, and dropped all the same.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_trailers_lose_framing_routing_and_forwarding_fields() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let raw = common::raw_exchange(
        proxy.addr,
        b"POST /echo-headers HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\
          trailer: content-length, host, connection, x-forwarded-for, authorization, x-checksum\r\n\r\n\
          3\r\nabc\r\n0\r\ncontent-length: 0\r\nhost: evil.example\r\nconnection: close\r\n\
          x-forwarded-for: 10.9.9.9\r\nauthorization: Bearer forged\r\nx-checksum: 7\r\n\r\n",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    let json: serde_json::Value = serde_json::from_str(&raw[raw.find("\r\n\r\n").unwrap() + 4..])
        .unwrap_or_else(|e| panic!("{e}: {raw}"));
    assert_eq!(json["body_len"], 3);
    assert_eq!(
        json["trailers"],
        serde_json::json!({ "x-checksum": ["7"] }),
        "{raw}"
    );
    assert_eq!(json["headers"]["host"], serde_json::json!(["x"]));
    assert_eq!(
        json["headers"]["trailer"],
        serde_json::json!(["x-checksum"]),
        "{raw}"
    );
}

/// An upstream's answer trailers reach an HTTP/2 client (hyper forwards them there) without
/// the fields only a head may carry: a client merging them into the head would take a
/// length or a cookie from them as the answer's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_trailers_lose_header_only_fields() {
    let upstream = raw_answering(Some(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum, content-length, set-cookie\r\n\r\n\
          5\r\nhello\r\n0\r\nx-checksum: 1\r\ncontent-length: 5\r\nset-cookie: a=b\r\n\r\n",
    ))
    .await;
    let proxy = start_proxy(upstream, ROUTES).await;
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let request = Request::get(format!("http://{}/upload", proxy.addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers");
    assert_eq!(collected.to_bytes(), "hello");
    let names: Vec<_> = trailers.keys().map(|n| n.as_str()).collect();
    assert_eq!(names, ["x-checksum"], "{trailers:?}");
    assert_eq!(trailers["x-checksum"], "1");
}

/// A protected answer keeps its trailers (filtered as a streamed one's): stored, the first
/// caller and its repeats get them after the body; one over `max_answer` streams, trailers
/// included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_answers_keep_their_trailers_stored_or_streamed_over_max_answer() {
    let upstream = raw_answering(Some(
        b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\nconnection: close\r\n\r\n\
          5\r\nhello\r\n0\r\nx-checksum: 1\r\nset-cookie: a=b\r\n\r\n",
    ))
    .await;
    let routes = "routes:\n  - name: stored\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key }\n  - name: streamed\n    match: { methods: [POST], path: /big }\n    key: { header: Idempotency-Key }\n    max_answer: 3B\n";
    let proxy = start_proxy(upstream, routes).await;
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let post = |path: &str, key: &str| {
        Request::post(format!("http://{}{path}", proxy.addr))
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    for replayed in [false, true] {
        let response = client.request(post("/orders", "stored")).await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(
            response.headers().contains_key("idempotent-replayed"),
            replayed
        );
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned();
        assert_eq!(collected.to_bytes(), "hello");
        let trailers = trailers.unwrap_or_else(|| panic!("replayed: {replayed}: no trailers"));
        let names: Vec<_> = trailers.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["x-checksum"], "replayed: {replayed}");
        assert_eq!(trailers["x-checksum"], "1");
    }
    let response = client.request(post("/big", "streamed")).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected
        .trailers()
        .cloned()
        .expect("trailers of a streamed answer");
    assert_eq!(collected.to_bytes(), "hello");
    assert_eq!(trailers["x-checksum"], "1");
}

/// A `Connection` option naming `Host` does not leave the forwarded request without one:
/// an HTTP/1.1 request must have a `Host` (RFC 9112 §3.2), and the upstream must read the
/// host the request was routed by, not fall back to its default one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_option_naming_host_keeps_the_host() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    for connection in ["host", "keep-alive, Host"] {
        let a = send(
            proxy.addr,
            Method::POST,
            "/echo-headers",
            &[("host", "shop.example"), ("connection", connection)],
            "",
        )
        .await;
        assert_eq!(a.status, StatusCode::OK);
        let seen = &a.json()["headers"];
        assert_eq!(
            seen["host"],
            serde_json::json!(["shop.example"]),
            "{connection}: {seen}"
        );
        assert_eq!(
            seen["x-forwarded-host"][0], "shop.example",
            "{connection}: {seen}"
        );
    }
}

/// A client's `Forwarded` (RFC 7239) is not passed on: it says what `X-Forwarded-Host`,
/// `-Proto` and `-For` say, which the proxy sets itself, and upstreams that read it first
/// (Spring's `ForwardedHeaderFilter`) would take a client's word for its address, scheme and
/// host (a password-reset link to another host).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_forwarded_field_does_not_reach_the_upstream() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let a = send(
        proxy.addr,
        Method::GET,
        "/echo-headers",
        &[
            ("host", "shop.example"),
            ("forwarded", "for=203.0.113.1;proto=https;host=evil.example"),
        ],
        "",
    )
    .await;
    let seen = &a.json()["headers"];
    assert!(seen.get("forwarded").is_none(), "{seen}");
    assert_eq!(seen["x-forwarded-host"][0], "shop.example");
}

/// `X-Original-URL` and `X-Rewrite-URL` name another path to upstreams that honour them
/// (IIS's URL Rewrite, ASP.NET and Zend apps behind it, Symfony before 2018): `PUT
/// /echo-headers` with `X-Original-URL: /api/orders` would run `/api/orders` there while
/// the route was chosen by `/echo-headers` (here none: unprotected). The upstream reads the
/// path the request was routed by: the client's fields are not passed on, whatever the
/// method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_rewrite_url_fields_do_not_reach_the_upstream() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    for method in [Method::PUT, Method::POST, Method::GET] {
        let a = send(
            proxy.addr,
            method.clone(),
            "/echo-headers",
            &[
                ("host", "shop.example"),
                ("x-original-url", "/api/orders"),
                ("X-Rewrite-URL", "/api/orders"),
            ],
            "",
        )
        .await;
        let seen = &a.json()["headers"];
        assert!(seen.get("x-original-url").is_none(), "{method}: {seen}");
        assert!(seen.get("x-rewrite-url").is_none(), "{method}: {seen}");
        assert_eq!(seen["x-forwarded-host"][0], "shop.example", "{method}");
    }
}
