//! A claim on the memory store, decided under its shard's lock: what the key holds now
//! ([`Decision`]), taking a free key (within the bounds and the caller's and the address's
//! shares), answering
//! a duplicate with a waiter on the owner's channel, and turning a claim whose owner
//! vanished into what its route's lapse rule says.

use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use super::limits::Room;
use super::record::{Entry, InFlight, Outcome, SettledRecord, Ticks};
use super::shard::Shard;
use super::{MemoryStore, SWEEP_PER_WRITE};
use crate::key::Digest;
use crate::store::response::ENTRY_OVERHEAD;
use crate::store::{
    mismatched, Claim, ClaimArgs, ClaimMode, Lapse, Liveness, NotStored, OwnerToken, RawClaim,
    StoreError, Unknown, Waiter,
};

/// What a claim decided under the shard lock.
enum Decision {
    /// The key is this claim's.
    Take,
    /// The claim's answer.
    Answer(Claim),
    /// The owner vanished without settling, and its claim is held as unknown for `ttl`:
    /// the record becomes an unknown outcome, and the claim gets that.
    Lapsed { ttl: Duration },
}

impl MemoryStore {
    /// See [`Store::claim_with`](crate::store::Store::claim_with).
    pub fn claim(&self, args: &ClaimArgs) -> Result<RawClaim, StoreError> {
        // A claim that found the store full while other threads held shards it could make
        // room in waits for them holding none of its own, then starts over: its key may
        // have been claimed meanwhile. It goes round again only if room was there, which
        // a claim of another shard may have taken first; a store of claims in flight
        // alone answers `Full` on the first round that finds no room.
        loop {
            match self.claim_in_shard(args) {
                Err(Room::Busy) => {
                    let (_, ticks) = self.now();
                    if !self.room_for_entry_waiting(self.shard_index(&args.key), ticks) {
                        return Err(StoreError::Full);
                    }
                }
                Err(_) => return Err(StoreError::Full),
                Ok(claim) => return claim,
            }
        }
    }

    /// A claim decided and taken under its shard's lock; `Err` when the key is free but
    /// the store has no room for it ([`Room::Busy`]: yet), with the store unchanged but
    /// for expired records swept and live ones evicted.
    fn claim_in_shard(&self, args: &ClaimArgs) -> Result<Result<RawClaim, StoreError>, Room> {
        let key = args.key;
        let index = self.shard_index(&key);
        let mut shard = self.shard(&key);
        let (now, ticks) = self.now();
        shard.sweep(ticks, SWEEP_PER_WRITE, &self.totals);
        match self.decide(&mut shard, args, now, ticks) {
            Decision::Answer(claim) => return Ok(Ok(RawClaim::Other(claim))),
            Decision::Lapsed { ttl } => {
                return Ok(Ok(self.hold_lapsed(&mut shard, args, ticks, ttl)))
            }
            Decision::Take => {}
        }
        // The record the claim replaces (an issued token, a failure left for waiters, an
        // expired or abandoned record) stays until the claim is sure to be written: a
        // refused claim must not spend a token nor take the waiters' failure away. Its
        // slot counts as freed: against the share of its caller or its address, if it is
        // the claim's, and against the bounds (a record costs at least as much as a claim,
        // so taking its slot needs no room).
        let tags = self.totals.layout.pack(args.caller, args.address);
        let replaced = shard
            .map
            .get(&key)
            .map(|entry| (entry.tags(), (1, entry.cost())));
        if let Some(over) = self.over_share(tags, (1, ENTRY_OVERHEAD), replaced) {
            return Ok(Err(over));
        }
        if replaced.is_none() {
            match self.room_for_entry(&mut shard, index, ticks) {
                Room::Fits => {}
                full => return Err(full),
            }
        }
        shard.remove(&key, &self.totals);
        let token = OwnerToken::random();
        let (liveness, alive) = Liveness::new();
        shard.insert(
            key,
            Entry::InFlight(Box::new(InFlight {
                token,
                fingerprint: args.fingerprint,
                lease_until: now + args.lease,
                lease: args.lease,
                lapse: args.lapse,
                alive,
                created: ticks,
                route: args.route,
                tags,
                done: None,
            })),
            ENTRY_OVERHEAD,
            &self.totals,
        );
        Ok(Ok(RawClaim::Owner {
            token,
            liveness: Some(liveness),
        }))
    }

