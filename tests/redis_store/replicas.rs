//! Exactly once between replicas on Redis and Valkey: two proxy processes, a killed
//! owner's key held as unknown or taken over once after its grace, an owner slower than
//! several leases, Redis restarted empty mid-claim, and a duplicate whose owner fails
//! between its two looks.

use std::time::Duration;

use http::StatusCode;

use crate::common::redis_server::RedisServer;
use crate::common::{self, post, start_proxy, start_upstream, ProxyProcess};
use crate::redis_yaml;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxy_processes_on_one_redis_execute_each_key_once() {
    two_proxies_execute_each_key_once(&RedisServer::start()).await;
}

/// The same on Valkey 9, where completions are `SET … IFEQ` instead of the completion
/// script: a key the other replica waits on completes by the script, which wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxy_processes_on_one_valkey_execute_each_key_once() {
    two_proxies_execute_each_key_once(&RedisServer::start_valkey()).await;
}

/// 200 requests over 10 keys, alternating between two proxy processes on `redis`: each
/// key executes once and every answer for it is the same.
async fn two_proxies_execute_each_key_once(redis: &RedisServer) {
    common::two_proxies_execute_each_key_once(&redis_yaml(&redis.url(), "wait_timeout: 30s")).await;
}

/// Sends a request through `addr` that reaches the upstream's gate `gate` and is never
/// answered there: its replica is killed meanwhile.
fn doomed(addr: std::net::SocketAddr, key: &'static str, gate: &'static str) {
    tokio::spawn(async move {
        let request = http::Request::post(format!("http://{addr}/orders"))
            .header("idempotency-key", key)
            .header("x-test-gate", gate)
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap();
        common::client().request(request).await
    });
}

/// 20 retries of `key` at once through `addr`.
async fn burst(addr: std::net::SocketAddr, key: &'static str) -> Vec<common::Answer> {
    let retries: Vec<_> = (0..20)
        .map(|_| {
            tokio::spawn(
                async move { post(addr, "/orders", &[("idempotency-key", key)], "{}").await },
            )
        })
        .collect();
    let mut answers = Vec::new();
    for retry in retries {
        answers.push(retry.await.unwrap());
    }
    answers
}

/// A replica killed while its upstream call runs: bursts of retries on another replica
/// never execute the request again. While the dead owner's lease runs they hear it is in
/// flight; once it lapsed, that its outcome is unknown (`on_unknown_outcome: hold`, the
/// default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owners_key_is_held_as_unknown_and_never_run_again() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let config = redis_yaml(&redis.url(), "lease: 1s, wait_timeout: 100ms");
    let mut a = ProxyProcess::start(upstream.addr, &config);
    let b = ProxyProcess::start(upstream.addr, &config);
    doomed(a.addr, "crash", "crash");
    upstream.arrived("crash", 1).await;
    a.kill();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: never lapsed"
        );
        let answers = burst(b.addr, "crash").await;
        for answer in &answers {
            assert_eq!(answer.status, StatusCode::CONFLICT, "{:?}", answer.body);
        }
        if answers
            .iter()
            .all(|a| a.problem() == "urn:idemgate:problem:outcome-unknown")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(upstream.executed_for("crash"), 1, "never run again");
    upstream.open("crash");
}

/// With `on_unknown_outcome: release` a killed owner's key is taken over, but not before
/// its lease and `background_timeout` passed (its call could run until then), and by
/// exactly one of the bursts of retries racing for it; the others replay that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owners_key_is_taken_over_once_after_its_grace_when_released() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let config = redis_yaml(
        &redis.url(),
        "lease: 500ms, upstream_timeout: 500ms, background_timeout: 1s, on_unknown_outcome: release, wait_timeout: 100ms",
    );
    let mut a = ProxyProcess::start(upstream.addr, &config);
    let b = ProxyProcess::start(upstream.addr, &config);
    doomed(a.addr, "crash", "crash");
    upstream.arrived("crash", 1).await;
    let arrived = std::time::Instant::now();
    a.kill();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut executed_again = Vec::new();
    let taken_over = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: never taken over"
        );
        let answers = burst(b.addr, "crash").await;
        let now = std::time::Instant::now();
        for answer in answers {
            match answer.status {
                StatusCode::CONFLICT => {
                    assert_eq!(answer.problem(), "urn:idemgate:problem:in-flight")
                }
                StatusCode::CREATED if !answer.replayed() => executed_again.push(answer),
                StatusCode::CREATED => {}
                other => panic!(
                    "unexpected {other}: {}",
                    String::from_utf8_lossy(&answer.body)
                ),
            }
        }
        if !executed_again.is_empty() {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(executed_again.len(), 1, "one retry took it over");
    // The claim was taken before its request arrived, so the takeover came at least the
    // grace after the arrival (plus the lease, after the last renewal).
    assert!(
        taken_over - arrived >= Duration::from_secs(1),
        "{:?}",
        taken_over - arrived
    );
    let again = post(b.addr, "/orders", &[("idempotency-key", "crash")], "{}").await;
    assert!(again.replayed());
    assert_eq!(again.body, executed_again[0].body);
    assert_eq!(upstream.executed_for("crash"), 2);
    upstream.open("crash");
}

