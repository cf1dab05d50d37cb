//! `Expect: 100-continue` on protected routes (RFC 9110 §10.1.1): a request its head alone
//! refuses gets that final answer instead of `100 Continue`, so the client never sends the
//! body; the connection then ends, and what the client sends after is never read as a
//! request. A request the head does not refuse gets `100 Continue`, then its answer.
//!
//! Raw TCP throughout: what matters is which bytes come before the body is sent.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{content_length_of, post, start_proxy, start_upstream};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ROUTES: &str = r#"
tokens: { ttl: 5m }
defaults: { max_body: 64KiB }
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
  - name: pay
    match: { methods: [POST], path: /orders/pay }
    key: { token: { header: Idempotency-Token } }
  - name: fresh
    match: { methods: [POST], path: /orders/fresh }
    key: { header: Idempotency-Key, required: true }
    fresh: { header: X-Timestamp, max_age: 5m, skew: 30s }
"#;

/// A head with `Expect: 100-continue` announcing `length` bytes of body.
fn expecting(path: &str, fields: &str, length: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{fields}\
         expect: 100-continue\r\ncontent-length: {length}\r\n\r\n"
    )
}

/// Reads one answer head, byte by byte so nothing after it is taken (the 10 s bound is a
/// hang guard only: the test sends no body before it has this head).
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(10), async {
        while !head.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
    })
    .await
    .expect("hang guard: no answer head before the body was sent");
    String::from_utf8_lossy(&head).into_owned()
}

/// Reads the body of the answer whose head is `head`.
async fn read_body(stream: &mut TcpStream, head: &str) -> Vec<u8> {
    let mut body = vec![0u8; content_length_of(head)];
    stream.read_exact(&mut body).await.unwrap();
    body
}

/// Everything the proxy still sends until it ends the connection (hang guard: 30 s).
async fn read_rest(stream: &mut TcpStream) -> String {
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut rest))
        .await
        .expect("hang guard: the proxy kept the connection open")
        .expect("the proxy ended the connection with a reset");
    String::from_utf8_lossy(&rest).into_owned()
}

fn unix_seconds(ago: Duration) -> u64 {
    (SystemTime::now() - ago)
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Each head the route refuses whatever the body: the final answer is the first thing the
/// proxy writes, problem+json, saying `Connection: close`. The body the client sends after
/// it anyway is a whole request with a good key: it is never read as one (no second
/// answer, nothing executed), and the connection ends. Nothing is claimed either: the key
/// of the stale request executes afterwards as a first request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_the_route_refuses_gets_its_answer_instead_of_100_continue() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let stale = format!(
        "idempotency-key: stale-1\r\nx-timestamp: {}\r\n",
        unix_seconds(Duration::from_secs(3600))
    );
    let smuggled = "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: smuggled\r\n\
                    content-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    let cases: [(&str, &str, usize, u16, &str); 7] = [
        ("/orders", "", smuggled.len(), 400, "key-invalid"),
        (
            "/orders",
            "idempotency-key: has space\r\n",
            smuggled.len(),
            400,
            "key-invalid",
        ),
        (
            "/orders",
            "idempotency-key: a\r\nidempotency-key: b\r\n",
            smuggled.len(),
            400,
            "key-invalid",
        ),
        ("/orders/pay", "", smuggled.len(), 400, "key-invalid"),
        (
            "/orders/pay",
            "idempotency-token: not-an-issued-token\r\n",
            smuggled.len(),
            400,
            "token-invalid",
        ),
        (
            "/orders/fresh",
            &stale,
            smuggled.len(),
            400,
            "stale-request",
        ),
        (
            "/orders",
            "idempotency-key: big\r\n",
            70 * 1024,
            413,
            "payload-too-large",
        ),
    ];
    for (path, fields, length, status, kind) in cases {
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        let head = expecting(path, fields, length);
        stream.write_all(head.as_bytes()).await.unwrap();
        let answer = read_head(&mut stream).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{path} {fields:?}: {answer}"
        );
        let lower = answer.to_ascii_lowercase();
        assert!(lower.contains("connection: close"), "{kind}: {answer}");
        assert!(
            lower.contains("content-type: application/problem+json"),
            "{kind}: {answer}"
        );
        let problem: serde_json::Value =
            serde_json::from_slice(&read_body(&mut stream, &answer).await).unwrap();
        assert_eq!(problem["type"], format!("urn:idemgate:problem:{kind}"));
        // The client sends its body after all (as curl does after its wait): the proxy
        // may already have closed, so a failed write is no failure.
        let _ = stream.write_all(smuggled.as_bytes()).await;
        let rest = read_rest(&mut stream).await;
        assert_eq!(rest, "", "{kind}: the body was read as a request");
    }
    assert_eq!(upstream.executed(), 0);
    let now = format!("{}", unix_seconds(Duration::ZERO));
    let a = post(
        proxy.addr,
        "/orders/fresh",
        &[("idempotency-key", "stale-1"), ("x-timestamp", &now)],
        "{}",
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert!(!a.replayed(), "the refused request claimed its key");
    assert_eq!(upstream.executed(), 1);
}

