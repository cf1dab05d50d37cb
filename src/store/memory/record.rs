//! One key's record in the memory store ([`Entry`]): a one-time token issued, a claim in
//! flight, an answer to replay, or a key settled without one. Records are laid out for
//! size, since the store holds one per key: a done record is the map value itself; the
//! rarer kinds are boxed.

use std::sync::Weak;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use super::tags::Tags;
use crate::key::Digest;
use crate::store::response::ENTRY_OVERHEAD;
use crate::store::{Lapse, OwnerToken, RouteTag, StoredResponse};

/// Nanoseconds since the store's epoch (584 years fit).
pub(super) type Ticks = u64;

/// One key's record.
#[derive(Debug)]
pub(super) enum Entry {
    /// A one-time token issued and not yet used.
    Issued { expires_at: Ticks },
    /// Claimed; its owner is running.
    InFlight(Box<InFlight>),
    /// The answer to replay; the response carries the claim's payload fingerprint.
    Done {
        response: StoredResponse,
        expires_at: Ticks,
        route: RouteTag,
        /// Whose it is, for the shares.
        tags: Tags,
    },
    /// Settled without an answer to replay (rare, so boxed).
    Settled(Box<SettledRecord>),
}

// The per-key cost of the map (with the key and the table's slack): a record must not grow
// past this without a reason. (Its caller's and address's tags share 4 bytes for it: see
// `tags`.)
const _: () = assert!(std::mem::size_of::<Entry>() <= 32);

/// A claim whose owner is running.
#[derive(Debug)]
pub(super) struct InFlight {
    pub token: OwnerToken,
    pub fingerprint: Digest,
    /// Renewed lazily: a claim found past it while its owner is alive gets `lease` more.
    pub lease_until: Instant,
    /// The owner's lease, for those lazy renewals.
    pub lease: Duration,
    /// What the claim means once it lapsed.
    pub lapse: Lapse,
    pub alive: Weak<()>,
    /// Claim time, for the admin API (converted to wall time only when shown: a wall-clock
    /// read per claim costs more than the conversion).
    pub created: Ticks,
    pub route: RouteTag,
    pub tags: Tags,
    /// Dropped when the record is replaced or removed; waiters subscribed to it wake.
    /// Made by the first duplicate: most claims never see one, and the channel is an
    /// allocation and a notification per claim otherwise.
    pub done: Option<watch::Sender<()>>,
}

/// A key settled without an answer to replay.
#[derive(Debug)]
pub(super) struct SettledRecord {
    pub outcome: Outcome,
    /// The owner that settled it: its waiters get a failure; it may still complete an
    /// unknown outcome.
    pub token: OwnerToken,
    pub fingerprint: Digest,
    /// When it was settled.
    pub at: SystemTime,
    pub expires_at: Ticks,
    pub route: RouteTag,
    pub tags: Tags,
}

/// How a settled key ended.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Executed; the answer was too large to keep.
    NotStored { status: http::StatusCode },
    /// May have executed; no one knows.
    Unknown,
    /// Failed; the owner's waiters get `response`. With `issued`, a one-time token that is
    /// usable again by anyone else.
    Failed {
        response: StoredResponse,
        issued: bool,
    },
}

impl Entry {
    /// When a record expires; in-flight claims are not in the expiry index.
    pub(super) fn expires_at(&self) -> Option<Ticks> {
        match self {
            Entry::Issued { expires_at } | Entry::Done { expires_at, .. } => Some(*expires_at),
            Entry::Settled(record) => Some(record.expires_at),
            Entry::InFlight(_) => None,
        }
    }

    pub(super) fn set_expiry(&mut self, at: Ticks) {
        match self {
            Entry::Issued { expires_at } | Entry::Done { expires_at, .. } => *expires_at = at,
            Entry::Settled(record) => record.expires_at = at,
            Entry::InFlight(_) => {}
        }
    }

    /// Whether the record holds an unspent one-time token: one issued, or one handed back
    /// with its attempt's failure (to be spent again). Both count in `token_share` and sit
    /// in the token queues, so room is made from them first.
    pub(super) fn holds_token(&self) -> bool {
        match self {
            Entry::Issued { .. } => true,
            Entry::Settled(record) => {
                matches!(record.outcome, Outcome::Failed { issued: true, .. })
            }
            _ => false,
        }
    }

    /// Whether the record's TTL has run out (it counts as absent, until swept).
    pub fn is_expired(&self, now: Ticks) -> bool {
        self.expires_at().is_some_and(|at| at <= now)
    }

    /// Bytes charged against `max_bytes`.
    pub(super) fn cost(&self) -> usize {
        match self {
            Entry::Done { response, .. } => response.cost(),
            Entry::Settled(record) => match &record.outcome {
                Outcome::Failed { response, .. } => response.cost(),
                _ => ENTRY_OVERHEAD,
            },
            Entry::Issued { .. } | Entry::InFlight(_) => ENTRY_OVERHEAD,
        }
    }

    /// The caller and the address whose shares the record counts against (an unspent
    /// token counts against none: it has its own share).
    pub(super) fn tags(&self) -> Tags {
        match self {
            Entry::Done { tags, .. } => *tags,
            Entry::Settled(record) => record.tags,
            Entry::InFlight(record) => record.tags,
            Entry::Issued { .. } => Tags::default(),
        }
    }

    /// The route an evicted record counts for.
    pub(super) fn route(&self) -> RouteTag {
        match self {
            Entry::Done { route, .. } => *route,
            Entry::Settled(record) => record.route,
            Entry::InFlight(record) => record.route,
            Entry::Issued { .. } => RouteTag::default(),
        }
    }
}

impl InFlight {
    /// Whether its owner still holds the claim at `now`: it is alive, or its lease has not
    /// run out. Past that the claim has lapsed, and its route's [`Lapse`] says what it is.
    pub fn owner_holds(&self, now: Instant) -> bool {
        self.alive.strong_count() > 0 || self.lease_until > now
    }

    /// Whether the claim still stands at `now`, so a purge must leave it: its owner holds
    /// it, or it lapsed on a route that releases lapsed claims and the dead owner's call
    /// may still run (its grace). A lapsed claim held as unknown does not: it is an
    /// unknown outcome, the operator's to purge.
    pub fn stands(&self, now: Instant) -> bool {
        self.owner_holds(now)
            || matches!(self.lapse, Lapse::Release { grace } if now < self.lease_until + grace)
    }
}

impl SettledRecord {
    /// A key settled now by `token` with `outcome`, not yet indexed for expiry.
    pub fn now(
        outcome: Outcome,
        token: OwnerToken,
        fingerprint: Digest,
        route: RouteTag,
        tags: Tags,
    ) -> Self {
        Self {
            outcome,
            token,
            fingerprint,
            at: SystemTime::now(),
            expires_at: 0,
            route,
            tags,
        }
    }

    /// The record as an entry, with the bytes it is charged.
    pub fn into_entry(self) -> (Entry, usize) {
        let entry = Entry::Settled(Box::new(self));
        let cost = entry.cost();
        (entry, cost)
    }
}
