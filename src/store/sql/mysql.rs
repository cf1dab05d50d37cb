//! The MySQL / MariaDB store. Claims, settlements, renewals and hits are stored procedures
//! (`mysql.sql`, created beside the table when missing), each one `CALL`. Inside them each
//! statement runs in its own transaction (or a short explicit one around a locking read)
//! and reads what committed before it: a claim looks, writes only if the row is still
//! what it looked at, and otherwise looks again, so of any number of concurrent claimers
//! exactly one owns a free key. Connections use READ COMMITTED, so a locking read of a
//! missing key takes no gap lock that concurrent claims of neighbouring keys would
//! deadlock on.
//!
//! MySQL has no notifications: a duplicate that waits is woken by its owner's settlement
//! when both are in this process, and otherwise by a re-check of its key at most every
//! [`WAIT_POLL`] ([`super::poller`]).

use std::str::FromStr;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::Row;

use super::common::Common;
use super::found::{decide, digest_of, seen_of, token_of, Decided, Found, Look};
use super::poller::Recheck;
use super::reaper::{Reap, BATCH};
use super::waiters::Interests;
use super::{decode, millis, Call, SqlSettings, Written};
use crate::key::Digest;
use crate::store::renewals::{self, HeldClaim, Renewals};
use crate::store::{
    Claim, ClaimArgs, ClaimMode, KeyInfo, Lapse, OwnerToken, Ownership, RawClaim, Settled,
    Settlement, StoreError, Waiter,
};

/// The schema and routines, `{t}` standing for the table name, statements separated by
/// `-- ;;` lines.
const SCHEMA: &str = include_str!("mysql.sql");

/// How often, at most, a waiting duplicate's key is looked at again when its owner runs in
/// another process (MySQL has no notifications).
pub const WAIT_POLL: Duration = Duration::from_millis(100);

