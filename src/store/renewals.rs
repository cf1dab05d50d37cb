//! Renewal of live claims on the shared stores (Redis, PostgreSQL, MySQL): one task per
//! store renews every claim a [`crate::store::Lease`] holds, each at a third of its lease.
//! A task spawned per claim would cost every first-seen request a spawn, a timer armed and
//! an abort, for a renewal that almost no request lives long enough to need. The task talks
//! to its store through [`Renew`], so this module imports no backend.
//!
//! A renewal that finds its record gone (Redis restarted empty, or failed over to a
//! replica that never got it; an operator's purge) writes the claim back, so duplicates
//! keep finding it in flight instead of executing while the owner still runs.
//!
//! Holding a claim here is a map insert and a removal under a short lock. The task sleeps
//! until the earliest renewal is due, or with no claim to renew until one is; a claim due
//! sooner than the task's planned wake-up (the first, or a shorter lease) wakes it. A claim
//! whose renewal is out is left out of that plan until the renewal answers, which wakes
//! the task if the claim is due sooner (at once, when the store took longer than the
//! period): a stalled store leaves the task asleep, not scanning. A store and its task
//! belong to one runtime, as its connection does.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::key::Digest;
use crate::store::{Lapse, OwnerToken, StoreError};
use crate::sync::lock;

/// One claim to keep alive, with what rebuilds its record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeldClaim {
    pub key: Digest,
    pub token: OwnerToken,
    pub fingerprint: Digest,
    pub lease: Duration,
    pub lapse: Lapse,
}

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// The claim was there and is extended.
    Extended,
    /// The record was gone and the claim is written back.
    Restored,
    /// Another owner's record is there: the claim is lost.
    Lost,
}

/// The store a renewing task sends renewals to.
pub(crate) trait Renew: Send + Sync + 'static {
    /// Extends (or restores) `claim` to its lease plus lapse span from now.
    fn renew(&self, claim: &HeldClaim) -> impl Future<Output = Result<Renewed, StoreError>> + Send;
}

/// Renews at a third of the lease: a renewal that fails within a third of the lease (the
/// store's timeout, where the lease is three of them) leaves the next a third of the lease
/// to land before the claim lapses.
const RENEWALS_PER_LEASE: u32 = 3;
/// Floor of the renewal period, so a tiny lease cannot make the task spin.
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// The claims one store renews, shared by the leases and the renewing task.
#[derive(Debug, Default)]
pub(crate) struct Renewals {
    state: Mutex<State>,
    /// Wakes the task for a claim due before the task's planned wake-up.
    sooner: Notify,
    /// Wakes leases waiting in [`Renewal::finish`] for their renewal to be answered.
    settled: Notify,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    claims: HashMap<u64, Claim>,
    /// When the task wakes next; `None` while it waits for a claim to be held or a renewal
    /// to answer (or has not run).
    wake_at: Option<Instant>,
    task_started: bool,
}

#[derive(Debug)]
struct Claim {
    claim: HeldClaim,
    due: Instant,
    /// A renewal is out: a slow store gets one per claim at a time, not one per period.
    renewing: bool,
    /// Its lease is settling and waits for the renewal that is out; none is sent again.
    finishing: bool,
    /// A renewal got no answer (the store failed, or timed out): on a SQL database its
    /// statement may still commit, later than anything sent after it.
    unanswered: bool,
    /// When the renewal out (or last out) was sent.
    sent: Instant,
    /// When the last renewal that landed was sent, or the claim asked for while none has:
    /// the record lasts its lease (and lapse span) from then, at least, and no longer
    /// unless a later renewal lands.
    renewed: Instant,
}

/// What a renewal's answer means for renewing the claim again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Renewed or restored: renew it again when due.
    Renewable,
    /// No answer (the store failed or timed out): renew it again when due; the renewal may
    /// still land.
    Unanswered,
    /// Another owner holds the key: never renew it again.
    Lost,
}

/// A renewal the task is to send.
struct Due {
    id: u64,
    claim: HeldClaim,
}

/// One claim kept renewed until this is dropped.
#[derive(Debug)]
pub(crate) struct Renewal {
    /// The store's renewals, where the claim is removed once it is finished or dropped.
    renewals: Option<Arc<Renewals>>,
    id: u64,
}

