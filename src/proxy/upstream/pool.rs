//! Keep-alive connections to the upstream, each one of hyper's HTTP/1.1 client connections
//! (`hyper::client::conn::http1`) driven by a task of its own, handed out most recently
//! used first and handed back by the answer's body once the upstream has sent all of it.
//!
//! A pool of the project's own rather than hyper-util's `legacy::Client`, for three things
//! that client does not offer: a cap on open connections that makes requests wait for a
//! free or returned one ([`Pool::checkout`]); the rule that a request is sent again only if
//! hyper gave it back unsent (`try_send_request`), so the proxy can tell a request that
//! provably never went out from one that may have; and a connection whose life is tied to
//! its handle ([`Conn`]): dropping the handle ends the connection's task and closes the
//! socket at once, e.g. after an answer that arrived while the upload was still going out.
//! With one origin there is no pool key to hash, and the end of the body is the hand-back
//! point, so no task per request watches for the connection to become idle. One task per
//! pool ([`sweep`]) closes idle connections at its idle timeout
//! (`connections.upstream_idle_timeout`), before the upstream closes them itself: a request
//! sent on a connection the upstream is closing at that moment fails after it was written,
//! which the proxy cannot tell from a request the upstream read.
//!
//! A connection whose answer ended while its request was still going out (the upstream
//! answered an upload early) comes back only once the request went out whole, within
//! `connections.upstream_read_timeout` ([`put_when_written`]), so that no request waits
//! behind another's upload.
//!
//! A connection's slot under the cap and its count in `idemgate_upstream_connections` go
//! with its socket ([`Leased`]): after `101 Switching Protocols` the socket leaves hyper's
//! connection for the upgraded stream, and both stay taken until that stream is dropped.
//!
//! The pool is generic over the kind of HTTP/1.1 connection ([`Handshake`]): hyper's
//! ([`Hyper`], the default), or the hand-written client's
//! (`connections.upstream_http1: idemgate`, `super::http1`); the cap, the hand-out order
//! and the idle expiry are the same for both.
//!
//! HTTP/2 connections, shared by concurrent requests rather than handed out whole, are
//! pooled by [`h2`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Once, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::connector::{Connector, Io, SocketSent};

pub mod h2;
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::proxy::body::ProxyBody;

/// One upstream connection: the sending half of hyper's connection. Dropping it ends the
/// connection's task, which closes the socket and only then frees its slot under the cap.
pub struct Conn {
    sender: SendRequest<ProxyBody>,
    /// Dropped with the handle: the task sees its receiver resolve and stops.
    _stop: oneshot::Sender<()>,
}

impl Conn {
    /// hyper's sending half.
    pub fn sender(&mut self) -> &mut SendRequest<ProxyBody> {
        &mut self.sender
    }
}

/// A kind of pooled HTTP/1.1 connection: how one starts over a socket, and how the pool
/// tells whether an idle one can still carry a request.
pub trait Handshake: Send + Sync + 'static {
    /// The connection.
    type Conn: Send + 'static;

    /// Starts a connection over `io`, which carries its slot under the cap and its count
    /// in the open gauge to the end of the socket.
    fn handshake(&self, io: Leased) -> impl Future<Output = Result<Self::Conn, ProxyError>> + Send;

    /// Whether an idle `conn` can carry another request: the upstream has not closed it,
    /// nor sent anything unasked.
    fn usable(conn: &mut Self::Conn) -> bool;
}

/// hyper's HTTP/1.1 client connections, each driven by a task of its own.
#[derive(Debug)]
pub struct Hyper(http1::Builder);

impl Handshake for Hyper {
    type Conn = Conn;

    async fn handshake(&self, io: Leased) -> Result<Conn, ProxyError> {
        let (sender, conn) = self
            .0
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| ProxyError::UpstreamUnreachable(format!("HTTP/1.1 handshake: {e}")))?;
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            // Ending drops the connection and with it the socket, unless an upgrade took it.
            tokio::select! {
                biased;
                _ = stopped => {}
                result = conn.with_upgrades() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "upstream connection ended with an error");
                    }
                }
            }
        });
        Ok(Conn {
            sender,
            _stop: stop,
        })
    }

    fn usable(conn: &mut Conn) -> bool {
        // Closed: the upstream closed it, or sent something unasked (hyper's task noticed).
        !conn.sender.is_closed()
    }
}

