//! Waiters on an in-flight key: woken by completion or release, by the lapse of a vanished
//! owner, giving up at their deadline, sharing an owner's failure, and never owning a key
//! freed meanwhile.

use std::time::{Duration, Instant};

use http::StatusCode;
use idemgate::store::{Claim, ClaimArgs, Settled, Settlement, Store};

use crate::support::*;

/// A duplicate waiting on an in-flight key is woken by completion and then finds the
/// answer. (The lease outlives the deadline, so only the wake-up can return `true`.)
pub async fn a_waiter_resolves_when_the_owner_completes(store: &Store) {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let waiter = expect_in_flight(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let waiting = tokio::spawn(waiter.wait(Instant::now() + HANG_GUARD));
    assert!(lease.complete(response(b"a"), LONG_TTL).await.unwrap());
    assert!(waiting.await.unwrap(), "the waiter hit its deadline");
    expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await);
}

/// A waiter is woken by release too, and the key is then free.
pub async fn a_waiter_resolves_when_the_owner_releases(store: &Store) {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let waiter = expect_in_flight(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let waiting = tokio::spawn(waiter.wait(Instant::now() + HANG_GUARD));
    assert!(lease.release().await.unwrap());
    assert!(waiting.await.unwrap(), "the waiter hit its deadline");
    let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(again.release().await.unwrap());
}

/// A waiter does not wait past the lease of an owner that vanished: it resolves before
/// its (much later) deadline, and, the claim being held, finds the key's outcome
/// unknown rather than taking a turn of its own.
pub async fn a_waiter_of_a_vanished_owner_finds_its_key_held_as_unknown(store: &Store) {
    let k = fresh_key();
    let args = holding(k, fingerprint(1), SHORT_LEASE);
    claim_abandoned_with(store, args).await;
    let waiter = expect_in_flight(store.claim_with(args).await.unwrap());
    let owner = waiter.owner();
    assert!(
        waiter.wait(Instant::now() + HANG_GUARD).await,
        "the waiter hit its deadline"
    );
    let again = ClaimArgs {
        after: owner,
        ..args
    };
    match claim_until_settled(store, again).await {
        Claim::OutcomeUnknown(_) => {}
        other => panic!("expected outcome_unknown, got {}", other.as_str()),
    }
}

/// Released on lapse, the vanished owner's claim is taken over once its grace has
/// passed too.
pub async fn a_waiter_of_a_vanished_owner_takes_over_after_the_grace_when_released(store: &Store) {
    let k = fresh_key();
    let args = releasing(k, fingerprint(1), SHORT_LEASE, SHORT_LEASE);
    claim_abandoned_with(store, args).await;
    let waiter = expect_in_flight(store.claim_with(args).await.unwrap());
    assert!(
        waiter.wait(Instant::now() + HANG_GUARD).await,
        "the waiter hit its deadline"
    );
    let b = claim_until_owner_with(store, args).await;
    assert!(b.release().await.unwrap());
}

/// With the owner alive and renewing (one renewal falls before the deadline), a
/// waiter whose deadline comes first returns `false`; the key is still in flight.
pub async fn a_waiter_gives_up_at_its_deadline_while_the_owner_renews(store: &Store) {
    const LEASE: Duration = Duration::from_millis(600);
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LEASE).await);
    let waiter = expect_in_flight(claim(store, k, fingerprint(1), LEASE).await);
    let resolved = within(
        "the waiter's deadline",
        waiter.wait(Instant::now() + Duration::from_millis(300)),
    )
    .await;
    assert!(!resolved, "the waiter resolved while the owner was running");
    expect_in_flight(claim(store, k, fingerprint(1), LEASE).await);
    assert!(lease.release().await.unwrap());
}

/// The waiters of an owner that failed get its failure instead of a turn of their own;
/// a request that comes afterwards (no owner waited on) executes.
pub async fn waiters_share_a_failure_and_later_claims_execute(store: &Store) {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let waiter = expect_in_flight(claim(&store, k, fingerprint(1), LONG_LEASE).await);
                let owner = waiter.owner();
                (owner, waiter)
            })
        })
        .collect();
    let mut woken = Vec::new();
    for w in waiters {
        let (owner, waiter) = w.await.unwrap();
        assert_eq!(owner, Some(lease.token()));
        woken.push(tokio::spawn(async move {
            (owner, waiter.wait(Instant::now() + HANG_GUARD).await)
        }));
    }
    let failed = Settlement::Failed {
        response: failure_response(),
        linger: LONG_TTL,
        reissue: None,
    };
    assert_eq!(lease.settle(failed).await.unwrap(), Settled::Written);
    for w in woken {
        let (owner, resolved) = w.await.unwrap();
        assert!(resolved, "a waiter hit its deadline");
        let after = ClaimArgs {
            after: owner,
            ..ClaimArgs::new(k, fingerprint(1), LONG_LEASE)
        };
        match store.claim_with(after).await.unwrap() {
            Claim::Failed(Some(got)) => {
                assert_eq!(got.status(), StatusCode::BAD_GATEWAY);
                assert_eq!(&got.body()[..], b"the owner failed");
            }
            other => panic!("expected the owner's failure, got {}", other.as_str()),
        }
    }
    let inspected = store.inspect(k).await.unwrap().expect("a record");
    assert_eq!(inspected.state, "failed");
    let later = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(later.release().await.unwrap());
}

