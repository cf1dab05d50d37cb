//! The store contract: claim a key atomically, hold it while the owner works, settle it with
//! the outcome (the answer, a failure its waiters share, "executed, answer not stored", or
//! "outcome unknown"), and let duplicates wait for that outcome.
//!
//! Backends form a closed set, so [`Store`] is an enum; every backend passes the same
//! conformance suite (`tests/store_conformance/`). Ownership is a type: a successful claim
//! yields a [`Lease`] that keeps the claim while alive (renewing it on the shared stores,
//! Redis, PostgreSQL and MySQL; holding it alive on the memory store). Settling is fenced by
//! the owner's token, and a record the store lost (a restarted Redis) is written back rather
//! than given up, so a retry never runs again because the store forgot.
//!
//! A claim whose owner stopped renewing (a killed replica) *lapses*. Its request may have
//! reached the upstream, so what that means is the route's [`Lapse`]: the key is held as
//! "outcome unknown", or it is taken over once the dead owner's call cannot still run.
//!
//! This file holds the operations ([`Store`]) and what they answer ([`Claim`], [`Purged`],
//! [`StoreError`]).
//! The values they take and return live beside it, each in its own file: `claim` (what a claim
//! names), `settlement` (how a claim ends), `waiter` (a duplicate's wait), `report` (what the
//! admin API and `/metrics` show), `response` (a stored answer), `seal` (answers encrypted at
//! rest), `lease` (ownership as a value), `renewals` (the shared stores' renewing task) and
//! `unanswered` (the release of a shared store's claim that got no answer), `settling` (the
//! bounds on settlements made again in the background), `background` (the
//! count of writes made after their owner ended, which a shutdown waits for), `revision` (which
//! record a key holds, as the admin API's `ETag` names it). The
//! backends (`memory`, `redis`, `sql`) import those, never each other. Everything a caller
//! needs is re-exported here, so `crate::store::X` is the path to use.

pub mod background;
mod claim;
pub mod lease;
pub mod memory;
pub mod redis;
mod renewals;
mod report;
pub mod response;
mod revision;
pub mod seal;
mod settlement;
pub mod settling;
pub mod sql;
mod unanswered;
mod waiter;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub(crate) use claim::mismatched;
pub use claim::{
    AddressTag, CallerTag, ClaimArgs, ClaimMode, Lapse, OwnerToken, Ownership, RouteTag,
};
pub use lease::{Armed, Lease, Liveness};
pub use memory::{MemoryLimits, MemoryStore, WhenFull};
pub use redis::{RedisSettings, RedisStore};
pub use report::{KeyInfo, Seen, StoreStats};
pub use response::StoredResponse;
pub use revision::Revision;
pub(crate) use settlement::{token_left, FailureKept, NotKept};
pub use settlement::{Settled, Settlement};
pub use settling::{AnswerRoom, FixedRoom, Held};
pub use sql::mysql::MysqlStore;
pub use sql::postgres::PostgresStore;
pub use sql::SqlSettings;
pub use unanswered::{ClaimFailure, UnansweredClaim};
pub use waiter::Waiter;

use crate::key::Digest;

/// `at` as Unix milliseconds (0 before 1970): how records carry wall-clock times, in 8
/// bytes and in the Redis encoding alike.
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// The answer to a claim.
#[derive(Debug)]
pub enum Claim {
    /// The key was free (or a dead owner's claim could be taken over): this request owns it.
    Owner(Lease),
    /// Another request owns the key and is still running.
    InFlight(Waiter),
    /// The key was completed: replay this.
    Done(StoredResponse),
    /// The owner this request waited on ([`ClaimArgs::after`]) failed: its answer, which
    /// this request shares instead of executing again (`None`: the answer is no longer
    /// kept, or the owner's outcome was settled otherwise meanwhile).
    Failed(Option<StoredResponse>),
    /// The key's request executed, but its answer was too large to keep.
    NotStored(NotStored),
    /// The key's request may have executed, and no one knows its outcome.
    OutcomeUnknown(Unknown),
    /// The key was used with another payload.
    Mismatch,
    /// A one-time token that was never issued, has expired, or was issued to another
    /// caller (they all look the same, so nothing is revealed).
    NotIssued,
}

