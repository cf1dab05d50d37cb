//! The buffer budget (`connections.max_buffered`) against one HTTP/2 client: protected
//! bodies have no total deadline, only a gap limit, so a client trickling a byte per gap on
//! each of its `max_streams` streams keeps their buffers for as long as it likes. One
//! connection holds at most its share of the budget: past it its next body is refused, and
//! other connections keep being served.

use super::*;

/// The budget of the test: its default per-connection share is an eighth, 32 KiB.
const ROUTES: &str = r#"
connections: { max_buffered: 256KiB }
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
"#;

/// What each held body sends of its declared length (one byte more): it never ends.
const SENT: usize = 20 * 1024;

/// One HTTP/2 connection opens protected uploads, sends all but the last byte of each, and
/// stalls: each holds about `SENT` bytes of the budget until its client goes on. The first
/// one fits in the connection's share, the next does not and gets `503 overloaded` before
/// its key is claimed; another connection's upload is served meanwhile, and the held body,
/// once finished, runs. Without a share the one connection fills the whole budget
/// (twelve bodies) and everyone else gets `503 overloaded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_holds_at_most_its_share_of_the_buffer_budget() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let (mut held, mut refused) = (Vec::new(), None);
    // The budget holds 12 such bodies: the 13th is refused, share or not.
    for i in 0..16 {
        // Read before it sends: the bodies held so far hold still.
        let before = proxy.metric("idemgate_buffered_bytes");
        let request = http::Request::post("http://x/orders")
            .header("idempotency-key", format!("hoard-{i}"))
            .header("content-length", SENT + 1)
            .body(())
            .unwrap();
        let (answer, mut body) = client.send_request(request, false).unwrap();
        body.send_data(vec![b'h'; SENT].into(), false).unwrap();
        let mut answer = Box::pin(answer);
        // Either the proxy answers it (refused), or the budget shows its bytes held.
        tokio::select! {
            answer = &mut answer => {
                refused = Some((i, answer.unwrap()));
                break;
            }
            () = proxy.metric_reaches("idemgate_buffered_bytes", before + SENT as f64) => {
                held.push((answer, body));
            }
        }
        client = client.ready().await.unwrap();
    }
    let (refused_at, refused) = refused.expect("no upload of the connection was refused");
    // Another connection is served while the first holds its bodies.
    let other = common::post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "other")],
        &"o".repeat(SENT),
    )
    .await;
    assert_eq!(
        other.status,
        201,
        "another connection was refused while one connection held {} bodies of {} KiB: {:?}",
        held.len(),
        SENT >> 10,
        other.body
    );
    assert_eq!(held.len(), 1, "bodies one connection held at once");
    assert_eq!(refused_at, 1);
    refused_for_the_share(&proxy, refused, "request_body").await;
    // The held body goes on: it runs, once; the refused one never reached the upstream.
    let (answer, mut body) = held.pop().unwrap();
    body.send_data(vec![b'h'].into(), true).unwrap();
    let answer = tokio::time::timeout(HANG, answer)
        .await
        .expect("hang guard: the held body was never answered")
        .unwrap();
    assert_eq!(answer.status(), 201);
    assert_eq!(upstream.executed_for("hoard-0"), 1);
    assert_eq!(upstream.executed_for("hoard-1"), 0);
    assert_eq!(upstream.executed(), 2);
}

/// Decoded size of the padding field each held head carries (`x-pad`, under the 16 KiB
/// header list limit): three such heads are more than a connection's 32 KiB share, two
/// are not.
const PAD: usize = 12 * 1024;

