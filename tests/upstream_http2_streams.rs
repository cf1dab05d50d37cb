//! HTTP/2 upstream streams against hand-made servers (h2's own server API, or raw frames):
//! a GOAWAY with an error after the server read a request holds its key, one below the
//! request's stream releases it, and a request waiting for a stream under the server's
//! `SETTINGS_MAX_CONCURRENT_STREAMS` at the connection cap is one that was never sent, and
//! an answer head as large as HTTP/1.1 takes passes without ending the connection.

#[path = "common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::{go_away_below_every_stream, post, send, start_proxy};
use http::{Method, StatusCode};
use tokio::net::TcpListener;

/// An HTTP/2 upstream allowing `streams` concurrent streams: records each request's path as
/// its head arrives, answers `/plain/hold` once `release` has a permit and anything else
/// at once (201).
struct Limited {
    addr: SocketAddr,
    paths: Arc<Mutex<Vec<String>>>,
    arrived: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Semaphore>,
}

impl Limited {
    async fn start(streams: u32) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let paths: Arc<Mutex<Vec<String>>> = Arc::default();
        let arrived = Arc::new(tokio::sync::Notify::new());
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let (seen, told, gate) = (
            Arc::clone(&paths),
            Arc::clone(&arrived),
            Arc::clone(&release),
        );
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (seen, told, gate) = (Arc::clone(&seen), Arc::clone(&told), Arc::clone(&gate));
                tokio::spawn(async move {
                    let mut conn = h2::server::Builder::new()
                        .max_concurrent_streams(streams)
                        .handshake::<_, bytes::Bytes>(stream)
                        .await
                        .unwrap();
                    while let Some(Ok((request, mut respond))) = conn.accept().await {
                        let path = request.uri().path().to_owned();
                        seen.lock().unwrap().push(path.clone());
                        told.notify_waiters();
                        let gate = Arc::clone(&gate);
                        tokio::spawn(async move {
                            if path == "/plain/hold" {
                                gate.acquire().await.unwrap().forget();
                            }
                            let answer = http::Response::builder().status(201).body(()).unwrap();
                            let _ = respond.send_response(answer, true);
                        });
                    }
                });
            }
        });
        Self {
            addr,
            paths,
            arrived,
            release,
        }
    }

    fn paths(&self) -> Vec<String> {
        self.paths.lock().unwrap().clone()
    }

    /// Waits until `n` requests arrived (hang guard: 30 s).
    async fn arrived(&self, n: usize) {
        tokio::time::timeout(std::time::Duration::from_secs(30), async {
            loop {
                let changed = self.arrived.notified();
                if self.paths.lock().unwrap().len() >= n {
                    return;
                }
                changed.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("hang guard: {n} requests never arrived"));
    }
}

/// One HTTP/2 connection to the upstream, on which the server allows one stream at a time;
/// `/plain/hold` waits for its answer as long as the test needs.
const ONE_STREAM: &str = r#"
connections: { upstream_protocol: http2, max_upstream: 1, upstream_idle_timeout: 1h }
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
    upstream_timeout: 300ms
  - name: hold
    match: { path: /plain/hold }
    idempotency: off
    upstream_timeout: 1h
  - name: plain
    match: { path: "/plain/*" }
    idempotency: off
    upstream_timeout: 300ms
"#;

/// The connection is at the cap and its one stream is busy: a pass-through request whose
/// `upstream_timeout` passes while it waits for a stream is answered 502 (never sent) and must never
/// reach the upstream afterwards (its client was told it failed, and may have retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_given_up_while_waiting_for_a_stream_is_never_sent_later() {
    let upstream = Limited::start(1).await;
    let proxy = start_proxy(upstream.addr, ONE_STREAM).await;
    let addr = proxy.addr;
    let busy = tokio::spawn(async move { send(addr, Method::POST, "/plain/hold", &[], "").await });
    upstream.arrived(1).await;
    let late = send(proxy.addr, Method::POST, "/plain/late", &[], "").await;
    // Nothing was sent: the 502 of an upstream that never took it, not the 504 of one that
    // may have it.
    assert_eq!(late.status, StatusCode::BAD_GATEWAY, "{late:?}");
    assert_eq!(late.problem(), "urn:idemgate:problem:upstream-unreachable");
    upstream.release.add_permits(1);
    assert_eq!(busy.await.unwrap().status, StatusCode::CREATED);
    // On the same connection, after the stream freed: were `/plain/late` still to go out,
    // it would reach the server before this one.
    let after = send(proxy.addr, Method::POST, "/plain/after", &[], "").await;
    assert_eq!(after.status, StatusCode::CREATED);
    assert_eq!(upstream.paths(), ["/plain/hold", "/plain/after"]);
}

