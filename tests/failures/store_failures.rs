//! A store that fails under a running request or a held key: duplicates on a fail-open
//! route that found their key taken are never forwarded, and a completion whose reply was
//! lost or failed is made again, and an answer in time is not turned into a 504 by a
//! slow store.

use std::sync::atomic::Ordering;

use http::StatusCode;

use crate::common::redis_server::RedisServer;
use crate::common::{self, post, ProxyHandle};
use crate::held_replies::*;
use crate::route;

/// A fail-open route on Redis through a relay whose replies can be held, with a store
/// `timeout` of 200 ms and the policy keys `extra`; its connection to Redis is open.
async fn failing_open_behind_held_replies(
    extra: &str,
) -> (RedisServer, Relay, common::Upstream, ProxyHandle) {
    let (redis, relay, upstream, proxy) =
        timing_out_behind_held_replies(&route(&format!("on_store_error: fail_open\n    {extra}")))
            .await;
    warm_up(&proxy).await;
    (redis, relay, upstream, proxy)
}

/// The duplicate's answer, or a panic if it reached the upstream first (it arrived at
/// gate `pay` as the second request there).
async fn answered_without_running(
    upstream: &common::Upstream,
    duplicate: tokio::task::JoinHandle<common::Answer>,
) -> common::Answer {
    tokio::select! {
        answer = duplicate => answer.unwrap(),
        () = upstream.arrived("pay", 2) => {
            panic!("the duplicate of a running request was forwarded and ran a second time")
        }
    }
}

/// Once the store has failed the duplicate, the owner finishes: it executed once, and
/// the duplicate got the in-flight 409 with `Retry-After`.
async fn the_duplicate_got_409_and_the_owner_ran_once(
    relay: &Relay,
    upstream: &common::Upstream,
    owner: tokio::task::JoinHandle<common::Answer>,
    duplicate: common::Answer,
) {
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(duplicate.problem(), "urn:idemgate:problem:in-flight");
    assert_eq!(
        duplicate.headers.get(http::header::RETRY_AFTER).unwrap(),
        "1"
    );
    relay.hold.send_replace(false);
    upstream.open("pay");
    assert_eq!(owner.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(upstream.executed_for("pay"), 1);
}

/// `on_store_error: fail_open` forwards a request only when the store cannot say whether
/// its key is taken. A duplicate waiting on a running owner whose store fails while it
/// waits (its next look gets no reply within the store timeout) knows the key is in
/// flight: it gets the in-flight 409 with `Retry-After`, never a run of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fail_open_a_waiting_duplicate_is_never_forwarded_when_the_store_fails() {
    let (_redis, relay, upstream, proxy) =
        failing_open_behind_held_replies("wait_timeout: 30s").await;
    let owner = owner_at_gate(&proxy, &upstream).await;
    let addr = proxy.addr;
    let duplicate = tokio::spawn(async move { post(addr, "/orders", &PAY, "{}").await });
    proxy.metric_reaches("idemgate_waiting", 1.0).await;
    // Its next look (within a second, or when woken) gets no reply.
    relay.hold.send_replace(true);
    let duplicate = answered_without_running(&upstream, duplicate).await;
    the_duplicate_got_409_and_the_owner_ran_once(&relay, &upstream, owner, duplicate).await;
}

/// The same when the store fails right after the duplicate's first look found the key in
/// flight (on Redis: the look is answered, the subscription to the owner's channel is
/// not): the store tells it was found in flight, and the duplicate gets the 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fail_open_a_duplicate_found_in_flight_is_never_forwarded_when_the_store_fails() {
    a_duplicate_whose_second_command_gets_no_reply_gets_409("wait_timeout: 30s").await;
}

/// The same for a duplicate that will not wait (`in_flight: reject`): its first look
/// (`SET NX GET`) finds the owner's claim, and the claim script's look for its remaining
/// TTL gets no reply. The store did say the key is taken: a 409, never a run of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fail_open_a_rejected_duplicate_is_never_forwarded_when_its_second_look_fails() {
    a_duplicate_whose_second_command_gets_no_reply_gets_409("in_flight: reject").await;
}

/// A fail-open route with the policy keys `extra`: while its owner is held at the
/// upstream, a duplicate's first look (`SET NX GET`) is answered and its next command to
/// Redis gets no reply; the duplicate gets the in-flight 409, never a run of its own.
async fn a_duplicate_whose_second_command_gets_no_reply_gets_409(extra: &str) {
    let (_redis, relay, upstream, proxy) = failing_open_behind_held_replies(extra).await;
    let owner = owner_at_gate(&proxy, &upstream).await;
    let addr = proxy.addr;
    // The duplicate's first look is the next command (the owner renews every 10 s).
    relay.hold_after_next.store(true, Ordering::SeqCst);
    let duplicate = tokio::spawn(async move { post(addr, "/orders", &PAY, "{}").await });
    let duplicate = answered_without_running(&upstream, duplicate).await;
    the_duplicate_got_409_and_the_owner_ran_once(&relay, &upstream, owner, duplicate).await;
}

