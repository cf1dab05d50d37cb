//! A correct reverse proxy first: unprotected traffic streams through byte-exact, headers are
//! cleaned per RFC 9110 §7.6.1, chunked bodies, `Expect: 100-continue`, upgrades and HTTP/2
//! clients work.
//!
//! The routes and the raw-socket helpers every module uses are here; `bodies.rs` has the
//! bodies streamed byte-exact, `headers.rs` header cleaning, `Expect` and trailers,
//! `forwarded.rs` the forwarded fields of trusted and other peers,
//! `protocols.rs` upgrades and HTTP/2, `stalls.rs` peers that stall, `trailers.rs` answer
//! trailers to HTTP/1.1 and HTTP/2 clients, and `unprotected.rs` the rules of routes with
//! `idempotency: off`.

#[path = "../common/mod.rs"]
mod common;

mod bodies;
mod forwarded;
mod headers;
mod protocols;
mod stalls;
mod trailers;
mod tunnels;
mod unprotected;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ROUTES: &str = r#"
routes:
  - name: create-order
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
  - name: uploads
    match: { path: /upload }
    idempotency: off
  - name: echo
    match: { path: /echo-headers }
    idempotency: off
"#;

async fn raw_exchange(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    let interim = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(
        interim.starts_with("HTTP/1.1 100 Continue"),
        "expected 100 first, got {interim}"
    );
    stream.write_all(body).await.unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.unwrap();
    String::from_utf8_lossy(&rest).into_owned()
}

/// Reads one HTTP/1.1 head (through its blank line) byte by byte, so nothing after it is
/// consumed, lowercased; `None` if the peer closes or fails first.
async fn read_head(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.ok()?;
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).to_ascii_lowercase())
}

/// A raw upstream that reads each request's head and answers it with `answer` (`None`:
/// never answers, holding the connection).
async fn raw_answering(answer: Option<&'static [u8]>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                while read_head(&mut stream).await.is_some() {
                    match answer {
                        Some(answer) => stream.write_all(answer).await.unwrap(),
                        None => tokio::time::sleep(std::time::Duration::from_secs(300)).await,
                    }
                }
            });
        }
    });
    upstream
}
