//! The memory store's own invariants (expiry order, queue bounds, what is shown); the store
//! contract itself is `tests/store_conformance/`.

use super::rate::{Counters, TEST_MOST_STEPS};
use super::shard::TEST_COMPACT_SLACK;
use super::*;
use crate::store::{
    CallerTag, ClaimArgs, ClaimMode, Liveness, OwnerToken, Ownership, RawClaim, Settled,
    Settlement, StoredResponse,
};

pub(super) const LEASE: Duration = Duration::from_secs(30);
pub(super) const FINGERPRINT: Digest = Digest([7; 32]);

pub(super) fn key(n: u8) -> Digest {
    Digest([n; 32])
}

/// One shard (bounds below 1024 entries), so eviction order is exact.
pub(super) fn store(max_entries: usize) -> MemoryStore {
    MemoryStore::new(MemoryLimits {
        max_entries,
        max_bytes: 1 << 30,
        ..MemoryLimits::default()
    })
}

pub(super) fn owner(
    store: &MemoryStore,
    k: Digest,
    lease: Duration,
) -> (OwnerToken, Option<Liveness>) {
    match store.claim(&ClaimArgs::new(k, FINGERPRINT, lease)).unwrap() {
        RawClaim::Owner { token, liveness } => (token, liveness),
        RawClaim::Other(other) => panic!("{k:?} was not free: {}", other.as_str()),
    }
}

pub(super) fn store_done(store: &MemoryStore, k: Digest, ttl: Duration) {
    let (token, _liveness) = owner(store, k, LEASE);
    let response = StoredResponse::new(http::StatusCode::OK, &http::HeaderMap::new(), b"ok");
    let owned = Ownership {
        key: k,
        token,
        fingerprint: FINGERPRINT,
        lapse: ClaimArgs::new(k, FINGERPRINT, LEASE).lapse,
    };
    let settled = store.settle(&owned, Settlement::Done { response, ttl });
    assert_eq!(settled, Settled::Written);
}

pub(super) fn is_done(store: &MemoryStore, k: Digest) -> bool {
    store.inspect(k).is_some_and(|info| info.state == "done")
}

/// Eviction takes the record that expires first, not the one written first: records
/// with different TTLs sit in different queues.
#[test]
fn eviction_takes_the_earliest_expiry_across_ttls() {
    let store = store(3);
    store_done(&store, key(1), Duration::from_secs(100));
    store_done(&store, key(2), Duration::from_secs(10));
    store_done(&store, key(3), Duration::from_secs(50));
    store_done(&store, key(4), Duration::from_secs(100));
    assert!(!is_done(&store, key(2)));
    for k in [1, 3, 4] {
        assert!(is_done(&store, key(k)), "key {k} was evicted");
    }
    assert_eq!(store.stats().entries, 3);
}

/// A key stored again with a longer TTL leaves a stale entry in the short queue; that
/// entry must not evict the new record before its time.
#[test]
fn a_stale_queue_entry_does_not_evict_the_key_stored_again() {
    let store = store(2);
    store_done(&store, key(1), Duration::from_secs(10));
    assert!(store.forget(key(1)));
    store_done(&store, key(1), Duration::from_secs(100));
    store_done(&store, key(2), Duration::from_secs(50));
    store_done(&store, key(3), Duration::from_secs(100));
    assert!(
        is_done(&store, key(1)),
        "the stale entry evicted the new record"
    );
    assert!(!is_done(&store, key(2)));
    assert!(is_done(&store, key(3)));
}

/// Records removed long before they expire (admin deletes, tokens spent) leave queue
/// entries behind; compaction keeps those from outnumbering the live ones, so the
/// index stays bounded by what the store holds.
#[test]
fn stale_queue_entries_stay_bounded_by_live_records() {
    let store = store(100);
    let hour = Duration::from_secs(3600);
    for round in 0..20_000u32 {
        let mut k = Digest([0; 32]);
        k.0[..4].copy_from_slice(&round.to_le_bytes());
        store_done(&store, k, hour);
        assert!(store.forget(k));
    }
    store_done(&store, key(1), hour);
    let shard = store.shards[0].lock().unwrap();
    let (queued, indexed, in_queues) = shard.queued();
    assert_eq!(indexed, 1);
    assert!(queued <= 2 * indexed + TEST_COMPACT_SLACK + 1, "{queued}");
    assert_eq!(queued, in_queues);
}

