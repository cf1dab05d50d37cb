//! A Redis that may evict keys under memory pressure (a `maxmemory` with a policy other
//! than `noeviction`) would drop a claim in flight and let its duplicate run, or drop an
//! answer and let its retry run: the store refuses to claim on it until it no longer may,
//! and uses a server that will not say (`INFO` forbidden, as on some managed services)
//! unchecked.

use std::time::{Duration, Instant};

use http::StatusCode;

use crate::common::redis_server::RedisServer;
use crate::common::{post, start_proxy, start_upstream, ProxyHandle, Upstream};
use crate::redis_yaml;

fn evicting(extra: &[&str]) -> RedisServer {
    let mut args = vec!["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"];
    args.extend_from_slice(extra);
    RedisServer::start_with(args.into_iter().map(String::from).collect())
}

/// An upstream and a proxy in front of it on `redis`, with `on_store_error` as given.
async fn proxy_on(redis: &RedisServer, on_store_error: &str) -> (Upstream, ProxyHandle) {
    let upstream = start_upstream().await;
    let yaml = redis_yaml(&redis.url(), &format!("on_store_error: {on_store_error}"));
    let proxy = start_proxy(upstream.addr, &yaml).await;
    (upstream, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_may_evict_claims_is_refused_until_it_no_longer_may() {
    let redis = evicting(&[]);
    let (upstream, proxy) = proxy_on(&redis, "fail_closed").await;
    let refused = post(proxy.addr, "/orders", &[("idempotency-key", "a")], "{}").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        upstream.executed(),
        0,
        "nothing runs on a store that may lose it"
    );

    // Fixed at runtime: the store takes claims again without a restart.
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = post(proxy.addr, "/orders", &[("idempotency-key", "b")], "{}").await;
        if answer.status == StatusCode::CREATED {
            break;
        }
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(Instant::now() < deadline, "still refused after the fix");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let replay = post(proxy.addr, "/orders", &[("idempotency-key", "b")], "{}").await;
    assert!(replay.replayed());
    assert_eq!(upstream.executed(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_will_not_say_whether_it_evicts_is_used_unchecked() {
    let redis = evicting(&["--rename-command", "INFO", "info-hidden"]);
    let (upstream, proxy) = proxy_on(&redis, "fail_closed").await;
    let first = post(proxy.addr, "/orders", &[("idempotency-key", "a")], "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let replay = post(proxy.addr, "/orders", &[("idempotency-key", "a")], "{}").await;
    assert!(replay.replayed());
    assert_eq!(upstream.executed(), 1);
}

/// A server that may evict is reachable and answering: refusing its claims is not an
/// outage, so `fail_open` must not forward the request unprotected (every retry of it
/// would run again, a duplicate beside its running owner too). It gets the 503, as a
/// memory store refusing new keys answers whatever `on_store_error` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_may_evict_is_not_failed_open_past() {
    let redis = evicting(&[]);
    let (upstream, proxy) = proxy_on(&redis, "fail_open").await;
    for _ in 0..2 {
        let answer = post(proxy.addr, "/orders", &[("idempotency-key", "a")], "{}").await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(upstream.executed(), 0, "a retry ran unprotected");
}
