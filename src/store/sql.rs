//! The SQL stores: a dedupe table with a unique key on the digest, in PostgreSQL
//! ([`postgres`]) or MySQL/MariaDB ([`mysql`]), shared by every replica and as durable as
//! the database (an acknowledged claim or answer survives a restart or a failover to a
//! synchronous replica).
//!
//! One row per key. Every read-decide-write runs inside the database, as one call of a
//! routine idemgate creates beside its table (a PL/pgSQL function, a MySQL procedure), so
//! a first-seen request costs two statements (claim, settle) and a replay one. Leases and
//! expiry use the database's clock (`now()`), never a replica's. An in-flight row carries
//! its lease (`lease_until`, moved on by the owner's renewals, `store::renewals`) and
//! its end (`expires_at` = lease + the lapse span), so, as on Redis, the row itself says
//! whether its claim lapsed. Expired rows count as gone at once; a reaper (`reaper`)
//! deletes them in small batches.
//!
//! Duplicates wait for a settlement: on PostgreSQL by `LISTEN`/`NOTIFY` (`listener`);
//! on MySQL, which has no notifications, by a re-check of every waited-on key at most
//! every [`mysql::WAIT_POLL`] (`poller`). On both, an owner's settlement wakes the
//! waiters in its own process at once (`waiters`).
//!
//! The store is written once ([`SqlStore`], module `store`), over the `Dialect` of its
//! database: [`postgres`] and [`mysql`] hold only what differs (their SQL, their pool, how
//! waiters hear of settlements). `statements` states each routine's parameters and
//! answer columns, `found` what a claim's answer means, `common` the bounds and state
//! every call shares.

mod common;
mod found;
mod listener;
pub mod mysql;
mod poller;
pub mod postgres;
mod reaper;
mod statements;
mod store;
mod waiters;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::{Settlement, StoreError};

pub use store::SqlStore;
pub use waiters::Interest;

/// Where and how to reach a PostgreSQL or MySQL/MariaDB database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlSettings {
    /// `postgres://user:password@host:port/db?sslmode=…` or `mysql://…`.
    pub url: String,
    /// The dedupe table (its indexes, routines and the `_hits` table are named after it).
    pub table: String,
    /// Longest wait for one store operation (a free connection included) before it counts
    /// as a store error.
    pub timeout: Duration,
    /// Connections in the pool statements run on (PostgreSQL opens one more, outside it,
    /// for `LISTEN`).
    pub max_connections: u32,
    /// How often the reaper deletes expired rows.
    pub reap_every: Duration,
}

impl SqlSettings {
    /// Settings for `url` with the defaults of everything else.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            table: DEFAULT_TABLE.to_owned(),
            timeout: Duration::from_secs(2),
            max_connections: 16,
            reap_every: Duration::from_secs(10),
        }
    }
}

/// The table idemgate uses unless told otherwise.
pub const DEFAULT_TABLE: &str = "idemgate_keys";

/// Whether `table` is a name idemgate can use as it is in its SQL (lower-case letters,
/// digits and `_`, starting with a letter or `_`, short enough for the names derived from
/// it): it is written into statements, never quoted or escaped.
pub fn valid_table(table: &str) -> Result<(), String> {
    let mut chars = table.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    if !first_ok
        || table.len() > 40
        || !table
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return Err(format!(
            "{table:?} is not a table name idemgate uses: lower-case letters, digits and `_`, \
             starting with a letter or `_`, at most 40 characters"
        ));
    }
    Ok(())
}

/// What a settlement writes: the record's kind (`None`: the row is deleted), how long it
/// lives, and its columns.
pub(super) struct Written<'a> {
    kind: Option<u8>,
    ttl_ms: i64,
    status: Option<i16>,
    response: Option<&'a [u8]>,
    issued: bool,
}

impl<'a> Written<'a> {
    fn of(settlement: &'a Settlement) -> Self {
        let ms = |ttl: Duration| ttl.as_millis().clamp(1, i64::MAX as u128) as i64;
        let delete = Self {
            kind: None,
            ttl_ms: 0,
            status: None,
            response: None,
            issued: false,
        };
        match settlement {
            Settlement::Done { ttl, .. }
            | Settlement::NotStored { ttl, .. }
            | Settlement::Unknown { ttl }
                if ttl.is_zero() =>
            {
                delete
            }
            Settlement::Done { response, ttl } => Self {
                kind: Some(b'D'),
                ttl_ms: ms(*ttl),
                response: Some(response.encode()),
                ..delete
            },
            Settlement::NotStored { status, ttl } => Self {
                kind: Some(b'N'),
                ttl_ms: ms(*ttl),
                status: Some(status.as_u16() as i16),
                ..delete
            },
            Settlement::Unknown { ttl } => Self {
                kind: Some(b'U'),
                ttl_ms: ms(*ttl),
                ..delete
            },
            Settlement::Failed {
                response,
                linger,
                reissue,
            } => Self {
                kind: Some(b'F'),
                ttl_ms: ms((*linger).max(reissue.unwrap_or_default())),
                response: Some(response.encode()),
                issued: reissue.is_some(),
                ..delete
            },
            Settlement::Release { reissue: Some(ttl) } => Self {
                kind: Some(b'T'),
                ttl_ms: ms(*ttl),
                ..delete
            },
            Settlement::Release { reissue: None } => delete,
        }
    }
}