pub(super) fn numbered(tag: u8, n: u32) -> Digest {
    let mut k = Digest([tag; 32]);
    k.0[..4].copy_from_slice(&n.to_le_bytes());
    k
}

/// Compaction runs while a record is being written; it must not drop that record's own
/// entry (compacting after the push, before the record was in the map, would lose it).
/// Stale entries pile up to the compaction point again and again while short-lived
/// records are written between them.
#[test]
fn a_record_written_at_compaction_time_keeps_its_queue_entry() {
    let store = store(100);
    let hour = Duration::from_secs(3600);
    for round in 0..3 * TEST_COMPACT_SLACK as u32 {
        let gone = numbered(1, round);
        store_done(&store, gone, hour);
        assert!(store.forget(gone));
        store_done(&store, numbered(2, round), Duration::from_nanos(1));
        assert!(store.shards[0].lock().unwrap().every_record_is_indexed());
    }
}

/// The admin view of a claim whose live owner outran its lease (no duplicate came to
/// extend it) shows when the claim would lapse were the owner to vanish now, not a time
/// in the past.
#[test]
fn inspect_shows_a_live_owners_claim_as_not_lapsed() {
    let store = store(10);
    let lease = Duration::from_millis(50);
    let (_, liveness) = owner(&store, key(1), lease);
    std::thread::sleep(lease * 2);
    let before = SystemTime::now();
    let info = store.inspect(key(1)).expect("in flight");
    assert_eq!(info.state, "in_flight");
    assert!(info.expires >= before + lease, "shown as lapsed");
    drop(liveness);
}

/// Writes sweep expired records without a timer: answers stored with a 1 ns TTL are
/// gone (and their bytes returned) after a few more writes.
#[test]
fn writes_sweep_expired_records() {
    let store = store(100);
    for n in 0..8 {
        store_done(&store, key(n), Duration::from_nanos(1));
    }
    for n in 100..104 {
        store_done(&store, key(n), Duration::from_secs(60));
    }
    assert_eq!(store.stats().entries, 4);
    assert_eq!(
        store.stats().bytes,
        4 * StoredResponse::new(http::StatusCode::OK, &http::HeaderMap::new(), b"ok").cost()
    );
}

/// A full store drops what has expired before anything live, whatever sits first in its
/// expiry order, and counts no eviction for it.
#[test]
fn a_full_store_drops_expired_records_before_live_ones() {
    let store = store(3);
    store_done(&store, key(1), Duration::from_nanos(1));
    store_done(&store, key(2), Duration::from_secs(100));
    store_done(&store, key(3), Duration::from_secs(200));
    store_done(&store, key(4), Duration::from_secs(300));
    for k in [2, 3, 4] {
        assert!(is_done(&store, key(k)), "key {k} was evicted");
    }
    assert!(store.stats().evictions.is_empty(), "{:?}", store.stats());
}

/// A caller's share counts the records it holds now: once one of them is gone (expired,
/// purged), it may claim again; other callers were never limited by it.
#[test]
fn a_callers_share_frees_up_as_its_records_go() {
    let store = MemoryStore::new(MemoryLimits {
        max_entries: 10,
        caller_share: 20,
        ..MemoryLimits::default()
    });
    let claim = |k: Digest, caller: u32| {
        store.claim(&ClaimArgs {
            caller: CallerTag(caller),
            ..ClaimArgs::new(k, FINGERPRINT, LEASE)
        })
    };
    assert!(matches!(claim(key(1), 7), Ok(RawClaim::Owner { .. })));
    assert!(matches!(claim(key(2), 7), Ok(RawClaim::Owner { .. })));
    assert!(matches!(claim(key(3), 7), Err(StoreError::CallerFull)));
    assert!(matches!(claim(key(4), 8), Ok(RawClaim::Owner { .. })));
    assert!(store.forget(key(1)));
    assert!(matches!(claim(key(3), 7), Ok(RawClaim::Owner { .. })));
}

