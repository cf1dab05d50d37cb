//! The SQL store, written once over its database ([`Dialect`]): what each routine is sent
//! and what its answer means, the wait of a duplicate, the schema created on first use,
//! renewals and the reaper. A backend (PostgreSQL, MySQL) supplies only what differs
//! between databases.

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::task::AbortHandle;

use super::common::Common;
use super::found::{decide, digest_of, seen_of, token_of, Decided, Found, Look};
use super::reaper::{self, Reap};
use super::statements::{Arg, Columns, Statements};
use super::waiters::Interests;
use super::{decode, millis, valid_table, Call, Refusal, SqlSettings, Written};
use crate::key::Digest;
use crate::store::renewals::{self, HeldClaim, Renewals};
use crate::store::unanswered::{ClaimFailure, Unanswered};
use crate::store::{
    Claim, ClaimArgs, ClaimMode, KeyInfo, Lapse, NotKept, OwnerToken, Ownership, Purged, RawClaim,
    Revision, Settled, Settlement, Store, StoreError, Waiter,
};

/// One SQL database's side of a [`SqlStore`].
pub trait Dialect: Send + Sync + Sized + 'static {
    /// A row of this database's answers.
    type Row: Columns + Send;

    /// How long a waiter trusts the database's notifications before it looks at the record
    /// itself; `None`: the database has no notifications, and a re-check of the waited-on
    /// keys ([`super::poller`]) wakes the waiters.
    const NOTIFICATIONS: Option<Duration>;

    /// Sets up the pool for `settings` (the table name already checked), without waiting
    /// for the database.
    fn open(settings: &SqlSettings) -> Result<Self, StoreError>;

    /// The store's handle, for work that outlives a call (an unanswered claim's release).
    fn shared(store: Arc<SqlStore<Self>>) -> Store;

    /// Starts the task that wakes this process's waiters on settlements made elsewhere.
    fn watch(&self, store: Weak<SqlStore<Self>>, interests: &Arc<Interests>) -> AbortHandle;

    /// The statements, with the table name in place.
    fn statements(&self) -> &Statements;

    /// Runs `sql` as it is (one statement or several), with no parameters.
    fn run<'a>(&'a self, sql: &'a str) -> Call<'a, ()>;

    /// Runs `sql` with `args` and returns the rows it answers.
    fn fetch<'a>(&'a self, sql: &'a str, args: &'a [Arg<'a>]) -> Call<'a, Vec<Self::Row>>;

    /// Runs `sql` with `args` and returns how many rows it changed.
    fn execute<'a>(&'a self, sql: &'a str, args: &'a [Arg<'a>]) -> Call<'a, u64>;

    /// The largest statement the database takes (MySQL's `max_allowed_packet`), asked once
    /// the schema is ready; `None`: no answer idemgate keeps comes near its limit.
    fn statement_limit(&self) -> Call<'_, Option<u64>>;

    /// The claim routine's outcome (column 0 of its answer).
    fn outcome(row: &Self::Row) -> Result<i64, StoreError>;

    /// A record's kind (`I`, `D`, …) from column `at`.
    fn kind(row: &Self::Row, at: usize) -> Result<u8, StoreError>;

    /// Deletes `key`'s record whatever it is and its observe-mode count, and tells the
    /// waiters in other processes; says whether a live record was there
    /// (`Store::forget`, for tests; an operator's purge is a routine, `Statements::purge`).
    fn forget(
        store: &SqlStore<Self>,
        key: Digest,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// A store on a SQL database (`PostgresStore`, `MysqlStore`).
pub struct SqlStore<D> {
    dialect: D,
    common: Common,
}

impl<D: Dialect> SqlStore<D> {
    /// Sets up the pool without waiting for the database: one that is down at start makes
    /// requests fail (and `/readyz` say so) until it is back. The table is created on the
    /// first operation that reaches it (`idemgate run` asks at start).
    pub fn connect(settings: &SqlSettings) -> Result<Arc<Self>, StoreError> {
        valid_table(&settings.table).map_err(StoreError::Unavailable)?;
        let dialect = D::open(settings)?;
        let interests: Arc<Interests> = Arc::default();
        Ok(Arc::new_cyclic(|weak| {
            let watcher = dialect.watch(weak.clone(), &interests);
            let reaper = tokio::spawn(reaper::reap(weak.clone(), settings.reap_every));
            Self {
                dialect,
                common: Common::new(settings, interests, vec![watcher, reaper.abort_handle()]),
            }
        }))
    }

    /// The database's side of the store.
    pub(super) fn dialect(&self) -> &D {
        &self.dialect
    }

    /// The claims this store keeps renewed for their leases.
    pub(crate) fn renewals(&self) -> &Arc<Renewals> {
        &self.common.renewals
    }

    /// The longest wait for one operation.
    pub(crate) fn timeout(&self) -> Duration {
        self.common.timeout()
    }

    /// Expired rows the reaper deleted since start.
    pub fn reaped(&self) -> u64 {
        self.common.reaped.load(Relaxed)
    }

    /// Settlements given up on since start (see `Store::settlement_lost`).
    pub(crate) fn settlements_lost(&self) -> &AtomicU64 {
        &self.common.settlements_lost
    }

    /// Bounds on what its settlements made again hold (see `store::settling`).
    pub(crate) fn settling(&self) -> &crate::store::settling::Settling {
        &self.common.settling
    }

    /// Token issuances refused since start (see `Store::token_refused`).
    pub(crate) fn tokens_refused(&self) -> &AtomicU64 {
        &self.common.tokens_refused
    }

    /// Creates the tables and routines when missing (once per store).
    async fn ready_schema(&self) -> Result<(), StoreError> {
        self.common.schema(|| self.migrate()).await
    }

    /// One attempt at creating what is missing: the schema's statements in turn; then the
    /// database's statement limit.
    fn migrate(&self) -> Call<'_, ()> {
        Box::pin(async move {
            for sql in &self.statements().schema {
                self.dialect.run(sql).await?;
            }
            let limit = self.dialect.statement_limit().await?;
            self.common
                .statement_limit
                .store(limit.unwrap_or(u64::MAX), Relaxed);
            Ok(())
        })
    }

    /// The rows `sql` answers, under the store's bounds.
    pub(super) async fn fetch(
        &self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> Result<Vec<D::Row>, StoreError> {
        self.common.call(|| self.dialect.fetch(sql, args)).await
    }

    /// The one row `sql` answers.
    pub(super) async fn fetch_one(
        &self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> Result<D::Row, StoreError> {
        first_row(self.fetch(sql, args).await?)
    }

    /// How many rows `sql` changed, under the store's bounds.
    pub(super) async fn execute(&self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        self.common.call(|| self.dialect.execute(sql, args)).await
    }

    /// One claim routine call; `mark` (with notifications): a waiter that has joined the
    /// key's interest marks another owner's in-flight record as waited on, so its
    /// settlement notifies.
    async fn look(
        &self,
        args: &ClaimArgs,
        token: OwnerToken,
        mark: bool,
    ) -> Result<Look, StoreError> {
        self.ready_schema().await?;
        let token = token.0.to_be_bytes();
        let params = [
            Arg::Bytes(&args.key.0),
            Arg::Bytes(&token),
            Arg::Bytes(&args.fingerprint.0),
            Arg::Int(millis(args.lease)),
            Arg::Int(millis(args.lapse.span())),
            // A waiter takes a free key only on a route that releases lapsed claims, and
            // only once it saw its owner's claim lapse (`takes_over`): the routine lets
            // a waiter take one unless `p_hold`, which it writes only into a claim it
            // takes, so a waiter that may not take one passes it set.
            Arg::Flag(
                matches!(args.lapse, Lapse::Hold { .. })
                    || (args.after.is_some() && !args.takes_over),
            ),
            Arg::Flag(args.mode == ClaimMode::IssuedOnly),
            Arg::Flag(args.after.is_some()),
            Arg::Flag(mark),
        ];
        let params = match D::NOTIFICATIONS {
            Some(_) => &params[..],
            None => &params[..8],
        };
        let row = self.fetch_one(&self.statements().claim, params).await?;
        Ok(match D::outcome(&row)? {
            0 => Look::Claimed,
            1 => Look::Free,
            _ => Look::Found(found::<D>(&row, 1)?),
        })
    }

    fn statements(&self) -> &Statements {
        self.dialect.statements()
    }

    /// See [`crate::store::Store::claim_or_unanswered`]. A claim left without an answer is
    /// released in the background when this future is dropped, and handed back with a
    /// store error (`store::unanswered`).
    pub(crate) async fn claim(
        self: &Arc<Self>,
        args: &ClaimArgs,
    ) -> Result<RawClaim, ClaimFailure> {
        let token = OwnerToken::random();
        let unanswered = Unanswered::arm(args, token, || D::shared(Arc::clone(self)));
        unanswered.ended(self.claim_as(args, token).await)
    }

    /// A claim by `token`.
    async fn claim_as(&self, args: &ClaimArgs, token: OwnerToken) -> Result<RawClaim, StoreError> {
        let look = self.look(args, token, false).await?;
        let (owner, recheck, lapsed) = match decide(args, token, look)? {
            Decided::Claim(claim) => return Ok(claim),
            Decided::InFlight { .. } if !args.waits => {
                return Ok(RawClaim::Other(Claim::InFlight(Waiter::unwatched())))
            }
            Decided::InFlight {
                owner,
                recheck,
                lapsed,
            } => (owner, recheck, lapsed),
        };
        let Some(trusted) = D::NOTIFICATIONS else {
            // The re-check's next look compares the row with this owner: a settlement
            // since the claim looked wakes the waiter then.
            let (signal, interest) = self.common.interests.join(args.key, owner);
            return Ok(RawClaim::Other(Claim::InFlight(Waiter::watching(
                signal,
                Instant::now() + recheck,
                owner,
                lapsed,
                interest,
            ))));
        };
        // The key was seen in flight: a failure from here on must not read as "the store
        // could not say" (which `fail_open` forwards).
        let args = &ClaimArgs {
            after: Some(owner),
            takes_over: lapsed,
            ..*args
        };
        self.wait_on(args, token, owner, trusted)
            .await
            .map_err(StoreError::after_in_flight)
    }

    /// A waiter's claim with notifications, once its first look found `owner`'s claim in
    /// flight (`args` name it as [`ClaimArgs::after`]); `trusted`: how long a wake-up may
    /// be waited for before looking again.
    async fn wait_on(
        &self,
        args: &ClaimArgs,
        token: OwnerToken,
        owner: OwnerToken,
        trusted: Duration,
    ) -> Result<RawClaim, StoreError> {
        // Join the key's waiters once notifications arrive, then look again and mark the
        // record: a settlement after that look notifies, one before it is seen.
        tokio::time::timeout(self.common.timeout(), self.common.interests.listening())
            .await
            .map_err(|_| StoreError::Unavailable("not listening for notifications".into()))?;
        let (signal, interest) = self.common.interests.join(args.key, owner);
        // Looked at as the owner's waiter: if the owner failed since the first look, this
        // duplicate gets its failure, never a turn of its own on the failure record (nor
        // on a key it freed, unless its claim had lapsed).
        match decide(args, token, self.look(args, token, true).await?)? {
            Decided::Claim(claim) => Ok(claim),
            Decided::InFlight {
                owner,
                recheck,
                lapsed,
            } => Ok(RawClaim::Other(Claim::InFlight(Waiter::watching(
                signal,
                Instant::now() + recheck.min(trusted),
                owner,
                lapsed,
                interest,
            )))),
        }
    }

    /// See [`crate::store::Store::issue`].
    pub async fn issue(&self, key: Digest, ttl: Duration) -> Result<(), StoreError> {
        self.ready_schema().await?;
        let params = [
            Arg::Bytes(&key.0),
            Arg::Bytes(&Digest::NONE.0),
            Arg::Int(millis(ttl)),
        ];
        self.execute(&self.statements().issue, &params)
            .await
            .map(|_| ())
    }

    /// See [`crate::store::Store::hit`].
    pub async fn hit(&self, key: Digest, window: Duration) -> Result<u64, StoreError> {
        self.ready_schema().await?;
        let params = [Arg::Bytes(&key.0), Arg::Int(millis(window))];
        let row = self.fetch_one(&self.statements().hit, &params).await?;
        Ok(row.int(0)?.max(0) as u64)
    }

    /// See [`crate::store::Store::settle`]. An answer the database refuses (as it will
    /// every time: see `sql::refused`) is left out as one too large for a statement is:
    /// kept, the claim would lapse with the answer lost, and a retry run it again or hear
    /// "outcome unknown". Why it was left out is the refusal's: a limit on size, or a rule
    /// of the database's own.
    pub(crate) async fn settle(
        &self,
        owned: &Ownership,
        settlement: Settlement,
    ) -> Result<(Settled, Option<NotKept>), StoreError> {
        self.ready_schema().await?;
        let (settlement, too_large) = self.common.fitted(settlement);
        let refusal = match self.write_settlement(owned, &settlement).await? {
            Ok(Settled::Written | Settled::WrittenBack) if too_large => {
                return Ok((Settled::AnswerNotKept, Some(NotKept::TooLarge)))
            }
            Ok(settled) => return Ok((settled, None)),
            Err(refusal) => refusal,
        };
        let Some(lesser) = settlement.without_answer() else {
            return Err(StoreError::Unavailable(refusal.error));
        };
        tracing::error!(
            key = %owned.key.short(),
            settled = settlement.as_str(),
            error = %refusal.error,
            too_large = refusal.why == NotKept::TooLarge,
            "the database refuses the answer; written without it"
        );
        match self.write_settlement(owned, &lesser).await? {
            Ok(settled) => match settlement.settled_without_answer(settled) {
                Settled::AnswerNotKept => Ok((Settled::AnswerNotKept, Some(refusal.why))),
                settled => Ok((settled, None)),
            },
            Err(refusal) => Err(StoreError::Unavailable(refusal.error)),
        }
    }

    /// One call of the settle routine; `Ok(Err(_))`: the database refuses it.
    async fn write_settlement(
        &self,
        owned: &Ownership,
        settlement: &Settlement,
    ) -> Result<Result<Settled, Refusal>, StoreError> {
        let written = Written::of(settlement);
        let token = owned.token.0.to_be_bytes();
        let params = [
            Arg::Bytes(&owned.key.0),
            Arg::Bytes(&token),
            Arg::Bytes(&owned.fingerprint.0),
            Arg::Kind(written.kind),
            Arg::Int(written.ttl_ms),
            Arg::Status(written.status),
            Arg::Blob(written.response),
            Arg::Flag(written.issued),
            Arg::Flag(settlement.writes_back()),
        ];
        let sql = &self.statements().settle;
        let rows = match self
            .common
            .call_refusable(|| self.dialect.fetch(sql, &params))
            .await?
        {
            Ok(rows) => rows,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let row = first_row(rows)?;
        self.common.settled(owned, settlement, row.int(0)?).map(Ok)
    }

    /// See [`crate::store::Store::inspect`].
    pub async fn inspect(&self, key: Digest) -> Result<Option<KeyInfo>, StoreError> {
        self.ready_schema().await?;
        let params = [Arg::Bytes(&key.0); 3];
        let rows = self.fetch(&self.statements().inspect, &params).await?;
        rows.first()
            .map(|row| {
                let info = found::<D>(row, 0)?.info()?;
                Ok(KeyInfo {
                    seen: seen_of(row.maybe_int(10)?, row.maybe_int(11)?),
                    ..info
                })
            })
            .transpose()
    }

    /// See [`crate::store::Store::saw_duplicate`].
    pub async fn saw_duplicate(&self, key: Digest) -> Result<Option<SystemTime>, StoreError> {
        self.ready_schema().await?;
        let row = self
            .fetch_one(&self.statements().seen, &[Arg::Bytes(&key.0)])
            .await?;
        Ok(row
            .maybe_int(0)?
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)))
    }

    /// See [`crate::store::Store::purge`]: one routine call locks the row, decides,
    /// compares and deletes.
    pub async fn purge(&self, key: Digest, only: Option<Revision>) -> Result<Purged, StoreError> {
        self.ready_schema().await?;
        let token = only.and_then(|r| r.token()).map(|t| t.0.to_be_bytes());
        let params = [
            Arg::Bytes(&key.0),
            Arg::Kind(only.map(|r| r.state())),
            Arg::Blob(token.as_ref().map(|t| &t[..])),
            // The routine's own `created_ms`, as inspect read it.
            Arg::Int(only.map_or(0, |r| r.at() as i64)),
        ];
        let row = self.fetch_one(&self.statements().purge, &params).await?;
        let purged = Common::purged(row.int(0)?)?;
        if purged == Purged::Removed {
            self.common.interests.wake(&key);
        }
        Ok(purged)
    }

    /// See [`crate::store::Store::forget`].
    pub async fn forget(&self, key: Digest) -> Result<bool, StoreError> {
        self.ready_schema().await?;
        let removed = D::forget(self, key).await?;
        self.common.interests.wake(&key);
        Ok(removed)
    }

    /// Whether the database answers (creating the table first if it is missing).
    pub async fn ready(&self) -> bool {
        if self.ready_schema().await.is_err() {
            return false;
        }
        self.execute("SELECT 1", &[]).await.is_ok()
    }
}

impl<D: Dialect> renewals::Renew for SqlStore<D> {
    async fn renew(&self, claim: &HeldClaim) -> Result<renewals::Renewed, StoreError> {
        self.ready_schema().await?;
        let token = claim.token.0.to_be_bytes();
        let params = [
            Arg::Bytes(&claim.key.0),
            Arg::Bytes(&token),
            Arg::Bytes(&claim.fingerprint.0),
            Arg::Int(millis(claim.lease)),
            Arg::Int(millis(claim.lapse.span())),
            Arg::Flag(matches!(claim.lapse, Lapse::Hold { .. })),
        ];
        let row = self.fetch_one(&self.statements().renew, &params).await?;
        Common::renewed(row.int(0)?)
    }
}

impl<D: Dialect> Reap for SqlStore<D> {
    async fn reap_batch(&self) -> Result<u64, StoreError> {
        self.ready_schema().await?;
        let mut total = 0;
        for sql in &self.statements().reap {
            total += self.execute(sql, &[]).await?;
        }
        Ok(total)
    }

    fn reaped(&self) -> &AtomicU64 {
        &self.common.reaped
    }
}

/// The record columns of a claim's or an inspection's row, from column `at` on.
fn found<D: Dialect>(row: &D::Row, at: usize) -> Result<Found, StoreError> {
    Ok(Found {
        kind: D::kind(row, at)?,
        token: token_of(row.bytes(at + 1)?)?,
        fingerprint: digest_of(row.bytes(at + 2)?)?,
        status: row.small(at + 3)?,
        response: row.bytes(at + 4)?,
        lapse_hold: row.flag(at + 6)?,
        lease_ms: row.maybe_int(at + 7)?,
        expires_ms: row.int(at + 8)?,
        created_ms: row.int(at + 9)?,
    })
}

/// The first of the rows a statement answered: the one row a routine returns.
fn first_row<R>(rows: Vec<R>) -> Result<R, StoreError> {
    rows.into_iter()
        .next()
        .ok_or_else(|| decode(sqlx::Error::RowNotFound))
}
