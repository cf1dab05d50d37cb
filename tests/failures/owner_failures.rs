//! An owner's upstream failing: a 500 shared with the duplicates that waited, a request
//! timed out and its late answer replayed, an upstream that never answers, a reset after
//! the request went out.

use http::{Method, StatusCode};

use crate::common::{self, post, start_proxy, start_proxy_with_admin, start_upstream, ProxyHandle};
use crate::{park_duplicates, route};

/// Three clicks on "pay" against an upstream that answers 500 after a partial commit:
/// the duplicates that were waiting get the owner's 500 (marked as a replay), never a
/// turn of their own. Only a request that comes after it executes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_waiting_on_a_failing_owner_share_its_500_and_do_not_execute() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &route("wait_timeout: 30s")).await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [
            ("idempotency-key", "pay"),
            ("x-test-gate", "pay"),
            ("x-test-status", "500"),
        ];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("pay", 1).await;
    let duplicates = park_duplicates(&proxy, "pay", 5).await;
    upstream.open("pay");
    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::INTERNAL_SERVER_ERROR);
    for duplicate in duplicates {
        let duplicate = duplicate.await.unwrap();
        assert_eq!(duplicate.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(duplicate.replayed(), "the owner's failure, shared");
        assert_eq!(duplicate.body, owner.body);
    }
    assert_eq!(upstream.executed(), 1, "the waiting duplicates ran nothing");
    assert_eq!(
        proxy.metric(r#"idemgate_requests_total{route="orders",outcome="failure_shared"}"#),
        5.0
    );

    // A retry after the failure is a new attempt.
    let later = post(proxy.addr, "/orders", &[("idempotency-key", "pay")], "{}").await;
    assert_eq!(later.status, StatusCode::CREATED);
    assert!(!later.replayed());
    assert_eq!(upstream.executed(), 2);
}

/// `upstream_timeout` passes while the upstream still works: the client gets a 504, the
/// owner keeps waiting in the background, and a retry meanwhile does not execute again;
/// once the answer comes it is stored, and the retry gets it replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_request_is_not_run_again_and_its_late_answer_is_replayed() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &route("upstream_timeout: 300ms\n    background_timeout: 60s\n    wait_timeout: 100ms"),
    )
    .await;
    let first = [("idempotency-key", "late"), ("x-test-gate", "late")];
    let timed_out = post(proxy.addr, "/orders", &first, "{}").await;
    assert_eq!(timed_out.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(timed_out.problem(), "urn:idemgate:problem:upstream-timeout");
    upstream.arrived("late", 1).await;

    // While the first still runs, the retry waits, then hears it is in progress.
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "late")], "{}").await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert_eq!(retry.problem(), "urn:idemgate:problem:in-flight");
    assert_eq!(upstream.executed(), 1);

    upstream.open("late");
    let replayed = retry_until(&proxy, "late", |a| a.status != StatusCode::CONFLICT).await;
    assert_eq!(replayed.status, StatusCode::CREATED);
    assert!(replayed.replayed());
    assert_eq!(replayed.json()["n"], 1, "the first execution's answer");
    assert_eq!(upstream.executed(), 1);
}

