//! The PostgreSQL store. Claims, settlements and renewals are PL/pgSQL functions
//! (`postgres.sql`, created beside the table when missing); each runs as one statement in
//! its own READ COMMITTED transaction, and each of its statements sees what committed
//! before it. That is what keeps a claim atomic under concurrency: a plain
//! `INSERT … ON CONFLICT` with a look in the same statement would not see a row another
//! claimer committed after the statement began, so the claim function looks, writes only
//! if the row is still what it looked at, and otherwise looks again.
//!
//! A duplicate that waits marks the record (`waited`); only the settlement of a marked
//! record sends a `NOTIFY` (it takes a lock that serialises committing notifiers), so a
//! request nobody waits on never pays for one.

use std::str::FromStr;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::Row;

use super::common::Common;
use super::found::{decide, digest_of, seen_of, token_of, Decided, Found, Look};
use super::reaper::{Reap, BATCH};
use super::waiters::Interests;
use super::{decode, millis, Call, SqlSettings, Written};
use crate::key::Digest;
use crate::store::renewals::{self, HeldClaim, Renewals};
use crate::store::{
    Claim, ClaimArgs, ClaimMode, KeyInfo, Lapse, OwnerToken, Ownership, RawClaim, Settled,
    Settlement, StoreError, Waiter,
};

/// The schema and routines, `{t}` standing for the table name.
const SCHEMA: &str = include_str!("postgres.sql");

/// Serialises schema creation between replicas starting together (`pg_advisory_xact_lock`).
const MIGRATION_LOCK: i64 = 0x1de3_6a7e;

/// How long a waiter trusts the notifications before looking at the record itself.
pub const FALLBACK_RECHECK: Duration = Duration::from_secs(1);

/// Checks a `postgres://` URL the way the store will read it.
pub fn check_url(url: &str) -> Result<(), String> {
    let scheme = url.split_once("://").map(|(s, _)| s);
    if !matches!(scheme, Some("postgres" | "postgresql")) {
        return Err("expected a postgres:// or postgresql:// URL".into());
    }
    PgConnectOptions::from_str(url)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The statements, with the table name in place.
struct Statements {
    schema: String,
    claim: String,
    settle: String,
    renew: String,
    issue: String,
    hit: String,
    inspect: String,
    remove: String,
    reap: String,
    reap_hits: String,
    reap_seen: String,
    seen: String,
    channel: String,
}

impl Statements {
    fn new(t: &str) -> Self {
        let found = "kind, token, fingerprint, status, response, issued, lapse_hold,
            (extract(epoch FROM lease_until - now()) * 1000)::bigint AS lease_ms,
            (extract(epoch FROM expires_at - now()) * 1000)::bigint AS expires_ms,
            (extract(epoch FROM created_at) * 1000)::bigint AS created_ms";
        Self {
            schema: format!(
                "SELECT pg_advisory_xact_lock({MIGRATION_LOCK});\n{}",
                SCHEMA.replace("{t}", t)
            ),
            claim: format!("SELECT * FROM {t}_claim_v1($1, $2, $3, $4, $5, $6, $7, $8, $9)"),
            settle: format!("SELECT {t}_settle_v1($1, $2, $3, $4, $5, $6, $7, $8, $9)::bigint"),
            renew: format!("SELECT {t}_renew_v1($1, $2, $3, $4, $5, $6)::bigint"),
            issue: format!(
                "INSERT INTO {t} (digest, kind, token, fingerprint, created_at, expires_at)
                 VALUES ($1, 'T', NULL, $2, now(), now() + $3 * interval '1 millisecond')
                 ON CONFLICT (digest) DO UPDATE SET kind = 'T', token = NULL,
                    fingerprint = EXCLUDED.fingerprint, created_at = now(),
                    lease_until = NULL, expires_at = EXCLUDED.expires_at,
                    lapse_hold = false, waited = false, issued = false, status = NULL,
                    response = NULL"
            ),
            hit: format!(
                "INSERT INTO {t}_hits AS h (digest, window_end, hits)
                 VALUES ($1, now() + $2 * interval '1 millisecond', 1)
                 ON CONFLICT (digest) DO UPDATE SET
                    hits = CASE WHEN h.window_end <= now() THEN 1 ELSE h.hits + 1 END,
                    window_end = CASE WHEN h.window_end <= now()
                        THEN EXCLUDED.window_end ELSE h.window_end END
                 RETURNING hits"
            ),
            inspect: format!(
                "SELECT {found},
                    (SELECT s.times FROM {t}_seen s
                        WHERE s.digest = $1 AND s.expires_at > now()) AS seen_times,
                    (SELECT (extract(epoch FROM s.last_at) * 1000)::bigint FROM {t}_seen s
                        WHERE s.digest = $1 AND s.expires_at > now()) AS seen_ms
                 FROM {t} WHERE digest = $1 AND expires_at > now()"
            ),
            remove: format!(
                "WITH gone AS (DELETE FROM {t} WHERE digest = $1 AND expires_at > now()
                    RETURNING 1),
                 seen AS (DELETE FROM {t}_seen WHERE digest = $1)
                 SELECT count(*) FROM gone, pg_notify('{t}_done', $2)"
            ),
            // A count restarts with a key's new record: the old one's has expired.
            seen: format!(
                "WITH r AS (SELECT kind, created_at, expires_at FROM {t}
                    WHERE digest = $1 AND expires_at > now()),
                 up AS (INSERT INTO {t}_seen (digest, times, last_at, expires_at)
                    SELECT $1, 2, now(), r.expires_at FROM r
                    ON CONFLICT (digest) DO UPDATE SET
                        times = CASE WHEN {t}_seen.expires_at > now()
                            THEN {t}_seen.times + 1 ELSE 2 END,
                        last_at = now(), expires_at = EXCLUDED.expires_at
                    RETURNING 1)
                 SELECT (extract(epoch FROM r.created_at) * 1000)::bigint
                 FROM r, (SELECT count(*) FROM up) counted WHERE r.kind <> 'T'"
            ),
            reap: format!(
                "WITH gone AS (DELETE FROM {t} WHERE digest IN (
                    SELECT digest FROM {t} WHERE expires_at <= now()
                    LIMIT {BATCH} FOR UPDATE SKIP LOCKED) RETURNING 1)
                 SELECT count(*) FROM gone"
            ),
            reap_hits: format!(
                "WITH gone AS (DELETE FROM {t}_hits WHERE digest IN (
                    SELECT digest FROM {t}_hits WHERE window_end <= now()
                    LIMIT {BATCH} FOR UPDATE SKIP LOCKED) RETURNING 1)
                 SELECT count(*) FROM gone"
            ),
            reap_seen: format!(
                "WITH gone AS (DELETE FROM {t}_seen WHERE digest IN (
                    SELECT digest FROM {t}_seen WHERE expires_at <= now()
                    LIMIT {BATCH} FOR UPDATE SKIP LOCKED) RETURNING 1)
                 SELECT count(*) FROM gone"
            ),
            channel: format!("{t}_done"),
        }
    }
}

