//! The Redis store: one record per key, shared by every replica ([`records`] has the
//! layouts).
//!
//! Every operation is atomic and, in the common case, one round trip: a first-seen request
//! costs two (claim, complete), a replay one. A claim is first tried as a plain `SET … NX
//! PX … GET` (Redis 7.0+; older servers get the claim script), which costs Redis a quarter
//! of a Lua call: Redis, not the proxy, is what limits a first-seen load when both share a
//! machine. A completion, likewise, is first tried as a swap: `SET … IFEQ <own in-flight
//! record> PX …` (Valkey 8.1+, Redis 8.4+; one server-side compare), or, on a server that
//! refuses `IFEQ` (then for good), the same compare-and-set as a five-line script. A swap
//! that finds another record than the one written (a waiter's mark, below, or a record the
//! store lost) leaves it to the general settle script. Everything else is a Lua script
//! ([`scripts`]), fenced by the owner token, so an owner whose claim lapsed cannot touch
//! its successor's record; one whose record is gone writes its outcome back.
//!
//! An in-flight record's TTL is the lease plus the lapse span: a live owner renews it
//! ([`renewals`]); once it went a whole lease without renewal its remaining TTL is at most
//! the span, and the claim has lapsed (held as an unknown outcome, or taken over once the
//! record expires, by the route's [`Lapse`]).
//!
//! Duplicates on any replica wait on `{prefix}done:{<hex>}` (RESP3 push on the shared
//! connection) instead of polling, with a fallback re-check at most every
//! [`FALLBACK_RECHECK`]. A waiter subscribes ([`subscriptions`]), then looks at the record
//! with the claim script, which appends a mark (`w`) to another owner's unmarked in-flight
//! record it finds; a duplicate that will not wait does neither. Only the settle script
//! and removal `PUBLISH`: a swap matches the unmarked record alone, so a record someone
//! waits on always settles by the script that publishes, and the common completion, which
//! nobody waits on, publishes nothing.

mod conn;
mod records;
mod scripts;
mod subscriptions;

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::{IntoConnectionInfo, ProtocolVersion, PushInfo, Value};
use tokio::sync::{mpsc, watch, OnceCell};

use self::conn::Conn;
use self::records::{
    claim_value, settled_value, DoneRecord, Name, Record, CLAIM_LEN, CREATED_MASK,
};
use self::scripts::Scripts;
use self::subscriptions::Channels;
use super::renewals::{self, HeldClaim, Renewals};
use super::{
    mismatched, unix_ms, Claim, ClaimArgs, ClaimMode, KeyInfo, Lapse, NotStored, OwnerToken,
    Ownership, RawClaim, Settled, Settlement, StoreError, Unknown, Waiter,
};
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

/// What a look at a key found.
enum Look {
    /// This claim took the key.
    Claimed,
    /// Nothing, and the claim may not take it (issued-only, or a waiter).
    Free,
    /// A record, with its remaining TTL when the look could read it (the script can,
    /// `SET … GET` cannot).
    Found { data: Vec<u8>, pttl: Option<i64> },
}

/// What a look means for the claim.
enum Decided {
    Claim(RawClaim),
    /// Another owner's claim, alive or lapsed but possibly still running: `owner` runs it,
    /// and a waiter looks again after `recheck` at the latest.
    InFlight {
        owner: OwnerToken,
        recheck: Duration,
    },
}

/// Whether a record `SET … GET` returned needs the claim script: to be taken over
/// atomically (an issued token, a failure left for waiters), or for its remaining TTL (a
/// claim or an unknown outcome, whose meaning depends on it).
fn needs_script(data: &[u8]) -> bool {
    !matches!(data.first(), Some(b'D' | b'N'))
}

