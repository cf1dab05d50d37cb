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
//! [`WAIT_POLL`] (the `poller` module).

use std::str::FromStr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlRow};
use sqlx::Row;
use tokio::task::AbortHandle;

use super::common::pool_options;
use super::found::{digest_of, token_of};
use super::poller::Recheck;
use super::reaper::BATCH;
use super::statements::{bind, Arg, Columns, Statements};
use super::store::{Dialect, SqlStore};
use super::waiters::Interests;
use super::{decode, Call, SqlSettings};
use crate::key::Digest;
use crate::store::{OwnerToken, Store, StoreError};

/// The MySQL- or MariaDB-backed store.
pub type MysqlStore = SqlStore<Mysql>;

/// The schema and routines, `{t}` standing for the table name, statements separated by
/// `-- ;;` lines.
const SCHEMA: &str = include_str!("mysql.sql");

/// A locking read of a missing key takes no gap lock (see the module docs).
const SESSION: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

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

/// MySQL's side of a [`MysqlStore`]: its pool and statements.
pub struct Mysql {
    pool: MySqlPool,
    sql: Statements,
    /// Deletes a record whatever it is (`Store::forget`, for tests).
    forget: String,
    /// Deletes a key's observe-mode count.
    forget_seen: String,
    table: String,
}

impl std::fmt::Debug for MysqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlStore")
            .field("table", &self.dialect().table)
            .finish()
    }
}

/// The statements for table `t`.
fn statements(t: &str) -> Statements {
    let ms = |column: &str| {
        format!("CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), {column}) DIV 1000 AS SIGNED)")
    };
    // Deletes a batch of `table`'s rows whose `column` has passed.
    let reap = |table: &str, column: &str| {
        format!(
            "DELETE FROM {table} WHERE {column} <= UTC_TIMESTAMP(3)
             ORDER BY {column} LIMIT {BATCH}"
        )
    };
    Statements {
        schema: SCHEMA
            .replace("{t}", t)
            .split("\n-- ;;\n")
            .map(str::to_owned)
            .collect(),
        claim: format!("CALL {t}_claim_v1(?, ?, ?, ?, ?, ?, ?, ?)"),
        settle: format!("CALL {t}_settle_v2(?, ?, ?, ?, ?, ?, ?, ?, ?)"),
        renew: format!("CALL {t}_renew_v2(?, ?, ?, ?, ?, ?)"),
        purge: format!("CALL {t}_purge_v2(?, ?, ?, ?)"),
        hit: format!("CALL {t}_hit_v1(?, ?)"),
        issue: format!(
            "INSERT INTO {t} (digest, kind, token, fingerprint, created_at, expires_at)
             VALUES (?, 'T', NULL, ?, UTC_TIMESTAMP(3),
                     UTC_TIMESTAMP(3) + INTERVAL ? * 1000 MICROSECOND)
             ON DUPLICATE KEY UPDATE kind = 'T', token = NULL,
                fingerprint = VALUES(fingerprint), created_at = VALUES(created_at),
                lease_until = NULL, expires_at = VALUES(expires_at),
                lapse_hold = FALSE, issued = FALSE, status = NULL, response = NULL"
        ),
        // A count stands while it expires with its record (see `mysql.sql`).
        inspect: format!(
            "SELECT kind, token, fingerprint, status, response, issued, lapse_hold,
                {} AS lease_ms, {} AS expires_ms,
                CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at) DIV 1000
                    AS SIGNED) AS created_ms,
                (SELECT s.times FROM {t}_seen s
                    WHERE s.digest = ? AND s.expires_at = r.expires_at) AS seen_times,
                (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', s.last_at) DIV 1000
                    AS SIGNED) FROM {t}_seen s
                    WHERE s.digest = ? AND s.expires_at = r.expires_at) AS seen_ms
             FROM {t} r WHERE digest = ? AND expires_at > UTC_TIMESTAMP(3)",
            ms("lease_until"),
            ms("expires_at"),
        ),
        seen: format!("CALL {t}_seen_v1(?)"),
        reap: [
            reap(t, "expires_at"),
            reap(&format!("{t}_hits"), "window_end"),
            reap(&format!("{t}_seen"), "expires_at"),
        ],
    }
}