/// A caller at its share that uses its one-time token is refused (`CallerFull`, a 429),
/// and keeps its token: the claim checks the share before it takes the issued record, so
/// once the caller has room again its retry owns the key instead of finding the token
/// spent by a claim that never ran.
#[test]
fn a_token_refused_over_the_callers_share_stays_issued() {
    let store = MemoryStore::new(MemoryLimits {
        max_entries: 10,
        caller_share: 30,
        ..MemoryLimits::default()
    });
    let claim = |k: Digest, mode: ClaimMode| {
        store.claim(&ClaimArgs {
            mode,
            caller: CallerTag(7),
            ..ClaimArgs::new(k, FINGERPRINT, LEASE)
        })
    };
    let held: Vec<_> = (1..=3)
        .map(|n| match claim(key(n), ClaimMode::Any) {
            Ok(RawClaim::Owner { liveness, .. }) => liveness,
            _ => panic!("key {n} was not owned"),
        })
        .collect();
    let token = key(99);
    store.issue(token, Duration::from_secs(300)).unwrap();
    assert!(matches!(
        claim(token, ClaimMode::IssuedOnly),
        Err(StoreError::CallerFull)
    ));
    assert_eq!(store.inspect(token).map(|info| info.state), Some("issued"));
    assert!(store.forget(key(1)));
    assert!(matches!(
        claim(token, ClaimMode::IssuedOnly),
        Ok(RawClaim::Owner { .. })
    ));
    drop(held);
}

/// A claim that takes the slot of its caller's own record (the failure left for the
/// waiters of its previous attempt) fits the share that record held.
#[test]
fn a_claim_replacing_its_callers_own_record_fits_the_share() {
    let store = MemoryStore::new(MemoryLimits {
        max_entries: 10,
        caller_share: 20,
        ..MemoryLimits::default()
    });
    let args = |k: Digest| ClaimArgs {
        caller: CallerTag(7),
        ..ClaimArgs::new(k, FINGERPRINT, LEASE)
    };
    let Ok(RawClaim::Owner { token, .. }) = store.claim(&args(key(1))) else {
        panic!("key 1 was not owned");
    };
    let failed = Settlement::Failed {
        response: StoredResponse::new(
            http::StatusCode::INTERNAL_SERVER_ERROR,
            &http::HeaderMap::new(),
            b"no",
        ),
        linger: Duration::from_secs(5),
        reissue: None,
    };
    let owned = Ownership {
        key: key(1),
        token,
        fingerprint: FINGERPRINT,
        lapse: args(key(1)).lapse,
    };
    assert_eq!(store.settle(&owned, failed), Settled::Written);
    let Ok(RawClaim::Owner {
        liveness: _held, ..
    }) = store.claim(&args(key(2)))
    else {
        panic!("key 2 was not owned");
    };
    assert!(matches!(
        store.claim(&args(key(1))),
        Ok(RawClaim::Owner { .. })
    ));
}

fn seen_counts(store: &MemoryStore) -> usize {
    store
        .shards
        .iter()
        .map(|s| s.lock().unwrap().seen.len())
        .sum()
}

pub(super) fn owned(k: Digest, token: OwnerToken) -> Ownership {
    Ownership {
        key: k,
        token,
        fingerprint: FINGERPRINT,
        lapse: ClaimArgs::new(k, FINGERPRINT, LEASE).lapse,
    }
}

/// Observe mode's count of a key's duplicates goes with the key's record, on every path
/// that removes it: a claim released unsent, a failure with no room to be shared, a token
/// issued over the key. (`seen` is charged to no bound, so a count left behind would
/// grow without one.)
#[test]
fn a_removed_record_leaves_no_seen_count_behind() {
    let store = MemoryStore::new(MemoryLimits {
        max_entries: 10,
        max_bytes: 4096,
        token_share: 100,
        ..MemoryLimits::default()
    });
    let too_big = StoredResponse::new(
        http::StatusCode::INTERNAL_SERVER_ERROR,
        &http::HeaderMap::new(),
        &[b'x'; 8192],
    );
    for n in 0..20u8 {
        let k = key(n);
        let (token, _liveness) = owner(&store, k, LEASE);
        assert!(store.saw_duplicate(k).is_some());
        let settlement = if n % 2 == 0 {
            Settlement::Release { reissue: None }
        } else {
            Settlement::Failed {
                response: too_big.clone(),
                linger: Duration::from_secs(5),
                reissue: None,
            }
        };
        assert_eq!(store.settle(&owned(k, token), settlement), Settled::Written);
    }
    assert_eq!(store.stats().entries, 0);
    for n in 20..25u8 {
        let k = key(n);
        let (_token, _liveness) = owner(&store, k, LEASE);
        assert!(store.saw_duplicate(k).is_some());
        store.issue(k, Duration::from_secs(60)).unwrap();
    }
    assert_eq!(store.stats().entries, 5);
    assert_eq!(seen_counts(&store), 0, "seen counts left behind");
}