/// A good head gets `100 Continue`, then, once its body is sent, its answer; it runs once,
/// and its repeat on the same connection (also expecting) is a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_head_gets_100_continue_then_its_answer_and_runs_once() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    let body = r#"{"sku":"A1"}"#;
    for round in 0..2 {
        let head = expecting("/orders", "idempotency-key: go-1\r\n", body.len());
        stream.write_all(head.as_bytes()).await.unwrap();
        let interim = read_head(&mut stream).await;
        assert_eq!(interim, "HTTP/1.1 100 Continue\r\n\r\n", "round {round}");
        stream.write_all(body.as_bytes()).await.unwrap();
        let answer = read_head(&mut stream).await;
        assert!(
            answer.starts_with("HTTP/1.1 201 "),
            "round {round}: {answer}"
        );
        let replayed = answer
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true");
        assert_eq!(replayed, round == 1, "round {round}: {answer}");
        read_body(&mut stream, &answer).await;
    }
    assert_eq!(upstream.executed(), 1);
}

/// The buffers all requests may hold are full (another client's head and half its body):
/// a head announcing a body gets `503 overloaded` at once instead of `100 Continue`, since
/// neither it nor the body finds room, and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_whose_body_would_find_no_buffer_room_gets_503_instead_of_100_continue() {
    let upstream = start_upstream().await;
    let routes = format!(
        "connections: {{ max_buffered: 1KiB, max_buffered_per_connection: 1KiB }}\n{ROUTES}"
    );
    let proxy = start_proxy(upstream.addr, &routes).await;
    // Its head, and as much of its 2 KiB body as the budget has room for after it, fill
    // the budget until this connection ends.
    let mut filler = TcpStream::connect(proxy.addr).await.unwrap();
    let head = "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: filler\r\n\
                content-type: application/json\r\ncontent-length: 2048\r\n\r\n";
    filler.write_all(head.as_bytes()).await.unwrap();
    proxy.metric_reaches("idemgate_buffered_bytes", 1.0).await;
    let head = proxy.metric("idemgate_buffered_bytes") as usize;
    filler.write_all(&vec![b' '; 1024 - head]).await.unwrap();
    proxy
        .metric_reaches("idemgate_buffered_bytes", 1024.0)
        .await;

    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    let head = expecting("/orders", "idempotency-key: late\r\n", 10);
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_head(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"));
    let problem: serde_json::Value =
        serde_json::from_slice(&read_body(&mut stream, &answer).await).unwrap();
    assert_eq!(problem["type"], "urn:idemgate:problem:overloaded");
    let _ = stream.write_all(b"{\"a\":123}").await;
    assert_eq!(read_rest(&mut stream).await, "");
    drop(filler);
    assert_eq!(upstream.executed(), 0);
}
