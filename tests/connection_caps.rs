//! `connections.max_client` and `connections.max_upstream`: over the client cap a new
//! connection waits while the others are served; over the upstream cap requests wait for
//! a connection, the upstream never sees more than the cap, and a request that waited past
//! its timeout for a connection never went out (502, key released, not 504).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{metric, post, start_proxy, start_upstream};
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
/// by default).
async fn one_slot_short_head_timeout() -> (common::Upstream, common::ProxyHandle) {
    let upstream = start_upstream().await;
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{}\nconnections: {{ max_client: 1 }}\n{ROUTES}",
        upstream.addr
    );
    let proxy = common::start_proxy_tuned(&text, None, |proxy| {
        proxy.with_idle_timeout(Duration::from_millis(300))
    })
    .await;
    (upstream, proxy)
}

/// Waits for the proxy to close `stream`, reading and dropping what it sends first (such
/// as HTTP/2 SETTINGS); false if it is still open after the 10 s hang guard.
async fn closed_by_the_proxy(stream: &mut TcpStream) -> bool {
    let mut buf = vec![0u8; 4096];
    let closed = async {
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .is_ok()
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

/// The server's first SETTINGS frame on a cleartext HTTP/2 connection, as (id, value)
/// pairs (RFC 9113 §6.5.1).
async fn server_settings(addr: SocketAddr) -> Vec<(u16, u32)> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    loop {
        let mut head = [0u8; 9];
        stream.read_exact(&mut head).await.unwrap();
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0; len];
        stream.read_exact(&mut payload).await.unwrap();
        // SETTINGS, not the ACK of ours.
        if head[3] == 4 && head[4] & 1 == 0 {
            return payload
                .chunks_exact(6)
                .map(|s| {
                    let id = u16::from_be_bytes([s[0], s[1]]);
                    (id, u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
                })
                .collect();
        }
    }
}

/// `connections.max_streams` is what an HTTP/2 client is told it may have open at once
/// (`SETTINGS_MAX_CONCURRENT_STREAMS`, id 3): 128 by default, as nginx, rather than
/// hyper's 200, so memory is bounded by settings a user sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_are_told_max_streams() {
    const MAX_CONCURRENT_STREAMS: u16 = 3;
    let upstream = start_upstream().await;
    for (yaml, expected) in [("", 128), ("connections: { max_streams: 7 }\n", 7)] {
        let proxy = start_proxy(upstream.addr, yaml).await;
        let settings = server_settings(proxy.addr).await;
        assert!(
            settings.contains(&(MAX_CONCURRENT_STREAMS, expected)),
            "{yaml:?}: {settings:?}"
        );
    }
}

/// An HTTP/2 frame: the 9-byte header, then `payload` (RFC 9113 §4.1).
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// A header block of HPACK "literal without indexing, new name" fields (RFC 7541
/// §6.2.2), for names and values under 127 bytes.
fn h2_fields(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0);
        out.push(name.len() as u8);
        out.extend(name.as_bytes());
        out.push(value.len() as u8);
        out.extend(value.as_bytes());
    }
    out
}

/// The start of a cleartext HTTP/2 connection whose client opens every stream's window at
/// `window` bytes (`SETTINGS_INITIAL_WINDOW_SIZE`) and never sends a WINDOW_UPDATE.
fn h2_hello(window: u32) -> Vec<u8> {
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let mut setting = vec![0, 4];
    setting.extend(window.to_be_bytes());
    hello.extend(h2_frame(4, 0, 0, &setting));
    hello
}

/// A POST of `{}` to `/orders` with `key` (and `extra` fields) on `stream`: HEADERS
/// (END_HEADERS), then DATA (END_STREAM).
fn h2_post(stream: u32, key: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut fields = vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/orders"),
        (":authority", "x"),
        ("idempotency-key", key),
        ("content-length", "2"),
    ];
    fields.extend_from_slice(extra);
    let mut out = h2_frame(1, 0x4, stream, &h2_fields(&fields));
    out.extend(h2_frame(0, 0x1, stream, b"{}"));
    out
}

/// A client whose windows stay at zero asks for a replay of `key`'s stored answer on
/// stream 1: it can take nothing of it.
async fn h2_client_taking_nothing(addr: SocketAddr, key: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut hello = h2_hello(0);
    hello.extend(h2_post(1, key, &[]));
    stream.write_all(&hello).await.unwrap();
    stream
}

