//! `connections.max_client` and `connections.max_upstream`: over the client cap a new
//! connection waits while the others are served; over the upstream cap requests wait for
//! a connection, the upstream never sees more than the cap, and a request that waited past
//! its timeout for a connection never went out (502, key released, not 504).
//! `http2_clients.rs`: HTTP/2 clients that leave their window shut, stop taking an answer,
//! or send and leave before their request went out.

#[path = "../common/mod.rs"]
mod common;

mod http2_clients;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{closed_by_the_proxy, metric, post, start_proxy, start_upstream};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

const ROUTES: &str = r#"
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
  - name: plain
    match: { path: "/plain/*" }
    idempotency: off
"#;

/// One GET on `stream`, answered (by the test upstream) with a JSON body: reads the whole
/// answer and returns its status line.
async fn get_on(stream: &mut TcpStream, path: &str) -> String {
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    read_answer(stream).await
}

async fn read_answer(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut body = vec![0u8; common::content_length_of(&head)];
    stream.read_exact(&mut body).await.unwrap();
    head.lines().next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_client_cap_a_new_connection_waits_while_the_others_are_served() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &format!("connections: {{ max_client: 2 }}\n{ROUTES}"),
    )
    .await;
    let mut first = TcpStream::connect(proxy.addr).await.unwrap();
    let mut second = TcpStream::connect(proxy.addr).await.unwrap();
    assert!(get_on(&mut first, "/plain/1").await.contains("200"));
    assert!(get_on(&mut second, "/plain/2").await.contains("200"));
    // The third is accepted by the kernel, but not served while the two are open.
    let mut third = TcpStream::connect(proxy.addr).await.unwrap();
    third
        .write_all(b"GET /plain/3 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    while metric(proxy.admin, "idemgate_client_connections_waited_total").await < 1.0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        metric(proxy.admin, "idemgate_client_connections").await,
        2.0
    );
    // The two go on being served meanwhile.
    assert!(get_on(&mut first, "/plain/4").await.contains("200"));
    assert!(get_on(&mut second, "/plain/5").await.contains("200"));
    let mut byte = [0u8; 1];
    let early = tokio::time::timeout(Duration::from_millis(300), third.read(&mut byte)).await;
    assert!(
        early.is_err(),
        "the third connection was served over the cap"
    );
    // One closes: the third gets its turn.
    drop(first);
    let answer = tokio::time::timeout(Duration::from_secs(30), read_answer(&mut third))
        .await
        .expect("hang guard: the waiting connection was never served");
    assert!(answer.contains("200"), "{answer}");
}

/// A raw upstream that holds every request until the test lets it go (`release`), and
/// counts connections: open now, most open at once, and in all.
struct Holding {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
    /// One message per request that arrived.
    arrived: mpsc::UnboundedReceiver<()>,
    release: Arc<Semaphore>,
    /// The requests' idempotency keys, in arrival order.
    keys: Arc<Mutex<Vec<String>>>,
}

