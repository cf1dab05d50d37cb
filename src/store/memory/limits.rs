//! The memory store's bounds ([`MemoryLimits`]) and how it stays within them: expired
//! records are swept first, then, with `when_full: evict`, the live records closest to
//! expiry are evicted, each counted by route and logged at most once in a while; with
//! `when_full: reject` the write is refused instead. A caller's share (`caller_share`) is
//! checked here too.

use std::sync::atomic::Ordering;

use super::record::Ticks;
use super::shard::Shard;
use super::totals::Totals;
use super::MemoryStore;
use crate::store::response::ENTRY_OVERHEAD;
use crate::store::{CallerTag, RouteTag};
use crate::sync::lock;

/// What the memory store does when a bound is reached and no expired record is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenFull {
    /// Evict the live record closest to expiry (counted and logged).
    #[default]
    Evict,
    /// Refuse the new claim (503); an answer that finds no room is recorded as "executed,
    /// answer not stored".
    Reject,
}

impl WhenFull {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Evict => "evict",
            Self::Reject => "reject",
        }
    }
}

/// Bounds of the memory store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Most records held (in flight and done).
    pub max_entries: usize,
    /// Most bytes of records (bodies, headers and a fixed overhead each).
    pub max_bytes: usize,
    /// What a full store does.
    pub when_full: WhenFull,
    /// The most of `max_entries` and of `max_bytes`, in percent, that the records of one
    /// caller (one scope) may hold; 100: no limit per caller.
    pub caller_share: u8,
}

impl Default for MemoryLimits {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            max_bytes: 256 << 20,
            when_full: WhenFull::Evict,
            caller_share: 100,
        }
    }
}

impl MemoryLimits {
    /// Whether records are counted per caller (a share below 100%).
    pub fn counts_callers(&self) -> bool {
        self.caller_share < 100
    }
}

/// At most one eviction warning per this many milliseconds.
const EVICTION_LOG_EVERY_MS: u64 = 10_000;

impl MemoryStore {
    /// Makes room for one more record of [`ENTRY_OVERHEAD`] bytes (a claim, an issued
    /// token); whether there is.
    pub(super) fn room_for_entry(&self, own: &mut Shard, own_index: usize, now: Ticks) -> bool {
        let limits = self.limits;
        self.make_room(own, own_index, now, self.limits.when_full, |t| {
            t.entries.load(Ordering::Relaxed) >= limits.max_entries
                || t.bytes.load(Ordering::Relaxed) + ENTRY_OVERHEAD > limits.max_bytes
        })
    }

    /// Makes room for `cost` more bytes (an answer replacing its claim's slot); whether
    /// there is. `when_full` says whether live records may go for it: an answer to replay
    /// is worth the store's own choice; a failure shared for a few seconds is never worth
    /// a live record (whose repeats would run again), so it asks with `Reject`.
    pub(super) fn room_for_bytes(
        &self,
        own: &mut Shard,
        own_index: usize,
        now: Ticks,
        cost: usize,
        when_full: WhenFull,
    ) -> bool {
        let max = self.limits.max_bytes;
        cost <= max
            && self.make_room(own, own_index, now, when_full, |t| {
                t.bytes.load(Ordering::Relaxed) + cost > max
            })
    }

    /// Frees room until `over` is false: expired records first, in the caller's shard (its
    /// lock is held) and every other shard it can lock without waiting (never blocking on
    /// a second lock, so no lock-order deadlock); then, with `when_full: evict`, live
    /// records closest to expiry, each counted. Returns whether `over` is false.
    fn make_room(
        &self,
        own: &mut Shard,
        own_index: usize,
        now: Ticks,
        when_full: WhenFull,
        over: impl Fn(&Totals) -> bool,
    ) -> bool {
        if !over(&self.totals) {
            return true;
        }
        let totals = &self.totals;
        own.sweep(now, usize::MAX, totals);
        for (i, other) in self.shards.iter().enumerate() {
            if !over(totals) {
                return true;
            }
            if i != own_index {
                if let Ok(mut other) = other.try_lock() {
                    other.sweep(now, usize::MAX, totals);
                }
            }
        }
        if !over(totals) {
            return true;
        }
        if when_full == WhenFull::Reject {
            return false;
        }
        while over(totals) {
            match own.evict_one(totals) {
                Some(route) => self.count_eviction(route, now),
                None => break,
            }
        }
        for (i, other) in self.shards.iter().enumerate() {
            if !over(totals) {
                return true;
            }
            if i == own_index {
                continue;
            }
            if let Ok(mut other) = other.try_lock() {
                while over(totals) {
                    match other.evict_one(totals) {
                        Some(route) => self.count_eviction(route, now),
                        None => break,
                    }
                }
            }
        }
        !over(totals)
    }

    fn count_eviction(&self, route: RouteTag, now: Ticks) {
        let total = {
            let mut evictions = lock(&self.evictions);
            let count = evictions.entry(route).or_default();
            *count += 1;
            evictions.values().sum::<u64>()
        };
        let now_ms = now / 1_000_000;
        let last = self.eviction_logged.load(Ordering::Relaxed);
        if (last == 0 || now_ms >= last + EVICTION_LOG_EVERY_MS)
            && self
                .eviction_logged
                .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                evicted_so_far = total,
                max_entries = self.limits.max_entries,
                max_bytes = self.limits.max_bytes,
                "memory store full: evicting live records (their repeats would execute again); \
                 raise max_entries/max_bytes, or set when_full: reject"
            );
        }
    }

    /// Whether `caller` adding `added` (records, bytes) while `freed` (records, bytes) of
    /// its own go would hold more than its share of the store.
    pub(super) fn over_caller_share(
        &self,
        caller: CallerTag,
        added: (usize, usize),
        freed: (usize, usize),
    ) -> bool {
        if caller == CallerTag::NONE || !self.limits.counts_callers() {
            return false;
        }
        let share = usize::from(self.limits.caller_share);
        let (held, held_bytes) = self.totals.callers.held(caller);
        (held + added.0).saturating_sub(freed.0) > (self.limits.max_entries * share / 100).max(1)
            || (held_bytes + added.1).saturating_sub(freed.1) > self.limits.max_bytes / 100 * share
    }
}
