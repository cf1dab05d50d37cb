//! Owners' answers against the buffer budget: the answer a request ran to goes to its own
//! client from a copy that lives until that client has read it. Whatever the store keeps
//! (an answer sent to Redis, a sealed record, a failure record that lingers only a moment,
//! the memory store's record in clear, which it may evict or expire), clients that send
//! requests with distinct keys on streams they never read would each hold an answer outside
//! every bound: the charge the answer's buffer took stays with that copy until its body is
//! sent or dropped. A further
//! request finds the connection's share full and gets `503 overloaded`; the answers held
//! are still served whole, and nothing runs twice.

use bytes::Bytes;

use super::replays::{connect, held_falls_to, read_all};
use super::*;
use common::redis_server::RedisServer;

/// Each answer's body: four held fit in the connection's share, with room to read each.
const BODY: usize = 200 * 1024;
/// How many answers the client holds unread.
const HELD: usize = 4;
/// The body of the request sent once they are held: more than the share has left.
const LATE: usize = 256 * 1024;

/// A share of 1 MiB of a 2 MiB budget: the share is what one connection exhausts.
fn config(store: &str) -> String {
    format!(
        "connections: {{ max_buffered: 2MiB, max_buffered_per_connection: 1MiB }}\n{store}\nroutes:\n  - name: orders\n    match: {{ methods: [POST], path: /orders }}\n    key: {{ header: Idempotency-Key, required: true }}\n"
    )
}

/// Sends the protected request with key `key` asking for a `BODY`-byte answer with
/// `status`, and waits for the answer's head (its body unread).
async fn order(
    client: &mut h2::client::SendRequest<Bytes>,
    key: &str,
    status: u16,
) -> http::Response<h2::RecvStream> {
    let request = http::Request::post("http://x/orders")
        .header("idempotency-key", key)
        .header("x-test-bytes", BODY)
        .header("x-test-status", status)
        .body(())
        .unwrap();
    let (answer, _) = client.send_request(request, true).unwrap();
    tokio::time::timeout(HANG, answer)
        .await
        .expect("hang guard: no answer head")
        .unwrap()
}

/// Sends the protected request with key `key` and a `LATE`-byte body; its answer's head.
async fn late(
    client: &mut h2::client::SendRequest<Bytes>,
    key: &str,
) -> http::Response<h2::RecvStream> {
    let request = http::Request::post("http://x/orders")
        .header("idempotency-key", key)
        .header("content-length", LATE)
        .body(())
        .unwrap();
    let (answer, mut send) = client.send_request(request, false).unwrap();
    // Refused, the stream may be reset before all of it went: no matter.
    let _ = send.send_data(Bytes::from(vec![b'y'; LATE]), true);
    tokio::time::timeout(HANG, answer)
        .await
        .expect("hang guard: no answer head")
        .unwrap()
}

/// `HELD` requests with distinct keys on one connection whose client reads nothing, each
/// answered with `status` and a `BODY`-byte body: each answer keeps its charge while held,
/// so a further request whose body the share has no room for is refused with `503
/// overloaded` before it runs. Read at last, every answer is whole, the refused request
/// runs on its retry, and each ran once.
async fn owners_answers_held_by_a_slow_client_are_bounded(store: &str, status: u16) {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &config(store)).await;
    let (mut client, _driver) = connect(&proxy).await;
    let mut held = Vec::new();
    for i in 0..HELD {
        let answer = order(&mut client, &format!("k{i}"), status).await;
        assert_eq!(answer.status(), status);
        held.push(answer);
    }
    let charged = proxy.metric("idemgate_buffered_bytes");
    assert!(
        charged >= (HELD * BODY) as f64,
        "{HELD} answers held by a client that reads nothing hold {charged} bytes of the budget"
    );
    let refused = late(&mut client, "late").await;
    assert_eq!(refused.status(), 503, "a body past the connection's share");
    assert_eq!(refused.headers()["retry-after"], "1");
    let share = "idemgate_buffer_share_refusals_total{what=\"request_body\"}";
    assert_eq!(proxy.metric(share), 1.0);
    assert_eq!(upstream.executed_for("late"), 0);
    drop(refused);
    read_all_of(held).await;
    held_falls_to(&proxy, 0.0).await;
    let answer = late(&mut client, "late").await;
    assert_eq!(answer.status(), 201);
    assert!(read_all(answer).await > 0);
    assert_eq!(upstream.executed_for("late"), 1);
    for i in 0..HELD {
        assert_eq!(upstream.executed_for(&format!("k{i}")), 1);
    }
}

