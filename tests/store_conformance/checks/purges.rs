//! The operator's purge (`Store::purge`, the admin API's `DELETE /keys/{digest}`): what it
//! deletes (every settled record, an issued token, a lapsed claim held as unknown), what it
//! leaves (a claim in flight), and that deciding and deleting are one step, so a claim
//! made after an operator looked at a key is never deleted under its owner. A purge that
//! names the record the operator read (its revision, the admin API's `ETag`) removes that
//! record and no other: not a new claim's answer stored after it, nor the same claim in
//! another state.

use std::time::{Duration, Instant};

use http::StatusCode;
use idemgate::key::Digest;
use idemgate::store::{
    Claim, ClaimArgs, ClaimMode, Lease, Purged, Revision, Settled, Settlement, Store,
    StoredResponse,
};

use crate::support::*;

fn issued_only(key: Digest) -> ClaimArgs {
    ClaimArgs {
        mode: ClaimMode::IssuedOnly,
        ..ClaimArgs::new(key, Digest::NONE, LONG_LEASE)
    }
}

/// A failure left for the waiters of the owner of a fresh key, for an hour.
async fn failed_fresh(store: &Store) -> Digest {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let failed = Settlement::Failed {
        response: failure_response(),
        linger: LONG_TTL,
        reissue: None,
    };
    assert_eq!(lease.settle(failed).await.unwrap(), Settled::Written);
    k
}

/// The admin API shows `state` at `key`: what an operator sees before purging it.
async fn operator_sees(store: &Store, key: Digest, state: &str) {
    let info = store.inspect(key).await.unwrap().expect("a record");
    assert_eq!(info.state, state);
}

/// What an operator reads before purging `key`, seen as `state`: the record's revision,
/// which the admin API answers as its `ETag`.
async fn operator_reads(store: &Store, key: Digest, state: &str) -> Revision {
    let info = store.inspect(key).await.unwrap().expect("a record");
    assert_eq!(info.state, state);
    info.revision
}

/// The key replays `want`: its record is an answer, and the next retry does not execute.
async fn replays(store: &Store, key: Digest, want: &StoredResponse) {
    assert_same_response(
        &expect_done(claim(store, key, fingerprint(1), LONG_LEASE).await),
        want,
    );
}

/// Claims `key` once its unknown outcome has expired.
async fn claim_once_unknown_expired(store: &Store, key: Digest) -> Lease {
    within("the unknown outcome to expire", async {
        loop {
            match claim(store, key, fingerprint(1), LONG_LEASE).await {
                Claim::Owner(lease) => return lease,
                Claim::OutcomeUnknown(_) => tokio::time::sleep(POLL).await,
                other => panic!("an unknown outcome answered {}", other.as_str()),
            }
        }
    })
    .await
}

/// `owner`'s claim survived whatever was tried on it: it is still in flight, and its
/// answer is written over its own record (not written back over a gap, as it would be
/// after the claim was deleted) and replayed.
async fn still_owned(store: &Store, key: Digest, owner: Lease) {
    operator_sees(store, key, "in_flight").await;
    expect_in_flight(claim(store, key, fingerprint(1), LONG_LEASE).await);
    let want = response(b"the one execution");
    let done = Settlement::Done {
        response: want.clone(),
        ttl: LONG_TTL,
    };
    assert_eq!(owner.settle(done).await.unwrap(), Settled::Written);
    assert_same_response(
        &expect_done(claim(store, key, fingerprint(1), LONG_LEASE).await),
        &want,
    );
}

