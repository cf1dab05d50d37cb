//! Records over time and through the admin side: duplicates counted in observe mode, TTL
//! expiry, a zero TTL, inspect, and a record the store forgot.

use std::time::Duration;

use idemgate::store::{Purged, Settled, Settlement, Store};

use crate::support::*;

/// Observe mode counts the duplicates a key sees while it has a record (the first
/// request counts as one), and learns when that record was made; a key with no
/// record counts nothing, and a purge forgets the count.
pub async fn duplicates_seen_in_observe_mode_are_counted_on_their_key(store: &Store) {
    let k = fresh_key();
    assert_eq!(
        store.saw_duplicate(k).await.unwrap(),
        None,
        "no record, no count"
    );
    let before = std::time::SystemTime::now() - Duration::from_secs(1);
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let made = store
        .saw_duplicate(k)
        .await
        .unwrap()
        .expect("the claim's time");
    assert!(made >= before, "{made:?}");
    assert!(lease.complete(response(b"a"), LONG_TTL).await.unwrap());
    assert!(store.saw_duplicate(k).await.unwrap().is_some());
    let seen = store.inspect(k).await.unwrap().expect("a record").seen;
    assert_eq!(seen.map(|s| s.times), Some(3), "{seen:?}");
    assert_eq!(store.purge(k, None).await.unwrap(), Purged::Removed);
    assert!(store.inspect(k).await.unwrap().is_none());
    let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert_eq!(store.inspect(k).await.unwrap().expect("a claim").seen, None);
    assert!(again.release().await.unwrap());
}

/// A done record expires with its TTL: the key eventually executes again.
pub async fn a_done_key_is_free_again_after_its_ttl(store: &Store) {
    let k = complete_fresh(store, b"short-lived", Duration::from_millis(200)).await;
    let again = claim_until_owner(store, k, fingerprint(1), LONG_LEASE).await;
    assert!(again.release().await.unwrap());
}

/// A zero TTL completes (the owner did own the key) but stores nothing.
pub async fn a_zero_ttl_completes_without_storing(store: &Store) {
    let k = complete_fresh(store, b"not kept", Duration::ZERO).await;
    assert!(store.inspect(k).await.unwrap().is_none());
    let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(again.release().await.unwrap());
}

/// Inspect shows nothing for an unknown key, an in-flight record without a response,
/// and a done record with it; it claims nothing.
pub async fn inspect_reports_in_flight_and_done_records(store: &Store) {
    let k = fresh_key();
    assert!(store.inspect(k).await.unwrap().is_none());

    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let info = store.inspect(k).await.unwrap().expect("in-flight record");
    assert_eq!(info.state, "in_flight");
    assert!(info.response.is_none());

    let want = response(&binary_body());
    assert!(lease.complete(want.clone(), LONG_TTL).await.unwrap());
    let info = store.inspect(k).await.unwrap().expect("done record");
    assert_eq!(info.state, "done");
    assert_same_response(&info.response.expect("stored response"), &want);
    // Inspecting did not consume or change anything.
    let got = expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert_same_response(&got, &want);
}