/// Retries `key` (each is answered at once or after a short wait) until `done` says so.
async fn retry_until(
    proxy: &ProxyHandle,
    key: &str,
    done: impl Fn(&common::Answer) -> bool,
) -> common::Answer {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let answer = post(proxy.addr, "/orders", &[("idempotency-key", key)], "{}").await;
        if done(&answer) {
            return answer;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: {key} never settled"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// An upstream that takes the request and never answers: past `background_timeout` the
/// key is held as an unknown outcome, counted, and every retry gets that problem instead
/// of a second execution, until an operator purges the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_never_answers_leaves_the_key_held_as_unknown() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(
        upstream.addr,
        &route("upstream_timeout: 200ms\n    background_timeout: 400ms\n    wait_timeout: 50ms"),
        Some("admin-token"),
    )
    .await;
    let first = [("idempotency-key", "lost"), ("x-test-gate", "never")];
    let timed_out = post(proxy.addr, "/orders", &first, "{}").await;
    assert_eq!(timed_out.status, StatusCode::GATEWAY_TIMEOUT);
    let held = retry_until(&proxy, "lost", |a| {
        a.problem() != "urn:idemgate:problem:in-flight"
    })
    .await;
    assert_eq!(held.status, StatusCode::CONFLICT);
    assert_eq!(held.problem(), "urn:idemgate:problem:outcome-unknown");
    assert_eq!(upstream.executed(), 1);
    assert_eq!(
        proxy.metric(r#"idemgate_unknown_outcomes_total{route="orders"}"#),
        1.0
    );

    // Support checked what happened and purges the key: the next retry executes.
    let digest = common::stored_key(&proxy, "/orders", &[("idempotency-key", "lost")], b"{}");
    let purge = common::send(
        proxy.admin,
        Method::DELETE,
        &format!("/keys/{digest}"),
        &[("authorization", "Bearer admin-token")],
        "",
    )
    .await;
    assert_eq!(purge.status, StatusCode::NO_CONTENT);
    let after = post(proxy.addr, "/orders", &[("idempotency-key", "lost")], "{}").await;
    assert_eq!(after.status, StatusCode::CREATED);
    assert_eq!(upstream.executed(), 2);
}

/// An upstream that reads the request and breaks the connection without an answer may
/// have executed it: the client gets a 502, and the key is held (no retry executes); with
/// `on_unknown_outcome: release` the retry executes, as the operator chose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_after_sending_holds_the_key_unless_release_is_configured() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &route("wait_timeout: 100ms")).await;
    let reset = [("idempotency-key", "reset"), ("x-test-reset", "1")];
    let broken = post(proxy.addr, "/orders", &reset, "{}").await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY);
    assert_eq!(broken.problem(), "urn:idemgate:problem:upstream-failed");
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "reset")], "{}").await;
    assert_eq!(retry.problem(), "urn:idemgate:problem:outcome-unknown");
    assert_eq!(upstream.executed(), 1);
    // docs/operations.md, Metrics: the owner's 502 after sending is `unknown`, the repeat of that
    // unknown outcome `held`, as `/metrics` on the admin listener shows them.
    let metrics = common::metrics_text(proxy.admin).await;
    let series = |outcome: &str| {
        common::metric_in(
            &metrics,
            &format!(r#"idemgate_requests_total{{route="orders",outcome="{outcome}"}}"#),
        )
    };
    assert_eq!(series("unknown"), 1.0, "{metrics}");
    assert_eq!(series("held"), 1.0, "{metrics}");
    assert_eq!(series("executed"), 0.0, "{metrics}");

    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &route("on_unknown_outcome: release")).await;
    let broken = post(proxy.addr, "/orders", &reset, "{}").await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY);
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "reset")], "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(upstream.executed(), 2);
}

/// With `on_unknown_outcome: release`, an owner whose upstream never answers is given up
/// at `background_timeout` and its key freed for a later request. A duplicate that was
/// waiting on it all along is not a later request: its owner's request went out and may
/// have run, so it gets the owner's failure, never a turn of its own.
/// (`background_timeout` is only the margin the duplicate has to park before the owner
/// gives up; parking later would hang the test, never pass it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waiting_on_an_owner_given_up_at_background_timeout_does_not_execute() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &route(
            "upstream_timeout: 200ms\n    background_timeout: 3s\n    wait_timeout: 60s\n    on_unknown_outcome: release",
        ),
    )
    .await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [("idempotency-key", "given-up"), ("x-test-gate", "never")];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("never", 1).await;
    let duplicates = park_duplicates(&proxy, "given-up", 1).await;
    let timed_out = owner.await.unwrap();
    assert_eq!(timed_out.status, StatusCode::GATEWAY_TIMEOUT);
    // The later request below runs again: the 504 must not have promised its answer.
    let detail = timed_out.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        detail.contains("elsewhere a retry runs it again"),
        "the 504 of a releasing route promises what its retry does not keep: {detail}"
    );
    for duplicate in duplicates {
        let duplicate = duplicate.await.unwrap();
        assert_eq!(
            upstream.executed(),
            1,
            "the duplicate that waited on the owner ran its request again: {:?} {}",
            duplicate.status,
            String::from_utf8_lossy(&duplicate.body)
        );
        assert_eq!(duplicate.status, StatusCode::BAD_GATEWAY);
        assert_eq!(
            duplicate.problem(),
            "urn:idemgate:problem:duplicate-of-failed-request"
        );
    }
    // A request after the owner was given up is a new attempt, as the route chose.
    let later = post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "given-up")],
        "{}",
    )
    .await;
    assert_eq!(later.status, StatusCode::CREATED);
    assert_eq!(upstream.executed(), 2);
}

/// With `on_unknown_outcome: release`, a reset after sending frees the key, and the retry
/// runs the request again. The 502 must say so: a client told that a retry with the same
/// key is not executed would retry a payment on the strength of that and pay twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_502_after_sending_on_a_releasing_route_does_not_promise_its_retry_is_not_run() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &route("on_unknown_outcome: release")).await;
    let reset = [("idempotency-key", "told"), ("x-test-reset", "1")];
    let broken = post(proxy.addr, "/orders", &reset, "{}").await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY);
    assert_eq!(broken.problem(), "urn:idemgate:problem:upstream-failed");
    let detail = broken.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        detail.contains("a retry runs it again unless"),
        "the 502 of a releasing route promises what its retry does not keep: {detail}"
    );
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "told")], "{}").await;
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "the retry ran, as the 502 said"
    );
    assert_eq!(upstream.executed(), 2);
}
