//! A claim on a shared store whose answer never came: the store timed out, or the
//! connection broke, after the claim was sent, or the claiming future was dropped mid-call.
//! The claim may have landed all the same, with no [`Lease`](super::Lease) to renew or
//! settle it; left alone it would lapse like a dead owner's and, held as an unknown outcome,
//! refuse every retry of its key for the lapse's whole ttl, though nothing was ever sent
//! under it.
//!
//! Unless something was: with `on_store_error: fail_open`, and in observe mode, a claim that
//! failed may have its request forwarded unprotected. Whether it was is known only once the
//! forward has handed it to a connection or failed first (an upstream refusing the
//! connection, a client gone before), so the failed claim comes back to its caller as an
//! [`UnansweredClaim`], which decides when it is dropped, as a dropped [`Lease`](super::Lease) does, from
//! whether the request may have gone out ([`UnansweredClaim::sending`]). One that may have
//! stands for a request sent with no answer stored, so it is kept, and lapses as a dead
//! owner's does, by the route's `on_unknown_outcome`: a retry gets the in-flight 409 while
//! its lease runs, then the outcome-unknown one until its ttl ends (`hold`), or runs once
//! its grace is over, when the forwarded call can no longer be running (`release`).
//! Released, it would let that retry run the request a second time, or hand a one-time
//! token back for it. It costs nothing to keep: no task, no place among [`MAX_RELEASING`].
//! A forward dropped mid-way (a panic, its client gone) decides the same way: kept if the
//! request had been handed to a connection, released if certainly not.
//!
//! Otherwise nothing was sent (the caller did not forward, or its forward failed first, or
//! the claiming future was dropped), so it is settled as a dropped unsent lease is (the key
//! freed, a one-time token issued again): the same fenced settlement, by the owner token
//! the claim carried, so it releases that claim if it landed and touches nothing else,
//! neither another owner's record nor a settled one. It runs in the background, logged, and
//! is retried (the store has just failed) until the store answers: a store out of reach for
//! longer than the claim's lease (a crash after the write, a partition, a failover) still
//! holds the claim when it is back, lapsed, and only this release can free it before its
//! lapse span ends.
//!
//! On Redis the first answer to a release is taken as final: Redis runs one connection's
//! commands in order, and the release usually goes out after the claim on the connection
//! the claim went out on. Not always: when that connection broke and was replaced (redis-rs
//! reconnects; a cluster may route to another connection), the claim may still be on its
//! way on the old one (in a socket buffer, a retransmission, a proxy in between) and land
//! after the release, which found nothing to free. Such a claim is not released again: it
//! lapses as above, a retry refused for a while, never one run twice. On a SQL database the
//! claim statement may likewise still run on its own connection and commit after a release
//! found nothing, and there it is common enough to be worth repeating the release, more
//! rarely each time, until the lease has passed.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::background::Place;
use super::claim::{ClaimArgs, OwnerToken, Ownership};
use super::settlement::{Settled, Settlement};
use super::{Store, StoreError};
use tracing::Instrument;

/// At most this many unanswered claims are being released (or settlements made again after
/// an unanswered renewal) at once in a process, each a task until its lease has passed and
/// the store has answered; past it, one is left to lapse, with a warning, and counted as a
/// settlement lost. A store failing every claim for a while fills it; the first of them,
/// sent as the store went away, are the ones that may have landed.
const MAX_RELEASING: usize = 4096;
/// The shortest pause between two releases of one claim.
const MIN_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between two releases of one claim: once the store is back, an orphan
/// claim holds its key (a 409 for its retries) at most this long, and a store down for
/// hours gets one try per claim this often, not a storm when it returns.
const MAX_PAUSE: Duration = Duration::from_secs(10);

/// Unanswered claims being released now, in this process.
static RELEASING: AtomicUsize = AtomicUsize::new(0);

/// A claim that was, or may have been, sent without an answer: what its release needs.
#[derive(Debug, Clone, Copy)]
struct Orphan {
    owned: Ownership,
    /// Until when a one-time token goes back to issued ([`ClaimArgs::reissue`]).
    reissue: Option<SystemTime>,
    lease: Duration,
}

impl Orphan {
    fn new(args: &ClaimArgs, token: OwnerToken) -> Self {
        Self {
            owned: Ownership {
                key: args.key,
                token,
                fingerprint: args.fingerprint,
                lapse: args.lapse,
            },
            reissue: args.reissue,
            lease: args.lease,
        }
    }
}

/// Held by a shared store's claim while it waits for answers: dropped unanswered (the
/// claim's future dropped, so nothing was sent), it releases the claim in the background;
/// [`Unanswered::ended`] by an error, it hands the claim to its caller. `store` builds the
/// store's handle only then, so an answered claim costs nothing.
pub(crate) struct Unanswered<F: FnOnce() -> Store> {
    armed: Option<(F, Orphan)>,
}

impl<F: FnOnce() -> Store> Unanswered<F> {
    /// Armed for the claim of `args` by `token`.
    pub(crate) fn arm(args: &ClaimArgs, token: OwnerToken, store: F) -> Self {
        Self {
            armed: Some((store, Orphan::new(args, token))),
        }
    }