/// An HTTP/2 client whose flow-control window stays at zero takes nothing of its answer,
/// as an HTTP/1.1 client that does not read: its connection is closed once
/// `client_send_timeout` passes, and frees its `max_client` slot (hyper holds the answer's
/// one frame waiting for window, so neither the socket nor the body shows the wait unless
/// the answer's last frame counts as handed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_whose_window_stays_zero_is_closed_after_the_send_timeout() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &format!("connections: {{ max_client: 1, client_send_timeout: 1s }}\n{ROUTES}"),
    )
    .await;
    // The answer is stored first, so the stuck client's is a replay.
    let first = post(proxy.addr, "/orders", &[("idempotency-key", "stuck")], "{}").await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    let mut stuck = h2_client_taking_nothing(proxy.addr, "stuck").await;
    // Well within the head timeout (30 s): only the send timeout can close it this soon.
    assert!(
        closed_by_the_proxy(&mut stuck).await,
        "an HTTP/2 client taking nothing is still served after 10 s (client_send_timeout 1 s)"
    );
    assert!(served_within(proxy.addr, Duration::from_secs(10)).await);
}

/// An HTTP/2 client whose window lets one byte through, then never opens again, takes
/// nothing more of its answer, even while another of its requests stays open (here held by
/// the upstream; a slow upload does the same): its connection is closed once
/// `client_send_timeout` passes. An answer handed to hyper as one frame is queued whole in
/// the HTTP/2 connection, where nothing sees it wait, and stays there as long as the
/// connection has a request open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_that_stops_taking_an_answer_is_closed_while_another_request_is_open() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &format!("connections: {{ max_client: 1, client_send_timeout: 1s }}\n{ROUTES}"),
    )
    .await;
    let first = post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "large"), ("x-test-bytes", "200000")],
        "{}",
    )
    .await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    let mut stuck = TcpStream::connect(proxy.addr).await.unwrap();
    let mut hello = h2_hello(1);
    hello.extend(h2_post(1, "held", &[("x-test-gate", "held")]));
    stuck.write_all(&hello).await.unwrap();
    upstream.arrived("held", 1).await;
    stuck
        .write_all(&h2_post(3, "large", &[("x-test-bytes", "200000")]))
        .await
        .unwrap();
    // Well within the head timeout (30 s): only the send timeout can close it this soon.
    let closed = closed_by_the_proxy(&mut stuck).await;
    upstream.open("held");
    assert!(
        closed,
        "an HTTP/2 client taking nothing is still served after 10 s (client_send_timeout 1 s)"
    );
    assert!(served_within(proxy.addr, Duration::from_secs(10)).await);
}

/// A protected request whose client left before a connection took it never went out: its
/// owner stops there and frees its key, rather than waiting on, detached, for a
/// connection. Otherwise clients that send a request and leave at once (or reset their
/// HTTP/2 stream: a rapid reset) pile up owners, each holding its buffered body (up to
/// `max_body`) and a claim in the store, past every bound on clients (`max_client` ×
/// `max_streams`), for `upstream_timeout` each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_whose_clients_left_before_their_request_went_out_do_not_pile_up() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &format!("connections: {{ max_client: 1, max_streams: 1, max_upstream: 1 }}\n{ROUTES}"),
    )
    .await;
    // One request holds the only upstream connection; its client leaves, and its owner
    // runs on, as it must: its request went out.
    let mut held = TcpStream::connect(proxy.addr).await.unwrap();
    held.write_all(&common::raw_post(
        "/orders",
        &["idempotency-key: held", "x-test-gate: held"],
        "{}",
    ))
    .await
    .unwrap();
    upstream.arrived("held", 1).await;
    drop(held);
    const LEFT: usize = 8;
    for i in 0..LEFT {
        // Served once the previous connection closed (`max_client: 1`).
        let mut client = TcpStream::connect(proxy.addr).await.unwrap();
        client
            .write_all(&common::raw_post(
                "/orders",
                &[&format!("idempotency-key: left-{i}")],
                "{}",
            ))
            .await
            .unwrap();
        proxy
            .metric_reaches("idemgate_upstream_connections_waited_total", (i + 1) as f64)
            .await;
        drop(client);
    }
    // The held owner, and at most the last one, not yet seen to be left.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut owners = proxy.metric("idemgate_in_flight");
    while owners > 2.0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        owners = proxy.metric("idemgate_in_flight");
    }
    upstream.open("held");
    assert!(
        owners <= 2.0,
        "{owners} owners run, {LEFT} of them for clients that left before their request went out \
         (max_client 1, max_streams 1)"
    );
}
