//! How the memory store keeps one-time tokens, which anyone may ask for, from costing
//! another record: issuing one never evicts, unspent ones hold at most `token_share`, and
//! making room for a claim or an answer takes unspent tokens before any other record.

use super::tests::{
    is_done, key, numbered, owned, owner, while_shard_zero_is_held, FINGERPRINT, LEASE,
};
use super::*;
use crate::store::{ClaimArgs, ClaimMode, RawClaim, Settled, Settlement, StoredResponse};
use std::time::SystemTime;

/// The route of every answer here, so its evictions are told from the tokens' (counted
/// under the default tag).
const ORDERS: RouteTag = RouteTag(1);

/// Stores an answer for `k` on [`ORDERS`], to expire after `ttl`.
fn store_done(store: &MemoryStore, k: Digest, ttl: Duration) {
    let args = ClaimArgs {
        route: ORDERS,
        ..ClaimArgs::new(k, FINGERPRINT, LEASE)
    };
    let Ok(RawClaim::Owner { token, .. }) = store.claim(&args) else {
        panic!("{k:?} was not free");
    };
    let done = Settlement::Done {
        response: answer(),
        ttl,
    };
    assert_eq!(store.settle(&owned(k, token), done), Settled::Written);
}

const TOKEN_TTL: Duration = Duration::from_secs(300);
/// Shorter than [`TOKEN_TTL`]: an answer that expires before the tokens, so earliest
/// expiry alone would evict it first.
const ANSWER_TTL: Duration = Duration::from_secs(10);

/// One shard of `max_entries`, unspent tokens holding at most `token_share` percent.
fn store(max_entries: usize, token_share: u8, when_full: WhenFull) -> MemoryStore {
    MemoryStore::new(MemoryLimits {
        max_entries,
        max_bytes: 1 << 30,
        when_full,
        token_share,
        ..MemoryLimits::default()
    })
}

fn answer() -> StoredResponse {
    StoredResponse::new(http::StatusCode::OK, &http::HeaderMap::new(), b"ok")
}

fn evictions(store: &MemoryStore, route: RouteTag) -> u64 {
    let stats = store.stats();
    stats
        .evictions
        .iter()
        .filter(|e| e.0 == route)
        .map(|e| e.1)
        .sum()
}

fn token_evictions(store: &MemoryStore) -> u64 {
    evictions(store, RouteTag::default())
}

fn record_evictions(store: &MemoryStore) -> u64 {
    evictions(store, ORDERS)
}

/// A store full of answers refuses a token (counted) rather than evict one, even with
/// `when_full: evict`.
#[test]
fn issuing_a_token_never_evicts_a_record() {
    let store = store(4, 100, WhenFull::Evict);
    for n in 1..=4 {
        store_done(&store, key(n), ANSWER_TTL);
    }
    assert!(matches!(
        store.issue(key(9), TOKEN_TTL),
        Err(StoreError::Full)
    ));
    for n in 1..=4 {
        assert!(is_done(&store, key(n)), "answer {n} was evicted");
    }
    assert_eq!(store.stats().tokens_refused, 1);
    assert_eq!(record_evictions(&store), 0);
}

/// Unspent tokens hold at most `token_share` of the store, even with room to spare, and
/// issuing one past that never evicts another token; a token spent (claimed) frees its
/// place in the budget.
#[test]
fn unspent_tokens_hold_at_most_their_share() {
    let store = store(10, 30, WhenFull::Evict);
    assert_eq!(store.limits().max_tokens(), 3);
    for n in 1..=3 {
        store.issue(key(n), TOKEN_TTL).unwrap();
    }
    assert!(matches!(
        store.issue(key(4), TOKEN_TTL),
        Err(StoreError::Full)
    ));
    for n in 1..=3 {
        assert_eq!(store.inspect(key(n)).map(|i| i.state), Some("issued"));
    }
    let spend = ClaimArgs {
        mode: ClaimMode::IssuedOnly,
        ..ClaimArgs::new(key(1), FINGERPRINT, LEASE)
    };
    assert!(matches!(store.claim(&spend), Ok(RawClaim::Owner { .. })));
    store.issue(key(4), TOKEN_TTL).unwrap();
    assert_eq!(store.stats().tokens_refused, 1);
    assert_eq!(store.stats().entries, 4);
}