/// A connection checked out for one request.
pub struct Checkout<C = Conn> {
    /// The connection.
    pub conn: C,
    /// Whether it served an earlier request: only then is a request it gave back unsent
    /// sent again on another (the upstream may have closed it while it sat idle).
    pub reused: bool,
}

struct Idle<C> {
    conn: C,
    /// When it came back. tokio's clock rather than std's: the same time in production,
    /// and one a test can pause and move past the idle timeout without waiting for it.
    since: Instant,
}

impl<C> Idle<C> {
    fn expired(&self, now: Instant, timeout: Duration) -> bool {
        now >= self.since + timeout
    }
}

/// The connections to one upstream origin.
pub struct Pool<H: Handshake = Hyper> {
    connector: Connector,
    handshake: H,
    /// Oldest first: [`Pool::put`] pushes at the end, [`Pool::take_idle`] pops from it.
    idle: Mutex<Vec<Idle<H::Conn>>>,
    /// How long a connection may sit idle before it is closed
    /// (`connections.upstream_idle_timeout`), whether or not a checkout comes by.
    idle_timeout: Duration,
    /// One permit per open connection (`connections.max_upstream`).
    slots: Arc<Semaphore>,
    /// Wakes a request waiting for a slot when a connection comes back idle.
    returned: Notify,
    /// Starts [`sweep`] with the first connection: only then is there something to close,
    /// and a runtime to run it (a pool may be made outside one).
    sweeper: Once,
    metrics: Arc<Metrics>,
}

impl<H: Handshake> std::fmt::Debug for Pool<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("connector", &self.connector)
            .field("idle", &crate::sync::lock(&self.idle).len())
            .field("idle_timeout", &self.idle_timeout)
            .field("free_slots", &self.slots.available_permits())
            .finish()
    }
}

impl Pool<Hyper> {
    /// A pool of at most `max` of hyper's connections made by `connector`, each closed
    /// once it has been idle for `idle_timeout`.
    pub fn new(
        connector: Connector,
        max: usize,
        idle_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self::with(
            Hyper::default(),
            connector,
            slots(max),
            idle_timeout,
            metrics,
        )
    }
}

/// The slots of a cap of `max` connections, for [`Pool::with`] (tokio's semaphore holds
/// at most [`Semaphore::MAX_PERMITS`]; a larger `max` is no cap in practice).
pub fn slots(max: usize) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS)))
}

impl Default for Hyper {
    /// hyper's connections as the proxy sets them up.
    fn default() -> Self {
        let mut builder = http1::Builder::new();
        // One buffer per write (head and body copied in) rather than a queue of them for
        // `writev`: a request is mostly a head and one small body, and managing the queue
        // costs more than copying.
        builder.writev(false);
        Self(builder)
    }
}

