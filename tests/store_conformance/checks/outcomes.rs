//! Outcomes other than an answer: keys held as unknown (never owned until purged), lapsed
//! claims held or released after their grace, answers not stored, records a store lost
//! written back, and late answers settling their own unknown outcome.

use std::time::{Duration, Instant};

use http::StatusCode;
use idemgate::store::{Claim, Purged, Settled, Settlement, Store};

use crate::support::*;

/// An unknown outcome answers every claim as such (with its end in the future) and
/// is never owned; another payload is still a mismatch; the admin purge frees it.
pub async fn a_key_held_as_unknown_is_never_owned_until_purged(store: &Store) {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let settled = lease
        .settle(Settlement::Unknown { ttl: LONG_TTL })
        .await
        .unwrap();
    assert_eq!(settled, Settled::Written);
    for _ in 0..3 {
        match claim(store, k, fingerprint(1), LONG_LEASE).await {
            Claim::OutcomeUnknown(unknown) => {
                assert!(unknown.until > std::time::SystemTime::now())
            }
            other => panic!("expected outcome_unknown, got {}", other.as_str()),
        }
    }
    expect_mismatch(claim(store, k, fingerprint(2), LONG_LEASE).await);
    let info = store.inspect(k).await.unwrap().expect("a record");
    assert_eq!(info.state, "outcome_unknown");
    assert_eq!(store.purge(k, None).await.unwrap(), Purged::Removed);
    let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(again.release().await.unwrap());
}

/// A claim whose owner vanished, held on lapse, becomes an unknown outcome: many
/// claims after the lapse, none owns it.
pub async fn a_lapsed_claim_held_as_unknown_is_never_taken_over(store: &Store) {
    let k = fresh_key();
    let args = holding(k, fingerprint(1), SHORT_LEASE);
    claim_abandoned_with(store, args).await;
    match claim_until_settled(store, args).await {
        Claim::OutcomeUnknown(_) => {}
        other => panic!("expected outcome_unknown, got {}", other.as_str()),
    }
    for _ in 0..20 {
        let claim = store.claim_with(args).await.unwrap();
        assert!(
            matches!(claim, Claim::OutcomeUnknown(_)),
            "got {}",
            claim.as_str()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Released on lapse, a vanished owner's claim is taken over, but never before its
/// lease and its grace have both passed since it was taken (the dead owner's call may
/// run until then). Slowness can only delay the takeover, never make this fail.
pub async fn a_lapsed_claim_released_is_taken_over_only_after_its_grace(store: &Store) {
    let k = fresh_key();
    let grace = Duration::from_millis(600);
    let args = releasing(k, fingerprint(1), SHORT_LEASE, grace);
    let taken = Instant::now();
    claim_abandoned_with(store, args).await;
    let b = claim_until_owner_with(store, args).await;
    assert!(
        taken.elapsed() >= SHORT_LEASE + grace,
        "taken over after {:?}",
        taken.elapsed()
    );
    assert!(b.release().await.unwrap());
}

/// "Executed, answer not stored" answers every claim with the status, never owned.
pub async fn an_answer_not_stored_is_answered_and_never_owned(store: &Store) {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let not_stored = Settlement::NotStored {
        status: StatusCode::OK,
        ttl: LONG_TTL,
    };
    assert_eq!(lease.settle(not_stored).await.unwrap(), Settled::Written);
    for _ in 0..2 {
        match claim(store, k, fingerprint(1), LONG_LEASE).await {
            Claim::NotStored(record) => assert_eq!(record.status, StatusCode::OK),
            other => panic!("expected not_stored, got {}", other.as_str()),
        }
    }
    expect_mismatch(claim(store, k, fingerprint(2), LONG_LEASE).await);
    let info = store.inspect(k).await.unwrap().expect("a record");
    assert_eq!(
        (info.state, info.status),
        ("not_stored", Some(StatusCode::OK))
    );
}

/// A store that lost an owner's record (a restarted Redis; forgotten here) is not a
/// licence to re-run: the owner's answer, or its unknown outcome, is written back; a
/// release has nothing to write.
pub async fn an_owner_whose_record_vanished_writes_its_outcome_back(store: &Store) {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(store.forget(k).await.unwrap());
    let want = response(b"written back");
    let done = Settlement::Done {
        response: want.clone(),
        ttl: LONG_TTL,
    };
    assert_eq!(lease.settle(done).await.unwrap(), Settled::WrittenBack);
    assert_same_response(
        &expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await),
        &want,
    );

    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(store.forget(k).await.unwrap());
    let unknown = Settlement::Unknown { ttl: LONG_TTL };
    assert_eq!(lease.settle(unknown).await.unwrap(), Settled::WrittenBack);
    let held = claim(store, k, fingerprint(1), LONG_LEASE).await;
    assert!(
        matches!(held, Claim::OutcomeUnknown(_)),
        "got {}",
        held.as_str()
    );

    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(store.forget(k).await.unwrap());
    assert!(lease.release().await.unwrap());
    assert!(store.inspect(k).await.unwrap().is_none());
}

/// The owner of a key it settled as unknown (its answer was late) may still settle it
/// with the answer, which every claim then replays.
pub async fn a_late_answer_settles_its_own_unknown_outcome(store: &Store) {
    let k = fresh_key();
    let owned = claim_abandoned_with(store, holding(k, fingerprint(1), LONG_LEASE)).await;
    let unknown = Settlement::Unknown { ttl: LONG_TTL };
    assert_eq!(
        store.settle(&owned, unknown).await.unwrap(),
        Settled::Written
    );
    let want = response(b"late");
    let done = Settlement::Done {
        response: want.clone(),
        ttl: LONG_TTL,
    };
    assert_eq!(store.settle(&owned, done).await.unwrap(), Settled::Written);
    assert_same_response(
        &expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await),
        &want,
    );
}
