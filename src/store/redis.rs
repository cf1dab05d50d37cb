//! The Redis store: one record per key, shared by every replica.
//!
//! A record is a single Redis string under `{prefix}{<hex digest>}` (the braces are a
//! cluster hash tag, so a key's record and everything about it live on one slot). Its value
//! is binary, never base64 or JSON:
//!
//! - in flight: `'I'` · owner token (16 bytes) · payload fingerprint (32) · created ms (8),
//!   and `'w'` once a duplicate waits on it, with a `PX` of the lease, renewed by the live
//!   owner. The token's low 48 bits are the created ms too, so the owner can rebuild its
//!   unmarked record byte for byte (below);
//! - done: `'D'` · payload fingerprint (32) · [`StoredResponse::encode`] (status, headers,
//!   body), with a `PX` of the route's `ttl`.
//!
//! Redis therefore holds SHA-256 digests and the upstream's response, never a raw client
//! key, `Authorization` value or request body.
//!
//! Every operation is atomic and, in the common case, one round trip: a first-seen request
//! costs two (claim, complete), a replay one. A claim is first tried as a plain `SET … NX
//! PX … GET` (Redis 7.0+; older servers get the claim script), which costs Redis a quarter
//! of a Lua call: Redis, not the proxy, is what limits a first-seen load when both share a
//! machine. A completion, likewise, is first tried as a swap: `SET … IFEQ <own in-flight
//! record> PX …` (Valkey 8.1+, Redis 8.4+; one server-side compare, where a script costs
//! Redis as much as the rest of the request), or, on a server that refuses `IFEQ` (then
//! for good), the same compare-and-set as a five-line script, cheaper for Redis than the
//! general completion script. A swap that finds another record than the one written (a
//! lapsed lease, or a waiter's mark, below) leaves it to the general completion script,
//! which says so (a second round trip, and a second store timeout at worst). The rest are
//! Lua scripts.
//! Completion, release and renewal are fenced by the owner token, so an owner whose lease
//! lapsed cannot touch its successor's record.
//!
//! Duplicates on any replica wait on `{prefix}done:{<hex>}` (RESP3 push on the shared
//! connection) instead of polling, with a fallback re-check at most every
//! [`FALLBACK_RECHECK`]. A waiter subscribes (see `subscriptions`), then looks at the
//! record with the claim script, which appends a mark (`'w'`) to another owner's unmarked
//! in-flight record it finds; a duplicate that will not wait does neither. Only the general
//! completion script, release and removal `PUBLISH`: a swap matches the unmarked record
//! alone, so a record someone waits on always completes by the script that publishes, and
//! the common completion, which nobody waits on, publishes nothing (on Redis 7.0 a
//! script's `PUBLISH` was a tenth of a first-seen request's Redis instructions).

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::BufMut as _;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    IntoConnectionInfo, ProtocolVersion, PushInfo, RedisWrite, Script, ToRedisArgs, Value,
};
use tokio::sync::{mpsc, watch, OnceCell};

use super::memory::{mismatched, ClaimMode, RawClaim};
use super::renewals::Renewals;
use super::subscriptions::{self, Channels, Subscription};
use super::{unix_ms, KeyInfo, OwnerToken, StoreError, StoredResponse, Waiter};
use crate::key::Digest;

/// The bits of an owner token that hold its claim's created ms.
const CREATED_MASK: u128 = (1 << 48) - 1;
/// An unmarked in-flight record: `'I'`, the owner token (16 bytes), the payload
/// fingerprint (32), the claim's created ms (8). A waiter's mark may follow.
const CLAIM_LEN: usize = 57;

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

const CLAIM: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then
  if ARGV[3] == '1' then return 1 end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 0
end
if string.sub(v, 1, 1) == 'T' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 0
end
if ARGV[4] == '1' and #v == #ARGV[1] and string.sub(v, 1, 1) == 'I'
    and string.sub(v, 2, 17) ~= string.sub(ARGV[1], 2, 17) then
  redis.call('APPEND', KEYS[1], 'w')
end
return {v, redis.call('PTTL', KEYS[1])}
";

const ISSUE: &str = r"
redis.call('SET', KEYS[1], 'T', 'PX', ARGV[1])
return 1
";

const HIT: &str = r"
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n
";

const RENEW: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
";

