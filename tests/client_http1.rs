//! HTTP/1.1 client connections over raw TCP: pipelining, split reads, how answers are
//! framed, problem answers on a kept connection, idle closes and a late HTTP/2 preface.

mod common;

use std::time::Duration;

use common::{start_proxy, start_upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ROUTES: &str = r#"
routes:
  - name: orders
    match: { methods: [POST], path: "/orders" }
    key: { header: Idempotency-Key, required: true }
  - name: rest
    match: { path: "/*" }
    idempotency: off
"#;

/// Writes `requests` in one go on one connection and reads until the proxy closes it (the
/// last request says `Connection: close`). The 30 s bound is a hang guard only.
async fn exchange(addr: std::net::SocketAddr, parts: &[&[u8]]) -> String {
    String::from_utf8_lossy(&exchange_bytes(addr, parts).await).into_owned()
}

async fn exchange_bytes(addr: std::net::SocketAddr, parts: &[&[u8]]) -> Vec<u8> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    for part in parts {
        stream.write_all(part).await.unwrap();
        // Separate writes arrive as separate reads on loopback once the proxy has read.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("hang guard: the proxy neither answered nor closed")
        .unwrap();
    answer
}

fn post(key: &str, body: &str, extra: &str) -> Vec<u8> {
    format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Status lines of the answers in `raw`, in order.
fn statuses(raw: &str) -> Vec<&str> {
    raw.match_indices("HTTP/1.1 ")
        .map(|(at, _)| &raw[at + 9..at + 12])
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    // Two requests with a length, a chunked one, then a repeat of the first: all in one
    // write, so each is parsed from what the previous one left in the read buffer.
    let mut all = post("p1", r#"{"n":1}"#, "");
    all.extend(post("p2", r#"{"n":2}"#, ""));
    all.extend_from_slice(
        b"POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: p3\r\ntransfer-encoding: chunked\r\n\r\n7\r\n{\"n\":3}\r\n0\r\n\r\n",
    );
    all.extend(post("p1", r#"{"n":1}"#, "connection: close\r\n"));
    let raw = exchange(proxy.addr, &[&all]).await;
    assert_eq!(statuses(&raw), ["201", "201", "201", "201"], "{raw}");
    let bodies: Vec<usize> = ["\\\"n\\\":1", "\\\"n\\\":2", "\\\"n\\\":3"]
        .iter()
        .map(|b| raw.find(b).unwrap_or_else(|| panic!("{b} missing: {raw}")))
        .collect();
    assert!(bodies[0] < bodies[1] && bodies[1] < bodies[2], "{raw}");
    assert_eq!(upstream.executed(), 3, "p1 twice is one execution");
    assert!(raw.contains("idempotent-replayed: true"), "{raw}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_or_body_split_over_reads_is_served_whole() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let request = post("split", r#"{"split":true}"#, "connection: close\r\n");
    let head_end = request.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    // The head in two pieces.
    let raw = exchange(proxy.addr, &[&request[..20], &request[20..]]).await;
    assert_eq!(statuses(&raw), ["201"], "{raw}");
    // The head, then the body later.
    let again = post("split2", r#"{"split":true}"#, "connection: close\r\n");
    let raw = exchange(proxy.addr, &[&again[..head_end], &again[head_end..]]).await;
    assert_eq!(statuses(&raw), ["201"], "{raw}");
    assert!(
        raw.contains(r#"{\"split\":true}"#),
        "the whole body arrived: {raw}"
    );
    assert_eq!(upstream.executed(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_framed_and_dated() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    // A streamed answer of unknown length goes out chunked, byte for byte.
    let n = 200_000;
    let raw = exchange_bytes(
        proxy.addr,
        &[
            format!("GET /download?bytes={n} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        ],
    )
    .await;
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(head.contains("\r\ndate: "), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    let mut rest = &raw[head_end..];
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16).unwrap();
        rest = &rest[line_end + 2..];
        if size == 0 {
            assert_eq!(rest, b"\r\n", "no trailers, then the end");
            break;
        }
        body.extend_from_slice(&rest[..size]);
        assert_eq!(&rest[size..size + 2], b"\r\n");
        rest = &rest[size + 2..];
    }
    assert_eq!(body, common::pattern_bytes(n));

    // HEAD: the length, no body; the next request on the connection still parses.
    let raw = exchange(
        proxy.addr,
        &[b"HEAD /anything HTTP/1.1\r\nhost: x\r\n\r\nGET /anything HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"],
    )
    .await;
    assert_eq!(statuses(&raw), ["200", "200"], "{raw}");
    let first = &raw[..raw[9..].find("HTTP/1.1").unwrap() + 9];
    assert!(
        first.to_ascii_lowercase().contains("content-length: "),
        "{first}"
    );
    assert!(
        first.ends_with("\r\n\r\n"),
        "no body after a HEAD answer: {first}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn problem_answers_keep_the_connection_and_close_closes_it() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    // No key on a route that requires one: 400 problem+json, and the connection stays.
    stream
        .write_all(b"POST /orders HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut buf = vec![0u8; 8192];
    let n = stream.read(&mut buf).await.unwrap();
    let first = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(first.starts_with("HTTP/1.1 400"), "{first}");
    assert!(first.contains("application/problem+json"), "{first}");
    stream
        .write_all(&post("after-problem", "{}", "connection: close\r\n"))
        .await
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut rest))
        .await
        .expect("hang guard")
        .unwrap();
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.starts_with("HTTP/1.1 201"), "{rest}");
    assert!(
        rest.to_ascii_lowercase().contains("connection: close"),
        "{rest}"
    );
    assert_eq!(upstream.executed(), 1);
}

/// A request refused for its head before its body was read (here a second `Host`), with a
/// request pipelined behind it: the refusal says `Connection: close` and the connection
/// ends after it (RFC 9112 §9.6), so the client knows the request behind was not processed.
/// The proxy's idle timeout (30 s) is longer than the hang guard (10 s): a connection
/// left open fails the test rather than closing by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_the_body_was_read_closes_the_connection() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let mut both = b"POST /orders HTTP/1.1\r\nhost: x\r\nhost: y\r\nidempotency-key: r1\r\ncontent-length: 2\r\n\r\n{}".to_vec();
    both.extend(post("behind-refusal", "{}", ""));
    stream.write_all(&both).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("hang guard: the connection stayed open after the refusal")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(statuses(&answer), ["400"], "{answer}");
    let head = &answer[..answer.find("\r\n\r\n").unwrap()].to_ascii_lowercase();
    assert!(head.contains("\r\nconnection: close"), "{head}");
    assert_eq!(upstream.executed(), 0);
}

/// A client that goes away while its request waits on the upstream cancels it, as hyper
/// did: the proxy drops the upstream connection at once instead of holding it (and a task)
/// until `upstream_timeout` (here 300 s; the 30 s bound is a hang guard only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_cancels_its_pass_through_request() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let (got_request, request_arrived) = tokio::sync::oneshot::channel();
    let (saw_close, upstream_closed) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request arrives");
            head.extend_from_slice(&buf[..n]);
        }
        got_request.send(()).unwrap();
        // Never answers; reads until the proxy closes its side.
        while stream.read(&mut buf).await.unwrap_or(0) > 0 {}
        saw_close.send(()).unwrap();
    });
    let routes = format!("defaults: {{ upstream_timeout: 300s }}\n{ROUTES}");
    let proxy = start_proxy(upstream, &routes).await;
    let mut client = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    client
        .write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    request_arrived.await.unwrap();
    drop(client);
    tokio::time::timeout(Duration::from_secs(30), upstream_closed)
        .await
        .expect("the upstream call went on after its client left")
        .unwrap();
}

/// A kept-alive connection with no new request for the idle timeout is closed, without an
/// answer (there is no request to answer); before that it serves request after request. The timeout
/// is 300 ms here (`Proxy::with_idle_timeout`); the 30 s bound is a hang guard only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_is_closed_quietly() {
    let upstream = start_upstream().await;
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{}\n{ROUTES}",
        upstream.addr
    );
    let proxy = common::start_proxy_tuned(&text, None, |proxy| {
        proxy.with_idle_timeout(Duration::from_millis(300))
    })
    .await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    // Two requests one after the other on the one connection: it was kept alive and
    // reusable before it went idle.
    for key in ["idle-1", "idle-2"] {
        stream.write_all(&post(key, "{}", "")).await.unwrap();
        let mut buf = vec![0u8; 8192];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 201"),
            "{key} served on the kept-alive connection"
        );
    }
    assert_eq!(upstream.executed_for("idle-1"), 1);
    assert_eq!(upstream.executed_for("idle-2"), 1);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut rest))
        .await
        .expect("hang guard: an idle connection was never closed")
        .unwrap();
    assert!(
        rest.is_empty(),
        "nothing is sent on an idle close: {rest:?}"
    );
}

/// An HTTP/2 preface opens a connection (RFC 9113 §3.3) and never follows a request:
/// once a connection has carried an HTTP/1.1 request, hyper-util's server has settled on
/// HTTP/1.1 for it, so the preface closes it instead of switching the connection to
/// HTTP/2, whose SETTINGS frame would follow the first answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_preface_after_a_request_does_not_switch_protocols() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let preface_and_settings: &[u8] =
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    let raw = exchange_bytes(
        proxy.addr,
        &[
            b"GET /first HTTP/1.1\r\nhost: x\r\n\r\n",
            preface_and_settings,
        ],
    )
    .await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let head_end = text.find("\r\n\r\n").unwrap() + 4;
    let after = &raw[head_end + common::content_length_of(&text[..head_end])..];
    // hyper's HTTP/1 connection sees the preface's prefix where a request line should be
    // and ends the connection without writing anything (hyper's `Conn::on_parse_error`
    // answers no 4xx to an HTTP/2 prefix): no answer, no SETTINGS frame, then the close
    // `exchange_bytes` read up to.
    assert!(
        after.is_empty(),
        "after the first answer: {:?}",
        String::from_utf8_lossy(after)
    );
}
