//! A proxy on Redis through a relay that can hold, drop or cut Redis's replies
//! (`common::relay`), and the helpers the store-failure tests share: records in Redis by kind, a warm-up request,
//! an owner held at the upstream's gate.

use std::time::Duration;

use http::StatusCode;

use crate::common::redis_server::RedisServer;
pub(crate) use crate::common::relay::{relay_to, Relay};
use crate::common::{self, post, start_proxy, start_upstream, ProxyHandle};

/// Waits until `condition` holds (a hang guard of 30 s, never a timing assertion).
pub(crate) async fn until(mut condition: impl FnMut() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The first byte of each idemgate record in Redis (its kind: `I` in flight, `D` done, `T`
/// an issued token…), the rate-limit counters left out.
pub(crate) fn record_kinds(redis: &RedisServer) -> Vec<String> {
    let keys = redis.cli(&["KEYS", "*"]);
    let mut kinds: Vec<String> = keys
        .lines()
        .filter(|key| !key.is_empty() && !key.contains("rate:"))
        .map(|key| redis.cli(&["GETRANGE", key, "0", "0"]).trim().to_owned())
        .collect();
    kinds.sort();
    kinds
}

/// A proxy on Redis through a relay whose replies can be held, with `routes`.
pub(crate) async fn behind_held_replies(
    routes: &str,
) -> (RedisServer, Relay, common::Upstream, ProxyHandle) {
    let redis = RedisServer::start();
    let relay = relay_to(redis.port).await;
    let upstream = start_upstream().await;
    // The store timeout is a hang guard here: the claim must outlast the held reply.
    let config = format!(
        "store:\n  redis: {{ url: \"redis://{}\", timeout: 30s }}\n{routes}",
        relay.addr
    );
    let proxy = start_proxy(upstream.addr, &config).await;
    (redis, relay, upstream, proxy)
}

/// A proxy on Redis through a relay whose replies can be held, with a store `timeout` of
/// 200 ms (`routes` after the store section), its connection to Redis opened by one
/// request with `warm`'s headers.
pub(crate) async fn timing_out_behind_held_replies(
    routes: &str,
) -> (RedisServer, Relay, common::Upstream, ProxyHandle) {
    let redis = RedisServer::start();
    let relay = relay_to(redis.port).await;
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  redis: {{ url: \"redis://{}\", timeout: 200ms }}\n{routes}",
        relay.addr
    );
    let proxy = start_proxy(upstream.addr, &config).await;
    (redis, relay, upstream, proxy)
}

/// An owner held at the upstream's gate `pay` ([`owner_at_gate`]), and any duplicate of it.
pub(crate) const PAY: [(&str, &str); 2] = [("idempotency-key", "pay"), ("x-test-gate", "pay")];

/// The proxy's first request, so its connection to Redis is open (and, on Redis, how it
/// swaps is known) before replies are held or dropped.
pub(crate) async fn warm_up(proxy: &ProxyHandle) {
    let warm = post(proxy.addr, "/orders", &[("idempotency-key", "warm")], "{}").await;
    assert_eq!(warm.status, StatusCode::CREATED);
}

/// An owner of key `pay`, once the upstream holds it at its gate.
pub(crate) async fn owner_at_gate(
    proxy: &ProxyHandle,
    upstream: &common::Upstream,
) -> tokio::task::JoinHandle<common::Answer> {
    let addr = proxy.addr;
    let owner = tokio::spawn(async move { post(addr, "/orders", &PAY, "{}").await });
    upstream.arrived("pay", 1).await;
    owner
}
