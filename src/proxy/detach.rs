//! [`Detachable`]: a future that runs in the caller's task but is not cancelled with it.
//! Dropped before it finished (hyper drops a request's future when its client goes away),
//! it moves to a task of its own and runs to the end there.
//!
//! The owner of a claim must reach the upstream and store the answer even if its client
//! disconnected, or stopped waiting at its own deadline, so that client's retry finds the
//! answer. Detached, it runs at most until its bound ([`Detachable::bounded`]); past it the
//! future is dropped, and the guards it holds (the claim's lease) settle what it leaves.
//! What its caller would have done with the output (count the request's outcome) is done
//! by [`Detachable::when_detached_ends`]. Spawning the owner's work up
//! front gives that too, but costs every first-seen request a task (its allocation, a
//! scheduling round and a wake-up of the waiting request) and a copy of its future and
//! output; a disconnect mid-request is rare, so it pays instead.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tracing::Instrument;

/// What a detached future's end is told to (see [`Detachable::when_detached_ends`]): its
/// output, or `None` when it was dropped at its bound.
pub type Ended<F> = fn(Option<&<F as Future>::Output>);

/// See the [module docs](self). `E` is told how a detached run ended (the caller that
/// awaits it to the end learns that itself).
pub struct Detachable<F: Future + Send + 'static, E = Ended<F>>
where
    F::Output: Send + 'static,
    E: FnOnce(Option<&F::Output>) + Send + 'static,
{
    // Boxed so it can move to a task after having been polled (pinned) here.
    running: Option<Pin<Box<F>>>,
    /// The caller's span: polled here the future runs inside it anyway; moved to a task
    /// (which does not inherit it), it takes the span along, so a detached owner's log
    /// lines still carry the request's method, route and key (the `request` span of
    /// [`crate::proxy::Proxy::handle`]; a disabled span when logs are below `info`).
    span: tracing::Span,
    /// Once detached, how long it may run on: no timer is armed unless it is detached.
    bound: Option<std::time::Instant>,
    /// Once detached, a flag raised at its instant, the future then polled again: what its
    /// caller would have told it at that time, had it still been there.
    signal: Option<(std::time::Instant, Arc<AtomicBool>)>,
    /// Once detached, told how it ended; `None`: no one is.
    ended: Option<E>,
}

/// The detachable future panicked; like a panicking spawned task, the panic was caught
/// and the future dropped (guards it held, such as a claim, ran their `Drop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Panicked;

impl<F: Future + Send + 'static> Detachable<F>
where
    F::Output: Send + 'static,
{
    /// Wraps `future`; it starts when first polled.
    pub fn new(future: F) -> Self {
        Self {
            running: Some(Box::pin(future)),
            span: tracing::Span::current(),
            bound: None,
            signal: None,
            ended: None,
        }
    }

    /// Once detached, `ended` is told how the run ended: with its output, or `None` if it
    /// was dropped at its bound. What its caller, had it stayed, would have done with the
    /// output (such as counting it). Held in place: no allocation.
    pub fn when_detached_ends<E>(mut self, ended: E) -> Detachable<F, E>
    where
        E: FnOnce(Option<&F::Output>) + Send + 'static,
    {
        Detachable {
            running: self.running.take(),
            span: self.span.clone(),
            bound: self.bound,
            signal: self.signal.take(),
            ended: Some(ended),
        }
    }
}

impl<F: Future + Send + 'static, E> Detachable<F, E>
where
    F::Output: Send + 'static,
    E: FnOnce(Option<&F::Output>) + Send + 'static,
{
    /// Its caller has answered for it (it will not await it to the end, and has already
    /// accounted for the request): a detached run ends untold.
    pub fn disown(&mut self) {
        self.ended = None;
    }

    /// Once detached, `flag` is raised at `at` and the future polled again (a caller still
    /// waiting raises it itself). No timer is armed unless it is detached.
    pub fn signal_at(mut self, at: std::time::Instant, flag: Arc<AtomicBool>) -> Self {
        self.signal = Some((at, flag));
        self
    }

    /// Once detached, it is dropped at `deadline` if it has not finished by then.
    pub fn bounded(mut self, deadline: std::time::Instant) -> Self {
        self.bound = Some(deadline);
        self
    }
}

impl<F: Future + Send + 'static, E> Future for Detachable<F, E>
where
    F::Output: Send + 'static,
    E: FnOnce(Option<&F::Output>) + Send + 'static + Unpin,
{
    type Output = Result<F::Output, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let running = self
            .running
            .as_mut()
            .expect("Detachable polled after it finished");
        match catch_unwind(AssertUnwindSafe(|| running.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                self.running = None;
                Poll::Ready(Ok(output))
            }
            Err(_) => {
                self.running = None;
                Poll::Ready(Err(Panicked))
            }
        }
    }
}

