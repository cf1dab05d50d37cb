//! One-time tokens: issue, then consume atomically (see `Store::issue`, `ClaimMode`).

use std::time::{Duration, SystemTime};

use idemgate::key::Digest;
use idemgate::store::{Claim, ClaimArgs, ClaimMode, Settled, Settlement, Store};

use crate::support::*;

/// A token's expiry as issued, `left` from now: what a settlement hands it back until.
fn expiry_in(left: Duration) -> Option<SystemTime> {
    Some(SystemTime::now() + left)
}

async fn claim_issued(store: &Store, key: Digest) -> Claim {
    store
        .claim_with(ClaimArgs {
            mode: ClaimMode::IssuedOnly,
            ..ClaimArgs::new(key, Digest::NONE, LONG_LEASE)
        })
        .await
        .expect("claim")
}

pub async fn an_issued_key_is_owned_once_by_concurrent_issued_claims(store: &Store) {
    let key = fresh_key();
    store.issue(key, LONG_TTL).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move { claim_issued(&store, key).await }));
    }
    let mut owners = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Claim::Owner(lease) => owners.push(lease),
            Claim::InFlight(_) | Claim::Done(_) => {}
            other => panic!("an issued key answered {}", other.as_str()),
        }
    }
    assert_eq!(owners.len(), 1, "issue and consume are one atomic step");
    let lease = owners.pop().unwrap();
    assert!(lease.complete(response(b"paid"), LONG_TTL).await.unwrap());
    expect_done(claim_issued(store, key).await);
}

pub async fn an_issued_claim_of_a_key_never_issued_is_unknown(store: &Store) {
    assert_eq!(
        claim_issued(store, fresh_key()).await.as_str(),
        "not_issued"
    );
    // An ordinary claim of the same kind of key is unaffected.
    let lease = expect_owner(claim(store, fresh_key(), Digest::NONE, LONG_LEASE).await);
    assert!(lease.release().await.unwrap());
}

pub async fn a_reissued_release_makes_the_key_claimable_again(store: &Store) {
    let key = fresh_key();
    store.issue(key, LONG_TTL).await.unwrap();
    let lease = expect_owner(claim_issued(store, key).await);
    let reissue = Settlement::Release {
        reissue: expiry_in(LONG_TTL),
    };
    assert_eq!(lease.settle(reissue).await.unwrap(), Settled::Written);
    let again = expect_owner(claim_issued(store, key).await);
    assert!(again.release().await.unwrap());
    assert_eq!(
        claim_issued(store, key).await.as_str(),
        "not_issued",
        "spent after a plain release"
    );
}

/// A token whose attempt failed is handed back with the failure (as the proxy settles a
/// 5xx or an upstream never reached): the client's retry owns it again. A failure that
/// hands nothing back spends it.
pub async fn a_failed_token_attempt_hands_the_token_back(store: &Store) {
    let key = fresh_key();
    store.issue(key, LONG_TTL).await.unwrap();
    let failed = |reissue| Settlement::Failed {
        response: failure_response(),
        linger: LONG_TTL,
        reissue,
    };
    let lease = expect_owner(claim_issued(store, key).await);
    assert_eq!(
        lease.settle(failed(expiry_in(LONG_TTL))).await.unwrap(),
        Settled::Written
    );
    let again = expect_owner(claim_issued(store, key).await);
    assert_eq!(again.settle(failed(None)).await.unwrap(), Settled::Written);
    assert_eq!(
        claim_issued(store, key).await.as_str(),
        "not_issued",
        "spent by a failure that hands nothing back"
    );
}

/// A token spent on a request whose outcome is unknown, or whose answer was not stored,
/// is never handed back: its repeats are answered from that record, and a claim never
/// owns it again.
pub async fn a_token_whose_request_may_have_run_is_never_owned_again(store: &Store) {
    for (settlement, state) in [
        (Settlement::Unknown { ttl: LONG_TTL }, "outcome_unknown"),
        (
            Settlement::NotStored {
                status: http::StatusCode::SEE_OTHER,
                ttl: LONG_TTL,
            },
            "not_stored",
        ),
    ] {
        let key = fresh_key();
        store.issue(key, LONG_TTL).await.unwrap();
        let lease = expect_owner(claim_issued(store, key).await);
        assert_eq!(lease.settle(settlement).await.unwrap(), Settled::Written);
        assert_eq!(claim_issued(store, key).await.as_str(), state);
    }
}

