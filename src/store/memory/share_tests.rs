//! What one client address may hold of the memory store (`address_share`), and that its
//! counts follow its records on every path that writes, replaces or removes one: a count
//! left behind would hold a share against an address that holds nothing, and one missing
//! would let an address past its share.

use super::tests::{key, owned, FINGERPRINT, LEASE};
use super::*;
use crate::store::{
    AddressTag, CallerTag, ClaimArgs, Lapse, Liveness, RawClaim, Settled, Settlement,
    StoredResponse,
};

fn answer() -> StoredResponse {
    StoredResponse::new(http::StatusCode::OK, &http::HeaderMap::new(), b"ok")
}

/// A claim of `k` by `caller` from `address`.
fn args(k: Digest, caller: u32, address: u32) -> ClaimArgs {
    ClaimArgs {
        caller: CallerTag(caller),
        address: AddressTag(address),
        ..ClaimArgs::new(k, FINGERPRINT, LEASE)
    }
}

/// The owner's token of a claim that must own its key.
fn owns(store: &MemoryStore, args: &ClaimArgs) -> (crate::store::OwnerToken, Liveness) {
    match store.claim(args) {
        Ok(RawClaim::Owner {
            token,
            liveness: Some(liveness),
        }) => (token, liveness),
        Ok(RawClaim::Other(other)) => panic!("{:?} was not free: {}", args.key, other.as_str()),
        other => panic!("{:?} was not owned: {other:?}", args.key),
    }
}

/// The records and bytes the per-address and per-caller counts hold, each summed over
/// every address (caller, where counted), are those of the whole store: every record here
/// is claimed from an address by a caller, so any difference is a count a path forgot.
#[track_caller]
fn assert_counted(store: &MemoryStore, step: &str) {
    let all = (
        store.totals.entries.load(Ordering::SeqCst),
        store.totals.bytes.load(Ordering::SeqCst),
    );
    assert_eq!(store.totals.addresses.total(), all, "addresses, {step}");
    if store.limits.counts_callers() {
        assert_eq!(store.totals.callers.total(), all, "callers, {step}");
    }
}

/// Both shares counted (their tags then share a record's 32 bits), neither reached here:
/// room for 4 records, one shard.
fn counting_store(when_full: WhenFull) -> MemoryStore {
    MemoryStore::new(MemoryLimits {
        max_entries: 4,
        max_bytes: 1 << 30,
        when_full,
        caller_share: 99,
        address_share: 99,
        ..MemoryLimits::default()
    })
}

/// One address naming a new caller on every claim (a made-up `Authorization` each) holds
/// at most its share: past it, its new keys are refused (`AddressFull`, a 429) while
/// another address still claims; once one of its records is gone it may claim again.
#[test]
fn one_address_holds_at_most_its_share_whatever_callers_it_names() {
    let store = MemoryStore::new(MemoryLimits {
        max_entries: 10,
        address_share: 30,
        ..MemoryLimits::default()
    });
    let held: Vec<_> = (1..=3)
        .map(|n| owns(&store, &args(key(n), u32::from(n), 5)))
        .collect();
    assert!(matches!(
        store.claim(&args(key(4), 4, 5)),
        Err(StoreError::AddressFull)
    ));
    let (_, other) = owns(&store, &args(key(5), 4, 6));
    assert!(store.forget(key(1)));
    let (_, again) = owns(&store, &args(key(4), 4, 5));
    drop((held, other, again));
}

/// The bytes of an answer count too: an answer that would take its address past its
/// share of `max_bytes` is not kept ("executed, not stored"), as one past its caller's
/// share is not, rather than taking room the store would make by evicting others.
#[test]
fn an_answer_past_the_addresss_byte_share_is_not_kept() {
    let cost = answer().cost();
    let store = MemoryStore::new(MemoryLimits {
        max_entries: 1000,
        // 3%: three small answers' bytes.
        max_bytes: 100 * cost,
        address_share: 3,
        ..MemoryLimits::default()
    });
    let settle = |n: u8, response: StoredResponse| {
        let (token, _alive) = owns(&store, &args(key(n), n.into(), 5));
        let ttl = Duration::from_secs(60);
        store.settle(&owned(key(n), token), Settlement::Done { response, ttl })
    };
    assert_eq!(settle(1, answer()), Settled::Written);
    assert_eq!(settle(2, answer()), Settled::Written);
    let large = StoredResponse::new(
        http::StatusCode::OK,
        &http::HeaderMap::new(),
        &vec![b'x'; 2 * cost],
    );
    assert_eq!(settle(3, large), Settled::AnswerNotKept);
    assert_counted(&store, "after the answer not kept");
}