/// A token handed back after its attempt failed (released unsent) is a token like any
/// other: while new ones hold the whole share, it is not written (counted), and its
/// holder asks for a new one; never a record beyond `token_share`.
#[test]
fn a_token_handed_back_stays_within_the_share() {
    let store = store(10, 30, WhenFull::Evict);
    for n in 1..=3 {
        store.issue(key(n), TOKEN_TTL).unwrap();
    }
    let spend = ClaimArgs {
        mode: ClaimMode::IssuedOnly,
        ..ClaimArgs::new(key(1), FINGERPRINT, LEASE)
    };
    let Ok(RawClaim::Owner { token, .. }) = store.claim(&spend) else {
        panic!("the token was not spent");
    };
    // Its place in the share is taken while its attempt runs.
    store.issue(key(4), TOKEN_TTL).unwrap();
    let back = Settlement::Release {
        reissue: Some(SystemTime::now() + TOKEN_TTL),
    };
    assert_eq!(store.settle(&owned(key(1), token), back), Settled::Written);
    assert_eq!(store.inspect(key(1)).map(|i| i.state), None);
    assert_eq!(store.stats().tokens_refused, 1);
    assert_eq!(store.stats().entries, 3);
}

/// Spends the issued token at `k`: the owner's token.
fn spend(store: &MemoryStore, k: Digest) -> crate::store::OwnerToken {
    let args = ClaimArgs {
        mode: ClaimMode::IssuedOnly,
        ..ClaimArgs::new(k, FINGERPRINT, LEASE)
    };
    let Ok(RawClaim::Owner { token, .. }) = store.claim(&args) else {
        panic!("the token at {k:?} was not spent");
    };
    token
}

/// A failure that hands its token back, as the proxy settles a 5xx or an upstream never
/// reached: the failure shared with the waiters, the token usable again. Its token has
/// less than the linger left, so both stay in the failure's record (with more, the token
/// would go back alone).
fn failed_handing_back() -> Settlement {
    Settlement::Failed {
        response: answer(),
        linger: Duration::from_secs(5),
        reissue: Some(SystemTime::now() + Duration::from_secs(3)),
    }
}

/// A token handed back with its attempt's failure (kept in the failure's record, to be
/// spent again for `reissue`) counts in the share like one issued: while it is there, the
/// share is full; once it is spent again, there is room.
#[test]
fn a_token_handed_back_with_a_failure_counts_in_the_share() {
    let store = store(10, 30, WhenFull::Evict);
    for n in 1..=3 {
        store.issue(key(n), TOKEN_TTL).unwrap();
    }
    let owner = spend(&store, key(1));
    let settled = store.settle(&owned(key(1), owner), failed_handing_back());
    assert_eq!(settled, Settled::Written);
    assert_eq!(store.inspect(key(1)).map(|i| i.state), Some("failed"));
    assert!(
        matches!(store.issue(key(4), TOKEN_TTL), Err(StoreError::Full)),
        "three unspent tokens, one of them handed back, fill a share of three"
    );
    let _again = spend(&store, key(1));
    store.issue(key(4), TOKEN_TTL).unwrap();
    assert_eq!(store.stats().tokens_refused, 1);
}

/// A failure that finds the share full shares its failure with the waiters, but hands
/// its token back no more than a release would: never a token beyond `token_share`.
#[test]
fn a_failure_that_finds_the_share_full_does_not_hand_its_token_back() {
    let store = store(10, 30, WhenFull::Evict);
    for n in 1..=3 {
        store.issue(key(n), TOKEN_TTL).unwrap();
    }
    let owner = spend(&store, key(1));
    // Its place in the share is taken while its attempt runs.
    store.issue(key(4), TOKEN_TTL).unwrap();
    let settled = store.settle(&owned(key(1), owner), failed_handing_back());
    assert_eq!(settled, Settled::Written);
    assert_eq!(store.inspect(key(1)).map(|i| i.state), Some("failed"));
    let args = ClaimArgs {
        mode: ClaimMode::IssuedOnly,
        ..ClaimArgs::new(key(1), FINGERPRINT, LEASE)
    };
    assert!(matches!(
        store.claim(&args),
        Ok(RawClaim::Other(crate::store::Claim::NotIssued))
    ));
    assert_eq!(store.stats().tokens_refused, 1);
}

/// The budget holds by bytes as well: `token_share` of `max_bytes`, at a token's cost.
#[test]
fn the_token_budget_follows_max_bytes_too() {
    let limits = MemoryLimits {
        max_entries: 1_000_000,
        max_bytes: 100 * ENTRY_OVERHEAD,
        token_share: 10,
        ..MemoryLimits::default()
    };
    assert_eq!(limits.max_tokens(), 10);
    let tiny = MemoryLimits {
        max_entries: 4,
        ..limits
    };
    assert_eq!(
        tiny.max_tokens(),
        1,
        "a store always has room for one token"
    );
}

