//! Upgraded connections (tunnels) end: one that carries no byte either way for
//! `connections.tunnel_idle_timeout`, or whose write to one side waits that long, is closed
//! on both sides, so idle tunnels cannot hold the upstream connections (`max_upstream`)
//! every other request needs; a shutdown closes them at once, so they do not hold the
//! drain; while it lives, a tunnel keeps its client connection's slot (`max_client`).
//!
//! A close is waited for (hang guard) and never timed from below; a tunnel shown to stay
//! open is kept busy far more often than its timeout, so only a stall of seconds fails it.

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
const GUARD: Duration = Duration::from_secs(10);

/// What the upstream does once it switched protocols.
#[derive(Clone, Copy)]
enum Upgraded {
    /// Sends back what it reads.
    Echo,
    /// Reads and drops what it gets, sends nothing.
    Sink,
    /// Reads and drops what it gets, and sends as fast as it can.
    Flood,
}

/// An upstream that switches every request to the `echo` protocol, then does `what`, and
/// reports each upgraded connection whose proxy side closed (a read of 0 bytes or an
/// error).
async fn tunnel_upstream(what: Upgraded) -> (SocketAddr, mpsc::UnboundedReceiver<()>) {
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
                let (mut read, write) = stream.into_split();
                // Kept while the upstream reads: a write half dropped sends the end.
                let mut write = Some(write);
                if let Upgraded::Flood = what {
                    let mut flood = write.take().expect("just made");
                    tokio::spawn(async move {
                        while flood.write_all(&[b'x'; 16 << 10]).await.is_ok() {}
                    });
                }
                let mut buf = [0u8; 1024];
                while let Ok(n @ 1..) = read.read(&mut buf).await {
                    if let (Upgraded::Echo, Some(write)) = (what, &mut write) {
                        if write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                }
                let _ = closed.send(());
            });
        }
    });
    (addr, seen)
}

/// A connection to `proxy` upgraded to the `echo` protocol.
async fn upgrade(proxy: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream
        .write_all(b"GET /chat HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: echo\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut stream).await.expect("an answer head");
    assert!(head.starts_with("http/1.1 101"), "{head}");
    stream
}

/// [`upgrade`], checked to echo once.
async fn open_tunnel(proxy: SocketAddr) -> TcpStream {
    let mut stream = upgrade(proxy).await;
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
        Err(_) => panic!("the tunnel is still open after {GUARD:?}"),
    }
}

/// Waits (within [`GUARD`]) for the upstream to see its side of a tunnel closed.
async fn upstream_sees_a_close(closed: &mut mpsc::UnboundedReceiver<()>) {
    tokio::time::timeout(GUARD, closed.recv())
        .await
        .expect("the upstream's side of the tunnel is still open")
        .unwrap();
}

/// An idle tunnel is closed on both sides once the timeout has passed. Before, it stayed
/// open for as long as its two peers did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tunnel_is_closed_on_both_sides() {
    let (upstream, mut upstream_closed) = tunnel_upstream(Upgraded::Echo).await;
    let routes = format!("connections: {{ tunnel_idle_timeout: 300ms }}\n{ROUTES}");
    let proxy = start_proxy(upstream, &routes).await;
    let mut tunnel = open_tunnel(proxy.addr).await;
    closed_by_proxy(&mut tunnel).await;
    upstream_sees_a_close(&mut upstream_closed).await;
}