    /// What a claim finds at `args.key`; converts a lapsed claim held as unknown on the way.
    fn decide(&self, shard: &mut Shard, args: &ClaimArgs, now: Instant, ticks: Ticks) -> Decision {
        use Decision::{Answer, Take};
        let issued_only = args.mode == ClaimMode::IssuedOnly;
        // A waiter never takes a turn of its own from a key that was settled meanwhile,
        // unless it saw its owner's claim lapse on a route that lets a lapsed claim be
        // taken over (its owner may have died, and the grace has passed since).
        let takes_over = args.takes_over && matches!(args.lapse, Lapse::Release { .. });
        let free = || match (args.after, issued_only) {
            (_, true) => Answer(Claim::NotIssued),
            (Some(_), false) if !takes_over => Answer(Claim::Failed(None)),
            (_, false) => Take,
        };
        let fp = &args.fingerprint;
        let unless_mismatched = |stored: &Digest, claim: Claim| {
            if mismatched(stored, fp) {
                Answer(Claim::Mismatch)
            } else {
                Answer(claim)
            }
        };
        let Some(entry) = shard.map.get_mut(&args.key) else {
            return free();
        };
        match entry {
            Entry::Issued { expires_at } if *expires_at > ticks => match args.after {
                Some(_) => Answer(Claim::Failed(None)),
                None => Take,
            },
            Entry::Issued { .. } => free(),
            Entry::Done {
                response,
                expires_at,
                ..
            } if *expires_at > ticks => {
                unless_mismatched(&response.fingerprint(), Claim::Done(response.clone()))
            }
            Entry::Done { .. } => free(),
            Entry::Settled(record) if record.expires_at > ticks => {
                let until = self.wall(record.expires_at, now, SystemTime::now());
                match &record.outcome {
                    Outcome::NotStored { status } => unless_mismatched(
                        &record.fingerprint,
                        Claim::NotStored(NotStored {
                            status: *status,
                            at: record.at,
                        }),
                    ),
                    Outcome::Unknown => unless_mismatched(
                        &record.fingerprint,
                        Claim::OutcomeUnknown(Unknown { until }),
                    ),
                    Outcome::Failed { response, .. } if args.after == Some(record.token) => {
                        unless_mismatched(
                            &record.fingerprint,
                            Claim::Failed(Some(response.clone())),
                        )
                    }
                    Outcome::Failed { .. } if args.after.is_some() => Answer(Claim::Failed(None)),
                    Outcome::Failed { issued, .. } if !issued && issued_only => {
                        Answer(Claim::NotIssued)
                    }
                    Outcome::Failed { .. } => Take,
                }
            }
            Entry::Settled(_) => free(),
            Entry::InFlight(record) if record.owner_holds(now) => {
                // A live owner's claim is extended lazily, by whoever finds it past due.
                if record.lease_until <= now {
                    record.lease_until = now + record.lease;
                }
                let until = record.lease_until;
                wait_on(record, fp, until, false)
            }
            // The owner vanished without settling: its request may have gone out.
            Entry::InFlight(record) => match record.lapse {
                Lapse::Hold { ttl } => Decision::Lapsed { ttl },
                Lapse::Release { grace } if now < record.lease_until + grace => {
                    let until = record.lease_until + grace;
                    wait_on(record, fp, until, true)
                }
                // A token whose owner vanished is spent (as on Redis, where its records
                // are gone by then); the client asks for a new one.
                Lapse::Release { .. } if issued_only => Answer(Claim::NotIssued),
                Lapse::Release { .. } => Take,
            },
        }
    }

    /// Turns the lapsed claim at `args.key` into an unknown outcome for `ttl` (keeping its
    /// owner's token and fingerprint) and answers the claim with it.
    fn hold_lapsed(
        &self,
        shard: &mut Shard,
        args: &ClaimArgs,
        ticks: Ticks,
        ttl: Duration,
    ) -> RawClaim {
        let Some(Entry::InFlight(record)) = shard.map.get(&args.key) else {
            unreachable!("decided on a claim in flight");
        };
        let (token, fingerprint) = (record.token, record.fingerprint);
        let (route, tags) = (record.route, record.tags);
        let seen = shard.remove_for_outcome(&args.key, &self.totals);
        let (entry, cost) =
            SettledRecord::now(Outcome::Unknown, token, fingerprint, route, tags).into_entry();
        shard.put(args.key, entry, ticks, ttl, cost, &self.totals);
        shard.keep_seen(args.key, seen);
        RawClaim::Other(if mismatched(&fingerprint, &args.fingerprint) {
            Claim::Mismatch
        } else {
            Claim::OutcomeUnknown(Unknown {
                until: SystemTime::now() + ttl,
            })
        })
    }
}

/// A duplicate's answer from another owner's claim in flight (`lapsed`: its owner vanished,
/// and it may be taken over after its grace): a waiter on the claim's channel (made by the
/// first duplicate) until `until`, unless the payloads disagree.
fn wait_on(record: &mut InFlight, fingerprint: &Digest, until: Instant, lapsed: bool) -> Decision {
    if mismatched(&record.fingerprint, fingerprint) {
        return Decision::Answer(Claim::Mismatch);
    }
    let done = record.done.get_or_insert_with(|| watch::channel(()).0);
    Decision::Answer(Claim::InFlight(Waiter::new(
        done.subscribe(),
        until,
        record.token,
        lapsed,
    )))
}