/// A claim settled with its outcome is the same request: the duplicates observed while
/// it ran still count after it is done.
#[test]
fn a_settled_claim_keeps_its_seen_count() {
    let store = store(10);
    let (token, _liveness) = owner(&store, key(1), LEASE);
    assert!(store.saw_duplicate(key(1)).is_some());
    let response = StoredResponse::new(http::StatusCode::OK, &http::HeaderMap::new(), b"ok");
    let done = Settlement::Done {
        response,
        ttl: Duration::from_secs(60),
    };
    assert_eq!(store.settle(&owned(key(1), token), done), Settled::Written);
    let seen = store.inspect(key(1)).and_then(|info| info.seen);
    assert_eq!(seen.map(|s| s.times), Some(2));
}

fn caller(n: u32) -> Digest {
    let mut d = Digest([9; 32]);
    d.0[..4].copy_from_slice(&n.to_le_bytes());
    d
}

/// Token rate counters (one per caller per window) are at most `max_entries`: a client
/// naming a new caller on every request (a random `Authorization`) cannot grow them. Past
/// the bound a new caller counts as over any rate (429 until a window ends), while the
/// callers already counted keep being counted.
#[test]
fn rate_counters_stay_within_max_entries() {
    let store = store(10);
    let window = Duration::from_secs(60);
    for n in 0..1000 {
        store.hit(caller(n), window);
    }
    assert!(store.hit(caller(5000), window) > u64::from(u32::MAX));
    assert_eq!(store.hit(caller(0), window), 2);
    let held = store.counters.lock().unwrap().len();
    assert!(held <= 10, "{held} counters held with max_entries 10");
}

/// Counters whose window has ended make room for new callers, without a timer: the hits
/// that follow drop them.
#[test]
fn ended_rate_windows_make_room_for_new_callers() {
    let store = store(10);
    let window = Duration::from_millis(50);
    for round in 0..3 {
        for n in 10 * round..10 * round + 10 {
            assert_eq!(store.hit(caller(n), window), 1, "caller {n}");
        }
        std::thread::sleep(window * 2);
    }
    let held = store.counters.lock().unwrap().len();
    assert!(held <= 10, "{held} counters held with max_entries 10");
}

/// A hit does a bounded amount of expiry work, however many counters run or end at once:
/// no scan of all counters under the lock. Callers coming back after their window (each
/// leaving a stale queue entry) keep the queues within twice the counters.
#[test]
fn a_rate_hit_does_bounded_work() {
    let most = 5000;
    let window = Duration::from_secs(1);
    let second = 1_000_000_000;
    let mut counters = Counters::default();
    let mut worst = 0;
    for round in 0..6u64 {
        // Half of the callers come back each round, half are new; all windows of the
        // round before have ended.
        let now = round * second;
        for n in 0..most as u32 {
            let n = if n % 2 == 0 {
                n
            } else {
                n + round as u32 * most as u32
            };
            assert_eq!(counters.hit(caller(n), now, window, most), 1);
            worst = worst.max(counters.steps);
        }
        assert!(counters.len() <= most, "{} counters", counters.len());
        assert!(
            counters.queued() <= 2 * most,
            "{} queued",
            counters.queued()
        );
    }
    assert!(worst <= TEST_MOST_STEPS, "{worst} steps in one hit");
}

