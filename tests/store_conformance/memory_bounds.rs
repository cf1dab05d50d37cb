//! `max_entries` and `max_bytes` of the memory store (backend specific). Bounds below 1024
//! entries use one shard, so these are exact; [`sharded_bounds_hold_for_the_configured_totals`]
//! covers the sharded case.

use std::sync::Arc;

use http::StatusCode;
use idemgate::store::{Claim, MemoryLimits, MemoryStore, Settled, Settlement, Store, StoreError};

use crate::support::*;

fn store(max_entries: usize, max_bytes: usize) -> Store {
    Store::Memory(Arc::new(MemoryStore::new(MemoryLimits {
        max_entries,
        max_bytes,
        ..MemoryLimits::default()
    })))
}

/// Filling a store that holds in-flight claims with done records evicts done records
/// only: the count stays within `max_entries` and every held key is still in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_takes_done_records_and_never_in_flight_ones() {
    const MAX: usize = 64;
    let store = store(MAX, 1 << 40);
    let mut held = Vec::new();
    for _ in 0..8 {
        let k = fresh_key();
        held.push((
            k,
            expect_owner(claim(&store, k, fingerprint(1), LONG_LEASE).await),
        ));
    }
    let mut last = None;
    for _ in 0..MAX * 4 {
        last = Some(complete_fresh(&store, b"done", LONG_TTL).await);
        assert!(store.stats().entries <= MAX, "{:?}", store.stats());
    }
    assert_eq!(store.stats().in_flight, held.len());
    for (k, _) in &held {
        expect_in_flight(claim(&store, *k, fingerprint(1), LONG_LEASE).await);
    }
    expect_done(claim(&store, last.unwrap(), fingerprint(1), LONG_LEASE).await);
    for (_, lease) in held {
        assert!(lease.release().await.unwrap());
    }
    assert_eq!(store.stats().in_flight, 0);
}

/// When every slot holds an in-flight claim nothing may be evicted: a new key is
/// refused with `Full`, held keys still answer in flight, and a release makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_full_of_in_flight_claims_refuses_new_keys() {
    const MAX: usize = 16;
    let store = store(MAX, 1 << 40);
    let mut held = Vec::new();
    for _ in 0..MAX {
        let k = fresh_key();
        held.push((
            k,
            expect_owner(claim(&store, k, fingerprint(1), LONG_LEASE).await),
        ));
    }
    let refused = store.claim(fresh_key(), fingerprint(1), LONG_LEASE).await;
    assert!(
        matches!(refused, Err(StoreError::Full)),
        "expected Full, got {:?}",
        refused.map(|c| c.as_str())
    );
    expect_in_flight(claim(&store, held[0].0, fingerprint(1), LONG_LEASE).await);

    let (_, lease) = held.pop().unwrap();
    assert!(lease.release().await.unwrap());
    let newcomer = expect_owner(claim(&store, fresh_key(), fingerprint(1), LONG_LEASE).await);
    assert!(newcomer.release().await.unwrap());
}

/// The byte budget is a total, not a per-shard share: with 64 shards, an answer larger
/// than a sixty-fourth of `max_bytes` (but within it) is still stored and replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_large_answer_may_use_most_of_the_byte_budget() {
    let store = store(100_000, 1 << 20);
    let body = vec![9u8; 600 * 1024];
    for _ in 0..20 {
        complete_fresh(&store, &[1; 100], LONG_TTL).await;
    }
    let big = complete_fresh(&store, &body, LONG_TTL).await;
    let replay = expect_done(claim(&store, big, fingerprint(1), LONG_LEASE).await);
    assert_eq!(replay.body().len(), body.len());
    assert!(store.stats().bytes <= 1 << 20, "{:?}", store.stats());
}

/// Done records are evicted to keep their accounted bytes within `max_bytes`, and the
/// newest answer is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_bytes_bounds_the_bytes_held() {
    let cost = response(&[7; 100]).cost();
    let max_bytes = 10 * cost + cost / 2;
    let store = store(1000, max_bytes);
    let mut last = None;
    for _ in 0..50 {
        last = Some(complete_fresh(&store, &[7; 100], LONG_TTL).await);
        assert!(store.stats().bytes <= max_bytes, "{:?}", store.stats());
    }
    assert_eq!(store.stats().entries, 10);
    expect_done(claim(&store, last.unwrap(), fingerprint(1), LONG_LEASE).await);
}

/// An answer larger than the whole byte budget cannot be stored, and nothing says it
/// was: the key records "executed, answer not stored" instead (a small record within
/// the budget), so a repeat is answered and never executes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_larger_than_the_byte_budget_is_recorded_as_not_stored() {
    let store = store(1000, 1024);
    let k = fresh_key();
    let lease = expect_owner(claim(&store, k, fingerprint(1), LONG_LEASE).await);
    let done = Settlement::Done {
        response: response(&[1; 4096]),
        ttl: LONG_TTL,
    };
    assert_eq!(lease.settle(done).await.unwrap(), Settled::AnswerNotKept);
    match claim(&store, k, fingerprint(1), LONG_LEASE).await {
        Claim::NotStored(record) => assert_eq!(record.status, StatusCode::CREATED),
        other => panic!("expected not_stored, got {}", other.as_str()),
    }
    assert!(store.stats().bytes <= 1024, "{:?}", store.stats());
    assert_eq!(store.stats().entries, 1);
}

/// With several shards, the totals still hold: shares of `max_entries` and `max_bytes`
/// that do not divide evenly must not add up to more than the configured bound.
/// (4097 entries make 4 shards; 40 answers' worth minus 3 bytes, over 4 shards, must
/// hold 9 answers per shard, not 10.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_bounds_hold_for_the_configured_totals() {
    const MAX: usize = 4097;
    let by_entries = store(MAX, 1 << 40);
    for _ in 0..MAX * 3 {
        complete_fresh(&by_entries, b"x", LONG_TTL).await;
    }
    assert!(
        by_entries.stats().entries <= MAX,
        "{:?}",
        by_entries.stats()
    );

    let cost = response(b"x").cost();
    let max_bytes = 40 * cost - 3;
    let by_bytes = store(4096, max_bytes);
    for _ in 0..400 {
        complete_fresh(&by_bytes, b"x", LONG_TTL).await;
    }
    assert!(
        by_bytes.stats().bytes <= max_bytes,
        "{:?}",
        by_bytes.stats()
    );
}