const COMPLETE: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) == ARGV[1] then
  if ARGV[3] == '0' then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], 'D' .. string.sub(v, 18, 49) .. ARGV[2], 'PX', ARGV[3])
  end
  redis.call('PUBLISH', ARGV[4], '1')
  return 1
end
return 0
";

/// `SET … IFEQ` for servers without it. The whole in-flight record is compared and the
/// done record comes ready-made, so the script builds no strings: Redis 7.0 runs it in
/// 39k instructions against the general completion script's 44k (instructions.sh). It
/// publishes nothing: a record it matches carries no waiter's mark, so no one waits on it.
const SWAP: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
";

const RELEASE: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) == ARGV[1] then
  if ARGV[3] == '0' then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], 'T', 'PX', ARGV[3])
  end
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
";

const INSPECT: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
return {v, redis.call('PTTL', KEYS[1])}
";

const REMOVE: &str = r"
local n = redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], '1')
return n
";

#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    // Connected on first use, so a cluster that is down at start does not stop the proxy.
    Cluster(Arc<(ClusterClient, OnceCell<ClusterConnection>)>),
}

/// A usable connection of either kind (cheap clones of the shared, multiplexed one).
pub(super) enum Handle {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// The connection to send on; a cluster connects on first use.
    pub(super) async fn handle(&self) -> redis::RedisResult<Handle> {
        Ok(match self {
            Self::Single(c) => Handle::Single(c.clone()),
            Self::Cluster(cluster) => {
                let (client, cell) = &**cluster;
                let conn = cell
                    .get_or_try_init(|| client.get_async_connection())
                    .await?;
                Handle::Cluster(conn.clone())
            }
        })
    }
}

impl Handle {
    pub(super) async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Self::Single(c) => c.subscribe(channel).await,
            Self::Cluster(c) => c.subscribe(channel).await,
        }
    }

    pub(super) async fn unsubscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Self::Single(c) => c.unsubscribe(channel).await,
            Self::Cluster(c) => c.unsubscribe(channel).await,
        }
    }
}

impl redis::aio::ConnectionLike for Handle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
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
    /// completions swap by the [`SWAP`] script then.
    no_set_ifeq: AtomicBool,
    renewals: Arc<Renewals>,
}

struct Scripts {
    claim: Script,
    renew: Script,
    complete: Script,
    swap: Script,
    release: Script,
    inspect: Script,
    remove: Script,
    issue: Script,
    hit: Script,
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

/// One claim attempt's inputs: the key, the token it would own it with, the payload
/// fingerprint, the lease, and whether only an issued token may be claimed.
#[derive(Clone, Copy)]
struct ClaimArgs<'a> {
    key: &'a Digest,
    token: OwnerToken,
    fingerprint: Digest,
    lease: Duration,
    mode: ClaimMode,
}

/// What the claim script found.
enum Found {
    Claimed,
    /// An issued-only claim found no issued token.
    Unknown,
    InFlight {
        token: u128,
        fingerprint: Digest,
        pttl: i64,
    },
    Done {
        fingerprint: Digest,
        response: StoredResponse,
    },
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
            scripts: Scripts {
                claim: Script::new(CLAIM),
                renew: Script::new(RENEW),
                complete: Script::new(COMPLETE),
                swap: Script::new(SWAP),
                release: Script::new(RELEASE),
                inspect: Script::new(INSPECT),
                remove: Script::new(REMOVE),
                issue: Script::new(ISSUE),
                hit: Script::new(HIT),
            },
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

    /// The in-flight record a claim by `token` writes.
    fn claim_value(token: OwnerToken, fingerprint: Digest) -> [u8; CLAIM_LEN] {
        let mut value = [0; CLAIM_LEN];
        value[0] = b'I';
        value[1..17].copy_from_slice(&token.0.to_be_bytes());
        value[17..49].copy_from_slice(&fingerprint.0);
        value[49..].copy_from_slice(&((token.0 & CREATED_MASK) as u64).to_be_bytes());
        value
    }

