//! The memory store's bounds ([`MemoryLimits`]) and how it stays within them: expired
//! records are swept first, then unspent one-time tokens closest to expiry are evicted,
//! then, with `when_full: evict`, the live records closest to expiry, each counted by route
//! and logged at most once in a while; with `when_full: reject` the write is refused
//! instead. Issuing a token makes room by expiry alone and within the tokens' own budget
//! (`token_share`): anyone may ask for one, so a token never costs another record. A
//! caller's share (`caller_share`) and a client address's (`address_share`) are checked
//! here too.

use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, TryLockError};

use super::record::Ticks;
use super::shard::{Evictable, Shard};
use super::tags::Tags;
use super::totals::{Holders, Totals};
use super::MemoryStore;
use crate::store::response::ENTRY_OVERHEAD;
use crate::store::{RouteTag, StoreError};
use crate::sync::lock;

/// A shard's lock if no other thread holds it. A poisoned one is taken, as [`lock`] does:
/// passing it over would leave its records out of every other shard's room.
fn try_lock(shard: &Mutex<Shard>) -> Option<MutexGuard<'_, Shard>> {
    match shard.try_lock() {
        Ok(guard) => Some(guard),
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

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
    /// The most of `max_entries` and of `max_bytes`, in percent, that the records of one
    /// client address may hold, whatever callers it names; 100: no limit per address.
    pub address_share: u8,
    /// The most of `max_entries` and of `max_bytes`, in percent, that unspent one-time
    /// tokens may hold: whoever asks gets one, so without a budget of their own they
    /// would crowd out claims and answers.
    pub token_share: u8,
}

impl Default for MemoryLimits {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            max_bytes: 256 << 20,
            when_full: WhenFull::Evict,
            caller_share: 100,
            address_share: 100,
            token_share: 10,
        }
    }
}

impl MemoryLimits {
    /// Whether records are counted per caller (a share below 100%).
    pub fn counts_callers(&self) -> bool {
        self.caller_share < 100
    }

    /// Whether records are counted per client address (a share below 100%).
    pub fn counts_addresses(&self) -> bool {
        self.address_share < 100
    }

    /// The most unspent tokens held at once: `token_share` of `max_entries`, and of
    /// `max_bytes` at a token's cost; at least one.
    pub fn max_tokens(&self) -> usize {
        let share = usize::from(self.token_share);
        let by_entries = self.max_entries.saturating_mul(share) / 100;
        let by_bytes = self.max_bytes / 100 * share / ENTRY_OVERHEAD;
        by_entries.min(by_bytes).max(1)
    }
}

/// What making room may take, beyond expired records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Reclaim {
    /// Nothing live: an issued token (whose room nobody may pay for), a failure shared for
    /// a few seconds.
    Expired,
    /// Unspent tokens too, never another record: `when_full: reject`. A lost token costs
    /// its holder a new one, never a run.
    Tokens,
    /// Unspent tokens, then any record but a claim in flight: `when_full: evict`.
    Live,
}

impl From<WhenFull> for Reclaim {
    fn from(when_full: WhenFull) -> Self {
        match when_full {
            WhenFull::Evict => Self::Live,
            WhenFull::Reject => Self::Tokens,
        }
    }
}

/// At most one eviction warning per this many milliseconds.
const EVICTION_LOG_EVERY_MS: u64 = 10_000;

/// Whether a new record fits, after making room while holding the writer's own shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Room {
    /// It fits: there was room, or room was made.
    Fits,
    /// It does not, and nothing more may go: every record left is in flight (with
    /// `when_full: reject`, live).
    Full,
    /// Not yet: shards another thread held the lock of were passed over. The writer lets
    /// go of its own shard, calls [`MemoryStore::make_room_waiting`] and starts over.
    Busy,
}

impl MemoryStore {
    /// Whether the store is over a bound with one more record of [`ENTRY_OVERHEAD`] bytes.
    fn over_for_entry(&self) -> impl Fn(&Totals) -> bool {
        let limits = self.limits;
        move |t| {
            t.entries.load(Ordering::Relaxed) >= limits.max_entries
                || t.bytes.load(Ordering::Relaxed) + ENTRY_OVERHEAD > limits.max_bytes
        }
    }

    /// Whether the store is over a bound, or unspent tokens over their budget, with one
    /// more token.
    fn over_for_token(&self) -> impl Fn(&Totals) -> bool {
        let over = self.over_for_entry();
        let most = self.limits.max_tokens();
        move |t| over(t) || t.issued.load(Ordering::Relaxed) >= most
    }

    /// Makes room for one more claim while holding the writer's shard.
    pub(super) fn room_for_entry(&self, own: &mut Shard, own_index: usize, now: Ticks) -> Room {
        let over = self.over_for_entry();
        self.make_room(own, own_index, now, self.limits.when_full.into(), over)
    }

