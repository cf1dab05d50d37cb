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

use super::NotKept;

use super::{token_left, FailureKept, Settlement, StoreError};

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
            } => match FailureKept::of(*linger, token_left(*reissue)) {
                FailureKept::Token { ttl } => Self {
                    kind: Some(b'T'),
                    ttl_ms: ms(ttl),
                    ..delete
                },
                FailureKept::Record { ttl, issued } => Self {
                    kind: Some(b'F'),
                    ttl_ms: ms(ttl),
                    response: Some(response.encode()),
                    issued,
                    ..delete
                },
            },
            Settlement::Release { reissue } => match token_left(*reissue) {
                Some(ttl) => Self {
                    kind: Some(b'T'),
                    ttl_ms: ms(ttl),
                    ..delete
                },
                None => delete,
            },
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

/// The database's refusal of a statement, as it will refuse it every time it is sent:
/// for a limit on size, or a rule of its own (see [`refusal`]), with its error.
#[derive(Debug)]
pub(super) struct Refusal {
    /// Why: what the answer left out for it is counted as.
    pub(super) why: NotKept,
    /// The database's error, for the log.
    pub(super) error: String,
}

/// Whether, and why, an error is the database refusing the statement itself (see
/// [`refusal`]). The routines' own "kept racing" errors (a row that changed under them 20
/// times) are no refusal: sent again, they may land.
fn refused(error: &sqlx::Error) -> Option<NotKept> {
    let sqlx::Error::Database(e) = error else {
        return None;
    };
    if e.message().starts_with("idemgate:") {
        return None;
    }
    let number = e
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|my| my.number());
    refusal(number, e.code().as_deref())
}

/// Whether an error, by its MySQL/MariaDB error number (`None` on PostgreSQL) and its
/// SQLSTATE, is the database refusing the statement itself, and why: a limit on size
/// ([`NotKept::TooLarge`], met every time by an answer that large, as `max_answer` is) or
/// a rule of its own ([`NotKept::Refused`], counted as lost for an operator to hear of). A
/// refusal is recorded as "executed, answer not stored", so only an error that no repeat
/// gets past counts: one that a retry may get past (a connection limit, a lock, a
/// failover) must not.
fn refusal(number: Option<u16>, code: Option<&str>) -> Option<NotKept> {
    match number {
        Some(number) => mysql_refusal(number, code),
        None => postgres_refusal(code),
    }
}

/// MySQL and MariaDB, by error number: their SQLSTATE is too coarse to go by, 42000 being
/// a row too large (1118) but also a user over `max_user_connections` (1203) or its hourly
/// limits (1226), or no access to the database (1044, 1049), all raised opening a
/// connection, which sqlx does not try again.
fn mysql_refusal(number: u16, state: Option<&str>) -> Option<NotKept> {
    match number {
        // A row over a tenth of the redo log; a statement or result over `max_allowed_packet`.
        1118 | 1153 | 1301 => Some(NotKept::TooLarge),
        // A trigger's `SIGNAL SQLSTATE '45000'`.
        1644
        // A value the column or a constraint will not take: too long, NULL, a duplicate, a
        // foreign key, out of range, not of the column's type, a check constraint (MySQL).
        | 1406 | 1048 | 1364 | 1062 | 1169 | 1586 | 1451 | 1452 | 1264 | 1690 | 1292
        | 1366 | 3819 => Some(NotKept::Refused),
        // MariaDB's check constraint; MySQL gives the number to an unrelated error.
        4025 if state == Some("23000") => Some(NotKept::Refused),
        _ => None,
    }
}

/// PostgreSQL, by SQLSTATE class: a value it will not take (22, and 23 for a constraint, 44
/// for a view's check option), a statement or row over a limit (54), a trigger's `RAISE`
/// (P0). None of them is raised opening a connection or by the server's state (28, 08,
/// 53, 57, 25 for a standby); class 42 is not taken either, as its statements are fixed by
/// an operator (a routine missing mid-deploy, a revoked privilege, which 42501 also is on
/// connecting without CONNECT), after which a repeat lands.
fn postgres_refusal(code: Option<&str>) -> Option<NotKept> {
    match code.and_then(|code| code.get(..2))? {
        "54" => Some(NotKept::TooLarge),
        "22" | "23" | "44" | "P0" => Some(NotKept::Refused),
        _ => None,
    }
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
        Err(refusal) => Err(StoreError::Unavailable(refusal.error)),
    }
}

