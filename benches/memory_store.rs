//! Memory store benchmarks: the owner's path (claim a fresh key, complete it), the
//! duplicate's path (claim a done key, get the stored answer) in a small and a 1M-key
//! store, the same owner's path through `Store` with its `Lease` guard, and
//! rebuilding a stored response's headers for a replay.
//!
//! Also prints, once, the resident memory each stored key costs (1M keys, 16-byte
//! bodies, 3 headers), for the README's sizing advice.
//!
//! `MemoryStore`'s methods are synchronous; they are called directly where `Store`'s async
//! wrapper would only add an `.await`. The `store/` benchmark goes through `Store` to show
//! what the lease guard adds (on the memory store it holds the claim's liveness; Redis
//! leases spawn a renewal task instead).

use std::cell::OnceCell;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use http::header::{CONTENT_TYPE, LOCATION};
use http::{HeaderMap, HeaderValue, StatusCode};
use idemgate::key::Digest;
use idemgate::store::{
    Claim, ClaimArgs, MemoryLimits, MemoryStore, Ownership, RawClaim, Settled, Settlement, Store,
    StoredResponse,
};

const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(24 * 3600);
const FINGERPRINT: Digest = Digest([7; 32]);
const MILLION: u64 = 1_000_000;

/// A well-mixed 64-bit value for `n` (splitmix64): cheap key material and indices.
fn mix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Key number `n`: uniformly distributed bytes like a real SHA-256, without its cost.
fn key(n: u64) -> Digest {
    let mut d = [0u8; 32];
    for (i, word) in d.chunks_exact_mut(8).enumerate() {
        word.copy_from_slice(&mix(n.wrapping_mul(4).wrapping_add(i as u64)).to_le_bytes());
    }
    Digest(d)
}

/// A typical created-resource answer: three headers and `body`.
fn response(body: &[u8]) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(LOCATION, HeaderValue::from_static("/orders/4711"));
    headers.insert(
        "x-request-id",
        HeaderValue::from_static("5f0c6f3e9d2b4a7c8e1f0a2b3c4d5e6f"),
    );
    StoredResponse::new(StatusCode::CREATED, &headers, body)
}

/// Claims `k` (which must be free) and completes it.
fn store_one(store: &MemoryStore, k: Digest, response: StoredResponse) {
    let args = ClaimArgs::new(k, FINGERPRINT, LEASE);
    match store.claim(&args) {
        Ok(RawClaim::Owner { token, .. }) => {
            let owned = Ownership {
                key: k,
                token,
                fingerprint: FINGERPRINT,
                lapse: args.lapse,
            };
            let done = Settlement::Done { response, ttl: TTL };
            assert_eq!(store.settle(&owned, done), Settled::Written);
        }
        other => panic!("expected owner, got {other:?}"),
    }
}

/// Claims done key `k` and returns what it replays.
fn replay(store: &MemoryStore, k: Digest) -> StoredResponse {
    match store.claim(&ClaimArgs::new(k, FINGERPRINT, LEASE)) {
        Ok(RawClaim::Other(Claim::Done(stored))) => stored,
        other => panic!("expected done, got {other:?}"),
    }
}

/// Resident set size in bytes, from `/proc/self/statm` (4 KiB pages assumed).
fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// 1M done keys with 16-byte bodies and 3 headers, each answer allocated on its own as in
/// the proxy; prints the RSS growth per key.
fn filled_store() -> MemoryStore {
    let before = rss_bytes();
    let started = Instant::now();
    let store = MemoryStore::new(MemoryLimits {
        max_entries: 2 * MILLION as usize,
        max_bytes: 8 << 30,
        ..MemoryLimits::default()
    });
    for n in 0..MILLION {
        store_one(&store, key(n), response(&n.to_le_bytes().repeat(2)));
    }
    let grown = rss_bytes().saturating_sub(before);
    let stats = store.stats();
    assert_eq!(stats.entries, MILLION as usize);
    eprintln!(
        "memory_store: {} keys stored in {:.2?}; RSS grew {:.1} MiB = {} bytes per key \
         (16-byte body, 3 headers; {} bytes per key accounted to max_bytes)",
        stats.entries,
        started.elapsed(),
        grown as f64 / (1 << 20) as f64,
        grown / stats.entries,
        stats.bytes / stats.entries,
    );
    store
}

fn memory_store(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_store");

    // First, so the RSS measurement sees a heap no earlier benchmark has grown.
    let million = OnceCell::new();
    group.bench_function("replay_hit_1M_keys", |b| {
        let store = million.get_or_init(filled_store);
        let mut n = 0u64;
        b.iter(|| {
            n += 1;
            replay(store, black_box(key(mix(n) % MILLION)))
        });
    });
    drop(million);

    // Steady state of a full store: past the default 100k entries, every claim also
    // evicts the record closest to expiry.
    group.bench_function("claim_new_complete", |b| {
        let store = MemoryStore::new(MemoryLimits::default());
        let answer = response(&[0xab; 1024]);
        let mut n = 0u64;
        b.iter(|| {
            n += 1;
            store_one(&store, black_box(key(n)), answer.clone());
        });
    });

    group.bench_function("replay_hit", |b| {
        const KEYS: u64 = 1000;
        let store = MemoryStore::new(MemoryLimits::default());
        for n in 0..KEYS {
            store_one(&store, key(n), response(&[0xab; 1024]));
        }
        let mut n = 0u64;
        b.iter(|| {
            n += 1;
            replay(&store, black_box(key(mix(n) % KEYS)))
        });
    });
    group.finish();
}

/// The owner's path as the proxy runs it: `Store::claim` starts a `Lease` (holding the
/// claim's liveness), `Lease::complete` stores the answer. Each iteration yields once, as
/// a request does between its phases.
fn store_with_lease(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let store = Store::Memory(Arc::new(MemoryStore::new(MemoryLimits::default())));
    let answer = response(&[0xab; 1024]);
    let mut n = 0u64;
    c.bench_function("store/claim_lease_complete", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let started = Instant::now();
                for _ in 0..iters {
                    n += 1;
                    let Ok(Claim::Owner(lease)) =
                        store.claim(black_box(key(n)), FINGERPRINT, LEASE).await
                    else {
                        panic!("expected owner");
                    };
                    assert!(lease.complete(answer.clone(), TTL).await.unwrap());
                    tokio::task::yield_now().await;
                }
                started.elapsed()
            })
        });
    });
}

fn stored_response(c: &mut Criterion) {
    let answer = response(&[0xab; 1024]);
    let mut group = c.benchmark_group("stored_response");
    group.bench_function("headers_rebuild", |b| {
        b.iter(|| black_box(&answer).headers())
    });
    group.finish();
}

criterion_group!(benches, memory_store, store_with_lease, stored_response);
criterion_main!(benches);