/// Every settled record (an answer, a failure left for waiters, "executed, answer not
/// stored", an unknown outcome) and an issued token is purged, and the key's next request
/// executes; a key with no record is absent, before and after.
pub async fn a_purge_removes_every_settled_record_and_frees_the_key(store: &Store) {
    assert_eq!(
        store.purge(fresh_key(), None).await.unwrap(),
        Purged::Absent
    );
    let settled = |settlement| async move {
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert_eq!(lease.settle(settlement).await.unwrap(), Settled::Written);
        k
    };
    let not_stored = Settlement::NotStored {
        status: StatusCode::OK,
        ttl: LONG_TTL,
    };
    let keys = [
        (complete_fresh(store, b"a", LONG_TTL).await, "done"),
        (failed_fresh(store).await, "failed"),
        (settled(not_stored).await, "not_stored"),
        (
            settled(Settlement::Unknown { ttl: LONG_TTL }).await,
            "outcome_unknown",
        ),
    ];
    for (k, state) in keys {
        operator_sees(store, k, state).await;
        assert_eq!(
            store.purge(k, None).await.unwrap(),
            Purged::Removed,
            "{state}"
        );
        assert!(store.inspect(k).await.unwrap().is_none(), "{state}");
        assert_eq!(
            store.purge(k, None).await.unwrap(),
            Purged::Absent,
            "{state}"
        );
        let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(again.release().await.unwrap());
    }

    let k = fresh_key();
    store.issue(k, LONG_TTL).await.unwrap();
    operator_sees(store, k, "issued").await;
    assert_eq!(store.purge(k, None).await.unwrap(), Purged::Removed);
    let spent = store.claim_with(issued_only(k)).await.unwrap();
    assert_eq!(spent.as_str(), "not_issued");
}

/// A claim in flight is never purged: not while its owner runs, not while the lease of an
/// owner that vanished has not run out (no one can tell it vanished), and not once that
/// lease ran out on a route that releases lapsed claims (the dead owner's call may run
/// until the grace ends). A live owner's answer then lands as if nothing happened.
pub async fn a_purge_leaves_a_claim_in_flight_alone(store: &Store) {
    let k = fresh_key();
    let owner = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert_eq!(store.purge(k, None).await.unwrap(), Purged::InFlight);
    still_owned(store, k, owner).await;

    let k = fresh_key();
    claim_abandoned_with(store, holding(k, fingerprint(1), LONG_LEASE)).await;
    assert_eq!(store.purge(k, None).await.unwrap(), Purged::InFlight);
    operator_sees(store, k, "in_flight").await;

    let k = fresh_key();
    let grace = Duration::from_secs(60);
    let taken = Instant::now();
    claim_abandoned_with(store, releasing(k, fingerprint(1), SHORT_LEASE, grace)).await;
    tokio::time::sleep(SHORT_LEASE * 2).await;
    assert!(
        taken.elapsed() < grace,
        "the check was too slow to test the grace"
    );
    assert_eq!(store.purge(k, None).await.unwrap(), Purged::InFlight);
    operator_sees(store, k, "in_flight").await;
}

