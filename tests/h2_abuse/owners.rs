//! Owners whose clients left after their request went out run on (SPEC 5), and count
//! against the connection that started them until they end: a client that sends whole
//! requests and resets their streams at once (a rapid reset of requests already read), or
//! closes its connections and opens new ones, has no more upstream calls running than one
//! that waits for its answers.

use super::*;

/// What became of one request sent and reset at once.
enum Fate {
    /// It reached the upstream (and its stream was then reset by the client).
    WentOut,
    /// The proxy answered it with this status before anything went out.
    Answered(u16),
}

/// Sends a whole POST on `stream` and resets the stream as soon as the request reaches the
/// upstream's gate `held` (the `went_out`-th to arrive there), unless the proxy answers it
/// first.
async fn send_and_reset(
    client: &mut H2,
    upstream: &common::Upstream,
    stream: u32,
    body: &str,
    went_out: usize,
) -> Fate {
    client
        .send(&wire::post(
            stream,
            "/orders",
            body,
            &[("x-test-gate", "held")],
        ))
        .await;
    let fate = tokio::select! {
        () = upstream.arrived("held", went_out) => Fate::WentOut,
        frame = client.next_on(stream) => {
            let frame = frame.expect("the proxy closed the connection");
            assert_eq!(frame.kind, HEADERS, "stream {stream}: {frame:?}");
            Fate::Answered(status_of(&frame.payload).expect("a readable :status"))
        }
    };
    if let Fate::WentOut = fate {
        client.send(&wire::reset(stream, CANCEL)).await;
    }
    fate
}

/// Waits until no owner runs in the proxy (hang guard: 30 s).
async fn owners_end(proxy: &common::ProxyHandle) {
    let deadline = std::time::Instant::now() + HANG;
    while proxy.metric("idemgate_in_flight") > 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: owners still run"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A client that sends whole POSTs on one HTTP/2 connection and resets each stream once its
/// request went out: every owner runs on (its request may have run), so without a bound
/// each reset frees a stream for the next request and upstream calls pile up without end.
/// They count against the connection's `max_streams` until they end: past that, a request
/// is refused with `503` before its key is claimed; other clients are served meanwhile,
/// and the refused request runs once retried after the owners ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resetting_sent_requests_runs_no_more_of_them_upstream_than_max_streams() {
    const MAX_STREAMS: usize = 4;
    const SENT: usize = 12;
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &format!("connections: {{ max_streams: {MAX_STREAMS} }}\n"),
    )
    .await;
    let mut client = H2::open(proxy.addr).await;
    let (mut went_out, mut answered) = (0, Vec::new());
    for i in 0..SENT {
        let body = format!(r#"{{"order":{i}}}"#);
        match send_and_reset(
            &mut client,
            &upstream,
            2 * i as u32 + 1,
            &body,
            went_out + 1,
        )
        .await
        {
            Fate::WentOut => went_out += 1,
            Fate::Answered(status) => answered.push((i, status)),
        }
    }
    let in_flight = proxy.metric("idemgate_in_flight");
    // Another client is served while the owners hold this connection's share.
    let other = common::post(proxy.addr, "/orders", &[], r#"{"other":1}"#).await;
    upstream.open("held");
    assert_eq!(
        went_out, MAX_STREAMS,
        "{went_out} of {SENT} reset requests went out upstream at once from one connection \
         (max_streams {MAX_STREAMS}); answered: {answered:?}"
    );
    assert!(
        answered.iter().all(|&(_, status)| status == 503),
        "{answered:?}"
    );
    assert_eq!(in_flight, MAX_STREAMS as f64);
    assert_eq!(other.status, 201, "{:?}", other.body);
    // Once the owners ended, the connection is served again, and a refused request runs:
    // it was refused before its key was claimed.
    owners_end(&proxy).await;
    let (refused, _) = answered[0];
    let stream = 2 * SENT as u32 + 1;
    client
        .send(&wire::post(
            stream,
            "/orders",
            &format!(r#"{{"order":{refused}}}"#),
            &[],
        ))
        .await;
    let frame = client.next_on(stream).await.expect("an answer");
    assert_eq!(status_of(&frame.payload), Some(201), "{frame:?}");
    assert_eq!(upstream.executed(), MAX_STREAMS + 2);
}

/// A client that sends a request on a connection, then closes it once the request went out,
/// and opens the next: its owners run on, and each connection keeps its `max_client` slot
/// until they end, so a client cannot have more connections' worth of upstream calls
/// running than the cap by leaving them. A new connection waits in the backlog meanwhile,
/// and is served once they end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_client_left_keeps_its_slot_until_its_owners_end() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "connections: { max_client: 1 }\n").await;
    let mut left = TcpStream::connect(proxy.addr).await.unwrap();
    let request = common::raw_post("/orders", &["x-test-gate: held"], r#"{"left":1}"#);
    left.write_all(&request).await.unwrap();
    upstream.arrived("held", 1).await;
    drop(left);
    let mut next = TcpStream::connect(proxy.addr).await.unwrap();
    let request = common::raw_post("/orders", &["x-test-gate: next"], r#"{"next":1}"#);
    next.write_all(&request).await.unwrap();
    // Either the new connection is served, or the proxy counts the one that closed as
    // outlived by its owner (and so still holding the only slot).
    let served_while_held = tokio::select! {
        () = upstream.arrived("next", 1) => true,
        () = proxy.metric_reaches("idemgate_client_connections_outlived", 1.0) => false,
    };
    upstream.open("next");
    upstream.open("held");
    assert!(
        !served_while_held,
        "a second connection was served while the first, whose client left, still had its \
         owner running (max_client 1)"
    );
    let mut answer = Vec::new();
    tokio::time::timeout(HANG, next.read_to_end(&mut answer))
        .await
        .expect("hang guard: the waiting connection was never served")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert_eq!(proxy.metric("idemgate_client_connections_outlived"), 0.0);
}

/// An owner that runs on after its client left still holds the request's head (it went
/// out with the request): its charge in the buffer budget goes with it, and is given back
/// when the owner ends, not when the client leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_client_left_holds_its_head_in_the_budget_until_it_ends() {
    const PAD: usize = 12 * 1024;
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let mut left = TcpStream::connect(proxy.addr).await.unwrap();
    let pad = format!("x-pad: {}", "p".repeat(PAD));
    let headers = ["x-test-gate: held", pad.as_str()];
    let request = common::raw_post("/orders", &headers, r#"{"left":1}"#);
    left.write_all(&request).await.unwrap();
    upstream.arrived("held", 1).await;
    drop(left);
    // Counted as outlived once its connection has ended, and with it the request's future
    // (an HTTP/1 connection drives its request's future itself): the owner runs detached.
    proxy
        .metric_reaches("idemgate_client_connections_outlived", 1.0)
        .await;
    let held = proxy.metric("idemgate_buffered_bytes");
    upstream.open("held");
    assert!(
        held >= PAD as f64,
        "a detached owner's head held {held} bytes of the budget"
    );
    owners_end(&proxy).await;
    let deadline = std::time::Instant::now() + HANG;
    while proxy.metric("idemgate_buffered_bytes") > 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: the owner's buffers were never given back"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(upstream.executed(), 1);
}
