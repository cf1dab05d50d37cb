//! The embedded store: sharded maps under short mutexes, bounded by entry count and bytes,
//! expiring by TTL. In-flight claims are never evicted; done records go earliest-expiry
//! first when a bound is reached. The bounds are totals over all shards (kept in atomics),
//! so one large answer can use the whole byte budget, not just its shard's share.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use super::{KeyInfo, OwnerToken, StoreError, StoreStats, StoredResponse, Waiter};
use crate::key::Digest;

/// Bounds of the memory store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Most records held (in flight and done).
    pub max_entries: usize,
    /// Most bytes of done records (bodies, headers and a fixed overhead each).
    pub max_bytes: usize,
}

impl Default for MemoryLimits {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            max_bytes: 256 << 20,
        }
    }
}

/// What a claim found, before the [`super::Store`] wraps ownership in a lease guard.
#[derive(Debug)]
pub enum RawClaim {
    /// Claimed by this token.
    Owner(OwnerToken),
    /// Owned by someone else.
    InFlight(Waiter),
    /// Completed.
    Done(Arc<StoredResponse>),
    /// Completed or in flight with another payload.
    Mismatch,
    /// [`ClaimMode::IssuedOnly`] and no issued record: an unknown, expired or foreign token.
    Unknown,
}

/// Which records a claim may start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimMode {
    /// A free key becomes owned (client keys, fields, fingerprints).
    Any,
    /// Only a key issued beforehand (a one-time token) becomes owned, consuming the issue
    /// record in the same atomic step.
    IssuedOnly,
}

/// The in-process store.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    limits: MemoryLimits,
    totals: Totals,
    /// Fixed-window counters for rate limits: key → (window end, hits).
    counters: Mutex<DigestMap<(Instant, u64)>>,
}

/// Records and done-record bytes over all shards.
#[derive(Debug, Default)]
struct Totals {
    entries: AtomicUsize,
    bytes: AtomicUsize,
}

#[derive(Debug)]
enum Entry {
    // Variants are kept near the size of `Done` (the common one): the map stores the
    // largest variant's size for every key.
    /// A one-time token issued and not yet used.
    Issued { expires_at: Instant, seq: u64 },
    InFlight {
        token: OwnerToken,
        fingerprint: Digest,
        lease_until: Instant,
        /// Unix milliseconds, for the admin API (8 bytes instead of a 16-byte SystemTime:
        /// every byte of a record is paid per key).
        created_ms: u64,
        // Dropped when the record is replaced or removed; waiters subscribed to it wake.
        // Made by the first duplicate: most claims never see one, and the channel is an
        // allocation and a notification per claim otherwise.
        done: Option<watch::Sender<()>>,
    },
    Done {
        fingerprint: Digest,
        response: Arc<StoredResponse>,
        expires_at: Instant,
        seq: u64,
    },
}

// The per-key cost of the map: a record must not grow past this without a reason.
const _: () = assert!(std::mem::size_of::<Entry>() <= 96);

/// Digests are uniformly random already; hashing them again with SipHash is wasted work.
#[derive(Default)]
struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8).take(1) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(word);
        }
    }
    fn write_usize(&mut self, _: usize) {}
}

type DigestMap<V> = HashMap<Digest, V, BuildHasherDefault<DigestHasher>>;

#[derive(Debug, Default)]
struct Shard {
    map: DigestMap<Entry>,
    /// Done records by expiry, for sweeping and for choosing what to evict.
    expiry: BTreeMap<(Instant, u64), Digest>,
    in_flight: usize,
    seq: u64,
}

/// Below this many entries per shard, sharding buys nothing: eviction would mostly reach
/// into other shards.
const MIN_ENTRIES_PER_SHARD: usize = 1024;
const MAX_SHARDS: usize = 16;
/// Expired records swept per write, so expiry costs O(1) amortized and needs no timer.
const SWEEP_PER_WRITE: usize = 4;
/// Bytes charged for an issued token: it holds no response, only its slot.
const ISSUED_COST: usize = super::response::ENTRY_OVERHEAD;
/// Rate counters are pruned of finished windows once this many exist.
const COUNTER_SWEEP_AT: usize = 4096;

