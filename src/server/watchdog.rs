//! A client connection's watchdog: what closes a connection that holds its slot without
//! using it, and one whose client does not take its answers.
//!
//! hyper bounds only the reading of an HTTP/1.1 request head; nothing bounds a connection
//! that sends nothing, or part of the HTTP/2 preface (hyper-util reads it to choose the
//! protocol, with no timer), or an HTTP/2 connection with no request, and a client that
//! stops reading its answer holds the connection, and the upstream connection the answer
//! streams from, for as long as it likes. So each connection has a [`Watch`], fed by:
//! - [`Watched`], its service: a request is open from its head (the service call) until its
//!   answer's body is done or dropped ([`Tracked`]);
//! - [`Tracked`], each answer's body: it notes when it hands hyper a frame, and whether
//!   hyper has come back for the next (when the client does not read, it does not: a full
//!   socket for HTTP/1.1, a spent flow-control window for HTTP/2);
//! - [`Metered`], the socket (under TLS): it notes since when a write waits.
//!
//! A [`Watchdog`] polled beside the connection fires:
//! - [`Expired::Idle`] when no request has been open for the head timeout, from accept or
//!   from the end of the last answer: a connection that has not completed a request head
//!   in that time (whatever its protocol, before or after TLS), or an idle kept-alive one
//!   (nginx's `client_header_timeout` and `keepalive_timeout`, Envoy's `idle_timeout`);
//! - [`Expired::Send`] when the client has taken nothing for the send timeout while an
//!   answer waits for it (nginx's `send_timeout`): a write that makes no progress, or a
//!   frame hyper took and could not pass on.
//!
//! Its state lives in atomics so that HTTP/2 streams, which run on tasks of their own, can
//! feed it. Feeding it is cheap, because nothing that feeds it touches the timer or wakes
//! the connection's task: every deadline a change can set lies at least `check` (the
//! shorter of the two timeouts) after the change, and the watchdog's timer is never armed
//! further out than `check` (both to the clock's millisecond). When the timer fires, the
//! watchdog reads the true deadline and fires or re-arms (the lazy idle timer of nginx and
//! Envoy); between firings, a poll costs an atomic load or two. The one change that can
//! bring a deadline into the past, a waiting write progressing on an idle connection (its
//! head timeout, paused while the write waited, may have passed), asks for a check at the
//! next poll: the write runs on the connection's task, which polls the watchdog after it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

// Orderings. The counts (`open`, `handed`) and `write_waits_since` say which deadlines
// apply; the times (`idle_since`, `progress_at`) say where. A writer stores the time, then
// changes the count with Release; the watchdog loads the count with Acquire, then the time,
// so a count it sees comes with a time at least as new as the one written before it. The
// times themselves, and the decrements that only drop a deadline, need no ordering of
// their own (Relaxed); nothing here needs a single total order (SeqCst).
use Ordering::{Acquire, Relaxed, Release};

/// Why a [`Watchdog`] fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// No request open for the head timeout: close gracefully.
    Idle,
    /// An answer waited the send timeout for the client to take something: close now.
    Send,
}

/// One connection's state; see the [module docs](self). Times are milliseconds since
/// `epoch` (the accept): the bounds are seconds, so a millisecond clock is fine.
#[derive(Debug)]
pub struct Watch {
    epoch: Instant,
    head: Duration,
    send: Duration,
    /// Requests whose head was read and whose answer is not done.
    open: AtomicUsize,
    /// When the last answer ended (0: accept).
    idle_since: AtomicU64,
    /// Answers that handed hyper a frame and were not polled since.
    handed: AtomicUsize,
    /// When an answer last handed hyper a frame, or a waiting write progressed.
    progress_at: AtomicU64,
    /// Since when a write to the socket waits, plus one (0: none waits).
    write_waits_since: AtomicU64,
    /// A change may have brought a deadline into the past: the watchdog checks at its
    /// next poll instead of waiting for its timer.
    recheck: AtomicBool,
}

