//! Scenarios run the same way on every shared store (Redis, PostgreSQL, MariaDB): two
//! in-process proxies on one store, one of them linked to it through a [`Relay`].

use std::time::{Duration, Instant};

use http::StatusCode;

use super::client::post;
use super::proxy::start_proxy;
use super::relay::Relay;
use super::upstream::start_upstream;

/// A route `orders` on `/orders` keyed by `Idempotency-Key`, after a `store:` section.
fn orders(store: &str, defaults: &str) -> String {
    format!(
        "store:\n{store}defaults: {{ {defaults} }}\nroutes:\n  - name: orders\n    match: {{ methods: [POST], path: /orders }}\n    key: {{ header: Idempotency-Key, required: true }}\n"
    )
}

/// Waits until `condition` holds (a hang guard of 30 s, never a timing assertion).
async fn until(mut condition: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "hang guard: gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An owner on proxy `a` (store section `direct`) fails with a 500 while a duplicate waits
/// on proxy `b` (store section `relayed`: through `relay`, with a store timeout that
/// outlasts the hold below), on a route with `on_unknown_outcome: release`. What `b` sends
/// to the store is held from just before the failure until `failure_gone` says the
/// failure record has expired (its linger passed): the duplicate's next look comes only
/// then, and finds the key free. It waited on an owner that failed, not on one that
/// vanished: it must not take the key and execute the request a second time (SPEC: the
/// duplicates that were waiting get the owner's outcome; only a later request executes
/// again).
pub async fn a_duplicate_that_looks_after_its_owners_failure_expired_does_not_execute(
    direct: &str,
    relayed: &str,
    relay: &Relay,
    failure_gone: impl FnMut() -> bool,
) {
    let upstream = start_upstream().await;
    let defaults = "on_unknown_outcome: release, wait_timeout: 60s";
    let a = start_proxy(upstream.addr, &orders(direct, defaults)).await;
    let b = start_proxy(upstream.addr, &orders(relayed, defaults)).await;
    let addr = a.addr;
    let owner = tokio::spawn(async move {
        let headers = [
            ("idempotency-key", "fails"),
            ("x-test-gate", "fails"),
            ("x-test-status", "500"),
        ];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("fails", 1).await;
    let addr = b.addr;
    let duplicate =
        tokio::spawn(
            async move { post(addr, "/orders", &[("idempotency-key", "fails")], "{}").await },
        );
    b.metric_reaches("idemgate_waiting", 1.0).await;
    relay.hold_requests.send_replace(true);
    upstream.open("fails");
    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::INTERNAL_SERVER_ERROR);
    until(failure_gone, "the failure record to expire").await;
    relay.hold_requests.send_replace(false);
    let duplicate = duplicate.await.unwrap();
    assert_eq!(
        upstream.executed_for("fails"),
        1,
        "the duplicate that waited on the failed owner ran the request again: {:?} {}",
        duplicate.status,
        String::from_utf8_lossy(&duplicate.body)
    );
    // What a duplicate of a failed owner gets when the failure itself is gone.
    assert_eq!(duplicate.status, StatusCode::BAD_GATEWAY, "{duplicate:?}");
    assert_eq!(
        duplicate.json()["type"],
        "urn:idemgate:problem:duplicate-of-failed-request"
    );
}
