//! An HTTP/2 upstream that refuses a stream (`REFUSED_STREAM`, or a GOAWAY whose last
//! stream id is below it) did not process it (RFC 9113 §8.7): a request whose body is
//! known whole goes out once more, on another connection, and is answered; a streamed
//! upload, which may have been read in part, is not, and neither is a stream reset for any
//! other reason (the upstream may have run it).

#[path = "common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::{go_away_below_every_stream, post, start_proxy};
use http::StatusCode;
use tokio::net::{TcpListener, TcpStream};

const ROUTES: &str = r#"
connections: { upstream_protocol: http2, upstream_idle_timeout: 1h }
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
  - name: plain
    match: { path: "/plain/*" }
    idempotency: off
"#;

/// What the upstream does with the first stream it is sent; every later one it reads
/// whole and answers 201.
#[derive(Clone, Copy)]
enum First {
    /// Resets it with `REFUSED_STREAM` at once.
    Refuse,
    /// Reads it whole (runs it), then resets it with this code.
    RunThenReset(h2::Reason),
    /// Answers its HEADERS with GOAWAY(last stream id 0, NO_ERROR) and closes the
    /// connection (raw frames: h2's own server never names a last id below a stream it
    /// received).
    GoAwayBelow,
}

/// An HTTP/2 upstream that records each stream's connection (numbered from 0) as its head
/// arrives, and the body of each request it ran.
struct Upstream {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<usize>>>,
    ran: Arc<Mutex<Vec<Bytes>>>,
}

impl Upstream {
    async fn start(first: First) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads: Arc<Mutex<Vec<usize>>> = Arc::default();
        let ran: Arc<Mutex<Vec<Bytes>>> = Arc::default();
        let firsts = Arc::new(AtomicBool::new(true));
        let (h, r) = (Arc::clone(&heads), Arc::clone(&ran));
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok((stream, _)) = listener.accept().await {
                let (heads, ran, firsts) = (Arc::clone(&h), Arc::clone(&r), Arc::clone(&firsts));
                let conn = n;
                n += 1;
                tokio::spawn(async move {
                    if conn == 0 && matches!(first, First::GoAwayBelow) {
                        firsts.store(false, Ordering::SeqCst);
                        return go_away_below_every_stream(stream, || {
                            heads.lock().unwrap().push(conn)
                        })
                        .await;
                    }
                    serve(stream, conn, first, heads, ran, firsts).await;
                });
            }
        });
        Self { addr, heads, ran }
    }

    fn heads(&self) -> Vec<usize> {
        self.heads.lock().unwrap().clone()
    }

    fn ran(&self) -> Vec<Bytes> {
        self.ran.lock().unwrap().clone()
    }
}

async fn serve(
    stream: TcpStream,
    conn: usize,
    first: First,
    heads: Arc<Mutex<Vec<usize>>>,
    ran: Arc<Mutex<Vec<Bytes>>>,
    firsts: Arc<AtomicBool>,
) {
    let Ok(mut h2) = h2::server::handshake(stream).await else {
        return;
    };
    while let Some(Ok((request, mut respond))) = h2.accept().await {
        heads.lock().unwrap().push(conn);
        let is_first = firsts.swap(false, Ordering::SeqCst);
        if is_first && matches!(first, First::Refuse) {
            respond.send_reset(h2::Reason::REFUSED_STREAM);
            continue;
        }
        let ran = Arc::clone(&ran);
        tokio::spawn(async move {
            let mut body = request.into_body();
            let mut whole = Vec::new();
            while let Some(chunk) = body.data().await {
                let Ok(chunk) = chunk else { return };
                let _ = body.flow_control().release_capacity(chunk.len());
                whole.extend_from_slice(&chunk);
            }
            ran.lock().unwrap().push(whole.into());
            match first {
                First::RunThenReset(reason) if is_first => respond.send_reset(reason),
                _ => {
                    let answer = http::Response::builder().status(201).body(()).unwrap();
                    let _ = respond.send_response(answer, true);
                }
            }
        });
    }
}

const ORDER: &str = r#"{"sku":"a-1","quantity":2}"#;

/// The first stream is refused: the protected POST goes out again, whole, on a new
/// connection, and is answered 201, run once (before, a 502 `upstream-unreachable`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_is_sent_again_on_a_new_connection_and_answered() {
    let upstream = Upstream::start(First::Refuse).await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let a = post(proxy.addr, "/orders", &[("idempotency-key", "r")], ORDER).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    assert_eq!(
        upstream.heads(),
        [0, 1],
        "sent again, on another connection"
    );
    assert_eq!(upstream.ran(), [Bytes::from(ORDER)]);
    let again = post(proxy.addr, "/orders", &[("idempotency-key", "r")], ORDER).await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(upstream.ran().len(), 1);
}

/// The server answers the request's HEADERS with GOAWAY(last stream id 0), as one shutting
/// down during a deploy does: the request goes out again on a new connection and is
/// answered (before, a 502 `upstream-unreachable`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_above_a_goaway_is_sent_again_on_a_new_connection() {
    let upstream = Upstream::start(First::GoAwayBelow).await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let a = post(proxy.addr, "/orders", &[("idempotency-key", "g")], ORDER).await;
    assert_eq!(a.status, StatusCode::CREATED, "{a:?}");
    assert_eq!(upstream.heads(), [0, 1]);
    assert_eq!(upstream.ran(), [Bytes::from(ORDER)]);
}

/// A streamed (chunked, unprotected) upload may have been read in part when its stream is
/// refused: it is not sent again, and its client gets the 502 of a request never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_streamed_upload_is_not_sent_again() {
    let upstream = Upstream::start(First::Refuse).await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let answer = common::raw_exchange(
        proxy.addr,
        b"POST /plain/up HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\
          connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    assert!(answer.contains("upstream-unreachable"), "{answer}");
    assert_eq!(upstream.heads(), [0], "sent once");
    assert!(upstream.ran().is_empty());
}

/// A stream the upstream reset with INTERNAL_ERROR after reading it may have run: it is
/// never sent again, and the key is held as outcome unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_for_another_reason_is_never_sent_again() {
    let upstream = Upstream::start(First::RunThenReset(h2::Reason::INTERNAL_ERROR)).await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let a = post(proxy.addr, "/orders", &[("idempotency-key", "i")], ORDER).await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{a:?}");
    assert_eq!(a.problem(), "urn:idemgate:problem:upstream-failed");
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "i")], ORDER).await;
    assert_eq!(retry.problem(), "urn:idemgate:problem:outcome-unknown");
    assert_eq!(upstream.heads(), [0]);
    assert_eq!(upstream.ran().len(), 1);
}
