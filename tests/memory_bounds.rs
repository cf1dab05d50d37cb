//! Memory stays bounded by configuration, whatever clients and upstreams send: a body
//! buffered on a protected route costs about its bound (`max_body`, `max_answer`), even
//! when it comes as one-byte chunks, and all of them together stay within
//! `connections.max_buffered`. A counting allocator (this test binary's own) measures the
//! peak. The memory store's bounds are no lever for one caller against another's answers
//! either: one-time tokens, which anyone may ask for, hold only their own share of it.

#[path = "memory_bounds/address_share.rs"]
mod address_share;
mod common;
#[path = "memory_bounds/tokens.rs"]
mod tokens;

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Counts the bytes allocated now and the most ever allocated at once.
struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to `System` unchanged; the counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
        System.dealloc(p, layout)
    }
}

#[global_allocator]
static A: Counting = Counting;

/// The bound of every test: `max_body` and `max_answer` are `512KiB`.
const LIMIT: usize = 512 * 1024;

/// What a buffered body may cost the proxy, as a multiple of its bound: the buffer (under
/// twice what it holds, while it grows), and what it sends on.
const FACTOR: usize = 4;

/// What an answer stored for replay may cost, as a multiple of its bound: [`FACTOR`], and
/// the stored record (`StoredResponse::new` builds it in a `Vec`, then moves it into an
/// `Arc`, which copies it once).
const STORED_FACTOR: usize = FACTOR + 1;

/// hyper's buffers of the connections a request uses, whatever the bound: each may read
/// and write up to about 400 KiB at once, and a read buffer holding data not yet consumed
/// grows to about twice that.
const CONNECTION_BUFFERS: usize = 2 << 20;

/// Runs `test` alone on a runtime of its own, which is dropped (with every task and
/// server it started) before the next test runs: the allocator counts the whole process.
fn alone<F: Future>(test: F) -> F::Output {
    static ALONE: Mutex<()> = Mutex::new(());
    let _alone = ALONE.lock().unwrap_or_else(PoisonError::into_inner);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(test)
}

/// Starts counting: the peak from now on is measured against what is allocated now.
fn baseline() -> usize {
    let base = CURRENT.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    base
}

/// `n` bytes as `n` one-byte chunks, then the end.
fn one_byte_chunks(n: usize) -> Bytes {
    let mut out = Vec::with_capacity(n * 6 + 5);
    for _ in 0..n {
        out.extend_from_slice(b"1\r\nx\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out.into()
}

/// An upstream answering every request with `body` (chunked framing included) after its
/// head, then holding the connection open. The body is shared, not copied per answer.
async fn chunky_upstream(body: Bytes) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut seen = Vec::new();
                loop {
                    let Ok(k) = s.read(&mut buf).await else {
                        return;
                    };
                    if k == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..k]);
                    if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&seen[..end]).to_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                        while seen.len() < end + 4 + len {
                            let Ok(k) = s.read(&mut buf).await else {
                                return;
                            };
                            if k == 0 {
                                return;
                            }
                            seen.extend_from_slice(&buf[..k]);
                        }
                        break;
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n")
                    .await;
                let _ = s.write_all(&body).await;
                let _ = s.flush().await;
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    addr
}

/// Reads `r` to its end without keeping it: its first 200 bytes and its length.
async fn head_of(mut r: impl AsyncRead + Unpin) -> (String, usize) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut head = Vec::new();
    let mut len = 0;
    loop {
        let k = tokio::time::timeout(Duration::from_secs(60), r.read(&mut buf))
            .await
            .expect("hang guard")
            .unwrap();
        if k == 0 {
            break;
        }
        if head.len() < 200 {
            head.extend_from_slice(&buf[..k.min(200 - head.len())]);
        }
        len += k;
    }
    (String::from_utf8_lossy(&head).into_owned(), len)
}

