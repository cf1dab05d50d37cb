//! Renewal of live Redis claims: one task per store renews every claim a [`super::Lease`]
//! holds, each at a third of its lease. A task spawned per claim cost every first-seen
//! request a spawn, a timer armed and an abort (~2k instructions, callgrind), for a
//! renewal that almost no request lives long enough to need.
//!
//! Holding a claim here is a map insert and a removal under a short lock. The task sleeps
//! until the earliest renewal is due; a claim due sooner than that (a shorter lease than
//! any seen before, or the first claim) wakes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::redis::RedisStore;
use super::OwnerToken;
use crate::key::Digest;
use crate::sync::lock;

/// Renews at a third of the lease, so two renewals can fail before the claim lapses.
const RENEWALS_PER_LEASE: u32 = 3;
/// Floor of the renewal period, so a tiny lease cannot make the task spin.
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// The claims one Redis store renews, shared by the leases and the renewing task.
#[derive(Debug, Default)]
pub(crate) struct Renewals {
    state: Mutex<State>,
    /// Wakes the task for a claim due before the task's planned wake-up.
    sooner: Notify,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    claims: HashMap<u64, Claim>,
    /// When the task wakes next; `None` before it runs (a first claim then wakes it).
    wake_at: Option<Instant>,
    /// The shortest renewal period seen: with no claim held, the task wakes at this pace,
    /// so a new claim never waits longer than its own period to be looked at.
    idle_period: Option<Duration>,
    task_started: bool,
}

#[derive(Debug)]
struct Claim {
    key: Digest,
    token: OwnerToken,
    lease: Duration,
    due: Instant,
}

/// One claim kept renewed until this is dropped.
#[derive(Debug)]
pub(crate) struct Renewal {
    renewals: Arc<Renewals>,
    id: u64,
}

impl Drop for Renewal {
    fn drop(&mut self) {
        lock(&self.renewals.state).claims.remove(&self.id);
    }
}

fn period(lease: Duration) -> Duration {
    (lease / RENEWALS_PER_LEASE).max(MIN_PERIOD)
}

impl Renewals {
    /// Keeps `key`'s claim by `token` renewed on `store` until the returned guard drops.
    /// Starts the store's renewing task on first use (inside a tokio runtime).
    pub(crate) fn hold(
        self: &Arc<Self>,
        store: &Arc<RedisStore>,
        key: Digest,
        token: OwnerToken,
        lease: Duration,
    ) -> Renewal {
        let period = period(lease);
        let due = Instant::now() + period;
        let (id, wake) = {
            let mut state = lock(&self.state);
            let id = state.next_id;
            state.next_id += 1;
            state.claims.insert(
                id,
                Claim {
                    key,
                    token,
                    lease,
                    due,
                },
            );
            if state.idle_period.is_none_or(|idle| period < idle) {
                state.idle_period = Some(period);
            }
            if !state.task_started {
                // Outside a runtime nothing renews (as with no task to spawn on).
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    state.task_started = true;
                    let alive = TaskAlive(Arc::clone(self));
                    rt.spawn(renew_due(alive, Arc::downgrade(store)));
                }
            }
            (id, state.wake_at.is_none_or(|at| due < at))
        };
        if wake {
            self.sooner.notify_one();
        }
        Renewal {
            renewals: Arc::clone(self),
            id,
        }
    }

    /// The claims due by `now`, each moved to its next due time, and when the task should
    /// wake next (which it records).
    fn take_due(&self, now: Instant) -> (Vec<(u64, Digest, OwnerToken, Duration)>, Instant) {
        let mut state = lock(&self.state);
        let mut due = Vec::new();
        let mut next = now + state.idle_period.unwrap_or(MIN_PERIOD);
        for (id, claim) in state.claims.iter_mut() {
            if claim.due <= now {
                due.push((*id, claim.key, claim.token, claim.lease));
                claim.due = now + period(claim.lease);
            }
            next = next.min(claim.due);
        }
        state.wake_at = Some(next);
        (due, next)
    }

    /// Stops renewing a claim the store says is no longer `token`'s; whether it was still
    /// held (a lease that finished meanwhile is not news).
    fn lost(&self, id: u64) -> bool {
        lock(&self.state).claims.remove(&id).is_some()
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
/// is due or a sooner one arrives. Ends once the store is gone.
async fn renew_due(alive: TaskAlive, store: Weak<RedisStore>) {
    let renewals = &alive.0;
    loop {
        let (due, next) = renewals.take_due(Instant::now());
        let Some(strong) = store.upgrade() else {
            return;
        };
        // Each renewal on its own, as each claim's own task did: a slow or dead Redis
        // holds up one renewal per claim, not every claim behind it.
        for (id, key, token, lease) in due {
            let (store, renewals) = (Arc::clone(&strong), Arc::clone(renewals));
            tokio::spawn(async move {
                match store.renew(key, token, lease).await {
                    Ok(true) => {}
                    // Unless the lease finished meanwhile, which is no news.
                    Ok(false) if renewals.lost(id) => {
                        tracing::warn!(key = %key.short(), "lost the claim while still running");
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(key = %key.short(), error = %e, "could not renew the claim");
                    }
                }
            });
        }
        drop(strong);
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = renewals.sooner.notified() => {}
        }
    }
}
