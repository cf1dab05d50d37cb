//! [`Lease`]: ownership of a claimed key as a value. While it lives the claim does not
//! lapse, so a slow upstream never lets a duplicate execute: on the shared stores (Redis,
//! PostgreSQL, MySQL) the store's renewing task renews it (`store::renewals`), on the
//! memory store the lease holds the claim's [`Liveness`].
//!
//! A lease knows whether its request may have gone out ([`Lease::mark_sent`]). Dropped
//! unsettled (a cancelled or panicking owner, or one whose background wait ran out), it
//! settles the key from what it knows, pingora's `WritePermit` idea: a request that never
//! went out frees the key for a retry; one that may have reached the upstream follows the
//! route's [`Lapse`] (held as outcome unknown, or released), never plainly freed. Unless
//! its owner knows how it ends before it can write it: an owner with the answer in hand
//! that must first settle other keys ([`Lease::armed`]) gets that answer made in the
//! background, as a settlement dropped midway is, rather than an unknown outcome.
//!
//! A settlement the store fails (unreachable, or no answer within its timeout), or whose
//! caller stops waiting for it, is not given up: it is made again in the background,
//! backing off, for as long as the claim's record lasts (every write is fenced by the
//! owner's token, so a repeat of one that did land changes nothing): a lease after the
//! last renewal whose answer came back, then the lapse span, during which the store holds
//! it as its lapse rule says; and no sooner than a lease and the lapse span after the first
//! failure, as a renewal whose answer never came back may have landed (see `RetryEnds`).
//! What those retries hold is bounded (`super::settling`): so many at once, their answers
//! within the store's room; one past the room is made again without its answer ("executed,
//! answer not stored"), never given up while that smaller record can land.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::claim::{ClaimArgs, Lapse, OwnerToken, Ownership};
use super::renewals::{Finished, HeldClaim, Renewal};
use super::response::StoredResponse;
use super::settlement::{NotKept, Settled, Settlement};
use super::{background, settling, unanswered, Store, StoreError};
use crate::key::Digest;
use tracing::Instrument;

/// Held by the owner of a memory-store claim: while it lives the claim does not lapse, so
/// an owner in this process needs no renewal timer (a timer registration and a task per
/// claim). The claim's `lease_until` is claim time + lease, pushed forward by each claim
/// that finds it past due while the owner is alive; once the liveness is dropped without
/// the claim being settled (an owner that vanished without its guard running), the claim
/// lapses at `lease_until`, which may already have passed.
#[derive(Debug)]
pub struct Liveness {
    _alive: Arc<()>,
}

impl Liveness {
    pub(crate) fn new() -> (Self, std::sync::Weak<()>) {
        let alive = Arc::new(());
        let weak = Arc::downgrade(&alive);
        (Self { _alive: alive }, weak)
    }
}

/// Ownership of one key. End it with [`Lease::settle`] (or its shorthands).
#[derive(Debug)]
pub struct Lease {
    store: Store,
    owned: Ownership,
    /// Shared stores: keeps the claim on the store's renewal list.
    renewal: Option<Renewal>,
    /// Memory store: keeps the claim alive instead of a renewer.
    liveness: Option<Liveness>,
    /// The request may have reached the upstream: set by whoever hands it to a connection
    /// (see [`Lease::sending`]).
    sent: Arc<AtomicBool>,
    /// A one-time token's: until when it goes back to issued when the claim is released.
    reissue: Option<SystemTime>,
    /// How long the claim outlives an owner that stops renewing it.
    lease: Duration,
    finished: bool,
}

/// A lease with the settlement it ends with, made even if this value is dropped before
/// [`Armed::settle`] wrote it (see [`Lease::armed`]). Beside the lease, not in it: a
/// settlement is large, and every claim's answer carries a lease.
#[derive(Debug)]
pub struct Armed {
    /// Both `Some` until settled or dropped.
    lease: Option<Lease>,
    settlement: Option<Settlement>,
}

impl Armed {
    /// The settlement it is armed with.
    pub fn settlement(&self) -> &Settlement {
        self.settlement.as_ref().expect("armed until settled")
    }

