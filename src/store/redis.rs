//! The Redis store: one record per key, shared by every replica (`records` has the
//! layouts).
//!
//! Every operation is atomic and, in the common case, one round trip: a first-seen request
//! costs two (claim, complete), a replay one. A claim is first tried as a plain `SET … NX PX …
//! GET` (Redis 7.0+; older servers get the claim script), which costs Redis far less than a Lua
//! call, and Redis, not the proxy, is what limits a first-seen load when both share a machine.
//! A completion, likewise, is first tried as a swap: `SET … IFEQ <own in-flight record> PX …`
//! (Valkey 8.1+, Redis 8.4+; one server-side compare), or, on a server that refuses `IFEQ`
//! (then for good), the same compare-and-set as a five-line script. A swap that finds another
//! record than the one written (a waiter's mark, below, or a record the store lost) leaves it
//! to the general settle script. Everything else is a Lua script (`scripts`), fenced by the
//! owner token, so an owner whose claim lapsed cannot touch its successor's record; one whose
//! record is gone writes its outcome back.
//!
//! An in-flight record's TTL is the lease plus the lapse span: a live owner renews it
//! (`renew`, on the store's renewing task); once it went a whole lease without renewal its
//! remaining TTL is at most the span, and the claim has lapsed (held as an unknown outcome,
//! or taken over once the record expires, by the route's [`Lapse`](super::Lapse)).
//!
//! Duplicates on any replica wait on `{prefix}done:{<hex>}` (RESP3 push on the shared
//! connection) instead of polling, with a fallback re-check at most every
//! [`FALLBACK_RECHECK`]. A waiter subscribes (`subscriptions`), then looks at the record
//! with the claim script, which appends a mark (`w`) to another owner's unmarked in-flight
//! record it finds; a duplicate that will not wait does neither. Only the settle script
//! and a purge `PUBLISH`: a swap matches the unmarked record alone, so a record someone
//! waits on always settles by the script that publishes, and the common completion, which
//! nobody waits on, publishes nothing.
//!
//! Observe mode counts a key's duplicates in `{prefix}seen:{<hex>}`, which lives exactly as
//! long as the record it counts, as on the memory store: the count script marks a claim in
//! flight it counts (`s`), so that claim's renewals renew the counter and its settlement
//! goes by the settle script, which gives the counter the outcome's TTL (or deletes it
//! with the record); a claim that takes a record over deletes its counter. A key nobody
//! counted pays nothing for this: its completion is still the swap.
//!
//! This file holds the store, its settings, record names and the small operations; each larger
//! job has its own file: `conn` (the connection), `calls` (one operation under the timeout,
//! retried once), `claims` (a claim's looks and what they mean), `settle` (completions, by swap
//! or script), `renew` (renewing a live claim), `inspect` (the admin API's view and observe
//! mode's count), `eviction` (claims refused while the server may evict records), `subscriptions` (the waiters' channels), `records` (what is written) and
//! `scripts` (the Lua).

mod calls;
mod claims;
mod conn;
mod eviction;
mod inspect;
mod records;
mod renew;
mod scripts;
mod settle;
pub(super) mod subscriptions;

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use redis::{PushInfo, Value};
use tokio::sync::mpsc;

use self::conn::Conn;
use self::records::Name;
use self::scripts::Scripts;
use self::subscriptions::Channels;
use super::renewals::Renewals;
use super::{OwnerToken, Purged, Revision, StoreError};
use crate::key::Digest;
pub use subscriptions::Subscription;

/// How long a waiter trusts the notification channel before looking at the record itself.
pub const FALLBACK_RECHECK: Duration = Duration::from_secs(1);

/// Where and how to reach Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// One server (`redis://` or `rediss://`, user, password and db in the URL) …
    pub url: Option<String>,
    /// … or the seed nodes of a Redis Cluster.
    pub cluster: Vec<String>,
    /// Prepended to every record and channel name.
    pub prefix: String,
    /// Longest wait for one store operation before it counts as a store error.
    pub timeout: Duration,
    /// For `rediss://`: PEM roots to trust instead of the system's.
    pub ca: Option<Vec<u8>>,
}

/// The Redis-backed store.
pub struct RedisStore {
    conn: Conn,
    prefix: String,
    timeout: Duration,
    channels: Arc<Channels>,
    scripts: Scripts,
    /// Set once Redis refused `SET … NX … GET` (before 7.0): claims use the script then.
    no_set_nx_get: AtomicBool,
    /// Set once the server refused `SET … IFEQ` (Redis before 8.4, Valkey before 8.1):
    /// completions swap by the swap script then.
    no_set_ifeq: AtomicBool,
    renewals: Arc<Renewals>,
    /// Whether the server may evict records (claims are refused while it may).
    eviction: eviction::Eviction,
    /// The shortest answer Redis refused as too long, lately; one as long is not sent
    /// again (see `settle`).
    refused_len: settle::RefusedLen,
    /// Settlements given up on (see [`Store::settlement_lost`](super::Store::settlement_lost)).
    settlements_lost: AtomicU64,
    /// Bounds on what its settlements made again hold.
    settling: super::settling::Settling,
    /// Token issuances refused past `tokens.budget` (see [`Store::token_refused`](super::Store::token_refused)).
    tokens_refused: AtomicU64,
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        // Its renewing task may be waiting for a claim that will never come.
        self.renewals.store_dropped();
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("cluster", &matches!(self.conn, Conn::Cluster(_)))
            .finish()
    }
}

