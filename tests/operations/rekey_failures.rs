//! A duplicate that waited across a rekeying reload on a request the config before it
//! keyed gets that request's outcome, failures included, as a duplicate of its own key
//! does: it never runs the request itself.

use std::time::{Duration, Instant};

use http::StatusCode;

use crate::common::redis_server::RedisServer;
use crate::common::relay::relay_to;
use crate::common::{post, reload, start_proxy_with_admin, start_upstream};
use crate::ROUTES;

/// The owner, routed before the reload, is held at the upstream's gate; the duplicate sent
/// after it finds the key the old config gave it in flight and waits. The owner's answer
/// is a 5xx too large to keep, so its key is freed with no failure to share: the duplicate
/// is told the request it waited on failed (`502`), and the upstream ran it once. A later
/// retry runs it again, as after any failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waiting_across_a_rekeying_reload_on_an_owner_that_failed_never_runs() {
    duplicate_of_a_failed_owner("").await;
}

/// The same on Redis, where the duplicate waits on the earlier key's channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waiting_across_a_rekeying_reload_on_a_failed_owner_never_runs_on_redis() {
    let redis = RedisServer::start();
    duplicate_of_a_failed_owner(&format!(
        "store:\n  redis: {{ url: \"{}\" }}\n",
        redis.url()
    ))
    .await;
}

async fn duplicate_of_a_failed_owner(store: &str) {
    let routes = ROUTES.replace(
        "defaults: { max_body: 1KiB }",
        "defaults: { max_body: 1KiB, max_answer: 64KiB }",
    );
    let config = format!("{store}{routes}");
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, &config, None).await;
    let addr = proxy.addr;
    let failing = [
        ("idempotency-key", "fails"),
        ("x-test-gate", "fails"),
        ("x-test-status", "503"),
        ("x-test-bytes", "1048576"),
    ];
    let owner = tokio::spawn(async move { post(addr, "/orders", &failing, "{}").await });
    upstream.arrived("fails", 1).await;
    let renamed = config.replace("- name: orders\n", "- name: purchases\n");
    let reloaded = reload(&proxy, upstream.addr, &renamed);
    assert!(reloaded.honoured_until.is_some(), "{reloaded:?}");
    let duplicate = tokio::spawn(async move { post(addr, "/orders", &failing, "{}").await });
    proxy.metric_reaches("idemgate_waiting", 1.0).await;
    upstream.open("fails");
    let first = owner.await.unwrap();
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(first.body.len(), 1 << 20, "streamed whole");
    let second = duplicate.await.unwrap();
    assert_eq!(
        upstream.executed_for("fails"),
        1,
        "the duplicate that waited ran"
    );
    assert_eq!(second.status, StatusCode::BAD_GATEWAY, "{:?}", second.body);
    assert_eq!(
        second.problem(),
        "urn:idemgate:problem:duplicate-of-failed-request"
    );
    let retry = post(addr, "/orders", &[("idempotency-key", "fails")], "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert_eq!(upstream.executed_for("fails"), 2);
}

/// The owner, keyed after a rekeying reload, holds its own key and the one the config
/// before gave it; its client gets a 504 and it runs on, detached, bounded by
/// `background_timeout`. The upstream answers before the bound, just as Redis slows down:
/// the settlements wait on Redis, and the bound hits while they do. The answer is in hand,
/// so the owner's own key must still end with it, never as an unknown outcome (held, its
/// retries would get a 409 for the whole `ttl`) nor released: the retry replays it, and
/// the upstream ran the request once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_in_hand_when_the_background_bound_hits_is_not_released() {
    let redis = RedisServer::start();
    let relay = relay_to(redis.port).await;
    // Redis's own timeout outlasts the bound: the settlement is still waiting when it hits.
    let store = format!(
        "store:\n  redis: {{ url: \"redis://{}\", timeout: 20s }}\n",
        relay.addr
    );
    let bound = Duration::from_secs(3);
    let routes = ROUTES.replace(
        "defaults: { max_body: 1KiB }",
        "defaults: { max_body: 1KiB, upstream_timeout: 300ms, background_timeout: 3s }",
    );
    let config = format!("{store}{routes}");
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, &config, None).await;
    let renamed = config.replace("- name: orders\n", "- name: purchases\n");
    let reloaded = reload(&proxy, upstream.addr, &renamed);
    assert!(reloaded.honoured_until.is_some(), "{reloaded:?}");
    let addr = proxy.addr;
    let gated = [("idempotency-key", "late"), ("x-test-gate", "late")];
    let sent = Instant::now();
    let owner = tokio::spawn(async move { post(addr, "/orders", &gated, "{}").await });
    upstream.arrived("late", 1).await;
    let first = owner.await.unwrap();
    assert_eq!(
        first.status,
        StatusCode::GATEWAY_TIMEOUT,
        "{:?}",
        first.body
    );
    // Redis slows down (what the proxy sends waits), then the upstream answers.
    relay.hold_requests.send_replace(true);
    upstream.open("late");
    let answered = r#"idemgate_upstream_seconds_count{route="purchases"}"#;
    proxy.metric_reaches(answered, 1.0).await;
    assert!(
        sent.elapsed() < bound - Duration::from_millis(500),
        "inconclusive: the answer came back too close to the bound ({:?})",
        sent.elapsed()
    );
    // The bound drops the owner, its settlements still waiting on Redis.
    let deadline = Instant::now() + Duration::from_secs(30);
    while proxy.metric("idemgate_in_flight") > 0.0 {
        assert!(
            Instant::now() < deadline,
            "hang guard: the owner never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(sent.elapsed() >= bound, "the owner ended before its bound");
    relay.hold_requests.send_replace(false);
    let retry = loop {
        let retry = post(addr, "/orders", &[("idempotency-key", "late")], "{}").await;
        let in_flight = retry.status == StatusCode::CONFLICT
            && retry.problem() == "urn:idemgate:problem:in-flight";
        if !in_flight {
            break retry;
        }
        assert!(
            Instant::now() < deadline,
            "hang guard: the key stayed in flight"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert!(retry.replayed(), "the retry was not replayed");
    assert_eq!(upstream.executed_for("late"), 1, "the retry ran again");
}
