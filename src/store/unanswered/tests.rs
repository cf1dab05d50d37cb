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

/// Whether a claim of `args` that ended with `claim` (or, `None`, whose future was dropped
/// unanswered) is released: its guard builds the store's handle only to release it.
fn released(args: &ClaimArgs, claim: Option<Result<(), StoreError>>) -> bool {
    let built = std::cell::Cell::new(false);
    let guard = Unanswered::arm(args, OwnerToken(9), || {
        built.set(true);
        unreachable_postgres()
    });
    match claim {
        Some(claim) => guard.ended(&claim),
        None => drop(guard),
    }
    built.get()
}

/// A claim that failed as an outage while its request is forwarded all the same
/// (`fail_open`) is kept: it may have landed, and its request went out, so a release would
/// let a retry run it again. Any other failure, a dropped claim, or a claim whose caller
/// forwards nothing is released; an answered one is neither.
#[tokio::test]
async fn only_a_claim_whose_request_is_forwarded_is_kept_when_it_fails() {
    let outage = || StoreError::Unavailable("no answer".into());
    let forwarding = ClaimArgs {
        forwards_on_outage: true,
        ..args()
    };
    assert!(!released(&forwarding, Some(Err(outage()))), "forwarded");
    assert!(!released(&forwarding, Some(Ok(()))), "answered");
    assert!(released(&forwarding, None), "dropped: nothing forwarded");
    let found = StoreError::FoundInFlight("no answer".into());
    assert!(released(&forwarding, Some(Err(found))), "a duplicate: 409");
    assert!(released(&args(), Some(Err(outage()))), "fail_closed: 503");
}