async fn holding_upstream() -> Holding {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (open, most, total): (Arc<AtomicUsize>, Arc<AtomicUsize>, Arc<AtomicUsize>) =
        (Arc::default(), Arc::default(), Arc::default());
    let release = Arc::new(Semaphore::new(0));
    let keys: Arc<Mutex<Vec<String>>> = Arc::default();
    let (arrived_tx, arrived) = mpsc::unbounded_channel();
    let (o, m, t, r, k) = (
        Arc::clone(&open),
        Arc::clone(&most),
        Arc::clone(&total),
        Arc::clone(&release),
        Arc::clone(&keys),
    );
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            t.fetch_add(1, Ordering::SeqCst);
            let now = o.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            let (o, r, k, arrived_tx) = (
                Arc::clone(&o),
                Arc::clone(&r),
                Arc::clone(&k),
                arrived_tx.clone(),
            );
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                loop {
                    let mut line = String::new();
                    if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                        break;
                    }
                    let mut length = 0usize;
                    loop {
                        let mut field = String::new();
                        read.read_line(&mut field).await.unwrap();
                        let field = field.trim_end();
                        if field.is_empty() {
                            break;
                        }
                        let (name, value) = field.split_once(':').unwrap();
                        match name.to_ascii_lowercase().as_str() {
                            "content-length" => length = value.trim().parse().unwrap(),
                            "idempotency-key" => k.lock().unwrap().push(value.trim().to_owned()),
                            _ => {}
                        }
                    }
                    let mut body = vec![0u8; length];
                    read.read_exact(&mut body).await.unwrap();
                    let _ = arrived_tx.send(());
                    r.acquire().await.unwrap().forget();
                    let answer = "HTTP/1.1 201 Created\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";
                    if write.write_all(answer.as_bytes()).await.is_err() {
                        break;
                    }
                }
                o.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Holding {
        addr,
        open,
        most,
        total,
        arrived,
        release,
        keys,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_cap_bounds_connections_and_queued_requests_are_served() {
    let mut upstream = holding_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &format!("connections: {{ max_upstream: 2 }}\n{ROUTES}"),
    )
    .await;
    let requests: Vec<_> = (0..5)
        .map(|i| {
            let addr = proxy.addr;
            tokio::spawn(async move { post(addr, &format!("/plain/{i}"), &[], "{}").await })
        })
        .collect();
    // Two arrive; the other three wait for a connection.
    for _ in 0..2 {
        upstream.arrived.recv().await.unwrap();
    }
    while metric(proxy.admin, "idemgate_upstream_connections_waited_total").await < 3.0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        metric(proxy.admin, "idemgate_upstream_connections").await,
        2.0
    );
    assert_eq!(upstream.open.load(Ordering::SeqCst), 2);
    upstream.release.add_permits(5);
    for request in requests {
        let answer = request.await.unwrap();
        assert_eq!(answer.status, 201, "{:?}", answer.body);
    }
    assert_eq!(
        upstream.most.load(Ordering::SeqCst),
        2,
        "at most two at once"
    );
    assert_eq!(
        upstream.total.load(Ordering::SeqCst),
        2,
        "the waiting requests reused the two connections"
    );
}

/// Waiting for a connection is waiting before anything was sent: a protected request
/// whose `upstream_timeout` passes while the only connection is busy is a 502 that
/// releases its key (the retry executes), not a 504 that would hold it as possibly run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_timed_out_waiting_for_a_connection_was_not_sent() {
    let mut upstream = holding_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        r#"
connections: { max_upstream: 1 }
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
    upstream_timeout: 300ms
  - name: plain
    match: { path: "/plain/*" }
    idempotency: off
"#,
    )
    .await;
    let addr = proxy.addr;
    let busy = tokio::spawn(async move { post(addr, "/plain/busy", &[], "{}").await });
    upstream.arrived.recv().await.unwrap();
    let waited = post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "queued")],
        "{}",
    )
    .await;
    assert_eq!(waited.status, 502, "{:?}", waited.body);
    assert_eq!(
        waited.json()["type"],
        "urn:idemgate:problem:upstream-unreachable"
    );
    upstream.release.add_permits(3);
    assert_eq!(busy.await.unwrap().status, 201);
    // The released key executes now.
    let retry = post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "queued")],
        "{}",
    )
    .await;
    assert_eq!(retry.status, 201, "{:?}", retry.body);
    assert!(!retry.replayed());
    assert_eq!(*upstream.keys.lock().unwrap(), ["queued"]);
}

/// Whether a new connection gets a pass-through answer within `within`: its client slot
/// (`max_client: 1` below) is free.
async fn served_within(addr: SocketAddr, within: Duration) -> bool {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /plain/x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    matches!(
        tokio::time::timeout(within, stream.read_to_end(&mut answer)).await,
        Ok(Ok(_)) if answer.starts_with(b"HTTP/1.1 200")
    )
}

