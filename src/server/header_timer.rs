//! hyper's header-read timer, one per connection and re-armed lazily.
//!
//! hyper asks its timer for a new sleep each time it starts reading a request head and
//! drops it once the head is parsed. With tokio's timer that is a boxed timer entry,
//! inserted into the timer wheel under its lock and removed again, for every request on a
//! keep-alive connection, for a timeout that almost never fires.
//!
//! Here a connection keeps one tokio sleep. A new deadline later than the armed one (the
//! usual case: each head gets `now + 30 s`) only records it; the armed sleep, when it fires
//! early, is re-armed at the deadline of the sleep that is waiting, so a connection
//! re-registers at most once per timeout period. A deadline earlier than the armed one
//! re-arms at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::sync::lock;

/// A [`hyper::rt::Timer`] for one connection's header reads; see the [module docs](self).
#[derive(Debug, Clone, Default)]
pub struct ConnTimer {
    armed: Arc<Mutex<Option<Pin<Box<tokio::time::Sleep>>>>>,
}

impl hyper::rt::Timer for ConnTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(self.now() + duration)
    }

    // hyper computes each head's deadline as `now() + timeout`. tokio's clock: the same as
    // std's, except in tests that pause it.
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(LazySleep {
            armed: Arc::clone(&self.armed),
            deadline: deadline.into(),
        })
    }
}

/// One header read's deadline on its connection's shared sleep.
struct LazySleep {
    armed: Arc<Mutex<Option<Pin<Box<tokio::time::Sleep>>>>>,
    deadline: tokio::time::Instant,
}

impl hyper::rt::Sleep for LazySleep {}

impl Future for LazySleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let mut armed = lock(&self.armed);
        let sleep = armed.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        // The armed deadline never lies past this one, so it fires no later than it should.
        if sleep.deadline() > deadline {
            sleep.as_mut().reset(deadline);
        }
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if sleep.deadline() >= deadline {
                return Poll::Ready(());
            }
            // An earlier head's deadline passed; this head's has not.
            sleep.as_mut().reset(deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Timer;

    fn poll(sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>) -> Poll<()> {
        sleep
            .as_mut()
            .poll(&mut Context::from_waker(std::task::Waker::noop()))
    }

    /// Moves the paused clock.
    async fn advance(by: Duration) {
        tokio::time::advance(by).await;
    }

    /// tokio rounds deadlines up to its next millisecond tick, so a deadline counts as
    /// reached 1 ms after it.
    async fn advance_past(by: Duration) {
        advance(by + Duration::from_millis(1)).await;
    }

    /// Pending until 30 s from now have passed, then ready.
    async fn fires_after_30_seconds(mut sleep: Pin<Box<dyn hyper::rt::Sleep>>) {
        assert!(poll(&mut sleep).is_pending());
        advance(Duration::from_secs(29)).await;
        assert!(poll(&mut sleep).is_pending());
        advance_past(Duration::from_secs(1)).await;
        assert!(poll(&mut sleep).is_ready());
    }

    /// Both ways hyper may ask: `sleep(timeout)`, and `sleep_until(now() + timeout)` (what
    /// its header read does), on the same clock as the sleep.
    #[tokio::test(start_paused = true)]
    async fn a_sleep_fires_at_its_deadline() {
        let timer = ConnTimer::default();
        fires_after_30_seconds(timer.sleep(Duration::from_secs(30))).await;
        let timer = ConnTimer::default();
        fires_after_30_seconds(timer.sleep_until(timer.now() + Duration::from_secs(30))).await;
    }

    /// The second head's sleep reuses the armed one; when the first deadline passes it is
    /// re-armed, and fires at the second deadline, not the first.
    #[tokio::test(start_paused = true)]
    async fn a_later_deadline_is_kept_when_the_earlier_one_passes() {
        let timer = ConnTimer::default();
        let mut first = timer.sleep(Duration::from_secs(30));
        assert!(poll(&mut first).is_pending());
        drop(first);
        advance(Duration::from_secs(10)).await;
        let mut second = timer.sleep(Duration::from_secs(30)); // due at 40 s
        assert!(poll(&mut second).is_pending());
        advance(Duration::from_secs(25)).await; // 35 s: the first deadline has passed
        assert!(poll(&mut second).is_pending());
        advance(Duration::from_secs(4)).await; // 39 s
        assert!(poll(&mut second).is_pending());
        advance_past(Duration::from_secs(1)).await; // 40 s
        assert!(poll(&mut second).is_ready());
    }

    /// A deadline earlier than the armed one re-arms at once.
    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_re_arms() {
        let timer = ConnTimer::default();
        let mut long = timer.sleep(Duration::from_secs(60));
        assert!(poll(&mut long).is_pending());
        drop(long);
        let mut short = timer.sleep(Duration::from_secs(5));
        assert!(poll(&mut short).is_pending());
        advance_past(Duration::from_secs(5)).await;
        assert!(poll(&mut short).is_ready());
    }

    /// Each connection has its own sleep: one connection's deadline does not move
    /// another's.
    #[tokio::test(start_paused = true)]
    async fn connections_do_not_share_deadlines() {
        let (a, b) = (ConnTimer::default(), ConnTimer::default());
        let mut slow = a.sleep(Duration::from_secs(30));
        let mut fast = b.sleep(Duration::from_secs(1));
        assert!(poll(&mut slow).is_pending());
        assert!(poll(&mut fast).is_pending());
        advance_past(Duration::from_secs(1)).await;
        assert!(poll(&mut fast).is_ready());
        assert!(poll(&mut slow).is_pending());
    }
}