    /// After [`Room::Busy`]: makes room for one more claim, holding no shard; whether there
    /// is room now.
    pub(super) fn room_for_entry_waiting(&self, own_index: usize, now: Ticks) -> bool {
        let over = self.over_for_entry();
        self.make_room_waiting(own_index, now, self.limits.when_full.into(), over)
    }

    /// Makes room for one more unspent token, within the bounds and the tokens' budget, by
    /// sweeping expired records only, while holding the writer's shard.
    pub(super) fn room_for_token(&self, own: &mut Shard, own_index: usize, now: Ticks) -> Room {
        let over = self.over_for_token();
        self.make_room(own, own_index, now, Reclaim::Expired, over)
    }

    /// After [`Room::Busy`]: [`MemoryStore::room_for_token`] holding no shard; whether
    /// there is room now.
    pub(super) fn room_for_token_waiting(&self, own_index: usize, now: Ticks) -> bool {
        let over = self.over_for_token();
        self.make_room_waiting(own_index, now, Reclaim::Expired, over)
    }

    /// Makes room for `cost` more bytes (an answer replacing its claim's slot); whether
    /// there is. `reclaim` says what live records may go for it: an answer to replay is
    /// worth the store's own choice (`when_full`); a failure shared for a few seconds is
    /// never worth a live record, so it asks with [`Reclaim::Expired`].
    pub(super) fn room_for_bytes(
        &self,
        own: &mut Shard,
        own_index: usize,
        now: Ticks,
        cost: usize,
        reclaim: Reclaim,
    ) -> bool {
        let max = self.limits.max_bytes;
        cost <= max
            && self.make_room(own, own_index, now, reclaim, |t| {
                t.bytes.load(Ordering::Relaxed) + cost > max
            }) == Room::Fits
    }

    /// Makes room for an answer of `cost` bytes that is to replace its claim's record of
    /// `own` bytes, while that record (and the writer's shard) is still held.
    pub(super) fn room_for_answer(
        &self,
        shard: &mut Shard,
        own_index: usize,
        now: Ticks,
        cost: usize,
        own: usize,
    ) -> Room {
        let max = self.limits.max_bytes;
        if cost > max {
            return Room::Full;
        }
        self.make_room(
            shard,
            own_index,
            now,
            self.limits.when_full.into(),
            move |t| t.bytes.load(Ordering::Relaxed).saturating_sub(own) + cost > max,
        )
    }

    /// After [`Room::Busy`]: [`MemoryStore::room_for_answer`] holding no shard; whether
    /// there is room now.
    pub(super) fn room_for_answer_waiting(
        &self,
        own_index: usize,
        now: Ticks,
        cost: usize,
        own: usize,
    ) -> bool {
        let max = self.limits.max_bytes;
        self.make_room_waiting(own_index, now, self.limits.when_full.into(), move |t| {
            t.bytes.load(Ordering::Relaxed).saturating_sub(own) + cost > max
        })
    }

    /// Frees room until `over` is false: expired records first, in the caller's shard (its
    /// lock is held) and every other shard it can lock without waiting (never blocking on
    /// a second lock while holding one, so no lock-order deadlock); then, as `reclaim`
    /// allows, unspent tokens closest to expiry, then live records closest to expiry, each
    /// counted. Shards passed over because another thread held them make the answer
    /// [`Room::Busy`], not [`Room::Full`]: what they hold may still go. No record but a
    /// token goes while a shard passed over may still hold a token.
    fn make_room(
        &self,
        own: &mut Shard,
        own_index: usize,
        now: Ticks,
        reclaim: Reclaim,
        over: impl Fn(&Totals) -> bool,
    ) -> Room {
        if !over(&self.totals) {
            return Room::Fits;
        }
        let totals = &self.totals;
        let mut busy = false;
        own.sweep(now, usize::MAX, totals);
        for (i, other) in self.shards.iter().enumerate() {
            if !over(totals) {
                return Room::Fits;
            }
            if i != own_index {
                match try_lock(other) {
                    Some(mut other) => other.sweep(now, usize::MAX, totals),
                    None => busy = true,
                }
            }
        }
        let tokens = reclaim >= Reclaim::Tokens && totals.issued.load(Ordering::Relaxed) > 0;
        for which in [Evictable::Tokens, Evictable::Any] {
            let allowed = match which {
                Evictable::Tokens => tokens,
                // Tokens in a shard passed over go first: the writer waits for it.
                Evictable::Any => reclaim == Reclaim::Live && !(busy && tokens),
            };
            if !allowed || !over(totals) {
                continue;
            }
            self.evict_while(own, now, which, &over);
            for (i, other) in self.shards.iter().enumerate() {
                if !over(totals) {
                    break;
                }
                if i != own_index {
                    match try_lock(other) {
                        Some(mut other) => self.evict_while(&mut other, now, which, &over),
                        None => busy = true,
                    }
                }
            }
        }
        match (over(totals), busy) {
            (false, _) => Room::Fits,
            (true, false) => Room::Full,
            (true, true) => Room::Busy,
        }
    }

