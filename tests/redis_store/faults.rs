//! Redis down: `fail_closed` answers 503 and `fail_open` forwards while it is, both recover
//! when it is back, and a Redis down at start does not stop the proxy.

use std::time::Duration;

use http::{Method, StatusCode};

use crate::common::redis_server::RedisServer;
use crate::common::{self, post, send, start_proxy, start_upstream, ProxyProcess};
use crate::redis_yaml;

/// Fires keyed requests in waves; some keys repeat across waves so a lost record would
/// show up as a second execution.
async fn wave(addr: std::net::SocketAddr, wave: usize) -> Vec<StatusCode> {
    let mut tasks = Vec::new();
    for i in 0..20 {
        tasks.push(tokio::spawn(async move {
            let key = format!("w{}-{}", wave % 3, i);
            post(addr, "/orders", &[("idempotency-key", &key)], "{}")
                .await
                .status
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses
}

fn durable_redis() -> RedisServer {
    // Redis that keeps what it acknowledged across a kill, as a production one would.
    RedisServer::start_with(
        ["--appendonly", "yes", "--appendfsync", "always"]
            .map(String::from)
            .to_vec(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_answers_503_while_redis_is_down_and_recovers() {
    let mut redis = durable_redis();
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &redis_yaml(&redis.url(), "on_store_error: fail_closed"),
    )
    .await;
    assert!(wave(proxy.addr, 0)
        .await
        .iter()
        .all(|s| *s == StatusCode::CREATED));
    assert!(wave(proxy.addr, 1)
        .await
        .iter()
        .all(|s| *s == StatusCode::CREATED));
    let before = upstream.executed();
    redis.kill();
    let down = wave(proxy.addr, 2).await;
    assert!(
        down.iter().all(|s| *s == StatusCode::SERVICE_UNAVAILABLE),
        "{down:?}"
    );
    let problem = post(proxy.addr, "/orders", &[("idempotency-key", "x")], "{}").await;
    assert_eq!(
        problem.json()["type"],
        "urn:idemgate:problem:store-unavailable"
    );
    assert_eq!(
        upstream.executed(),
        before,
        "nothing was forwarded unprotected"
    );
    assert!(!proxy.store.ready().await);
    // Unprotected traffic does not depend on the store.
    assert_eq!(
        send(proxy.addr, Method::GET, "/health", &[], "")
            .await
            .status,
        StatusCode::OK
    );
    redis.restart();
    wait_until_async(|| proxy.store.ready()).await;
    // Same keys again (wave 0 ≡ wave 3): replayed from the restarted, durable Redis.
    let after = wave(proxy.addr, 3).await;
    assert!(after.iter().all(|s| *s == StatusCode::CREATED), "{after:?}");
    assert!(wave(proxy.addr, 2)
        .await
        .iter()
        .all(|s| *s == StatusCode::CREATED));
    assert_eq!(
        upstream.most_executions_of_one_key(),
        1,
        "no key ever executed twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_forwards_while_redis_is_down_and_recovers() {
    let mut redis = durable_redis();
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &redis_yaml(&redis.url(), "on_store_error: fail_open"),
    )
    .await;
    assert!(wave(proxy.addr, 0)
        .await
        .iter()
        .all(|s| *s == StatusCode::CREATED));
    redis.kill();
    let before = upstream.executed();
    let down = wave(proxy.addr, 1).await;
    assert!(down.iter().all(|s| *s == StatusCode::CREATED), "{down:?}");
    assert_eq!(upstream.executed(), before + 20, "forwarded unprotected");
    redis.restart();
    wait_until_async(|| proxy.store.ready()).await;
    let replay = post(proxy.addr, "/orders", &[("idempotency-key", "w0-1")], "{}").await;
    assert!(replay.replayed(), "protection is back without a restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_at_start_does_not_stop_the_proxy() {
    let (dead, held) = common::refusing_addr();
    let dead_port = dead.port();
    let upstream = start_upstream().await;
    let proxy = ProxyProcess::start(
        upstream.addr,
        &redis_yaml(&format!("redis://127.0.0.1:{dead_port}"), ""),
    );
    let ready = send(proxy.admin, Method::GET, "/readyz", &[], "").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        send(proxy.admin, Method::GET, "/healthz", &[], "")
            .await
            .status,
        StatusCode::OK
    );
    let refused = post(proxy.addr, "/orders", &[("idempotency-key", "k")], "{}").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    // Redis comes up on that port: service recovers without a restart.
    drop(held);
    let _redis = RedisServer::start_on(dead_port);
    let admin = proxy.admin;
    wait_until_async(|| async move {
        send(admin, Method::GET, "/readyz", &[], "").await.status == StatusCode::OK
    })
    .await;
    let ok = post(proxy.addr, "/orders", &[("idempotency-key", "k")], "{}").await;
    assert_eq!(ok.status, StatusCode::CREATED);
    assert_eq!(upstream.executed(), 1);
}

async fn wait_until_async<F, Fut>(mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !condition().await {
        assert!(std::time::Instant::now() < deadline, "hang guard");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A settlement Redis missed is made again in the background, and what that retry logs
/// carries the request's span (method, route, key) like every line the request causes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_retried_in_the_background_logs_in_its_requests_span() {
    use std::sync::atomic::Ordering;

    let redis = RedisServer::start();
    let relay = crate::common::relay::relay_to(redis.port).await;
    let upstream = start_upstream().await;
    let url = format!("redis://{}", relay.addr);
    let proxy = ProxyProcess::start_logging(upstream.addr, &redis_yaml(&url, ""), "info");
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [("idempotency-key", "retried"), ("x-test-gate", "settle")];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("settle", 1).await;
    relay.cut.store(true, Ordering::SeqCst);
    upstream.open("settle");
    assert_eq!(owner.await.unwrap().status, StatusCode::CREATED);
    assert!(proxy.log().contains("could not settle the claim"));
    relay.cut.store(false, Ordering::SeqCst);
    crate::common::redis_server::wait_until(
        || proxy.log().contains("settled the claim on a retry"),
        "the background settlement",
    );
    let log = proxy.log();
    let line = log
        .lines()
        .find(|l| l.contains("settled the claim on a retry"))
        .unwrap();
    assert!(line.contains("route=create-order"), "{line}");
    assert!(line.contains("method=POST"), "{line}");
    let replay = post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "retried")],
        "{}",
    )
    .await;
    assert!(replay.replayed());
    assert_eq!(upstream.executed(), 1);
}