/// What a claim's renewals leave its settlement to know.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Finished {
    /// A renewal went unanswered: on a SQL database it may still land after the
    /// settlement (`store::unanswered` makes such a settlement again).
    pub unanswered: bool,
    /// When the last renewal that landed was sent (the claim asked for, if none did): the
    /// claim lapses a lease after it, not after the settlement's first try, which may come
    /// long after renewals started failing.
    pub renewed: Instant,
}

impl Renewal {
    /// When the last renewal that landed so far was sent (see [`Finished::renewed`]). A
    /// claim lost to another owner is no longer kept here: now, as its settlement finds
    /// the other owner's record and writes nothing.
    pub(crate) fn renewed(&self) -> Instant {
        let Some(renewals) = &self.renewals else {
            return Instant::now();
        };
        let state = lock(&renewals.state);
        state
            .claims
            .get(&self.id)
            .map_or_else(Instant::now, |c| c.renewed)
    }

    /// Stops renewing, once no renewal of this claim is out any more: a settlement sent
    /// after this lands after every renewal that was answered. Returns what the renewals
    /// leave the settlement to know.
    pub(crate) async fn finish(self) -> Finished {
        // A claim lost to another owner (see `renewed`).
        let none_out = Finished {
            unanswered: false,
            renewed: Instant::now(),
        };
        let Some(renewals) = &self.renewals else {
            return none_out;
        };
        let id = self.id;
        // A renewal's answer leaves a finishing claim here to be removed once no renewal is
        // out (or by `self`'s drop, should this future be dropped first).
        loop {
            let settled = renewals.settled.notified();
            let unanswered = {
                let mut state = lock(&renewals.state);
                match state.claims.get_mut(&id) {
                    Some(claim) if claim.renewing => {
                        claim.finishing = true;
                        None
                    }
                    // Removed under the lock, so no renewal is sent in between.
                    Some(_) => state.claims.remove(&id).map(|claim| Finished {
                        unanswered: claim.unanswered,
                        renewed: claim.renewed,
                    }),
                    // Lost to another owner: nothing more to know.
                    None => Some(none_out),
                }
            };
            if let Some(finished) = unanswered {
                return finished;
            }
            settled.await;
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        if let Some(renewals) = &self.renewals {
            lock(&renewals.state).claims.remove(&self.id);
        }
    }
}

fn period(lease: Duration) -> Duration {
    (lease / RENEWALS_PER_LEASE).max(MIN_PERIOD)
}

impl Renewals {
    /// Keeps `claim`, asked for at `claimed`, renewed on `store` until the returned guard
    /// drops. Starts the store's renewing task on first use (inside a tokio runtime).
    pub(crate) fn hold<S: Renew>(
        self: &Arc<Self>,
        store: &Arc<S>,
        claim: HeldClaim,
        claimed: Instant,
    ) -> Renewal {
        let period = period(claim.lease);
        let due = Instant::now() + period;
        // Outside a runtime nothing renews (as with no task to spawn on).
        let runtime = tokio::runtime::Handle::try_current().ok();
        let (id, wake, start) = {
            let mut state = lock(&self.state);
            let id = state.next_id;
            state.next_id += 1;
            state.claims.insert(
                id,
                Claim {
                    claim,
                    due,
                    renewing: false,
                    finishing: false,
                    unanswered: false,
                    sent: claimed,
                    renewed: claimed,
                },
            );
            let start = !state.task_started && runtime.is_some();
            state.task_started |= start;
            (id, state.wake_at.is_none_or(|at| due < at), start)
        };
        // Spawned with the lock released: a runtime that is shutting down drops the task
        // at once, in this thread, and its `TaskAlive` takes the lock.
        if let (true, Some(rt)) = (start, runtime) {
            rt.spawn(renew_due(
                TaskAlive(Arc::clone(self)),
                Arc::downgrade(store),
            ));
        }
        if wake {
            self.sooner.notify_one();
        }
        Renewal {
            renewals: Some(Arc::clone(self)),
            id,
        }
    }

