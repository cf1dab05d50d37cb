//! The upstream side of the proxy: kept-alive connections are reused, requests go out in
//! origin form with a `Host`, a connection the upstream closed while idle is never used
//! for a request (nor does a request sent on it execute twice), the proxy closes idle
//! connections before the upstream's keep-alive timeout does; `upstream_timeout` covers
//! the body too.
//!
//! The upstream here is a raw TCP server, so the test sees exactly what went over the wire.
//!
//! The raw upstreams every test uses and the tests of request forms (`Host`, `CONNECT`)
//! are here; `keep_alive.rs` has the pooled connections, `connection_auth.rs` connections
//! an upstream authenticated (NTLM), `framing.rs` answers framed
//! oddly, `stalls.rs` upstreams that stall mid-body.

#[path = "../common/mod.rs"]
mod common;

mod connection_auth;
mod framing;
mod keep_alive;
mod stalls;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use common::{post, start_proxy};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

const ROUTES: &str = r#"
routes:
  - name: orders
    match: { methods: [POST], path: "/orders/*" }
    key: { header: Idempotency-Key, required: true }
  - name: plain
    match: { path: "/plain/*" }
    idempotency: off
"#;

/// For the tests that count connections to see them reused: an idle timeout no pause
/// between their requests reaches, however busy the machine.
const KEEP_IDLE: &str = "connections: { upstream_idle_timeout: 1h }\n";

/// What the raw upstream saw.
#[derive(Default)]
struct Seen {
    connections: usize,
    /// Request line and `Host` of every request, in order.
    requests: Vec<(String, Option<String>)>,
}

/// Reads one request (line, headers, `Content-Length` body) and returns its request line
/// and `Host`; `None` once the proxy closed the connection.
async fn read_request(read: &mut BufReader<OwnedReadHalf>) -> Option<(String, Option<String>)> {
    let (line, headers) = read_request_headers(read).await?;
    let host = headers.into_iter().find(|(name, _)| name == "host");
    Some((line, host.map(|(_, value)| value)))
}

/// Reads one request and returns its request line and headers (names lower-cased, values
/// trimmed), its body read past; `None` once the proxy closed the connection.
async fn read_request_headers(
    read: &mut BufReader<OwnedReadHalf>,
) -> Option<(String, Vec<(String, String)>)> {
    let mut line = String::new();
    if read.read_line(&mut line).await.unwrap_or(0) == 0 {
        return None;
    }
    let (mut length, mut headers) = (0usize, Vec::new());
    loop {
        let mut header = String::new();
        read.read_line(&mut header).await.unwrap();
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap();
        let (name, value) = (name.to_ascii_lowercase(), value.trim().to_owned());
        if name == "content-length" {
            length = value.parse().unwrap();
        }
        headers.push((name, value));
    }
    let mut body = vec![0u8; length];
    read.read_exact(&mut body).await.unwrap();
    Some((line.trim_end().to_owned(), headers))
}

/// A raw HTTP/1.1 upstream answering `201 {"ok":true}` with keep-alive. With
/// `close_after_each`, it closes a connection after one answer, once the test notifies
/// `close`, without having said so in a `Connection` header (as a server whose keep-alive
/// timeout ran out does), and reports each close on the returned channel.
async fn raw_upstream(
    close_after_each: bool,
    close: Arc<Notify>,
) -> (SocketAddr, Arc<Mutex<Seen>>, mpsc::UnboundedReceiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let (closed_tx, closed_rx) = mpsc::unbounded_channel();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            record.lock().unwrap().connections += 1;
            let record = Arc::clone(&record);
            let closed_tx = closed_tx.clone();
            let close = Arc::clone(&close);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                while let Some(request) = read_request(&mut read).await {
                    record.lock().unwrap().requests.push(request);
                    let answer = "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";
                    write.write_all(answer.as_bytes()).await.unwrap();
                    if close_after_each {
                        close.notified().await;
                        let _ = write.shutdown().await;
                        drop(write);
                        drop(read);
                        let _ = closed_tx.send(());
                        return;
                    }
                }
            });
        }
    });
    (addr, seen, closed_rx)
}

const OK: &[u8] = b"HTTP/1.1 201 Created\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";

/// What a scripted upstream sends for one request: the pieces of its answer (written apart,
/// so the proxy sees them in separate reads) and whether it closes the connection after.
type Script = fn(usize) -> (Vec<&'static [u8]>, bool);

/// A raw upstream that answers the n-th request it reads (over all its connections) with
/// `script(n)`.
async fn scripted_upstream(script: Script) -> (SocketAddr, Arc<Mutex<Seen>>) {
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
                while let Some(request) = read_request(&mut read).await {
                    let n = {
                        let mut seen = record.lock().unwrap();
                        seen.requests.push(request);
                        seen.requests.len() - 1
                    };
                    let (pieces, close) = script(n);
                    for piece in pieces {
                        write.write_all(piece).await.unwrap();
                        write.flush().await.unwrap();
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                    if close {
                        let _ = write.shutdown().await;
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn a_request_without_host_gets_the_upstreams() {
    let (upstream, seen, _) = raw_upstream(false, Arc::default()).await;
    let proxy = start_proxy(upstream, ROUTES).await;
    let answer = common::raw_exchange(
        proxy.addr,
        b"POST /plain/old HTTP/1.0\r\ncontent-length: 2\r\n\r\nhi",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.0 201"), "{answer}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.requests[0].0, "POST /plain/old HTTP/1.1");
    assert_eq!(
        seen.requests[0].1.as_deref(),
        Some(upstream.to_string().as_str())
    );
}

/// `CONNECT` is a 501 and never reaches the upstream. Forwarded (as `CONNECT /`), a 2xx
/// made the upstream connection a tunnel that went back to the pool, and the next client's
/// request was written into the tunnel.
#[tokio::test]
async fn connect_is_501_and_never_reaches_the_upstream() {
    let (upstream, seen) = scripted_upstream(|_| (vec![OK], false)).await;
    let proxy = start_proxy(upstream, ROUTES).await;
    let answer = common::raw_exchange(
        proxy.addr,
        b"CONNECT 10.0.0.1:443 HTTP/1.1\r\nhost: 10.0.0.1:443\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 501"), "{answer}");
    assert!(
        answer.contains("urn:idemgate:problem:not-implemented"),
        "{answer}"
    );
    let next = post(proxy.addr, "/plain/after", &[], "{}").await;
    assert_eq!(next.status, 201);
    let seen = seen.lock().unwrap();
    let lines: Vec<_> = seen
        .requests
        .iter()
        .map(|(line, _)| line.as_str())
        .collect();
    assert_eq!(lines, ["POST /plain/after HTTP/1.1"]);
}
