//! A duplicate that waited across a rekeying reload on a request the config before it
//! keyed gets that request's outcome, failures included, as a duplicate of its own key
//! does: it never runs the request itself.

use http::StatusCode;

use crate::common::redis_server::RedisServer;
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