/// Checks a `mysql://` URL the way the store will read it.
pub fn check_url(url: &str) -> Result<(), String> {
    let scheme = url.split_once("://").map(|(s, _)| s);
    if !matches!(scheme, Some("mysql" | "mariadb")) {
        return Err("expected a mysql:// or mariadb:// URL".into());
    }
    MySqlConnectOptions::from_str(url)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The statements, with the table name in place.
struct Statements {
    schema: Vec<String>,
    claim: String,
    settle: String,
    renew: String,
    hit: String,
    issue: String,
    inspect: String,
    remove: String,
    remove_seen: String,
    reap: String,
    reap_hits: String,
    reap_seen: String,
    seen: String,
    made: String,
    table: String,
}

impl Statements {
    fn new(t: &str) -> Self {
        let ms = |column: &str| {
            format!(
                "CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), {column}) DIV 1000 AS SIGNED)"
            )
        };
        Self {
            schema: SCHEMA
                .replace("{t}", t)
                .split("\n-- ;;\n")
                .map(str::to_owned)
                .collect(),
            claim: format!("CALL {t}_claim_v1(?, ?, ?, ?, ?, ?, ?, ?)"),
            settle: format!("CALL {t}_settle_v1(?, ?, ?, ?, ?, ?, ?, ?, ?)"),
            renew: format!("CALL {t}_renew_v1(?, ?, ?, ?, ?, ?)"),
            hit: format!("CALL {t}_hit_v1(?, ?)"),
            issue: format!(
                "INSERT INTO {t} (digest, kind, token, fingerprint, created_at, expires_at)
                 VALUES (?, 'T', NULL, ?, UTC_TIMESTAMP(3),
                         UTC_TIMESTAMP(3) + INTERVAL ? MICROSECOND)
                 ON DUPLICATE KEY UPDATE kind = 'T', token = NULL,
                    fingerprint = VALUES(fingerprint), created_at = VALUES(created_at),
                    lease_until = NULL, expires_at = VALUES(expires_at),
                    lapse_hold = FALSE, issued = FALSE, status = NULL, response = NULL"
            ),
            inspect: format!(
                "SELECT kind, token, fingerprint, status, response, issued, lapse_hold,
                    {} AS lease_ms, {} AS expires_ms,
                    CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at) DIV 1000
                        AS SIGNED) AS created_ms,
                    (SELECT s.times FROM {t}_seen s
                        WHERE s.digest = ? AND s.expires_at > UTC_TIMESTAMP(3)) AS seen_times,
                    (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', s.last_at) DIV 1000
                        AS SIGNED) FROM {t}_seen s
                        WHERE s.digest = ? AND s.expires_at > UTC_TIMESTAMP(3)) AS seen_ms
                 FROM {t} WHERE digest = ? AND expires_at > UTC_TIMESTAMP(3)",
                ms("lease_until"),
                ms("expires_at"),
            ),
            remove: format!("DELETE FROM {t} WHERE digest = ? AND expires_at > UTC_TIMESTAMP(3)"),
            remove_seen: format!("DELETE FROM {t}_seen WHERE digest = ?"),
            // A count restarts with a key's new record: the old one's has expired.
            seen: format!(
                "INSERT INTO {t}_seen (digest, times, last_at, expires_at)
                 SELECT digest, 2, UTC_TIMESTAMP(3), expires_at FROM {t}
                    WHERE digest = ? AND expires_at > UTC_TIMESTAMP(3)
                 ON DUPLICATE KEY UPDATE
                    times = IF({t}_seen.expires_at > UTC_TIMESTAMP(3), {t}_seen.times + 1, 2),
                    last_at = UTC_TIMESTAMP(3), expires_at = VALUES(expires_at)"
            ),
            made: format!(
                "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at) DIV 1000
                    AS SIGNED) FROM {t}
                 WHERE digest = ? AND kind <> 'T' AND expires_at > UTC_TIMESTAMP(3)"
            ),
            reap: format!(
                "DELETE FROM {t} WHERE expires_at <= UTC_TIMESTAMP(3)
                 ORDER BY expires_at LIMIT {BATCH}"
            ),
            reap_hits: format!(
                "DELETE FROM {t}_hits WHERE window_end <= UTC_TIMESTAMP(3)
                 ORDER BY window_end LIMIT {BATCH}"
            ),
            reap_seen: format!(
                "DELETE FROM {t}_seen WHERE expires_at <= UTC_TIMESTAMP(3)
                 ORDER BY expires_at LIMIT {BATCH}"
            ),
            table: t.to_owned(),
        }
    }

    /// The re-check of `n` keys: those that are a live claim, with the owner.
    fn claimed(&self, n: usize) -> String {
        let marks = vec!["?"; n].join(", ");
        format!(
            "SELECT digest, token FROM {} WHERE digest IN ({marks}) AND kind = 'I'
             AND expires_at > UTC_TIMESTAMP(3)",
            self.table
        )
    }
}

/// The MySQL- or MariaDB-backed store.
pub struct MysqlStore {
    pool: MySqlPool,
    sql: Statements,
    common: Common,
}

impl std::fmt::Debug for MysqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlStore")
            .field("table", &self.sql.table)
            .finish()
    }
}

