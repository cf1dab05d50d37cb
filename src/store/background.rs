//! Writes the store module makes in the background, after their owner has gone: a
//! settlement the store failed (or whose caller stopped waiting for it) made again, an
//! unsettled lease's drop, the release of a claim that got no answer, the repeat of a
//! settlement after an unanswered renewal. Counted here, process-wide, so that a shutdown
//! waits for them within its drain ([`finished`]) and says how many it leaves unwritten
//! ([`pending`]): the owner that started one has ended, so the proxy's count of owners
//! no longer shows it, and an exit that cut it off would lose an answer the upstream gave
//! (its claim then lapsing into an unknown outcome, or, on a store that lost the record
//! meanwhile, leaving the key free for a second run) without a word.
//!
//! Process-wide rather than per store: one process runs one store, and the spawns happen
//! deep in guards' drops that hold a [`Store`](super::Store) clone, not the proxy. Counting
//! one is two atomic operations; only a shutdown that waits makes a finishing one notify.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use tokio::sync::Notify;

static RUNNING: AtomicUsize = AtomicUsize::new(0);
/// Set once a shutdown waits in [`finished`]; until then finishing writes notify no one.
static DRAINING: AtomicBool = AtomicBool::new(false);
static CHANGED: Notify = Notify::const_new();

/// Spawns `write` on `runtime`, counted until it ends (or is dropped with its runtime).
/// Counted before the spawn, so no shutdown looks in between and misses it.
pub(crate) fn spawn<F>(runtime: &tokio::runtime::Handle, write: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let counted = Counted::new();
    runtime.spawn(async move {
        let _counted = counted;
        write.await;
    });
}

/// How many background writes are running now.
pub fn pending() -> usize {
    RUNNING.load(Ordering::SeqCst)
}

/// Waits until no background write is running, or `deadline`.
pub async fn finished(deadline: Instant) {
    // SeqCst on both sides, as in `Owners::finished`: a write ending now either sees
    // `DRAINING` and notifies, or ended before the count below is read.
    DRAINING.store(true, Ordering::SeqCst);
    loop {
        let changed = CHANGED.notified();
        if pending() == 0 {
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

/// One background write counted in [`RUNNING`].
struct Counted;

impl Counted {
    fn new() -> Self {
        RUNNING.fetch_add(1, Ordering::SeqCst);
        Self
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::SeqCst);
        if DRAINING.load(Ordering::SeqCst) {
            CHANGED.notify_waiters();
        }
    }
}

/// A place among at most `cap` background writes of one kind, which `count` counts (the
/// releases of unanswered claims, the settlements made again), given back however its
/// task ends.
pub(super) struct Place(&'static AtomicUsize);

impl Place {
    /// A place, or `None` when all `cap` are taken.
    pub(super) fn take(count: &'static AtomicUsize, cap: usize) -> Option<Self> {
        if count.fetch_add(1, Ordering::Relaxed) >= cap {
            count.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(Self(count))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
