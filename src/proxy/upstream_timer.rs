//! The upstream timeout, on a timer each client connection keeps for its requests.
//!
//! `tokio::time::timeout` makes a timer entry per request, inserts it into the timer wheel
//! on its first poll and removes it again when dropped, under the wheel's lock, on every
//! proxied request, for a timeout that almost never fires. A later deadline on an armed tokio sleep only records the new time (the
//! wheel re-files the entry if the old time comes first), so a connection whose requests
//! take turns with one sleep pays the insertion once per timeout period instead.
//!
//! Each request borrows the connection's sleep for as long as it waits and puts it back
//! when done; a request that finds it lent out (concurrent HTTP/2 streams) makes its own.
//! A sleep wakes one waker, so it is never shared by two waiting requests.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tokio::time::Sleep;

/// One client connection's reusable upstream timer; clones share it.
#[derive(Debug, Clone, Default)]
pub struct UpstreamTimer {
    idle: Arc<Mutex<Option<Pin<Box<Sleep>>>>>,
}

impl UpstreamTimer {
    /// Runs `future` until `deadline`: its output, or `None` if the deadline came first.
    pub fn timeout_at<F: Future>(&self, deadline: Instant, future: F) -> Timeout<'_, F> {
        Timeout {
            future,
            lent: Lent {
                timer: self,
                sleep: None,
                deadline: deadline.into(),
                waker: None,
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// [`UpstreamTimer::timeout_at`]'s future. A named type rather than an `async fn`: an
    /// async fn keeps the future it is given twice in its state (as its argument and as the
    /// pinned local it awaits), and these futures hold a whole upstream exchange, which the
    /// owner's path copies when it boxes it.
    pub struct Timeout<'a, F> {
        #[pin]
        future: F,
        lent: Lent<'a>,
    }
}

impl<F: Future> Future for Timeout<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // The future first, as tokio's timeout does: an answer that is ready counts even
        // when the deadline has passed too.
        if let Poll::Ready(output) = this.future.poll(cx) {
            return Poll::Ready(Some(output));
        }
        this.lent.poll(cx).map(|()| None)
    }
}

/// The connection's sleep while one request waits on it.
struct Lent<'a> {
    timer: &'a UpstreamTimer,
    sleep: Option<Pin<Box<Sleep>>>,
    deadline: tokio::time::Instant,
    /// The waker the sleep was last polled with, by this request.
    waker: Option<Waker>,
}

impl Lent<'_> {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let sleep = self.sleep.get_or_insert_with(|| {
            // Never waits on the lock: a connection's requests rarely overlap, and one that
            // finds it taken makes a sleep of its own.
            let idle = self
                .timer
                .idle
                .try_lock()
                .ok()
                .and_then(|mut idle| idle.take());
            match idle {
                Some(mut sleep) => {
                    sleep.as_mut().reset(deadline);
                    sleep
                }
                None => Box::pin(tokio::time::sleep_until(deadline)),
            }
        });
        // Registered with this task's waker: until it fires there is nothing to renew, and
        // the check is a load instead of a coop-budget and waker round (two or three polls
        // per request).
        if self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return if sleep.is_elapsed() {
                Poll::Ready(())
            } else {
                Poll::Pending
            };
        }
        let polled = sleep.as_mut().poll(cx);
        self.waker = Some(cx.waker().clone());
        polled
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(sleep) = self.sleep.take() {
            if let Ok(mut idle) = self.timer.idle.try_lock() {
                if idle.is_none() {
                    *idle = Some(sleep);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn in_secs(secs: u64) -> Instant {
        (tokio::time::Instant::now() + Duration::from_secs(secs)).into_std()
    }

    /// A timer that never fires would hang the test; this fails it instead (the clock is
    /// paused, so the hour passes at once).
    async fn within_an_hour<T>(future: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(3600), future)
            .await
            .expect("the timer never fired")
    }

    #[tokio::test(start_paused = true)]
    async fn a_future_that_ends_in_time_gives_its_output() {
        let timer = UpstreamTimer::default();
        let output = timer
            .timeout_at(in_secs(30), async {
                tokio::time::sleep(Duration::from_secs(29)).await;
                7
            })
            .await;
        assert_eq!(output, Some(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_future_past_its_deadline_is_cut_off() {
        let timer = UpstreamTimer::default();
        let output =
            within_an_hour(timer.timeout_at(in_secs(30), std::future::pending::<()>())).await;
        assert_eq!(output, None);
    }

    /// The second request reuses the first one's sleep, armed for 30 s from the first
    /// request's start; it still fires at the second request's own deadline, later.
    #[tokio::test(start_paused = true)]
    async fn a_reused_sleep_fires_at_the_new_deadline() {
        let timer = UpstreamTimer::default();
        let quick = timer
            .timeout_at(in_secs(30), tokio::time::sleep(Duration::from_secs(1)))
            .await;
        assert_eq!(quick, Some(()));
        assert!(
            timer.idle.lock().unwrap().is_some(),
            "the sleep was put back"
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        let started = tokio::time::Instant::now();
        let cut = within_an_hour(timer.timeout_at(in_secs(30), std::future::pending::<()>())).await;
        assert_eq!(cut, None);
        assert!(started.elapsed() >= Duration::from_secs(30));
    }

    /// A shorter timeout after a longer one fires at its own, earlier, deadline.
    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_on_a_reused_sleep_fires_early() {
        let timer = UpstreamTimer::default();
        let quick = timer
            .timeout_at(in_secs(300), tokio::time::sleep(Duration::from_secs(1)))
            .await;
        assert_eq!(quick, Some(()));
        let started = tokio::time::Instant::now();
        let cut = within_an_hour(timer.timeout_at(in_secs(5), std::future::pending::<()>())).await;
        assert_eq!(cut, None);
        assert!(started.elapsed() < Duration::from_secs(6));
    }

    /// Two requests waiting at once each have a sleep of their own, and both fire.
    #[tokio::test(start_paused = true)]
    async fn overlapping_requests_each_get_a_sleep() {
        let timer = UpstreamTimer::default();
        let first = timer.timeout_at(in_secs(10), std::future::pending::<()>());
        let second = timer.timeout_at(in_secs(20), std::future::pending::<()>());
        assert_eq!(
            within_an_hour(async { tokio::join!(first, second) }).await,
            (None, None)
        );
    }
}
