//! What a request costs in round trips to Redis and Valkey (two for a first-seen key, one
//! for a replay), and what Redis holds afterwards.

use http::StatusCode;

use crate::common::redis_server::RedisServer;
use crate::common::{post, start_proxy, start_upstream};
use crate::{commands, redis_yaml};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_seen_costs_two_round_trips_and_a_replay_one() {
    // The claim is one `SET NX GET`; the completion the swap script (its GET and SET; no
    // PUBLISH, as nobody waits): Redis 7.0 refuses `SET … IFEQ` (in the warm-up).
    let redis = RedisServer::start();
    round_trips_and_what_redis_holds(&redis, &["evalsha=1", "get=1", "set=2"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_seen_on_valkey_runs_no_script() {
    // The claim is one `SET NX GET`; the completion `SET … IFEQ`: two commands, no Lua.
    let valkey = RedisServer::start_valkey();
    round_trips_and_what_redis_holds(&valkey, &["set=2"]).await;
}

/// A first-seen request runs `first_seen` on `redis` (as `commands` lists them), a replay
/// one `SET NX GET`, and Redis holds no raw key or caller secret.
async fn round_trips_and_what_redis_holds(redis: &RedisServer, first_seen: &[&str]) {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &redis_yaml(&redis.url(), "")).await;
    // Warm up: connection handshake, script loading and learning which `SET` options the
    // server takes are one-time costs.
    post(proxy.addr, "/orders", &[("idempotency-key", "warm")], "{}").await;
    redis.cli(&["CONFIG", "RESETSTAT"]);
    post(proxy.addr, "/orders", &[("idempotency-key", "rt")], "{}").await;
    assert_eq!(commands(redis), first_seen, "claim + complete");
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let replay = post(proxy.addr, "/orders", &[("idempotency-key", "rt")], "{}").await;
    assert!(replay.replayed());
    assert_eq!(commands(redis), ["set=1"], "the claim's SET NX GET only");
    // What Redis holds: digests and the response, never the raw key or caller secrets.
    let keys = redis.cli(&["--scan", "--pattern", "t:*"]);
    // Every record is named `t:{<64 hex digits>}`: the digest, never the client's key.
    assert!(!keys.trim().is_empty(), "records were written");
    for name in keys.lines() {
        let digest = name
            .strip_prefix("t:{")
            .and_then(|rest| rest.strip_suffix('}'))
            .unwrap_or_else(|| panic!("record name {name:?}"));
        assert!(
            digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "record name {name:?}"
        );
    }
    let auth = post(
        proxy.addr,
        "/orders",
        &[
            ("idempotency-key", "secret-key-123"),
            ("authorization", "Bearer sk_live_abc"),
        ],
        "{}",
    )
    .await;
    assert_eq!(auth.status, StatusCode::CREATED);
    let dump = redis.cli(&["--scan", "--pattern", "*"]);
    assert!(
        !dump.contains("secret-key-123") && !dump.contains("sk_live"),
        "{dump}"
    );
}
