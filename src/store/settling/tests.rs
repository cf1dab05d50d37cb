//! The bounds on settlements made again: an answer past the room is left out, the
//! settlement made again as "executed, answer not stored" and counted; one within it holds
//! its bytes until it is done; past the count, one is given up and counted as lost. Each
//! test counts its places in a counter of its own, so none crowds out another's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

use super::{admit, FixedRoom, MAX_SETTLING};
use crate::key::Digest;
use crate::store::{
    Lapse, OwnerToken, Ownership, PostgresStore, Settlement, SqlSettings, Store, StoredResponse,
};

const TTL: Duration = Duration::from_secs(60);

/// A PostgreSQL store nothing listens for: its pool connects lazily, and nothing here
/// sends it a statement.
fn unreachable_postgres() -> Store {
    let settings = SqlSettings::new("postgres://idemgate@127.0.0.1:1/idemgate");
    Store::Postgres(PostgresStore::connect(&settings).expect("a lazy pool"))
}

/// A store whose answers made again have a room of `bytes`, counted in the room returned.
fn store_with_room(bytes: usize) -> (Store, Arc<FixedRoom>) {
    let store = unreachable_postgres();
    let room = Arc::new(FixedRoom::new(bytes));
    store.keep_retried_answers_in(room.clone());
    (store, room)
}

/// A done settlement whose answer's body is `body` bytes long.
fn done(body: usize) -> Settlement {
    let response = StoredResponse::new(StatusCode::CREATED, &HeaderMap::new(), &vec![b'x'; body]);
    Settlement::Done { response, ttl: TTL }
}

fn owned(n: u8) -> Ownership {
    Ownership {
        key: Digest([n; 32]),
        token: OwnerToken(u128::from(n)),
        fingerprint: Digest::NONE,
        lapse: Lapse::Hold { ttl: TTL },
    }
}

#[tokio::test]
async fn an_answer_past_the_room_is_made_again_as_executed_not_stored_and_counted() {
    static SETTLING: AtomicUsize = AtomicUsize::new(0);
    let (store, room) = store_with_room(1_000);
    let admitted = admit(&SETTLING, &store, &owned(1), done(2_000)).expect("admitted");
    let Settlement::NotStored { status, ttl } = admitted.settlement else {
        panic!("kept its answer: {}", admitted.settlement.as_str());
    };
    assert_eq!(
        (status, ttl),
        (StatusCode::CREATED, TTL),
        "executed, for as long"
    );
    assert_eq!(room.held(), 0, "no bytes held for it");
    assert_eq!(store.stats().retried_answers_dropped, 1, "counted");
    assert_eq!(store.stats().settlements_lost, 0, "not given up");
    assert_eq!(SETTLING.load(Ordering::Relaxed), 1, "its place taken");
    drop(admitted);
    assert_eq!(SETTLING.load(Ordering::Relaxed), 0, "its place given back");
}

#[tokio::test]
async fn answers_within_the_room_hold_their_bytes_until_they_are_done() {
    static SETTLING: AtomicUsize = AtomicUsize::new(0);
    let (store, room) = store_with_room(5_000);
    let first = admit(&SETTLING, &store, &owned(2), done(2_000)).expect("admitted");
    assert!(matches!(first.settlement, Settlement::Done { .. }));
    let size = first.settlement.answer_size();
    assert_eq!(room.held(), size);
    let second = admit(&SETTLING, &store, &owned(3), done(2_000)).expect("admitted");
    assert!(matches!(second.settlement, Settlement::Done { .. }));
    // The third would hold more than the room: made again without its answer.
    let third = admit(&SETTLING, &store, &owned(4), done(2_000)).expect("admitted");
    assert_eq!(third.settlement.as_str(), "not_stored");
    assert_eq!(store.stats().retried_answers_dropped, 1);
    drop(first);
    assert_eq!(room.held(), size, "the first's bytes given back");
    let fourth = admit(&SETTLING, &store, &owned(5), done(2_000)).expect("admitted");
    assert!(
        matches!(fourth.settlement, Settlement::Done { .. }),
        "room again"
    );
    drop((second, third, fourth));
    assert_eq!(room.held(), 0);
}

#[tokio::test]
async fn a_failure_past_the_room_still_frees_its_key_and_gives_its_token_back() {
    static SETTLING: AtomicUsize = AtomicUsize::new(0);
    let (store, _room) = store_with_room(10);
    let response = StoredResponse::new(StatusCode::BAD_GATEWAY, &HeaderMap::new(), b"failed");
    let reissue = Some(SystemTime::now() + Duration::from_secs(5));
    let failed = Settlement::Failed {
        response,
        linger: Duration::from_secs(5),
        reissue,
    };
    let admitted = admit(&SETTLING, &store, &owned(6), failed).expect("admitted");
    assert!(
        matches!(admitted.settlement, Settlement::Release { reissue: r } if r == reissue),
        "{}",
        admitted.settlement.as_str()
    );
}

#[tokio::test]
async fn a_settlement_without_an_answer_takes_no_room() {
    static SETTLING: AtomicUsize = AtomicUsize::new(0);
    let (store, _room) = store_with_room(0);
    let unknown = Settlement::Unknown { ttl: TTL };
    let admitted = admit(&SETTLING, &store, &owned(7), unknown).expect("admitted");
    assert_eq!(admitted.settlement.as_str(), "outcome_unknown");
    assert_eq!(store.stats().retried_answers_dropped, 0);
}

#[tokio::test]
async fn a_settlement_past_the_count_is_given_up_and_counted_as_lost() {
    static FULL: AtomicUsize = AtomicUsize::new(MAX_SETTLING);
    let (store, room) = store_with_room(1 << 20);
    assert!(admit(&FULL, &store, &owned(8), done(100)).is_none());
    assert_eq!(store.stats().settlements_lost, 1, "given up, and counted");
    assert_eq!(FULL.load(Ordering::Relaxed), MAX_SETTLING, "no place taken");
    assert_eq!(room.held(), 0);
}
