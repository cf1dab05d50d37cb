//! Claims and replays: one owner among concurrent claimers, a completed key replaying its
//! status, headers, binary body and trailers, fingerprint mismatches, and a released key
//! claimed afresh.

use std::sync::Arc;

use idemgate::key::Digest;
use idemgate::store::{Claim, Store, StoredResponse};
use std::time::Instant;

use crate::support::*;

const CLAIMERS: usize = 200;

/// Of 200 simultaneous claims of a free key exactly one owns it; the owner holds its
/// lease until every claim has answered, so all others must see it in flight.
pub async fn a_free_key_has_exactly_one_owner_among_concurrent_claimers(store: &Store) {
    let k = fresh_key();
    let start = Arc::new(tokio::sync::Barrier::new(CLAIMERS));
    let tasks: Vec<_> = (0..CLAIMERS)
        .map(|_| {
            let (store, start) = (store.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                claim(&store, k, fingerprint(1), LONG_LEASE).await
            })
        })
        .collect();
    let (mut owners, mut in_flight) = (Vec::new(), 0);
    for task in tasks {
        match within("a claim", task).await.expect("claimer panicked") {
            Claim::Owner(lease) => owners.push(lease),
            Claim::InFlight(_) => in_flight += 1,
            other => panic!("unexpected {}", other.as_str()),
        }
    }
    assert_eq!(owners.len(), 1, "owners of one key");
    assert_eq!(in_flight, CLAIMERS - 1);
    for lease in owners {
        assert!(lease.release().await.unwrap());
    }
}

/// Same race, but the owner completes as soon as it wins: nobody may become a second
/// owner of the completed key; the rest see it in flight or done.
pub async fn an_owner_finishing_at_once_leaves_claimers_in_flight_or_done(store: &Store) {
    let k = fresh_key();
    let start = Arc::new(tokio::sync::Barrier::new(CLAIMERS));
    let tasks: Vec<_> = (0..CLAIMERS)
        .map(|_| {
            let (store, start) = (store.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                match claim(&store, k, fingerprint(1), LONG_LEASE).await {
                    Claim::Owner(lease) => {
                        assert!(lease.complete(response(b"once"), LONG_TTL).await.unwrap());
                        "owner"
                    }
                    Claim::Done(stored) => {
                        assert_same_response(&stored, &response(b"once"));
                        "done"
                    }
                    other => other.as_str(),
                }
            })
        })
        .collect();
    let mut owners = 0;
    for task in tasks {
        match within("a claim", task).await.expect("claimer panicked") {
            "owner" => owners += 1,
            "done" | "in_flight" => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(owners, 1, "owners of one key");
    expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await);
}

/// Complete stores status, repeated headers in order and a binary body; every later
/// claim replays exactly that.
pub async fn a_completed_key_replays_status_headers_and_binary_body(store: &Store) {
    let k = fresh_key();
    let want = response(&binary_body());
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(lease.complete(want.clone(), LONG_TTL).await.unwrap());
    for _ in 0..2 {
        let got = expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert_same_response(&got, &want);
    }
}

/// An answer with trailers (a gRPC call's `grpc-status`) replays them, to the waiter that
/// was holding for it and to every later claim, after the same body.
pub async fn a_completed_key_replays_its_trailers_to_waiters_and_later_claims(store: &Store) {
    let k = fresh_key();
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    trailers.insert("grpc-message", http::HeaderValue::from_static("done"));
    let plain = response(&binary_body());
    let (status, headers, body) = plain.parts();
    let want = StoredResponse::with_trailers(status, &headers, &body, Some(&trailers));
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let waiter = expect_in_flight(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let waiting = tokio::spawn(waiter.wait(Instant::now() + HANG_GUARD));
    assert!(lease.complete(want.clone(), LONG_TTL).await.unwrap());
    assert!(waiting.await.unwrap(), "the waiter hit its deadline");
    for _ in 0..2 {
        let got = expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert_same_response(&got, &want);
        assert_eq!(got.trailers(), Some(trailers.clone()));
    }
}

/// A claim with another payload's fingerprint is a mismatch, while the first request
/// runs and after it is done; the original fingerprint still gets its answers.
pub async fn another_fingerprint_mismatches_in_flight_and_done(store: &Store) {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    expect_mismatch(claim(store, k, fingerprint(2), LONG_LEASE).await);
    expect_in_flight(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(lease.complete(response(b"a"), LONG_TTL).await.unwrap());
    expect_mismatch(claim(store, k, fingerprint(2), LONG_LEASE).await);
    expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await);
}

/// `Digest::NONE` means "nothing to compare" on either side: no mismatch.
pub async fn the_none_fingerprint_never_mismatches(store: &Store) {
    // Stored with a fingerprint, offered without one.
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    expect_in_flight(claim(store, k, Digest::NONE, LONG_LEASE).await);
    assert!(lease.complete(response(b"a"), LONG_TTL).await.unwrap());
    expect_done(claim(store, k, Digest::NONE, LONG_LEASE).await);

    // Stored without a fingerprint, offered with any.
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, Digest::NONE, LONG_LEASE).await);
    expect_in_flight(claim(store, k, fingerprint(2), LONG_LEASE).await);
    assert!(lease.complete(response(b"b"), LONG_TTL).await.unwrap());
    expect_done(claim(store, k, fingerprint(2), LONG_LEASE).await);
    expect_done(claim(store, k, fingerprint(3), LONG_LEASE).await);
}

/// Release frees the key at once: the next claim executes again.
pub async fn a_released_key_is_claimed_afresh(store: &Store) {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(lease.release().await.unwrap());
    let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(again.release().await.unwrap());
}
