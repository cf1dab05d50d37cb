//! Releases and repeated settlements given up because too many are running: each is logged
//! and counted as a settlement lost, never dropped without a trace. Each test counts its
//! places in a counter of its own, full from the start, so it neither waits on a release
//! nor crowds out another test's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{release_in_background, settle_again_in_background, Orphan, Unanswered, MAX_RELEASING};
use crate::key::Digest;
use crate::store::{
    ClaimArgs, Lapse, OwnerToken, Ownership, PostgresStore, Settlement, SqlSettings, Store,
    StoreError,
};

/// A PostgreSQL store nothing listens for: its pool connects lazily, and nothing here
/// sends it a statement.
fn unreachable_postgres() -> Store {
    let settings = SqlSettings::new("postgres://idemgate@127.0.0.1:1/idemgate");
    Store::Postgres(PostgresStore::connect(&settings).expect("a lazy pool"))
}

fn args() -> ClaimArgs {
    ClaimArgs::new(Digest([7; 32]), Digest::NONE, Duration::from_secs(1))
}

#[tokio::test]
async fn a_settlement_repeat_past_the_cap_is_counted_as_lost() {
    static FULL: AtomicUsize = AtomicUsize::new(MAX_RELEASING);
    let store = unreachable_postgres();
    let owned = held(7);
    let release = Settlement::Release { reissue: None };
    settle_again_in_background(&FULL, &store, owned, release, Duration::from_secs(1));
    assert_given_up(&store, &FULL);
}

#[tokio::test]
async fn an_unanswered_claims_release_past_the_cap_is_counted_as_lost() {
    static FULL: AtomicUsize = AtomicUsize::new(MAX_RELEASING);
    let store = unreachable_postgres();
    release_in_background(&FULL, &store, Orphan::new(&args(), OwnerToken(7)));
    assert_given_up(&store, &FULL);
}

#[tokio::test]
async fn a_settlement_repeat_within_the_cap_takes_a_place_until_it_ends() {
    static ONE_LEFT: AtomicUsize = AtomicUsize::new(MAX_RELEASING - 1);
    let store = unreachable_postgres();
    let owned = held(8);
    let release = Settlement::Release { reissue: None };
    settle_again_in_background(&ONE_LEFT, &store, owned, release, Duration::from_secs(1));
    assert_eq!(
        store.stats().settlements_lost,
        0,
        "made again, not given up"
    );
    assert_eq!(
        ONE_LEFT.load(Ordering::Relaxed),
        MAX_RELEASING,
        "its place taken"
    );
}

/// An ownership of the key `[n; 32]` held as an unknown outcome when it lapses.
fn held(n: u8) -> Ownership {
    Ownership {
        key: Digest([n; 32]),
        token: OwnerToken(u128::from(n)),
        fingerprint: Digest::NONE,
        lapse: Lapse::Hold {
            ttl: Duration::from_secs(60),
        },
    }
}

/// A release or repeat past the cap was given up: counted as lost, no place taken.
fn assert_given_up(store: &Store, places: &AtomicUsize) {
    assert_eq!(store.stats().settlements_lost, 1, "given up, and counted");
    assert_eq!(
        places.load(Ordering::Relaxed),
        MAX_RELEASING,
        "no place taken"
    );
}

/// Whether a claim that ended with `claim` (`None`: its future dropped unanswered), and
/// whose request was then `sent` or not, is released: a release its handle starts is
/// given up at once (its count is full) and counted as lost.
fn released(claim: Option<Result<(), StoreError>>, sent: bool) -> bool {
    static FULL: AtomicUsize = AtomicUsize::new(MAX_RELEASING);
    let store = unreachable_postgres();
    let built = std::cell::Cell::new(false);
    let guard = Unanswered::arm(&args(), OwnerToken(9), || {
        built.set(true);
        store.clone()
    });
    let Some(claim) = claim else {
        drop(guard);
        return built.get();
    };
    let Err(failure) = guard.ended(claim) else {
        return built.get();
    };
    let mut unanswered = failure.unanswered.expect("a failed claim is handed back");
    unanswered.releasing = &FULL;
    unanswered.sending().store(sent, Ordering::SeqCst);
    drop(unanswered);
    store.stats().settlements_lost == 1
}

/// A failed claim is kept only once its request may have gone out (its caller forwarded
/// it, `fail_open` on an outage or observe mode on any failure, the FoundInFlight of a
/// takeover whose reply was lost too): it may have landed, and a release would let a retry
/// run it again. One whose request was never sent (not forwarded, or the upstream refused
/// the connection) or whose claim future was dropped is released; an answered one neither.
#[tokio::test]
async fn only_a_claim_whose_request_is_forwarded_is_kept_when_it_fails() {
    let outage = || Some(Err(StoreError::Unavailable("no answer".into())));
    let found = || Some(Err(StoreError::FoundInFlight("no answer".into())));
    assert!(!released(outage(), true), "forwarded and sent");
    assert!(!released(found(), true), "observed, forwarded and sent");
    assert!(released(outage(), false), "never sent");
    assert!(released(found(), false), "a duplicate: 409");
    assert!(!released(Some(Ok(())), false), "answered");
    assert!(released(None, false), "dropped mid-claim: nothing sent");
}