impl RedisStore {
    /// Sets up the connection without waiting for Redis: a server that is down at start
    /// makes requests fail (and `/readyz` say so) until it is back, but does not stop the
    /// proxy from starting.
    pub fn connect(settings: &RedisSettings) -> Result<Self, StoreError> {
        let bad = |e: redis::RedisError| StoreError::Unavailable(e.to_string());
        let (push_tx, push_rx) = mpsc::unbounded_channel::<PushInfo>();
        // redis-rs leaves Nagle on; every claim is a small write answered at once, so
        // delaying it only adds latency (and stalls the multiplexed connection).
        let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
        let conn = if settings.cluster.is_empty() {
            let url = settings.url.as_deref().unwrap_or("redis://127.0.0.1:6379");
            let info = url.into_connection_info().map_err(bad)?;
            let resp3 = info
                .redis_settings()
                .clone()
                .set_protocol(ProtocolVersion::RESP3);
            let info = info.set_redis_settings(resp3).set_tcp_settings(tcp);
            let client = match &settings.ca {
                Some(pem) => redis::Client::build_with_tls(info, tls_roots(pem)),
                None => redis::Client::open(info),
            }
            .map_err(bad)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(settings.timeout))
                .set_response_timeout(Some(settings.timeout))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_millis(500))
                .set_push_sender(push_tx)
                .set_automatic_resubscription();
            Conn::Single(ConnectionManager::new_lazy_with_config(client, config).map_err(bad)?)
        } else {
            let mut builder = ClusterClient::builder(settings.cluster.clone());
            if let Some(pem) = &settings.ca {
                builder = builder.certs(tls_roots(pem));
            }
            let client = builder
                .use_protocol(ProtocolVersion::RESP3)
                .tcp_settings(tcp)
                .connection_timeout(settings.timeout)
                .response_timeout(settings.timeout)
                .push_sender(push_tx)
                .build()
                .map_err(bad)?;
            Conn::Cluster(Arc::new((client, OnceCell::new())))
        };
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
        })
    }

    /// The claims this store keeps renewed for their leases.
    pub(crate) fn renewals(&self) -> &Arc<Renewals> {
        &self.renewals
    }

    fn record<'a>(&'a self, key: &'a Digest) -> Name<'a> {
        Name::new(&self.prefix, "", key)
    }

    fn channel<'a>(&'a self, key: &'a Digest) -> Name<'a> {
        Name::new(&self.prefix, "done:", key)
    }

    /// Runs one script invocation under the store timeout. A connection that dropped since
    /// the last call is retried once on the fresh connection: every script is safe to run
    /// twice (a repeated claim recognises its own token, the others are fenced).
    async fn run(&self, invocation: redis::ScriptInvocation<'_>) -> Result<Value, StoreError> {
        self.bounded(self.retried(|| async {
            invocation
                .invoke_async(&mut self.conn.handle().await?)
                .await
        }))
        .await
    }

    /// `call`, made again once if the connection dropped under the first attempt.
    async fn retried<T, F, Fut>(&self, call: F) -> redis::RedisResult<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        match call().await {
            Err(e) if e.is_connection_dropped() || e.is_io_error() => {
                tracing::debug!(error = %e, "redis connection dropped; retrying once");
                call().await
            }
            other => other,
        }
    }

    /// Sends one command under the store timeout, retried once on a dropped connection like
    /// [`RedisStore::run`] (the caller makes sure it is safe to send twice). An error
    /// answer of the server is left to the caller.
    async fn query_raw(&self, cmd: &redis::Cmd) -> Result<redis::RedisResult<Value>, StoreError> {
        let call = async {
            let result = self
                .retried(|| async {
                    cmd.query_async::<Value>(&mut self.conn.handle().await?)
                        .await
                })
                .await;
            match result {
                Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => Ok(Err(e)),
                other => other.map(Ok),
            }
        };
        self.bounded(call).await
    }

    /// Bounds one store operation by the store timeout; either failure is a store error.
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(StoreError::Unavailable(e.to_string())),
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer within {:?}",
                self.timeout
            ))),
        }
    }

    /// A fresh owner token: 80 random bits over the claim's time in ms (48 bits last until
    /// the year 10889). The in-flight record's created ms is read back from it, so the
    /// record follows from the token and fingerprint alone and a completion can name it in
    /// `IFEQ` without the store remembering anything per claim. Fencing needs only that a
    /// successor's token differs: 80 random bits, and a different millisecond besides.
    fn stamped_token() -> OwnerToken {
        let ms = u128::from(unix_ms(SystemTime::now())) & CREATED_MASK;
        OwnerToken(rand::random::<u128>() << 48 | ms)
    }

    /// `I` and the owner token: what fences a renewal.
    fn fence(token: OwnerToken) -> [u8; 17] {
        let mut fence = [0; 17];
        fence[0] = b'I';
        fence[1..].copy_from_slice(&token.0.to_be_bytes());
        fence
    }

    /// A claim's first look: `SET NX GET` where it can be (it writes the claim if the key
    /// is free and returns what is there otherwise), else the claim script. A waiter
    /// coming back (`after`) always takes the script: it must not take a free key.
    async fn first_look(
        &self,
        args: &ClaimArgs,
        value: &[u8],
        px: u64,
    ) -> Result<Look, StoreError> {
        if args.mode == ClaimMode::IssuedOnly
            || args.after.is_some()
            || self.no_set_nx_get.load(Relaxed)
        {
            return self.look(args, value, px, false).await;
        }
        let record = self.record(&args.key);
        // Sized up front: grown argument by argument, the command reallocated four times.
        let mut cmd = redis::Cmd::with_capacity(7, 32 + record.len() + CLAIM_LEN);
        cmd.arg("SET")
            .arg(record)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(px)
            .arg("GET");
        match self.query_raw(&cmd).await? {
            Ok(Value::Nil) => Ok(Look::Claimed),
            Ok(Value::BulkString(data)) => Ok(Look::Found { data, pttl: None }),
            Ok(other) => Err(unexpected(&other)),
            // Before 7.0, NX and GET together are a syntax error.
            Err(e) if refused_as_syntax(&e) => {
                tracing::info!(error = %e, "redis refuses SET NX GET; claiming by script");
                self.no_set_nx_get.store(true, Relaxed);
                self.look(args, value, px, false).await
            }
            Err(e) => Err(StoreError::Unavailable(e.to_string())),
        }
    }

    /// A look by the claim script. With `mark`, by a waiter that has subscribed, an
    /// unmarked in-flight record of another owner it finds is marked as waited on.
    async fn look(
        &self,
        args: &ClaimArgs,
        value: &[u8],
        px: u64,
        mark: bool,
    ) -> Result<Look, StoreError> {
        let flag = |on: bool| if on { "1" } else { "0" };
        let after = args.after.map(|t| t.0.to_be_bytes());
        let mut invocation = self.scripts.claim.prepare_invoke();
        invocation
            .key(self.record(&args.key))
            .arg(value)
            .arg(px)
            .arg(flag(args.mode == ClaimMode::IssuedOnly))
            .arg(flag(mark))
            .arg(after.as_ref().map_or(&[][..], |a| &a[..]))
            .arg(flag(matches!(args.lapse, Lapse::Release { .. })));
        match self.run(invocation).await? {
            Value::Int(0) => Ok(Look::Claimed),
            Value::Int(1) => Ok(Look::Free),
            Value::Array(items) => {
                let mut items = items.into_iter();
                match (items.next(), items.next()) {
                    (Some(Value::BulkString(data)), Some(Value::Int(pttl))) => Ok(Look::Found {
                        data,
                        pttl: Some(pttl),
                    }),
                    (first, _) => Err(unexpected(&first.unwrap_or(Value::Nil))),
                }
            }
            other => Err(unexpected(&other)),
        }
    }

    /// See [`super::Store::claim_with`].
    pub(crate) async fn claim(&self, args: &ClaimArgs) -> Result<RawClaim, StoreError> {
        let token = Self::stamped_token();
        let value = claim_value(token, args.fingerprint, args.lapse);
        let px = (args.lease + args.lapse.span()).as_millis().max(1) as u64;
        let look = match self.first_look(args, &value, px).await? {
            // A waiter subscribes before it looks again; the others look again now.
            Look::Found { data, pttl: None }
                if needs_script(&data) && !(args.waits && data.first() == Some(&b'I')) =>
            {
                self.look(args, &value, px, false).await?
            }
            look => look,
        };
        match decide(args, token, look)? {
            Decided::Claim(claim) => return Ok(claim),
            Decided::InFlight { .. } if !args.waits => {
                return Ok(RawClaim::Other(Claim::InFlight(Waiter::unwatched())))
            }
            Decided::InFlight { .. } => {}
        }
        // Subscribe first, then look again and mark the record: a settlement between the
        // two is then either seen by that look or, the swap refusing a marked record,
        // published by the settle script to the channel.
        let (signal, subscription) = self.subscribe(&args.key).await?;
        match decide(args, token, self.look(args, &value, px, true).await?)? {
            Decided::Claim(claim) => Ok(claim),
            Decided::InFlight { owner, recheck } => Ok(RawClaim::Other(Claim::InFlight(
                Waiter::with_subscription(signal, Instant::now() + recheck, owner, subscription),
            ))),
        }
    }

    /// Joins the waiters on `key`'s channel, once Redis has confirmed its subscription.
    async fn subscribe(
        &self,
        key: &Digest,
    ) -> Result<(watch::Receiver<()>, Subscription), StoreError> {
        let channel = self.channel(key).to_string();
        let (signal, subscription) = self.channels.join(channel, self.conn.clone());
        // On an error the share is dropped, and with it the count.
        self.bounded(subscription.subscribed()).await?;
        Ok((signal, subscription))
    }

    /// See [`super::Store::issue`].
    pub async fn issue(&self, key: Digest, ttl: Duration) -> Result<(), StoreError> {
        let mut invocation = self.scripts.issue.prepare_invoke();
        invocation
            .key(self.record(&key))
            .arg(ttl.as_millis().max(1) as u64);
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

    /// Renews (or restores, see [`renewals`]) a claim for `px` ms from now.
    async fn renew_claim(&self, claim: &HeldClaim) -> Result<renewals::Renewed, StoreError> {
        let px = (claim.lease + claim.lapse.span()).as_millis().max(1) as u64;
        let mut invocation = self.scripts.renew.prepare_invoke();
        invocation
            .key(self.record(&claim.key))
            .arg(&Self::fence(claim.token)[..])
            .arg(px)
            .arg(&claim_value(claim.token, claim.fingerprint, claim.lapse)[..]);
        match self.run(invocation).await? {
            Value::Int(1) => Ok(renewals::Renewed::Extended),
            Value::Int(2) => Ok(renewals::Renewed::Restored),
            Value::Int(0) => Ok(renewals::Renewed::Lost),
            other => Err(unexpected(&other)),
        }
    }

    /// See [`super::Store::settle`].
    pub(crate) async fn settle(
        &self,
        owned: &Ownership,
        settlement: Settlement,
    ) -> Result<Settled, StoreError> {
        let key = &owned.key;
        if let Settlement::Done { response, ttl } = &settlement {
            if !ttl.is_zero() {
                let response = response.clone().with_fingerprint(owned.fingerprint);
                let in_flight = claim_value(owned.token, owned.fingerprint, owned.lapse);
                if self.swap_done(key, &in_flight, &response, *ttl).await? {
                    return Ok(Settled::Written);
                }
                // Not the record this claim wrote: a waiter marked it, the store lost it,
                // or a swap retried after a dropped connection had already been done. The
                // settle script compares the token alone and answers for each.
            }
        }
        let (value, px) = settled_value(owned.token, owned.fingerprint, &settlement);
        let mut invocation = self.scripts.settle.prepare_invoke();
        invocation
            .key(self.record(key))
            .arg(&owned.token.0.to_be_bytes()[..])
            .arg(value.as_deref().unwrap_or_default())
            .arg(px)
            .arg(self.channel(key))
            .arg(if settlement.writes_back() { "1" } else { "0" });
        match self.run(invocation).await? {
            Value::Int(1) => Ok(Settled::Written),
            Value::Int(2) => {
                tracing::warn!(
                    key = %key.short(),
                    settled = settlement.as_str(),
                    "the store had lost the claim; wrote the outcome back"
                );
                Ok(Settled::WrittenBack)
            }
            Value::Int(0) => Ok(Settled::NotWritten),
            other => Err(unexpected(&other)),
        }
    }

    /// A completion by swap: the done record written where the in-flight record
    /// `in_flight` is, else nothing (`false`). `SET … IFEQ` where the server has it, else
    /// the swap script.
    async fn swap_done(
        &self,
        key: &Digest,
        in_flight: &[u8],
        response: &super::StoredResponse,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let done = DoneRecord(response);
        let ttl_ms = ttl.as_millis().max(1) as u64;
        if !self.no_set_ifeq.load(Relaxed) {
            if let Some(swapped) = self.set_ifeq(key, done, in_flight, ttl_ms).await? {
                return Ok(swapped);
            }
        }
        let mut invocation = self.scripts.swap.prepare_invoke();
        invocation
            .key(self.record(key))
            .arg(in_flight)
            .arg(done)
            .arg(ttl_ms);
        Ok(matches!(self.run(invocation).await?, Value::Int(1)))
    }

    /// `SET <done> IFEQ <in-flight record> PX <ttl>`. `None`: the server has no `IFEQ`, and
    /// is not asked again.
    async fn set_ifeq(
        &self,
        key: &Digest,
        done: DoneRecord<'_>,
        in_flight: &[u8],
        ttl_ms: u64,
    ) -> Result<Option<bool>, StoreError> {
        let record = self.record(key);
        let mut set = redis::Cmd::with_capacity(7, 32 + record.len() + done.len() + CLAIM_LEN);
        set.arg("SET")
            .arg(record)
            .arg(done)
            .arg("IFEQ")
            .arg(in_flight)
            .arg("PX")
            .arg(ttl_ms);
        match self.query_raw(&set).await? {
            Ok(Value::Okay) => Ok(Some(true)),
            Ok(Value::Nil) => Ok(Some(false)),
            Ok(other) => Err(unexpected(&other)),
            // An unknown option is a syntax error: the script is the way for this server
            // from now on. Anything else (`LOADING`, `READONLY`, `OOM`, …) passes and
            // would fail the script alike.
            Err(e) if refused_as_syntax(&e) => {
                tracing::info!(error = %e, "redis refuses SET IFEQ; swapping by script");
                self.no_set_ifeq.store(true, Relaxed);
                Ok(None)
            }
            Err(e) => Err(StoreError::Unavailable(e.to_string())),
        }
    }

    fn seen_counter<'a>(&'a self, key: &'a Digest) -> Name<'a> {
        Name::new(&self.prefix, "seen:", key)
    }

    /// See [`super::Store::saw_duplicate`].
    pub async fn saw_duplicate(&self, key: Digest) -> Result<Option<SystemTime>, StoreError> {
        let mut invocation = self.scripts.seen.prepare_invoke();
        invocation
            .key(self.record(&key))
            .key(self.seen_counter(&key))
            .arg(unix_ms(SystemTime::now()));
        Ok(match self.run(invocation).await? {
            Value::BulkString(head) => records::made_at(&head),
            _ => None,
        })
    }

    /// See [`super::Store::inspect`].
    pub async fn inspect(&self, key: Digest) -> Result<Option<KeyInfo>, StoreError> {
        let mut invocation = self.scripts.inspect.prepare_invoke();
        invocation
            .key(self.record(&key))
            .key(self.seen_counter(&key));
        let (data, pttl, seen) = match self.run(invocation).await? {
            Value::Int(0) => return Ok(None),
            Value::Array(items) => {
                let mut items = items.into_iter();
                match (items.next(), items.next(), items.next()) {
                    (Some(Value::BulkString(data)), Some(Value::Int(pttl)), seen) => {
                        (data, pttl, seen_of(seen))
                    }
                    (first, _, _) => return Err(unexpected(&first.unwrap_or(Value::Nil))),
                }
            }
            other => return Err(unexpected(&other)),
        };
        let now = SystemTime::now();
        let ms = |ms: i64| Duration::from_millis(ms.max(0) as u64);
        let info = |state, created, expires, response, status| KeyInfo {
            state,
            created,
            expires,
            response,
            status,
            waiters: None,
            seen,
        };
        Ok(Some(match Record::parse(&data)? {
            Record::Issued => info("issued", now, now + ms(pttl), None, None),
            Record::InFlight { created, lapse, .. } => {
                let span = lapse.span().as_millis() as i64;
                match lapse {
                    _ if pttl > span => {
                        info("in_flight", created, now + ms(pttl - span), None, None)
                    }
                    Lapse::Hold { .. } => {
                        info("outcome_unknown", created, now + ms(pttl), None, None)
                    }
                    Lapse::Release { .. } => info("in_flight", created, now + ms(pttl), None, None),
                }
            }
            Record::Done(response) => {
                let status = Some(response.status());
                info(
                    "done",
                    response.stored_at(),
                    now + ms(pttl),
                    Some(response),
                    status,
                )
            }
            Record::NotStored { status, at, .. } => {
                info("not_stored", at, now + ms(pttl), None, Some(status))
            }
            Record::Unknown { at, .. } => info("outcome_unknown", at, now + ms(pttl), None, None),
            Record::Failed { response, .. } => {
                let status = Some(response.status());
                info(
                    "failed",
                    response.stored_at(),
                    now + ms(pttl),
                    Some(response),
                    status,
                )
            }
        }))
    }

    /// See [`super::Store::remove`].
    pub async fn remove(&self, key: Digest) -> Result<bool, StoreError> {
        let mut invocation = self.scripts.remove.prepare_invoke();
        invocation
            .key(self.record(&key))
            .key(self.seen_counter(&key))
            .arg(self.channel(&key));
        Ok(matches!(self.run(invocation).await?, Value::Int(1)))
    }

    /// Whether Redis answers a PING within the store timeout.
    pub async fn ready(&self) -> bool {
        let ping = async {
            redis::cmd("PING")
                .query_async::<String>(&mut self.conn.handle().await?)
                .await
        };
        self.bounded(ping).await.is_ok()
    }
}