/// A claim whose owner vanished, held on lapse, is an unknown outcome: once its lease ran
/// out the operator (who checked the upstream by hand) purges it, and the retry executes.
pub async fn a_lapsed_claim_held_as_unknown_is_purged(store: &Store) {
    let k = fresh_key();
    claim_abandoned_with(store, holding(k, fingerprint(1), SHORT_LEASE)).await;
    within("the claim to lapse", async {
        while store.inspect(k).await.unwrap().expect("a record").state != "outcome_unknown" {
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    assert_eq!(store.purge(k, None).await.unwrap(), Purged::Removed);
    let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(again.release().await.unwrap());
}

/// The race an operator's purge runs: it looks, and a request claims the key before the
/// delete. A key an operator saw as a failure left for waiters (a retry takes it), an
/// issued token (its request takes it) or an expired answer (the next request takes it)
/// is claimed here after the look; the purge that follows leaves that claim alone, so the
/// next retry waits for it instead of running the request a second time beside it.
pub async fn a_claim_made_after_a_purge_looked_is_never_purged(store: &Store) {
    let k = failed_fresh(store).await;
    operator_sees(store, k, "failed").await;
    let retry = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert_eq!(store.purge(k, None).await.unwrap(), Purged::InFlight);
    still_owned(store, k, retry).await;

    let k = fresh_key();
    store.issue(k, LONG_TTL).await.unwrap();
    operator_sees(store, k, "issued").await;
    let request = expect_owner(store.claim_with(issued_only(k)).await.unwrap());
    assert_eq!(store.purge(k, None).await.unwrap(), Purged::InFlight);
    still_owned(store, k, request).await;

    let k = complete_fresh(store, b"short-lived", Duration::from_millis(200)).await;
    operator_sees(store, k, "done").await;
    let next = claim_until_owner(store, k, fingerprint(1), LONG_LEASE).await;
    assert_eq!(store.purge(k, None).await.unwrap(), Purged::InFlight);
    still_owned(store, k, next).await;
}

/// Purges and claims of a key an operator saw as a failure, sent at once, many times:
/// whichever lands first, the claim owns the key and keeps it (the purge found nothing to
/// refuse, or refused the claim), never deleted under its owner.
pub async fn purges_racing_claims_never_remove_a_claim(store: &Store) {
    for _ in 0..20 {
        let k = failed_fresh(store).await;
        let (s1, s2) = (store.clone(), store.clone());
        let claimed = tokio::spawn(async move { claim(&s1, k, fingerprint(1), LONG_LEASE).await });
        let purged = tokio::spawn(async move { s2.purge(k, None).await });
        let (claimed, purged) = (claimed.await.unwrap(), purged.await.unwrap());
        let owner = match claimed {
            Claim::Owner(owner) => owner,
            other => panic!("a retry of a failure answered {}", other.as_str()),
        };
        assert!(
            matches!(purged.unwrap(), Purged::Removed | Purged::InFlight),
            "the failure record or the claim was there"
        );
        assert_eq!(store.purge(k, None).await.unwrap(), Purged::InFlight);
        still_owned(store, k, owner).await;
    }
}

/// An operator reads a key and decides to purge it; before the purge lands, a new claim
/// replaces the record: an unknown outcome expires and a retry stores its answer, a failure
/// record's retry stores one, an expired answer's next request stores another, an issued
/// token is used and given back. The purge naming what the operator read leaves the new
/// record, and the next retry replays it instead of running the request once more.
pub async fn a_purge_naming_a_replaced_record_leaves_its_successor(store: &Store) {
    let answer = response(b"the retry's answer");
    let done = || Settlement::Done {
        response: answer.clone(),
        ttl: LONG_TTL,
    };

    let k = fresh_key();
    let first = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let unknown = Settlement::Unknown {
        ttl: Duration::from_millis(200),
    };
    assert_eq!(first.settle(unknown).await.unwrap(), Settled::Written);
    let read = operator_reads(store, k, "outcome_unknown").await;
    let retry = claim_once_unknown_expired(store, k).await;
    assert_eq!(retry.settle(done()).await.unwrap(), Settled::Written);
    assert_eq!(store.purge(k, Some(read)).await.unwrap(), Purged::Changed);
    replays(store, k, &answer).await;

    let k = failed_fresh(store).await;
    let read = operator_reads(store, k, "failed").await;
    let retry = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert_eq!(retry.settle(done()).await.unwrap(), Settled::Written);
    assert_eq!(store.purge(k, Some(read)).await.unwrap(), Purged::Changed);
    replays(store, k, &answer).await;

    let k = complete_fresh(store, b"short-lived", Duration::from_millis(200)).await;
    let read = operator_reads(store, k, "done").await;
    let next = claim_until_owner(store, k, fingerprint(1), LONG_LEASE).await;
    assert_eq!(next.settle(done()).await.unwrap(), Settled::Written);
    assert_eq!(store.purge(k, Some(read)).await.unwrap(), Purged::Changed);
    replays(store, k, &answer).await;

    let k = fresh_key();
    store.issue(k, LONG_TTL).await.unwrap();
    let read = operator_reads(store, k, "issued").await;
    let used = expect_owner(store.claim_with(issued_only(k)).await.unwrap());
    let given_back = Settlement::Release {
        reissue: Some(std::time::SystemTime::now() + LONG_TTL),
    };
    assert_eq!(used.settle(given_back).await.unwrap(), Settled::Written);
    operator_sees(store, k, "issued").await;
    assert_eq!(store.purge(k, Some(read)).await.unwrap(), Purged::Changed);
    let again = expect_owner(store.claim_with(issued_only(k)).await.unwrap());
    assert!(again.release().await.unwrap());
}

/// A purge naming a claim the operator read in flight, or as an unknown outcome, leaves it
/// once its owner settled it with an answer: the record is the same claim's, but not what
/// the operator decided on. While the claim is in flight the purge is refused as any is.
pub async fn a_purge_naming_a_record_whose_state_changed_leaves_it(store: &Store) {
    let answer = response(b"the owner's answer");
    let done = || Settlement::Done {
        response: answer.clone(),
        ttl: LONG_TTL,
    };

    let k = fresh_key();
    let owner = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let read = operator_reads(store, k, "in_flight").await;
    assert_eq!(store.purge(k, Some(read)).await.unwrap(), Purged::InFlight);
    assert_eq!(owner.settle(done()).await.unwrap(), Settled::Written);
    assert_eq!(store.purge(k, Some(read)).await.unwrap(), Purged::Changed);
    replays(store, k, &answer).await;

    let k = fresh_key();
    let owned = claim_abandoned_with(store, holding(k, fingerprint(1), LONG_LEASE)).await;
    let unknown = Settlement::Unknown { ttl: LONG_TTL };
    assert_eq!(
        store.settle(&owned, unknown).await.unwrap(),
        Settled::Written
    );
    let read = operator_reads(store, k, "outcome_unknown").await;
    assert_eq!(
        store.settle(&owned, done()).await.unwrap(),
        Settled::Written
    );
    assert_eq!(store.purge(k, Some(read)).await.unwrap(), Purged::Changed);
    replays(store, k, &answer).await;
}

/// A purge naming the record the key holds removes it, whatever it is (an answer, a
/// failure, "executed, answer not stored", an unknown outcome, a lapsed claim held as one,
/// an issued token, one given back), and the key's next request executes; named again,
/// the key is absent.
pub async fn a_purge_naming_the_current_record_removes_it(store: &Store) {
    let settled = |settlement| async move {
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert_eq!(lease.settle(settlement).await.unwrap(), Settled::Written);
        k
    };
    let not_stored = Settlement::NotStored {
        status: StatusCode::OK,
        ttl: LONG_TTL,
    };
    let lapsed = fresh_key();
    claim_abandoned_with(store, holding(lapsed, fingerprint(1), SHORT_LEASE)).await;
    within("the claim to lapse", async {
        while store
            .inspect(lapsed)
            .await
            .unwrap()
            .expect("a record")
            .state
            != "outcome_unknown"
        {
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    let keys = [
        (complete_fresh(store, b"a", LONG_TTL).await, "done"),
        (failed_fresh(store).await, "failed"),
        (settled(not_stored).await, "not_stored"),
        (
            settled(Settlement::Unknown { ttl: LONG_TTL }).await,
            "outcome_unknown",
        ),
        (lapsed, "outcome_unknown"),
    ];
    for (k, state) in keys {
        let read = operator_reads(store, k, state).await;
        assert_eq!(
            store.purge(k, Some(read)).await.unwrap(),
            Purged::Removed,
            "{state}"
        );
        assert_eq!(
            store.purge(k, Some(read)).await.unwrap(),
            Purged::Absent,
            "{state}"
        );
        let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(again.release().await.unwrap());
    }

    let k = fresh_key();
    store.issue(k, LONG_TTL).await.unwrap();
    let read = operator_reads(store, k, "issued").await;
    assert_eq!(store.purge(k, Some(read)).await.unwrap(), Purged::Removed);
    assert_eq!(
        store.claim_with(issued_only(k)).await.unwrap().as_str(),
        "not_issued"
    );

    let k = fresh_key();
    store.issue(k, LONG_TTL).await.unwrap();
    let used = expect_owner(store.claim_with(issued_only(k)).await.unwrap());
    let given_back = Settlement::Release {
        reissue: Some(std::time::SystemTime::now() + LONG_TTL),
    };
    assert_eq!(used.settle(given_back).await.unwrap(), Settled::Written);
    let read = operator_reads(store, k, "issued").await;
    assert_eq!(store.purge(k, Some(read)).await.unwrap(), Purged::Removed);
    assert_eq!(
        store.claim_with(issued_only(k)).await.unwrap().as_str(),
        "not_issued"
    );
}