impl MemoryStore {
    /// An empty store with these bounds.
    pub fn new(limits: MemoryLimits) -> Self {
        let shards = (limits.max_entries / MIN_ENTRIES_PER_SHARD).clamp(1, MAX_SHARDS);
        let shards = if shards.is_power_of_two() {
            shards
        } else {
            shards.next_power_of_two() / 2
        };
        Self {
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            limits,
            totals: Totals::default(),
            counters: Mutex::default(),
        }
    }

    fn shard_index(&self, key: &Digest) -> usize {
        key.0[31] as usize & (self.shards.len() - 1)
    }

    /// Evicts done records, the caller's shard first (its lock is held), then others it
    /// can lock without waiting (never blocking on a second lock, so no lock-order
    /// deadlock), until `over` is false. Returns whether it is.
    fn make_room(&self, own: &mut Shard, own_index: usize, over: impl Fn(&Totals) -> bool) -> bool {
        while over(&self.totals) {
            if !own.evict_one(&self.totals) {
                break;
            }
        }
        for (i, other) in self.shards.iter().enumerate() {
            if !over(&self.totals) {
                return true;
            }
            if i == own_index {
                continue;
            }
            if let Ok(mut other) = other.try_lock() {
                while over(&self.totals) && other.evict_one(&self.totals) {}
            }
        }
        !over(&self.totals)
    }