impl Claim {
    /// Label for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Owner(_) => "owner",
            Self::InFlight(_) => "in_flight",
            Self::Done(_) => "done",
            Self::Failed(_) => "failed",
            Self::NotStored(_) => "not_stored",
            Self::OutcomeUnknown(_) => "outcome_unknown",
            Self::Mismatch => "mismatch",
            Self::NotIssued => "not_issued",
        }
    }
}

/// What an operator's purge ([`Store::purge`]) did, decided and done in one atomic step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purged {
    /// The key's record (an answer, a failure left for waiters, "executed, answer not
    /// stored", an unknown outcome, a lapsed claim held as one, an issued token) was
    /// deleted: the key's next request executes.
    Removed,
    /// A claim in flight, left as it is: its owner is running (or its lease has not run
    /// out, or a takeover waits for the dead owner's call).
    InFlight,
    /// The key has no live record.
    Absent,
    /// The key holds another record than the one the purge named (another claim's, or
    /// the same one in another state), left as it is.
    Changed,
}

/// What a key records about a request that executed but whose answer was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotStored {
    /// The upstream's status.
    pub status: http::StatusCode,
    /// When it was recorded.
    pub at: SystemTime,
}

/// What a key records about a request whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unknown {
    /// When the state ends (the key is free again), unless an operator purges it first.
    pub until: SystemTime,
}

/// Store failures; with `on_store_error` they become a 503 or an unprotected forward
/// (never [`StoreError::FoundInFlight`]: that request is a duplicate of a running one).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store is full: of in-flight claims none of which may be evicted, or of live
    /// records with `when_full: reject`.
    #[error("the store is full")]
    Full,
    /// This caller's records hold its whole share of the store (`caller_share`).
    #[error("this caller's records hold its share of the store")]
    CallerFull,
    /// The records of this client address hold its whole share of the store
    /// (`address_share`).
    #[error("this client address's records hold its share of the store")]
    AddressFull,
    /// The backend could not be reached or answered an error.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backend failed after the claim had found its key taken (another owner's claim
    /// in flight, or a record the claim had to look at again, such as an unknown outcome),
    /// before the claim had its answer: the request is a duplicate of one that may be
    /// running or have run, so it must not be forwarded unprotected.
    #[error("store unavailable after finding the key in flight: {0}")]
    FoundInFlight(String),
    /// The store answered with a record for this key that cannot be read (damaged, cut
    /// short): the request it records may have run, so the key is neither free nor the
    /// store down, and the request is neither forwarded (whatever `on_store_error` says)
    /// nor run.
    #[error("unreadable record: {0}")]
    Unreadable(String),
    /// The backend answered, but may lose records (a Redis whose `maxmemory-policy`
    /// evicts): it takes no claim, and, being reachable, is no outage either, so the
    /// request is not forwarded whatever `on_store_error` says.
    #[error("store refuses claims: {0}")]
    Evicting(String),
}

impl StoreError {
    /// This error, met by a claim that had found its key taken: an outage becomes
    /// [`StoreError::FoundInFlight`].
    pub(crate) fn after_in_flight(self) -> Self {
        match self {
            Self::Unavailable(e) => Self::FoundInFlight(e),
            other => other,
        }
    }
}

/// A store backend.
///
/// The Redis and SQL arms of its methods box their futures: a network call is a future of
/// kilobytes, and unboxed it would be part of every caller's future on the memory store
/// too, copied whenever a request's task is spawned. Next to a network round trip the
/// allocation costs nothing.
#[derive(Debug, Clone)]
pub enum Store {
    /// The embedded in-process store.
    Memory(Arc<MemoryStore>),
    /// Redis, shared by replicas.
    Redis(Arc<RedisStore>),
    /// A PostgreSQL table, shared by replicas and durable.
    Postgres(Arc<PostgresStore>),
    /// A MySQL or MariaDB table, shared by replicas and durable.
    Mysql(Arc<MysqlStore>),
}

