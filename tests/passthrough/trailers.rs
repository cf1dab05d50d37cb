//! Answer trailers on the pass-through path: declared in `Trailer` (end-to-end, RFC 9110
//! §6.6.2), they reach an HTTP/1.1 client that asked for them (`TE: trailers`) and every
//! HTTP/2 client, less the fields only a header section may carry, from each upstream
//! client; an HTTP/1.1 upstream is asked for them when the client asked.

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioExecutor;

use crate::common::{self, start_proxy, start_upstream};
use crate::{raw_answering, ROUTES};

/// The ways the proxy speaks to its upstream: HTTP/1.1 through hyper's client or the
/// hand-written one, and HTTP/2 (each test names its own, whatever the run asks for).
const UPSTREAMS: [&str; 3] = [
    "connections: { upstream_protocol: http1, upstream_http1: hyper }",
    "connections: { upstream_protocol: http1, upstream_http1: idemgate }",
    "connections: { upstream_protocol: http2 }",
];

/// A GET of `path` as raw HTTP/1.1, `TE: trailers` with `te`: the whole answer.
async fn http1_get(proxy: std::net::SocketAddr, path: &str, te: bool) -> String {
    let te = if te { "te: trailers\r\n" } else { "" };
    let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\n{te}connection: close\r\n\r\n");
    common::raw_exchange(proxy, request.as_bytes()).await
}

/// A GET of `path` over HTTP/2 (with `TE: trailers`, as gRPC clients send it): the body
/// and the trailers.
async fn http2_get(proxy: std::net::SocketAddr, path: &str) -> (Bytes, http::HeaderMap) {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let request = Request::get(format!("http://{proxy}{path}"))
        .header("te", "trailers")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    (collected.to_bytes(), trailers)
}

/// An upstream that sends its declared trailers whatever the request said (as Go's
/// net/http does): an HTTP/1.1 client that asked gets them, the `Trailer` field naming
/// only those that go on; one that did not ask gets the body alone. Before, `Trailer` was
/// stripped as hop-by-hop and hyper's server sent no trailer field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_answer_trailers_reach_an_http1_client_that_asked_for_them() {
    let upstream = raw_answering(Some(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\
          trailer: x-checksum, content-length, grpc-status, set-cookie\r\n\r\n\
          5\r\nhello\r\n0\r\nx-checksum: 1\r\ncontent-length: 5\r\ngrpc-status: 0\r\n\
          set-cookie: a=b\r\n\r\n",
    ))
    .await;
    for connections in &UPSTREAMS[..2] {
        let proxy = start_proxy(upstream, &format!("{connections}\n{ROUTES}")).await;
        let answer = http1_get(proxy.addr, "/upload", true).await;
        let lower = answer.to_ascii_lowercase();
        assert!(lower.starts_with("http/1.1 200"), "{connections}: {answer}");
        assert!(
            lower.contains("\r\ntrailer: x-checksum, grpc-status\r\n"),
            "{connections}: {answer}"
        );
        assert!(
            lower.ends_with("5\r\nhello\r\n0\r\nx-checksum: 1\r\ngrpc-status: 0\r\n\r\n"),
            "{connections}: {answer}"
        );
        let answer = http1_get(proxy.addr, "/upload", false).await;
        assert!(
            answer.ends_with("5\r\nhello\r\n0\r\n\r\n"),
            "{connections}: {answer}"
        );
    }
}

/// A hyper upstream sends HTTP/1.1 trailers only to a request with `TE: trailers`: the
/// proxy asks for them when its client did, so they reach an HTTP/1.1 client that asked
/// and an HTTP/2 one, from every kind of upstream. Before, the client's `TE` was dropped
/// as hop-by-hop and an HTTP/1.1 upstream sent none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hyper_upstream_is_asked_for_trailers_the_client_asked_for() {
    let upstream = start_upstream().await;
    for connections in UPSTREAMS {
        let proxy = start_proxy(upstream.addr, &format!("{connections}\n{ROUTES}")).await;
        let answer = http1_get(proxy.addr, "/trailers", true).await;
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("\r\ntrailer: x-checksum, grpc-status\r\n"),
            "{connections}: {answer}"
        );
        assert!(
            answer.ends_with("5\r\nhello\r\n0\r\nx-checksum: 1\r\ngrpc-status: 0\r\n\r\n"),
            "{connections}: {answer}"
        );
        let (body, trailers) = http2_get(proxy.addr, "/trailers").await;
        assert_eq!(body, "hello", "{connections}");
        let names: Vec<_> = trailers.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["x-checksum", "grpc-status"], "{connections}");
    }
}

/// Trailers an HTTP/2 upstream sends without declaring them (gRPC servers do) reach
/// HTTP/2 clients, but not HTTP/1.1 ones: their head went out before the trailers came,
/// and hyper sends an HTTP/1.1 client only the trailer fields its head declared. The
/// body arrives whole all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeclared_trailers_of_an_http2_upstream_reach_only_http2_clients() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &format!("{}\n{ROUTES}", UPSTREAMS[2])).await;
    let answer = http1_get(proxy.addr, "/trailers?undeclared", true).await;
    assert!(answer.ends_with("5\r\nhello\r\n0\r\n\r\n"), "{answer}");
    assert!(
        !answer.to_ascii_lowercase().contains("trailer:"),
        "{answer}"
    );
    let (body, trailers) = http2_get(proxy.addr, "/trailers?undeclared").await;
    assert_eq!(body, "hello");
    let names: Vec<_> = trailers.keys().map(|n| n.as_str()).collect();
    assert_eq!(names, ["x-checksum", "grpc-status"]);
}

/// A protected answer over `max_answer` streams on as a pass-through one does, and keeps
/// its declared trailers for an HTTP/1.1 client alike (a stored one declares those it
/// kept: `tests/grpc_trailers.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protected_answer_streamed_over_max_answer_keeps_its_declared_trailers() {
    let upstream = raw_answering(Some(
        b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n\
          5\r\nhello\r\n0\r\nx-checksum: 1\r\n\r\n",
    ))
    .await;
    let routes = "routes:\n  - name: streamed\n    match: { methods: [POST], path: /big }\n    \
                  key: { header: Idempotency-Key }\n    max_answer: 3B\n";
    // A raw HTTP/1.1 upstream: through either HTTP/1.1 client.
    for connections in &UPSTREAMS[..2] {
        let proxy = start_proxy(upstream, &format!("{connections}\n{routes}")).await;
        let answer = common::raw_exchange(
            proxy.addr,
            b"POST /big HTTP/1.1\r\nhost: x\r\nidempotency-key: big\r\nte: trailers\r\n\
              content-length: 2\r\nconnection: close\r\n\r\n{}",
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 201"),
            "{connections}: {answer}"
        );
        assert!(
            answer.ends_with("\r\n0\r\nx-checksum: 1\r\n\r\n"),
            "{connections}: {answer}"
        );
    }
}
