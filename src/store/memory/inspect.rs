//! Reading the memory store without claiming: the admin API's view of one key
//! ([`KeyInfo`], with the state a lapsed claim will turn into at its next claim) and observe
//! mode's count of a key's duplicates.

use std::time::{Instant, SystemTime};

use super::record::{Entry, Outcome, Ticks};
use super::MemoryStore;
use crate::key::Digest;
use crate::store::{KeyInfo, Lapse, Seen};

impl MemoryStore {
    /// See [`Store::inspect`](crate::store::Store::inspect).
    pub fn inspect(&self, key: Digest) -> Option<KeyInfo> {
        let now = Instant::now();
        let wall = SystemTime::now();
        let ticks = self.ticks(now);
        let shard = self.shard(&key);
        let entry = shard.map.get(&key)?;
        if entry.is_expired(ticks) {
            return None;
        }
        let until = |at: Ticks| self.wall(at, now, wall);
        let seen = shard
            .seen
            .get(&key)
            .map(|&(times, last)| Seen { times, last });
        Some(match entry {
            Entry::InFlight(record) => {
                let created = self.wall(record.created, now, wall);
                let alive = record.alive.strong_count() > 0;
                match record.lapse {
                    // A lapsed claim held as unknown: what its next claim will say.
                    Lapse::Hold { ttl } if !record.owner_holds(now) => KeyInfo {
                        state: "outcome_unknown",
                        created,
                        expires: wall + ttl,
                        response: None,
                        status: None,
                        waiters: None,
                        seen,
                    },
                    _ => KeyInfo {
                        state: "in_flight",
                        created,
                        // A live owner's claim does not lapse at a lease_until no one has
                        // renewed since: show when it would, were the owner to vanish now.
                        expires: wall
                            + if alive {
                                record.lease_until.max(now + record.lease)
                            } else {
                                record.lease_until
                            }
                            .saturating_duration_since(now),
                        response: None,
                        status: None,
                        waiters: Some(record.done.as_ref().map_or(0, |d| d.receiver_count())),
                        seen,
                    },
                }
            }
            Entry::Done {
                response,
                expires_at,
                ..
            } => KeyInfo {
                state: "done",
                created: response.stored_at(),
                expires: until(*expires_at),
                response: Some(response.clone()),
                status: Some(response.status()),
                waiters: None,
                seen,
            },
            Entry::Settled(record) => {
                let (state, response, status) = match &record.outcome {
                    Outcome::NotStored { status } => ("not_stored", None, Some(*status)),
                    Outcome::Unknown => ("outcome_unknown", None, None),
                    Outcome::Failed { response, .. } => {
                        ("failed", Some(response.clone()), Some(response.status()))
                    }
                };
                KeyInfo {
                    state,
                    created: record.at,
                    expires: until(record.expires_at),
                    response,
                    status,
                    waiters: None,
                    seen,
                }
            }
            Entry::Issued { expires_at } => KeyInfo {
                state: "issued",
                created: wall,
                expires: until(*expires_at),
                response: None,
                status: None,
                waiters: None,
                seen,
            },
        })
    }

    /// See [`Store::saw_duplicate`](crate::store::Store::saw_duplicate).
    pub fn saw_duplicate(&self, key: Digest) -> Option<SystemTime> {
        let (now, ticks) = self.now();
        let wall = SystemTime::now();
        let mut shard = self.shard(&key);
        let made = match shard.map.get(&key)? {
            entry if entry.is_expired(ticks) => return None,
            Entry::Done { response, .. } => Some(response.stored_at()),
            Entry::InFlight(record) => Some(self.wall(record.created, now, wall)),
            Entry::Settled(record) => Some(record.at),
            Entry::Issued { .. } => None,
        };
        let seen = shard.seen.entry(key).or_insert((1, wall));
        seen.0 += 1;
        seen.1 = wall;
        made
    }
}