    /// A claim's first look: `SET NX GET` where it can be (it writes the claim if the key
    /// is free and returns what is there otherwise), else the claim script. What it finds
    /// in flight comes without its remaining lease (`pttl` -1): the caller looks again
    /// with the script before it waits.
    async fn first_claim(&self, args: ClaimArgs<'_>) -> Result<Found, StoreError> {
        if args.mode == ClaimMode::IssuedOnly || self.no_set_nx_get.load(Relaxed) {
            return self.try_claim(args, false).await;
        }
        let record = self.record(args.key);
        // Sized up front: grown argument by argument, the command reallocated four times.
        let mut cmd = redis::Cmd::with_capacity(7, 32 + record.len() + CLAIM_LEN);
        cmd.arg("SET")
            .arg(record)
            .arg(&Self::claim_value(args.token, args.fingerprint)[..])
            .arg("NX")
            .arg("PX")
            .arg(args.lease.as_millis().max(1) as u64)
            .arg("GET");
        let data = match self.query_raw(&cmd).await? {
            Ok(Value::Nil) => return Ok(Found::Claimed),
            Ok(Value::BulkString(data)) => data,
            Ok(other) => return Err(unexpected(&other)),
            // Before 7.0, NX and GET together are a syntax error.
            Err(e) if refused_as_syntax(&e) => {
                tracing::info!(error = %e, "redis refuses SET NX GET; claiming by script");
                self.no_set_nx_get.store(true, Relaxed);
                return self.try_claim(args, false).await;
            }
            Err(e) => return Err(StoreError::Unavailable(e.to_string())),
        };
        match data.first() {
            // An issued token is taken over by a claim: only the script does that atomically.
            Some(b'T') => self.try_claim(args, false).await,
            _ => found_record(data, -1, args.token),
        }
    }