/// A client's body of `max_body` sent as one-byte chunks is buffered (to derive its key) in
/// about `max_body`, not in a handle per chunk.
#[test]
fn a_request_body_in_one_byte_chunks_stays_near_max_body() {
    alone(async {
        let upstream = common::start_upstream().await;
        // `/upload` hashes the body as it streams in: the upstream holds none of it.
        let proxy = common::start_proxy(
            upstream.addr,
            r#"
defaults: { max_body: 512KiB }
routes:
  - name: upload
    match: { methods: [POST], path: /upload }
    key: { header: Idempotency-Key, required: true }
"#,
        )
        .await;
        let body = one_byte_chunks(LIMIT);
        let s = TcpStream::connect(proxy.addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let base = baseline();
        let (r, mut w) = s.into_split();
        // The test's copy is shared, not freed while the proxy reads: that would make room
        // under the peak.
        let sent = body.clone();
        let writer = tokio::spawn(async move {
            w.write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\nidempotency-key: chunky\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n").await.unwrap();
            w.write_all(&sent).await.unwrap();
            w
        });
        let (head, _) = head_of(r).await;
        let _w = writer.await.unwrap();
        let grown = PEAK.load(Ordering::SeqCst) - base;
        drop(body);
        eprintln!("answer: {head:?}; peak growth: {} KiB", grown >> 10);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.contains(&format!("\r\n\r\n{LIMIT} ")), "{head}");
        assert!(
            grown < FACTOR * LIMIT + CONNECTION_BUFFERS,
            "buffering a body of {} KiB took {} KiB",
            LIMIT >> 10,
            grown >> 10
        );
    })
}

/// Asks `proxy` (with `max_answer: 512KiB`) for an answer on a protected route: the head and
/// length of what its client got, and how much the process's peak allocation grew meanwhile.
async fn ask(proxy: std::net::SocketAddr) -> (String, usize, usize) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let base = baseline();
    s.write_all(b"POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: chunky\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}").await.unwrap();
    let (head, len) = head_of(&mut s).await;
    let grown = PEAK.load(Ordering::SeqCst) - base;
    eprintln!("answer: {head:?}; peak growth: {} KiB", grown >> 10);
    (head, len, grown)
}

const ANSWER_ROUTE: &str = r#"
defaults: { max_answer: 512KiB }
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
"#;

/// An upstream's answer of `max_answer` sent as one-byte chunks is buffered (to be stored
/// and replayed) in about `max_answer`, not in a handle per chunk.
#[test]
fn an_answer_in_one_byte_chunks_stays_near_max_answer() {
    alone(async {
        let upstream = chunky_upstream(one_byte_chunks(LIMIT)).await;
        let proxy = common::start_proxy(upstream, ANSWER_ROUTE).await;
        let (head, len, grown) = ask(proxy.addr).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            head.contains(&format!("content-length: {LIMIT}\r\n")),
            "{head}"
        );
        assert!(len > LIMIT, "the whole answer came: {len} bytes");
        assert!(
            grown < STORED_FACTOR * LIMIT + CONNECTION_BUFFERS,
            "buffering and storing an answer of {} KiB took {} KiB",
            LIMIT >> 10,
            grown >> 10
        );
    })
}

/// An upstream's answer larger than `max_answer`, sent as one-byte chunks, holds about
/// `max_answer` before it streams on (the part read first), however long it is.
#[test]
fn a_larger_answer_in_one_byte_chunks_holds_near_max_answer() {
    alone(async {
        let upstream = chunky_upstream(one_byte_chunks(LIMIT + LIMIT / 4)).await;
        let proxy = common::start_proxy(upstream, ANSWER_ROUTE).await;
        let (head, len, grown) = ask(proxy.addr).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            len > LIMIT + LIMIT / 4,
            "the whole answer came: {len} bytes"
        );
        assert!(
            grown < FACTOR * LIMIT + CONNECTION_BUFFERS,
            "an answer past {} KiB held {} KiB",
            LIMIT >> 10,
            grown >> 10
        );
    })
}