/// The PostgreSQL-backed store.
pub struct PostgresStore {
    pool: PgPool,
    sql: Statements,
    common: Common,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("channel", &self.sql.channel)
            .finish()
    }
}

impl PostgresStore {
    /// Sets up the pool without waiting for the database: one that is down at start makes
    /// requests fail (and `/readyz` say so) until it is back. The table is created on the
    /// first operation that reaches it (`idemgate run` asks at start).
    pub fn connect(settings: &SqlSettings) -> Result<Arc<Self>, StoreError> {
        super::valid_table(&settings.table).map_err(StoreError::Unavailable)?;
        let options = PgConnectOptions::from_str(&settings.url)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?
            .application_name("idemgate");
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections.max(1))
            .acquire_timeout(settings.timeout)
            // A ping per acquire would be a round trip per statement; a connection the
            // database dropped fails its statement instead, which is sent again.
            .test_before_acquire(false)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    // Each statement must see what committed before it (see the module
                    // docs), whatever the database's default isolation is.
                    sqlx::query(
                        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED",
                    )
                    .execute(conn)
                    .await
                    .map(|_| ())
                })
            })
            .connect_lazy_with(options);
        let interests: Arc<Interests> = Arc::default();
        let sql = Statements::new(&settings.table);
        let listener = tokio::spawn(super::listener::listen(
            pool.clone(),
            sql.channel.clone(),
            Arc::clone(&interests),
        ));
        let store = Arc::new_cyclic(|weak| {
            let reaper = tokio::spawn(super::reaper::reap(weak.clone(), settings.reap_every));
            Self {
                pool,
                sql,
                common: Common::new(
                    settings,
                    interests,
                    vec![listener.abort_handle(), reaper.abort_handle()],
                ),
            }
        });
        Ok(store)
    }

    /// The claims this store keeps renewed for their leases.
    pub(crate) fn renewals(&self) -> &Arc<Renewals> {
        &self.common.renewals
    }

    /// Expired rows the reaper deleted since start.
    pub fn reaped(&self) -> u64 {
        self.common.reaped.load(Relaxed)
    }

    /// Creates the table, its indexes and routines when missing (once per store).
    async fn ready_schema(&self) -> Result<(), StoreError> {
        self.common.schema(|| self.migrate()).await
    }

    /// One attempt at creating what is missing. The statements go as one simple query,
    /// which PostgreSQL runs as one transaction, after an advisory lock that replicas
    /// starting together take in turn.
    fn migrate(&self) -> Call<'_, ()> {
        Box::pin(async move {
            sqlx::raw_sql(&self.sql.schema)
                .execute(&self.pool)
                .await
                .map(|_| ())
        })
    }

    /// One claim routine call; `mark`: a waiter that has joined the key's interest marks
    /// another owner's in-flight record as waited on.
    async fn look(
        &self,
        args: &ClaimArgs,
        token: OwnerToken,
        mark: bool,
    ) -> Result<Look, StoreError> {
        self.ready_schema().await?;
        let token_bytes = token.0.to_be_bytes();
        let (lease_ms, span_ms) = (millis(args.lease), millis(args.lapse.span()));
        let row = self
            .common
            .call(|| {
                sqlx::query(&self.sql.claim)
                    .bind(&args.key.0[..])
                    .bind(&token_bytes[..])
                    .bind(&args.fingerprint.0[..])
                    .bind(lease_ms)
                    .bind(span_ms)
                    .bind(matches!(args.lapse, Lapse::Hold { .. }))
                    .bind(args.mode == ClaimMode::IssuedOnly)
                    .bind(args.after.is_some())
                    .bind(mark)
                    .fetch_one(&self.pool)
            })
            .await?;
        let outcome: i16 = row.try_get("outcome").map_err(decode)?;
        Ok(match outcome {
            0 => Look::Claimed,
            1 => Look::Free,
            _ => Look::Found(found(&row)?),
        })
    }

    /// See [`crate::store::Store::claim_with`].
    pub(crate) async fn claim(&self, args: &ClaimArgs) -> Result<RawClaim, StoreError> {
        let token = OwnerToken::random();
        let first = match decide(args, token, self.look(args, token, false).await?)? {
            Decided::Claim(claim) => return Ok(claim),
            Decided::InFlight { .. } if !args.waits => {
                return Ok(RawClaim::Other(Claim::InFlight(Waiter::unwatched())))
            }
            Decided::InFlight { owner, .. } => owner,
        };
        // Join the key's waiters once notifications arrive, then look again and mark the
        // record: a settlement after that look notifies, one before it is seen.
        tokio::time::timeout(self.common.timeout(), self.common.interests.listening())
            .await
            .map_err(|_| StoreError::Unavailable("not listening for notifications".into()))?;
        let (signal, interest) = self.common.interests.join(args.key, first);
        match decide(args, token, self.look(args, token, true).await?)? {
            Decided::Claim(claim) => Ok(claim),
            Decided::InFlight { owner, recheck } => {
                Ok(RawClaim::Other(Claim::InFlight(Waiter::watching(
                    signal,
                    Instant::now() + recheck.min(FALLBACK_RECHECK),
                    owner,
                    interest,
                ))))
            }
        }
    }

    /// See [`crate::store::Store::issue`].
    pub async fn issue(&self, key: Digest, ttl: Duration) -> Result<(), StoreError> {
        self.ready_schema().await?;
        self.common
            .call(|| {
                sqlx::query(&self.sql.issue)
                    .bind(&key.0[..])
                    .bind(&Digest::NONE.0[..])
                    .bind(millis(ttl))
                    .execute(&self.pool)
            })
            .await
            .map(|_| ())
    }

    /// See [`crate::store::Store::hit`].
    pub async fn hit(&self, key: Digest, window: Duration) -> Result<u64, StoreError> {
        self.ready_schema().await?;
        let hits: i64 = self
            .common
            .call(|| {
                sqlx::query_scalar(&self.sql.hit)
                    .bind(&key.0[..])
                    .bind(millis(window))
                    .fetch_one(&self.pool)
            })
            .await?;
        Ok(hits.max(0) as u64)
    }

    /// See [`crate::store::Store::settle`].
    pub(crate) async fn settle(
        &self,
        owned: &Ownership,
        settlement: Settlement,
    ) -> Result<Settled, StoreError> {
        self.ready_schema().await?;
        let written = Written::of(&settlement);
        let token = owned.token.0.to_be_bytes();
        let code: i64 = self
            .common
            .call(|| {
                sqlx::query_scalar(&self.sql.settle)
                    .bind(&owned.key.0[..])
                    .bind(&token[..])
                    .bind(&owned.fingerprint.0[..])
                    .bind(written.kind.map(|k| k as i8))
                    .bind(written.ttl_ms)
                    .bind(written.status)
                    .bind(written.response)
                    .bind(written.issued)
                    .bind(settlement.writes_back())
                    .fetch_one(&self.pool)
            })
            .await?;
        self.common.settled(owned, &settlement, code)
    }

    /// See [`crate::store::Store::inspect`].
    pub async fn inspect(&self, key: Digest) -> Result<Option<KeyInfo>, StoreError> {
        self.ready_schema().await?;
        let row = self
            .common
            .call(|| {
                sqlx::query(&self.sql.inspect)
                    .bind(&key.0[..])
                    .fetch_optional(&self.pool)
            })
            .await?;
        row.map(|row| {
            let info = found(&row)?.info()?;
            let times: Option<i64> = row.try_get("seen_times").map_err(decode)?;
            let last: Option<i64> = row.try_get("seen_ms").map_err(decode)?;
            Ok(KeyInfo {
                seen: seen_of(times, last),
                ..info
            })
        })
        .transpose()
    }

    /// See [`crate::store::Store::saw_duplicate`].
    pub async fn saw_duplicate(&self, key: Digest) -> Result<Option<SystemTime>, StoreError> {
        self.ready_schema().await?;
        let made: Option<i64> = self
            .common
            .call(|| {
                sqlx::query_scalar(&self.sql.seen)
                    .bind(&key.0[..])
                    .fetch_optional(&self.pool)
            })
            .await?;
        Ok(made.map(|ms| UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)))
    }

    /// See [`crate::store::Store::remove`].
    pub async fn remove(&self, key: Digest) -> Result<bool, StoreError> {
        self.ready_schema().await?;
        let hex = hex::encode(key.0);
        let removed: i64 = self
            .common
            .call(|| {
                sqlx::query_scalar(&self.sql.remove)
                    .bind(&key.0[..])
                    .bind(&hex)
                    .fetch_one(&self.pool)
            })
            .await?;
        self.common.interests.wake(&key);
        Ok(removed > 0)
    }

    /// Whether the database answers (creating the table first if it is missing).
    pub async fn ready(&self) -> bool {
        if self.ready_schema().await.is_err() {
            return false;
        }
        self.common
            .call(|| sqlx::query("SELECT 1").execute(&self.pool))
            .await
            .is_ok()
    }
}