    /// The claims due by `now` with no renewal out, each marked and moved to its next due
    /// time, and when the task should wake next (which it records; `None`: no claim to
    /// wake for). A claim whose renewal is out sets no wake-up: its due time may be past
    /// (the store is slower than its period), and would make the task scan again at once,
    /// in a loop, until the renewal answers; the answer wakes the task for it instead.
    fn take_due(&self, now: Instant) -> (Vec<Due>, Option<Instant>) {
        let mut state = lock(&self.state);
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, held) in state.claims.iter_mut() {
            if held.finishing || held.renewing {
                continue;
            }
            if held.due <= now {
                due.push(Due {
                    id: *id,
                    claim: held.claim,
                });
                held.renewing = true;
                held.sent = now;
                held.due = now + period(held.claim.lease);
                // Out now: its answer sets its wake-up.
                continue;
            }
            next = Some(next.map_or(held.due, |at| at.min(held.due)));
        }
        state.wake_at = next;
        (due, next)
    }

    /// A renewal of claim `id` answered; whether the claim is still held (a lease that
    /// is finishing makes its renewal's answer no news, but for whether it was one). With
    /// [`Answer::Lost`], the store said the claim is no longer its token's, and it is not
    /// renewed again. Otherwise the claim is due again, and wakes the task if that is
    /// before its planned wake-up (at once, when the renewal took longer than its period).
    fn answered(&self, id: u64, answer: Answer) -> bool {
        let mut state = lock(&self.state);
        let wake_at = state.wake_at;
        let Some(claim) = state.claims.get_mut(&id) else {
            return false;
        };
        claim.unanswered |= answer == Answer::Unanswered;
        if answer == Answer::Renewable {
            claim.renewed = claim.renewed.max(claim.sent);
        }
        if claim.finishing {
            claim.renewing = false;
            drop(state);
            self.settled.notify_waiters();
            return false;
        }
        if answer == Answer::Lost {
            state.claims.remove(&id);
            return true;
        }
        claim.renewing = false;
        let wake = wake_at.is_none_or(|at| claim.due < at);
        drop(state);
        if wake {
            self.sooner.notify_one();
        }
        true
    }

    /// Lets a task waiting for claims notice that its store is gone.
    pub(crate) fn store_dropped(&self) {
        self.sooner.notify_one();
    }
}

/// Held by the renewing task: when the task ends (its store gone, or its runtime shut
/// down under it), the next claim starts a new one.
struct TaskAlive(Arc<Renewals>);

impl Drop for TaskAlive {
    fn drop(&mut self) {
        let mut state = lock(&self.0.state);
        state.task_started = false;
        state.wake_at = None;
    }
}

/// The renewing task: starts the renewals that are due, then sleeps until the next claim
/// is due or a sooner one arrives. Ends once the store is gone (it wakes the task).
async fn renew_due<S: Renew>(alive: TaskAlive, store: Weak<S>) {
    let renewals = &alive.0;
    loop {
        let (due, next) = renewals.take_due(Instant::now());
        let Some(strong) = store.upgrade() else {
            return;
        };
        // Each renewal on its own: a slow or dead store holds up one renewal per claim,
        // not every claim behind it.
        for Due { id, claim } in due {
            let (store, renewals) = (Arc::clone(&strong), Arc::clone(renewals));
            tokio::spawn(async move {
                let result = store.renew(&claim).await;
                let key = claim.key.short();
                // Unless the lease finished meanwhile, whatever the answer is no news.
                match result {
                    Ok(Renewed::Extended) => {
                        renewals.answered(id, Answer::Renewable);
                    }
                    Ok(Renewed::Restored) if renewals.answered(id, Answer::Renewable) => {
                        tracing::warn!(%key, "the store had lost a running claim; wrote it back");
                    }
                    Ok(Renewed::Restored) => {}
                    Ok(Renewed::Lost) if renewals.answered(id, Answer::Lost) => {
                        tracing::warn!(%key, "lost the claim while still running");
                    }
                    Ok(Renewed::Lost) => {}
                    Err(e) if renewals.answered(id, Answer::Unanswered) => {
                        tracing::warn!(%key, error = %e, "could not renew the claim");
                    }
                    Err(_) => {}
                }
            });
        }
        drop(strong);
        match next {
            Some(next) => tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = renewals.sooner.notified() => {}
            },
            None => renewals.sooner.notified().await,
        }
    }
}

#[cfg(test)]
mod tests;