impl Dialect for Mysql {
    type Row = MySqlRow;

    const NOTIFICATIONS: Option<Duration> = None;

    fn shared(store: Arc<SqlStore<Self>>) -> Store {
        Store::Mysql(store)
    }

    fn open(settings: &SqlSettings) -> Result<Self, StoreError> {
        let options = MySqlConnectOptions::from_str(&settings.url)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let t = &settings.table;
        Ok(Self {
            pool: pool_options(settings, SESSION).connect_lazy_with(options),
            sql: statements(t),
            forget: format!("DELETE FROM {t} WHERE digest = ? AND expires_at > UTC_TIMESTAMP(3)"),
            forget_seen: format!("DELETE FROM {t}_seen WHERE digest = ?"),
            table: t.to_owned(),
        })
    }

    fn watch(&self, store: Weak<MysqlStore>, interests: &Arc<Interests>) -> AbortHandle {
        let poller = super::poller::poll(store, Arc::clone(interests), WAIT_POLL);
        tokio::spawn(poller).abort_handle()
    }

    fn statements(&self) -> &Statements {
        &self.sql
    }

    fn run<'a>(&'a self, sql: &'a str) -> Call<'a, ()> {
        Box::pin(async move { sqlx::raw_sql(sql).execute(&self.pool).await.map(|_| ()) })
    }

    fn fetch<'a>(&'a self, sql: &'a str, args: &'a [Arg<'a>]) -> Call<'a, Vec<MySqlRow>> {
        Box::pin(bind(sql, args, kind).fetch_all(&self.pool))
    }

    fn execute<'a>(&'a self, sql: &'a str, args: &'a [Arg<'a>]) -> Call<'a, u64> {
        let query = bind(sql, args, kind);
        Box::pin(async move { Ok(query.execute(&self.pool).await?.rows_affected()) })
    }

    fn statement_limit(&self) -> Call<'_, Option<u64>> {
        Box::pin(async move {
            let limit: i64 = sqlx::query_scalar("SELECT CAST(@@max_allowed_packet AS SIGNED)")
                .fetch_one(&self.pool)
                .await?;
            Ok(u64::try_from(limit).ok())
        })
    }

    fn outcome(row: &MySqlRow) -> Result<i64, StoreError> {
        row.try_get(0).map_err(decode)
    }

    fn kind(row: &MySqlRow, at: usize) -> Result<u8, StoreError> {
        let kind: Vec<u8> = row.try_get(at).map_err(decode)?;
        Ok(kind.first().copied().unwrap_or(0))
    }

    async fn forget(store: &MysqlStore, key: Digest) -> Result<bool, StoreError> {
        let params = [Arg::Bytes(&key.0)];
        let removed = store.execute(&store.dialect().forget, &params).await?;
        store.execute(&store.dialect().forget_seen, &params).await?;
        Ok(removed > 0)
    }
}

impl Recheck for MysqlStore {
    async fn claimed(&self, keys: &[Digest]) -> Result<Vec<(Digest, OwnerToken)>, StoreError> {
        let marks = vec!["?"; keys.len()].join(", ");
        let sql = format!(
            "SELECT digest, token FROM {} WHERE digest IN ({marks}) AND kind = 'I'
             AND expires_at > UTC_TIMESTAMP(3)",
            self.dialect().table
        );
        let params: Vec<Arg<'_>> = keys.iter().map(|key| Arg::Bytes(&key.0)).collect();
        let rows = self.fetch(&sql, &params).await?;
        rows.iter()
            .map(|row| {
                let key = digest_of(row.bytes(0)?)?;
                let owner = token_of(row.bytes(1)?)?;
                Ok((key, owner.unwrap_or(OwnerToken(0))))
            })
            .collect()
    }
}

/// A record's kind as its `CHAR(1)` column takes it (`None`: delete, or, to the purge
/// routine, any record). A letter no record has stays one.
fn kind(kind: Option<u8>) -> Option<&'static str> {
    kind.map(|k| match k {
        b'D' => "D",
        b'N' => "N",
        b'U' => "U",
        b'F' => "F",
        b'T' => "T",
        b'I' => "I",
        _ => "?",
    })
}