/// [`bounded`], telling the database's refusal of the statement (`Ok(Err(_))`, see
/// [`refused`]) from a failure to get an answer.
async fn refusable<'a, T>(
    timeout: Duration,
    tries: u32,
    op: impl Fn() -> Call<'a, T>,
) -> Result<Result<T, Refusal>, StoreError> {
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
        Ok(Err(e)) => match refused(&e) {
            Some(why) => Ok(Err(Refusal {
                why,
                error: e.to_string(),
            })),
            None => Err(StoreError::Unavailable(e.to_string())),
        },
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

    /// MySQL and MariaDB errors by number (and SQLSTATE), PostgreSQL's by SQLSTATE: a
    /// refusal is recorded as "executed, answer not stored", so an error a retry may get
    /// past (a connection limit, a lock, a failover) must never read as one; and a size
    /// limit is told from a rule of the database's own, which alone counts as lost.
    #[test]
    fn only_a_statement_refusal_counts_as_refused() {
        use NotKept::{Refused, TooLarge};
        let mysql = [
            // A trigger's SIGNAL; a row too large, max_allowed_packet (both ways); a value
            // too long, NULL, a duplicate, a check constraint.
            (1644, "45000", Some(Refused)),
            (1118, "42000", Some(TooLarge)),
            (1153, "08S01", Some(TooLarge)),
            (1301, "HY000", Some(TooLarge)),
            (1406, "22001", Some(Refused)),
            (1048, "23000", Some(Refused)),
            (1062, "23000", Some(Refused)),
            (3819, "HY000", Some(Refused)),
            (4025, "23000", Some(Refused)),
            // Lock wait and deadlock, on a statement.
            (1205, "HY000", None),
            (1213, "40001", None),
            // Raised opening a connection: over max_user_connections, a user's hourly
            // limit, no access to or no such database, too many connections, bad password.
            (1203, "42000", None),
            (1226, "42000", None),
            (1044, "42000", None),
            (1049, "42000", None),
            (1040, "08004", None),
            (1045, "28000", None),
            // MySQL's 4025 is not MariaDB's check constraint.
            (4025, "HY000", None),
        ];
        let mut wrong: Vec<String> = mysql
            .iter()
            .filter(|&&(number, state, why)| refusal(Some(number), Some(state)) != why)
            .map(|(number, state, _)| format!("{number} ({state})"))
            .collect();
        let postgres = [
            ("22001", Some(Refused)),
            ("23505", Some(Refused)),
            ("23514", Some(Refused)),
            // Program limits: a statement too complex, too many columns or arguments.
            ("54000", Some(TooLarge)),
            ("54001", Some(TooLarge)),
            ("54011", Some(TooLarge)),
            ("P0001", Some(Refused)),
            ("44000", Some(Refused)),
            // Serialization failure, deadlock, out of memory, a cancelled statement, a
            // standby after a failover, too many connections, auth and connection errors,
            // no CONNECT privilege (raised opening a connection).
            ("40001", None),
            ("40P01", None),
            ("53100", None),
            ("53200", None),
            ("53300", None),
            ("57014", None),
            ("57P01", None),
            ("25006", None),
            ("28000", None),
            ("28P01", None),
            ("08006", None),
            ("3D000", None),
            ("42501", None),
        ];
        wrong.extend(
            postgres
                .iter()
                .filter(|&&(code, why)| refusal(None, Some(code)) != why)
                .map(|(code, _)| code.to_string()),
        );
        assert_eq!(wrong, Vec::<String>::new(), "read the wrong way");
        assert_eq!(refusal(None, None), None, "no SQLSTATE at all");
    }

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
