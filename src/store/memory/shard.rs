//! One shard of the memory store: its records and their expiry index.
//!
//! The expiry index is one FIFO per TTL: records written with the same TTL expire in the
//! order they were written, so each queue is sorted by construction, 40 bytes an entry
//! instead of an ordered tree's node overhead. Queue entries are not removed with their
//! record: one whose record is gone or has another expiry is stale, skipped when it
//! reaches the front, and dropped in bulk by [`Shard::compact`] before stale entries can
//! outnumber live ones.
//!
//! Unspent one-time tokens (issued, or handed back with a failure: [`Entry::holds_token`])
//! have queues of their own, so a store making room finds them before any other record that
//! holds a claim or an answer: anyone may ask for a token, and losing an unspent one costs
//! its holder a new token, never a run. Unspent tokens share one queue whatever their span,
//! kept in expiry order: a token handed back keeps what was left of the expiry it was
//! issued with, exactly, so its entry goes where that expiry falls. A queue goes once
//! emptied, so the number of queues stays that of the TTLs in use.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use super::record::{Entry, Ticks};
use super::totals::Totals;
use crate::key::{Digest, DigestMap};
use crate::store::RouteTag;

/// One shard: its records, their expiry index, and how often observe mode saw its keys.
#[derive(Debug, Default)]
pub(super) struct Shard {
    pub map: DigestMap<Entry>,
    /// Records other than claims in flight, by expiry, for sweeping and for choosing what
    /// to evict.
    queues: Vec<ExpiryQueue>,
    /// Entries over all queues, stale ones included.
    queued: usize,
    pub in_flight: usize,
    /// Keys seen more than once on routes in observe mode: how often, and when last.
    /// Empty (and never looked at) unless such a route saw a duplicate.
    pub seen: DigestMap<Seen>,
}

/// How often observe mode saw a key, and when last.
pub(super) type Seen = (u64, SystemTime);

/// Records written with one TTL, oldest first, or unspent tokens of any span: either way
/// their expiry times ascend.
#[derive(Debug)]
struct ExpiryQueue {
    /// The TTL of its records (of the first token, for the tokens' queue: not compared).
    ttl: Duration,
    /// Whether it holds unspent tokens ([`Entry::holds_token`]) rather than other records.
    tokens: bool,
    entries: VecDeque<(Ticks, Digest)>,
}

/// Which records [`Shard::evict_one`] may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Evictable {
    /// Unspent tokens only.
    Tokens,
    /// Any record but a claim in flight.
    Any,
}

/// Stale expiry-queue entries a shard tolerates beyond its live ones before compacting.
const COMPACT_SLACK: usize = 1024;

/// Whether the queue entry `(at, key)` stands for a record in `map` (else it is stale).
fn is_live(map: &DigestMap<Entry>, at: Ticks, key: &Digest) -> bool {
    map.get(key).and_then(Entry::expires_at) == Some(at)
}

impl Shard {
    /// Inserts a claim in flight, charged `cost` bytes (the slot it reserves).
    pub fn insert(&mut self, key: Digest, entry: Entry, cost: usize, totals: &Totals) {
        if let Entry::InFlight(_) = entry {
            self.in_flight += 1;
        } else if entry.holds_token() {
            totals.issued.fetch_add(1, Ordering::Relaxed);
        }
        totals.add(entry.tags(), cost);
        self.map.insert(key, entry);
    }

    /// Inserts a record that expires `ttl` from `now`, indexed for expiry and charged
    /// `cost` bytes.
    pub fn put(
        &mut self,
        key: Digest,
        mut entry: Entry,
        now: Ticks,
        ttl: Duration,
        cost: usize,
        totals: &Totals,
    ) {
        let tokens = entry.holds_token();
        let expires_at = self.index(key, now, ttl, tokens);
        entry.set_expiry(expires_at);
        self.insert(key, entry, cost, totals);
    }

