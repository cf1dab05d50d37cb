//! HTTP/2 clients against the connection bounds: told `max_streams`; a window left shut,
//! an answer no longer taken while another request is open, and owners whose clients left
//! before their request went out, each closed or stopped so nothing is held for good.

use super::*;

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
/// the answer's last frame counts as handed). The proxy lingers 300 ms on the closed
/// connection, whose client keeps its socket, before its slot is free (5 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_whose_window_stays_zero_is_closed_after_the_send_timeout() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &format!("connections: {{ max_client: 1, client_send_timeout: 1s, lingering_timeout: 300ms }}\n{ROUTES}"),
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
        &format!("connections: {{ max_client: 1, client_send_timeout: 1s, lingering_timeout: 300ms }}\n{ROUTES}"),
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
        &format!("connections: {{ max_client: 2, max_streams: 1, max_upstream: 1 }}\n{ROUTES}"),
    )
    .await;
    // One request holds the only upstream connection; its client leaves, and its owner
    // runs on, as it must: its request went out (its connection keeps one of the two client
    // slots meanwhile).
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
        // Served once the previous connection closed (the other slot of `max_client: 2`).
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
         (max_client 2, max_streams 1)"
    );
}
