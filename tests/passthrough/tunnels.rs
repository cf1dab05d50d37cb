//! Upgraded connections (tunnels) end: one that carries no byte either way for
//! `connections.tunnel_idle_timeout` is closed on both sides, so idle tunnels cannot hold
//! the upstream connections (`max_upstream`) every other request needs; while it lives, a
//! tunnel keeps its client connection's slot (`max_client`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::common::{self, start_proxy, start_upstream};
use crate::{read_head, ROUTES};

/// Bounds every wait for something the proxy should do: a hang guard, far past the
/// timeouts under test.
const GUARD: Duration = Duration::from_secs(5);

/// An upstream that switches every request to an echo protocol and reports each upgraded
/// connection whose proxy side closed (a read of 0 bytes or an error).
async fn echo_upstream() -> (SocketAddr, mpsc::UnboundedReceiver<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (closed, seen) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let closed = closed.clone();
            tokio::spawn(async move {
                if read_head(&mut stream).await.is_none() {
                    return;
                }
                let switch = b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\n";
                stream.write_all(switch).await.unwrap();
                let mut buf = [0u8; 1024];
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if stream.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = closed.send(());
            });
        }
    });
    (addr, seen)
}

/// A connection to `proxy` upgraded to the `echo` protocol, checked to echo once.
async fn open_tunnel(proxy: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream
        .write_all(b"GET /chat HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: echo\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut stream).await.expect("an answer head");
    assert!(head.starts_with("http/1.1 101"), "{head}");
    echo(&mut stream, b"ping").await;
    stream
}

async fn echo(stream: &mut TcpStream, message: &[u8]) {
    stream.write_all(message).await.unwrap();
    let mut back = vec![0u8; message.len()];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(back, message);
}

/// Waits (within [`GUARD`]) for the proxy to close `stream`: its end of file, or a reset.
async fn closed_by_proxy(stream: &mut TcpStream) {
    let mut byte = [0u8; 1];
    match tokio::time::timeout(GUARD, stream.read(&mut byte)).await {
        Ok(Ok(0) | Err(_)) => {}
        Ok(Ok(_)) => panic!("a byte nobody sent"),
        Err(_) => panic!("the idle tunnel is still open after {GUARD:?}"),
    }
}

/// An idle tunnel is closed on both sides once the timeout has passed, and not before.
/// Before, it stayed open for as long as its two peers did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tunnel_is_closed_on_both_sides() {
    let (upstream, mut upstream_closed) = echo_upstream().await;
    let routes = format!("connections: {{ tunnel_idle_timeout: 300ms }}\n{ROUTES}");
    let proxy = start_proxy(upstream, &routes).await;
    let mut tunnel = open_tunnel(proxy.addr).await;
    let idle_from = Instant::now();
    closed_by_proxy(&mut tunnel).await;
    let waited = idle_from.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "closed after {waited:?}"
    );
    tokio::time::timeout(GUARD, upstream_closed.recv())
        .await
        .expect("the upstream's side of the tunnel is still open")
        .unwrap();
}

/// Bytes more often than the timeout keep a tunnel open past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_tunnel_outlives_the_idle_timeout() {
    let (upstream, mut upstream_closed) = echo_upstream().await;
    let routes = format!("connections: {{ tunnel_idle_timeout: 300ms }}\n{ROUTES}");
    let proxy = start_proxy(upstream, &routes).await;
    let mut tunnel = open_tunnel(proxy.addr).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1200) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        echo(&mut tunnel, b"still here").await;
    }
    assert!(
        upstream_closed.try_recv().is_err(),
        "the upstream saw a close"
    );
}

/// Idle tunnels give their upstream connections back: with `max_upstream: 2` filled by two
/// of them, a protected request goes out once they were closed. Before, it waited for a
/// slot until its `upstream_timeout` and was a 502 `upstream-unreachable`, as every
/// request was for as long as the tunnels stayed open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tunnels_do_not_starve_the_upstream_connections() {
    let upstream = start_upstream().await;
    let routes = format!(
        "connections: {{ max_upstream: 2, tunnel_idle_timeout: 300ms }}\n\
         defaults: {{ upstream_timeout: 3s }}\n{ROUTES}"
    );
    let proxy = start_proxy(upstream.addr, &routes).await;
    let mut tunnels = [open_tunnel(proxy.addr).await, open_tunnel(proxy.addr).await];
    let answer = common::post(proxy.addr, "/orders", &[("idempotency-key", "k1")], "{}").await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    assert_eq!(upstream.executed(), 1);
    for tunnel in &mut tunnels {
        closed_by_proxy(tunnel).await;
    }
}

/// A tunnel counts against `max_client` while it lives: with a cap of one, the next
/// connection is served only once the tunnel has closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_holds_its_client_slot_until_it_closes() {
    let (upstream, _closed) = echo_upstream().await;
    let routes = format!("connections: {{ max_client: 1, tunnel_idle_timeout: 1s }}\n{ROUTES}");
    let proxy = start_proxy(upstream, &routes).await;
    let mut tunnel = open_tunnel(proxy.addr).await;
    let mut next = TcpStream::connect(proxy.addr).await.unwrap();
    next.write_all(
        b"GET /chat HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: echo\r\n\r\n",
    )
    .await
    .unwrap();
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(500), next.read(&mut byte)).await;
    assert!(early.is_err(), "served beside a live tunnel: {early:?}");
    closed_by_proxy(&mut tunnel).await;
    // As a client does at the end: else the proxy's lingering close waits for it.
    drop(tunnel);
    let head = tokio::time::timeout(GUARD, read_head(&mut next))
        .await
        .expect("not served after the tunnel closed");
    assert!(head.is_some_and(|h| h.starts_with("http/1.1 101")));
}