/// At most this many tries of one operation: each may find another pooled connection the
/// database dropped (a restart closes them all, and each is found out on use).
fn max_tries(max_connections: u32) -> u32 {
    max_connections.saturating_add(2)
}

/// Whether an error says the statement did not run to completion on a healthy connection
/// and may be sent again: every routine is safe to repeat (a repeated claim recognises its
/// own token, the others are fenced by it).
fn transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(e) => matches!(
            e.code().as_deref(),
            // Deadlock or serialization failure (both databases); PostgreSQL shutting
            // down or starting up, or the connection gone.
            Some("40001" | "40P01" | "57P01" | "57P02" | "57P03" | "08000" | "08003" | "08006")
        ),
        _ => false,
    }
}

/// Whether an error is the database refusing the statement itself, as it will every time
/// it is sent: a value it will not take (a trigger or constraint that rejects it, SQLSTATE
/// classes 22, 23, 44, 45 for MySQL's `SIGNAL`, and PL/pgSQL's `P0`), a row or statement
/// too large (classes 42, as MySQL's error 1118 for a row over a tenth of its redo log, and
/// 54; MySQL's `max_allowed_packet`). The routines' own "kept racing" errors (a row that
/// changed under them 20 times) are no refusal: sent again, they may land.
fn refused(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(e) = error else {
        return false;
    };
    if e.message().starts_with("idemgate:") {
        return false;
    }
    let class = e
        .code()
        .map(|code| code.chars().take(2).collect::<String>());
    matches!(
        class.as_deref(),
        Some("22" | "23" | "42" | "44" | "45" | "54" | "P0")
    ) || e.message().contains("max_allowed_packet")
}

/// One database call, boxed: sqlx's futures hold borrows that the compiler cannot prove
/// `Send` for every lifetime once they sit inside a generic retry loop, and the proxy's
/// futures must be `Send`.
type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, sqlx::Error>> + Send + 'a>>;

/// Runs `op` under the store timeout, again on a transient error (a connection the
/// database dropped), at most `tries` times.
async fn bounded<'a, T>(
    timeout: Duration,
    tries: u32,
    op: impl Fn() -> Call<'a, T>,
) -> Result<T, StoreError> {
    match refusable(timeout, tries, op).await? {
        Ok(value) => Ok(value),
        Err(refusal) => Err(StoreError::Unavailable(refusal)),
    }
}

/// [`bounded`], telling the database's refusal of the statement (`Ok(Err(_))`, see
/// [`refused`]) from a failure to get an answer.
async fn refusable<'a, T>(
    timeout: Duration,
    tries: u32,
    op: impl Fn() -> Call<'a, T>,
) -> Result<Result<T, String>, StoreError> {
    let attempts = async {
        let mut tried = 1;
        loop {
            match op().await {
                Err(e) if tried < tries && transient(&e) => {
                    tracing::debug!(error = %e, "database connection dropped; trying again");
                    tried += 1;
                }
                other => return other,
            }
        }
    };
    match tokio::time::timeout(timeout, attempts).await {
        Ok(Ok(value)) => Ok(Ok(value)),
        Ok(Err(e)) if refused(&e) => Ok(Err(e.to_string())),
        Ok(Err(e)) => Err(StoreError::Unavailable(e.to_string())),
        Err(_) => Err(StoreError::Unavailable(format!(
            "no answer from the database within {timeout:?}"
        ))),
    }
}

/// `d` in whole milliseconds, as the routines take them (MySQL multiplies them by 1000).
fn millis(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128 / 1000) as i64
}

/// A row that is not what the statement returns.
fn decode(e: sqlx::Error) -> StoreError {
    StoreError::Unavailable(format!("unexpected answer from the database: {e}"))
}

/// `ms` (the database's count of milliseconds from now) as a duration, negative as zero.
fn ms(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        for ok in ["idemgate_keys", "_t", "keys2"] {
            assert!(valid_table(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Keys",
            "2keys",
            "a-b",
            "a;drop",
            "x\"y",
            &"k".repeat(41),
        ] {
            assert!(valid_table(bad).is_err(), "{bad}");
        }
    }
}