impl RedisStore {
    /// Settlements given up on since start (see [`Store::settlement_lost`](super::Store::settlement_lost)).
    pub(crate) fn settlements_lost(&self) -> &AtomicU64 {
        &self.settlements_lost
    }

    /// Bounds on what its settlements made again hold (see `super::settling`).
    pub(crate) fn settling(&self) -> &super::settling::Settling {
        &self.settling
    }

    /// Token issuances refused since start (see [`Store::token_refused`](super::Store::token_refused)).
    pub(crate) fn tokens_refused(&self) -> &AtomicU64 {
        &self.tokens_refused
    }

    /// Sets up the connection without waiting for Redis: a server that is down at start
    /// makes requests fail (and `/readyz` say so) until it is back, but does not stop the
    /// proxy from starting.
    pub fn connect(settings: &RedisSettings) -> Result<Self, StoreError> {
        let (push_tx, push_rx) = mpsc::unbounded_channel::<PushInfo>();
        let conn = Conn::open(settings, push_tx)?;
        let channels: Arc<Channels> = Arc::default();
        tokio::spawn(subscriptions::dispatch(push_rx, Arc::downgrade(&channels)));
        Ok(Self {
            conn,
            prefix: settings.prefix.clone(),
            timeout: settings.timeout,
            channels,
            scripts: Scripts::default(),
            no_set_nx_get: AtomicBool::new(false),
            no_set_ifeq: AtomicBool::new(false),
            renewals: Arc::default(),
            eviction: eviction::Eviction::default(),
            refused_len: settle::RefusedLen::default(),
            settlements_lost: AtomicU64::new(0),
            settling: Default::default(),
            tokens_refused: AtomicU64::new(0),
        })
    }

    /// The claims this store keeps renewed for their leases.
    pub(crate) fn renewals(&self) -> &Arc<Renewals> {
        &self.renewals
    }

    /// The longest wait for one operation.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    fn record<'a>(&'a self, key: &'a Digest) -> Name<'a> {
        Name::new(&self.prefix, "", key)
    }

    fn channel<'a>(&'a self, key: &'a Digest) -> Name<'a> {
        Name::new(&self.prefix, "done:", key)
    }

    /// Observe mode's count of `key`'s duplicates (a hash: `n`, `last`), on the record's slot.
    fn seen_counter<'a>(&'a self, key: &'a Digest) -> Name<'a> {
        Name::new(&self.prefix, "seen:", key)
    }

    /// See [`super::Store::issue`].
    pub async fn issue(&self, key: Digest, ttl: Duration) -> Result<(), StoreError> {
        let mut invocation = self.scripts.issue.prepare_invoke();
        invocation
            .key(self.record(&key))
            .arg(ttl.as_millis().max(1) as u64)
            .arg(records::issued_value(OwnerToken::random()));
        self.run(invocation).await.map(|_| ())
    }

    /// See [`super::Store::hit`].
    pub async fn hit(&self, key: Digest, window: Duration) -> Result<u64, StoreError> {
        let mut invocation = self.scripts.hit.prepare_invoke();
        invocation
            .key(Name::new(&self.prefix, "rate:", &key))
            .arg(window.as_millis().max(1) as u64);
        match self.run(invocation).await? {
            Value::Int(n) => Ok(n.max(0) as u64),
            other => Err(unexpected(&other)),
        }
    }

    /// See [`super::Store::purge`]: one script decides, compares and deletes.
    pub async fn purge(&self, key: Digest, only: Option<Revision>) -> Result<Purged, StoreError> {
        let mut invocation = self.scripts.purge.prepare_invoke();
        invocation
            .key(self.record(&key))
            .key(self.seen_counter(&key))
            .arg(self.channel(&key))
            .arg(only.as_ref().map(records::purge_tag).unwrap_or_default());
        match self.run(invocation).await? {
            Value::Int(1) => Ok(Purged::Removed),
            Value::Int(2) => Ok(Purged::InFlight),
            Value::Int(3) => Ok(Purged::Changed),
            Value::Int(0) => Ok(Purged::Absent),
            other => Err(unexpected(&other)),
        }
    }

    /// See [`super::Store::forget`].
    pub async fn forget(&self, key: Digest) -> Result<bool, StoreError> {
        let mut invocation = self.scripts.forget.prepare_invoke();
        invocation
            .key(self.record(&key))
            .key(self.seen_counter(&key))
            .arg(self.channel(&key));
        Ok(matches!(self.run(invocation).await?, Value::Int(1)))
    }

    /// Whether Redis answers a PING within the store timeout, and takes claims (it may
    /// not evict records, `eviction`).
    pub async fn ready(&self) -> bool {
        if self.refuse_if_evicting().await.is_err() {
            return false;
        }
        let ping = async {
            redis::cmd("PING")
                .query_async::<String>(&mut self.conn.handle().await?)
                .await
        };
        self.bounded(ping).await.is_ok()
    }
}

/// Whether the server refused a command as a syntax error: the answer of a server that
/// lacks an option. Only that, not any `ERR` (redis-rs reports some of its own reconnect
/// failures as `ERR` too), turns the option off for good.
fn refused_as_syntax(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.contains("syntax"))
}

fn unexpected(value: &Value) -> StoreError {
    StoreError::Unavailable(format!("unexpected answer from Redis: {value:?}"))
}