/// What a claim found, before the [`Store`] wraps ownership in a lease guard (what a
/// backend answers; callers of [`Store`] get a [`Claim`]).
#[derive(Debug)]
pub enum RawClaim {
    /// Claimed by this token; on the memory store with the claim's [`Liveness`].
    Owner {
        /// The fencing token of this ownership.
        token: OwnerToken,
        /// `Some` on the memory store: the claim does not lapse while it lives.
        liveness: Option<Liveness>,
    },
    /// Anything else, as the caller gets it.
    Other(Claim),
}

impl Store {
    /// Claims `key` for a request whose payload fingerprint is `fingerprint`, with the
    /// defaults of [`ClaimArgs::new`]. Atomic: of any number of concurrent claims of a free
    /// key exactly one becomes [`Claim::Owner`].
    pub async fn claim(
        &self,
        key: Digest,
        fingerprint: Digest,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.claim_with(ClaimArgs::new(key, fingerprint, lease))
            .await
    }

    /// Claims as `args` say (see [`ClaimArgs`]).
    ///
    /// On the shared stores a claim may be written and its answer lost (a store error
    /// after it was sent, or this future dropped mid-claim): no [`Lease`] holds it then,
    /// and it is released in the background, fenced by its owner token, as a dropped
    /// unsent lease is. So a caller may drop this future at any point (hyper drops a
    /// request's future when its client goes away). A caller that may send its request
    /// after a failed claim uses [`Store::claim_or_unanswered`].
    pub async fn claim_with(&self, args: ClaimArgs) -> Result<Claim, StoreError> {
        self.claim_or_unanswered(args)
            .await
            .map_err(|failure| failure.error)
    }

    /// [`Store::claim_with`], for a caller that may send its request upstream after a failed
    /// claim (`on_store_error: fail_open`, observe mode): the failure comes with the claim
    /// it may have left ([`UnansweredClaim`]), which the caller drops once it knows whether
    /// the request went out, so the claim is kept if it may have and released if not.
    pub async fn claim_or_unanswered(&self, args: ClaimArgs) -> Result<Claim, ClaimFailure> {
        // The record is written after this, so it lapses a lease after it at the earliest.
        let asked = tokio::time::Instant::now();
        let raw = match self {
            Self::Memory(m) => m.claim(&args)?,
            Self::Redis(r) => Box::pin(r.claim(&args)).await?,
            Self::Postgres(p) => Box::pin(p.claim(&args)).await?,
            Self::Mysql(m) => Box::pin(m.claim(&args)).await?,
        };
        Ok(match raw {
            RawClaim::Owner { token, liveness } => {
                Claim::Owner(Lease::start(self.clone(), &args, token, liveness, asked))
            }
            RawClaim::Other(claim) => claim,
        })
    }

    /// Releases the claim of `args` by `token` as a claim that got no answer is released
    /// (fenced by the token, tried again until an answer is final, or the record is gone while none comes),
    /// and returns when done: the store's last answer, `None` if it gave none. For tests of
    /// that release; a claim that goes unanswered is released by itself, in the background.
    #[doc(hidden)]
    pub async fn release_unanswered(&self, args: &ClaimArgs, token: OwnerToken) -> Option<Settled> {
        unanswered::release_now(self, args, token).await
    }

    /// Records `key` as issued (a one-time token) for `ttl`; only then can
    /// [`ClaimMode::IssuedOnly`] claim it, once.
    pub async fn issue(&self, key: Digest, ttl: Duration) -> Result<(), StoreError> {
        match self {
            Self::Memory(m) => m.issue(key, ttl),
            Self::Redis(r) => Box::pin(r.issue(key, ttl)).await,
            Self::Postgres(p) => Box::pin(p.issue(key, ttl)).await,
            Self::Mysql(m) => Box::pin(m.issue(key, ttl)).await,
        }
    }

