//! The store contract: claim a key atomically, hold it while the owner works, settle it
//! with the outcome (the answer, a failure its waiters share, "executed, answer not
//! stored", or "outcome unknown"), and let duplicates wait for that outcome.
//!
//! Backends form a closed set, so [`Store`] is an enum; every backend passes the same
//! conformance suite (`tests/store_conformance.rs`). Ownership is a type: a successful claim
//! yields a [`Lease`] that keeps the claim while alive (renewing it on the shared stores,
//! Redis, PostgreSQL and MySQL; holding it alive on the memory store). Settling is fenced by the owner's token, and a record the
//! store lost (a restarted Redis) is written back rather than given up, so a retry never
//! runs again because the store forgot.
//!
//! A claim whose owner stopped renewing (a killed replica) *lapses*. Its request may have
//! reached the upstream, so what that means is the route's [`Lapse`]: the key is held as
//! "outcome unknown", or it is taken over once the dead owner's call cannot still run.

pub mod lease;
pub mod memory;
pub mod redis;
mod renewals;
pub mod response;
pub mod seal;
pub mod sql;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

pub use lease::Lease;
pub use memory::{MemoryLimits, MemoryStore, WhenFull};
pub use redis::{RedisSettings, RedisStore};
pub use response::StoredResponse;
pub use sql::mysql::MysqlStore;
pub use sql::postgres::PostgresStore;
pub use sql::SqlSettings;

use crate::key::Digest;

/// `at` as Unix milliseconds (0 before 1970): how records carry wall-clock times, in 8
/// bytes and in the Redis encoding alike.
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// Identifies one ownership of a key; settling must present it (fencing), so an owner
/// whose claim was taken over cannot touch the new owner's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(pub u128);

impl OwnerToken {
    /// A fresh random token.
    pub fn random() -> Self {
        Self(rand::random())
    }
}

/// Which records a claim may start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimMode {
    /// A free key becomes owned (client keys, fields, fingerprints).
    Any,
    /// Only a key issued beforehand (a one-time token) becomes owned, consuming the issue
    /// record in the same atomic step.
    IssuedOnly,
}

/// What a lapsed claim (its owner stopped renewing it for a whole lease) means. The dead
/// owner's request may have reached the upstream, so it is never simply free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lapse {
    /// The key is held as "outcome unknown" for `ttl` after the lapse (until an operator
    /// purges it): no retry executes it again (`on_unknown_outcome: hold`).
    Hold {
        /// How long the unknown state lasts.
        ttl: Duration,
    },
    /// A retry takes the key over, but only `grace` after the lapse, when the dead owner's
    /// upstream call cannot still be running (`on_unknown_outcome: release`).
    Release {
        /// The longest the dead owner's call could still run after its last renewal.
        grace: Duration,
    },
}

impl Lapse {
    /// How long a lapsed claim stays in its store after its lease ran out.
    pub fn span(self) -> Duration {
        match self {
            Self::Hold { ttl } => ttl,
            Self::Release { grace } => grace,
        }
    }
}

/// One claim attempt.
#[derive(Debug, Clone, Copy)]
pub struct ClaimArgs {
    /// The key to claim.
    pub key: Digest,
    /// The request's payload fingerprint ([`Digest::NONE`]: nothing to compare).
    pub fingerprint: Digest,
    /// How long the claim outlives an owner that stops renewing it.
    pub lease: Duration,
    /// What a lapsed claim of this key means.
    pub lapse: Lapse,
    /// Whether only an issued key may be owned.
    pub mode: ClaimMode,
    /// Whether a duplicate that finds the key in flight will wait for it (on Redis a
    /// waiter subscribes and marks the record; one that will not gets
    /// [`Waiter::unwatched`]).
    pub waits: bool,
    /// The owner a duplicate waited on: if that owner failed and released the key, this
    /// claim gets its failure ([`Claim::Failed`]) instead of a turn of its own.
    pub after: Option<OwnerToken>,
    /// The route's tag for the store's own metrics (evictions by route).
    pub route: RouteTag,
    /// Whose request it is, for a store that limits what one caller may hold
    /// ([`CallerTag::NONE`]: not counted).
    pub caller: CallerTag,
}