    /// [`MemoryStore::make_room`] for a writer that holds no shard (it let go of its own
    /// after [`Room::Busy`]): it waits for each shard's lock in turn, holding one at a
    /// time, so it cannot deadlock with another writer; its own shard goes first, as
    /// there. Whether there is room now; the writer starts over, since its key may have
    /// changed meanwhile.
    fn make_room_waiting(
        &self,
        own_index: usize,
        now: Ticks,
        reclaim: Reclaim,
        over: impl Fn(&Totals) -> bool,
    ) -> bool {
        let totals = &self.totals;
        let count = self.shards.len();
        let order = (0..count).map(|i| (own_index + i) % count);
        for i in order.clone() {
            if !over(totals) {
                return true;
            }
            self.wait_for(i).sweep(now, usize::MAX, totals);
        }
        let passes = [Evictable::Tokens, Evictable::Any];
        let allowed = |which: &Evictable| match which {
            Evictable::Tokens => reclaim >= Reclaim::Tokens,
            Evictable::Any => reclaim == Reclaim::Live,
        };
        for which in passes.into_iter().filter(allowed) {
            for i in order.clone() {
                if !over(totals) {
                    return true;
                }
                self.evict_while(&mut self.wait_for(i), now, which, &over);
            }
        }
        !over(totals)
    }

    /// Evicts live records of `which` from `shard`, closest to expiry first, each counted,
    /// while `over`.
    fn evict_while(
        &self,
        shard: &mut Shard,
        now: Ticks,
        which: Evictable,
        over: &impl Fn(&Totals) -> bool,
    ) {
        while over(&self.totals) {
            match shard.evict_one(which, &self.totals) {
                Some(route) => self.count_eviction(route, now, which),
                None => break,
            }
        }
    }

    /// The lock of shard `index`, waited for if another thread holds it.
    fn wait_for(&self, index: usize) -> MutexGuard<'_, Shard> {
        let shard = &self.shards[index];
        try_lock(shard).unwrap_or_else(|| {
            #[cfg(test)]
            self.shard_waits.fetch_add(1, Ordering::SeqCst);
            lock(shard)
        })
    }

    fn count_eviction(&self, route: RouteTag, now: Ticks, which: Evictable) {
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
            if which == Evictable::Tokens {
                tracing::warn!(
                    evicted_so_far = total,
                    max_entries = self.limits.max_entries,
                    "memory store full: evicting unspent one-time tokens (their holders get \
                     400 token-invalid and ask again); raise max_entries/max_bytes"
                );
                return;
            }
            tracing::warn!(
                evicted_so_far = total,
                max_entries = self.limits.max_entries,
                max_bytes = self.limits.max_bytes,
                "memory store full: evicting live records (their repeats would execute again); \
                 raise max_entries/max_bytes, or set when_full: reject"
            );
        }
    }

    /// Which share, if any, the records of `tags` adding `added` (records, bytes) would
    /// exceed: [`StoreError::CallerFull`] for their caller's, [`StoreError::AddressFull`]
    /// for their address's. `replaced` (its tags, and the records and bytes it frees) is
    /// a record the new one takes the place of: freed for whichever holder it shares.
    pub(super) fn over_share(
        &self,
        tags: Tags,
        added: (usize, usize),
        replaced: Option<(Tags, (usize, usize))>,
    ) -> Option<StoreError> {
        let layout = self.totals.layout;
        let theirs = replaced.map(|(theirs, _)| theirs);
        let freed = |same: bool| match replaced {
            Some((_, freed)) if same => freed,
            _ => (0, 0),
        };
        let caller = layout.caller(tags);
        let by_caller = freed(theirs.map(|t| layout.caller(t)) == Some(caller));
        if self.over(
            &self.totals.callers,
            caller.0,
            self.limits.caller_share,
            added,
            by_caller,
        ) {
            return Some(StoreError::CallerFull);
        }
        let address = layout.address(tags);
        let by_address = freed(theirs.map(|t| layout.address(t)) == Some(address));
        let share = self.limits.address_share;
        if self.over(&self.totals.addresses, address.0, share, added, by_address) {
            return Some(StoreError::AddressFull);
        }
        None
    }

    /// Whether the holder tagged `tag` (0: not counted) adding `added` while `freed` of its
    /// own go would hold more than `share` percent of the store.
    fn over(
        &self,
        holders: &Holders,
        tag: u32,
        share: u8,
        added: (usize, usize),
        freed: (usize, usize),
    ) -> bool {
        if tag == 0 {
            return false;
        }
        let share = usize::from(share);
        let (held, held_bytes) = holders.held(tag);
        (held + added.0).saturating_sub(freed.0) > (self.limits.max_entries * share / 100).max(1)
            || (held_bytes + added.1).saturating_sub(freed.1) > self.limits.max_bytes / 100 * share
    }
}