/// The only client slot, with a head timeout of 300 ms (`Proxy::with_idle_timeout`; 30 s
/// by default). The slot of a closed connection whose client keeps its socket open is held
/// while the proxy lingers: 300 ms without a byte here (`lingering_timeout`, 5 s by
/// default), so that the next connection is not served 5 s later for no other reason.
async fn one_slot_short_head_timeout() -> (common::Upstream, common::ProxyHandle) {
    let upstream = start_upstream().await;
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{}\nconnections: {{ max_client: 1, lingering_timeout: 300ms }}\n{ROUTES}",
        upstream.addr
    );
    let proxy = common::start_proxy_tuned(&text, None, |proxy| {
        proxy.with_idle_timeout(Duration::from_millis(300))
    })
    .await;
    (upstream, proxy)
}

/// A connection that sends nothing is closed once the head timeout passes from its
/// accept, before any protocol is known, so it cannot hold a `max_client` slot; so is one
/// to the admin port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_nothing_is_closed_and_frees_its_client_slot() {
    let (_upstream, proxy) = one_slot_short_head_timeout().await;
    let mut silent = TcpStream::connect(proxy.addr).await.unwrap();
    let mut admin = TcpStream::connect(proxy.admin).await.unwrap();
    assert!(
        closed_by_the_proxy(&mut silent).await,
        "a silent connection is still open after 10 s (head timeout 300 ms)"
    );
    assert!(served_within(proxy.addr, Duration::from_secs(10)).await);
    assert!(
        closed_by_the_proxy(&mut admin).await,
        "a silent admin connection is still open after 10 s (head timeout 300 ms)"
    );
}

/// A client that starts a request head and sends no more (slowloris) is closed without an
/// answer, but not at the head timeout: a head already begun gets the graceful close's
/// grace (one head timeout more) to finish, so the first head of a connection has twice the
/// timeout in all; one begun after a kept-alive answer is closed at the timeout, as hyper
/// closes a connection between requests at once. The README's numbers are these, at 30 s.
/// Only lower bounds are checked: timing decides no pass, a slow machine closes later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_request_head_gets_the_head_timeout_and_its_grace() {
    let (_upstream, proxy) = one_slot_short_head_timeout().await;
    let started = std::time::Instant::now();
    let mut first = TcpStream::connect(proxy.addr).await.unwrap();
    first
        .write_all(b"POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: slow\r\n")
        .await
        .unwrap();
    assert!(closed_by_the_proxy(&mut first).await, "hang guard");
    // Lower bounds only: a slow machine makes the close later, never earlier.
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "closed before the grace: {:?}",
        started.elapsed()
    );
    drop(first); // frees its slot, held while the proxy lingers

    let mut kept = TcpStream::connect(proxy.addr).await.unwrap();
    assert!(get_on(&mut kept, "/plain/a").await.contains("200"));
    let answered = std::time::Instant::now();
    kept.write_all(b"POST /orders HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    assert!(closed_by_the_proxy(&mut kept).await, "hang guard");
    let after = answered.elapsed();
    // From the answer's end as the proxy saw it, a little before the client read it.
    assert!(after >= Duration::from_millis(250), "{after:?}");
}

/// A connection that sends the start of the HTTP/2 preface and then nothing (the protocol
/// is still being chosen) is closed at the head timeout and frees its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_stuck_in_the_http2_preface_is_closed_and_frees_its_client_slot() {
    let (_upstream, proxy) = one_slot_short_head_timeout().await;
    let mut stuck = TcpStream::connect(proxy.addr).await.unwrap();
    stuck.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    assert!(
        closed_by_the_proxy(&mut stuck).await,
        "a partial preface is still open after 10 s (head timeout 300 ms)"
    );
    assert!(served_within(proxy.addr, Duration::from_secs(10)).await);
}

/// An HTTP/2 connection that sends its preface and SETTINGS and then no request is closed
/// when it has had no open stream for the head timeout (with a GOAWAY), as an idle
/// HTTP/1.1 connection is, and frees its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_without_a_request_is_closed_and_frees_its_client_slot() {
    let (_upstream, proxy) = one_slot_short_head_timeout().await;
    let mut idle = TcpStream::connect(proxy.addr).await.unwrap();
    idle.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    assert!(
        closed_by_the_proxy(&mut idle).await,
        "an idle HTTP/2 connection is still open after 10 s (head timeout 300 ms)"
    );
    assert!(served_within(proxy.addr, Duration::from_secs(10)).await);
}
