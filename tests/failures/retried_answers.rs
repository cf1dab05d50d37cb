//! Settlements a store failed, made again in the background, hold their answers within a
//! bound (`store::settling`): the proxy gives them one connection's share of its buffer
//! budget (`connections.max_buffered_per_connection`). Answers past it are made again
//! without their bytes, as "executed, answer not stored", counted: their repeats get the
//! 409, never a second run.

use std::sync::atomic::Ordering;

use http::StatusCode;

use crate::common::post;
use crate::held_replies::*;
use crate::route;

/// Owners whose answers the store fails to take at once.
const OWNERS: usize = 4;
/// Each answer's record holds a header this large (`x-test-pad`).
const PAD: usize = 20_000;

/// Redis is cut off as four owners' answers come: each completion fails, and is made
/// again in the background. One share (50,000 bytes) holds two 20 KB answers: the other
/// two are made again as "executed, answer not stored" and counted. Once Redis is back,
/// two keys replay their answers and two get the answer-not-stored 409; none runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_past_the_bound_of_background_retries_are_settled_as_not_stored() {
    let config = format!(
        "connections: {{ max_buffered_per_connection: 50000B }}\n{}",
        route("")
    );
    let (redis, relay, upstream, proxy) = timing_out_behind_held_replies(&config).await;
    warm_up(&proxy).await;
    let pad = PAD.to_string();
    let owners: Vec<_> = (0..OWNERS)
        .map(|i| {
            let (addr, pad) = (proxy.addr, pad.clone());
            tokio::spawn(async move {
                let key = format!("big-{i}");
                let headers = [
                    ("idempotency-key", key.as_str()),
                    ("x-test-gate", "big"),
                    ("x-test-pad", pad.as_str()),
                ];
                post(addr, "/orders", &headers, "{}").await
            })
        })
        .collect();
    upstream.arrived("big", OWNERS).await;
    // Every claim landed; every completion from now on is lost with its connection.
    relay.cut.store(true, Ordering::SeqCst);
    upstream.open("big");
    for owner in owners {
        assert_eq!(owner.await.unwrap().status, StatusCode::CREATED);
    }
    // Each owner counts its outcome once its completion failed and its retry started.
    let unknown = r#"idemgate_requests_total{route="orders",outcome="unknown"}"#;
    proxy.metric_reaches(unknown, OWNERS as f64).await;
    let dropped = "idemgate_store_retried_answers_dropped_total";
    assert_eq!(proxy.metric(dropped), 2.0, "two answers past the bound");
    assert!(
        proxy.metric("idemgate_buffered_bytes") >= 40_000.0,
        "the two answers kept are charged while they wait"
    );
    relay.cut.store(false, Ordering::SeqCst);
    until(
        || !record_kinds(&redis).contains(&"I".to_owned()),
        "every completion made again",
    )
    .await;
    let (mut replayed, mut not_stored) = (0, 0);
    for i in 0..OWNERS {
        let key = format!("big-{i}");
        let repeat = post(proxy.addr, "/orders", &[("idempotency-key", &key)], "{}").await;
        if repeat.replayed() {
            assert_eq!(repeat.status, StatusCode::CREATED);
            replayed += 1;
        } else {
            assert_eq!(repeat.status, StatusCode::CONFLICT);
            assert_eq!(repeat.problem(), "urn:idemgate:problem:answer-not-stored");
            not_stored += 1;
        }
        assert_eq!(upstream.executed_for(&key), 1, "{key} ran again");
    }
    assert_eq!((replayed, not_stored), (2, 2));
    // The answers the retries held were let go once written: nothing stays charged.
    until(
        || proxy.metric("idemgate_buffered_bytes") == 0.0,
        "the retries' charges let go",
    )
    .await;
    assert_eq!(proxy.metric("idemgate_store_settlements_lost_total"), 0.0);
    assert_eq!(
        upstream.executed(),
        1 + OWNERS,
        "the warm-up and each owner once"
    );
}