    fn shard(&self, key: &Digest) -> MutexGuard<'_, Shard> {
        let index = self.shard_index(key);
        // A poisoned shard only means another thread panicked mid-operation; every
        // operation leaves the shard consistent before it can panic, so keep serving.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// See [`super::Store::claim`].
    pub fn claim(
        &self,
        key: Digest,
        fingerprint: Digest,
        lease: Duration,
        mode: ClaimMode,
    ) -> Result<RawClaim, StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(&key);
        shard.sweep(now, SWEEP_PER_WRITE, &self.totals);
        match shard.map.get_mut(&key) {
            Some(Entry::Issued { expires_at, .. }) if *expires_at > now => {}
            None | Some(Entry::Issued { .. }) if mode == ClaimMode::IssuedOnly => {
                return Ok(RawClaim::Unknown)
            }
            Some(Entry::Done {
                fingerprint: stored,
                response,
                expires_at,
                ..
            }) if *expires_at > now => {
                return Ok(if mismatched(stored, &fingerprint) {
                    RawClaim::Mismatch
                } else {
                    RawClaim::Done(response.clone())
                });
            }
            Some(Entry::InFlight {
                fingerprint: stored,
                lease_until,
                done,
                ..
            }) if *lease_until > now => {
                return Ok(if mismatched(stored, &fingerprint) {
                    RawClaim::Mismatch
                } else {
                    let done = done.get_or_insert_with(|| watch::channel(()).0);
                    RawClaim::InFlight(Waiter::new(done.subscribe(), *lease_until))
                });
            }
            // Only a live issued record starts an issued-only claim: a token whose answer
            // expired, or whose owner vanished, is spent (as on Redis, where both records
            // are gone by then); the client asks for a new one.
            _ if mode == ClaimMode::IssuedOnly => return Ok(RawClaim::Unknown),
            // Free, expired, issued, or owned by someone whose lease ran out: take it over.
            _ => {}
        }
        shard.remove(&key, &self.totals);
        let max = self.limits.max_entries;
        if !self.make_room(&mut shard, self.shard_index(&key), |t| {
            t.entries.load(Ordering::Relaxed) >= max
        }) {
            return Err(StoreError::Full);
        }
        let token = OwnerToken::random();
        shard.in_flight += 1;
        self.totals.entries.fetch_add(1, Ordering::Relaxed);
        shard.map.insert(
            key,
            Entry::InFlight {
                token,
                fingerprint,
                lease_until: now + lease,
                created_ms: SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
                done: None,
            },
        );
        Ok(RawClaim::Owner(token))
    }

    /// See [`super::Store::issue`].
    pub fn issue(&self, key: Digest, ttl: Duration) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut shard = self.shard(&key);
        shard.remove(&key, &self.totals);
        let max_entries = self.limits.max_entries;
        let max_bytes = self.limits.max_bytes;
        let index = self.shard_index(&key);
        if !self.make_room(&mut shard, index, |t| {
            t.entries.load(Ordering::Relaxed) >= max_entries
                || t.bytes.load(Ordering::Relaxed) + ISSUED_COST > max_bytes
        }) {
            return Err(StoreError::Full);
        }
        shard.insert_issued(key, now + ttl, &self.totals);
        Ok(())
    }

    /// See [`super::Store::hit`].
    pub fn hit(&self, key: Digest, window: Duration) -> u64 {
        let now = Instant::now();
        let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        if counters.len() >= COUNTER_SWEEP_AT {
            counters.retain(|_, (end, _)| *end > now);
        }
        let slot = counters.entry(key).or_insert((now + window, 0));
        if slot.0 <= now {
            *slot = (now + window, 0);
        }
        slot.1 += 1;
        slot.1
    }

    /// See [`super::Store::renew`].
    pub fn renew(&self, key: Digest, token: OwnerToken, lease: Duration) -> bool {
        let mut shard = self.shard(&key);
        match shard.map.get_mut(&key) {
            Some(Entry::InFlight {
                token: owner,
                lease_until,
                ..
            }) if *owner == token => {
                *lease_until = Instant::now() + lease;
                true
            }
            _ => false,
        }
    }

    /// See [`super::Store::complete`].
    pub fn complete(
        &self,
        key: Digest,
        token: OwnerToken,
        response: StoredResponse,
        ttl: Duration,
    ) -> bool {
        let now = Instant::now();
        let mut shard = self.shard(&key);
        let fingerprint = match shard.map.get(&key) {
            Some(Entry::InFlight {
                token: owner,
                fingerprint,
                ..
            }) if *owner == token => *fingerprint,
            _ => return false,
        };
        shard.remove(&key, &self.totals);
        let cost = response.cost();
        let max = self.limits.max_bytes;
        if ttl.is_zero() || cost > max {
            // Nothing to keep, or larger than the whole budget: the key is released, so a
            // retry runs again rather than finding a half-kept promise.
            return true;
        }
        self.make_room(&mut shard, self.shard_index(&key), |t| {
            t.bytes.load(Ordering::Relaxed) + cost > max
        });
        shard.seq += 1;
        let seq = shard.seq;
        let expires_at = now + ttl;
        shard.expiry.insert((expires_at, seq), key);
        self.totals.bytes.fetch_add(cost, Ordering::Relaxed);
        self.totals.entries.fetch_add(1, Ordering::Relaxed);
        shard.map.insert(
            key,
            Entry::Done {
                fingerprint,
                response: Arc::new(response),
                expires_at,
                seq,
            },
        );
        shard.sweep(now, SWEEP_PER_WRITE, &self.totals);
        true
    }

    /// See [`super::Store::release`]; with `reissue`, the key goes back to issued (a token
    /// whose attempt failed can be used again) instead of free.
    pub fn release(&self, key: Digest, token: OwnerToken, reissue: Option<Duration>) -> bool {
        let mut shard = self.shard(&key);
        match shard.map.get(&key) {
            Some(Entry::InFlight { token: owner, .. }) if *owner == token => {
                shard.remove(&key, &self.totals);
                if let Some(ttl) = reissue {
                    shard.insert_issued(key, Instant::now() + ttl, &self.totals);
                }
                true
            }
            _ => false,
        }
    }

    /// See [`super::Store::inspect`].
    pub fn inspect(&self, key: Digest) -> Option<KeyInfo> {
        let now = Instant::now();
        let wall = SystemTime::now();
        let shard = self.shard(&key);
        match shard.map.get(&key)? {
            Entry::InFlight {
                lease_until,
                created_ms,
                ..
            } => Some(KeyInfo {
                state: "in_flight",
                created: std::time::UNIX_EPOCH + Duration::from_millis(*created_ms),
                expires: wall + lease_until.saturating_duration_since(now),
                response: None,
            }),
            Entry::Done {
                response,
                expires_at,
                ..
            } if *expires_at > now => Some(KeyInfo {
                state: "done",
                created: response.stored_at(),
                expires: wall + expires_at.saturating_duration_since(now),
                response: Some(response.clone()),
            }),
            Entry::Done { .. } => None,
            Entry::Issued { expires_at, .. } if *expires_at > now => Some(KeyInfo {
                state: "issued",
                created: wall,
                expires: wall + expires_at.saturating_duration_since(now),
                response: None,
            }),
            Entry::Issued { .. } => None,
        }
    }

    /// See [`super::Store::remove`].
    pub fn remove(&self, key: Digest) -> bool {
        self.shard(&key).remove(&key, &self.totals)
    }

    /// Current gauges, summed over shards.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            entries: self.totals.entries.load(Ordering::Relaxed),
            in_flight: self
                .shards
                .iter()
                .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).in_flight)
                .sum(),
            bytes: self.totals.bytes.load(Ordering::Relaxed),
        }
    }
}