impl ClaimArgs {
    /// A plain claim: any key, a duplicate waits, a lapsed claim is held as unknown for a
    /// day.
    pub fn new(key: Digest, fingerprint: Digest, lease: Duration) -> Self {
        Self {
            key,
            fingerprint,
            lease,
            lapse: Lapse::Hold {
                ttl: Duration::from_secs(24 * 3600),
            },
            mode: ClaimMode::Any,
            waits: true,
            after: None,
            route: RouteTag::default(),
            caller: CallerTag::NONE,
        }
    }
}

/// A caller (one scope) as a store that limits its share knows it: 32 bits of the scope's
/// digest. Two callers that collide only share a limit, never a key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CallerTag(pub u32);

impl CallerTag {
    /// Not counted.
    pub const NONE: CallerTag = CallerTag(0);

    /// The tag of a caller whose scope digest is `scope`.
    pub fn of(scope: &Digest) -> Self {
        let tag = u32::from_le_bytes([scope.0[0], scope.0[1], scope.0[2], scope.0[3]]);
        // Zero means "not counted"; a scope that hashes to it counts as 1.
        Self(tag.max(1))
    }
}

/// One ownership of a key, as its settlement names it: the key, the owner's token, and
/// what its claim wrote (the payload fingerprint and the lapse rule), which the Redis store
/// rebuilds the in-flight record from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    /// The owned key.
    pub key: Digest,
    /// The fencing token.
    pub token: OwnerToken,
    /// The claim's payload fingerprint.
    pub fingerprint: Digest,
    /// The claim's lapse rule.
    pub lapse: Lapse,
}

/// A route as the store knows it: a small number, mapped back to the route's name by
/// [`crate::metrics::Metrics`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteTag(pub u16);

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

/// How an owner settles its key: the one write that ends a claim.
#[derive(Debug, Clone)]
pub enum Settlement {
    /// The answer, replayed for `ttl` (zero: nothing kept, the key is free).
    Done {
        /// The answer, stamped with the claim's payload fingerprint.
        response: StoredResponse,
        /// How long it is replayed.
        ttl: Duration,
    },
    /// The request executed; its answer was not kept. Repeats get a problem for `ttl`.
    NotStored {
        /// The upstream's status.
        status: http::StatusCode,
        /// How long the record stays.
        ttl: Duration,
    },
    /// The request may have executed; no one knows its outcome. Repeats get a problem
    /// for `ttl`.
    Unknown {
        /// How long the state lasts.
        ttl: Duration,
    },
    /// The request failed in a way a retry may repeat (a 5xx, a transient 4xx, an
    /// upstream that was never reached). The duplicates that were waiting get `response`
    /// for `linger`; any other request takes the key over.
    Failed {
        /// What the waiters get.
        response: StoredResponse,
        /// How long the waiters have to collect it.
        linger: Duration,
        /// For a one-time token: it goes back to issued for this long afterwards.
        reissue: Option<Duration>,
    },
    /// The key is freed (nothing was sent, nothing to share); with `reissue`, a one-time
    /// token's key goes back to issued for that long.
    Release {
        /// See above.
        reissue: Option<Duration>,
    },
}

impl Settlement {
    /// Label for logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Done { .. } => "done",
            Self::NotStored { .. } => "not_stored",
            Self::Unknown { .. } => "outcome_unknown",
            Self::Failed { .. } => "failed",
            Self::Release { .. } => "released",
        }
    }

    /// Whether this settlement must be written even when the claim's record is gone (the
    /// store lost it): an answer, or what says the request may have run. A failure or a
    /// release leaves nothing a retry needs.
    fn writes_back(&self) -> bool {
        matches!(
            self,
            Self::Done { ttl, .. } | Self::NotStored { ttl, .. } | Self::Unknown { ttl }
                if !ttl.is_zero()
        )
    }
}

/// What settling did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Written over this owner's own record.
    Written,
    /// The record was gone (the store lost it, or an operator purged it), and the
    /// settlement was written in its place.
    WrittenBack,
    /// An answer the store could not keep (larger than the memory store's whole budget,
    /// or no room with `when_full: reject`): the key records "executed, answer not stored"
    /// instead, so its repeats still never execute.
    AnswerNotKept,
    /// Nothing written: another owner holds the key.
    NotWritten,
}