/// Bytes far more often than the timeout (every 100 ms, against 3 s) keep a tunnel open
/// past it, whether they go both ways or one way only (a client that only talks, here; one
/// that only listens is the same to the tunnel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_tunnel_outlives_the_idle_timeout() {
    let (echoing, mut echo_closed) = tunnel_upstream(Upgraded::Echo).await;
    let (sink, mut sink_closed) = tunnel_upstream(Upgraded::Sink).await;
    let routes = format!("connections: {{ tunnel_idle_timeout: 3s }}\n{ROUTES}");
    let both_ways = start_proxy(echoing, &routes).await;
    let one_way = start_proxy(sink, &routes).await;
    let mut both = open_tunnel(both_ways.addr).await;
    let mut one = upgrade(one_way.addr).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        echo(&mut both, b"still here").await;
        one.write_all(b"still here").await.unwrap();
    }
    assert!(echo_closed.try_recv().is_err(), "the echo saw a close");
    assert!(sink_closed.try_recv().is_err(), "the sink saw a close");
    // Still open to the client too: a close would have ended the echo's reads.
    echo(&mut both, b"still here").await;
}

/// A client that keeps talking but never reads what its upstream sends keeps the tunnel
/// busy, while the upstream's bytes wait: the write to it, stalled for the timeout, closes
/// the tunnel on both sides. Before, it stayed open as long as the client talked, the
/// upstream's writes waiting for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_whose_client_reads_nothing_is_closed() {
    let (upstream, mut upstream_closed) = tunnel_upstream(Upgraded::Flood).await;
    let routes = format!("connections: {{ tunnel_idle_timeout: 1s }}\n{ROUTES}");
    let proxy = start_proxy(upstream, &routes).await;
    let mut tunnel = upgrade(proxy.addr).await;
    let talking = tokio::spawn(async move {
        while tunnel.write_all(b"still here").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    upstream_sees_a_close(&mut upstream_closed).await;
    talking.abort();
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

/// A tunnel counts against `max_client` while it lives, and gives its slot back once it
/// ended: with a cap of one, the next connection is not served beside it, and is once its
/// client closed it (the idle timeout is far off). The connection's task keeps the slot
/// until the tunnel hands the socket back: a task that let go at the switch fails the
/// first check, a slot kept past the tunnel the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_holds_its_client_slot_until_it_closes() {
    let (upstream, mut upstream_closed) = tunnel_upstream(Upgraded::Echo).await;
    let routes = format!("connections: {{ max_client: 1, tunnel_idle_timeout: 60s }}\n{ROUTES}");
    let proxy = start_proxy(upstream, &routes).await;
    let tunnel = open_tunnel(proxy.addr).await;
    let mut next = TcpStream::connect(proxy.addr).await.unwrap();
    next.write_all(
        b"GET /chat HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: echo\r\n\r\n",
    )
    .await
    .unwrap();
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(500), next.read(&mut byte)).await;
    assert!(early.is_err(), "served beside a live tunnel: {early:?}");
    drop(tunnel);
    upstream_sees_a_close(&mut upstream_closed).await;
    let head = tokio::time::timeout(GUARD, read_head(&mut next))
        .await
        .expect("not served after the tunnel closed");
    assert!(head.is_some_and(|h| h.starts_with("http/1.1 101")));
}

/// SIGTERM with a tunnel open, idle, far from its timeout: the tunnel is closed at once on
/// both sides, and the process exits well before `drain_timeout` (60 s). Before, the
/// drain waited for the tunnel to its very end, then the exit cut it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_closes_open_tunnels_without_waiting_for_the_drain() {
    let (upstream, mut upstream_closed) = tunnel_upstream(Upgraded::Echo).await;
    let config =
        format!("drain_timeout: 60s\nconnections: {{ tunnel_idle_timeout: 60s }}\n{ROUTES}");
    let mut proxy = common::ProxyProcess::start(upstream, &config);
    let mut tunnel = open_tunnel(proxy.addr).await;
    proxy.signal("TERM");
    closed_by_proxy(&mut tunnel).await;
    upstream_sees_a_close(&mut upstream_closed).await;
    // As a client does once it read the end: else the lingering close waits for it.
    drop(tunnel);
    let status = tokio::task::spawn_blocking(move || proxy.wait_exit_within(GUARD))
        .await
        .unwrap()
        .expect("still running, well before the drain's end");
    assert!(status.success());
}
