//! The operator's purge (`Store::purge`, the admin API's `DELETE /keys/{digest}`): what it
//! deletes (every settled record, an issued token, a lapsed claim held as unknown), what it
//! leaves (a claim in flight), and that deciding and deleting are one step, so a claim
//! made after an operator looked at a key is never deleted under its owner.

use std::time::{Duration, Instant};

use http::StatusCode;
use idemgate::key::Digest;
use idemgate::store::{Claim, ClaimArgs, ClaimMode, Lease, Purged, Settled, Settlement, Store};

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
    assert_eq!(store.purge(fresh_key()).await.unwrap(), Purged::Absent);
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
        assert_eq!(store.purge(k).await.unwrap(), Purged::Removed, "{state}");
        assert!(store.inspect(k).await.unwrap().is_none(), "{state}");
        assert_eq!(store.purge(k).await.unwrap(), Purged::Absent, "{state}");
        let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(again.release().await.unwrap());
    }

    let k = fresh_key();
    store.issue(k, LONG_TTL).await.unwrap();
    operator_sees(store, k, "issued").await;
    assert_eq!(store.purge(k).await.unwrap(), Purged::Removed);
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
    assert_eq!(store.purge(k).await.unwrap(), Purged::InFlight);
    still_owned(store, k, owner).await;

    let k = fresh_key();
    claim_abandoned_with(store, holding(k, fingerprint(1), LONG_LEASE)).await;
    assert_eq!(store.purge(k).await.unwrap(), Purged::InFlight);
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
    assert_eq!(store.purge(k).await.unwrap(), Purged::InFlight);
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
    assert_eq!(store.purge(k).await.unwrap(), Purged::Removed);
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
    assert_eq!(store.purge(k).await.unwrap(), Purged::InFlight);
    still_owned(store, k, retry).await;

    let k = fresh_key();
    store.issue(k, LONG_TTL).await.unwrap();
    operator_sees(store, k, "issued").await;
    let request = expect_owner(store.claim_with(issued_only(k)).await.unwrap());
    assert_eq!(store.purge(k).await.unwrap(), Purged::InFlight);
    still_owned(store, k, request).await;

    let k = complete_fresh(store, b"short-lived", Duration::from_millis(200)).await;
    operator_sees(store, k, "done").await;
    let next = claim_until_owner(store, k, fingerprint(1), LONG_LEASE).await;
    assert_eq!(store.purge(k).await.unwrap(), Purged::InFlight);
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
        let purged = tokio::spawn(async move { s2.purge(k).await });
        let (claimed, purged) = (claimed.await.unwrap(), purged.await.unwrap());
        let owner = match claimed {
            Claim::Owner(owner) => owner,
            other => panic!("a retry of a failure answered {}", other.as_str()),
        };
        assert!(
            matches!(purged.unwrap(), Purged::Removed | Purged::InFlight),
            "the failure record or the claim was there"
        );
        assert_eq!(store.purge(k).await.unwrap(), Purged::InFlight);
        still_owned(store, k, owner).await;
    }
}