/// The counts follow each record from its claim to its end: replaced by its outcome
/// (an answer, a failure, an unknown outcome, a late answer over that), released, swept
/// once expired, evicted for another record, purged, taken over by another address after
/// its owner vanished; and they are back to nothing once the store is empty.
#[test]
fn address_counts_return_to_zero_on_every_path() {
    let store = counting_store(WhenFull::Evict);
    let done = |ttl| Settlement::Done {
        response: answer(),
        ttl,
    };
    let hour = Duration::from_secs(3600);

    // Expiry: answers that expire at once, swept by the writes that follow.
    for n in 1..=2 {
        let (token, _alive) = owns(&store, &args(key(n), 1, 1));
        assert_counted(&store, "a claim");
        let answered = store.settle(&owned(key(n), token), done(Duration::from_nanos(1)));
        assert_eq!(answered, Settled::Written);
        assert_counted(&store, "an answer replacing its claim");
    }
    // Eviction: five answers in a store of four, each from its own address.
    for n in 3..=7 {
        let (token, _alive) = owns(&store, &args(key(n), n.into(), n.into()));
        assert_eq!(
            store.settle(&owned(key(n), token), done(hour)),
            Settled::Written
        );
        assert_counted(&store, "answers swept and evicted");
    }
    assert_eq!(store.stats().evictions.len(), 1, "{:?}", store.stats());
    assert!(store.inspect(key(1)).is_none() && store.inspect(key(3)).is_none());
    // Purge, by the admin API and by the proxy's own forget.
    assert_eq!(store.purge(key(4), None), Purged::Removed);
    assert!(store.forget(key(5)));
    assert_counted(&store, "purged");
    // Failure shared for a while, then a release: both end their claims.
    let (token, _alive) = owns(&store, &args(key(8), 8, 8));
    let failed = Settlement::Failed {
        response: answer(),
        linger: Duration::from_secs(5),
        reissue: None,
    };
    assert_eq!(
        store.settle(&owned(key(8), token), failed),
        Settled::Written
    );
    assert_counted(&store, "a failure shared");
    let (token, _alive) = owns(&store, &args(key(9), 9, 9));
    let release = Settlement::Release { reissue: None };
    assert_eq!(
        store.settle(&owned(key(9), token), release),
        Settled::Written
    );
    assert_counted(&store, "a release");

    // A claim whose owner vanished on a route that releases lapsed claims: taken over by
    // another address, whose count it moves to.
    let release = Lapse::Release {
        grace: Duration::ZERO,
    };
    let vanishing = |k, address| ClaimArgs {
        lease: Duration::from_nanos(1),
        lapse: release,
        ..args(k, 10, address)
    };
    let (_, alive) = owns(&store, &vanishing(key(10), 10));
    drop(alive);
    let (taker, _alive) = owns(&store, &vanishing(key(10), 11));
    assert_counted(&store, "taken over");
    let (held, held_bytes) = store.totals.addresses.total();
    assert!(held > 0 && held_bytes > 0);
    assert_eq!(
        store.settle(&owned(key(10), taker), done(hour)),
        Settled::Written
    );
    assert_counted(&store, "the taker's answer");

    // A claim whose owner vanished on a route that holds lapsed claims: its record turns
    // into an unknown outcome (still its address's), then its owner's late answer.
    let hold = ClaimArgs {
        lease: Duration::from_nanos(1),
        lapse: Lapse::Hold { ttl: hour },
        ..args(key(12), 12, 12)
    };
    let (token, alive) = owns(&store, &hold);
    drop(alive);
    assert!(matches!(
        store.claim(&args(key(12), 13, 13)),
        Ok(RawClaim::Other(crate::store::Claim::OutcomeUnknown(_)))
    ));
    assert_counted(&store, "held as unknown");
    assert_eq!(
        store.settle(&owned(key(12), token), done(hour)),
        Settled::Written
    );
    assert_counted(&store, "a late answer over the unknown outcome");

    for n in 1..=12 {
        store.forget(key(n));
    }
    assert_eq!(store.stats().entries, 0);
    assert!(store.totals.addresses.is_empty(), "{:?}", store.totals);
    assert!(store.totals.callers.is_empty(), "{:?}", store.totals);
}