/// As over HTTP/1.1 (`connection_caps.rs`), waiting for room on the upstream is waiting
/// before anything was sent: a protected request whose `upstream_timeout` passes then is a
/// 502 that releases its key, and its retry executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protected_request_that_timed_out_waiting_for_a_stream_was_not_sent() {
    let upstream = Limited::start(1).await;
    let proxy = start_proxy(upstream.addr, ONE_STREAM).await;
    let addr = proxy.addr;
    let busy = tokio::spawn(async move { send(addr, Method::POST, "/plain/hold", &[], "").await });
    upstream.arrived(1).await;
    let waited = post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "queued")],
        "{}",
    )
    .await;
    assert_eq!(waited.status, StatusCode::BAD_GATEWAY, "{waited:?}");
    assert_eq!(
        waited.problem(),
        "urn:idemgate:problem:upstream-unreachable"
    );
    upstream.release.add_permits(1);
    assert_eq!(busy.await.unwrap().status, StatusCode::CREATED);
    let retry = post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "queued")],
        "{}",
    )
    .await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert!(!retry.replayed());
    assert_eq!(upstream.paths(), ["/plain/hold", "/orders"]);
}

const ORDERS: &str = r#"
connections: { upstream_protocol: http2, upstream_idle_timeout: 1h }
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
"#;

/// The server reads the request, then ends the connection with GOAWAY(INTERNAL_ERROR)
/// whose last stream id covers it, and closes: it may have run the request, so the key is
/// held as outcome unknown (RFC 9113 §6.8: only streams above the last id were not
/// processed), and its retry never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goaway_with_an_error_covering_the_stream_holds_the_key() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let executed = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&executed);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let mut conn = h2::server::handshake(stream).await.unwrap();
                let Some(Ok(held)) = conn.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                // GOAWAY(last stream id = this one, INTERNAL_ERROR), then the socket closes;
                // the stream is neither answered nor reset (`held` lives until then).
                conn.abrupt_shutdown(h2::Reason::INTERNAL_ERROR);
                let _ = std::future::poll_fn(|cx| conn.poll_closed(cx)).await;
                drop(held);
            });
        }
    });
    let proxy = start_proxy(addr, ORDERS).await;
    let broken = post(proxy.addr, "/orders", &[("idempotency-key", "g")], "{}").await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY, "{broken:?}");
    assert_eq!(broken.problem(), "urn:idemgate:problem:upstream-failed");
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "g")], "{}").await;
    assert_eq!(retry.problem(), "urn:idemgate:problem:outcome-unknown");
    assert_eq!(executed.load(Ordering::SeqCst), 1);
}

/// The server answers every request's HEADERS with GOAWAY(last stream id 0): by its own
/// word it did not process the stream, so the proxy sends it once more on a new connection
/// (`upstream_http2_refused.rs`), and when that is refused too the key is released and the
/// client's retry is sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goaway_below_the_stream_releases_the_key() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&heads);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let count = Arc::clone(&count);
            tokio::spawn(go_away_below_every_stream(stream, move || {
                count.fetch_add(1, Ordering::SeqCst);
            }));
        }
    });
    let proxy = start_proxy(addr, ORDERS).await;
    for n in 1..=2 {
        let a = post(proxy.addr, "/orders", &[("idempotency-key", "above")], "{}").await;
        assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{a:?}");
        assert_eq!(a.problem(), "urn:idemgate:problem:upstream-unreachable");
        // Two heads per request: the first and the proxy's one resend, never more.
        assert_eq!(
            heads.load(Ordering::SeqCst),
            2 * n,
            "released, so sent again"
        );
    }
}

