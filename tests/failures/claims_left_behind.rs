//! Claims with no owner left to settle them: a client that leaves while its claim is at
//! Redis, a claim Redis answered only after the store timeout, and one whose reply never
//! came while Redis stayed out of reach past the claim's lease. The key is freed (a token
//! issued again), never left to lapse into an unknown outcome.

use std::sync::atomic::Ordering;

use http::StatusCode;
use tokio::io::AsyncWriteExt;

use crate::common::redis_server::RedisServer;
use crate::common::{self, post, ProxyHandle};
use crate::held_replies::*;
use crate::route;

/// Sends `request` on a connection of its own, waits until Redis holds a claim in flight
/// while its reply is held back, then leaves, and lets the reply through once the proxy
/// has seen the client go (its connection closed, the request's future dropped).
async fn leave_mid_claim(redis: &RedisServer, relay: &Relay, proxy: &ProxyHandle, request: &[u8]) {
    relay.hold.send_replace(true);
    let mut client = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    client.write_all(request).await.unwrap();
    until(
        || record_kinds(redis).contains(&"I".to_owned()),
        "the claim written in Redis",
    )
    .await;
    drop(client);
    until(
        || proxy.metric("idemgate_client_connections") == 0.0,
        "the proxy to see its client leave",
    )
    .await;
    relay.hold.send_replace(false);
}

/// A client that leaves while its claim is at Redis (written there, the reply not back
/// yet) sent nothing upstream: its key is freed, not left claimed by no one to lapse into
/// an unknown outcome, and its retry executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_claim_leaves_its_key_free() {
    let (redis, relay, upstream, proxy) = behind_held_replies(&route("")).await;
    // The connection to Redis is open before replies are held.
    warm_up(&proxy).await;
    let request = common::raw_post("/orders", &["idempotency-key: left"], "{}");
    leave_mid_claim(&redis, &relay, &proxy, &request).await;
    until(|| record_kinds(&redis) == ["D"], "the key freed").await;
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "left")], "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "not a 409");
    assert!(!retry.replayed());
    assert_eq!(upstream.executed_for("left"), 1);
}

/// The same on a token route: the token the claim consumed goes back to issued, and the
/// retry with it executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_claim_keeps_its_token() {
    let (redis, relay, upstream, proxy) = behind_held_replies(TOKEN_ROUTE).await;
    let token = warm_token_route(&proxy).await;
    assert_eq!(record_kinds(&redis), ["D", "T"]);
    let request = common::raw_post(
        "/orders/pay",
        &[
            "authorization: Bearer alice",
            &format!("idempotency-token: {token}"),
        ],
        "{}",
    );
    leave_mid_claim(&redis, &relay, &proxy, &request).await;
    token_issued_again_and_retried(&redis, &upstream, &proxy, &token).await;
}

/// A token route (`Bearer alice` asks for tokens) for the tests of claims left behind.
pub(crate) const TOKEN_ROUTE: &str = "tokens: { ttl: 5m }\nroutes:\n  - name: pay\n    match: { methods: [POST], path: /orders/pay }\n    key: { token: { header: Idempotency-Token } }\n";

/// Uses one token while replies still flow (the connection is open, the claim script
/// loaded), then returns a fresh one, issued and unused.
pub(crate) async fn warm_token_route(proxy: &ProxyHandle) -> String {
    let token = || async {
        let auth = [("authorization", "Bearer alice")];
        let issued = post(proxy.addr, "/.idemgate/token", &auth, "").await;
        assert_eq!(issued.status, StatusCode::CREATED);
        issued.json()["token"].as_str().unwrap().to_owned()
    };
    let warm = token().await;
    let headers = [
        ("authorization", "Bearer alice"),
        ("idempotency-token", warm.as_str()),
    ];
    let used = post(proxy.addr, "/orders/pay", &headers, "{}").await;
    assert_eq!(used.status, StatusCode::CREATED);
    token().await
}