/// A store of two shards (2048 entries) filled with settled records, all in shard 0.
fn full_in_shard_zero() -> MemoryStore {
    let store = MemoryStore::new(MemoryLimits {
        max_entries: 2048,
        max_bytes: 1 << 30,
        ..MemoryLimits::default()
    });
    assert_eq!(store.shards.len(), 2);
    for n in 0..2048 {
        store_done(&store, numbered(0, n), Duration::from_secs(3600));
    }
    assert_eq!(store.stats().entries, 2048);
    store
}

/// Runs `write` while another thread holds shard 0's lock, which it lets go once the store
/// waits for it (or once `write` returned without waiting).
pub(super) fn while_shard_zero_is_held<T>(store: &MemoryStore, write: impl FnOnce() -> T) -> T {
    let answered = std::sync::atomic::AtomicBool::new(false);
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _held = store.shards[0].lock().unwrap();
            held_tx.send(()).unwrap();
            while store.shard_waits.load(Ordering::SeqCst) == 0 && !answered.load(Ordering::SeqCst)
            {
                std::thread::yield_now();
            }
        });
        held_rx.recv().unwrap();
        let written = write();
        answered.store(true, Ordering::SeqCst);
        written
    })
}

/// With `when_full: evict`, a claim on a full store whose own shard holds nothing to evict
/// evicts a settled record in another shard even while another thread holds that shard's
/// lock: it waits for the lock, never answers `Full` (a 503) while a record could go. The
/// holder lets go once the claim waits for it, or once the claim has answered.
#[test]
fn a_full_store_evicts_in_a_shard_another_thread_holds() {
    let store = full_in_shard_zero();
    let claim = while_shard_zero_is_held(&store, || {
        store.claim(&ClaimArgs::new(numbered(1, 0), FINGERPRINT, LEASE))
    });
    assert!(
        matches!(claim, Ok(RawClaim::Owner { .. })),
        "{:?}",
        claim.map(|_| ())
    );
    assert_eq!(store.stats().entries, 2048);
    assert_eq!(store.stats().evictions.iter().map(|e| e.1).sum::<u64>(), 1);
}

/// A shard whose lock was poisoned (a thread panicked holding it) is still swept and
/// evicted in by writes to other shards, as every other use of it carries on: a full store
/// does not refuse claims for records it could evict there.
#[test]
fn a_full_store_evicts_in_a_poisoned_shard() {
    let store = full_in_shard_zero();
    let poisoned = std::thread::scope(|s| {
        s.spawn(|| {
            let _held = store.shards[0].lock().unwrap();
            panic!("poisons shard 0");
        })
        .join()
    });
    assert!(poisoned.is_err() && store.shards[0].is_poisoned());
    let claim = store.claim(&ClaimArgs::new(numbered(1, 0), FINGERPRINT, LEASE));
    assert!(
        matches!(claim, Ok(RawClaim::Owner { .. })),
        "{:?}",
        claim.map(|_| ())
    );
    assert_eq!(store.stats().evictions.iter().map(|e| e.1).sum::<u64>(), 1);
}

/// With `when_full: evict`, an answer that needs room in a shard another thread holds waits
/// for that shard's lock and evicts there: it is stored and replayed, not kept as "executed,
/// answer not stored". Its claim stays in flight meanwhile, so no duplicate runs.
#[test]
fn an_answer_evicts_in_a_shard_another_thread_holds() {
    let answer = || StoredResponse::new(http::StatusCode::OK, &http::HeaderMap::new(), b"ok");
    let cost = answer().cost();
    let store = MemoryStore::new(MemoryLimits {
        max_entries: 2048,
        max_bytes: 2047 * cost + ENTRY_OVERHEAD,
        ..MemoryLimits::default()
    });
    for n in 0..2047 {
        store_done(&store, numbered(0, n), Duration::from_secs(3600));
    }
    let k = numbered(1, 0);
    let (token, _liveness) = owner(&store, k, LEASE);
    let settled = while_shard_zero_is_held(&store, || {
        let done = Settlement::Done {
            response: answer(),
            ttl: Duration::from_secs(3600),
        };
        store.settle(&owned(k, token), done)
    });
    assert_eq!(settled, Settled::Written);
    assert!(is_done(&store, k));
    assert_eq!(store.stats().evictions.iter().map(|e| e.1).sum::<u64>(), 1);
}
