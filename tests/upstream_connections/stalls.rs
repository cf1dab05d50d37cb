//! Upstreams that stall mid-body: `upstream_timeout` covers the body of a stored answer
//! (a 504, the key held), and an answer over `max_answer` is cut off after the read timeout
//! and never run again; a client's upload the upstream answered early and that is still
//! going out holds up no other client's request.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::common::{self, post, start_proxy};
use crate::{read_request, Seen, ROUTES};

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

/// A raw upstream that answers an upload (`POST /plain/upload`) with `401` and keep-alive as
/// soon as it has read its head, before its body, as Node does, and then reads the body as
/// it comes; any other request it answers `201` once read whole. Counts its connections.
async fn early_answer_upstream() -> (std::net::SocketAddr, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            record.lock().unwrap().connections += 1;
            let record = Arc::clone(&record);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                loop {
                    let mut line = String::new();
                    if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let mut length = 0u64;
                    loop {
                        let mut header = String::new();
                        if read.read_line(&mut header).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let header = header.trim_end().to_ascii_lowercase();
                        if header.is_empty() {
                            break;
                        }
                        if let Some(value) = header.strip_prefix("content-length:") {
                            length = value.trim().parse().unwrap();
                        }
                    }
                    let line = line.trim_end().to_owned();
                    let upload = line.starts_with("POST /plain/upload ");
                    record.lock().unwrap().requests.push((line, None));
                    if upload {
                        let early = b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n";
                        if write.write_all(early).await.is_err() {
                            return;
                        }
                    }
                    let mut body = (&mut read).take(length);
                    match tokio::io::copy(&mut body, &mut tokio::io::sink()).await {
                        Ok(n) if n == length => {}
                        _ => return,
                    }
                    if !upload && write.write_all(crate::OK).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// An upstream that answers an upload before reading it (a `401` with keep-alive) leaves
/// its connection busy until the upload has gone out, however long the client takes to
/// send it: that connection is not handed to the next request, which goes out on a new
/// one (the cap allows it) instead of waiting behind another client's upload until its
/// `upstream_timeout`. For both HTTP/1.1 clients. The upload drips on for the whole test;
/// the next request is sent once its client has the `401`, and the 20 s bounds are hang
/// guards only.
#[tokio::test]
async fn an_answered_upload_still_going_out_does_not_hold_up_the_next_request() {
    for client in ["hyper", "idemgate"] {
        let (upstream, seen) = early_answer_upstream().await;
        let routes = format!(
            "connections: {{ upstream_http1: {client}, upstream_idle_timeout: 1h }}\n\
             defaults: {{ upstream_timeout: 2s }}\n{ROUTES}"
        );
        let proxy = start_proxy(upstream, &routes).await;

        let uploader = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        let (mut from_proxy, mut to_proxy) = uploader.into_split();
        to_proxy
            .write_all(
                b"POST /plain/upload HTTP/1.1\r\nhost: test\r\ncontent-length: 1000000\r\n\r\n",
            )
            .await
            .unwrap();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let drips = tokio::spawn(async move {
            loop {
                if to_proxy.write_all(&[b'x'; 64]).await.is_err() {
                    return;
                }
                tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(std::time::Duration::from_millis(20)) => {}
                }
            }
        });
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = from_proxy.read(&mut buf).await.unwrap();
                assert!(
                    n > 0,
                    "{client}: the proxy closed before answering the upload"
                );
                head.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .expect("hang guard: the upload was never answered");
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 401"), "{client}: {head}");

        let next = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            post(proxy.addr, "/plain/next", &[], "{}"),
        )
        .await
        .expect("hang guard: the next request never got an answer");
        assert_eq!(next.status, 201, "{client}: {:?}", next.body);
        {
            let seen = seen.lock().unwrap();
            assert_eq!(
                seen.connections, 2,
                "{client}: not on a connection of its own"
            );
            assert_eq!(seen.requests.len(), 2, "{client}");
            assert_eq!(seen.requests[1].0, "POST /plain/next HTTP/1.1", "{client}");
        }
        let _ = stop.send(());
        drips.await.unwrap();
    }
}
