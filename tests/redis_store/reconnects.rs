//! What the connection does when the server behind its address changes or goes away: a
//! primary demoted to a replica (a failover behind a DNS name or virtual IP) is left for
//! the one now behind the address, and the channels of waiters that left while Redis was
//! down do not stay subscribed across reconnects.

use std::sync::atomic::Ordering;

use http::StatusCode;

use crate::common::redis_server::{wait_until, RedisServer};
use crate::common::relay::relay_to;
use crate::common::{post, start_proxy, start_upstream};
use crate::redis_yaml;

/// A failover behind one address: the proxy's connection still reaches the old primary,
/// now a replica that answers every write `READONLY`, while new connections reach the new
/// primary. The proxy reconnects instead of failing every claim until it restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_is_left_for_the_new_one() {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let relay = relay_to(old.port).await;
    let upstream = start_upstream().await;
    let url = format!("redis://{}", relay.addr);
    let proxy = start_proxy(
        upstream.addr,
        &redis_yaml(&url, "on_store_error: fail_closed"),
    )
    .await;
    let warm = post(proxy.addr, "/orders", &[("idempotency-key", "warm")], "{}").await;
    assert_eq!(warm.status, StatusCode::CREATED);

    let port = new.port.to_string();
    assert_eq!(old.cli(&["REPLICAOF", "127.0.0.1", &port]).trim(), "OK");
    relay.target.store(new.port, Ordering::SeqCst);

    let first = post(proxy.addr, "/orders", &[("idempotency-key", "moved")], "{}").await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let again = post(proxy.addr, "/orders", &[("idempotency-key", "moved")], "{}").await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(upstream.executed_for("moved"), 1);
}

/// The channels `t:done:*` Redis has subscribers on.
fn subscribed(redis: &RedisServer) -> usize {
    redis
        .cli(&["PUBSUB", "CHANNELS", "t:done:*"])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// 50 duplicates wait on 50 keys in flight; Redis dies, so they give up, and their
/// `UNSUBSCRIBE`s cannot reach it. Once it is back (on the same address), none of their
/// channels is subscribed: the connection does not carry them across reconnects forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_leaving_while_redis_is_down_leave_no_subscription() {
    let mut redis = RedisServer::start();
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &redis_yaml(&redis.url(), "wait_timeout: 60s, lease: 30s"),
    )
    .await;
    let addr = proxy.addr;
    let keys: Vec<String> = (0..50).map(|i| format!("k{i}")).collect();
    let owners: Vec<_> = keys
        .iter()
        .map(|key| {
            let key = key.clone();
            tokio::spawn(async move {
                let headers = [("idempotency-key", key.as_str()), ("x-test-gate", "hold")];
                post(addr, "/orders", &headers, "{}").await
            })
        })
        .collect();
    upstream.arrived("hold", 50).await;
    let waiters: Vec<_> = keys
        .iter()
        .map(|key| {
            let key = key.clone();
            tokio::spawn(async move {
                post(addr, "/orders", &[("idempotency-key", key.as_str())], "{}").await
            })
        })
        .collect();
    wait_until(|| subscribed(&redis) == 50, "every waiter subscribed");

    redis.kill();
    for waiter in waiters {
        let answer = waiter.await.unwrap();
        // Told to retry (the store failed under its wait), never run: which refusal
        // depends on the command the outage cut, and is not what this test is about.
        assert!(!answer.status.is_success(), "{answer:?}");
    }
    assert_eq!(upstream.executed(), 50, "only the owners ran");
    redis.restart();
    // Back on a new connection, which resubscribes what the connection still counts as
    // subscribed before it sends anything else.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !proxy.store.ready().await {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: never reconnected"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let ok = post(proxy.addr, "/orders", &[("idempotency-key", "after")], "{}").await;
    assert_eq!(ok.status, StatusCode::CREATED);
    wait_until(|| subscribed(&redis) == 0, "no waiter's channel subscribed");
    upstream.open("hold");
    for owner in owners {
        owner.await.unwrap();
    }
    assert_eq!(
        upstream.executed(),
        51,
        "each owner once, and the request after"
    );
}