/// A waiter whose owner settled without leaving it anything (a plain release) is told
/// so; it never takes the freed key itself.
pub async fn a_waiter_never_owns_a_key_freed_meanwhile(store: &Store) {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let waiter = expect_in_flight(claim(store, k, fingerprint(1), LONG_LEASE).await);
    let after = ClaimArgs {
        after: waiter.owner(),
        ..ClaimArgs::new(k, fingerprint(1), LONG_LEASE)
    };
    assert!(lease.release().await.unwrap());
    match store.claim_with(after).await.unwrap() {
        Claim::Failed(None) => {}
        other => panic!("expected failed without an answer, got {}", other.as_str()),
    }
    let later = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(later.release().await.unwrap());
}

/// On a route that releases lapsed claims (`on_unknown_outcome: release`) too, a waiter
/// whose owner freed the key meanwhile (a plain release: its request never went out, or
/// went out and the owner gave up on it) never takes the key itself: only a later request
/// executes again.
pub async fn a_waiter_never_owns_a_key_freed_meanwhile_when_lapses_are_released(store: &Store) {
    let k = fresh_key();
    let args = releasing(k, fingerprint(1), LONG_LEASE, LONG_LEASE);
    let lease = expect_owner(store.claim_with(args).await.unwrap());
    let waiter = expect_in_flight(store.claim_with(args).await.unwrap());
    let after = ClaimArgs {
        after: waiter.owner(),
        ..args
    };
    assert!(lease.release().await.unwrap());
    match store.claim_with(after).await.unwrap() {
        Claim::Failed(None) => {}
        other => panic!(
            "a waiter took a turn of its own on a key its owner freed: {}",
            other.as_str()
        ),
    }
    let later = expect_owner(store.claim_with(args).await.unwrap());
    assert!(later.release().await.unwrap());
}

/// A waiter that looks again only after its owner's failure record has expired (the
/// failure's linger passed first: a slow store, a stalled process) finds the key free.
/// Even on a route that releases lapsed claims it must not execute: its owner did not
/// vanish, it failed, and only a later request executes again.
pub async fn a_waiter_that_missed_its_owners_failure_never_owns_the_key(store: &Store) {
    let k = fresh_key();
    let args = releasing(k, fingerprint(1), LONG_LEASE, LONG_LEASE);
    let lease = expect_owner(store.claim_with(args).await.unwrap());
    let waiter = expect_in_flight(store.claim_with(args).await.unwrap());
    let after = ClaimArgs {
        after: waiter.owner(),
        ..args
    };
    let failed = Settlement::Failed {
        response: failure_response(),
        linger: Duration::from_millis(1),
        reissue: None,
    };
    assert_eq!(lease.settle(failed).await.unwrap(), Settled::Written);
    within("the failure record to expire", async {
        while store.inspect(k).await.unwrap().is_some() {
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    match store.claim_with(after).await.unwrap() {
        Claim::Failed(None) => {}
        other => panic!(
            "a waiter took a turn of its own after its owner failed: {}",
            other.as_str()
        ),
    }
}

/// A waiter of a vanished owner on a route that releases lapsed claims, claiming again as
/// the proxy does (naming the owner it waited on, and whether it saw that claim lapse),
/// takes the key over once the grace has passed.
pub async fn a_waiter_claiming_after_its_vanished_owner_takes_over_when_released(store: &Store) {
    let k = fresh_key();
    let args = releasing(k, fingerprint(1), SHORT_LEASE, SHORT_LEASE);
    claim_abandoned_with(store, args).await;
    let mut claim = store.claim_with(args).await.unwrap();
    let lease = within("the takeover", async {
        loop {
            let waiter = match claim {
                Claim::Owner(lease) => return lease,
                Claim::InFlight(waiter) => waiter,
                other => panic!("expected in flight or owner, got {}", other.as_str()),
            };
            let again = ClaimArgs {
                after: waiter.owner(),
                takes_over: waiter.owner_lapsed(),
                ..args
            };
            assert!(waiter.wait(Instant::now() + HANG_GUARD).await);
            claim = store.claim_with(again).await.unwrap();
        }
    })
    .await;
    assert!(lease.release().await.unwrap());
}
