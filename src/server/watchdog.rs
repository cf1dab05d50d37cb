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
//! feed it; they wake the connection's task when a change gives it a new deadline.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::sync::lock;

/// Why a [`Watchdog`] fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// No request open for the head timeout: close gracefully.
    Idle,
    /// An answer waited the send timeout for the client to take something: close now.
    Send,
}

/// One connection's state; see the [module docs](self). Times are milliseconds since
/// `epoch` (the accept).
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
    /// The connection's task, to wake when another task changes a deadline.
    waker: Mutex<Option<Waker>>,
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
            waker: Mutex::new(None),
        })
    }

    /// How long the connection may go without a request.
    pub fn head(&self) -> Duration {
        self.head
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn at(&self, millis: u64) -> Instant {
        self.epoch + Duration::from_millis(millis)
    }

    fn wake(&self) {
        if let Some(waker) = lock(&self.waker).as_ref() {
            waker.wake_by_ref();
        }
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
        let waits_since = self.write_waits_since.load(SeqCst);
        if waits_since != 0 {
            sooner(self.at(waits_since - 1) + self.send, Expired::Send);
        }
        if self.handed.load(SeqCst) > 0 {
            sooner(
                self.at(self.progress_at.load(SeqCst)) + self.send,
                Expired::Send,
            );
        }
        // An answer still being written (HTTP/1.1 writes a whole small answer after hyper
        // dropped its body) is the send timeout's to bound.
        if self.open.load(SeqCst) == 0 && waits_since == 0 {
            sooner(
                self.at(self.idle_since.load(SeqCst)) + self.head,
                Expired::Idle,
            );
        }
        due
    }

    fn write_waits(&self) {
        if self.write_waits_since.load(SeqCst) == 0 {
            self.write_waits_since.store(self.now() + 1, SeqCst);
        }
    }

    fn write_progressed(&self) {
        if self.write_waits_since.load(SeqCst) != 0 {
            self.progress_at.store(self.now(), SeqCst);
            self.write_waits_since.store(0, SeqCst);
        }
    }
}

/// Fires when the connection it watches should close; see the [module docs](self).
#[derive(Debug)]
pub struct Watchdog {
    watch: Arc<Watch>,
    sleep: Pin<Box<Sleep>>,
}

impl Watchdog {
    /// Watches `watch`.
    pub fn new(watch: Arc<Watch>) -> Self {
        let sleep = Box::pin(tokio::time::sleep_until(watch.epoch + watch.head));
        Self { watch, sleep }
    }
}

impl Future for Watchdog {
    type Output = Expired;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Expired> {
        {
            let mut waker = lock(&self.watch.waker);
            if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *waker = Some(cx.waker().clone());
            }
        }
        loop {
            let Some((due, why)) = self.watch.due() else {
                return Poll::Pending;
            };
            if due <= Instant::now() {
                return Poll::Ready(why);
            }
            // A later deadline (the usual case: progress moved it) waits for the armed
            // sleep to fire first, so the timer is not re-registered at every frame.
            if due < self.sleep.deadline() || self.sleep.is_elapsed() {
                self.sleep.as_mut().reset(due);
            }
            if self.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

/// An open request: from its head until its answer is done or dropped.
#[derive(Debug)]
struct Open(Arc<Watch>);

impl Open {
    fn new(watch: &Arc<Watch>) -> Self {
        watch.open.fetch_add(1, SeqCst);
        Self(Arc::clone(watch))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        // The end time first: a watchdog that sees no request open must not read the
        // previous one.
        self.0.idle_since.store(self.0.now(), SeqCst);
        if self.0.open.fetch_sub(1, SeqCst) == 1 {
            self.0.wake();
        }
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
            self.open.0.handed.fetch_sub(1, SeqCst);
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
        if std::mem::take(&mut this.handed) {
            watch.handed.fetch_sub(1, SeqCst);
        }
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &frame {
            if !this.inner.is_end_stream() {
                watch.progress_at.store(watch.now(), SeqCst);
                this.handed = true;
                if watch.handed.fetch_add(1, SeqCst) == 0 {
                    watch.wake();
                }
            }
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