impl Settled {
    /// Whether the settlement is in the store now as it was asked for.
    pub fn kept(self) -> bool {
        matches!(self, Self::Written | Self::WrittenBack)
    }
}

/// A duplicate's handle on an in-flight key: resolves when the owner finishes (a
/// notification), or when the owner's lease as seen at claim time runs out (it may have
/// vanished), whichever comes first; the caller then claims again, naming
/// [`Waiter::owner`] as [`ClaimArgs::after`]. A live owner's claim moves its lease on
/// (renewed on Redis; on the memory store the claim that looks extends it), so that is one
/// look per lease period (Redis: per second at most), never a busy loop.
#[derive(Debug)]
pub struct Waiter {
    signal: watch::Receiver<()>,
    lease_until: Instant,
    owner: Option<OwnerToken>,
    // Keeps the owner's wake-ups coming while someone waits on them.
    _subscription: Option<Subscription>,
}

/// What keeps a waiter's wake-ups coming.
#[derive(Debug)]
enum Subscription {
    /// A Redis channel subscribed.
    Redis { _channel: redis::Subscription },
    /// Interest in a key of a SQL store (notified on PostgreSQL, re-checked on MySQL).
    Sql { _key: sql::Interest },
}

impl Waiter {
    pub(crate) fn new(
        signal: watch::Receiver<()>,
        lease_until: Instant,
        owner: OwnerToken,
    ) -> Self {
        Self {
            signal,
            lease_until,
            owner: Some(owner),
            _subscription: None,
        }
    }

    /// A waiter for a caller that will not wait: waiting on it returns at once, as if
    /// woken, so a caller that did would only look again.
    pub(crate) fn unwatched() -> Self {
        Self {
            signal: watch::channel(()).1,
            lease_until: Instant::now(),
            owner: None,
            _subscription: None,
        }
    }

    /// A waiter woken through a Redis subscription; `recheck_at` bounds how long it trusts
    /// the channel before looking at the record again.
    pub(crate) fn with_subscription(
        signal: watch::Receiver<()>,
        recheck_at: Instant,
        owner: OwnerToken,
        subscription: redis::Subscription,
    ) -> Self {
        Self {
            signal,
            lease_until: recheck_at,
            owner: Some(owner),
            _subscription: Some(Subscription::Redis {
                _channel: subscription,
            }),
        }
    }

    /// A waiter woken through its interest in a key of a SQL store; `recheck_at` bounds
    /// how long it trusts the wake-ups before looking at the record again.
    pub(crate) fn watching(
        signal: watch::Receiver<()>,
        recheck_at: Instant,
        owner: OwnerToken,
        interest: sql::Interest,
    ) -> Self {
        Self {
            signal,
            lease_until: recheck_at,
            owner: Some(owner),
            _subscription: Some(Subscription::Sql { _key: interest }),
        }
    }

    /// The owner this duplicate waits on.
    pub fn owner(&self) -> Option<OwnerToken> {
        self.owner
    }

    /// Waits until the owner settles, the lease runs out, or `deadline`. Returns `false`
    /// only when the deadline came first; the caller then claims again.
    pub async fn wait(mut self, deadline: Instant) -> bool {
        let until = self.lease_until.min(deadline);
        // The sender is dropped when the in-flight record is replaced or removed; that is
        // the notification.
        let changed = self.signal.changed();
        tokio::select! {
            _ = changed => true,
            _ = tokio::time::sleep_until(until.into()) => Instant::now() < deadline,
        }
    }
}

/// What the admin API shows about one key.
#[derive(Debug, Clone)]
pub struct KeyInfo {
    /// `issued`, `in_flight`, `done`, `failed`, `not_stored` or `outcome_unknown`.
    pub state: &'static str,
    /// When the record was created.
    pub created: SystemTime,
    /// When it expires (its lease runs out, for a claim in flight).
    pub expires: SystemTime,
    /// The stored response, when done or failed.
    pub response: Option<StoredResponse>,
    /// The upstream's status, when the answer was not stored.
    pub status: Option<http::StatusCode>,
    /// Duplicates waiting on a claim in flight, where the store knows (the memory store).
    pub waiters: Option<usize>,
    /// How often the key was seen on a route in `idempotency: observe`, if it was.
    pub seen: Option<Seen>,
}

