//! The state a SQL store keeps beside its database's pool: the bounds every database call
//! runs under, the schema created once, the keys duplicates wait on, the renewals, the
//! reaper's count, and the background tasks that end with the store; and the pool
//! settings both databases share.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolOptions;
use sqlx::{Database, Executor, IntoArguments};
use tokio::sync::OnceCell;
use tokio::task::AbortHandle;

use super::waiters::Interests;
use super::{bounded, max_tries, refusable, Call, Refusal, SqlSettings};
use crate::store::renewals::{Renewals, Renewed};
use crate::store::{Ownership, Purged, Settled, Settlement, StoreError};

/// Room a settlement's statement (and the row a replay reads back) takes beside its
/// answer, and then some.
const STATEMENT_SPARE: u64 = 64 << 10;

/// The state a SQL store keeps beside its pool and statements.
pub(super) struct Common {
    timeout: Duration,
    tries: u32,
    schema: OnceCell<()>,
    /// The keys duplicates in this process wait on.
    pub interests: Arc<Interests>,
    /// The claims this store keeps renewed.
    pub renewals: Arc<Renewals>,
    /// Expired rows the reaper deleted since start.
    pub reaped: AtomicU64,
    /// Settlements given up on (see `Store::settlement_lost`).
    pub settlements_lost: AtomicU64,
    /// Bounds on what its settlements made again hold (see `store::settling`).
    pub settling: crate::store::settling::Settling,
    /// Token issuances refused past `tokens.budget` (see `Store::token_refused`).
    pub tokens_refused: AtomicU64,
    /// The largest statement the database takes, in bytes (`u64::MAX`: no limit known).
    pub statement_limit: AtomicU64,
    /// The store's background tasks (listener or re-check, reaper), ended with it.
    tasks: Vec<AbortHandle>,
}

impl Drop for Common {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        // Its renewing task may be waiting for a claim that will never come.
        self.renewals.store_dropped();
    }
}

impl Common {
    pub(super) fn new(
        settings: &SqlSettings,
        interests: Arc<Interests>,
        tasks: Vec<AbortHandle>,
    ) -> Self {
        Self {
            timeout: settings.timeout,
            tries: max_tries(settings.max_connections),
            schema: OnceCell::new(),
            interests,
            renewals: Arc::default(),
            reaped: AtomicU64::new(0),
            settlements_lost: AtomicU64::new(0),
            settling: Default::default(),
            tokens_refused: AtomicU64::new(0),
            statement_limit: AtomicU64::new(u64::MAX),
            tasks,
        }
    }

    /// The longest one operation may take.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// One database call under the store timeout, sent again on a dropped connection
    /// (see [`bounded`]).
    pub(super) async fn call<'a, T>(&self, op: impl Fn() -> Call<'a, T>) -> Result<T, StoreError> {
        bounded(self.timeout, self.tries, op).await
    }

    /// [`Common::call`], telling the database's refusal of the statement (`Ok(Err(_))`:
    /// it will refuse it every time) from a failure to get an answer.
    pub(super) async fn call_refusable<'a, T>(
        &self,
        op: impl Fn() -> Call<'a, T>,
    ) -> Result<Result<T, Refusal>, StoreError> {
        refusable(self.timeout, self.tries, op).await
    }

    /// Runs `migrate` until it succeeds once (the first call that reaches the database
    /// creates what is missing; later calls return at once). Creating takes longer than a
    /// statement, so it gets at least ten seconds.
    pub(super) async fn schema<'a>(
        &'a self,
        migrate: impl Fn() -> Call<'a, ()>,
    ) -> Result<(), StoreError> {
        let timeout = self.timeout.max(Duration::from_secs(10));
        self.schema
            .get_or_try_init(|| bounded(timeout, self.tries, migrate))
            .await
            .map(|_| ())
    }

    /// `settlement` as the database can take it, and whether its answer was left out: an
    /// answer too large for one statement (MySQL's `max_allowed_packet`) is refused every
    /// time it is sent, so the claim would lapse with it lost (held as an unknown outcome,
    /// or, on a route that releases lapsed claims, run again). The request ran: the key
    /// records "executed, answer not stored" instead, as an answer over `max_answer` does.
    /// A failure too large to share frees the key all the same, as on the memory store:
    /// its waiters are told their owner failed, without its answer (a one-time token is
    /// still given back).
    pub(super) fn fitted(&self, settlement: Settlement) -> (Settlement, bool) {
        let limit = self
            .statement_limit
            .load(Relaxed)
            .saturating_sub(STATEMENT_SPARE);
        let too_large = settlement.answer_len() as u64 > limit;
        match settlement.without_answer() {
            Some(lesser) if too_large => {
                let dropped = matches!(settlement, Settlement::Done { .. });
                (lesser, dropped)
            }
            _ => (settlement, false),
        }
    }

    /// What a settle routine's answer `code` means; wakes the waiters in this process
    /// (they need no notification).
    pub(super) fn settled(
        &self,
        owned: &Ownership,
        settlement: &Settlement,
        code: i64,
    ) -> Result<Settled, StoreError> {
        self.interests.wake(&owned.key);
        Ok(match code {
            1 => Settled::Written,
            2 => {
                tracing::warn!(
                    key = %owned.key.short(),
                    settled = settlement.as_str(),
                    "the store had lost the claim; wrote the outcome back"
                );
                Settled::WrittenBack
            }
            0 => Settled::NotWritten,
            other => return Err(unexpected_code(other)),
        })
    }

    /// What a renew routine's answer `code` means.
    pub(super) fn renewed(code: i64) -> Result<Renewed, StoreError> {
        Ok(match code {
            1 => Renewed::Extended,
            2 => Renewed::Restored,
            0 => Renewed::Lost,
            other => return Err(unexpected_code(other)),
        })
    }

    /// What a purge routine's answer `code` means.
    pub(super) fn purged(code: i64) -> Result<Purged, StoreError> {
        Ok(match code {
            1 => Purged::Removed,
            2 => Purged::InFlight,
            3 => Purged::Changed,
            0 => Purged::Absent,
            other => return Err(unexpected_code(other)),
        })
    }
}

fn unexpected_code(code: i64) -> StoreError {
    StoreError::Unavailable(format!("unexpected answer from the database: {code}"))
}

/// A pool of at most `settings.max_connections` that runs `session` on each new connection.
pub(super) fn pool_options<DB>(settings: &SqlSettings, session: &'static str) -> PoolOptions<DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    PoolOptions::new()
        .max_connections(settings.max_connections.max(1))
        .acquire_timeout(settings.timeout)
        // A ping per acquire would be a round trip per statement; a connection the
        // database dropped fails its statement instead, which is sent again.
        .test_before_acquire(false)
        .after_connect(move |conn, _| {
            Box::pin(async move { sqlx::query(session).execute(conn).await.map(|_| ()) })
        })
}
