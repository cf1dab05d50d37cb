//! Reading the memory store without claiming: the admin API's view of one key
//! ([`KeyInfo`], with the state a lapsed claim will turn into at its next claim, and the
//! [`Revision`] a conditional purge compares) and observe mode's count of a key's
//! duplicates.

use std::time::{Instant, SystemTime};

use super::record::{Entry, Outcome, Ticks};
use super::MemoryStore;
use crate::key::Digest;
use crate::store::{KeyInfo, Lapse, Revision, Seen};

/// The state `entry` shows at `now`: a lapsed claim held as unknown shows what its next
/// claim will find.
fn state(entry: &Entry, now: Instant) -> &'static str {
    match entry {
        Entry::InFlight(record) => match record.lapse {
            Lapse::Hold { .. } if !record.owner_holds(now) => "outcome_unknown",
            _ => "in_flight",
        },
        Entry::Done { .. } => "done",
        Entry::Settled(record) => match record.outcome {
            Outcome::NotStored { .. } => "not_stored",
            Outcome::Unknown => "outcome_unknown",
            Outcome::Failed { .. } => "failed",
        },
        Entry::Issued { .. } => "issued",
    }
}

/// Which record `entry` is at `now`: its claim's token where it keeps one, and a time that
/// never moves while it stands (a claim's time in flight, its expiry after: the expiry
/// index already tells records apart by it).
pub(super) fn revision(entry: &Entry, now: Instant) -> Revision {
    let (at, token) = match entry {
        Entry::InFlight(record) => (record.created, Some(record.token)),
        Entry::Settled(record) => (record.expires_at, Some(record.token)),
        Entry::Done { expires_at, .. } | Entry::Issued { expires_at } => (*expires_at, None),
    };
    Revision::new(state(entry, now), at, token)
}

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
        let info = |created, expires, response, status| KeyInfo {
            state: state(entry, now),
            created,
            expires,
            response,
            status,
            waiters: None,
            seen,
            revision: revision(entry, now),
        };
        Some(match entry {
            Entry::InFlight(record) => {
                let created = self.wall(record.created, now, wall);
                let alive = record.alive.strong_count() > 0;
                match record.lapse {
                    // A lapsed claim held as unknown: what its next claim will say.
                    Lapse::Hold { ttl } if !record.owner_holds(now) => {
                        info(created, wall + ttl, None, None)
                    }
                    // A live owner's claim does not lapse at a lease_until no one has
                    // renewed since: show when it would, were the owner to vanish now.
                    _ => KeyInfo {
                        waiters: Some(record.done.as_ref().map_or(0, |d| d.receiver_count())),
                        ..info(
                            created,
                            wall + if alive {
                                record.lease_until.max(now + record.lease)
                            } else {
                                record.lease_until
                            }
                            .saturating_duration_since(now),
                            None,
                            None,
                        )
                    },
                }
            }
            Entry::Done {
                response,
                expires_at,
                ..
            } => info(
                response.stored_at(),
                until(*expires_at),
                Some(response.clone()),
                Some(response.status()),
            ),
            Entry::Settled(record) => {
                let (response, status) = match &record.outcome {
                    Outcome::NotStored { status } => (None, Some(*status)),
                    Outcome::Unknown => (None, None),
                    Outcome::Failed { response, .. } => {
                        (Some(response.clone()), Some(response.status()))
                    }
                };
                info(record.at, until(record.expires_at), response, status)
            }
            Entry::Issued { expires_at } => info(wall, until(*expires_at), None, None),
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