/// How often a key was seen in observe mode: its first request and the duplicates that
/// came after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Requests with the key, the first included.
    pub times: u64,
    /// When the latest duplicate came.
    pub last: SystemTime,
}

/// Gauges for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Records held, in flight and done.
    pub entries: usize,
    /// Records in flight.
    pub in_flight: usize,
    /// Bytes accounted to done records.
    pub bytes: usize,
    /// Live records evicted to make room, by route, since start.
    pub evictions: Vec<(RouteTag, u64)>,
    /// Expired rows the SQL store's reaper deleted since start.
    pub reaped: u64,
}

/// Store failures; with `on_store_error` they become a 503 or an unprotected forward.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store is full: of in-flight claims none of which may be evicted, or of live
    /// records with `when_full: reject`.
    #[error("the store is full")]
    Full,
    /// This caller's records hold its whole share of the store (`caller_share`).
    #[error("this caller's records hold its share of the store")]
    CallerFull,
    /// The backend could not be reached or answered an error.
    #[error("store unavailable: {0}")]
    Unavailable(String),
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

/// Held by the owner of a memory-store claim: while it lives the claim does not lapse, so
/// an owner in this process needs no renewal timer (a timer registration and a task per
/// claim). The claim's `lease_until` is claim time + lease, pushed forward by each claim
/// that finds it past due while the owner is alive; once the liveness is dropped without
/// the claim being settled (an owner that vanished without its guard running), the claim
/// lapses at `lease_until`, which may already have passed.
#[derive(Debug)]
pub struct Liveness {
    _alive: Arc<()>,
}

impl Liveness {
    pub(crate) fn new() -> (Self, std::sync::Weak<()>) {
        let alive = Arc::new(());
        let weak = Arc::downgrade(&alive);
        (Self { _alive: alive }, weak)
    }
}

/// Whether two payload fingerprints disagree; [`Digest::NONE`] on either side never does.
pub(crate) fn mismatched(stored: &Digest, offered: &Digest) -> bool {
    stored != offered && *stored != Digest::NONE && *offered != Digest::NONE
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
    pub async fn claim_with(&self, args: ClaimArgs) -> Result<Claim, StoreError> {
        let raw = match self {
            Self::Memory(m) => m.claim(&args)?,
            Self::Redis(r) => Box::pin(r.claim(&args)).await?,
            Self::Postgres(p) => Box::pin(p.claim(&args)).await?,
            Self::Mysql(m) => Box::pin(m.claim(&args)).await?,
        };
        Ok(match raw {
            RawClaim::Owner { token, liveness } => {
                Claim::Owner(Lease::start(self.clone(), &args, token, liveness))
            }
            RawClaim::Other(claim) => claim,
        })
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
        match self {
            Self::Memory(m) => Ok(m.settle(owned, settlement)),
            Self::Redis(r) => Box::pin(r.settle(owned, settlement)).await,
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

    /// Deletes a key whatever its state, so support can let a customer retry (an
    /// outcome-unknown key is purged this way, once someone checked what happened).
    pub async fn remove(&self, key: Digest) -> Result<bool, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.remove(key)),
            Self::Redis(r) => Box::pin(r.remove(key)).await,
            Self::Postgres(p) => Box::pin(p.remove(key)).await,
            Self::Mysql(m) => Box::pin(m.remove(key)).await,
        }
    }

    /// Whether the store limits each caller's share, and so needs [`ClaimArgs::caller`].
    pub fn counts_callers(&self) -> bool {
        match self {
            Self::Memory(m) => m.limits().counts_callers(),
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

    /// Current gauges (the memory store's; the SQL stores' reaper count; Redis keeps its
    /// own, see `INFO keyspace`).
    pub fn stats(&self) -> StoreStats {
        match self {
            Self::Memory(m) => m.stats(),
            Self::Redis(_) => StoreStats::default(),
            Self::Postgres(p) => StoreStats {
                reaped: p.reaped(),
                ..StoreStats::default()
            },
            Self::Mysql(m) => StoreStats {
                reaped: m.reaped(),
                ..StoreStats::default()
            },
        }
    }
}
