//! Peers that stall on a pass-through route: an answer stalled mid-body and a client that
//! stops reading are cut off (the upstream connection freed), a stalled upload gets 408.

use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{self, pattern_bytes, send, start_proxy, start_upstream};
use crate::{read_head, ROUTES};

/// An upstream that sends a pass-through answer's head and part of its body, then stalls,
/// is cut off after `connections.upstream_read_timeout` without a byte: the client's
/// connection ends (short of the announced length) instead of hanging, and the proxy
/// serves the next request. (The gap is 300 ms; the 30 s bound is a hang guard only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_through_answer_stalled_mid_body_is_cut_off() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                if read_head(&mut stream).await.is_none() {
                    return;
                }
                let head = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789";
                stream.write_all(head).await.unwrap();
                // Stalls: holds the connection, sends nothing more.
                tokio::time::sleep(std::time::Duration::from_secs(300)).await;
            });
        }
    });
    let routes = format!("connections: {{ upstream_read_timeout: 300ms }}\n{ROUTES}");
    let proxy = start_proxy(upstream, &routes).await;
    let text = common::raw_exchange(proxy.addr, b"GET /upload HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(body, "0123456789", "the part that came, and no more");
}

/// A client that asks for a large pass-through answer and stops reading it is cut off
/// once nothing has reached it for `connections.client_send_timeout` (nginx's
/// `send_timeout`): its connection is closed, and the upstream connection the answer
/// streamed from is freed, so with `max_upstream: 1` the next request is served. (The
/// timeout is 1 s; the 30 s bounds are hang guards only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_answer_is_cut_off_and_frees_the_upstream_connection() {
    let upstream = start_upstream().await;
    let routes = format!("connections: {{ max_upstream: 1, client_send_timeout: 1s }}\n{ROUTES}");
    let proxy = start_proxy(upstream.addr, &routes).await;
    let mut reader = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    reader
        .write_all(b"GET /download?bytes=268435456 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // The answer streams (the only upstream connection is taken); then it is not read.
    let head = read_head(&mut reader).await.expect("the answer's head");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let next = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        send(proxy.addr, Method::GET, "/download?bytes=10", &[], ""),
    )
    .await
    .expect("hang guard: a client that does not read holds the only upstream connection");
    assert_eq!(next.status, StatusCode::OK);
    assert_eq!(next.body, pattern_bytes(10));
    // The reader's connection was closed: what was sent before ends short of the length.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        reader.read_to_end(&mut rest),
    )
    .await
    .expect("hang guard: the connection of a client that does not read stays open");
    assert!(rest.len() < 268_435_456, "cut off short of the answer");
}

/// A client that sends part of a pass-through upload and then nothing is cut off after
/// the body read timeout (nginx's `client_body_timeout`): it gets a 408 problem, and the
/// upstream sees the upload end short instead of waiting on it. (The timeout is 300 ms;
/// the 30 s bounds are hang guards only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_pass_through_upload_is_cut_off_with_408() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let (cut_tx, cut) = tokio::sync::oneshot::channel::<usize>();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        read_head(&mut stream).await.expect("a request head");
        // Reads the body until the proxy ends it; reports how much came.
        let mut got = 0;
        let mut buf = [0u8; 1024];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
            got += n;
        }
        let _ = cut_tx.send(got);
    });
    let text = format!("listen: 127.0.0.1:0\nupstream: http://{upstream}\n{ROUTES}");
    let proxy = common::start_proxy_tuned(&text, None, |p| {
        p.with_body_read_timeout(std::time::Duration::from_millis(300))
    })
    .await;
    let answer = common::raw_exchange(
        proxy.addr,
        b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n0123456789",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("urn:idemgate:problem:body-timeout"),
        "{answer}"
    );
    let got = tokio::time::timeout(std::time::Duration::from_secs(30), cut)
        .await
        .expect("hang guard: the upstream was left waiting for the rest")
        .unwrap();
    assert!(
        got < 100,
        "the upstream never saw a whole body ({got} bytes)"
    );
}
