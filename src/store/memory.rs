//! The embedded store: sharded maps under short mutexes, bounded by entry count and bytes,
//! expiring by TTL. In-flight claims are never evicted; done records go earliest-expiry
//! first when a bound is reached. The bounds are totals over all shards (kept in atomics),
//! so one large answer can use the whole byte budget, not just its shard's share.
//!
//! Every byte of a record is paid a million times in a full store, so the layout is
//! chosen for size: a done record is a 56-byte map value (an in-flight claim, of which
//! there are only as many as requests running, is boxed), and the expiry index is one
//! FIFO per TTL (records written with the same TTL expire in the order they were written),
//! 40 bytes an entry instead of an ordered tree's node overhead.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use super::{KeyInfo, OwnerToken, StoreError, StoreStats, StoredResponse, Waiter};
use crate::key::{Digest, DigestMap};
use crate::sync::lock;

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
    /// Claimed by this token; on the memory store with the claim's [`Liveness`].
    Owner {
        /// The fencing token of this ownership.
        token: OwnerToken,
        /// `Some` on the memory store: the claim does not lapse while it lives.
        liveness: Option<Liveness>,
    },
    /// Owned by someone else.
    InFlight(Waiter),
    /// Completed.
    Done(StoredResponse),
    /// Completed or in flight with another payload.
    Mismatch,
    /// [`ClaimMode::IssuedOnly`] and no issued record: an unknown, expired or foreign token.
    Unknown,
}