impl<F: Future + Send + 'static, E> Drop for Detachable<F, E>
where
    F::Output: Send + 'static,
    E: FnOnce(Option<&F::Output>) + Send + 'static,
{
    fn drop(&mut self) {
        let Some(running) = self.running.take() else {
            return;
        };
        // Without a runtime (it is shutting down) the future is dropped: its guards still
        // release what it held.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let span = self.span.clone();
            let signal = self.signal.take();
            let bound = self.bound;
            let ended = self.ended.take();
            let detached = async move {
                let mut running = running;
                let run_on = async {
                    if let Some((at, flag)) = signal {
                        tokio::select! {
                            output = &mut running => return output,
                            _ = tokio::time::sleep_until(at.into()) => {
                                flag.store(true, Ordering::SeqCst);
                            }
                        }
                    }
                    (&mut running).await
                };
                let output = match bound {
                    Some(deadline) => tokio::time::timeout_at(deadline.into(), run_on).await.ok(),
                    None => Some(run_on.await),
                };
                // Past its bound the future is gone (its guards ran) before `ended` hears.
                drop(running);
                if let Some(ended) = ended {
                    ended(output.as_ref());
                }
            };
            runtime.spawn(detached.instrument(span));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tokio::sync::oneshot;

    /// Dropped mid-way, the future still runs to its end (in a task of its own).
    #[tokio::test]
    async fn a_dropped_detachable_runs_to_the_end() {
        let (go, wait) = oneshot::channel::<()>();
        let (done, finished) = oneshot::channel::<u32>();
        let mut detachable = Detachable::new(async move {
            wait.await.unwrap();
            done.send(7).unwrap();
        });
        // Started here, then abandoned while waiting.
        assert!(futures_poll_once(&mut detachable).is_pending());
        drop(detachable);
        go.send(()).unwrap();
        assert_eq!(finished.await.unwrap(), 7);
    }

    /// Awaited to the end, it runs in the caller's task and yields its output.
    #[tokio::test]
    async fn an_awaited_detachable_returns_its_output() {
        assert_eq!(Detachable::new(async { 5 }).await, Ok(5));
    }

    /// A panic becomes `Err(Panicked)` for the caller, after the future's guards dropped.
    #[tokio::test]
    async fn a_panic_is_caught_and_the_future_dropped() {
        struct Guard(Arc<AtomicBool>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = Guard(dropped.clone());
        let result = Detachable::new(async move {
            let _guard = guard;
            panic!("owner failed");
        })
        .await;
        assert_eq!(result, Err(Panicked));
        assert!(dropped.load(Ordering::SeqCst));
    }

    /// Detached with a bound, the future is dropped at it, and its guards run.
    #[tokio::test]
    async fn a_detached_future_is_dropped_at_its_bound() {
        struct Guard(Option<oneshot::Sender<()>>);
        impl Drop for Guard {
            fn drop(&mut self) {
                let _ = self.0.take().unwrap().send(());
            }
        }
        let (dropped, was_dropped) = oneshot::channel::<()>();
        let guard = Guard(Some(dropped));
        let mut detachable = Detachable::new(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        })
        .bounded(std::time::Instant::now() + std::time::Duration::from_millis(50));
        assert!(futures_poll_once(&mut detachable).is_pending());
        drop(detachable);
        // The hang guard only: the bound, not this timeout, ends the future.
        tokio::time::timeout(std::time::Duration::from_secs(30), was_dropped)
            .await
            .expect("the future outlived its bound")
            .unwrap();
    }

    /// Detached with a signal, the flag is raised at its instant and the future, polled
    /// again, sees it (here: ends with what it saw).
    #[tokio::test]
    async fn a_detached_future_is_signalled_at_its_instant() {
        let flag = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&flag);
        let (done, finished) = oneshot::channel::<bool>();
        let mut done = Some(done);
        let mut detachable = Detachable::new(std::future::poll_fn(move |_| {
            if seen.load(Ordering::SeqCst) {
                let _ = done.take().unwrap().send(true);
                return Poll::Ready(());
            }
            // Never woken by anything but the signal.
            Poll::Pending
        }))
        .signal_at(
            std::time::Instant::now() + std::time::Duration::from_millis(20),
            Arc::clone(&flag),
        );
        assert!(futures_poll_once(&mut detachable).is_pending());
        drop(detachable);
        let saw = tokio::time::timeout(std::time::Duration::from_secs(30), finished)
            .await
            .expect("hang guard: the signal never reached the future")
            .unwrap();
        assert!(saw && flag.load(Ordering::SeqCst));
    }

    /// Detached, its end is told the output, or `None` past its bound; awaited by its
    /// caller, or disowned, it is told nothing.
    #[tokio::test]
    async fn a_detached_end_is_told_how_it_ended() {
        let (tell, told) = tokio::sync::mpsc::unbounded_channel::<Option<u32>>();
        let detached = |future: Pin<Box<dyn Future<Output = u32> + Send>>| {
            let tell = tell.clone();
            Detachable::new(future).when_detached_ends(move |ended: Option<&u32>| {
                tell.send(ended.copied()).unwrap();
            })
        };
        let (go, wait) = oneshot::channel::<()>();
        let mut finishing = detached(Box::pin(async move {
            wait.await.unwrap();
            7
        }));
        assert!(futures_poll_once(&mut finishing).is_pending());
        drop(finishing);
        go.send(()).unwrap();
        let mut stuck = detached(Box::pin(std::future::pending()))
            .bounded(std::time::Instant::now() + std::time::Duration::from_millis(20));
        assert!(futures_poll_once(&mut stuck).is_pending());
        drop(stuck);
        assert_eq!(detached(Box::pin(async { 5 })).await, Ok(5));
        let mut disowned = detached(Box::pin(async { 9 }));
        disowned.disown();
        drop(disowned);
        drop(tell);
        let mut told = told;
        let mut heard = Vec::new();
        while let Some(ended) =
            tokio::time::timeout(std::time::Duration::from_secs(30), told.recv())
                .await
                .expect("hang guard: a detached end was never told")
        {
            heard.push(ended);
        }
        heard.sort();
        assert_eq!(heard, [None, Some(7)]);
    }

    fn futures_poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
        let waker = std::task::Waker::noop();
        Pin::new(future).poll(&mut Context::from_waker(waker))
    }
}
