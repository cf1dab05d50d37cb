//! An owner's settlement on the memory store: fenced by its token, the claim's record is
//! replaced by the outcome (or removed), which wakes its waiters as the record's channel
//! closes. An answer that finds no room is kept as "executed, answer not stored"; a
//! failure that finds none (it never evicts a live record) is shared without its answer.

use std::sync::atomic::Ordering;

use super::limits::{Reclaim, Room};
use super::record::{Entry, Outcome, SettledRecord, Ticks};
use super::shard::Shard;
use super::tags::Tags;
use super::{MemoryStore, SWEEP_PER_WRITE};
use crate::store::response::ENTRY_OVERHEAD;
use crate::store::{token_left, FailureKept, Ownership, RouteTag, Settled, Settlement};

impl MemoryStore {
    /// See [`Store::settle`](crate::store::Store::settle).
    pub fn settle(&self, owned: &Ownership, settlement: Settlement) -> Settled {
        let Ownership {
            key,
            token,
            fingerprint,
            ..
        } = *owned;
        let index = self.shard_index(&key);
        // Whether room may still be made waiting for shards other writes hold: an answer
        // may take unspent tokens' room in either mode, and live records' with `evict`.
        let mut evict = true;
        let (mut shard, ticks, route, tags, written) = loop {
            let mut shard = self.shard(&key);
            let (_, ticks) = self.now();
            let found = shard.map.get(&key);
            // What the claim's record holds, freed once the answer replaces it.
            let own = found.map_or(0, Entry::cost);
            let (route, tags, written) = match found {
                Some(Entry::InFlight(record)) if record.token == token => {
                    (record.route, record.tags, Settled::Written)
                }
                // A late outcome of a claim held as unknown: the owner was alive after all.
                Some(Entry::Settled(record))
                    if record.token == token && matches!(record.outcome, Outcome::Unknown) =>
                {
                    (record.route, record.tags, Settled::Written)
                }
                Some(entry) if !entry.is_expired(ticks) => return Settled::NotWritten,
                // Gone (purged): nothing to free, but what says the request ran goes back.
                _ if !settlement.writes_back() => {
                    shard.remove(&key, &self.totals);
                    return Settled::Written;
                }
                _ => (RouteTag::default(), Tags::default(), Settled::WrittenBack),
            };
            // An answer the store may evict for, which needs room in shards other writes
            // hold: room is made holding no shard (see `claim`) while the claim's record
            // stays, so its duplicates keep waiting; then the settlement starts over, made
            // afresh (its key may have changed). Once no room was found that way, the
            // answer takes what room there is, as before.
            let answer = match &settlement {
                Settlement::Done { response, ttl } if !ttl.is_zero() => response.cost(),
                _ => 0,
            };
            if !evict
                || answer == 0
                || self
                    .over_share(tags, (0, answer), Some((tags, (1, own))))
                    .is_some()
                || self.room_for_answer(&mut shard, index, ticks, answer, own) != Room::Busy
            {
                break (shard, ticks, route, tags, written);
            }
            drop(shard);
            evict = self.room_for_answer_waiting(index, ticks, answer, own);
        };
        // Removed (its waiters wake as the record's channel closes) before the new record
        // asks for room, so the claim's own bytes count as free. What observe mode saw of
        // the claim goes to its outcome, and with the claim if none follows.
        let seen = shard.remove_for_outcome(&key, &self.totals);
        let record =
            |outcome| SettledRecord::now(outcome, token, fingerprint, route, tags).into_entry();
        let issued = |ttl| (Entry::Issued { expires_at: 0 }, ttl, ENTRY_OVERHEAD);
        let (next, settled) = match settlement {
            Settlement::Release { reissue } => {
                let back =
                    token_left(reissue).filter(|_| self.token_back(&mut shard, index, ticks));
                (back.map(issued), written)
            }
            Settlement::Done { ttl, .. } if ttl.is_zero() => (None, written),
            Settlement::Done { response, ttl } => {
                let cost = response.cost();
                let fits = self.over_share(tags, (0, cost), None).is_none()
                    && self.room_for_bytes(
                        &mut shard,
                        index,
                        ticks,
                        cost,
                        self.limits.when_full.into(),
                    );
                if fits {
                    let response = response.with_fingerprint(fingerprint);
                    let entry = Entry::Done {
                        response,
                        expires_at: 0,
                        route,
                        tags,
                    };
                    (Some((entry, ttl, cost)), written)
                } else {
                    // The claim's own slot is free again, so this small record has room.
                    let status = response.status();
                    let (entry, cost) = record(Outcome::NotStored { status });
                    (Some((entry, ttl, cost)), Settled::AnswerNotKept)
                }
            }
            Settlement::NotStored { status, ttl } => {
                let (entry, cost) = record(Outcome::NotStored { status });
                (Some((entry, ttl, cost)), written)
            }
            Settlement::Unknown { ttl } => {
                let (entry, cost) = record(Outcome::Unknown);
                (Some((entry, ttl, cost)), written)
            }
            Settlement::Failed {
                response,
                linger,
                reissue,
            } => {
                // A token handed back with the failure is one more unspent token.
                let reissue =
                    token_left(reissue).filter(|_| self.token_back(&mut shard, index, ticks));
                let cost = response.cost();
                match FailureKept::of(linger, reissue) {
                    FailureKept::Token { ttl } => (Some(issued(ttl)), written),
                    // Shared for a few seconds: never at the cost of a live record.
                    FailureKept::Record { ttl, issued: back }
                        if self.room_for_bytes(
                            &mut shard,
                            index,
                            ticks,
                            cost,
                            Reclaim::Expired,
                        ) =>
                    {
                        let (entry, cost) = record(Outcome::Failed {
                            response,
                            issued: back,
                        });
                        (Some((entry, ttl, cost)), written)
                    }
                    // No room to share the failure: waiters are told their owner failed,
                    // without its answer; a one-time token (room made above) still goes back.
                    FailureKept::Record { .. } => (reissue.map(issued), written),
                }
            }
        };
        if let Some((entry, ttl, cost)) = next.filter(|(_, ttl, _)| !ttl.is_zero()) {
            shard.put(key, entry, ticks, ttl, cost, &self.totals);
            shard.keep_seen(key, seen);
            shard.sweep(ticks, SWEEP_PER_WRITE, &self.totals);
        }
        settled
    }

    /// Whether a one-time token may be handed back (its attempt failed unsent), on its
    /// own or in its failure's record: one more unspent token, so within their share, made
    /// room for by expiry alone, as one issued ([`MemoryStore::issue`]). Without room it is
    /// not handed back and counted as a refused issuance: its holder's retry hears
    /// `token-invalid` and asks for another, nothing having run. Shards other writes hold
    /// are not waited for (the claim's record is gone already): only a store at the
    /// tokens' bound meets this.
    fn token_back(&self, shard: &mut Shard, index: usize, now: Ticks) -> bool {
        if self.room_for_token(shard, index, now) == Room::Fits {
            return true;
        }
        self.tokens_refused.fetch_add(1, Ordering::Relaxed);
        false
    }
}