    /// The claim is over, as `claim` says: answered (an ownership, which its lease takes
    /// over, or another record), or failed, and then handed to the caller with its error:
    /// only the caller knows whether the request goes out all the same (see the module
    /// doc).
    pub(crate) fn ended<T>(mut self, claim: Result<T, StoreError>) -> Result<T, ClaimFailure> {
        let armed = self.armed.take();
        claim.map_err(|error| ClaimFailure {
            error,
            unanswered: armed
                .map(|(store, orphan)| Box::new(UnansweredClaim::new(store(), orphan))),
        })
    }
}

impl<F: FnOnce() -> Store> Drop for Unanswered<F> {
    fn drop(&mut self) {
        let Some((store, orphan)) = self.armed.take() else {
            return;
        };
        release_in_background(&RELEASING, &store(), orphan);
    }
}

/// A failed claim ([`Store::claim_or_unanswered`]): the store's error, and on a shared
/// store the claim it may have written all the same.
#[derive(Debug)]
pub struct ClaimFailure {
    /// What the store failed with.
    pub error: StoreError,
    /// The claim the failure may have left (`None` on the memory store, whose claims are
    /// answered at once): dropped, it is released unless its request may have gone out.
    /// Boxed: a failure is rare, and every claim's result is as large as its error.
    pub unanswered: Option<Box<UnansweredClaim>>,
}

impl ClaimFailure {
    /// `claim`'s answer or error, and the claim a failure may have left, apart.
    pub fn split<T>(
        claim: Result<T, Self>,
    ) -> (Result<T, StoreError>, Option<Box<UnansweredClaim>>) {
        match claim {
            Ok(claim) => (Ok(claim), None),
            Err(failure) => (Err(failure.error), failure.unanswered),
        }
    }
}

impl From<StoreError> for ClaimFailure {
    /// A failure that left no claim (the store refused before writing, or answers at once).
    fn from(error: StoreError) -> Self {
        Self {
            error,
            unanswered: None,
        }
    }
}

/// A claim that failed without an answer, which may have landed, in its caller's hands.
/// Dropped, it is released in the background unless its request may have gone out
/// ([`UnansweredClaim::sending`]): then it is kept, to lapse as one whose request went
/// out does. A caller that forwards nothing just drops it.
#[derive(Debug)]
pub struct UnansweredClaim {
    store: Store,
    orphan: Orphan,
    /// The request may have reached the upstream, as a [`Lease`](super::Lease)'s flag.
    sent: AtomicBool,
    /// The count of releases it takes its place in ([`RELEASING`]; a test's own).
    releasing: &'static AtomicUsize,
}

impl UnansweredClaim {
    fn new(store: Store, orphan: Orphan) -> Self {
        Self {
            store,
            orphan,
            sent: AtomicBool::new(false),
            releasing: &RELEASING,
        }
    }

    /// The flag the code that hands the request to a connection sets, as it does a lease's
    /// ([`Lease::sending`](super::Lease::sending)): from then on the request may have gone
    /// out, and the claim is kept.
    pub fn sending(&self) -> &AtomicBool {
        &self.sent
    }
}

impl Drop for UnansweredClaim {
    fn drop(&mut self) {
        if self.sent.load(Ordering::SeqCst) {
            // The caller warned of the failure and counts the forward.
            tracing::debug!(
                key = %self.orphan.owned.key.short(),
                "claim unanswered, its request sent; the claim, if it landed, lapses"
            );
            return;
        }
        release_in_background(self.releasing, &self.store, self.orphan);
    }
}

/// Starts the release of `orphan` in the background, unless `releasing` counts
/// [`MAX_RELEASING`] already (or there is no runtime): then it is given up, logged and
/// counted.
fn release_in_background(releasing: &'static AtomicUsize, store: &Store, orphan: Orphan) {
    const WHAT: &str = "the release of an unanswered claim";
    let Some((rt, place)) = admit(releasing, store, &orphan.owned, WHAT) else {
        return;
    };
    tracing::warn!(key = %orphan.owned.key.short(), "claim unanswered; releasing it in the background");
    let store = store.clone();
    let release = async move {
        let _place = place;
        release(&store, orphan).await;
    };
    super::background::spawn(&rt, release.instrument(tracing::Span::current()));
}

/// A release of `owned` (`what`) may start: the runtime to spawn it on, and its place
/// among the releases `releasing` counts. `None` when it may not (no runtime, or
/// [`MAX_RELEASING`] taken): it is given up, with a warning, and counted as a settlement
/// lost, since the claim it would free (if that landed) holds its key, in flight and then
/// as an unknown outcome, until its record ends.
fn admit(
    releasing: &'static AtomicUsize,
    store: &Store,
    owned: &Ownership,
    what: &'static str,
) -> Option<(tokio::runtime::Handle, Place)> {
    let key = owned.key.short();
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(%key, "{what}: no runtime to run it on; given up, the claim lapses");
        store.settlement_lost();
        return None;
    };
    let Some(place) = Place::take(releasing, MAX_RELEASING) else {
        tracing::warn!(
            %key,
            releasing = MAX_RELEASING,
            "{what}: too many others are being released; given up, the claim lapses"
        );
        store.settlement_lost();
        return None;
    };
    Some((rt, place))
}

