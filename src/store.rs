//! The store contract: claim a key atomically, hold it while the owner works, complete it
//! with the response (or release it), and let duplicates wait for the outcome.
//!
//! Backends form a closed set, so [`Store`] is an enum; every backend passes the same
//! conformance suite (`tests/store_conformance.rs`). Ownership is a type: a successful claim
//! yields a [`Lease`] that keeps the claim while alive (renewing it on Redis, holding it
//! alive on the memory store) and releases the key when dropped unfinished, so a
//! panicking or cancelled owner can never wedge a key.

pub mod lease;
pub mod memory;
pub mod redis;
mod renewals;
pub mod response;
mod subscriptions;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

pub use lease::Lease;
pub use memory::{ClaimMode, MemoryLimits, MemoryStore};
pub use redis::{RedisSettings, RedisStore};
pub use response::StoredResponse;

use crate::key::Digest;

/// `at` as Unix milliseconds (0 before 1970): how records carry wall-clock times, in 8
/// bytes and in the Redis encoding alike.
pub(crate) fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// Identifies one ownership of a key; completion and release must present it (fencing), so
/// an owner whose lease was taken over cannot touch the new owner's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(pub u128);

impl OwnerToken {
    /// A fresh random token.
    pub fn random() -> Self {
        Self(rand::random())
    }
}

/// The answer to a claim.
#[derive(Debug)]
pub enum Claim {
    /// The key was free (or its previous owner's lease had run out): this request owns it.
    Owner(Lease),
    /// Another request owns the key and is still running.
    InFlight(Waiter),
    /// The key was completed: replay this.
    Done(StoredResponse),
    /// The key was used with another payload.
    Mismatch,
    /// A one-time token that was never issued, has expired, or was issued to another
    /// caller (they all look the same, so nothing is revealed).
    Unknown,
}

impl Claim {
    /// Label for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Owner(_) => "owner",
            Self::InFlight(_) => "in_flight",
            Self::Done(_) => "done",
            Self::Mismatch => "mismatch",
            Self::Unknown => "unknown",
        }
    }
}

/// A duplicate's handle on an in-flight key: resolves when the owner finishes (a
/// notification), or when the owner's lease as seen at claim time runs out (it may have
/// vanished), whichever comes first; the caller then claims again. A live owner's claim
/// moves its lease on (renewed on Redis; on the memory store the claim that looks extends
/// it), so that is one look per lease period (Redis: per second at most), never a busy loop.
#[derive(Debug)]
pub struct Waiter {
    signal: watch::Receiver<()>,
    lease_until: Instant,
    // Keeps a Redis channel subscribed while someone waits on it.
    _subscription: Option<subscriptions::Subscription>,
}

impl Waiter {
    pub(crate) fn new(signal: watch::Receiver<()>, lease_until: Instant) -> Self {
        Self {
            signal,
            lease_until,
            _subscription: None,
        }
    }

    /// A waiter for a caller that will not wait: waiting on it returns at once, as if
    /// woken, so a caller that did would only look again.
    pub(crate) fn unwatched() -> Self {
        Self::new(watch::channel(()).1, Instant::now())
    }

    /// A waiter woken through a Redis subscription; `recheck_at` bounds how long it trusts
    /// the channel before looking at the record again.
    pub(crate) fn with_subscription(
        signal: watch::Receiver<()>,
        recheck_at: Instant,
        subscription: subscriptions::Subscription,
    ) -> Self {
        Self {
            signal,
            lease_until: recheck_at,
            _subscription: Some(subscription),
        }
    }

    /// Waits until the owner completes or releases, the lease runs out, or `deadline`.
    /// Returns `false` only when the deadline came first; the caller then claims again.
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
    /// `in_flight` or `done`.
    pub state: &'static str,
    /// When the record was created.
    pub created: SystemTime,
    /// When it expires (done) or its lease runs out (in flight).
    pub expires: SystemTime,
    /// The stored response, when done.
    pub response: Option<StoredResponse>,
}

/// Gauges for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Records held, in flight and done.
    pub entries: usize,
    /// Records in flight.
    pub in_flight: usize,
    /// Bytes accounted to done records.
    pub bytes: usize,
}

/// Store failures; with `on_store_error` they become a 503 or an unprotected forward.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store is full of in-flight claims, none of which may be evicted.
    #[error("the store is full of in-flight claims")]
    Full,
    /// The backend could not be reached or answered an error.
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

/// A store backend.
///
/// The Redis arms of its methods box their futures: a Redis call is a future of
/// kilobytes, and unboxed it would be part of every caller's future on the memory store
/// too, copied whenever a request's task is spawned. Next to a network round trip the
/// allocation costs nothing.
#[derive(Debug, Clone)]
pub enum Store {
    /// The embedded in-process store.
    Memory(Arc<MemoryStore>),
    /// Redis, shared by replicas.
    Redis(Arc<RedisStore>),
}

