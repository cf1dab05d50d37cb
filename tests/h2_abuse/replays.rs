//! Replays against the buffer budget: a replay holds its record (a copy decoded from Redis
//! or opened from a seal, or the memory store's own, which it may evict or expire
//! meanwhile) until its client has read it, so clients that ask for a large stored answer
//! again and again on streams they never read would hold one each, unbounded. Each replay
//! is charged to the budget for its record until its body is sent or dropped; a replay
//! without room gets `503 overloaded`, never a second execution.

use bytes::Bytes;
use tokio::task::JoinHandle;

use super::*;
use common::redis_server::RedisServer;

/// The stored answer's body: two replays of it fit in the budget, three do not.
const BODY: usize = 96 * 1024;

/// The budget of the tests, the connection's share turned off: each held replay is on a
/// connection of its own, and what is exhausted is the total.
fn config(store: &str) -> String {
    format!(
        "connections: {{ max_buffered: 256KiB, max_buffered_per_connection: 256KiB }}\n{store}\nroutes:\n  - name: orders\n    match: {{ methods: [POST], path: /orders }}\n    key: {{ header: Idempotency-Key, required: true }}\n"
    )
}

/// An HTTP/2 connection to the proxy whose client releases no flow-control window unless
/// it reads a body: the proxy can send 64 KiB of an answer and holds the rest.
pub(super) async fn connect(
    proxy: &common::ProxyHandle,
) -> (h2::client::SendRequest<Bytes>, JoinHandle<()>) {
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    (client.ready().await.unwrap(), driver)
}

/// Sends the protected request with key `key` asking for a `BODY`-byte answer, and waits
/// for the answer's head (its body unread).
async fn order(
    client: &mut h2::client::SendRequest<Bytes>,
    key: &str,
) -> http::Response<h2::RecvStream> {
    let request = http::Request::post("http://x/orders")
        .header("idempotency-key", key)
        .header("x-test-bytes", BODY)
        .body(())
        .unwrap();
    let (answer, _) = client.send_request(request, true).unwrap();
    tokio::time::timeout(HANG, answer)
        .await
        .expect("hang guard: no answer head")
        .unwrap()
}

/// Reads `answer`'s body to its end, releasing the window as it goes; its length.
pub(super) async fn read_all(answer: http::Response<h2::RecvStream>) -> usize {
    let mut body = answer.into_body();
    let mut len = 0;
    while let Some(chunk) = tokio::time::timeout(HANG, body.data())
        .await
        .expect("hang guard")
    {
        let chunk = chunk.unwrap();
        len += chunk.len();
        body.flow_control().release_capacity(chunk.len()).unwrap();
    }
    len
}

/// Waits until the proxy holds at most `n` bytes of the budget (hang guard: 30 s).
pub(super) async fn held_falls_to(proxy: &common::ProxyHandle, n: f64) {
    let deadline = std::time::Instant::now() + HANG;
    while proxy.metric("idemgate_buffered_bytes") > n {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: the budget never fell to {n}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Stores the `BODY`-byte answer of key `big`, read whole by its client, then holds two
/// replays of it on connections whose clients read nothing: each holds a copy of its
/// own, charged. A third is refused with `503 overloaded` and the upstream ran once; once
/// one slow client reads its answer and the other leaves, replays are served again.
async fn replays_held_by_slow_clients_are_bounded(store: &str) {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &config(store)).await;
    let (mut first, _driver) = connect(&proxy).await;
    let answer = order(&mut first, "big").await;
    assert_eq!(answer.status(), 201);
    assert_eq!(read_all(answer).await, BODY);
    held_falls_to(&proxy, 0.0).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let (mut client, driver) = connect(&proxy).await;
        let answer = order(&mut client, "big").await;
        assert_eq!(answer.status(), 201);
        assert_eq!(answer.headers()["idempotent-replayed"], "true");
        held.push((client, driver, answer));
    }
    let charged = proxy.metric("idemgate_buffered_bytes");
    assert!(
        charged >= (2 * BODY) as f64,
        "two replays held by clients that read nothing hold {charged} bytes of the budget"
    );
    let (mut client, _third) = connect(&proxy).await;
    let refused = order(&mut client, "big").await;
    assert_eq!(refused.status(), 503, "a third replay past the budget");
    assert_eq!(refused.headers()["retry-after"], "1");
    let mut problem = Vec::new();
    let mut body = refused.into_body();
    while let Some(chunk) = body.data().await {
        problem.extend_from_slice(&chunk.unwrap());
    }
    let problem: serde_json::Value = serde_json::from_slice(&problem).unwrap();
    assert_eq!(problem["type"], "urn:idemgate:problem:overloaded");
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("retry with the same key"), "{detail}");
    let refusals = "idemgate_buffer_refusals_total{what=\"replay\"}";
    assert_eq!(proxy.metric(refusals), 1.0);
    assert_eq!(upstream.executed_for("big"), 1);
    // One slow client reads its answer whole, the other leaves: their copies are given
    // back, and a replay is served again, whole.
    let (_client, _driver, answer) = held.pop().unwrap();
    assert_eq!(read_all(answer).await, BODY);
    let (client, driver, answer) = held.pop().unwrap();
    drop((client, answer));
    driver.abort();
    let _ = driver.await;
    held_falls_to(&proxy, 0.0).await;
    let answer = order(&mut client_of(&proxy).await, "big").await;
    assert_eq!(answer.status(), 201);
    assert_eq!(answer.headers()["idempotent-replayed"], "true");
    assert_eq!(read_all(answer).await, BODY);
    assert_eq!(upstream.executed_for("big"), 1);
}

/// A new connection's client (its driver runs on its own).
async fn client_of(proxy: &common::ProxyHandle) -> h2::client::SendRequest<Bytes> {
    connect(proxy).await.0
}

/// Redis hands each replay a copy of the record, decoded from its reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replays_held_by_slow_clients_are_charged_to_the_budget() {
    let redis = RedisServer::start();
    let store = format!(
        "store:\n  redis: {{ url: \"{}\", prefix: \"t:\", timeout: 500ms }}",
        redis.url()
    );
    replays_held_by_slow_clients_are_bounded(&store).await;
}

/// The memory store shares a sealed record, but each replay opens it into a copy of its
/// own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_replays_held_by_slow_clients_are_charged_to_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k1");
    std::fs::write(&key, format!("{}\n", "01".repeat(32))).unwrap();
    let store = format!("store: {{ encrypt: {{ key_file: {} }} }}", key.display());
    replays_held_by_slow_clients_are_bounded(&store).await;
}

/// A memory store's plain record is shared by every replay, but the store may drop it
/// (evicted when full, expired) while clients that read nothing still hold it: each
/// replay is charged for the record it holds, as a copy is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_replays_held_by_slow_clients_are_charged_to_the_budget() {
    replays_held_by_slow_clients_are_bounded("").await;
}