    /// A claim by the claim script. With `mark`, by a waiter that has subscribed, an
    /// unmarked in-flight record of another owner it finds is marked as waited on.
    async fn try_claim(&self, args: ClaimArgs<'_>, mark: bool) -> Result<Found, StoreError> {
        let flag = |on: bool| if on { "1" } else { "0" };
        let mut invocation = self.scripts.claim.prepare_invoke();
        invocation
            .key(self.record(args.key))
            .arg(&Self::claim_value(args.token, args.fingerprint)[..])
            .arg(args.lease.as_millis().max(1) as u64)
            .arg(flag(args.mode == ClaimMode::IssuedOnly))
            .arg(flag(mark));
        match self.run(invocation).await? {
            Value::Int(0) => Ok(Found::Claimed),
            Value::Int(1) => Ok(Found::Unknown),
            Value::Array(items) => {
                let (data, pttl) = record_and_ttl(items)?;
                found_record(data, pttl, args.token)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// See [`super::Store::claim_as`].
    pub async fn claim(
        &self,
        key: Digest,
        fingerprint: Digest,
        lease: Duration,
        mode: ClaimMode,
        waits: bool,
    ) -> Result<RawClaim, StoreError> {
        let token = Self::stamped_token();
        let args = ClaimArgs {
            key: &key,
            token,
            fingerprint,
            lease,
            mode,
        };
        let found = self.first_claim(args).await?;
        match found {
            Found::InFlight {
                fingerprint: stored,
                ..
            } if mismatched(&stored, &fingerprint) => return Ok(RawClaim::Mismatch),
            Found::InFlight { .. } => {}
            other => return Ok(self.settle(other, token, fingerprint)),
        }
        if !waits {
            return Ok(RawClaim::InFlight(Waiter::unwatched()));
        }
        // Subscribe first, then look again and mark the record: a completion between the
        // two is then either seen by that look or, the swap refusing a marked record,
        // published by the completion script to the channel.
        let (signal, subscription) = self.subscribe(&key).await?;
        match self.try_claim(args, true).await? {
            Found::InFlight { pttl, .. } => {
                let recheck = Duration::from_millis(pttl.max(1) as u64).min(FALLBACK_RECHECK);
                Ok(RawClaim::InFlight(Waiter::with_subscription(
                    signal,
                    Instant::now() + recheck,
                    subscription,
                )))
            }
            other => Ok(self.settle(other, token, fingerprint)),
        }
    }

    fn settle(&self, found: Found, token: OwnerToken, fingerprint: Digest) -> RawClaim {
        match found {
            Found::Claimed => RawClaim::Owner {
                token,
                liveness: None,
            },
            Found::Unknown => RawClaim::Unknown,
            Found::InFlight {
                fingerprint: stored,
                ..
            }
            | Found::Done {
                fingerprint: stored,
                ..
            } if mismatched(&stored, &fingerprint) => RawClaim::Mismatch,
            Found::Done { response, .. } => RawClaim::Done(response),
            Found::InFlight { .. } => unreachable!("in-flight records are handled by claim"),
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

    fn fence(token: OwnerToken) -> Vec<u8> {
        let mut fence = Vec::with_capacity(17);
        fence.push(b'I');
        fence.extend_from_slice(&token.0.to_be_bytes());
        fence
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

    /// See [`super::Store::renew`].
    pub async fn renew(
        &self,
        key: Digest,
        token: OwnerToken,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let mut invocation = self.scripts.renew.prepare_invoke();
        invocation
            .key(self.record(&key))
            .arg(Self::fence(token))
            .arg(lease.as_millis().max(1) as u64);
        Ok(matches!(self.run(invocation).await?, Value::Int(1)))
    }

    /// See [`super::Store::complete`].
    pub async fn complete(
        &self,
        key: Digest,
        token: OwnerToken,
        response: StoredResponse,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        if !ttl.is_zero() {
            let record = Self::claim_value(token, response.fingerprint());
            if self.swap_done(&key, &record[..], &response, ttl).await? {
                return Ok(true);
            }
            // Not the record a claim by `token` for this fingerprint wrote: the lease lapsed,
            // the response was not stamped with the claim's fingerprint (as the proxy
            // does), or a swap retried after a dropped connection had already been done.
            // The general script compares the token alone and answers for each; for the
            // last it says "not completed", as it does when itself retried that way.
        }
        let mut invocation = self.scripts.complete.prepare_invoke();
        invocation
            .key(self.record(&key))
            .arg(Self::fence(token))
            .arg(response.encode())
            .arg(ttl.as_millis() as u64)
            .arg(self.channel(&key));
        Ok(matches!(self.run(invocation).await?, Value::Int(1)))
    }

    /// A completion by swap: the done record written where the in-flight record
    /// `in_flight` is, else nothing (`false`). `SET … IFEQ` where the server has it, else
    /// the [`SWAP`] script.
    async fn swap_done(
        &self,
        key: &Digest,
        in_flight: &[u8],
        response: &StoredResponse,
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

    /// See [`super::Store::release`].
    pub async fn release(
        &self,
        key: Digest,
        token: OwnerToken,
        reissue: Option<Duration>,
    ) -> Result<bool, StoreError> {
        let mut invocation = self.scripts.release.prepare_invoke();
        invocation
            .key(self.record(&key))
            .arg(Self::fence(token))
            .arg(self.channel(&key))
            .arg(reissue.map_or(0, |ttl| ttl.as_millis().max(1) as u64));
        Ok(matches!(self.run(invocation).await?, Value::Int(1)))
    }

    /// See [`super::Store::inspect`].
    pub async fn inspect(&self, key: Digest) -> Result<Option<KeyInfo>, StoreError> {
        let mut invocation = self.scripts.inspect.prepare_invoke();
        invocation.key(self.record(&key));
        let items = match self.run(invocation).await? {
            Value::Int(0) => return Ok(None),
            Value::Array(items) => items,
            other => return Err(unexpected(&other)),
        };
        let (data, pttl) = record_and_ttl(items)?;
        let expires = SystemTime::now() + Duration::from_millis(pttl.max(0) as u64);
        Ok(Some(match data.first() {
            Some(b'T') => KeyInfo {
                state: "issued",
                created: SystemTime::now(),
                expires,
                response: None,
            },
            Some(b'I') if data.len() >= 57 => KeyInfo {
                state: "in_flight",
                created: UNIX_EPOCH
                    + Duration::from_millis(u64::from_be_bytes(
                        data[49..57].try_into().expect("8 bytes"),
                    )),
                expires,
                response: None,
            },
            _ => match parse_record(data, pttl)? {
                Found::Done { response, .. } => KeyInfo {
                    state: "done",
                    created: response.stored_at(),
                    expires,
                    response: Some(response),
                },
                _ => return Err(StoreError::Unavailable("malformed record".into())),
            },
        }))
    }

    /// See [`super::Store::remove`].
    pub async fn remove(&self, key: Digest) -> Result<bool, StoreError> {
        let mut invocation = self.scripts.remove.prepare_invoke();
        invocation.key(self.record(&key)).arg(self.channel(&key));
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

fn tls_roots(pem: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem.to_vec()),
    }
}

fn record_and_ttl(items: Vec<Value>) -> Result<(Vec<u8>, i64), StoreError> {
    let mut items = items.into_iter();
    match (items.next(), items.next()) {
        (Some(Value::BulkString(data)), Some(Value::Int(pttl))) => Ok((data, pttl)),
        (first, _) => Err(unexpected(&first.unwrap_or(Value::Nil))),
    }
}

/// The record a claim found, where `token` is the claim's own: finding its own in-flight
/// record means a retried claim whose first reply was lost, so the key is ours.
fn found_record(data: Vec<u8>, pttl: i64, token: OwnerToken) -> Result<Found, StoreError> {
    match parse_record(data, pttl)? {
        Found::InFlight { token: t, .. } if t == token.0 => Ok(Found::Claimed),
        found => Ok(found),
    }
}

fn parse_record(data: Vec<u8>, pttl: i64) -> Result<Found, StoreError> {
    let malformed = || StoreError::Unavailable("malformed record in Redis".into());
    match data.first() {
        Some(b'I') if data.len() >= CLAIM_LEN => Ok(Found::InFlight {
            token: u128::from_be_bytes(data[1..17].try_into().map_err(|_| malformed())?),
            fingerprint: Digest(data[17..49].try_into().map_err(|_| malformed())?),
            pttl,
        }),
        Some(b'D') if data.len() >= 33 => {
            let fingerprint = Digest(data[1..33].try_into().map_err(|_| malformed())?);
            let response =
                StoredResponse::decode(fingerprint, &data[33..]).ok_or_else(malformed)?;
            Ok(Found::Done {
                fingerprint,
                response,
            })
        }
        _ => Err(malformed()),
    }
}

/// The done record of a response, whose fingerprint is the claim's (what the completion
/// script builds from the in-flight record), written straight into the command that
/// carries it rather than assembled in a buffer of its own first.
#[derive(Clone, Copy)]
struct DoneRecord<'a>(&'a StoredResponse);

impl DoneRecord<'_> {
    fn len(&self) -> usize {
        1 + std::mem::size_of::<Digest>() + self.0.encode().len()
    }
}

impl ToRedisArgs for DoneRecord<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.bufmut_for_next_arg(self.len());
        for part in [&b"D"[..], &self.0.fingerprint().0, self.0.encode()] {
            arg.put_slice(part);
        }
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

/// A record or channel name, `{prefix}{infix}{<hex digest>}` (the braces make a cluster
/// keep a key's record and channel in one slot), written straight into the command that
/// carries it: a `String` per name was an allocation and a copy, three per first-seen
/// request.
#[derive(Clone, Copy)]
struct Name<'a> {
    prefix: &'a str,
    infix: &'static str,
    key: &'a Digest,
}

impl<'a> Name<'a> {
    fn new(prefix: &'a str, infix: &'static str, key: &'a Digest) -> Self {
        Self { prefix, infix, key }
    }

    fn len(&self) -> usize {
        self.prefix.len() + self.infix.len() + 2 + 2 * self.key.0.len()
    }

    /// The name's pieces, in order, given the buffer for its hex digits.
    fn parts<'b>(&'b self, hex: &'b mut [u8; 64]) -> [&'b [u8]; 5] {
        // 32 bytes always fit 64 hex digits.
        let _ = hex::encode_to_slice(self.key.0, hex);
        [
            self.prefix.as_bytes(),
            self.infix.as_bytes(),
            b"{",
            &hex[..],
            b"}",
        ]
    }
}

impl ToRedisArgs for Name<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut hex = [0; 64];
        let mut arg = out.bufmut_for_next_arg(self.len());
        for part in self.parts(&mut hex) {
            arg.put_slice(part);
        }
    }
}

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut hex = [0; 64];
        for part in self.parts(&mut hex) {
            // Every piece is ASCII (the prefix is a `str`, the rest hex and braces).
            f.write_str(std::str::from_utf8(part).map_err(|_| std::fmt::Error)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_and_channel_names_share_the_hash_tag() {
        let key = Digest([0xab; 32]);
        let hex = "ab".repeat(32);
        let names = [
            Name::new("idem:", "", &key),
            Name::new("idem:", "done:", &key),
        ];
        assert_eq!(names[0].to_string(), format!("idem:{{{hex}}}"));
        assert_eq!(names[1].to_string(), format!("idem:done:{{{hex}}}"));
        for name in names {
            // What a command carries is what the name shows, and `len` sizes it.
            assert_eq!(name.to_redis_args(), vec![name.to_string().into_bytes()]);
            assert_eq!(name.len(), name.to_string().len());
        }
    }
}