/// An upstream speaking HTTP/1.1 and h2c (hyper's auto server): `/orders/big?kb=N` answers
/// 201 with about N KiB of `Set-Cookie` fields (ASP.NET's chunked auth cookies, a long
/// CSP), `/orders/held` waits for `release`; both count what they execute.
async fn big_heads() -> (
    SocketAddr,
    Arc<AtomicUsize>,
    Arc<tokio::sync::Notify>,
    Arc<tokio::sync::Semaphore>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let executed = Arc::new(AtomicUsize::new(0));
    let arrived = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let state = (
        Arc::clone(&executed),
        Arc::clone(&arrived),
        Arc::clone(&release),
    );
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let state = state.clone();
            let service = hyper::service::service_fn(move |request: http::Request<_>| {
                let (count, told, gate) = state.clone();
                async move {
                    count.fetch_add(1, Ordering::SeqCst);
                    let mut answer = http::Response::builder().status(201);
                    if request.uri().path() == "/orders/held" {
                        told.notify_one();
                        gate.acquire().await.unwrap().forget();
                    }
                    let kb: usize = request
                        .uri()
                        .query()
                        .and_then(|q| q.strip_prefix("kb="))
                        .map_or(0, |n| n.parse().unwrap());
                    for i in 0..kb {
                        answer = answer.header("set-cookie", format!("c{i}={:x<1000}", i));
                    }
                    Ok::<_, std::convert::Infallible>(answer.body(String::new()).unwrap())
                }
            });
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, executed, arrived, release)
}

const BIG: &str = r#"
routes:
  - name: orders
    match: { methods: [POST], path: "/orders/*" }
    key: { header: Idempotency-Key, required: true }
"#;

/// An answer head of 20 KiB (the upstream ran the request) reaches the client over an
/// HTTP/1.1 upstream connection, and must over an HTTP/2 one too: hyper's HTTP/2 client
/// takes 16 KiB by default, and past it resets the stream, so the answer was lost and the
/// key held as outcome unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_head_of_20_kib_passes_over_http2_as_over_http11() {
    let (upstream, executed, _, _) = big_heads().await;
    for (n, protocol) in ["http1", "http2"].into_iter().enumerate() {
        let config = format!("connections: {{ upstream_protocol: {protocol} }}\n{BIG}");
        let proxy = start_proxy(upstream, &config).await;
        let key = format!("big-{protocol}");
        let a = post(
            proxy.addr,
            "/orders/big?kb=20",
            &[("idempotency-key", &key)],
            "{}",
        )
        .await;
        assert_eq!(a.status, StatusCode::CREATED, "{protocol}: {a:?}");
        assert_eq!(
            a.headers.get_all("set-cookie").iter().count(),
            20,
            "{protocol}"
        );
        assert_eq!(executed.load(Ordering::SeqCst), n + 1);
    }
}

/// A 40 KiB answer head on one stream must not end the HTTP/2 connection under the other
/// streams: h2 answers a header block past its limit that spans CONTINUATION frames with
/// GOAWAY(COMPRESSION_ERROR), and every request then open on the connection (another
/// caller's, which the upstream ran) failed with its outcome unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_head_does_not_fail_the_other_streams_of_its_connection() {
    let (upstream, executed, arrived, release) = big_heads().await;
    let config =
        format!("connections: {{ upstream_protocol: http2, upstream_idle_timeout: 1h }}\n{BIG}");
    let proxy = start_proxy(upstream, &config).await;
    let addr = proxy.addr;
    let innocent = tokio::spawn(async move {
        post(
            addr,
            "/orders/held",
            &[("idempotency-key", "innocent")],
            "{}",
        )
        .await
    });
    tokio::time::timeout(std::time::Duration::from_secs(30), arrived.notified())
        .await
        .expect("hang guard: the held request never arrived");
    let big = post(
        proxy.addr,
        "/orders/big?kb=40",
        &[("idempotency-key", "big")],
        "{}",
    )
    .await;
    release.add_permits(1);
    let innocent = innocent.await.unwrap();
    assert_eq!(innocent.status, StatusCode::CREATED, "{innocent:?}");
    assert_eq!(big.status, StatusCode::CREATED, "{big:?}");
    assert_eq!(executed.load(Ordering::SeqCst), 2);
}