/// A retry whose first look finds its key held as an unknown outcome (the owner's
/// upstream broke the connection after the request went out), and whose second look, for
/// the record's remaining TTL, gets no reply: the request may have run, so the retry is
/// never forwarded, and the upstream saw the key once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fail_open_a_retry_of_an_unknown_outcome_is_never_forwarded_when_the_store_fails() {
    let (redis, relay, upstream, proxy) =
        failing_open_behind_held_replies("wait_timeout: 30s").await;
    let reset = [("idempotency-key", "reset"), ("x-test-reset", "1")];
    let broken = post(proxy.addr, "/orders", &reset, "{}").await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY);
    until(
        || record_kinds(&redis) == ["D", "U"],
        "the key held as an unknown outcome",
    )
    .await;
    // The retry's first look is the next command.
    relay.hold_after_next.store(true, Ordering::SeqCst);
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "reset")], "{}").await;
    assert_eq!(upstream.executed_for("reset"), 1, "the retry was forwarded");
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert!(
        !relay.hold_after_next.load(Ordering::SeqCst),
        "the first look was answered"
    );
    relay.hold.send_replace(false);
}

/// An owner's completion that Redis carried out but whose reply was lost with its
/// connection is retried on a new one (a swap, then the settle script): the answer is
/// stored, and the owner counts it as stored (`executed`), not as "executed, answer not
/// stored" by another owner. Its repeat gets the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_retried_after_its_reply_was_lost_counts_as_stored() {
    let (_redis, relay, upstream, proxy) = behind_held_replies(&route("")).await;
    // The connection is open, and the server's way of swapping is known.
    warm_up(&proxy).await;
    let owner = owner_at_gate(&proxy, &upstream).await;
    // The owner's next command is its completion (it renews every 10 s).
    relay.drop_next.store(true, Ordering::SeqCst);
    upstream.open("pay");
    assert_eq!(owner.await.unwrap().status, StatusCode::CREATED);
    assert!(
        !relay.drop_next.load(Ordering::SeqCst),
        "no reply was dropped"
    );
    let executed = |outcome: &str| {
        proxy.metric(&format!(
            r#"idemgate_requests_total{{route="orders",outcome="{outcome}"}}"#
        ))
    };
    until(
        || executed("executed") + executed("executed_not_stored") >= 2.0,
        "the owner's outcome counted",
    )
    .await;
    assert_eq!(executed("executed_not_stored"), 0.0);
    assert_eq!(executed("executed"), 2.0, "the warm-up and the owner");
    let repeat = post(proxy.addr, "/orders", &PAY, "{}").await;
    assert_eq!(repeat.status, StatusCode::CREATED);
    assert!(repeat.replayed());
    assert_eq!(upstream.executed_for("pay"), 1);
}

/// An owner whose completion fails (Redis cut off as the upstream answers, the write and
/// its retry on a new connection both lost) still gives its client the answer, and makes
/// the completion again in the background: once Redis is back the answer is stored, and
/// the repeat gets the replay instead of finding the claim lapsed (a 409 for a day).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_the_store_failed_is_made_again_once_it_is_back() {
    let (redis, relay, upstream, proxy) = behind_held_replies(&route("")).await;
    warm_up(&proxy).await;
    let owner = owner_at_gate(&proxy, &upstream).await;
    relay.cut.store(true, Ordering::SeqCst);
    upstream.open("pay");
    assert_eq!(owner.await.unwrap().status, StatusCode::CREATED);
    let unknown = r#"idemgate_requests_total{route="orders",outcome="unknown"}"#;
    until(|| proxy.metric(unknown) == 1.0, "the completion to fail").await;
    assert_eq!(
        record_kinds(&redis),
        ["D", "I"],
        "the claim is left in flight"
    );
    relay.cut.store(false, Ordering::SeqCst);
    until(
        || record_kinds(&redis) == ["D", "D"],
        "the completion made again",
    )
    .await;
    let repeat = post(proxy.addr, "/orders", &PAY, "{}").await;
    assert_eq!(repeat.status, StatusCode::CREATED);
    assert!(repeat.replayed());
    assert_eq!(upstream.executed_for("pay"), 1);
}

/// An enforced owner whose store is slow to record the outcome (Redis answers the claim,
/// then nothing until its `timeout`, longer than the route's `upstream_timeout`) gets the
/// upstream's `201` once the store has failed, not a `504` for an upstream that did
/// answer; the answer is written again in the background and the retry replays it, the
/// request having run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enforced_answer_is_never_turned_into_a_504_by_a_slow_store() {
    let redis = RedisServer::start();
    let relay = relay_to(redis.port).await;
    let upstream = common::start_upstream().await;
    let config = format!(
        "store:\n  redis: {{ url: \"redis://{}\", timeout: 1s }}\n{}",
        relay.addr,
        route("upstream_timeout: 300ms")
    );
    let proxy = common::start_proxy(upstream.addr, &config).await;
    warm_up(&proxy).await;
    // The claim is answered; the outcome's write then gets no reply.
    relay.hold_after_next.store(true, Ordering::SeqCst);
    let key = [("idempotency-key", "slow-store")];
    let answer = post(proxy.addr, "/orders", &key, "{}").await;
    relay.hold.send_replace(false);
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "the upstream answered 201; the client got {} {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(answer.json()["n"], 2);
    let retry = post(proxy.addr, "/orders", &key, "{}").await;
    assert!(
        retry.replayed(),
        "{} {}",
        retry.status,
        String::from_utf8_lossy(&retry.body)
    );
    assert_eq!(retry.body, answer.body);
    assert_eq!(upstream.executed(), 2, "the warm-up and the one request");
}
