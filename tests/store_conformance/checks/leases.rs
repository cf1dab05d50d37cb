//! Leases: an owner whose lease lapsed is fenced off, live leases keep their claim across
//! lease periods, and a dropped lease frees its key or holds it as unknown depending on
//! whether its request went out.

use std::time::Duration;

use idemgate::store::{Claim, Settled, Settlement, Store};

use crate::support::*;

/// Owner A vanishes (no renewals); its claim lapses, and, released after a short
/// grace, B takes over. A, waking up, can settle nothing: each settlement answers
/// `NotWritten` and B's record is untouched; B completes normally.
pub async fn an_owner_whose_lease_lapsed_is_fenced_off(store: &Store) {
    let k = fresh_key();
    let args = releasing(k, fingerprint(1), SHORT_LEASE, SHORT_LEASE);
    let a = claim_abandoned_with(store, args).await;
    let b = claim_until_owner_with(store, args).await;
    assert_ne!(a.token, b.token());

    // Stamped with the claim's fingerprint as the proxy does, so a store comparing the
    // whole in-flight record (`SET … IFEQ`) gets as far as comparing the token.
    let stale = response(b"from the stale owner").with_fingerprint(fingerprint(1));
    for settlement in [
        Settlement::Done {
            response: stale,
            ttl: LONG_TTL,
        },
        Settlement::Unknown { ttl: LONG_TTL },
        Settlement::Failed {
            response: failure_response(),
            linger: LONG_TTL,
            reissue: None,
        },
        Settlement::Release { reissue: None },
    ] {
        let what = settlement.as_str();
        let settled = store.settle(&a, settlement).await.unwrap();
        assert_eq!(settled, Settled::NotWritten, "stale {what}");
    }

    // B still owns the key: in flight, nothing stored.
    expect_in_flight(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let info = store.inspect(k).await.unwrap().expect("B's record");
    assert_eq!(info.state, "in_flight");
    assert!(info.response.is_none());

    let want = response(b"from the new owner");
    assert!(b.complete(want.clone(), LONG_TTL).await.unwrap());
    let got = expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert_same_response(&got, &want);
}

/// A held lease keeps its claim (renewed in the background on Redis, held alive by the
/// lease on the memory store): after about three lease periods the key is still in
/// flight for everyone else, and the owner can still complete.
///
/// The lease is long enough (renewal every 300ms) that only a renewer that stopped
/// working, not a busy machine, lets it lapse.
pub async fn a_live_lease_keeps_its_claim_across_several_lease_periods(store: &Store) {
    const LEASE: Duration = Duration::from_millis(900);
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LEASE).await);
    for _ in 0..9 {
        tokio::time::sleep(LEASE / 3).await;
        expect_in_flight(claim(store, k, fingerprint(1), LEASE).await);
    }
    assert!(lease.complete(response(b"slow"), LONG_TTL).await.unwrap());
    expect_done(claim(store, k, fingerprint(1), LEASE).await);
}

/// Leases of different lengths held together each keep their claim: a short lease
/// taken while a long one is held is renewed at its own pace. (On Redis one task
/// renews every claim of a store and sleeps until the next is due; a claim due before
/// that must wake it.)
pub async fn leases_of_different_lengths_each_keep_their_claim(store: &Store) {
    const SHORT: Duration = Duration::from_millis(900);
    let (long_key, short_key) = (fresh_key(), fresh_key());
    let long = expect_owner(claim(store, long_key, fingerprint(1), LONG_LEASE).await);
    // Time for the renewer to plan its next wake-up by the long lease alone.
    tokio::time::sleep(SHORT / 3).await;
    let short = expect_owner(claim(store, short_key, fingerprint(1), SHORT).await);
    for _ in 0..6 {
        tokio::time::sleep(SHORT / 3).await;
        expect_in_flight(claim(store, short_key, fingerprint(1), SHORT).await);
    }
    assert!(short.complete(response(b"short"), LONG_TTL).await.unwrap());
    assert!(long.complete(response(b"long"), LONG_TTL).await.unwrap());
    expect_done(claim(store, short_key, fingerprint(1), SHORT).await);
    expect_done(claim(store, long_key, fingerprint(1), SHORT).await);
}

/// A lease dropped unsettled before its request went out (a cancelled owner) frees
/// the key long before its lease would have run out.
pub async fn dropping_an_unsent_lease_frees_the_key(store: &Store) {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    drop(lease);
    let again = claim_until_owner(store, k, fingerprint(1), LONG_LEASE).await;
    assert!(again.release().await.unwrap());
}

/// A lease dropped unsettled after its request went out (an owner that panicked, or
/// gave up waiting) may have executed it: the key is held as unknown, never freed.
pub async fn dropping_a_sent_lease_holds_its_key_as_unknown(store: &Store) {
    let k = fresh_key();
    let args = holding(k, fingerprint(1), LONG_LEASE);
    let mut lease = expect_owner(store.claim_with(args).await.unwrap());
    lease.mark_sent();
    drop(lease);
    match claim_until_settled(store, args).await {
        Claim::OutcomeUnknown(_) => {}
        other => panic!("expected outcome_unknown, got {}", other.as_str()),
    }
    assert_eq!(
        store.inspect(k).await.unwrap().expect("a record").state,
        "outcome_unknown"
    );
}