impl renewals::Renew for PostgresStore {
    async fn renew(&self, claim: &HeldClaim) -> Result<renewals::Renewed, StoreError> {
        self.ready_schema().await?;
        let token = claim.token.0.to_be_bytes();
        let code: i64 = self
            .common
            .call(|| {
                sqlx::query_scalar(&self.sql.renew)
                    .bind(&claim.key.0[..])
                    .bind(&token[..])
                    .bind(&claim.fingerprint.0[..])
                    .bind(millis(claim.lease))
                    .bind(millis(claim.lapse.span()))
                    .bind(matches!(claim.lapse, Lapse::Hold { .. }))
                    .fetch_one(&self.pool)
            })
            .await?;
        Common::renewed(code)
    }
}

impl Reap for PostgresStore {
    async fn reap_batch(&self) -> Result<u64, StoreError> {
        self.ready_schema().await?;
        let mut total = 0;
        for statement in [&self.sql.reap, &self.sql.reap_hits, &self.sql.reap_seen] {
            let n: i64 = self
                .common
                .call(|| sqlx::query_scalar(statement).fetch_one(&self.pool))
                .await?;
            total += n.max(0) as u64;
        }
        Ok(total)
    }

    fn reaped(&self) -> &AtomicU64 {
        &self.common.reaped
    }
}

/// The record columns of a claim's or an inspection's row.
fn found(row: &PgRow) -> Result<Found, StoreError> {
    let kind: i8 = row.try_get("kind").map_err(decode)?;
    Ok(Found {
        kind: kind as u8,
        token: token_of(row.try_get("token").map_err(decode)?)?,
        fingerprint: digest_of(row.try_get("fingerprint").map_err(decode)?)?,
        status: row.try_get("status").map_err(decode)?,
        response: row.try_get("response").map_err(decode)?,
        lapse_hold: row.try_get("lapse_hold").map_err(decode)?,
        lease_ms: row.try_get("lease_ms").map_err(decode)?,
        expires_ms: row.try_get("expires_ms").map_err(decode)?,
        created_ms: row.try_get("created_ms").map_err(decode)?,
    })
}