    /// Ends the claim with the settlement it was armed with (see [`Lease::settle`]).
    pub async fn settle(mut self) -> Result<Settled, StoreError> {
        // Both taken out and handed on in the same poll: `Lease::settle` marks the lease
        // finished and arms its `Pending` before it first waits.
        let lease = self.lease.take().expect("armed until settled");
        let settlement = self.settlement.take().expect("armed until settled");
        lease.settle(settlement).await
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        let (Some(mut lease), Some(settlement)) = (self.lease.take(), self.settlement.take())
        else {
            return;
        };
        tracing::warn!(
            key = %lease.owned.key.short(),
            settled = settlement.as_str(),
            "claim dropped before its settlement was written; making it in the background"
        );
        // As `Pending` does a settlement dropped midway: admitted within the bounds of
        // those made again, and made again until it lands. Whether a renewal is still out
        // is not known here: assumed so, as there.
        lease.finished = true;
        let renewal = lease.renewal.take();
        let renewed = renewal
            .as_ref()
            .map_or_else(tokio::time::Instant::now, Renewal::renewed);
        drop(renewal);
        retry_in_background(
            &lease.store,
            lease.owned,
            settlement,
            lease.lease,
            true,
            renewed,
        );
    }
}

/// The first pause before a failed settlement is made again; each next one doubles, up
/// to [`SETTLE_RETRY_MAX`] while the claim's lease runs, and to [`SETTLE_RETRY_LATE_MAX`]
/// once it has lapsed (a store down that long should not get a storm of retries when it
/// comes back), and never past a quarter of the time the claim's record has left.
const SETTLE_RETRY_FIRST: Duration = Duration::from_millis(100);
const SETTLE_RETRY_MAX: Duration = Duration::from_secs(2);
const SETTLE_RETRY_LATE_MAX: Duration = Duration::from_secs(30);

impl Lease {
    pub(crate) fn start(
        store: Store,
        args: &ClaimArgs,
        token: OwnerToken,
        liveness: Option<Liveness>,
        claimed: tokio::time::Instant,
    ) -> Self {
        let held = HeldClaim {
            key: args.key,
            token,
            fingerprint: args.fingerprint,
            lease: args.lease,
            lapse: args.lapse,
        };
        let renewal = match (&store, &liveness) {
            (Store::Redis(redis), None) => Some(redis.renewals().hold(redis, held, claimed)),
            (Store::Postgres(pg), None) => Some(pg.renewals().hold(pg, held, claimed)),
            (Store::Mysql(my), None) => Some(my.renewals().hold(my, held, claimed)),
            _ => None,
        };
        Self {
            store,
            owned: Ownership {
                key: args.key,
                token,
                fingerprint: args.fingerprint,
                lapse: args.lapse,
            },
            renewal,
            liveness,
            sent: Arc::default(),
            reissue: args.reissue,
            lease: args.lease,
            finished: false,
        }
    }

    /// The owned key.
    pub fn key(&self) -> Digest {
        self.owned.key
    }

    /// The fencing token of this ownership.
    pub fn token(&self) -> OwnerToken {
        self.owned.token
    }

    /// The claim's payload fingerprint.
    pub fn fingerprint(&self) -> Digest {
        self.owned.fingerprint
    }

    /// For a one-time token's claim, until when the token goes back to issued if the claim
    /// is released or fails: its expiry as issued (see [`ClaimArgs::reissue`]), which the
    /// settlement carries as it is, so a write made late keeps the token no longer.
    pub fn reissue(&self) -> Option<SystemTime> {
        self.reissue
    }

    /// Records that the request is about to go out: from now on, dropping the lease
    /// unsettled cannot free the key plainly.
    pub fn mark_sent(&mut self) {
        self.sent.store(true, Ordering::SeqCst);
    }

    /// Counts this claim's request as sent whenever `other`'s is: a key held beside
    /// `other`'s for the same request, whose drop unsettled (its owner gave up or
    /// panicked) must then follow its lapse rule as `other`'s does, not free the key.
    pub fn sent_with(&mut self, other: &Lease) {
        self.sent = Arc::clone(&other.sent);
    }