impl MysqlStore {
    /// Sets up the pool without waiting for the database (see
    /// [`super::postgres::PostgresStore::connect`]).
    pub fn connect(settings: &SqlSettings) -> Result<Arc<Self>, StoreError> {
        super::valid_table(&settings.table).map_err(StoreError::Unavailable)?;
        let options = MySqlConnectOptions::from_str(&settings.url)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let pool = MySqlPoolOptions::new()
            .max_connections(settings.max_connections.max(1))
            .acquire_timeout(settings.timeout)
            .test_before_acquire(false)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .execute(conn)
                        .await
                        .map(|_| ())
                })
            })
            .connect_lazy_with(options);
        let interests: Arc<Interests> = Arc::default();
        let store = Arc::new_cyclic(|weak: &std::sync::Weak<Self>| {
            let reaper = tokio::spawn(super::reaper::reap(weak.clone(), settings.reap_every));
            let poller = tokio::spawn(super::poller::poll(
                weak.clone(),
                Arc::clone(&interests),
                WAIT_POLL,
            ));
            Self {
                pool,
                sql: Statements::new(&settings.table),
                common: Common::new(
                    settings,
                    interests,
                    vec![reaper.abort_handle(), poller.abort_handle()],
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

    /// Creates the tables and routines when missing (once per store).
    async fn ready_schema(&self) -> Result<(), StoreError> {
        self.common.schema(|| self.migrate()).await
    }

    /// One attempt at creating what is missing, a statement at a time. Replicas starting
    /// together may both try: MySQL serialises the DDL, and `IF NOT EXISTS` makes the
    /// second a no-op.
    fn migrate(&self) -> Call<'_, ()> {
        Box::pin(async move {
            for statement in &self.sql.schema {
                sqlx::raw_sql(statement).execute(&self.pool).await?;
            }
            Ok(())
        })
    }

    /// One claim procedure call.
    async fn look(&self, args: &ClaimArgs, token: OwnerToken) -> Result<Look, StoreError> {
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
                    .fetch_one(&self.pool)
            })
            .await?;
        let outcome: i64 = row.try_get(0).map_err(decode)?;
        Ok(match outcome {
            0 => Look::Claimed,
            1 => Look::Free,
            _ => Look::Found(found(&row, 1)?),
        })
    }

    /// See [`crate::store::Store::claim_with`].
    pub(crate) async fn claim(&self, args: &ClaimArgs) -> Result<RawClaim, StoreError> {
        let token = OwnerToken::random();
        match decide(args, token, self.look(args, token).await?)? {
            Decided::Claim(claim) => Ok(claim),
            Decided::InFlight { .. } if !args.waits => {
                Ok(RawClaim::Other(Claim::InFlight(Waiter::unwatched())))
            }
            Decided::InFlight { owner, recheck } => {
                // The poller's next look compares the row with this owner: a settlement
                // since the claim looked wakes the waiter then.
                let (signal, interest) = self.common.interests.join(args.key, owner);
                Ok(RawClaim::Other(Claim::InFlight(Waiter::watching(
                    signal,
                    Instant::now() + recheck,
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
                    .bind(millis(ttl).saturating_mul(1000))
                    .execute(&self.pool)
            })
            .await
            .map(|_| ())
    }

    /// See [`crate::store::Store::hit`].
    pub async fn hit(&self, key: Digest, window: Duration) -> Result<u64, StoreError> {
        self.ready_schema().await?;
        let row = self
            .common
            .call(|| {
                sqlx::query(&self.sql.hit)
                    .bind(&key.0[..])
                    .bind(millis(window))
                    .fetch_one(&self.pool)
            })
            .await?;
        let hits: i64 = row.try_get(0).map_err(decode)?;
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
        let row = self
            .common
            .call(|| {
                sqlx::query(&self.sql.settle)
                    .bind(&owned.key.0[..])
                    .bind(&token[..])
                    .bind(&owned.fingerprint.0[..])
                    .bind(written.kind_str())
                    .bind(written.ttl_ms)
                    .bind(written.status)
                    .bind(written.response)
                    .bind(written.issued)
                    .bind(settlement.writes_back())
                    .fetch_one(&self.pool)
            })
            .await?;
        let code: i64 = row.try_get(0).map_err(decode)?;
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
                    .bind(&key.0[..])
                    .bind(&key.0[..])
                    .fetch_optional(&self.pool)
            })
            .await?;
        row.map(|row| {
            let info = found(&row, 0)?.info()?;
            let times: Option<i64> = row.try_get(10).map_err(decode)?;
            let last: Option<i64> = row.try_get(11).map_err(decode)?;
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
        self.common
            .call(|| {
                sqlx::query(&self.sql.seen)
                    .bind(&key.0[..])
                    .execute(&self.pool)
            })
            .await?;
        let made: Option<i64> = self
            .common
            .call(|| {
                sqlx::query_scalar(&self.sql.made)
                    .bind(&key.0[..])
                    .fetch_optional(&self.pool)
            })
            .await?;
        Ok(made.map(|ms| UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)))
    }

    /// See [`crate::store::Store::remove`].
    pub async fn remove(&self, key: Digest) -> Result<bool, StoreError> {
        self.ready_schema().await?;
        let done = self
            .common
            .call(|| {
                sqlx::query(&self.sql.remove)
                    .bind(&key.0[..])
                    .execute(&self.pool)
            })
            .await?;
        self.common
            .call(|| {
                sqlx::query(&self.sql.remove_seen)
                    .bind(&key.0[..])
                    .execute(&self.pool)
            })
            .await?;
        self.common.interests.wake(&key);
        Ok(done.rows_affected() > 0)
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

impl renewals::Renew for MysqlStore {
    async fn renew(&self, claim: &HeldClaim) -> Result<renewals::Renewed, StoreError> {
        self.ready_schema().await?;
        let token = claim.token.0.to_be_bytes();
        let row = self
            .common
            .call(|| {
                sqlx::query(&self.sql.renew)
                    .bind(&claim.key.0[..])
                    .bind(&token[..])
                    .bind(&claim.fingerprint.0[..])
                    .bind(millis(claim.lease))
                    .bind(millis(claim.lapse.span()))
                    .bind(matches!(claim.lapse, Lapse::Hold { .. }))
                    .fetch_one(&self.pool)
            })
            .await?;
        let code: i64 = row.try_get(0).map_err(decode)?;
        Common::renewed(code)
    }
}

impl Reap for MysqlStore {
    async fn reap_batch(&self) -> Result<u64, StoreError> {
        self.ready_schema().await?;
        let mut total = 0;
        for statement in [&self.sql.reap, &self.sql.reap_hits, &self.sql.reap_seen] {
            let done = self
                .common
                .call(|| sqlx::query(statement).execute(&self.pool))
                .await?;
            total += done.rows_affected();
        }
        Ok(total)
    }

    fn reaped(&self) -> &AtomicU64 {
        &self.common.reaped
    }
}

impl Recheck for MysqlStore {
    async fn claimed(&self, keys: &[Digest]) -> Result<Vec<(Digest, OwnerToken)>, StoreError> {
        let sql = self.sql.claimed(keys.len());
        let rows = self
            .common
            .call(|| {
                let mut query = sqlx::query(&sql);
                for key in keys {
                    query = query.bind(&key.0[..]);
                }
                query.fetch_all(&self.pool)
            })
            .await?;
        rows.iter()
            .map(|row| {
                let key = digest_of(row.try_get(0).map_err(decode)?)?;
                let owner = token_of(row.try_get(1).map_err(decode)?)?;
                Ok((key, owner.unwrap_or(OwnerToken(0))))
            })
            .collect()
    }
}

/// The record columns of a claim's or an inspection's row, from column `at` on. By
/// position: the rows of a prepared `CALL` come without column names (their shape is not
/// known when the statement is prepared).
fn found(row: &MySqlRow, at: usize) -> Result<Found, StoreError> {
    let kind: Vec<u8> = row.try_get(at).map_err(decode)?;
    Ok(Found {
        kind: kind.first().copied().unwrap_or(0),
        token: token_of(row.try_get(at + 1).map_err(decode)?)?,
        fingerprint: digest_of(row.try_get(at + 2).map_err(decode)?)?,
        status: row.try_get(at + 3).map_err(decode)?,
        response: row.try_get(at + 4).map_err(decode)?,
        lapse_hold: row.try_get(at + 6).map_err(decode)?,
        lease_ms: row.try_get(at + 7).map_err(decode)?,
        expires_ms: row.try_get(at + 8).map_err(decode)?,
        created_ms: row.try_get(at + 9).map_err(decode)?,
    })
}