/// A token lives its `ttl`, and a failure hands it back for its reissue window only:
/// past either, it is spent.
pub async fn a_token_is_spent_past_its_ttl_and_past_its_reissue_window(store: &Store) {
    let short = Duration::from_millis(200);
    let unused = fresh_key();
    store.issue(unused, short).await.unwrap();
    let failed = fresh_key();
    store.issue(failed, LONG_TTL).await.unwrap();
    let lease = expect_owner(claim_issued(store, failed).await);
    let handed_back = Settlement::Failed {
        response: failure_response(),
        linger: short,
        reissue: expiry_in(short),
    };
    assert_eq!(lease.settle(handed_back).await.unwrap(), Settled::Written);
    for key in [unused, failed] {
        within("the token's record to expire", async {
            while store.inspect(key).await.unwrap().is_some() {
                tokio::time::sleep(POLL).await;
            }
        })
        .await;
        assert_eq!(claim_issued(store, key).await.as_str(), "not_issued");
    }
}

/// A failure's record that hands its token back lets the token be spent until the token's
/// expiry as issued, never longer: its waiters' linger, running on past that expiry, does
/// not keep the token alive.
pub async fn a_failure_keeps_its_token_no_longer_than_its_expiry(store: &Store) {
    let key = fresh_key();
    store.issue(key, LONG_TTL).await.unwrap();
    let lease = expect_owner(claim_issued(store, key).await);
    let handed_back = Settlement::Failed {
        response: failure_response(),
        linger: LONG_TTL,
        reissue: expiry_in(Duration::from_millis(200)),
    };
    assert_eq!(lease.settle(handed_back).await.unwrap(), Settled::Written);
    // Sleeping past the token's expiry, far within the linger.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(claim_issued(store, key).await.as_str(), "not_issued");
}

/// A failure's answer (up to `max_answer`) is kept for its waiters' linger, never for the
/// rest of a token's life: a token handed back with more than the linger left goes back
/// alone, and stays the caller's to spend.
pub async fn a_token_handed_back_keeps_no_failure_past_the_linger(store: &Store) {
    let key = fresh_key();
    store.issue(key, LONG_TTL).await.unwrap();
    let lease = expect_owner(claim_issued(store, key).await);
    let handed_back = Settlement::Failed {
        response: failure_response(),
        linger: Duration::from_millis(200),
        reissue: expiry_in(LONG_TTL),
    };
    assert_eq!(lease.settle(handed_back).await.unwrap(), Settled::Written);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let info = store
        .inspect(key)
        .await
        .unwrap()
        .expect("the token's record");
    assert_eq!(info.state, "issued");
    let again = expect_owner(claim_issued(store, key).await);
    assert!(again.release().await.unwrap());
}

/// A settlement written late (made again in the background after its first write failed,
/// or repeated after a renewal went unanswered) hands its token back only for what is
/// left of the token's expiry as issued at that write, never the span left when it was
/// made: a release, a failure kept with its token, and one whose token goes back alone.
/// With nothing left, no token goes back: the key is freed, or its failure kept as one
/// that spends the token.
pub async fn a_settlement_written_late_keeps_its_token_no_longer_than_its_expiry(store: &Store) {
    let expiry = SystemTime::now() + Duration::from_secs(3);
    let settlements = [
        Settlement::Release {
            reissue: Some(expiry),
        },
        Settlement::Failed {
            response: failure_response(),
            linger: LONG_TTL,
            reissue: Some(expiry),
        },
        Settlement::Failed {
            response: failure_response(),
            linger: Duration::from_millis(200),
            reissue: Some(expiry),
        },
    ];
    let mut owned = Vec::new();
    for settlement in settlements {
        let key = fresh_key();
        store.issue(key, LONG_TTL).await.unwrap();
        owned.push((
            key,
            expect_owner(claim_issued(store, key).await),
            settlement,
        ));
    }
    // A second late: with the span taken when the settlement was made, each would last
    // a second past the expiry.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (key, lease, settlement) in owned {
        let what = settlement.as_str();
        assert_eq!(lease.settle(settlement).await.unwrap(), Settled::Written);
        let info = store
            .inspect(key)
            .await
            .unwrap()
            .expect("the token's record");
        // A shared store's clock starts the record's span when the write lands.
        let over = info.expires.duration_since(expiry).unwrap_or_default();
        assert!(
            over < Duration::from_millis(250),
            "{what}: kept {over:?} past the token's expiry"
        );
    }
    let past = Some(SystemTime::now() - Duration::from_millis(1));
    for (settlement, state) in [
        (Settlement::Release { reissue: past }, None),
        (
            Settlement::Failed {
                response: failure_response(),
                linger: LONG_TTL,
                reissue: past,
            },
            Some("failed"),
        ),
    ] {
        let key = fresh_key();
        store.issue(key, LONG_TTL).await.unwrap();
        let lease = expect_owner(claim_issued(store, key).await);
        assert_eq!(lease.settle(settlement).await.unwrap(), Settled::Written);
        let info = store.inspect(key).await.unwrap();
        assert_eq!(info.map(|info| info.state), state);
        assert_eq!(claim_issued(store, key).await.as_str(), "not_issued");
    }
}