impl Store {
    /// Claims `key` for a request whose payload fingerprint is `fingerprint`. Atomic: of
    /// any number of concurrent claims of a free key exactly one becomes [`Claim::Owner`].
    pub async fn claim(
        &self,
        key: Digest,
        fingerprint: Digest,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.claim_as(key, fingerprint, lease, ClaimMode::Any, true)
            .await
    }

    /// [`Store::claim`], where `mode` says whether only an issued key may be owned, and
    /// `waits` whether a duplicate that finds the key in flight will wait for it (on Redis
    /// a waiter subscribes and marks the record, which costs the owner's completion a
    /// round trip and a `PUBLISH`; one that will not gets a [`Waiter::unwatched`]).
    pub async fn claim_as(
        &self,
        key: Digest,
        fingerprint: Digest,
        lease: Duration,
        mode: ClaimMode,
        waits: bool,
    ) -> Result<Claim, StoreError> {
        let raw = match self {
            Self::Memory(m) => m.claim(key, fingerprint, lease, mode)?,
            Self::Redis(r) => Box::pin(r.claim(key, fingerprint, lease, mode, waits)).await?,
        };
        Ok(match raw {
            memory::RawClaim::Owner { token, liveness } => {
                Claim::Owner(Lease::start(self.clone(), key, token, lease, liveness))
            }
            memory::RawClaim::InFlight(w) => Claim::InFlight(w),
            memory::RawClaim::Done(r) => Claim::Done(r),
            memory::RawClaim::Mismatch => Claim::Mismatch,
            memory::RawClaim::Unknown => Claim::Unknown,
        })
    }

    /// Records `key` as issued (a one-time token) for `ttl`; only then can
    /// [`ClaimMode::IssuedOnly`] claim it, once.
    pub async fn issue(&self, key: Digest, ttl: Duration) -> Result<(), StoreError> {
        match self {
            Self::Memory(m) => m.issue(key, ttl),
            Self::Redis(r) => Box::pin(r.issue(key, ttl)).await,
        }
    }

    /// Counts one hit on `key` in the current fixed window of length `window` and returns
    /// the count so far (rate limits; shared by replicas on Redis).
    pub async fn hit(&self, key: Digest, window: Duration) -> Result<u64, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.hit(key, window)),
            Self::Redis(r) => Box::pin(r.hit(key, window)).await,
        }
    }

    /// Extends the lease of a live owner; `false` when `token` no longer owns the key.
    pub async fn renew(
        &self,
        key: Digest,
        token: OwnerToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.renew(key, token, lease)),
            Self::Redis(r) => Box::pin(r.renew(key, token, lease)).await,
        }
    }

    /// Stores the owner's response for `ttl` and wakes waiters; `false` (and nothing
    /// written) when `token` no longer owns the key.
    pub async fn complete(
        &self,
        key: Digest,
        token: OwnerToken,
        response: StoredResponse,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.complete(key, token, response, ttl)),
            Self::Redis(r) => Box::pin(r.complete(key, token, response, ttl)).await,
        }
    }

    /// The claims this process holds now that outlive it, each with its owner's token:
    /// on Redis those whose [`Lease`] lives (the store renews them); none on the memory
    /// store, which ends with the process.
    pub fn held_claims(&self) -> Vec<(Digest, OwnerToken)> {
        match self {
            Store::Memory(_) => Vec::new(),
            Store::Redis(redis) => redis.renewals().held(),
        }
    }

    /// Frees the key so a retry executes again; `false` when `token` no longer owns it.
    pub async fn release(&self, key: Digest, token: OwnerToken) -> Result<bool, StoreError> {
        self.release_as(key, token, None).await
    }

    /// [`Store::release`]; with `reissue`, a one-time token's key goes back to issued for
    /// that long, so the caller can retry with the same token.
    pub async fn release_as(
        &self,
        key: Digest,
        token: OwnerToken,
        reissue: Option<Duration>,
    ) -> Result<bool, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.release(key, token, reissue)),
            Self::Redis(r) => Box::pin(r.release(key, token, reissue)).await,
        }
    }

    /// Looks a key up without claiming it.
    pub async fn inspect(&self, key: Digest) -> Result<Option<KeyInfo>, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.inspect(key)),
            Self::Redis(r) => Box::pin(r.inspect(key)).await,
        }
    }

    /// Deletes a key whatever its state, so support can let a customer retry.
    pub async fn remove(&self, key: Digest) -> Result<bool, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.remove(key)),
            Self::Redis(r) => Box::pin(r.remove(key)).await,
        }
    }

    /// Whether the store answers (the memory store always does).
    pub async fn ready(&self) -> bool {
        match self {
            Self::Memory(_) => true,
            Self::Redis(r) => r.ready().await,
        }
    }

    /// Current gauges (the memory store's; Redis keeps its own, see `INFO keyspace`).
    pub fn stats(&self) -> StoreStats {
        match self {
            Self::Memory(m) => m.stats(),
            Self::Redis(_) => StoreStats::default(),
        }
    }
}