/// Held by the owner of a memory-store claim: while it lives the claim does not lapse, so
/// an owner in this process needs no renewal timer (a timer registration and a task per
/// claim). The claim's `lease_until` is claim time + lease, pushed forward by each claim
/// that finds it past due while the owner is alive; once the liveness is dropped without
/// the claim being completed or released (an owner that vanished without its guard
/// running), the claim lapses at `lease_until`, which may already have passed: the owner
/// is gone, and fencing keeps it from writing if it ever came back.
#[derive(Debug)]
pub struct Liveness {
    _alive: Arc<()>,
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
    /// Expiry times are kept as nanoseconds since this instant: 8 bytes instead of 16.
    epoch: Instant,
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

/// Nanoseconds since [`MemoryStore::epoch`] (584 years fit).
type Ticks = u64;

#[derive(Debug)]
enum Entry {
    /// A one-time token issued and not yet used.
    Issued {
        expires_at: Ticks,
    },
    InFlight(Box<InFlight>),
    /// The response carries the claim's payload fingerprint: one allocation to reach.
    Done {
        response: StoredResponse,
        expires_at: Ticks,
    },
}

// The per-key cost of the map (with the key and the table's slack): a record must not grow
// past this without a reason.
const _: () = assert!(std::mem::size_of::<Entry>() <= 32);

#[derive(Debug)]
struct InFlight {
    token: OwnerToken,
    fingerprint: Digest,
    /// Renewed lazily: a claim found past it while its owner is alive gets `lease` more.
    lease_until: Instant,
    /// The owner's lease, for those lazy renewals.
    lease: Duration,
    alive: Weak<()>,
    /// Claim time, for the admin API (converted to wall time only when shown: a wall-clock
    /// read per claim costs more than the conversion; after a wall-clock step the shown
    /// time is the monotonic age back from the current wall time).
    created: Ticks,
    // Dropped when the record is replaced or removed; waiters subscribed to it wake.
    // Made by the first duplicate: most claims never see one, and the channel is an
    // allocation and a notification per claim otherwise.
    done: Option<watch::Sender<()>>,
}

impl Entry {
    /// When a done or issued record expires; in-flight claims are not in the expiry index.
    fn expires_at(&self) -> Option<Ticks> {
        match self {
            Entry::Issued { expires_at } | Entry::Done { expires_at, .. } => Some(*expires_at),
            Entry::InFlight(_) => None,
        }
    }
}

#[derive(Debug, Default)]
struct Shard {
    map: DigestMap<Entry>,
    /// Done and issued records by expiry, for sweeping and for choosing what to evict.
    /// Queue entries are not removed with their record: one whose record is gone or has
    /// another expiry is stale, skipped when it reaches the front, and dropped in bulk by
    /// [`Shard::compact`] before stale entries can outnumber live ones.
    queues: Vec<ExpiryQueue>,
    /// Entries over all queues, stale ones included.
    queued: usize,
    in_flight: usize,
}

/// Records written with one TTL, oldest first: their expiry times ascend.
#[derive(Debug)]
struct ExpiryQueue {
    ttl: Duration,
    entries: VecDeque<(Ticks, Digest)>,
}

/// Below this many entries per shard, sharding buys nothing: eviction would mostly reach
/// into other shards.
const MIN_ENTRIES_PER_SHARD: usize = 1024;
/// A shard's table grows by doubling, rehashed at once under its lock in the proxy's
/// thread: the more shards, the shorter each pause. At 1.8M keys and 5k req/s, 16 shards
/// gave a p99.9 of 7-8 ms while the tables doubled, 64 shards 2.4-3.3 ms and 256 shards
/// 1.2-1.5 ms (`benches/load/growth.sh`), but 256 cost 12 B more per key and 2% of replay
/// and first-seen throughput; 64 measured level with 16 on both.
const MAX_SHARDS: usize = 64;
/// Expired records swept per write, so expiry costs O(1) amortized and needs no timer.
const SWEEP_PER_WRITE: usize = 4;
/// Bytes charged for an issued token: it holds no response, only its slot.
const ISSUED_COST: usize = super::response::ENTRY_OVERHEAD;
/// Rate counters are pruned of finished windows once this many exist.
const COUNTER_SWEEP_AT: usize = 4096;
/// Stale expiry-queue entries a shard tolerates beyond its live ones before compacting.
const COMPACT_SLACK: usize = 1024;

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
            epoch: Instant::now(),
            limits,
            totals: Totals::default(),
            counters: Mutex::default(),
        }
    }

    /// Now, and `now` as [`Ticks`].
    fn now(&self) -> (Instant, Ticks) {
        let now = Instant::now();
        (now, self.ticks(now))
    }

    fn ticks(&self, at: Instant) -> Ticks {
        at.saturating_duration_since(self.epoch).as_nanos() as Ticks
    }

    fn instant(&self, ticks: Ticks) -> Instant {
        self.epoch + Duration::from_nanos(ticks)
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
        lock(&self.shards[index])
    }

    /// See [`super::Store::claim`].
    pub fn claim(
        &self,
        key: Digest,
        fingerprint: Digest,
        lease: Duration,
        mode: ClaimMode,
    ) -> Result<RawClaim, StoreError> {
        let mut shard = self.shard(&key);
        let (now, ticks) = self.now();
        shard.sweep(ticks, SWEEP_PER_WRITE, &self.totals);
        match shard.map.get_mut(&key) {
            Some(Entry::Issued { expires_at }) if *expires_at > ticks => {}
            None | Some(Entry::Issued { .. }) if mode == ClaimMode::IssuedOnly => {
                return Ok(RawClaim::Unknown)
            }
            Some(Entry::Done {
                response,
                expires_at,
            }) if *expires_at > ticks => {
                return Ok(if mismatched(&response.fingerprint(), &fingerprint) {
                    RawClaim::Mismatch
                } else {
                    RawClaim::Done(response.clone())
                });
            }
            Some(Entry::InFlight(record))
                if record.lease_until > now || record.alive.strong_count() > 0 =>
            {
                if record.lease_until <= now {
                    record.lease_until = now + record.lease;
                }
                return Ok(if mismatched(&record.fingerprint, &fingerprint) {
                    RawClaim::Mismatch
                } else {
                    let done = record.done.get_or_insert_with(|| watch::channel(()).0);
                    RawClaim::InFlight(Waiter::new(done.subscribe(), record.lease_until))
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
        let liveness = Arc::new(());
        shard.in_flight += 1;
        self.totals.entries.fetch_add(1, Ordering::Relaxed);
        shard.map.insert(
            key,
            Entry::InFlight(Box::new(InFlight {
                token,
                fingerprint,
                lease_until: now + lease,
                lease,
                alive: Arc::downgrade(&liveness),
                created: ticks,
                done: None,
            })),
        );
        Ok(RawClaim::Owner {
            token,
            liveness: Some(Liveness { _alive: liveness }),
        })
    }

    /// See [`super::Store::issue`].
    pub fn issue(&self, key: Digest, ttl: Duration) -> Result<(), StoreError> {
        let mut shard = self.shard(&key);
        let (_, now) = self.now();
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
        shard.insert_issued(key, now, ttl, &self.totals);
        Ok(())
    }

    /// See [`super::Store::hit`].
    pub fn hit(&self, key: Digest, window: Duration) -> u64 {
        let now = Instant::now();
        let mut counters = lock(&self.counters);
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
            Some(Entry::InFlight(record)) if record.token == token => {
                record.lease_until = Instant::now() + lease;
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
        let mut shard = self.shard(&key);
        let fingerprint = match shard.map.get(&key) {
            Some(Entry::InFlight(record)) if record.token == token => record.fingerprint,
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
        let (_, now) = self.now();
        let expires_at = shard.index(key, now, ttl);
        self.totals.bytes.fetch_add(cost, Ordering::Relaxed);
        self.totals.entries.fetch_add(1, Ordering::Relaxed);
        shard.map.insert(
            key,
            Entry::Done {
                response: response.with_fingerprint(fingerprint),
                expires_at,
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
            Some(Entry::InFlight(record)) if record.token == token => {
                shard.remove(&key, &self.totals);
                if let Some(ttl) = reissue {
                    shard.insert_issued(key, self.now().1, ttl, &self.totals);
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
        let until = |at: Ticks| wall + self.instant(at).saturating_duration_since(now);
        match shard.map.get(&key)? {
            Entry::InFlight(record) => {
                // A live owner's claim does not lapse at a lease_until no one has renewed
                // since: show when it would, were the owner to vanish now.
                let until = if record.alive.strong_count() > 0 {
                    record.lease_until.max(now + record.lease)
                } else {
                    record.lease_until
                };
                Some(KeyInfo {
                    state: "in_flight",
                    created: wall
                        .checked_sub(now.saturating_duration_since(self.instant(record.created)))
                        .unwrap_or(wall),
                    expires: wall + until.saturating_duration_since(now),
                    response: None,
                })
            }
            Entry::Done {
                response,
                expires_at,
                ..
            } if self.instant(*expires_at) > now => Some(KeyInfo {
                state: "done",
                created: response.stored_at(),
                expires: until(*expires_at),
                response: Some(response.clone()),
            }),
            Entry::Done { .. } => None,
            Entry::Issued { expires_at } if self.instant(*expires_at) > now => Some(KeyInfo {
                state: "issued",
                created: wall,
                expires: until(*expires_at),
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
            in_flight: self.shards.iter().map(|s| lock(s).in_flight).sum(),
            bytes: self.totals.bytes.load(Ordering::Relaxed),
        }
    }
}

/// Whether two payload fingerprints disagree; [`Digest::NONE`] on either side never does.
pub(crate) fn mismatched(stored: &Digest, offered: &Digest) -> bool {
    stored != offered && *stored != Digest::NONE && *offered != Digest::NONE
}

/// Whether the queue entry `(at, key)` stands for a record in `map` (else it is stale).
fn is_live(map: &DigestMap<Entry>, at: Ticks, key: &Digest) -> bool {
    map.get(key).and_then(Entry::expires_at) == Some(at)
}

impl Shard {
    /// Records an issued token for `ttl` from `now`, indexed for expiry and counted.
    fn insert_issued(&mut self, key: Digest, now: Ticks, ttl: Duration, totals: &Totals) {
        let expires_at = self.index(key, now, ttl);
        self.map.insert(key, Entry::Issued { expires_at });
        totals.entries.fetch_add(1, Ordering::Relaxed);
        totals.bytes.fetch_add(ISSUED_COST, Ordering::Relaxed);
    }

    /// Enters `key` in the expiry queue of `ttl` and returns its expiry; the caller then
    /// inserts the done or issued record with that expiry.
    fn index(&mut self, key: Digest, now: Ticks, ttl: Duration) -> Ticks {
        // Before the push: the caller inserts the record only after this returns, so a
        // compaction after it would find no record for the new entry and drop it, leaving
        // a record that is never swept nor evicted.
        if self.queued >= 2 * self.indexed() + COMPACT_SLACK {
            self.compact();
        }
        let expires_at = now.saturating_add(ttl.as_nanos().min(u128::from(u64::MAX)) as Ticks);
        let queue = match self.queues.iter().position(|q| q.ttl == ttl) {
            Some(i) => &mut self.queues[i],
            None => {
                self.queues.push(ExpiryQueue {
                    ttl,
                    entries: VecDeque::new(),
                });
                self.queues.last_mut().expect("just pushed")
            }
        };
        queue.entries.push_back((expires_at, key));
        self.queued += 1;
        expires_at
    }

    /// Drops stale queue entries (and queues left empty, such as a TTL no route has any
    /// more after a reload). Runs after more than half of the entries went stale, so it
    /// costs O(1) per write amortized.
    fn compact(&mut self) {
        let map = &self.map;
        self.queues.retain_mut(|queue| {
            queue.entries.retain(|(at, key)| is_live(map, *at, key));
            queue.entries.shrink_to_fit();
            !queue.entries.is_empty()
        });
        self.queued = self.queues.iter().map(|q| q.entries.len()).sum();
    }

    /// Removes a record of any state, keeping the counters right (its expiry-queue entry,
    /// if any, goes stale).
    fn remove(&mut self, key: &Digest, totals: &Totals) -> bool {
        let freed = match self.map.remove(key) {
            Some(Entry::InFlight(_)) => {
                self.in_flight -= 1;
                totals.entries.fetch_sub(1, Ordering::Relaxed);
                return true;
            }
            Some(Entry::Done { response, .. }) => response.cost(),
            Some(Entry::Issued { .. }) => ISSUED_COST,
            None => return false,
        };
        totals.bytes.fetch_sub(freed, Ordering::Relaxed);
        totals.entries.fetch_sub(1, Ordering::Relaxed);
        true
    }

    /// Pops the queue entry that expires first, if it expires no later than `by`.
    fn pop_earliest(&mut self, by: Ticks) -> Option<(Ticks, Digest)> {
        let (index, at) = self
            .queues
            .iter()
            .enumerate()
            .filter_map(|(i, q)| q.entries.front().map(|(at, _)| (i, *at)))
            .min_by_key(|(_, at)| *at)?;
        if at > by {
            return None;
        }
        self.queued -= 1;
        self.queues[index].entries.pop_front()
    }

    /// Removes the record a popped queue entry stands for, unless the entry is stale.
    fn remove_indexed(&mut self, at: Ticks, key: &Digest, totals: &Totals) -> bool {
        is_live(&self.map, at, key) && self.remove(key, totals)
    }

    /// Done and issued records in `map`, each of which has exactly one live queue entry
    /// (every other record is in flight).
    fn indexed(&self) -> usize {
        self.map.len() - self.in_flight
    }

    /// Evicts the done or issued record closest to expiry; `false` when there is none.
    fn evict_one(&mut self, totals: &Totals) -> bool {
        while let Some((at, key)) = self.pop_earliest(Ticks::MAX) {
            if self.remove_indexed(at, &key, totals) {
                return true;
            }
        }
        false
    }

    /// Removes up to `most` records that expired by `now` (stale entries count, so a
    /// write never does more than `most` steps).
    fn sweep(&mut self, now: Ticks, most: usize, totals: &Totals) {
        for _ in 0..most {
            let Some((at, key)) = self.pop_earliest(now) else {
                break;
            };
            self.remove_indexed(at, &key, totals);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);
    const FINGERPRINT: Digest = Digest([7; 32]);

    fn key(n: u8) -> Digest {
        Digest([n; 32])
    }

    /// One shard (bounds below 1024 entries), so eviction order is exact.
    fn store(max_entries: usize) -> MemoryStore {
        MemoryStore::new(MemoryLimits {
            max_entries,
            max_bytes: 1 << 30,
        })
    }

    fn store_done(store: &MemoryStore, k: Digest, ttl: Duration) {
        let RawClaim::Owner { token, .. } =
            store.claim(k, FINGERPRINT, LEASE, ClaimMode::Any).unwrap()
        else {
            panic!("{k:?} was not free");
        };
        let response = StoredResponse::new(http::StatusCode::OK, &http::HeaderMap::new(), b"ok");
        assert!(store.complete(k, token, response, ttl));
    }

    fn is_done(store: &MemoryStore, k: Digest) -> bool {
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
        assert!(store.remove(key(1)));
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
            assert!(store.remove(k));
        }
        store_done(&store, key(1), hour);
        let shard = store.shards[0].lock().unwrap();
        assert_eq!(shard.indexed(), 1);
        assert!(
            shard.queued <= 2 * shard.indexed() + COMPACT_SLACK + 1,
            "{}",
            shard.queued
        );
        assert_eq!(
            shard.queued,
            shard.queues.iter().map(|q| q.entries.len()).sum::<usize>()
        );
    }

    fn numbered(tag: u8, n: u32) -> Digest {
        let mut k = Digest([tag; 32]);
        k.0[..4].copy_from_slice(&n.to_le_bytes());
        k
    }

    /// Every done or issued record has a queue entry with its expiry (else it would never
    /// be swept nor evicted), and `indexed()` counts exactly those records.
    fn assert_every_record_is_indexed(store: &MemoryStore) {
        let shard = store.shards[0].lock().unwrap();
        let mut records = 0;
        for (key, entry) in &shard.map {
            let Some(at) = entry.expires_at() else {
                continue;
            };
            records += 1;
            assert!(
                shard.queues.iter().any(|q| q.entries.contains(&(at, *key))),
                "a record has no queue entry"
            );
        }
        assert_eq!(shard.indexed(), records);
    }

    /// Compaction runs while a record is being written; it must not drop that record's
    /// own entry (found in review: compacting after the push, before the record was in
    /// the map, lost it). Stale entries pile up to the compaction point again and again
    /// while short-lived records are written between them.
    #[test]
    fn a_record_written_at_compaction_time_keeps_its_queue_entry() {
        let store = store(100);
        let hour = Duration::from_secs(3600);
        for round in 0..3 * COMPACT_SLACK as u32 {
            let gone = numbered(1, round);
            store_done(&store, gone, hour);
            assert!(store.remove(gone));
            store_done(&store, numbered(2, round), Duration::from_nanos(1));
            assert_every_record_is_indexed(&store);
        }
    }

    /// The admin view of a claim whose live owner outran its lease (no duplicate came to
    /// extend it) shows when the claim would lapse were the owner to vanish now, not a
    /// time in the past.
    #[test]
    fn inspect_shows_a_live_owners_claim_as_not_lapsed() {
        let store = store(10);
        let lease = Duration::from_millis(50);
        let RawClaim::Owner { liveness, .. } = store
            .claim(key(1), FINGERPRINT, lease, ClaimMode::Any)
            .unwrap()
        else {
            panic!("expected owner");
        };
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
            4 * StoredResponse::new(http::StatusCode::OK, &http::HeaderMap::new(), b"ok",).cost()
        );
    }
}