    /// Whether the request may have gone out ([`Lease::mark_sent`]).
    pub fn is_sent(&self) -> bool {
        self.sent.load(Ordering::SeqCst)
    }

    /// The flag [`Lease::mark_sent`] sets, for the code that hands the request to a
    /// connection (and for its caller, to learn whether it did).
    pub fn sending(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.sent)
    }

    /// The lease to be ended with `settlement`, which it makes even if dropped unsettled:
    /// in the background, as [`Lease::settle`] does one whose caller stopped waiting, not
    /// what the drop of a lease that knows only whether its request went out makes. For an
    /// owner that has its answer in hand but must write other keys before this one (the
    /// keys an earlier config gave the request, `proxy::previous`), and may be dropped
    /// meanwhile (a detached owner at its `background_timeout`): its answer is never
    /// recorded as unknown, or released.
    pub fn armed(self, settlement: Settlement) -> Armed {
        Armed {
            lease: Some(self),
            settlement: Some(settlement),
        }
    }

    /// Ends the claim with `settlement` (see [`Store::settle`]). A store error is
    /// returned at once (and this future may be dropped before the store answered), and
    /// the settlement made again in the background until it lands
    /// or the claim's record is gone: its lease, then its lapse span (held as an unknown
    /// outcome, or waiting for a takeover), during which the record is still this owner's
    /// and the settlement, fenced by its token, can still land.
    pub async fn settle(mut self, settlement: Settlement) -> Result<Settled, StoreError> {
        self.finished = true;
        let renewal = self.renewal.take();
        settle_and_follow_up(&self.store, self.owned, settlement, self.lease, renewal).await
    }

    /// Stores the response for `ttl`. `Ok(false)`: it was not kept as asked (another
    /// owner holds the key, or the store could not keep the answer).
    pub async fn complete(
        self,
        response: StoredResponse,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let response = response.with_fingerprint(self.owned.fingerprint);
        let settled = self.settle(Settlement::Done { response, ttl }).await?;
        Ok(settled.kept())
    }

    /// Frees the key so the next request with it executes. `Ok(false)`: another owner
    /// holds it.
    pub async fn release(self) -> Result<bool, StoreError> {
        let settled = self.settle(Settlement::Release { reissue: None }).await?;
        Ok(settled != Settled::NotWritten)
    }

    /// Gives the claim up without settling it, as an owner that crashed would: nothing
    /// renews it any more, and it lapses once the lease has passed. For tests of lapses
    /// and fencing; a real owner settles.
    #[doc(hidden)]
    pub fn abandon(mut self) {
        self.renewal = None;
        self.liveness = None;
        self.finished = true;
    }

    /// What an unsettled lease's drop writes: a request that never went out frees the key
    /// (a one-time token goes back to issued, so its retry can run); one that may have
    /// follows the lapse rule.
    fn settlement_on_drop(&self) -> Settlement {
        match (self.sent.load(Ordering::SeqCst), self.owned.lapse) {
            (true, Lapse::Hold { ttl }) => Settlement::Unknown { ttl },
            _ => Settlement::Release {
                reissue: self.reissue(),
            },
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let renewal = self.renewal.take();
        if self.finished {
            return;
        }
        let settlement = self.settlement_on_drop();
        let key = self.owned.key.short();
        tracing::warn!(
            %key,
            sent = self.sent.load(Ordering::SeqCst),
            settled = settlement.as_str(),
            "claim dropped unsettled"
        );
        let (store, owned) = (self.store.clone(), self.owned);
        let lease = self.lease;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let span = tracing::Span::current();
            let settle = async move {
                if let Err(e) =
                    settle_and_follow_up(&store, owned, settlement, lease, renewal).await
                {
                    tracing::warn!(%key, error = %e, "could not settle a dropped claim; retrying");
                }
            };
            background::spawn(&rt, settle.instrument(span));
        }
    }
}