impl Watch {
    /// The watch of a connection accepted now: `head` bounds the time without an open
    /// request, `send` the time an answer waits for the client.
    pub fn new(head: Duration, send: Duration) -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            head,
            send,
            open: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            handed: AtomicUsize::new(0),
            progress_at: AtomicU64::new(0),
            write_waits_since: AtomicU64::new(0),
            recheck: AtomicBool::new(false),
        })
    }

    /// How long the connection may go without a request.
    pub fn head(&self) -> Duration {
        self.head
    }

    /// The longest the watchdog's timer may be armed for: no change sets a deadline
    /// sooner than this after it (at least a millisecond, the clock's grain).
    fn check(&self) -> Duration {
        self.head.min(self.send).max(Duration::from_millis(1))
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn at(&self, millis: u64) -> Instant {
        self.epoch + Duration::from_millis(millis)
    }

    /// The next deadline, and what passing it means; `None`: nothing to watch for now (a
    /// request is open and no answer waits for the client).
    fn due(&self) -> Option<(Instant, Expired)> {
        let mut due: Option<(Instant, Expired)> = None;
        let mut sooner = |at: Instant, why: Expired| {
            if due.is_none_or(|(d, _)| at < d) {
                due = Some((at, why));
            }
        };
        let waits_since = self.write_waits_since.load(Acquire);
        if waits_since != 0 {
            sooner(self.at(waits_since - 1) + self.send, Expired::Send);
        }
        if self.handed.load(Acquire) > 0 {
            sooner(
                self.at(self.progress_at.load(Relaxed)) + self.send,
                Expired::Send,
            );
        }
        // An answer still being written (HTTP/1.1 writes a whole small answer after hyper
        // dropped its body) is the send timeout's to bound.
        if self.open.load(Acquire) == 0 && waits_since == 0 {
            sooner(
                self.at(self.idle_since.load(Relaxed)) + self.head,
                Expired::Idle,
            );
        }
        due
    }

    fn write_waits(&self) {
        // Only the connection's task writes: a load then a store do not race.
        if self.write_waits_since.load(Relaxed) == 0 {
            self.write_waits_since.store(self.now() + 1, Release);
        }
    }

    fn write_progressed(&self) {
        if self.write_waits_since.load(Relaxed) != 0 {
            self.progress_at.fetch_max(self.now(), Relaxed);
            self.write_waits_since.store(0, Release);
            // With no request open, the head timeout applies again, from the end of the
            // last answer: it may have passed while the write waited.
            self.recheck.store(true, Release);
        }
    }
}

/// Fires when the connection it watches should close; see the [module docs](self).
#[derive(Debug)]
pub struct Watchdog {
    watch: Arc<Watch>,
    sleep: Pin<Box<Sleep>>,
    /// The waker the armed timer holds; `None`: the timer was not polled since it was
    /// armed.
    waker: Option<Waker>,
}

impl Watchdog {
    /// Watches `watch`.
    pub fn new(watch: Arc<Watch>) -> Self {
        let sleep = Box::pin(tokio::time::sleep_until(watch.epoch + watch.check()));
        Self {
            watch,
            sleep,
            waker: None,
        }
    }
}

impl Watchdog {
    /// The timer fired, or may not hold this task's waker, or a change asked for a check:
    /// reads the true deadline, and fires or re-arms. Out of line, so that the usual poll
    /// stays a few instructions.
    #[cold]
    #[inline(never)]
    fn rearm(&mut self, cx: &mut Context<'_>) -> Poll<Expired> {
        self.watch.recheck.store(false, Relaxed);
        loop {
            let now = Instant::now();
            // Never further out than `check`: a change after now sets no sooner deadline.
            let mut next = now + self.watch.check();
            if let Some((at, why)) = self.watch.due() {
                if at <= now {
                    return Poll::Ready(why);
                }
                next = next.min(at);
            }
            self.sleep.as_mut().reset(next);
            if self.sleep.as_mut().poll(cx).is_pending() {
                if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    self.waker = Some(cx.waker().clone());
                }
                return Poll::Pending;
            }
        }
    }
}

impl Future for Watchdog {
    type Output = Expired;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Expired> {
        let this = &mut *self;
        // The usual poll (the connection's task woke for its socket): the armed timer
        // holds this task's waker and has not fired, and no change asked for a check.
        if !this.watch.recheck.load(Acquire)
            && this.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()))
            && !this.sleep.is_elapsed()
        {
            return Poll::Pending;
        }
        this.rearm(cx)
    }
}

