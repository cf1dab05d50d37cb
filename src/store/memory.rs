//! The embedded store: sharded maps under short mutexes, bounded by entry count and bytes,
//! expiring by TTL. In-flight claims are never evicted. When a bound is reached, expired
//! records go first, then unspent one-time tokens (earliest expiry first, counted); any
//! other live record is evicted (earliest expiry first) only with `when_full: evict`, and
//! every such eviction is counted by route and logged, since it drops a promise;
//! `when_full: reject` answers 503 instead. Anyone may ask for a token, so issuing one
//! never evicts anything live: unspent tokens hold at most `token_share` of the store, and
//! an issuance finding no room is refused (503, counted). The bounds are totals over all
//! shards (kept in atomics), so one large answer can use the whole byte budget.
//!
//! Every byte of a record is paid for by every key in a full store, so the layout is chosen for
//! size: a done record is a 32-byte map value (an in-flight claim, of which there are only as
//! many as requests running, is boxed, as are the rare settled records), and the expiry index
//! is one FIFO per TTL (see `shard`).
//!
//! This file holds the store itself (its shards, clock and the small operations); each larger
//! job has its own file: `claim` (what a claim finds and takes), `settle` (how an owner's
//! outcome is written), `inspect` (the admin API's view and observe mode's count), `limits`
//! (the bounds, and making room by expiry or eviction), `rate` (the rate-limit counters,
//! at most `max_entries` beside the records), `record` (one key's record), `shard` (one
//! shard's map and expiry index), `tags` (whose a record is, for the caller's and the
//! address's shares) and `totals` (what all shards hold, in all, by caller and by address).

mod claim;
mod inspect;
mod limits;
mod rate;
mod record;
mod settle;
mod shard;
mod tags;
mod totals;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use super::report::StoreStats;
use super::response::ENTRY_OVERHEAD;
use super::{Purged, Revision, RouteTag, StoreError};
use crate::key::Digest;
use crate::sync::lock;
use rate::Counters;
use record::{Entry, Ticks};
use shard::Shard;
use totals::Totals;

use limits::Room;
pub use limits::{MemoryLimits, WhenFull};

/// The in-process store.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// Expiry times are kept as nanoseconds since this instant: 8 bytes instead of 16.
    epoch: Instant,
    limits: MemoryLimits,
    totals: Totals,
    /// Fixed-window counters for rate limits, at most `max_entries` (see `rate`).
    counters: Mutex<Counters>,
    /// Live records evicted, by route (unspent tokens under the default tag).
    evictions: Mutex<BTreeMap<RouteTag, u64>>,
    /// Token issuances refused for want of room.
    tokens_refused: AtomicU64,
    /// When an eviction was last logged (ms since `epoch`), so a full store logs once in a
    /// while, not once per request.
    eviction_logged: AtomicU64,
    /// How often a write waited for a shard whose lock another thread held, so a test
    /// holding that lock knows when to let go of it.
    #[cfg(test)]
    shard_waits: std::sync::atomic::AtomicUsize,
}