    /// Enters `key` in the expiry queue of `ttl` (of unspent tokens with `tokens`) and
    /// returns its expiry; the caller then inserts the record with that expiry.
    fn index(&mut self, key: Digest, now: Ticks, ttl: Duration, tokens: bool) -> Ticks {
        // Before the push: the caller inserts the record only after this returns, so a
        // compaction after it would find no record for the new entry and drop it, leaving
        // a record that is never swept nor evicted.
        if self.queued >= 2 * self.indexed() + COMPACT_SLACK {
            self.compact();
        }
        let expires_at = now.saturating_add(ttl.as_nanos().min(u128::from(u64::MAX)) as Ticks);
        let queue = match self
            .queues
            .iter()
            .position(|q| q.tokens == tokens && (tokens || q.ttl == ttl))
        {
            Some(i) => &mut self.queues[i],
            None => {
                self.queues.push(ExpiryQueue {
                    ttl,
                    tokens,
                    entries: VecDeque::new(),
                });
                self.queues.last_mut().expect("just pushed")
            }
        };
        if tokens {
            // One queue for every span: a token handed back goes back until the expiry it
            // was issued with, which may come before those of tokens issued since. Mostly
            // at the back (a token just issued expires last).
            let at = queue.entries.partition_point(|(t, _)| *t <= expires_at);
            queue.entries.insert(at, (expires_at, key));
        } else {
            queue.entries.push_back((expires_at, key));
        }
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
    /// if any, goes stale), and what observe mode saw of it: a count never outlives its
    /// record (`seen` is charged to no bound). Whether there was one.
    pub fn remove(&mut self, key: &Digest, totals: &Totals) -> bool {
        if !self.seen.is_empty() {
            self.seen.remove(key);
        }
        self.take(key, totals)
    }

    /// Removes the record at `key` to put its own outcome in its place (the same request,
    /// so the duplicates observed while it ran still count): what observe mode saw of it,
    /// for [`Shard::keep_seen`] once the outcome is in.
    pub fn remove_for_outcome(&mut self, key: &Digest, totals: &Totals) -> Option<Seen> {
        let seen = self.seen.remove(key);
        self.take(key, totals);
        seen
    }

    /// Gives the record at `key` back what observe mode saw of the record it succeeds; kept
    /// only if a record is there, so a count never outlives its record.
    pub fn keep_seen(&mut self, key: Digest, seen: Option<Seen>) {
        if let Some(seen) = seen {
            if self.map.contains_key(&key) {
                self.seen.insert(key, seen);
            }
        }
    }

    /// Removes the record at `key` alone; see [`Shard::remove`].
    fn take(&mut self, key: &Digest, totals: &Totals) -> bool {
        let Some(entry) = self.map.remove(key) else {
            return false;
        };
        if let Entry::InFlight(_) = entry {
            self.in_flight -= 1;
        } else if entry.holds_token() {
            totals.issued.fetch_sub(1, Ordering::Relaxed);
        }
        totals.remove(entry.tags(), entry.cost());
        true
    }

    /// Pops the queue entry that expires first (of the token queues only, with
    /// `tokens_only`), if it expires no later than `by`.
    fn pop_earliest(&mut self, by: Ticks, tokens_only: bool) -> Option<(Ticks, Digest)> {
        let (index, at) = self
            .queues
            .iter()
            .enumerate()
            .filter(|(_, q)| q.tokens || !tokens_only)
            .filter_map(|(i, q)| q.entries.front().map(|(at, _)| (i, *at)))
            .min_by_key(|(_, at)| *at)?;
        if at > by {
            return None;
        }
        self.queued -= 1;
        let popped = self.queues[index].entries.pop_front();
        // An emptied queue goes at once: a TTL may never come back (a handed-back token's
        // span, a route reloaded away), and every write scans the queues.
        if self.queues[index].entries.is_empty() {
            self.queues.swap_remove(index);
        }
        popped
    }

    /// Records in `map` other than claims in flight, each of which has exactly one live
    /// queue entry.
    fn indexed(&self) -> usize {
        self.map.len() - self.in_flight
    }

    /// Evicts the record of `which` closest to expiry and returns its route (an unspent
    /// token's is the default tag); `None` when there is none (every record is in flight,
    /// or, for [`Evictable::Tokens`], no token is unspent).
    pub fn evict_one(&mut self, which: Evictable, totals: &Totals) -> Option<RouteTag> {
        let tokens_only = which == Evictable::Tokens;
        while let Some((at, key)) = self.pop_earliest(Ticks::MAX, tokens_only) {
            // A token queue's entry whose key now holds a claim or an answer is stale,
            // even should that record's expiry equal the token's to the nanosecond.
            let taken = tokens_only && !self.map.get(&key).is_some_and(Entry::holds_token);
            if !taken && is_live(&self.map, at, &key) {
                // A token counts under the default tag, handed back with a failure or not.
                let route = match self.map.get(&key) {
                    Some(entry) if !tokens_only => entry.route(),
                    _ => RouteTag::default(),
                };
                self.remove(&key, totals);
                return Some(route);
            }
        }
        None
    }

    /// Removes up to `most` records that expired by `now` (stale entries count, so a
    /// write never does more than `most` steps).
    pub fn sweep(&mut self, now: Ticks, most: usize, totals: &Totals) {
        for _ in 0..most {
            let Some((at, key)) = self.pop_earliest(now, false) else {
                break;
            };
            if is_live(&self.map, at, &key) {
                self.remove(&key, totals);
            }
        }
    }

    /// How many queue entries the shard keeps, stale ones included (for tests).
    #[cfg(test)]
    pub fn queued(&self) -> (usize, usize, usize) {
        (
            self.queued,
            self.indexed(),
            self.queues.iter().map(|q| q.entries.len()).sum::<usize>(),
        )
    }

    /// How many expiry queues the shard keeps (for tests).
    #[cfg(test)]
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Whether every record but the claims in flight has a queue entry with its expiry
    /// (else it would never be swept nor evicted), and `indexed()` counts exactly those.
    #[cfg(test)]
    pub fn every_record_is_indexed(&self) -> bool {
        let mut records = 0;
        for (key, entry) in &self.map {
            let Some(at) = entry.expires_at() else {
                continue;
            };
            records += 1;
            if !self.queues.iter().any(|q| q.entries.contains(&(at, *key))) {
                return false;
            }
        }
        self.indexed() == records
    }
}

/// [`COMPACT_SLACK`], for the tests' bounds.
#[cfg(test)]
pub(super) const TEST_COMPACT_SLACK: usize = COMPACT_SLACK;