/// Clients that declare a body of `max_body` and then send two bytes of it, one at a time,
/// and stall (a slowloris of bodies: one byte per `body_read_timeout` keeps it going)
/// make the proxy hold about what they sent, not `max_body` each: the buffer grows with
/// the data, the declared length only caps it. Otherwise a few bytes per connection (or
/// per HTTP/2 stream) would make it allocate `max_body` for each.
#[test]
fn a_stalled_body_holds_about_what_it_sent_not_its_declared_length() {
    const CLIENTS: usize = 16;
    alone(async {
        let upstream = common::start_upstream().await;
        let proxy = common::start_proxy(
            upstream.addr,
            r#"
defaults: { max_body: 512KiB }
routes:
  - name: upload
    match: { methods: [POST], path: /upload }
    key: { header: Idempotency-Key, required: true }
"#,
        )
        .await;
        let mut clients = Vec::new();
        for _ in 0..CLIENTS {
            clients.push(TcpStream::connect(proxy.addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let base = baseline();
        for (i, client) in clients.iter_mut().enumerate() {
            let head = format!("POST /upload HTTP/1.1\r\nhost: x\r\nidempotency-key: stalled-{i}\r\ncontent-length: {LIMIT}\r\n\r\nx");
            client.write_all(head.as_bytes()).await.unwrap();
        }
        // The second byte as a frame of its own.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for client in &mut clients {
            client.write_all(b"x").await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let held = CURRENT.load(Ordering::SeqCst).saturating_sub(base);
        eprintln!(
            "{CLIENTS} stalled bodies of 2 bytes hold {} KiB",
            held >> 10
        );
        assert!(
            held < CLIENTS * LIMIT / 8,
            "{CLIENTS} bodies of 2 bytes declared as {} KiB hold {} KiB",
            LIMIT >> 10,
            held >> 10
        );
        drop(clients);
    })
}

/// Routes of the buffer budget's tests: `/orders` keyed by `Idempotency-Key`, with all
/// requests together buffering at most `max_buffered` (`max_body` and `max_answer` keep
/// their defaults, far above it), and one connection as much (no share of its own: what
/// these tests hold up is the total; tests/h2_abuse holds one connection to its share).
fn budget_routes(max_buffered: &str) -> String {
    format!(
        r#"
connections: {{ max_buffered: {max_buffered}, max_buffered_per_connection: {max_buffered} }}
routes:
  - name: orders
    match: {{ methods: [POST], path: /orders }}
    key: {{ header: Idempotency-Key, required: true }}
"#
    )
}

/// Waits until the proxy buffers nothing (hang guard: 30 s).
async fn budget_drains(proxy: &common::ProxyHandle) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while proxy.metric("idemgate_buffered_bytes") > 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: buffered bytes never went back to 0"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `connections.max_buffered` bounds what all requests together buffer: while two
/// clients hold most of it with bodies they have half sent, concurrent uploads that do not
/// fit get `503 overloaded` with `Retry-After`, before their keys are claimed or anything
/// is sent (the upstream runs none of them); once the room is back, the proxy serves
/// again, and a refused request's retry runs (its key was never claimed).
#[test]
fn uploads_beyond_the_buffer_budget_get_503_overloaded_and_run_nothing() {
    const BODY: usize = 100 * 1024;
    alone(async {
        let upstream = common::start_upstream().await;
        let proxy = common::start_proxy(upstream.addr, &budget_routes("256KiB")).await;
        // Two clients send 100 KiB of a declared 120 KiB body, and stall.
        let mut holders = Vec::new();
        for i in 0..2 {
            let mut s = TcpStream::connect(proxy.addr).await.unwrap();
            let head = format!(
                "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: holder-{i}\r\ncontent-length: {}\r\n\r\n",
                BODY + 20 * 1024
            );
            s.write_all(head.as_bytes()).await.unwrap();
            s.write_all(&vec![b'h'; BODY]).await.unwrap();
            holders.push(s);
        }
        proxy
            .metric_reaches("idemgate_buffered_bytes", (2 * BODY) as f64)
            .await;
        assert_eq!(proxy.metric("idemgate_buffered_limit_bytes"), 262_144.0);
        let body = "x".repeat(BODY);
        let uploads: Vec<_> = (0..4)
            .map(|i| {
                let (addr, body) = (proxy.addr, body.clone());
                tokio::spawn(async move {
                    let key = format!("upload-{i}");
                    common::post(addr, "/orders", &[("idempotency-key", &key)], &body).await
                })
            })
            .collect();
        for upload in uploads {
            let answer = upload.await.unwrap();
            assert_eq!(answer.status, 503, "{:?}", answer.body);
            assert_eq!(answer.json()["type"], "urn:idemgate:problem:overloaded");
            assert_eq!(answer.headers["retry-after"], "1");
        }
        assert_eq!(upstream.executed(), 0, "a refused upload ran upstream");
        assert_eq!(
            proxy.metric(r#"idemgate_buffer_refusals_total{what="request_body"}"#),
            4.0
        );
        // The holders leave: their bytes come back, and the proxy serves again.
        drop(holders);
        budget_drains(&proxy).await;
        let retried = common::post(
            proxy.addr,
            "/orders",
            &[("idempotency-key", "upload-0")],
            &body,
        )
        .await;
        assert_eq!(retried.status, 201, "{:?}", retried.body);
        assert_eq!(upstream.executed_for("upload-0"), 1);
        let small =
            common::post(proxy.addr, "/orders", &[("idempotency-key", "small")], "{}").await;
        assert_eq!(small.status, 201);
        assert_eq!(upstream.executed(), 2);
        budget_drains(&proxy).await;
    })
}

/// An owner's answer the budget has no room for (under `max_answer`, over
/// `max_buffered`) never fails its exchange, since the request ran: it streams whole to its
/// client, and the key records "executed, answer not stored", so a duplicate that waited
/// for it, and a later one, get `409 answer-not-stored`, never a second run.
#[test]
fn an_answer_over_the_buffer_budget_streams_on_and_is_never_run_again() {
    const ANSWER: usize = 400_000;
    alone(async {
        let upstream = common::start_upstream().await;
        let proxy = common::start_proxy(upstream.addr, &budget_routes("128KiB")).await;
        let bytes = ANSWER.to_string();
        let headers = [
            ("idempotency-key", "big"),
            ("x-test-bytes", bytes.as_str()),
            ("x-test-gate", "big"),
        ];
        let owner = {
            let (addr, bytes) = (proxy.addr, bytes.clone());
            tokio::spawn(async move {
                let headers = [
                    ("idempotency-key", "big"),
                    ("x-test-bytes", bytes.as_str()),
                    ("x-test-gate", "big"),
                ];
                common::post(addr, "/orders", &headers, "{}").await
            })
        };
        upstream.arrived("big", 1).await;
        let duplicate = {
            let (addr, bytes) = (proxy.addr, bytes.clone());
            tokio::spawn(async move {
                let headers = [
                    ("idempotency-key", "big"),
                    ("x-test-bytes", bytes.as_str()),
                    ("x-test-gate", "big"),
                ];
                common::post(addr, "/orders", &headers, "{}").await
            })
        };
        proxy.metric_reaches("idemgate_waiting", 1.0).await;
        upstream.open("big");
        let owner = owner.await.unwrap();
        assert_eq!(owner.status, 201);
        assert_eq!(owner.body.len(), ANSWER, "the whole answer streamed on");
        assert!(owner.body.iter().all(|b| *b == b'x'));
        let duplicate = duplicate.await.unwrap();
        assert_eq!(duplicate.status, 409, "{:?}", duplicate.body);
        assert_eq!(
            duplicate.json()["type"],
            "urn:idemgate:problem:answer-not-stored"
        );
        let later = common::post(proxy.addr, "/orders", &headers, "{}").await;
        assert_eq!(later.status, 409);
        assert_eq!(
            later.json()["type"],
            "urn:idemgate:problem:answer-not-stored"
        );
        assert_eq!(upstream.executed_for("big"), 1, "the request ran again");
        assert!(proxy.metric(r#"idemgate_buffer_refusals_total{what="answer"}"#) >= 1.0);
        assert_eq!(
            proxy
                .metric(r#"idemgate_requests_total{route="orders",outcome="executed_not_stored"}"#),
            1.0
        );
        budget_drains(&proxy).await;
    })
}