impl<H: Handshake> Pool<H> {
    /// A pool of `handshake`'s connections made by `connector`, one per permit of `slots`
    /// (which another pool to the same upstream may share, so that the cap holds for
    /// both), each closed once it has been idle for `idle_timeout`.
    pub fn with(
        handshake: H,
        connector: Connector,
        slots: Arc<Semaphore>,
        idle_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            connector,
            handshake,
            idle: Mutex::new(Vec::new()),
            idle_timeout,
            slots,
            returned: Notify::new(),
            sweeper: Once::new(),
            metrics,
        }
    }

    /// Idle connections now, for tests.
    #[cfg(test)]
    pub fn idle_count(&self) -> usize {
        crate::sync::lock(&self.idle).len()
    }

    /// Whether a checkout would wait now: no idle connection and every slot of the cap
    /// taken (by this pool or another that shares its slots).
    pub fn would_wait(&self) -> bool {
        self.slots.available_permits() == 0 && crate::sync::lock(&self.idle).is_empty()
    }

    /// Closes the connection idle longest, freeing its slot for a pool that shares them;
    /// false when none is idle.
    pub fn close_oldest_idle(&self) -> bool {
        let mut idle = crate::sync::lock(&self.idle);
        if idle.is_empty() {
            return false;
        }
        let oldest = idle.remove(0);
        drop(idle);
        drop(oldest);
        true
    }

    /// The most recently used idle connection that is still open, else a new one if the
    /// cap allows, else the first of the two to come free. Unbounded in time: the caller
    /// bounds it (waiting here is waiting before anything was sent).
    pub async fn checkout(self: &Arc<Self>) -> Result<Checkout<H::Conn>, ProxyError> {
        let mut counted = false;
        loop {
            if let Some(conn) = self.take_idle() {
                return Ok(Checkout { conn, reused: true });
            }
            let slot = match Arc::clone(&self.slots).try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    if !std::mem::replace(&mut counted, true) {
                        self.metrics.connections().upstream_waited.inc();
                    }
                    match self.wait_for_slot().await {
                        Some(slot) => slot,
                        None => continue,
                    }
                }
            };
            // Boxed: dialing (TCP, TLS, handshake) is a future of kilobytes that would
            // otherwise be part of every request's future, which is moved (copied) whenever
            // a task is spawned or its output read, though a connection is dialed only once
            // per many requests.
            let conn = Box::pin(self.dial(slot)).await?;
            return Ok(Checkout {
                conn,
                reused: false,
            });
        }
    }

    /// A free slot, or `None` once a connection came back idle (take that instead).
    async fn wait_for_slot(&self) -> Option<OwnedSemaphorePermit> {
        let returned = self.returned.notified();
        tokio::pin!(returned);
        // Registered before the look at the idle list, so a return in between wakes it.
        returned.as_mut().enable();
        if !crate::sync::lock(&self.idle).is_empty() {
            return None;
        }
        tokio::select! {
            slot = Arc::clone(&self.slots).acquire_owned() => slot.ok(),
            () = returned => None,
        }
    }

    fn take_idle(&self) -> Option<H::Conn> {
        let now = Instant::now();
        let mut idle = crate::sync::lock(&self.idle);
        while let Some(mut entry) = idle.pop() {
            // Not usable: the upstream closed it while it sat idle, or sent something.
            if !entry.expired(now, self.idle_timeout) && H::usable(&mut entry.conn) {
                return Some(entry.conn);
            }
        }
        None
    }

    /// Takes a connection back for the next request.
    pub fn put(&self, mut conn: H::Conn) {
        if !H::usable(&mut conn) {
            return;
        }
        let mut idle = crate::sync::lock(&self.idle);
        // Read under the lock, so the list stays ordered by it.
        let since = Instant::now();
        idle.push(Idle { conn, since });
        drop(idle);
        self.returned.notify_one();
    }

    /// Opens a connection in `slot` and starts its task.
    async fn dial(self: &Arc<Self>, slot: OwnedSemaphorePermit) -> Result<H::Conn, ProxyError> {
        let io = self.connector.connect().await?;
        let open = self.metrics.connections().upstream_open.clone();
        open.inc();
        let io = Leased {
            io,
            _slot: slot,
            _open: OpenGuard(open),
        };
        let conn = self.handshake.handshake(io).await?;
        self.sweeper
            .call_once(|| drop(tokio::spawn(sweep(Arc::downgrade(self), self.idle_timeout))));
        Ok(conn)
    }
}

/// A pool whose idle connections [`sweep`] closes.
pub(super) trait Expiring: Send + Sync + 'static {
    /// Closes the idle connections past the idle timeout and those the upstream closed;
    /// returns when the next one will be past it.
    fn close_expired(&self, now: Instant) -> Instant;
}

impl<H: Handshake> Expiring for Pool<H> {
    fn close_expired(&self, now: Instant) -> Instant {
        let timeout = self.idle_timeout;
        let mut idle = crate::sync::lock(&self.idle);
        idle.retain_mut(|entry| !entry.expired(now, timeout) && H::usable(&mut entry.conn));
        // The oldest expires first; one that comes back later, a full timeout from now.
        idle.first()
            .map_or(now + timeout, |entry| entry.since + timeout)
    }
}

/// Closes a pool's idle connections as they pass its `idle_timeout`: checkout takes the
/// most recently used, so without this an older one would stay open, holding a slot, for
/// as long as newer ones serve, and with no traffic at all nothing would close any: the
/// upstream would, at its own keep-alive timeout. It holds the pool only while it looks: a
/// pool a reload replaced is dropped (closing its idle connections) and this ends at its
/// next look.
pub(super) async fn sweep<P: Expiring>(pool: Weak<P>, idle_timeout: Duration) {
    let mut next = Instant::now() + idle_timeout;
    loop {
        tokio::time::sleep_until(next).await;
        let Some(pool) = pool.upgrade() else { return };
        next = pool.close_expired(Instant::now());
    }
}