impl renewals::Renew for RedisStore {
    async fn renew(&self, claim: &HeldClaim) -> Result<renewals::Renewed, StoreError> {
        self.renew_claim(claim).await
    }
}

/// What `look` means for a claim by `token`.
fn decide(args: &ClaimArgs, token: OwnerToken, look: Look) -> Result<Decided, StoreError> {
    let answer = |claim| Ok(Decided::Claim(RawClaim::Other(claim)));
    let unless_mismatched = |stored: &Digest, claim| {
        if mismatched(stored, &args.fingerprint) {
            answer(Claim::Mismatch)
        } else {
            answer(claim)
        }
    };
    let (data, pttl) = match look {
        Look::Claimed => {
            return Ok(Decided::Claim(RawClaim::Owner {
                token,
                liveness: None,
            }))
        }
        // A waiter never takes a turn of its own from a key settled meanwhile.
        Look::Free if args.after.is_some() => return answer(Claim::Failed(None)),
        Look::Free => return answer(Claim::NotIssued),
        Look::Found { data, pttl } => (data, pttl),
    };
    let until = |pttl: Option<i64>| {
        SystemTime::now() + Duration::from_millis(pttl.unwrap_or(0).max(0) as u64)
    };
    match Record::parse(&data)? {
        // A retried claim whose first reply was lost: the key is ours.
        Record::InFlight { token: t, .. } if t == token => Ok(Decided::Claim(RawClaim::Owner {
            token,
            liveness: None,
        })),
        Record::InFlight { fingerprint, .. } if mismatched(&fingerprint, &args.fingerprint) => {
            answer(Claim::Mismatch)
        }
        Record::InFlight {
            token: owner,
            lapse,
            ..
        } => {
            let span = lapse.span().as_millis() as i64;
            match (pttl, lapse) {
                // Alive (or not known yet): look again when the lease would run out.
                (None, _) => Ok(Decided::InFlight {
                    owner,
                    recheck: FALLBACK_RECHECK,
                }),
                (Some(p), _) if p > span || p < 0 => Ok(Decided::InFlight {
                    owner,
                    recheck: Duration::from_millis((p - span).max(1) as u64).min(FALLBACK_RECHECK),
                }),
                (Some(_), Lapse::Hold { .. }) => {
                    answer(Claim::OutcomeUnknown(Unknown { until: until(pttl) }))
                }
                // Lapsed, but the dead owner's call may still run until the record expires.
                (Some(p), Lapse::Release { .. }) => Ok(Decided::InFlight {
                    owner,
                    recheck: Duration::from_millis(p.max(1) as u64).min(FALLBACK_RECHECK),
                }),
            }
        }
        Record::Done(response) => unless_mismatched(&response.fingerprint(), Claim::Done(response)),
        Record::NotStored {
            fingerprint,
            status,
            at,
        } => unless_mismatched(&fingerprint, Claim::NotStored(NotStored { status, at })),
        Record::Unknown { fingerprint, .. } => unless_mismatched(
            &fingerprint,
            Claim::OutcomeUnknown(Unknown { until: until(pttl) }),
        ),
        Record::Failed {
            token: owner,
            fingerprint,
            response,
            ..
        } if args.after == Some(owner) => {
            unless_mismatched(&fingerprint, Claim::Failed(Some(response)))
        }
        Record::Failed { .. } | Record::Issued if args.after.is_some() => {
            answer(Claim::Failed(None))
        }
        // The script takes a failure record or an issued token unless only an issued
        // token may be owned and this is no longer one.
        Record::Failed { .. } | Record::Issued => answer(Claim::NotIssued),
    }
}

fn tls_roots(pem: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem.to_vec()),
    }
}

/// Whether the server refused a command as a syntax error: the answer of a server that
/// lacks an option. Only that, not any `ERR` (redis-rs reports some of its own reconnect
/// failures as `ERR` too), turns the option off for good.
fn refused_as_syntax(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.contains("syntax"))
}

/// The observe-mode counter `HMGET n last` returned, if the key was seen more than once.
fn seen_of(value: Option<Value>) -> Option<super::Seen> {
    let Some(Value::Array(fields)) = value else {
        return None;
    };
    let number = |v: Option<&Value>| -> Option<u64> {
        match v? {
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        }
    };
    Some(super::Seen {
        times: number(fields.first())?,
        last: std::time::UNIX_EPOCH + Duration::from_millis(number(fields.get(1))?),
    })
}

fn unexpected(value: &Value) -> StoreError {
    StoreError::Unavailable(format!("unexpected answer from Redis: {value:?}"))
}
