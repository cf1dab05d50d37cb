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
//! request nobody waits on never pays for one. The `listener` module hears them.

use std::str::FromStr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgRow};
use sqlx::Row;
use tokio::task::AbortHandle;

use super::common::pool_options;
use super::reaper::BATCH;
use super::statements::{bind, Arg, Columns, Statements};
use super::store::{Dialect, SqlStore};
use super::waiters::Interests;
use super::{decode, Call, SqlSettings};
use crate::key::Digest;
use crate::store::{Store, StoreError};

/// The PostgreSQL-backed store.
pub type PostgresStore = SqlStore<Postgres>;

/// The schema and routines, `{t}` standing for the table name.
const SCHEMA: &str = include_str!("postgres.sql");

/// Serialises schema creation between replicas starting together (`pg_advisory_xact_lock`).
const MIGRATION_LOCK: i64 = 0x1de3_6a7e;

/// Each statement must see what committed before it (see the module docs), whatever the
/// database's default isolation is.
const SESSION: &str = "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED";

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

/// PostgreSQL's side of a [`PostgresStore`]: its pool and statements.
pub struct Postgres {
    pool: PgPool,
    /// The `LISTEN` connection's own pool of one, beside `pool` (`listener::pool`).
    listen: PgPool,
    sql: Statements,
    /// Deletes a record whatever it is, and its count, notifying its waiters; answers
    /// whether a live one was there (`Store::forget`, for tests).
    forget: String,
    /// The channel settlements are notified on.
    channel: String,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("channel", &self.dialect().channel)
            .finish()
    }
}

/// The statements for table `t`.
fn statements(t: &str) -> Statements {
    let found = "kind, token, fingerprint, status, response, issued, lapse_hold,
        (extract(epoch FROM lease_until - now()) * 1000)::bigint AS lease_ms,
        (extract(epoch FROM expires_at - now()) * 1000)::bigint AS expires_ms,
        (extract(epoch FROM created_at) * 1000)::bigint AS created_ms";
    // Deletes a batch of `table`'s rows whose `column` has passed, skipping the rows
    // another replica's reaper holds.
    let reap = |table: &str, column: &str| {
        format!(
            "DELETE FROM {table} WHERE digest IN (
                SELECT digest FROM {table} WHERE {column} <= now()
                LIMIT {BATCH} FOR UPDATE SKIP LOCKED)"
        )
    };
    Statements {
        schema: vec![format!(
            "SELECT pg_advisory_xact_lock({MIGRATION_LOCK});\n{}",
            SCHEMA.replace("{t}", t)
        )],
        claim: format!("SELECT * FROM {t}_claim_v1($1, $2, $3, $4, $5, $6, $7, $8, $9)"),
        settle: format!("SELECT {t}_settle_v2($1, $2, $3, $4, $5, $6, $7, $8, $9)::bigint"),
        renew: format!("SELECT {t}_renew_v2($1, $2, $3, $4, $5, $6)::bigint"),
        purge: format!("SELECT {t}_purge_v2($1, $2, $3, $4)::bigint"),
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
        // A count stands while it expires with its record (see `postgres.sql`).
        inspect: format!(
            "SELECT {found},
                (SELECT s.times FROM {t}_seen s
                    WHERE s.digest = $1 AND s.expires_at = r.expires_at) AS seen_times,
                (SELECT (extract(epoch FROM s.last_at) * 1000)::bigint FROM {t}_seen s
                    WHERE s.digest = $2 AND s.expires_at = r.expires_at) AS seen_ms
             FROM {t} r WHERE digest = $3 AND expires_at > now()"
        ),
        seen: format!("SELECT {t}_seen_v1($1)"),
        reap: [
            reap(t, "expires_at"),
            reap(&format!("{t}_hits"), "window_end"),
            reap(&format!("{t}_seen"), "expires_at"),
        ],
    }
}

impl Dialect for Postgres {
    type Row = PgRow;

    const NOTIFICATIONS: Option<Duration> = Some(FALLBACK_RECHECK);

    fn shared(store: Arc<SqlStore<Self>>) -> Store {
        Store::Postgres(store)
    }

    fn open(settings: &SqlSettings) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(&settings.url)
            .map_err(|e| StoreError::Unavailable(e.to_string()))?
            .application_name("idemgate");
        let t = &settings.table;
        Ok(Self {
            listen: super::listener::pool(options.clone(), settings.timeout),
            pool: pool_options(settings, SESSION).connect_lazy_with(options),
            sql: statements(t),
            forget: format!(
                "WITH gone AS (DELETE FROM {t} WHERE digest = $1 AND expires_at > now()
                    RETURNING 1),
                 seen AS (DELETE FROM {t}_seen WHERE digest = $1)
                 SELECT count(*) FROM gone, pg_notify('{t}_done', $2)"
            ),
            channel: format!("{t}_done"),
        })
    }

    fn watch(&self, _: Weak<SqlStore<Self>>, interests: &Arc<Interests>) -> AbortHandle {
        let listener = super::listener::listen(
            self.listen.clone(),
            self.channel.clone(),
            Arc::clone(interests),
        );
        tokio::spawn(listener).abort_handle()
    }

    fn statements(&self) -> &Statements {
        &self.sql
    }

    fn run<'a>(&'a self, sql: &'a str) -> Call<'a, ()> {
        Box::pin(async move { sqlx::raw_sql(sql).execute(&self.pool).await.map(|_| ()) })
    }

    fn fetch<'a>(&'a self, sql: &'a str, args: &'a [Arg<'a>]) -> Call<'a, Vec<PgRow>> {
        Box::pin(bind(sql, args, kind).fetch_all(&self.pool))
    }

    fn execute<'a>(&'a self, sql: &'a str, args: &'a [Arg<'a>]) -> Call<'a, u64> {
        let query = bind(sql, args, kind);
        Box::pin(async move { Ok(query.execute(&self.pool).await?.rows_affected()) })
    }

    fn statement_limit(&self) -> Call<'_, Option<u64>> {
        // A `bytea` holds up to 1 GB, far past any answer kept.
        Box::pin(async { Ok(None) })
    }

    fn outcome(row: &PgRow) -> Result<i64, StoreError> {
        let outcome: i16 = row.try_get(0).map_err(decode)?;
        Ok(outcome.into())
    }

    fn kind(row: &PgRow, at: usize) -> Result<u8, StoreError> {
        let kind: i8 = row.try_get(at).map_err(decode)?;
        Ok(kind as u8)
    }

    async fn forget(store: &PostgresStore, key: Digest) -> Result<bool, StoreError> {
        let hex = hex::encode(key.0);
        let params = [Arg::Bytes(&key.0), Arg::Text(&hex)];
        let row = store.fetch_one(&store.dialect().forget, &params).await?;
        Ok(row.int(0)? > 0)
    }
}

/// A record's kind as its `"char"` column takes it.
fn kind(kind: Option<u8>) -> Option<i8> {
    kind.map(|k| k as i8)
}
