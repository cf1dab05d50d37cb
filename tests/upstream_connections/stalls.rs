//! Upstreams that stall mid-body: `upstream_timeout` covers the body of a stored answer
//! (a 504, the key held), and an answer over `max_answer` is cut off after the read timeout
//! and never run again.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::common::{self, post, start_proxy};
use crate::{read_request, ROUTES};

/// `upstream_timeout` bounds the whole answer a protected request's client waits for, body
/// included: an upstream that sends its head and then stalls mid-body gets the client a
/// 504, and `background_timeout` bounds the owner's wait after it; the key is held, since
/// the request went out.
#[tokio::test]
async fn an_upstream_stalling_mid_body_times_out_and_holds_the_key() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let executed = Arc::new(Mutex::new(0usize));
    let count = Arc::clone(&executed);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                if read_request(&mut read).await.is_none() {
                    return;
                }
                let first = {
                    let mut n = count.lock().unwrap();
                    *n += 1;
                    *n == 1
                };
                // The first answer stops after half its body, until the proxy gives up.
                let body: &[u8] = if first { b"{\"ok\"" } else { b"{\"ok\":true}" };
                write
                    .write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 11\r\n\r\n")
                    .await
                    .unwrap();
                write.write_all(body).await.unwrap();
                let mut rest = Vec::new();
                let _ = read.read_to_end(&mut rest).await;
            });
        }
    });
    let routes = format!(
        "defaults: {{ upstream_timeout: 300ms, background_timeout: 600ms, wait_timeout: 50ms }}\n{ROUTES}"
    );
    let proxy = start_proxy(upstream, &routes).await;
    let key = [("idempotency-key", "stall")];
    // Hang guard only: without a timeout on the body this would never answer.
    let stalled = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        post(proxy.addr, "/orders/1", &key, "{}"),
    )
    .await
    .expect("the proxy never gave up on the stalled body");
    assert_eq!(stalled.status, 504, "{:?}", stalled.body);
    // The request went out and may have run: retries are never executed again. While the
    // owner waits on in the background they hear it is in flight; once it gave up, that its
    // outcome is unknown.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let held = loop {
        let retry = post(proxy.addr, "/orders/1", &key, "{}").await;
        assert_eq!(retry.status, 409, "{:?}", retry.body);
        if retry.json()["type"] != "urn:idemgate:problem:in-flight" {
            break retry;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: never gave up"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(held.json()["type"], "urn:idemgate:problem:outcome-unknown");
    assert_eq!(*executed.lock().unwrap(), 1);
}

/// An answer over `max_answer` streams to its client after `upstream_timeout` ended with
/// its head: an upstream that stalls mid-body is cut off after
/// `connections.upstream_read_timeout`, as on a pass-through route, instead of holding the
/// client and the upstream connection forever. The client's answer ends short, the
/// upstream connection is closed, and the key keeps "executed, answer not stored": its
/// repeat is a 409, never a second run. (The gap is 300 ms; the 10 s bounds are hang
/// guards only.)
#[tokio::test]
async fn an_answer_over_max_answer_that_stalls_is_cut_off_and_not_run_again() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let executed = Arc::new(Mutex::new(0usize));
    let count = Arc::clone(&executed);
    let (closed_tx, mut closed) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let count = Arc::clone(&count);
            let closed_tx = closed_tx.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                if read_request(&mut read).await.is_none() {
                    return;
                }
                *count.lock().unwrap() += 1;
                // 2 KiB of an announced 100,000 bytes, then nothing: more than max_answer,
                // so the proxy streams it on and stops buffering.
                write
                    .write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 100000\r\n\r\n")
                    .await
                    .unwrap();
                write.write_all(&[b'x'; 2048]).await.unwrap();
                // Reports when the proxy lets go of the connection.
                let mut rest = Vec::new();
                let _ = read.read_to_end(&mut rest).await;
                let _ = closed_tx.send(());
            });
        }
    });
    let routes = format!(
        "defaults: {{ max_answer: 1KiB }}\nconnections: {{ upstream_read_timeout: 300ms }}\n{ROUTES}"
    );
    let proxy = start_proxy(upstream, &routes).await;
    let request = common::raw_post("/orders/big", &["idempotency-key: big-stall"], "{}");
    let mut client = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    client.write_all(&request).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "hang guard: the client's answer never ended ({} bytes so far)",
        got.len()
    );
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 201"), "{text}");
    let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(body.len(), 2048, "the part that came, and no more");
    tokio::time::timeout(std::time::Duration::from_secs(10), closed.recv())
        .await
        .expect("hang guard: the upstream connection was never let go");
    let retry = post(
        proxy.addr,
        "/orders/big",
        &[("idempotency-key", "big-stall")],
        "{}",
    )
    .await;
    assert_eq!(retry.status, 409, "{:?}", retry.body);
    assert_eq!(
        retry.json()["type"],
        "urn:idemgate:problem:answer-not-stored"
    );
    assert_eq!(*executed.lock().unwrap(), 1);
}