/// Makes `settlement` once a renewal still out has landed (one that landed after a release
/// would find the record gone and write the claim back). A store error is returned at
/// once and the settlement made again in the background, in the current span, until it
/// lands or the claim's record is gone; one made after a renewal went unanswered (which on
/// a SQL database may land later still) is made again as
/// [`unanswered::settle_after_unanswered_renewal`] says. Dropped before the store
/// answered, this future leaves the settlement to be made in the background ([`Pending`]).
async fn settle_and_follow_up(
    store: &Store,
    owned: Ownership,
    settlement: Settlement,
    lease: Duration,
    renewal: Option<Renewal>,
) -> Result<Settled, StoreError> {
    // Without renewals (the memory store) the claim lives as long as its owner.
    let now = Finished {
        unanswered: false,
        renewed: tokio::time::Instant::now(),
    };
    let mut pending = Pending {
        armed: Some((store, owned, settlement, lease)),
        renewed: renewal.as_ref().map_or(now.renewed, Renewal::renewed),
    };
    let Finished {
        unanswered,
        renewed,
    } = match renewal {
        Some(renewal) => renewal.finish().await,
        None => now,
    };
    pending.renewed = renewed;
    let settlement = pending.settlement();
    // A clone shares the answer's bytes.
    let settled = store.settle(&owned, settlement.clone()).await;
    let settlement = pending.answered();
    if settled.is_err() {
        retry_in_background(store, owned, settlement, lease, unanswered, renewed);
    } else if unanswered {
        unanswered::settle_after_unanswered_renewal(store, owned, settlement, lease);
    }
    settled
}

/// A settlement on its way to the store. Dropped before the store answered (its caller
/// stopped waiting: a detached owner whose `background_timeout` passed as it wrote its
/// answer), it is made again in the background, as a failed one is: nothing else would
/// make it, the claim's renewals having stopped, and the claim would lapse with the answer
/// lost (held as an unknown outcome, or, on a route that releases lapsed claims, run again
/// by a retry).
struct Pending<'a> {
    armed: Option<(&'a Store, Ownership, Settlement, Duration)>,
    /// When the claim's last renewal that landed was sent (see [`Finished::renewed`]).
    renewed: tokio::time::Instant,
}

impl Pending<'_> {
    fn settlement(&self) -> &Settlement {
        &self.armed.as_ref().expect("armed until answered").2
    }

    /// The store answered (or failed, which its caller follows up): the settlement back.
    fn answered(mut self) -> Settlement {
        self.armed.take().expect("answered once").2
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let Some((store, owned, settlement, lease)) = self.armed.take() else {
            return;
        };
        tracing::warn!(
            key = %owned.key.short(),
            settled = settlement.as_str(),
            "settlement dropped before the store answered; making it again"
        );
        // Whether a renewal went unanswered is not known here: assumed so, which on a SQL
        // database only repeats a settlement that leaves no record, fenced by the token.
        retry_in_background(store, owned, settlement, lease, true, self.renewed);
    }
}

/// Starts [`settle_again`] in the background, within the bounds `settling` sets (at most
/// `MAX_SETTLING` at once, their answers within the store's room): past the count it is
/// given up and counted as lost; an answer without room is left out, the settlement made
/// again as "executed, answer not stored".
fn retry_in_background(
    store: &Store,
    owned: Ownership,
    settlement: Settlement,
    lease: Duration,
    unanswered: bool,
    renewed: tokio::time::Instant,
) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        // As `unanswered` gives up a release with no runtime: said and counted, not lost
        // without a word.
        tracing::warn!(
            key = %owned.key.short(),
            settled = settlement.as_str(),
            "no runtime to make the settlement again on; given up, the claim lapses"
        );
        store.settlement_lost();
        return;
    };
    let Some(settling::Admitted { settlement, holds }) =
        settling::admit(&settling::SETTLING, store, &owned, settlement)
    else {
        return;
    };
    let store = store.clone();
    let retry = async move {
        // Its place and its answer's bytes, given back once it is done.
        let _holds = holds;
        settle_again(store, owned, settlement, lease, unanswered, renewed).await;
    };
    background::spawn(&rt, retry.instrument(tracing::Span::current()));
}