/// A connection's socket with its slot under the cap and its count in the open gauge, so
/// that both last exactly as long as the socket: in the connection, or in the stream an
/// upgrade (`101 Switching Protocols`) hands it to.
pub struct Leased {
    /// Dropped first: the socket closes before its slot frees, so the cap holds for
    /// sockets, not only for handles.
    io: Io,
    _slot: OwnedSemaphorePermit,
    _open: OpenGuard,
}

impl AsyncRead for Leased {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl SocketSent for Leased {
    fn socket_sent(&self) -> Option<u64> {
        self.io.socket_sent()
    }
}

impl AsyncWrite for Leased {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Decrements the open-connections gauge when the connection's socket closes.
struct OpenGuard(prometheus_client::metrics::gauge::Gauge);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// An upstream answer's body as hyper's connection delivers it. At its end the connection
/// goes back to the pool if the answer let it keep the connection, once its request has
/// gone out whole ([`put_when_written`]); dropped earlier, or after an answer that closes
/// the connection, it ends the connection (whose task may still be sending an upload the
/// upstream no longer reads).
pub struct PooledBody {
    inner: Incoming,
    conn: Option<Conn>,
    /// Where the connection goes at the end; `None`: it is not reused.
    returning: Option<Arc<Pool>>,
    /// How long the rest of an upload the upstream answered early may take once the
    /// answer has ended (`connections.upstream_read_timeout`).
    finish_within: Duration,
}

impl std::fmt::Debug for PooledBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBody")
            .field("inner", &self.inner)
            .field("pooled", &self.returning.is_some())
            .finish()
    }
}

impl PooledBody {
    /// The body of an answer that came on `conn`, handing it back to `pool` at its end
    /// (`None`: never), or once its request has gone out whole, if that is within
    /// `finish_within` of the end.
    pub fn new(
        inner: Incoming,
        conn: Conn,
        pool: Option<Arc<Pool>>,
        finish_within: Duration,
    ) -> Self {
        let mut body = Self {
            inner,
            conn: Some(conn),
            returning: pool,
            finish_within,
        };
        // hyper never polls a body that says it is over (an empty one): hand back now.
        if body.inner.is_end_stream() {
            body.finish();
        }
        body
    }

    fn finish(&mut self) {
        let conn = self.conn.take();
        let (Some(pool), Some(conn)) = (self.returning.take(), conn) else {
            return;
        };
        // Ready: hyper's task has written the whole request and read the whole answer.
        if conn.sender.is_ready() {
            pool.put(conn);
        } else {
            let within = self.finish_within;
            drop(tokio::spawn(put_when_written(
                conn,
                Arc::downgrade(&pool),
                within,
            )));
        }
    }
}

/// Puts `conn` back in `pool` once hyper's task is ready for another request, if that is
/// within `within`; else closes it. Not ready at the end of an answer: the upstream
/// answered before it read the whole request (a `401` to an upload, as Node sends), and
/// hyper's task is still sending the rest, as fast as the client sends it. Idle meanwhile,
/// the connection would be handed to the next request, which would wait behind that
/// upload (another client's, however slow) though the cap let it open one of its own.
/// (Rarely, only the task has not yet noticed that the answer ended: it is ready at once.)
async fn put_when_written(mut conn: Conn, pool: Weak<Pool>, within: Duration) {
    match tokio::time::timeout(within, conn.sender.ready()).await {
        Ok(Ok(())) => {
            if let Some(pool) = pool.upgrade() {
                pool.put(conn);
            }
        }
        Ok(Err(e)) => tracing::debug!(error = %e, "the rest of an answered upload failed"),
        Err(_) => tracing::debug!("the rest of an answered upload timed out"),
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.finish(),
            // A sized body may say it is over with its last frame, and trailers end a
            // chunked one: hyper's server polls neither again.
            Poll::Ready(Some(Ok(frame))) if frame.is_trailers() || this.inner.is_end_stream() => {
                this.finish()
            }
            Poll::Ready(Some(Ok(_))) | Poll::Pending => {}
            Poll::Ready(Some(Err(_))) => {
                this.returning = None;
                this.conn = None;
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
