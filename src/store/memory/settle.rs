//! An owner's settlement on the memory store: fenced by its token, the claim's record is
//! replaced by the outcome (or removed), which wakes its waiters as the record's channel
//! closes. An answer that finds no room is kept as "executed, answer not stored"; a
//! failure that finds none is shared without its answer.

use super::record::{Entry, Outcome, SettledRecord};
use super::{MemoryStore, SWEEP_PER_WRITE};
use crate::store::response::ENTRY_OVERHEAD;
use crate::store::{CallerTag, Ownership, RouteTag, Settled, Settlement};

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
        let mut shard = self.shard(&key);
        let (_, ticks) = self.now();
        let (route, caller, written) = match shard.map.get(&key) {
            Some(Entry::InFlight(record)) if record.token == token => {
                (record.route, record.caller, Settled::Written)
            }
            // A late outcome of a claim held as unknown: the owner was alive after all.
            Some(Entry::Settled(record))
                if record.token == token && matches!(record.outcome, Outcome::Unknown) =>
            {
                (record.route, record.caller, Settled::Written)
            }
            Some(entry) if !entry.is_expired(ticks) => return Settled::NotWritten,
            // Gone (purged): nothing to free, but what says the request ran goes back.
            _ if !settlement.writes_back() => {
                shard.remove(&key, &self.totals);
                return Settled::Written;
            }
            _ => (RouteTag::default(), CallerTag::NONE, Settled::WrittenBack),
        };
        // Removed (its waiters wake as the record's channel closes) before the new record
        // asks for room, so the claim's own bytes count as free.
        shard.remove(&key, &self.totals);
        let record =
            |outcome| SettledRecord::now(outcome, token, fingerprint, route, caller).into_entry();
        let (entry, ttl, cost) = match settlement {
            Settlement::Release { reissue: None } => return written,
            Settlement::Release { reissue: Some(ttl) } => {
                (Entry::Issued { expires_at: 0 }, ttl, ENTRY_OVERHEAD)
            }
            Settlement::Done { ttl, .. } if ttl.is_zero() => return written,
            Settlement::Done { response, ttl } => {
                let cost = response.cost();
                let fits = !self.over_caller_share(caller, (0, cost), (0, 0))
                    && self.room_for_bytes(&mut shard, index, ticks, cost);
                if !fits {
                    // The claim's own slot is free again, so this small record has room.
                    let status = response.status();
                    let (entry, cost) = record(Outcome::NotStored { status });
                    shard.put(key, entry, ticks, ttl, cost, &self.totals);
                    return Settled::AnswerNotKept;
                }
                let response = response.with_fingerprint(fingerprint);
                let entry = Entry::Done {
                    response,
                    expires_at: 0,
                    route,
                    caller,
                };
                (entry, ttl, cost)
            }
            Settlement::NotStored { status, ttl } => {
                let (entry, cost) = record(Outcome::NotStored { status });
                (entry, ttl, cost)
            }
            Settlement::Unknown { ttl } => {
                let (entry, cost) = record(Outcome::Unknown);
                (entry, ttl, cost)
            }
            Settlement::Failed {
                response,
                linger,
                reissue,
            } => {
                let cost = response.cost();
                let fits = self.room_for_bytes(&mut shard, index, ticks, cost);
                if !fits {
                    // No room to share the failure: waiters are told their owner failed,
                    // without its answer; a one-time token is still given back.
                    if let Some(ttl) = reissue {
                        let issued = Entry::Issued { expires_at: 0 };
                        shard.put(key, issued, ticks, ttl, ENTRY_OVERHEAD, &self.totals);
                    }
                    return written;
                }
                let ttl = linger.max(reissue.unwrap_or_default());
                let issued = reissue.is_some();
                let (entry, cost) = record(Outcome::Failed { response, issued });
                (entry, ttl, cost)
            }
        };
        if !ttl.is_zero() {
            shard.put(key, entry, ticks, ttl, cost, &self.totals);
            shard.sweep(ticks, SWEEP_PER_WRITE, &self.totals);
        }
        written
    }
}