/// Makes a settlement the store failed again, backing off, until it lands or the claim's
/// record may be gone (see [`RetryEnds`]).
/// `unanswered`: a renewal of the claim went unanswered, and the settlement, once made, is
/// made again as [`unanswered::settle_after_unanswered_renewal`] says.
async fn settle_again(
    store: Store,
    owned: Ownership,
    settlement: Settlement,
    lease: Duration,
    unanswered: bool,
    renewed: tokio::time::Instant,
) {
    let ends = RetryEnds::new(
        Instant::now(),
        renewed.into_std(),
        lease,
        owned.lapse.span(),
    );
    let key = owned.key.short();
    let what = settlement.as_str();
    let mut pause = SETTLE_RETRY_FIRST;
    loop {
        if Instant::now() + pause >= ends.gives_up {
            tracing::error!(
                %key,
                settled = what,
                "could not settle the claim before its record expired; the settlement is lost"
            );
            store.settlement_lost();
            return;
        }
        tokio::time::sleep(pause).await;
        pause = ends.next_pause(pause, Instant::now());
        match store.settle_noting(&owned, settlement.clone()).await {
            Ok((settled, not_kept)) => {
                // The client had its answer; its retries will hear it ran, without it.
                match not_kept {
                    // The store's own rule, out of sight of the proxy's outcomes, which
                    // counted this request before its answer was refused.
                    Some(NotKept::Refused) => {
                        tracing::error!(%key, "the database refused the answer on a retry; recorded as executed, answer not stored");
                        store.settlement_lost();
                    }
                    // Left out by size, as it would have been on the first try: the
                    // store's limit, not a settlement lost.
                    Some(NotKept::TooLarge) => tracing::warn!(
                        %key,
                        "answer too large for the store, found on a retry: recorded as executed, answer not stored"
                    ),
                    None => {}
                }
                // After the count: tests/redis_store/refused_answers.rs waits for this line.
                tracing::info!(%key, settled = what, result = ?settled, "settled the claim on a retry");
                if unanswered {
                    unanswered::settle_after_unanswered_renewal(&store, owned, settlement, lease);
                }
                return;
            }
            Err(e) => {
                tracing::debug!(%key, settled = what, error = %e, "settling the claim failed again")
            }
        }
    }
}

/// Until when a failed settlement is made again, and how its pauses are paced.
#[derive(Debug, PartialEq, Eq)]
struct RetryEnds {
    /// The claim lapses here if no renewal sent after the last one that landed did (a
    /// lease after it): pauses stay short until then.
    lapses: Instant,
    /// The claim's record ends here then (its lapse span later): pauses are at most a
    /// quarter of the time left to it, so a store back before it takes the answer before
    /// a takeover could run the request again.
    ends: Instant,
    /// Given up here, never before `ends`: a renewal whose answer never came back (a
    /// stalled Redis, a late SQL commit) may have landed all the same and kept the record
    /// this owner's until a lease after the settlement first failed, then its lapse span.
    /// Trying past the record's end is harmless: every write is fenced by the token.
    gives_up: Instant,
}

impl RetryEnds {
    /// For a settlement that first failed at `failed`, of a claim whose last renewal that
    /// landed was sent at `renewed`.
    fn new(failed: Instant, renewed: Instant, lease: Duration, lapse_span: Duration) -> Self {
        let lapses = renewed + lease;
        let ends = lapses + lapse_span;
        Self {
            lapses,
            ends,
            gives_up: ends.max(failed + lease + lapse_span),
        }
    }

    /// The pause after `pause`, at `now`: doubled, at most [`SETTLE_RETRY_MAX`] before the
    /// claim lapses, [`SETTLE_RETRY_LATE_MAX`] after, and a quarter of the time left to
    /// the record's end (past it, to giving up).
    fn next_pause(&self, pause: Duration, now: Instant) -> Duration {
        let most = if now < self.lapses {
            SETTLE_RETRY_MAX
        } else {
            SETTLE_RETRY_LATE_MAX
        };
        let end = if now < self.ends {
            self.ends
        } else {
            self.gives_up
        };
        let left = (end.saturating_duration_since(now) / 4).max(SETTLE_RETRY_FIRST);
        (pause * 2).min(most).min(left)
    }
}

#[cfg(test)]
mod tests;