/// Whether two payload fingerprints disagree; [`Digest::NONE`] on either side never does.
pub(crate) fn mismatched(stored: &Digest, offered: &Digest) -> bool {
    stored != offered && *stored != Digest::NONE && *offered != Digest::NONE
}

impl Shard {
    /// Records an issued token until `expires_at`, indexed for expiry and counted.
    fn insert_issued(&mut self, key: Digest, expires_at: Instant, totals: &Totals) {
        self.seq += 1;
        let seq = self.seq;
        self.expiry.insert((expires_at, seq), key);
        self.map.insert(key, Entry::Issued { expires_at, seq });
        totals.entries.fetch_add(1, Ordering::Relaxed);
        totals.bytes.fetch_add(ISSUED_COST, Ordering::Relaxed);
    }

    /// Removes a record of any state, keeping the counters and the expiry index right.
    fn remove(&mut self, key: &Digest, totals: &Totals) -> bool {
        match self.map.remove(key) {
            Some(Entry::InFlight { .. }) => {
                self.in_flight -= 1;
                totals.entries.fetch_sub(1, Ordering::Relaxed);
                true
            }
            Some(Entry::Done {
                response,
                expires_at,
                seq,
                ..
            }) => {
                totals.bytes.fetch_sub(response.cost(), Ordering::Relaxed);
                totals.entries.fetch_sub(1, Ordering::Relaxed);
                self.expiry.remove(&(expires_at, seq));
                true
            }
            Some(Entry::Issued { expires_at, seq }) => {
                totals.bytes.fetch_sub(ISSUED_COST, Ordering::Relaxed);
                totals.entries.fetch_sub(1, Ordering::Relaxed);
                self.expiry.remove(&(expires_at, seq));
                true
            }
            None => false,
        }
    }

    /// Evicts the done record closest to expiry; `false` when there is none.
    fn evict_one(&mut self, totals: &Totals) -> bool {
        let Some((_, key)) = self.expiry.first_key_value() else {
            return false;
        };
        let key = *key;
        self.remove(&key, totals)
    }

    fn sweep(&mut self, now: Instant, most: usize, totals: &Totals) {
        for _ in 0..most {
            match self.expiry.first_key_value() {
                Some((&(at, _), &key)) if at <= now => {
                    self.remove(&key, totals);
                }
                _ => break,
            }
        }
    }
}
