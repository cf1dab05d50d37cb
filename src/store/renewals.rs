//! Renewal of live Redis claims: one task per store renews every claim a [`super::Lease`]
//! holds, each at a third of its lease. A task spawned per claim cost every first-seen
//! request a spawn, a timer armed and an abort (~2k instructions, callgrind), for a
//! renewal that almost no request lives long enough to need.
//!
//! Holding a claim here is a map insert and a removal under a short lock. The task sleeps
//! until the earliest renewal is due, or with no claim held until one is; a claim due
//! sooner than the task's planned wake-up (the first, or a shorter lease) wakes it. A
//! store and its task belong to one runtime, as its Redis connection does.

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
    /// When the task wakes next; `None` while it waits for a first claim (or has not run).
    wake_at: Option<Instant>,
    task_started: bool,
}

#[derive(Debug)]
struct Claim {
    key: Digest,
    token: OwnerToken,
    lease: Duration,
    due: Instant,
    /// A renewal is out: a slow Redis gets one per claim at a time, not one per period.
    renewing: bool,
}

/// A renewal the task is to send.
struct Due {
    id: u64,
    key: Digest,
    token: OwnerToken,
    lease: Duration,
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
        // Outside a runtime nothing renews (as with no task to spawn on).
        let runtime = tokio::runtime::Handle::try_current().ok();
        let (id, wake, start) = {
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
                    renewing: false,
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
            renewals: Arc::clone(self),
            id,
        }
    }

    /// The claims due by `now` with no renewal out, each marked and moved to its next due
    /// time, and when the task should wake next (which it records; `None`: no claim held).
    fn take_due(&self, now: Instant) -> (Vec<Due>, Option<Instant>) {
        let mut state = lock(&self.state);
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, claim) in state.claims.iter_mut() {
            if claim.due <= now && !claim.renewing {
                due.push(Due {
                    id: *id,
                    key: claim.key,
                    token: claim.token,
                    lease: claim.lease,
                });
                claim.renewing = true;
                claim.due = now + period(claim.lease);
            }
            next = Some(next.map_or(claim.due, |at| at.min(claim.due)));
        }
        state.wake_at = next;
        (due, next)
    }

    /// A renewal of claim `id` answered; whether the claim is still held (a lease that
    /// finished meanwhile makes its renewal's answer no news). With `lost`, the store
    /// said the claim is no longer its token's, and it is not renewed again.
    fn answered(&self, id: u64, lost: bool) -> bool {
        let mut state = lock(&self.state);
        if lost {
            return state.claims.remove(&id).is_some();
        }
        match state.claims.get_mut(&id) {
            Some(claim) => {
                claim.renewing = false;
                true
            }
            None => false,
        }
    }

    /// Every claim held now, with its owner's token.
    pub(crate) fn held(&self) -> Vec<(Digest, OwnerToken)> {
        let state = lock(&self.state);
        state.claims.values().map(|c| (c.key, c.token)).collect()
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
async fn renew_due(alive: TaskAlive, store: Weak<RedisStore>) {
    let renewals = &alive.0;
    loop {
        let (due, next) = renewals.take_due(Instant::now());
        let Some(strong) = store.upgrade() else {
            return;
        };
        // Each renewal on its own, as each claim's own task did: a slow or dead Redis
        // holds up one renewal per claim, not every claim behind it.
        for Due {
            id,
            key,
            token,
            lease,
        } in due
        {
            let (store, renewals) = (Arc::clone(&strong), Arc::clone(renewals));
            tokio::spawn(async move {
                let result = store.renew(key, token, lease).await;
                // Unless the lease finished meanwhile, whatever the answer is no news.
                match result {
                    Ok(true) => {
                        renewals.answered(id, false);
                    }
                    Ok(false) if renewals.answered(id, true) => {
                        tracing::warn!(key = %key.short(), "lost the claim while still running");
                    }
                    Ok(false) => {}
                    Err(e) if renewals.answered(id, false) => {
                        tracing::warn!(key = %key.short(), error = %e, "could not renew the claim");
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