/// A claim on a full store evicts an unspent token before an answer that expires sooner,
/// with either `when_full`: with `reject`, rather than answer `Full` (a 503) while a token
/// could go. The token's eviction is counted (under the default route tag).
#[test]
fn a_claim_evicts_unspent_tokens_before_any_answer() {
    for when_full in [WhenFull::Evict, WhenFull::Reject] {
        let store = store(6, 50, when_full);
        for n in 1..=3 {
            store_done(&store, key(n), ANSWER_TTL);
            store.issue(key(10 + n), TOKEN_TTL).unwrap();
        }
        let (_token, _liveness) = owner(&store, key(7), LEASE);
        for n in 1..=3 {
            assert!(is_done(&store, key(n)), "{when_full:?}: answer {n} evicted");
        }
        assert_eq!(store.inspect(key(11)).map(|i| i.state), None);
        assert_eq!(store.stats().entries, 6);
        assert_eq!(token_evictions(&store), 1, "{when_full:?}");
        assert_eq!(record_evictions(&store), 0, "{when_full:?}");
    }
}

/// With `when_full: evict`, once no token is left, the answer closest to expiry goes as
/// before.
#[test]
fn without_tokens_a_claim_evicts_the_earliest_answer() {
    let store = store(2, 50, WhenFull::Evict);
    store_done(&store, key(1), TOKEN_TTL);
    store_done(&store, key(2), ANSWER_TTL);
    let (_token, _liveness) = owner(&store, key(3), LEASE);
    assert!(is_done(&store, key(1)));
    assert!(!is_done(&store, key(2)));
    assert_eq!(record_evictions(&store), 1);
}

/// An answer that needs bytes takes them from unspent tokens, with `when_full: reject` as
/// well: it is stored and replayed, not kept as "executed, answer not stored".
#[test]
fn an_answer_evicts_tokens_for_its_bytes() {
    let cost = answer().cost();
    assert!(cost > ENTRY_OVERHEAD);
    // Room for the claim and three tokens, not for the answer beside them.
    let store = MemoryStore::new(MemoryLimits {
        max_entries: 100,
        max_bytes: cost + 3 * ENTRY_OVERHEAD - 1,
        when_full: WhenFull::Reject,
        token_share: 100,
        ..MemoryLimits::default()
    });
    let (token, _liveness) = owner(&store, key(1), LEASE);
    for n in 11..=13 {
        store.issue(key(n), TOKEN_TTL).unwrap();
    }
    let done = Settlement::Done {
        response: answer(),
        ttl: ANSWER_TTL,
    };
    assert_eq!(store.settle(&owned(key(1), token), done), Settled::Written);
    assert!(is_done(&store, key(1)));
    assert!(token_evictions(&store) >= 1);
}

/// Two shards (2048 entries) bounded by bytes to `answers` answers and `tokens` tokens.
fn two_shards(answers: usize, tokens: usize) -> MemoryStore {
    let store = MemoryStore::new(MemoryLimits {
        max_entries: 2048,
        max_bytes: answers * answer().cost() + tokens * ENTRY_OVERHEAD,
        token_share: 100,
        ..MemoryLimits::default()
    });
    assert_eq!(store.shards.len(), 2);
    store
}

/// Tokens in another shard go before an answer in the claim's own shard.
#[test]
fn a_claim_evicts_a_token_in_another_shard_before_an_answer_in_its_own() {
    let store = two_shards(2, 2);
    store_done(&store, numbered(0, 1), ANSWER_TTL);
    store_done(&store, numbered(0, 2), ANSWER_TTL);
    store.issue(numbered(1, 1), TOKEN_TTL).unwrap();
    store.issue(numbered(1, 2), TOKEN_TTL).unwrap();
    let (_token, _liveness) = owner(&store, numbered(0, 3), LEASE);
    assert!(is_done(&store, numbered(0, 1)));
    assert!(is_done(&store, numbered(0, 2)));
    assert_eq!(token_evictions(&store), 1);
    assert_eq!(record_evictions(&store), 0);
}

/// Tokens in a shard another thread holds go before an answer in the claim's own shard:
/// the claim waits for that shard rather than evict the answer it could reach at once.
#[test]
fn a_claim_waits_for_a_held_shard_with_tokens_rather_than_evict_an_answer() {
    let store = two_shards(2, 2);
    store_done(&store, numbered(1, 1), ANSWER_TTL);
    store_done(&store, numbered(1, 2), ANSWER_TTL);
    store.issue(numbered(0, 1), TOKEN_TTL).unwrap();
    store.issue(numbered(0, 2), TOKEN_TTL).unwrap();
    let claim = while_shard_zero_is_held(&store, || {
        store.claim(&ClaimArgs::new(numbered(1, 3), FINGERPRINT, LEASE))
    });
    assert!(matches!(claim, Ok(RawClaim::Owner { .. })));
    assert!(is_done(&store, numbered(1, 1)));
    assert!(is_done(&store, numbered(1, 2)));
    assert_eq!(token_evictions(&store), 1);
    assert_eq!(record_evictions(&store), 0);
}