    /// Counts one hit on `key` in the current fixed window of length `window` and returns
    /// the count so far (rate limits; shared by replicas on Redis).
    pub async fn hit(&self, key: Digest, window: Duration) -> Result<u64, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.hit(key, window)),
            Self::Redis(r) => Box::pin(r.hit(key, window)).await,
            Self::Postgres(p) => Box::pin(p.hit(key, window)).await,
            Self::Mysql(m) => Box::pin(m.hit(key, window)).await,
        }
    }

    /// Ends the claim `owned` with `settlement` and wakes its waiters. Fenced: another
    /// owner's record is never touched ([`Settled::NotWritten`]); a record that is gone is
    /// written back when the settlement says the request ran ([`Settled::WrittenBack`]).
    pub async fn settle(
        &self,
        owned: &Ownership,
        settlement: Settlement,
    ) -> Result<Settled, StoreError> {
        let (settled, _) = self.settle_noting(owned, settlement).await?;
        Ok(settled)
    }

    /// [`Store::settle`], with why an answer was left out ([`Settled::AnswerNotKept`];
    /// `None` otherwise).
    pub(crate) async fn settle_noting(
        &self,
        owned: &Ownership,
        settlement: Settlement,
    ) -> Result<(Settled, Option<NotKept>), StoreError> {
        // Only a SQL database refuses an answer for what it holds; the others leave out
        // one too large for them.
        let too_large = |settled: Settled| {
            let not_kept = (settled == Settled::AnswerNotKept).then_some(NotKept::TooLarge);
            (settled, not_kept)
        };
        match self {
            Self::Memory(m) => Ok(too_large(m.settle(owned, settlement))),
            Self::Redis(r) => Box::pin(r.settle(owned, settlement)).await.map(too_large),
            Self::Postgres(p) => Box::pin(p.settle(owned, settlement)).await,
            Self::Mysql(m) => Box::pin(m.settle(owned, settlement)).await,
        }
    }

    /// Counts one more request with `key` on a route in `idempotency: observe` (a duplicate
    /// enforcement would have replayed, held or refused), while the key has a record, and
    /// returns when that record was made: the first request's time, about.
    pub async fn saw_duplicate(&self, key: Digest) -> Result<Option<SystemTime>, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.saw_duplicate(key)),
            Self::Redis(r) => Box::pin(r.saw_duplicate(key)).await,
            Self::Postgres(p) => Box::pin(p.saw_duplicate(key)).await,
            Self::Mysql(m) => Box::pin(m.saw_duplicate(key)).await,
        }
    }

    /// Looks a key up without claiming it.
    pub async fn inspect(&self, key: Digest) -> Result<Option<KeyInfo>, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.inspect(key)),
            Self::Redis(r) => Box::pin(r.inspect(key)).await,
            Self::Postgres(p) => Box::pin(p.inspect(key)).await,
            Self::Mysql(m) => Box::pin(m.inspect(key)).await,
        }
    }

    /// Deletes `key`'s record unless it is a claim in flight, in one atomic step, so
    /// support can let a customer retry (an outcome-unknown key is purged this way, once
    /// someone checked what happened upstream). A claim in flight is never deleted: its
    /// waiters would take the owner for failed and the next retry would run the request
    /// beside it. Deciding and deleting at once matters because a key changes under an
    /// operator's eyes: a failure record's retry, an issued token's request or an expired
    /// record's next request may claim it between a look and a delete.
    ///
    /// With `only`, the record is deleted only if it is still that one, in that state
    /// ([`KeyInfo::revision`], what the operator looked at), compared in the same step:
    /// an unknown outcome an operator decided to purge may have expired meanwhile and a
    /// retry stored a new answer, which a purge must leave ([`Purged::Changed`]), or the
    /// next retry would run the request once more. A key without a live record is
    /// [`Purged::Absent`] and a claim in flight [`Purged::InFlight`], whatever `only` says.
    pub async fn purge(&self, key: Digest, only: Option<Revision>) -> Result<Purged, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.purge(key, only)),
            Self::Redis(r) => Box::pin(r.purge(key, only)).await,
            Self::Postgres(p) => Box::pin(p.purge(key, only)).await,
            Self::Mysql(m) => Box::pin(m.purge(key, only)).await,
        }
    }

    /// Deletes `key`'s record whatever its state, a claim in flight included, and says
    /// whether a live one was there: what a store that lost the record (a Redis restarted
    /// empty) looks like, for tests of how owners and waiters cope. Operators purge with
    /// [`Store::purge`].
    #[doc(hidden)]
    pub async fn forget(&self, key: Digest) -> Result<bool, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.forget(key)),
            Self::Redis(r) => Box::pin(r.forget(key)).await,
            Self::Postgres(p) => Box::pin(p.forget(key)).await,
            Self::Mysql(m) => Box::pin(m.forget(key)).await,
        }
    }

    /// Whether the store limits each caller's share, and so needs [`ClaimArgs::caller`].
    pub fn counts_callers(&self) -> bool {
        match self {
            Self::Memory(m) => m.limits().counts_callers(),
            Self::Redis(_) | Self::Postgres(_) | Self::Mysql(_) => false,
        }
    }

    /// Whether the store limits each client address's share, and so needs
    /// [`ClaimArgs::address`].
    pub fn counts_addresses(&self) -> bool {
        match self {
            Self::Memory(m) => m.limits().counts_addresses(),
            Self::Redis(_) | Self::Postgres(_) | Self::Mysql(_) => false,
        }
    }

    /// Whether the store answers (the memory store always does).
    pub async fn ready(&self) -> bool {
        match self {
            Self::Memory(_) => true,
            Self::Redis(r) => r.ready().await,
            Self::Postgres(p) => Box::pin(p.ready()).await,
            Self::Mysql(m) => Box::pin(m.ready()).await,
        }
    }

    /// Current gauges (the memory store's; the SQL stores' reaper count; the shared stores'
    /// lost settlements; Redis keeps the rest itself, see `INFO keyspace`).
    pub fn stats(&self) -> StoreStats {
        let lost = |count: &AtomicU64| count.load(Ordering::Relaxed);
        match self {
            Self::Memory(m) => m.stats(),
            Self::Redis(r) => StoreStats {
                settlements_lost: lost(r.settlements_lost()),
                retried_answers_dropped: r.settling().dropped(),
                tokens_refused: lost(r.tokens_refused()),
                ..StoreStats::default()
            },
            Self::Postgres(p) => StoreStats {
                reaped: p.reaped(),
                settlements_lost: lost(p.settlements_lost()),
                retried_answers_dropped: p.settling().dropped(),
                tokens_refused: lost(p.tokens_refused()),
                ..StoreStats::default()
            },
            Self::Mysql(m) => StoreStats {
                reaped: m.reaped(),
                settlements_lost: lost(m.settlements_lost()),
                retried_answers_dropped: m.settling().dropped(),
                tokens_refused: lost(m.tokens_refused()),
                ..StoreStats::default()
            },
        }
    }

    /// Answers of settlements this store fails, made again in the background, take their
    /// bytes from `room` from now on (see `settling`); the memory store, whose settlements
    /// never fail, has none.
    pub fn keep_retried_answers_in(&self, room: Arc<dyn AnswerRoom>) {
        if let Some(settling) = self.settling() {
            settling.set_room(room);
        }
    }

    /// The bounds on this store's settlements made again (`None`: the memory store's never
    /// are).
    pub(crate) fn settling(&self) -> Option<&settling::Settling> {
        match self {
            Self::Memory(_) => None,
            Self::Redis(r) => Some(r.settling()),
            Self::Postgres(p) => Some(p.settling()),
            Self::Mysql(m) => Some(m.settling()),
        }
    }

    /// Counts a one-time token the endpoint refused to issue past `tokens.budget`, beside
    /// those the memory store refused for want of room: one metric says tokens were
    /// refused, whichever bound did it.
    pub(crate) fn token_refused(&self) {
        let count = match self {
            Self::Memory(m) => m.tokens_refused(),
            Self::Redis(r) => r.tokens_refused(),
            Self::Postgres(p) => p.tokens_refused(),
            Self::Mysql(m) => m.tokens_refused(),
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a settlement the store never took before its claim's record ended, or a
    /// release given up (`store::unanswered`): an operator alerts on it, as its repeat runs
    /// again or hears "outcome unknown".
    pub(crate) fn settlement_lost(&self) {
        let count = match self {
            // Settling in memory cannot fail, so nothing is ever given up there.
            Self::Memory(_) => return,
            Self::Redis(r) => r.settlements_lost(),
            Self::Postgres(p) => p.settlements_lost(),
            Self::Mysql(m) => m.settlements_lost(),
        };
        count.fetch_add(1, Ordering::Relaxed);
    }
}