/// On Redis, an owner slower than several leases keeps its key through the proxy: its
/// renewals keep a duplicate out (409 in reject mode), and the duplicate then replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_slower_than_several_leases_keeps_its_key_on_redis() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &redis_yaml(&redis.url(), "lease: 300ms, in_flight: reject"),
    )
    .await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [("idempotency-key", "slow"), ("x-test-gate", "slow")];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("slow", 1).await;
    // Four leases pass while the owner is held: only renewals keep its claim.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let duplicate = post(addr, "/orders", &[("idempotency-key", "slow")], "{}").await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(duplicate.problem(), "urn:idemgate:problem:in-flight");
    upstream.open("slow");
    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::CREATED);
    let again = post(addr, "/orders", &[("idempotency-key", "slow")], "{}").await;
    assert!(again.replayed());
    assert_eq!(upstream.executed(), 1);
}

/// Redis killed under ten running owners and restarted empty (no persistence): each owner
/// finds its claim gone and writes its answer back, so the retries replay; no key runs
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_mid_claim_still_executes_each_key_once() {
    let mut redis = RedisServer::start();
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &redis_yaml(&redis.url(), "")).await;
    let keys: Vec<String> = (0..10).map(|n| format!("r{n}")).collect();
    let owners: Vec<_> = keys
        .iter()
        .map(|key| {
            let (addr, key) = (proxy.addr, key.clone());
            tokio::spawn(async move {
                let headers = [("idempotency-key", key.as_str()), ("x-test-gate", "mid")];
                post(addr, "/orders", &headers, "{}").await
            })
        })
        .collect();
    upstream.arrived("mid", 10).await;
    redis.restart();
    upstream.open("mid");
    let mut firsts = Vec::new();
    for owner in owners {
        let answer = owner.await.unwrap();
        assert_eq!(answer.status, StatusCode::CREATED);
        firsts.push(answer);
    }
    for (key, first) in keys.iter().zip(&firsts) {
        let retry = post(proxy.addr, "/orders", &[("idempotency-key", key)], "{}").await;
        assert!(retry.replayed(), "{key} ran again");
        assert_eq!(retry.body, first.body);
    }
    assert_eq!(upstream.executed(), 10);
    assert_eq!(upstream.most_executions_of_one_key(), 1);
}

/// A duplicate on another replica found the owner in flight, then looks again once
/// subscribed to the key's channel. If the owner settles a failure (its 500) between those
/// two looks, the duplicate shares that 500, never takes the failure record over and runs
/// the request itself. A relay in front of the duplicate's replica holds what it sends
/// after its first look's reply, so the owner's failure lands between the looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_shares_a_failure_its_owner_settles_between_its_two_looks() {
    use std::sync::atomic::Ordering;
    let redis = RedisServer::start();
    let relay = crate::common::relay::relay_to(redis.port).await;
    let upstream = start_upstream().await;
    let yaml = |url: &str| redis_yaml(url, "wait_timeout: 30s").replace("500ms", "30s");
    let a = ProxyProcess::start(upstream.addr, &yaml(&redis.url()));
    let relayed = redis.url().replace(
        &format!(":{}", redis.port),
        &format!(":{}", relay.addr.port()),
    );
    let b = ProxyProcess::start(upstream.addr, &yaml(&relayed));
    for (proxy, key) in [(&a, "warm-a"), (&b, "warm-b")] {
        let warm = post(proxy.addr, "/orders", &[("idempotency-key", key)], "{}").await;
        assert_eq!(warm.status, StatusCode::CREATED);
    }
    let owner_addr = a.addr;
    let owner = tokio::spawn(async move {
        let headers = [
            ("idempotency-key", "fails"),
            ("x-test-gate", "fails"),
            ("x-test-status", "500"),
        ];
        post(owner_addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("fails", 1).await;
    // The duplicate's first look passes (and finds the owner in flight); what its replica
    // sends after that reply waits at the relay.
    relay
        .hold_requests_after_next_reply
        .store(true, Ordering::SeqCst);
    let duplicate_addr = b.addr;
    let duplicate = tokio::spawn(async move {
        post(
            duplicate_addr,
            "/orders",
            &[("idempotency-key", "fails")],
            "{}",
        )
        .await
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while relay.requests_held() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: the duplicate never looked again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    upstream.open("fails");
    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::INTERNAL_SERVER_ERROR);
    relay.hold_requests.send_replace(false);
    let duplicate = duplicate.await.unwrap();
    assert_eq!(
        upstream.executed_for("fails"),
        1,
        "the duplicate that found the owner in flight ran it again: {:?}",
        duplicate.status
    );
    assert_eq!(duplicate.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(duplicate.replayed());
}