/// Releases the claim of `args` by `token`, as an unanswered claim's guard does, and
/// returns when it is done: the last answer the store gave, `None` if it gave none before
/// the lease passed. For tests of the fence; a claim's guard does this by itself.
pub(crate) async fn release_now(
    store: &Store,
    args: &ClaimArgs,
    token: OwnerToken,
) -> Option<Settled> {
    release(store, Orphan::new(args, token)).await
}

/// The fenced release of `orphan`, tried again until an answer is final (see [`repeat`]).
async fn release(store: &Store, orphan: Orphan) -> Option<Settled> {
    let settlement = Settlement::Release {
        // The span left is taken by the store as it writes ([`Settlement::Release`]).
        reissue: orphan.reissue,
    };
    repeat(
        store,
        &orphan.owned,
        &settlement,
        orphan.lease,
        "unanswered claim",
    )
    .await
}

/// Settles `owned` once more, in the background, after its owner settled it with
/// `settlement` while a renewal of its claim had gone unanswered. On a SQL database that
/// renewal's statement may still commit after the settlement, find the claim's record gone
/// and write the claim back: an orphan claim that would hold the key in flight, then as an
/// unknown outcome, though its owner is done. So a settlement that leaves no record this
/// owner's renewal would meet (a release, a failure past its linger, a zero ttl) is made
/// again, fenced by the owner's token, as an unanswered claim's release is: it frees the
/// orphan and touches nothing else. On Redis it is not made again: the renewal usually went
/// out before the settlement on the same connection, so landed first. A renewal left on a
/// connection that broke and was replaced can still land after the settlement and restore
/// the claim (the renewal script restores a record that is gone); that claim lapses as a
/// dead owner's does, its key refused for a while, never run twice (see the module doc).
pub(crate) fn settle_after_unanswered_renewal(
    store: &Store,
    owned: Ownership,
    settlement: Settlement,
    lease: Duration,
) {
    settle_again_in_background(&RELEASING, store, owned, settlement, lease);
}

/// [`settle_after_unanswered_renewal`], its place counted in `releasing`.
fn settle_again_in_background(
    releasing: &'static AtomicUsize,
    store: &Store,
    owned: Ownership,
    settlement: Settlement,
    lease: Duration,
) {
    const WHAT: &str = "settlement after an unanswered renewal";
    if settlement.writes_back() || matches!(store, Store::Redis(_) | Store::Memory(_)) {
        return;
    }
    let Some((rt, place)) = admit(releasing, store, &owned, WHAT) else {
        return;
    };
    tracing::debug!(key = %owned.key.short(), "a renewal went unanswered; settling again");
    let store = store.clone();
    let repeated = async move {
        let _place = place;
        repeat(&store, &owned, &settlement, lease, WHAT).await;
    };
    super::background::spawn(&rt, repeated.instrument(tracing::Span::current()));
}

/// Makes `settlement` of `owned`, tried again until an answer is final: on Redis the first
/// answer; on a SQL database, where a statement sent before may still commit after any
/// answer, the last of the tries made until `lease` has passed (at least three store
/// timeouts, so a short lease still gets a few). A store that gave no answer by then is
/// tried on, every [`MAX_PAUSE`] at most, until it answers or the claim's record is gone
/// (`lease` plus its lapse span): the claim may be there, lapsed, holding its key as an
/// unknown outcome or in flight for that long, and nothing else would free it.
async fn repeat(
    store: &Store,
    owned: &Ownership,
    settlement: &Settlement,
    lease: Duration,
    what: &'static str,
) -> Option<Settled> {
    let key = owned.key.short();
    let (timeout, ordered) = match store {
        Store::Redis(r) => (r.timeout(), true),
        Store::Postgres(p) => (p.timeout(), false),
        Store::Mysql(m) => (m.timeout(), false),
        // Its claims are answered at once; nothing is ever unanswered there.
        Store::Memory(_) => return None,
    };
    let started = Instant::now();
    let repeated_until = started + lease.max(timeout * 3);
    let record_gone = repeated_until.max(started + lease + owned.lapse.span());
    let mut pause = timeout.max(MIN_PAUSE);
    let mut last = None;
    loop {
        match store.settle(owned, settlement.clone()).await {
            Ok(settled) => {
                tracing::debug!(%key, ?settled, "{what}: settled");
                if ordered {
                    return Some(settled);
                }
                last = Some(settled);
            }
            Err(e) => tracing::debug!(%key, error = %e, "{what}: settling failed"),
        }
        let now = Instant::now();
        let until = if last.is_some() {
            repeated_until
        } else {
            record_gone
        };
        if now >= until {
            if last.is_none() {
                // Given up as surely as one past the cap ([`admit`]): counted alike.
                tracing::warn!(%key, "{what}: could not settle it before its record expired");
                store.settlement_lost();
            }
            return last;
        }
        tokio::time::sleep(pause.min(until - now)).await;
        pause = pause.saturating_mul(2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests;