/// Each token handed back goes back to issued for what is left of its expiry as issued,
/// a span no other hand-back shares to the nanosecond. The expiry index keeps one queue
/// per TTL, uncounted by `max_bytes` and scanned by every write, so tokens share one
/// whatever their span: 5000 hand-backs, each with its own span, leave one queue.
#[test]
fn handed_back_tokens_leave_no_queue_behind() {
    let store = store(1000, 100, WhenFull::Reject);
    for n in 0..5000u32 {
        let mut k = Digest([0; 32]);
        k.0[..4].copy_from_slice(&n.to_le_bytes());
        store.issue(k, TOKEN_TTL).unwrap();
        let owner = spend(&store, k);
        // Spans from 300 s down to about 295 s, a microsecond apart.
        let back = Settlement::Release {
            reissue: Some(SystemTime::now() + TOKEN_TTL - Duration::from_micros(u64::from(n))),
        };
        assert_eq!(store.settle(&owned(k, owner), back), Settled::Written);
        assert!(store.forget(k));
    }
    let shard = store.shards[0].lock().unwrap();
    assert_eq!(shard.queue_count(), 1);
}

/// A token handed back with its attempt's failure is never spent after its expiry as
/// issued, though the failure's waiters would have longer to collect it.
#[test]
fn a_token_handed_back_with_a_failure_expires_as_issued() {
    let store = store(10, 100, WhenFull::Evict);
    store.issue(key(1), TOKEN_TTL).unwrap();
    let owner = spend(&store, key(1));
    let failed = Settlement::Failed {
        response: answer(),
        linger: Duration::from_secs(5),
        reissue: Some(SystemTime::now() + Duration::from_millis(50)),
    };
    assert_eq!(
        store.settle(&owned(key(1), owner), failed),
        Settled::Written
    );
    // Sleeping past the token's expiry, well within the failure's linger.
    std::thread::sleep(Duration::from_millis(100));
    let args = ClaimArgs {
        mode: ClaimMode::IssuedOnly,
        ..ClaimArgs::new(key(1), FINGERPRINT, LEASE)
    };
    assert!(matches!(
        store.claim(&args),
        Ok(RawClaim::Other(crate::store::Claim::NotIssued))
    ));
}

/// Tokens handed back with spans shorter than those of tokens handed back before them
/// keep their own expiries exactly (as issued, never rounded), and their shared queue
/// stays in expiry order, so the writes after they expire sweep them first; a queue that
/// sweeping empties goes at once (every write scans the queues).
#[test]
fn queues_emptied_by_sweeping_go() {
    let store = store(1000, 100, WhenFull::Reject);
    // Issued for a little over the longest span: the entries their first issue left in
    // the queue (stale once spent) are swept by the end too.
    let hand_back = |n: u8, left: Duration| {
        store.issue(key(n), Duration::from_millis(1100)).unwrap();
        let owner = spend(&store, key(n));
        let expiry = SystemTime::now() + left;
        let back = Settlement::Release {
            reissue: Some(expiry),
        };
        assert_eq!(store.settle(&owned(key(n), owner), back), Settled::Written);
        let info = store.inspect(key(n)).expect("issued again");
        let lives = info.expires.duration_since(expiry).unwrap_or_default()
            + expiry.duration_since(info.expires).unwrap_or_default();
        assert!(
            lives < Duration::from_millis(2),
            "its expiry moved by {lives:?}"
        );
    };
    // The longest first: kept in arrival order, the short ones would wait behind it.
    hand_back(10, Duration::from_secs(1));
    for (n, ms) in [(1, 80), (2, 40), (3, 20), (4, 10)] {
        hand_back(n, Duration::from_millis(ms));
    }
    let queues = |store: &MemoryStore| {
        let shard = store.shards[0].lock().unwrap();
        let (queued, _, entries) = shard.queued();
        assert_eq!(queued, entries);
        assert!(shard.every_record_is_indexed());
        shard.queue_count()
    };
    assert_eq!(queues(&store), 1, "one queue for every span");
    // Each write sweeps a few expired records: a few claims of other keys.
    let writes = |store: &MemoryStore, from: u8| {
        for n in from..from + 4 {
            owner(store, key(n), LEASE);
        }
    };
    std::thread::sleep(Duration::from_millis(200));
    writes(&store, 100);
    assert_eq!(
        store.stats().entries,
        1 + 4,
        "the four short ones swept, the claims"
    );
    assert_eq!(
        store.inspect(key(10)).expect("still issued").state,
        "issued"
    );
    std::thread::sleep(Duration::from_millis(1000));
    writes(&store, 110);
    assert_eq!(queues(&store), 0, "the emptied queue is gone");
    assert!(store.inspect(key(10)).is_none());
    assert_eq!(store.stats().entries, 8, "the claims alone");
}
