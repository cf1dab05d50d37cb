//! HTTP/2 upstream streams against hand-made servers (h2's own server API, or raw frames):
//! a GOAWAY with an error after the server read a request holds its key, one below the
//! request's stream releases it.

#[path = "common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{post, start_proxy};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn problem_type(a: &common::Answer) -> String {
    a.json()["type"].as_str().unwrap_or_default().to_owned()
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
    assert_eq!(
        problem_type(&broken),
        "urn:idemgate:problem:upstream-failed"
    );
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "g")], "{}").await;
    assert_eq!(problem_type(&retry), "urn:idemgate:problem:outcome-unknown");
    assert_eq!(executed.load(Ordering::SeqCst), 1);
}

/// The server answers a request's HEADERS with GOAWAY(last stream id 0): by its own word it
/// did not process the stream, so the key is released and the retry is sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goaway_below_the_stream_releases_the_key() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&heads);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                // An empty SETTINGS frame, as a server's preface.
                stream
                    .write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
                    .await
                    .unwrap();
                let mut preface = [0; 24];
                stream.read_exact(&mut preface).await.unwrap();
                loop {
                    let mut head = [0; 9];
                    if stream.read_exact(&mut head).await.is_err() {
                        return;
                    }
                    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                    let mut payload = vec![0; len];
                    stream.read_exact(&mut payload).await.unwrap();
                    if head[3] == 0x1 {
                        count.fetch_add(1, Ordering::SeqCst);
                        // GOAWAY: last stream id 0, NO_ERROR.
                        let goaway = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
                        stream.write_all(&goaway).await.unwrap();
                        let _ = stream.shutdown().await;
                        let _ = stream.read_to_end(&mut Vec::new()).await;
                        return;
                    }
                }
            });
        }
    });
    let proxy = start_proxy(addr, ORDERS).await;
    for n in 1..=2 {
        let a = post(proxy.addr, "/orders", &[("idempotency-key", "above")], "{}").await;
        assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{a:?}");
        assert_eq!(
            problem_type(&a),
            "urn:idemgate:problem:upstream-unreachable"
        );
        assert_eq!(heads.load(Ordering::SeqCst), n, "released, so sent again");
    }
}