/// An open request: from its head until its answer is done or dropped.
#[derive(Debug)]
struct Open(Arc<Watch>);

impl Open {
    fn new(watch: &Arc<Watch>) -> Self {
        // Only drops the idle deadline: no ordering needed.
        watch.open.fetch_add(1, Relaxed);
        Self(Arc::clone(watch))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        // The end time first, then the count with Release: a watchdog that sees no request
        // open must not read the previous end. The maximum: HTTP/2 streams that end at once
        // store in any order. No wake: the head timeout from now ends after the armed timer.
        self.0.idle_since.fetch_max(self.0.now(), Relaxed);
        self.0.open.fetch_sub(1, Release);
    }
}

/// A connection's service, counting its open requests; see the [module docs](self).
#[derive(Debug)]
pub struct Watched<S> {
    inner: S,
    watch: Arc<Watch>,
}

impl<S> Watched<S> {
    /// `inner`, watched by `watch`.
    pub fn new(inner: S, watch: Arc<Watch>) -> Self {
        Self { inner, watch }
    }
}

impl<S, B, E> hyper::service::Service<Request<Incoming>> for Watched<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>, Error = E>,
{
    type Response = Response<Tracked<B>>;
    type Error = E;
    type Future = Answering<S::Future>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        Answering {
            open: Some(Open::new(&self.watch)),
            inner: self.inner.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's future, whose answer carries the request's [`Open`] in its body.
    pub struct Answering<F> {
        #[pin]
        inner: F,
        open: Option<Open>,
    }
}

impl<F, B, E> Future for Answering<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<Tracked<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let open = this.open.take().expect("polled after it finished");
        Poll::Ready(result.map(|response| {
            response.map(|inner| Tracked {
                inner,
                open,
                handed: false,
            })
        }))
    }
}

/// An answer's body, telling its [`Watch`] whether hyper keeps taking it; see the
/// [module docs](self).
#[derive(Debug)]
pub struct Tracked<B> {
    inner: B,
    open: Open,
    /// A frame was handed to hyper, which has not polled since.
    handed: bool,
}

impl<B> Drop for Tracked<B> {
    fn drop(&mut self) {
        if self.handed {
            self.open.0.handed.fetch_sub(1, Relaxed);
        }
    }
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        let watch = &this.open.0;
        // hyper came back: this answer no longer waits for the client (it only drops a
        // deadline, so Relaxed).
        if std::mem::take(&mut this.handed) {
            watch.handed.fetch_sub(1, Relaxed);
        }
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        // The last frame counts too: hyper's HTTP/2 side holds a frame, and the body with
        // it, until the client's flow-control window has room, so an answer of one frame
        // to a client that never opens its window would wait forever, unseen by the
        // socket. Once hyper sent it, it drops the body, and with it the count.
        if let Poll::Ready(Some(Ok(_))) = &frame {
            // The time, then the count with Release (see the orderings above); the
            // maximum, as streams on other tasks store too. No wake: the send timeout
            // from now ends after the armed timer.
            watch.progress_at.fetch_max(watch.now(), Relaxed);
            this.handed = true;
            watch.handed.fetch_add(1, Release);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A client socket that tells its [`Watch`] since when a write waits; see the
/// [module docs](self).
#[derive(Debug)]
pub struct Metered<T> {
    inner: T,
    watch: Arc<Watch>,
}

impl<T> Metered<T> {
    /// `inner`, watched by `watch`.
    pub fn new(inner: T, watch: Arc<Watch>) -> Self {
        Self { inner, watch }
    }

    fn noted<R>(&self, written: Poll<R>) -> Poll<R> {
        match written {
            Poll::Pending => self.watch.write_waits(),
            Poll::Ready(_) => self.watch.write_progressed(),
        }
        written
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Metered<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Metered<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.noted(written)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.noted(written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.inner).poll_flush(cx);
        this.noted(flushed)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let shut = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.noted(shut)
    }
}

#[cfg(test)]
mod tests;