/// A protected request's head is held too, while its body comes and its owner runs. One
/// HTTP/2 connection opens protected requests (each its own fingerprint, by its query)
/// with large heads whose owners the upstream holds (a gate): each holds its head in the
/// budget until its answer, so the first two fit in the connection's share and the third
/// is refused with `503 overloaded` before it is claimed; another connection is served
/// meanwhile, and once the held requests are answered their heads are given back. Without
/// the charge, every head is held for free: all of them go out and the budget shows
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_request_heads_count_against_the_connections_share() {
    let upstream = start_upstream().await;
    // No route: a POST is fingerprinted by the default rule.
    let proxy = start_proxy(upstream.addr, "connections: { max_buffered: 256KiB }\n").await;
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let (mut held, mut refused) = (Vec::new(), None);
    for i in 0..8 {
        let request = http::Request::post(format!("http://x/orders?held={i}"))
            .header("x-test-gate", "heads")
            .header("x-pad", "p".repeat(PAD))
            .body(())
            .unwrap();
        let (answer, _) = client.send_request(request, true).unwrap();
        let mut answer = Box::pin(answer);
        // Either the proxy answers it (refused), or it reaches the upstream's gate.
        tokio::select! {
            answer = &mut answer => {
                refused = Some((i, answer.unwrap()));
                break;
            }
            () = upstream.arrived("heads", held.len() + 1) => held.push(answer),
        }
        client = client.ready().await.unwrap();
    }
    let (refused_at, refused) = refused.unwrap_or_else(|| {
        panic!(
            "no request of the connection was refused: {} heads of {} KiB held at once",
            held.len(),
            PAD >> 10
        )
    });
    assert_eq!(
        refused_at, 2,
        "heads one connection held at once: {refused:?}"
    );
    let held_bytes = proxy.metric("idemgate_buffered_bytes");
    assert!(held_bytes >= (2 * PAD) as f64, "{held_bytes}");
    // Another connection is served while the first holds its heads.
    let other = common::post(proxy.addr, "/orders", &[], "o").await;
    assert_eq!(other.status, 201, "{:?}", other.body);
    refused_for_the_share(&proxy, refused, "request_head").await;
    // The connection at its share is refused protected heads only: a GET with as large a
    // head passes through, uncharged (its head goes upstream at once).
    let mut client = client.ready().await.unwrap();
    let get = http::Request::get("http://x/orders")
        .header("x-pad", "p".repeat(PAD))
        .body(())
        .unwrap();
    let (answer, _) = client.send_request(get, true).unwrap();
    let answer = tokio::time::timeout(HANG, answer)
        .await
        .expect("hang guard: the GET was never answered")
        .unwrap();
    assert_eq!(answer.status(), 200, "a GET is not refused for the share");
    // The held requests go on and are answered; the refused one never went out.
    upstream.open("heads");
    for answer in held {
        let answer = tokio::time::timeout(HANG, answer)
            .await
            .expect("hang guard: a held request was never answered")
            .unwrap();
        assert_eq!(answer.status(), 201);
        let mut body = answer.into_body();
        while let Some(chunk) = body.data().await {
            chunk.unwrap();
        }
    }
    assert_eq!(upstream.executed(), 3);
    // Heads and answers are given back once handed on: nothing is held now (the last DATA
    // frame an answer wrote may be released only at the connection's next flush).
    let deadline = std::time::Instant::now() + HANG;
    while proxy.metric("idemgate_buffered_bytes") > 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: the heads and answers were never given back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// `refused` is the `503 overloaded` a connection past its share gets, counted once as a
/// `what` refused for the share.
async fn refused_for_the_share(
    proxy: &common::ProxyHandle,
    refused: http::Response<h2::RecvStream>,
    what: &str,
) {
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let mut problem = refused.into_body();
    let mut text = Vec::new();
    while let Some(chunk) = problem.data().await {
        text.extend_from_slice(&chunk.unwrap());
    }
    let problem: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(problem["type"], "urn:idemgate:problem:overloaded");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("this connection is buffering"),
        "{detail}"
    );
    let refusals = format!("idemgate_buffer_refusals_total{{what=\"{what}\"}}");
    assert_eq!(proxy.metric(&refusals), 1.0);
    let share = format!("idemgate_buffer_share_refusals_total{{what=\"{what}\"}}");
    assert_eq!(proxy.metric(&share), 1.0);
}

/// A protected request whose head finds no room but which its head refuses anyway (a
/// required key missing) gets that refusal, not a `503` asking it to come back, even with
/// its body sent unasked (whose key is otherwise looked at after the body); the same head
/// with its key gets the `503`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_without_room_that_its_key_refuses_gets_the_key_refusal() {
    let upstream = start_upstream().await;
    let keyed = "connections: { max_buffered: 64KiB, max_buffered_per_connection: 1KiB }\nroutes:\n  - name: keyed\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key, required: true }\n";
    let proxy = start_proxy(upstream.addr, keyed).await;
    let pad = "p".repeat(2048);
    let keyless = common::post(proxy.addr, "/orders", &[("x-pad", &pad)], "{}").await;
    assert_eq!(keyless.status, 400, "{:?}", keyless.body);
    let key = [("x-pad", pad.as_str()), ("idempotency-key", "k1")];
    let keyed = common::post(proxy.addr, "/orders", &key, "{}").await;
    assert_eq!(keyed.status, 503, "{:?}", keyed.body);
    assert_eq!(upstream.executed(), 0);
}