/// What the owner stores goes to Redis; its client's copy is the proxy's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_owners_answers_held_by_a_slow_client_are_charged_to_the_budget() {
    let redis = RedisServer::start();
    let store = format!(
        "store:\n  redis: {{ url: \"{}\", prefix: \"t:\", timeout: 500ms }}",
        redis.url()
    );
    owners_answers_held_by_a_slow_client_are_bounded(&store, 201).await;
}

/// The memory store keeps a sealed record; the client's copy in clear is another one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_owners_answers_held_by_a_slow_client_are_charged_to_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k1");
    std::fs::write(&key, format!("{}\n", "01".repeat(32))).unwrap();
    let store = format!("store: {{ encrypt: {{ key_file: {} }} }}", key.display());
    owners_answers_held_by_a_slow_client_are_bounded(&store, 201).await;
}

/// A failure shared with the owner's waiters lingers in the memory store only a moment:
/// its client's copy outlives it, and is charged even there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_held_by_a_slow_client_are_charged_to_the_budget() {
    owners_answers_held_by_a_slow_client_are_bounded("", 500).await;
}

/// The memory store's record in clear is the client's copy too, but the store drops it
/// when full (`when_full: evict`) or at its `ttl` while a client that reads nothing still
/// holds it: its answers are charged as every owner's answer is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_owners_answers_held_by_a_slow_client_are_charged_to_the_budget() {
    owners_answers_held_by_a_slow_client_are_bounded("", 201).await;
}

/// Reads every answer of `held` whole, all at once: the connection's window, released by
/// one, may go to another, which must be read for it to come back.
async fn read_all_of(held: Vec<http::Response<h2::RecvStream>>) {
    let lengths = futures_util::future::join_all(held.into_iter().map(read_all)).await;
    assert_eq!(lengths, vec![BODY; HELD]);
}

/// A stored answer whose body fitted its owner's share of the buffer budget, but whose
/// record (its headers besides) is a little over it, is still replayed: refused for room
/// on every retry, it would be lost for as long as it is kept. A replay alone on its
/// connection may go past the share; the total still bounds it. The request's own body,
/// read for its key, is let go before its replay is charged: held, the replay would not
/// be alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_stored_within_the_share_is_replayed_though_its_record_is_over_it() {
    answer_over_the_share_is_replayed(None).await;
}

/// The same across a reload that renames the route: the retry's new key is free, and the
/// answer is replayed from the key the previous config gave it, the body let go first too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_share_is_replayed_from_the_previous_configs_key() {
    answer_over_the_share_is_replayed(Some("purchases")).await;
}

/// Stores the answer of key `big` (its record over the connection's share), then retries
/// it on the same connection, after a reload renaming the route to `renamed` if given.
async fn answer_over_the_share_is_replayed(renamed: Option<&str>) {
    const SHARE: usize = 256 * 1024;
    let upstream = start_upstream().await;
    let config = |name: &str| {
        format!(
            "connections: {{ max_buffered: 2MiB, max_buffered_per_connection: {SHARE} }}\nroutes:\n  - name: {name}\n    match: {{ methods: [POST], path: /orders }}\n    key: {{ header: Idempotency-Key, required: true }}\n"
        )
    };
    let proxy = start_proxy(upstream.addr, &config("orders")).await;
    let (mut client, _driver) = connect(&proxy).await;
    let send = |client: &mut h2::client::SendRequest<Bytes>| {
        let request = http::Request::post("http://x/orders")
            .header("idempotency-key", "big")
            .header("x-test-bytes", SHARE - 8 * 1024)
            .header("x-test-pad", 16 * 1024)
            .body(())
            .unwrap();
        let (answer, mut body) = client.send_request(request, false).unwrap();
        body.send_data(Bytes::from_static(b"{}"), true).unwrap();
        answer
    };
    let first = tokio::time::timeout(HANG, send(&mut client))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.status(), 201);
    assert_eq!(read_all(first).await, SHARE - 8 * 1024);
    held_falls_to(&proxy, 0.0).await;
    if let Some(name) = renamed {
        let reloaded = common::reload(&proxy, upstream.addr, &config(name));
        assert!(reloaded.honoured_until.is_some(), "{reloaded:?}");
    }
    let again = tokio::time::timeout(HANG, send(&mut client))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        again.status(),
        201,
        "the stored answer is replayed, not refused for room"
    );
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["x-pad"].len(), 16 * 1024);
    assert_eq!(read_all(again).await, SHARE - 8 * 1024);
    assert_eq!(upstream.executed_for("big"), 1);
}
