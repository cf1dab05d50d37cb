//! What a shutdown needs from the proxy: the owners to wait for ([`Owners`]), and when
//! the requests it holds must have been answered ([`Stopping`]).
//!
//! A shutdown lets open requests finish for `drain_timeout`, then the process exits and
//! every connection still open is cut without an answer, its client left to guess. So
//! once the drain starts, whatever still waits is answered a little before the drain ends,
//! as if its own deadline had passed then:
//!
//! - a duplicate waiting on an owner (its `wait_timeout` may well be longer) gets what a
//!   wait that timed out gets: `409 in-flight` with `Retry-After`, which sends its client
//!   to retry where the key's answer will be;
//! - an owner whose request went out gets what its `upstream_timeout` would give: a `504`
//!   saying the request may still be running. Its claim is kept (see [`Owners`]) and its
//!   call runs on, detached, for as long as the process lives;
//! - an owner still waiting for an upstream connection gives up and frees its key, as it
//!   would at its `upstream_timeout`, instead of leaving a claim that lapses into a held
//!   unknown outcome for a request that never went out.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::signal::Signal;

/// The owners running in this process right now, so a shutdown can wait for them. Those
/// still running when the drain ends keep their claims: their requests went out, so no
/// other replica may run them again (it treats them as dead owners once their leases
/// lapse). The process exits without dropping them, so no lease of theirs settles on its
/// way out; on the memory store their claims end with it all the same. What they hand to
/// the background once ended (a settlement the store failed) is counted in
/// `crate::store::background`, which the shutdown waits for next.
///
/// Holding a claim here is two atomic operations.
#[derive(Debug, Default)]
pub struct Owners {
    running: AtomicUsize,
    /// Set once a shutdown waits in [`Owners::finished`]; until then finishing owners
    /// notify no one (a notification takes a lock).
    draining: AtomicBool,
    changed: tokio::sync::Notify,
}

impl Owners {
    /// Counts an owner until the guard drops.
    pub(super) fn hold(self: &Arc<Self>) -> OwnedGuard {
        self.running.fetch_add(1, Ordering::SeqCst);
        OwnedGuard {
            owners: Arc::clone(self),
        }
    }

    /// How many claims are owned now.
    pub fn len(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Whether no claim is owned.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until every owner has finished, or `deadline`.
    pub async fn finished(&self, deadline: Instant) {
        // SeqCst on both sides: an owner finishing now either sees `draining` and notifies,
        // or finished before the count below is read.
        self.draining.store(true, Ordering::SeqCst);
        loop {
            let changed = self.changed.notified();
            if self.is_empty() {
                return;
            }
            if tokio::time::timeout_at(deadline.into(), changed)
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

/// One owner counted in [`Owners`].
pub(super) struct OwnedGuard {
    owners: Arc<Owners>,
}

impl Drop for OwnedGuard {
    fn drop(&mut self) {
        self.owners.running.fetch_sub(1, Ordering::SeqCst);
        if self.owners.draining.load(Ordering::SeqCst) {
            self.owners.changed.notify_waiters();
        }
    }
}

/// The longest a held request's answer is given, before the drain ends, to reach its
/// client; never more than half the drain.
const ANSWER_MARGIN: Duration = Duration::from_secs(1);

/// See the [module docs](self).
#[derive(Debug, Default)]
pub struct Stopping {
    /// When held requests are answered; set once, when the drain starts.
    answer_at: OnceLock<Instant>,
    /// Sent once `answer_at` is set. Every owner's client waits on it beside its upstream
    /// call: a [`Signal`], whose polls are an atomic load.
    started: Signal,
}

impl Stopping {
    /// The drain started now and lasts `drain`: held requests are answered shortly before
    /// it ends.
    pub fn begin(&self, drain: Duration) {
        let margin = ANSWER_MARGIN.min(drain / 2);
        let _ = self.answer_at.set(Instant::now() + drain - margin);
        self.started.send();
    }

    /// Resolves once the drain has started (never, unless one did). Tunnels end then: they
    /// carry no request to finish, and one left open would hold the drain to its end.
    pub async fn begun(&self) {
        self.started.sent().await;
    }

    /// Resolves when a duplicate still waiting, or an owner's client still waiting for the
    /// upstream's answer, must be answered, and an owner whose request has not gone out
    /// must give its key up (never, unless a drain started).
    pub async fn answer_now(&self) {
        self.started.sent().await;
        // Set before `started` was sent.
        if let Some(at) = self.answer_at.get() {
            tokio::time::sleep_until((*at).into()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A drain started while someone waits answers it before the drain ends; a drain
    /// started before the wait too.
    #[tokio::test]
    async fn a_wait_ends_before_the_drain_does() {
        let stopping = std::sync::Arc::new(Stopping::default());
        let waiting = tokio::spawn({
            let stopping = std::sync::Arc::clone(&stopping);
            async move { stopping.answer_now().await }
        });
        tokio::task::yield_now().await;
        let drain = Duration::from_millis(100);
        let started = Instant::now();
        stopping.begin(drain);
        tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("hang guard: the wait never ended")
            .unwrap();
        assert!(*stopping.answer_at.get().expect("set") < started + drain);
        tokio::time::timeout(Duration::from_secs(30), stopping.answer_now())
            .await
            .expect("hang guard: a later wait never ended");
    }
}