pub async fn hits_count_within_a_window_per_key(store: &Store) {
    let (a, b) = (fresh_key(), fresh_key());
    for n in 1..=3 {
        assert_eq!(store.hit(a, LONG_TTL).await.unwrap(), n);
    }
    assert_eq!(store.hit(b, LONG_TTL).await.unwrap(), 1);
}

/// A duplicate that waited on a token's owner which vanished (on a route that releases
/// lapsed claims) finds the token spent once the grace has passed, as a later request
/// does: `not_issued` (the client asks for a new token), on every store alike. Not a
/// failure of its owner: nobody knows how that request ended.
pub async fn a_waiter_on_a_vanished_token_owner_finds_the_token_spent(store: &Store) {
    let k = fresh_key();
    store.issue(k, LONG_TTL).await.unwrap();
    let args = ClaimArgs {
        mode: ClaimMode::IssuedOnly,
        reissue: Some(std::time::SystemTime::now() + LONG_TTL),
        ..releasing(k, Digest::NONE, SHORT_LEASE, SHORT_LEASE)
    };
    claim_abandoned_with(store, args).await;
    let mut claim = store.claim_with(args).await.unwrap();
    let last = within("the waiter's last claim", async {
        loop {
            let waiter = match claim {
                Claim::InFlight(waiter) => waiter,
                other => return other,
            };
            let again = ClaimArgs {
                after: waiter.owner(),
                takes_over: waiter.owner_lapsed(),
                ..args
            };
            waiter.wait(std::time::Instant::now() + HANG_GUARD).await;
            claim = store.claim_with(again).await.unwrap();
        }
    })
    .await;
    assert_eq!(last.as_str(), "not_issued");
    assert_eq!(claim_issued(store, k).await.as_str(), "not_issued");
}

/// A duplicate waiting on a token's owner whose record the store lost (a Redis restarted
/// without persistence; a purge refuses a claim in flight) is told the token is spent, as
/// a later request is: the same answer on every store.
pub async fn a_waiter_on_a_lost_token_record_finds_it_spent(store: &Store) {
    let k = fresh_key();
    store.issue(k, LONG_TTL).await.unwrap();
    let args = ClaimArgs {
        mode: ClaimMode::IssuedOnly,
        reissue: Some(std::time::SystemTime::now() + LONG_TTL),
        ..ClaimArgs::new(k, Digest::NONE, LONG_LEASE)
    };
    let lease = expect_owner(store.claim_with(args).await.unwrap());
    let waiter = expect_in_flight(store.claim_with(args).await.unwrap());
    let again = ClaimArgs {
        after: waiter.owner(),
        takes_over: waiter.owner_lapsed(),
        ..args
    };
    assert!(store.forget(k).await.unwrap());
    let last = store.claim_with(again).await.unwrap();
    assert_eq!(last.as_str(), "not_issued");
    lease.abandon();
}

/// A token whose answer was stored replays it while the answer lasts; once the answer's
/// record has expired the token is spent, never issued again: its reuse is refused, not
/// run a second time.
pub async fn a_token_is_spent_once_its_answer_has_expired(store: &Store) {
    let key = fresh_key();
    store.issue(key, LONG_TTL).await.unwrap();
    let lease = expect_owner(claim_issued(store, key).await);
    assert!(lease
        .complete(response(b"paid"), Duration::from_millis(200))
        .await
        .unwrap());
    expect_done(claim_issued(store, key).await);
    within("the answer's record to expire", async {
        while store.inspect(key).await.unwrap().is_some() {
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    assert_eq!(claim_issued(store, key).await.as_str(), "not_issued");
}
