//! Bodies streamed byte-exact: GET downloads, a 50 MiB chunked upload, chunked bodies to
//! protected routes, and uploads the upstream answers early or interrupts with an interim
//! answer.

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{self, pattern_bytes, send, start_proxy, start_upstream};
use crate::{read_head, ROUTES};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_downloads_arrive_byte_exact() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let n = 8 * 1024 * 1024 + 13;
    let a = send(
        proxy.addr,
        Method::GET,
        &format!("/download?bytes={n}"),
        &[],
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body.len(), n);
    assert!(a.body == pattern_bytes(n), "every byte as sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50_mib_chunked_upload_streams_through_byte_exact() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let data = Bytes::from(pattern_bytes(50 * 1024 * 1024));
    let expected = format!("{} {}", data.len(), hex::encode(Sha256::digest(&data)));
    let chunks: Vec<Bytes> = (0..data.len())
        .step_by(1 << 20)
        .map(|at| data.slice(at..(at + (1 << 20)).min(data.len())))
        .collect();
    let (status, answer) = upload(proxy.addr, chunks).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(String::from_utf8_lossy(&answer), expected);
}

/// POSTs `chunks` to `/upload` as one chunked body, streamed from the client (hyper's
/// HTTP/1.1 client, which reads an answer that comes before the body is all sent), and
/// returns the answer's status and body.
async fn upload(proxy: std::net::SocketAddr, chunks: Vec<Bytes>) -> (StatusCode, Bytes) {
    let frames = chunks
        .into_iter()
        .map(|chunk| Ok::<_, std::convert::Infallible>(Frame::data(chunk)));
    let body = StreamBody::new(futures_util::stream::iter(frames));
    let stream = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = Request::post("/upload")
        .header("host", "uploads.example")
        .body(body)
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_request_bodies_reach_protected_routes_whole() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let raw = common::raw_exchange(
        proxy.addr,
        b"POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: ch\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 201"), "{raw}");
    assert!(
        raw.contains(r#"\"a\":1"#),
        "the upstream got the whole body: {raw}"
    );
}

/// An upstream that answers `413` as soon as it has a request's head, reading none of its
/// body, as an app refusing an upload does. Then it either holds the connection without
/// reading (`finish: false`) or, as Go's and hyper's servers do, closes its sending side
/// and discards what still arrives (`finish: true`).
async fn start_early_answerer(finish: bool) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                if read_head(&mut stream).await.is_none() {
                    return;
                }
                let answer = "HTTP/1.1 413 Content Too Large\r\ncontent-length: 9\r\nconnection: close\r\n\r\ntoo large";
                stream.write_all(answer.as_bytes()).await.unwrap();
                if finish {
                    let _ = stream.shutdown().await;
                    let mut sink = vec![0u8; 1 << 16];
                    while stream.read(&mut sink).await.unwrap_or(0) > 0 {}
                } else {
                    // Held open and unread until the test ends.
                    tokio::time::sleep(std::time::Duration::from_secs(300)).await;
                    drop(stream);
                }
            });
        }
    });
    addr
}

/// A 64 MiB upload: far more than the sockets between client, proxy and upstream buffer.
fn chunks_of_64_mib() -> Vec<Bytes> {
    vec![Bytes::from(pattern_bytes(1 << 20)); 64]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_answering_before_the_upload_ends_is_relayed_at_once() {
    for finish in [false, true] {
        let upstream = start_early_answerer(finish).await;
        let proxy = start_proxy(upstream, ROUTES).await;
        // Hang guard, far below the 60 s upstream timeout a proxy that keeps writing into
        // an upstream that stopped reading would wait out.
        let (status, body) = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            upload(proxy.addr, chunks_of_64_mib()),
        )
        .await
        .unwrap_or_else(|_| panic!("no answer relayed (finish: {finish})"));
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "finish: {finish}");
        assert_eq!(&body[..], b"too large", "finish: {finish}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interim_answer_during_an_upload_does_not_cut_it_short() {
    // An upstream that sends `100 Continue` as soon as it has the head (unasked), then
    // reads the whole body and says how much it got: only a final answer ends an upload.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let head = read_head(&mut stream).await.expect("a request head");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|n| n.trim().parse().ok())
            .expect("a content-length upload");
        stream
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .unwrap();
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await.unwrap();
        let said = format!("{} {}", body.len(), hex::encode(Sha256::digest(&body)));
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{said}",
            said.len()
        );
        stream.write_all(answer.as_bytes()).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
    });
    let proxy = start_proxy(upstream, ROUTES).await;
    let data = Bytes::from(pattern_bytes(16 << 20));
    let expected = format!("{} {}", data.len(), hex::encode(Sha256::digest(&data)));
    let a = send(proxy.addr, Method::POST, "/upload", &[], data).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(String::from_utf8_lossy(&a.body), expected);
}