/// A store that forgets a record (a done one, or a claim in flight, as a Redis restarted
/// empty does) frees its key; the forgotten owner is fenced off from its successor.
pub async fn a_forgotten_record_frees_its_key_and_fences_off_its_owner(store: &Store) {
    let k = fresh_key();
    assert!(!store.forget(k).await.unwrap(), "forgot an unknown key");

    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(lease.complete(response(b"a"), LONG_TTL).await.unwrap());
    assert!(store.forget(k).await.unwrap());
    assert!(store.inspect(k).await.unwrap().is_none());

    let removed = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(store.forget(k).await.unwrap());
    let current = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(!removed
        .complete(response(b"stale"), LONG_TTL)
        .await
        .unwrap());
    expect_in_flight(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(current.release().await.unwrap());
}

/// Observe mode's count of a key goes with its record to the record's outcome, for as
/// long as that outcome is kept: the duplicates seen while the first request ran still
/// count once it is done, even when the outcome is kept longer than the claim's own
/// record would have lived (a route with `on_unknown_outcome: release`, whose claim lives
/// its lease plus the background bound, and whose answer lives the route's `ttl`).
pub async fn duplicates_seen_while_a_claim_ran_still_count_after_its_claim_would_have_expired(
    store: &Store,
) {
    let k = fresh_key();
    let args = releasing(k, fingerprint(1), SHORT_LEASE, SHORT_LEASE);
    let lease = expect_owner(store.claim_with(args).await.unwrap());
    assert!(store.saw_duplicate(k).await.unwrap().is_some());
    assert!(lease.complete(response(b"a"), LONG_TTL).await.unwrap());
    // Past the claim's lease and grace: only the done record is left.
    tokio::time::sleep(3 * SHORT_LEASE).await;
    assert!(store.saw_duplicate(k).await.unwrap().is_some());
    let seen = store.inspect(k).await.unwrap().expect("a record").seen;
    assert_eq!(
        seen.map(|s| s.times),
        Some(3),
        "the first request and two duplicates: {seen:?}"
    );
}

/// A key claimed afresh (its owner failed, and a later request runs it again) starts a
/// count of its own: the duplicates of the failed attempt are not counted as the new
/// one's, on every store alike.
pub async fn a_key_claimed_afresh_starts_its_seen_count_again(store: &Store) {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(store.saw_duplicate(k).await.unwrap().is_some());
    assert!(store.saw_duplicate(k).await.unwrap().is_some());
    let failed = Settlement::Failed {
        response: failure_response(),
        linger: LONG_TTL,
        reissue: None,
    };
    assert_eq!(lease.settle(failed).await.unwrap(), Settled::Written);
    let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(store.saw_duplicate(k).await.unwrap().is_some());
    let seen = store.inspect(k).await.unwrap().expect("a claim").seen;
    assert_eq!(
        seen.map(|s| s.times),
        Some(2),
        "the new attempt and one duplicate: {seen:?}"
    );
    assert!(again.release().await.unwrap());
}

/// A claim's count lives as long as the claim, however often its owner renews it: the
/// duplicates seen early in a long request still count later on (a claim that releases
/// lapsed claims lives its lease plus the grace from its last renewal, and no longer).
pub async fn duplicates_seen_while_a_claim_runs_still_count_across_its_renewals(store: &Store) {
    let k = fresh_key();
    let args = releasing(k, fingerprint(1), SHORT_LEASE, SHORT_LEASE);
    let lease = expect_owner(store.claim_with(args).await.unwrap());
    assert!(store.saw_duplicate(k).await.unwrap().is_some());
    // Past the claim's first lease and grace: its owner renewed it meanwhile.
    tokio::time::sleep(3 * SHORT_LEASE).await;
    assert!(store.saw_duplicate(k).await.unwrap().is_some());
    let seen = store.inspect(k).await.unwrap().expect("a claim").seen;
    assert_eq!(
        seen.map(|s| s.times),
        Some(3),
        "the first request and two duplicates: {seen:?}"
    );
    assert!(lease.release().await.unwrap());
}

/// The count of a claim held as an unknown outcome goes on to the answer that settles it
/// late, for as long as that answer is kept.
pub async fn duplicates_seen_before_an_unknown_outcome_still_count_after_its_late_answer(
    store: &Store,
) {
    let k = fresh_key();
    let owned = claim_abandoned_with(
        store,
        releasing(k, fingerprint(1), SHORT_LEASE, SHORT_LEASE),
    )
    .await;
    assert!(store.saw_duplicate(k).await.unwrap().is_some());
    let unknown = Settlement::Unknown { ttl: SHORT_LEASE };
    assert_eq!(
        store.settle(&owned, unknown).await.unwrap(),
        Settled::Written
    );
    let done = Settlement::Done {
        response: response(b"late"),
        ttl: LONG_TTL,
    };
    assert_eq!(store.settle(&owned, done).await.unwrap(), Settled::Written);
    // Past the claim's and the unknown outcome's lives: only the answer is left.
    tokio::time::sleep(3 * SHORT_LEASE).await;
    assert!(store.saw_duplicate(k).await.unwrap().is_some());
    let seen = store.inspect(k).await.unwrap().expect("a record").seen;
    assert_eq!(
        seen.map(|s| s.times),
        Some(3),
        "the first request and two duplicates: {seen:?}"
    );
}