/// Below this many entries per shard, sharding buys nothing: eviction would mostly reach
/// into other shards.
const MIN_ENTRIES_PER_SHARD: usize = 1024;
/// A shard's table grows by doubling, rehashed at once under its lock in the proxy's
/// thread: the more shards, the shorter each pause, but each costs memory per key
/// (`benches/load/growth.sh` measures both).
const MAX_SHARDS: usize = 64;
/// Expired records swept per write, so expiry costs O(1) amortized and needs no timer.
const SWEEP_PER_WRITE: usize = 4;

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
            totals: Totals::new(&limits),
            counters: Mutex::default(),
            evictions: Mutex::default(),
            tokens_refused: AtomicU64::new(0),
            eviction_logged: AtomicU64::new(0),
            #[cfg(test)]
            shard_waits: Default::default(),
        }
    }

    /// The bounds it was made with.
    pub fn limits(&self) -> MemoryLimits {
        self.limits
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

    /// `ticks` as wall-clock time, relative to `now` (`wall` being `now` on the wall clock).
    fn wall(&self, ticks: Ticks, now: Instant, wall: SystemTime) -> SystemTime {
        let at = self.instant(ticks);
        match at.checked_duration_since(now) {
            Some(ahead) => wall + ahead,
            None => wall
                .checked_sub(now.saturating_duration_since(at))
                .unwrap_or(wall),
        }
    }

    fn shard_index(&self, key: &Digest) -> usize {
        key.0[31] as usize & (self.shards.len() - 1)
    }

    fn shard(&self, key: &Digest) -> MutexGuard<'_, Shard> {
        // A poisoned shard only means another thread panicked mid-operation; every
        // operation leaves the shard consistent before it can panic, so keep serving.
        lock(&self.shards[self.shard_index(key)])
    }

    /// Token issuances refused since start (see [`super::Store::token_refused`]).
    pub(crate) fn tokens_refused(&self) -> &AtomicU64 {
        &self.tokens_refused
    }

    /// See [`super::Store::issue`]. Within the bounds and the tokens' budget
    /// ([`MemoryLimits::max_tokens`]), making room by expiry alone: a token is never worth
    /// a live record, another token included. Refused ([`StoreError::Full`], counted)
    /// otherwise.
    pub fn issue(&self, key: Digest, ttl: Duration) -> Result<(), StoreError> {
        let index = self.shard_index(&key);
        let refused = || {
            self.tokens_refused.fetch_add(1, Ordering::Relaxed);
            Err(StoreError::Full)
        };
        let (mut shard, now) = loop {
            let mut shard = self.shard(&key);
            let (_, now) = self.now();
            shard.remove(&key, &self.totals);
            match self.room_for_token(&mut shard, index, now) {
                Room::Fits => break (shard, now),
                Room::Full => return refused(),
                // Room is made holding no shard (see `claim`), then the token is issued
                // under its shard's lock.
                Room::Busy => {
                    drop(shard);
                    if !self.room_for_token_waiting(index, now) {
                        return refused();
                    }
                }
            }
        };
        shard.put(
            key,
            Entry::Issued { expires_at: 0 },
            now,
            ttl,
            ENTRY_OVERHEAD,
            &self.totals,
        );
        Ok(())
    }

    /// See [`super::Store::hit`]. A caller without a counter while `max_entries` run is
    /// not counted and gets a count over any rate (a 429 for the token endpoint).
    pub fn hit(&self, key: Digest, window: Duration) -> u64 {
        let (_, now) = self.now();
        lock(&self.counters).hit(key, now, window, self.limits.max_entries)
    }

    /// See [`super::Store::purge`]: decided and done under the shard's lock.
    pub fn purge(&self, key: Digest, only: Option<Revision>) -> Purged {
        let (now, ticks) = self.now();
        let mut shard = self.shard(&key);
        match shard.map.get(&key) {
            None => return Purged::Absent,
            Some(entry) if entry.is_expired(ticks) => return Purged::Absent,
            Some(Entry::InFlight(record)) if record.stands(now) => return Purged::InFlight,
            Some(entry) if only.is_some_and(|r| r != inspect::revision(entry, now)) => {
                return Purged::Changed
            }
            Some(_) => {}
        }
        // Its waiters, if any, wake as the record's channel closes.
        shard.remove(&key, &self.totals);
        Purged::Removed
    }

    /// See [`super::Store::forget`].
    pub fn forget(&self, key: Digest) -> bool {
        let (_, ticks) = self.now();
        let mut shard = self.shard(&key);
        let live = shard.map.get(&key).is_some_and(|e| !e.is_expired(ticks));
        shard.remove(&key, &self.totals) && live
    }

    /// Current gauges, summed over shards.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            entries: self.totals.entries.load(Ordering::Relaxed),
            in_flight: self.shards.iter().map(|s| lock(s).in_flight).sum(),
            bytes: self.totals.bytes.load(Ordering::Relaxed),
            evictions: lock(&self.evictions)
                .iter()
                .map(|(route, n)| (*route, *n))
                .collect(),
            tokens_refused: self.tokens_refused.load(Ordering::Relaxed),
            ..StoreStats::default()
        }
    }
}

#[cfg(test)]
mod share_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod token_tests;