/// The claim consumed `token` (`T` became `I`); once its release issues it again, the
/// retry with it executes once.
async fn token_issued_again_and_retried(
    redis: &RedisServer,
    upstream: &common::Upstream,
    proxy: &ProxyHandle,
    token: &str,
) {
    until(
        || record_kinds(redis) == ["D", "T"],
        "the token issued again",
    )
    .await;
    let headers = [
        ("authorization", "Bearer alice"),
        ("idempotency-token", token),
    ];
    let retry = post(proxy.addr, "/orders/pay", &headers, "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "not a 400 token-invalid");
    assert!(!retry.replayed());
    assert_eq!(upstream.executed(), 2, "the warm-up and the retry");
}

/// Sends `headers` to `path` while Redis's replies are held past the store timeout: the
/// client gets a 503 (`fail_closed`), and the claim has run in Redis all the same (its
/// reply reached the relay). The replies stay held: let them through.
async fn claim_unanswered(
    relay: &Relay,
    proxy: &ProxyHandle,
    path: &str,
    headers: &[(&str, &str)],
) {
    let before = relay.received();
    relay.hold.send_replace(true);
    let failed = post(proxy.addr, path, headers, "{}").await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(failed.problem(), "urn:idemgate:problem:store-unavailable");
    until(|| relay.received() > before, "Redis to run the claim").await;
}

/// A claim Redis answered only after the store `timeout` may have been written, with no
/// owner to settle it: the client gets a 503, and the claim, under which nothing was sent,
/// is released in the background instead of lapsing into an unknown outcome (a 409 for a
/// day). The retry executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answered_past_the_store_timeout_leaves_its_key_free() {
    let (redis, relay, upstream, proxy) = timing_out_behind_held_replies(&route("")).await;
    warm_up(&proxy).await;
    claim_unanswered(&relay, &proxy, "/orders", &[("idempotency-key", "late")]).await;
    relay.hold.send_replace(false);
    until(
        || record_kinds(&redis) == ["D"],
        "the unanswered claim released",
    )
    .await;
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "late")], "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "not a 409");
    assert!(!retry.replayed());
    assert_eq!(upstream.executed_for("late"), 1);
}

/// The same on a token route: the token the unanswered claim consumed goes back to
/// issued, and the retry with it executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answered_past_the_store_timeout_keeps_its_token() {
    let (redis, relay, upstream, proxy) = timing_out_behind_held_replies(TOKEN_ROUTE).await;
    let token = warm_token_route(&proxy).await;
    let headers = [
        ("authorization", "Bearer alice"),
        ("idempotency-token", token.as_str()),
    ];
    claim_unanswered(&relay, &proxy, "/orders/pay", &headers).await;
    relay.hold.send_replace(false);
    token_issued_again_and_retried(&redis, &upstream, &proxy, &token).await;
}

/// A claim Redis ran whose reply never came, the store then out of reach for longer than
/// the claim's lease (a Redis crash after the write, a network partition, a failover): the
/// client got a 503, so its request is known never to have gone out. Its release must go
/// on until the store answers, not give up at the lease: left there, the claim lapses and
/// holds the key as an unknown outcome (a 409) for the route's whole `ttl`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_unanswered_while_the_store_is_out_of_reach_past_its_lease_leaves_its_key_free() {
    let (redis, relay, upstream, proxy) =
        timing_out_behind_held_replies(&route("lease: 1s\n    ttl: 1h")).await;
    warm_up(&proxy).await;
    let before = relay.received();
    relay.hold.send_replace(true);
    let addr = proxy.addr;
    let first = tokio::spawn(async move {
        post(addr, "/orders", &[("idempotency-key", "stranded")], "{}").await
    });
    until(|| relay.received() > before, "Redis to run the claim").await;
    // From now on nothing the proxy sends reaches Redis: the release gets no answer.
    relay.cut.store(true, Ordering::SeqCst);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    // The claim's lease (1 s) runs out in Redis, and 3 s more pass: its release used to
    // stop trying at the lease.
    let span_ms = 3_600_000;
    until(
        || claim_pttl(&redis).is_some_and(|pttl| pttl < span_ms - 3_000),
        "the stranded claim's lease to run out",
    )
    .await;
    relay.cut.store(false, Ordering::SeqCst);
    relay.hold.send_replace(false);
    until(
        || record_kinds(&redis) == ["D"],
        "the stranded claim released once Redis answers",
    )
    .await;
    let retry = post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "stranded")],
        "{}",
    )
    .await;
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "not a 409 outcome-unknown"
    );
    assert!(!retry.replayed());
    assert_eq!(upstream.executed_for("stranded"), 1);
}

/// The remaining TTL in ms of the one claim in flight in Redis, if there is one.
fn claim_pttl(redis: &RedisServer) -> Option<i64> {
    redis
        .cli(&["KEYS", "*"])
        .lines()
        .filter(|key| !key.is_empty())
        .find(|key| redis.cli(&["GETRANGE", key, "0", "0"]).trim() == "I")
        .and_then(|key| redis.cli(&["PTTL", key]).trim().parse().ok())
}
