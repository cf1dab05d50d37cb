//! [`Signal`]: something that happens once per process (the accept loop stops, a drain
//! starts), waited on by many tasks, each polling it beside its own work.
//!
//! A connection task polls its stop future beside the connection each time it wakes, two
//! or three times per request; an owner's client polls the drain's beside its upstream
//! call. A `watch` channel's `changed()`, or a `Notify`'s `Notified` once registered, locks
//! the waiter list on every one of those polls to re-register the task's waker, a cost
//! paid per request for a signal sent once per process. Here the waker is registered
//! once, and again only if the task polls with another waker; every other poll is one
//! atomic load.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};

use tokio::sync::Notify;

/// Sent once; see the [module docs](self).
#[derive(Debug, Clone, Default)]
pub(crate) struct Signal {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    sent: AtomicBool,
    notify: Notify,
}

impl Signal {
    /// Wakes every task waiting in [`Signal::sent`], and every later call returns at once.
    pub(crate) fn send(&self) {
        self.inner.sent.store(true, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }

    /// Resolves once [`Signal::send`] has been called.
    pub(crate) async fn sent(&self) {
        let inner = &*self.inner;
        // Created before the first look at the flag: `notify_waiters` reaches a
        // `Notified` made before it even if not yet polled, so no send falls in between.
        let mut notified = pin!(inner.notify.notified());
        let mut registered: Option<Waker> = None;
        std::future::poll_fn(|cx| {
            if inner.sent.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            if registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                return Poll::Pending;
            }
            if notified.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            registered = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::{Context, Wake};

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll_with(future: std::pin::Pin<&mut impl Future<Output = ()>>, waker: &Waker) -> Poll<()> {
        future.poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn a_send_before_the_first_poll_resolves_it() {
        let signal = Signal::default();
        let mut sent = pin!(signal.sent());
        signal.send();
        assert!(poll_with(sent.as_mut(), Waker::noop()).is_ready());
    }

    #[test]
    fn a_send_wakes_a_waiting_task_once_and_resolves_it() {
        let signal = Signal::default();
        let counter = Arc::new(Counter::default());
        let waker = Waker::from(Arc::clone(&counter));
        let mut sent = pin!(signal.sent());
        // Polled many times by the same task, as a connection's wake-ups do.
        for _ in 0..3 {
            assert!(poll_with(sent.as_mut(), &waker).is_pending());
        }
        signal.send();
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert!(poll_with(sent.as_mut(), &waker).is_ready());
    }

    /// The registration follows the waker: a poll with another one moves it there.
    #[test]
    fn the_latest_waker_is_the_one_woken() {
        let signal = Signal::default();
        let (first, second) = (Arc::new(Counter::default()), Arc::new(Counter::default()));
        let mut sent = pin!(signal.sent());
        assert!(poll_with(sent.as_mut(), &Waker::from(Arc::clone(&first))).is_pending());
        assert!(poll_with(sent.as_mut(), &Waker::from(Arc::clone(&second))).is_pending());
        signal.send();
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
    }
}
