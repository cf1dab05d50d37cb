//! HTTP/2 connections to the upstream (`connections.upstream_protocol: http2`), each one of
//! hyper's client connections (`hyper::client::conn::http2`) shared by the requests that
//! run on it at once.
//!
//! A request takes the oldest open connection with room for another stream under the
//! server's `SETTINGS_MAX_CONCURRENT_STREAMS`; when none has room a new one is dialed (one
//! dial at a time, so a burst of first requests shares one connection), and when the cap
//! (`connections.max_upstream`) allows no more, the request waits here until a stream ends
//! or a connection closes. It is not handed to hyper to queue: h2 sends a queued stream's
//! HEADERS once a stream frees even if its request was given up meanwhile (a deadline
//! passed, the proxy answered 504), and while it waits here nothing went out, so a deadline
//! that passes is `upstream-unreachable`, as when the HTTP/1.1 pool has no connection free.
//! A request holds its connection through a [`Stream`] until its
//! answer's body ends; a connection without streams for `upstream_idle_timeout` is closed,
//! and one whose task ended (GOAWAY, an error, the socket closed) is dropped from the pool.
//!
//! A new connection is handed out only once the upstream's first frame, which RFC 9113 §3.4
//! says is its SETTINGS, arrived ([`Preface`]): a server that does not speak HTTP/2 then
//! fails the dial, before any request was written, instead of failing a request that the
//! proxy could not tell from one the upstream read.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::{sweep, Connector, Expiring, Leased, OpenGuard};
use crate::error::ProxyError;
use crate::metrics::Metrics;
use crate::proxy::body::ProxyBody;
use crate::proxy::upstream::connector::CONNECT_TIMEOUT;

/// The largest answer head taken (`SETTINGS_MAX_HEADER_LIST_SIZE`), about what hyper's
/// HTTP/1.1 client reads into its buffer (8 KiB + 100 × 4 KiB).
const MAX_ANSWER_HEAD: u32 = 400 * 1024;

/// The connection-level flow-control window: HTTP/2's largest (RFC 9113 §6.9.1).
const CONNECTION_WINDOW: u32 = (1 << 31) - 1;

/// The receive window of each stream: the most of an answer h2 buffers while its client
/// does not read it (hyper's default is 2 MiB). With the connection's window at the
/// largest, this is the whole bound: a stream's request is one in flight, so an upstream
/// connection holds at most this much for each stream open on it. 256 KiB a round trip is
/// 256 MB/s to an upstream 1 ms away, and still 5 MB/s at 50 ms.
const STREAM_WINDOW: u32 = 256 << 10;

/// What h2 queues of each request body beyond what the upstream's window lets out (hyper's
/// default: 1 MiB): hyper hands h2 the body's next part whole once the queue has any room,
/// then reads the one after and holds it until there is room again, so a stream holds at
/// most this plus two parts of its body.
const SEND_BUFFER: usize = 64 << 10;

/// One HTTP/2 connection, shared by its streams.
struct Shared {
    sender: SendRequest<ProxyBody>,
    /// The server's limit on concurrent streams, as the connection last saw it.
    limit: Arc<AtomicUsize>,
    /// Streams open on it, and since when it has had none.
    use_: Mutex<Use>,
    /// The pool's: told when a stream ends, for requests waiting for room.
    freed: Arc<Notify>,
    /// Dropped with the last reference: the connection's task stops, and hyper closes the
    /// connection once its streams are done.
    _stop: oneshot::Sender<()>,
}

struct Use {
    streams: usize,
    idle_since: Instant,
    /// Whether a stream ran on it before: only a request a used connection gave back
    /// unsent is sent again (the upstream may have closed it in between).
    used: bool,
}

impl Use {
    /// Takes a stream; returns whether the connection served one before.
    fn take(&mut self) -> bool {
        self.streams += 1;
        std::mem::replace(&mut self.used, true)
    }
}

impl Shared {
    fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    fn expired(&self, now: Instant, timeout: Duration) -> bool {
        let use_ = crate::sync::lock(&self.use_);
        use_.streams == 0 && now >= use_.idle_since + timeout
    }
}

/// One request's hold on an HTTP/2 connection, from checkout to the end of its answer's
/// body (or its failure): while any is held the connection is not idle.
pub struct Stream {
    conn: Arc<Shared>,
    /// Whether the connection served a stream before this one.
    pub reused: bool,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("reused", &self.reused)
            .finish()
    }
}

impl Stream {
    /// The first stream of a new connection.
    fn open(conn: Arc<Shared>) -> Self {
        let reused = crate::sync::lock(&conn.use_).take();
        Self { conn, reused }
    }

    /// A stream on `conn` if it has room under the server's limit: looked at and taken
    /// under one lock, so two requests never both take its last one.
    fn open_if_room(conn: &Arc<Shared>) -> Option<Self> {
        let mut use_ = crate::sync::lock(&conn.use_);
        if use_.streams >= conn.limit.load(Ordering::Relaxed).max(1) {
            return None;
        }
        let reused = use_.take();
        drop(use_);
        Some(Self {
            conn: Arc::clone(conn),
            reused,
        })
    }

    /// hyper's sending half (a clone of the connection's).
    pub fn sender(&self) -> SendRequest<ProxyBody> {
        self.conn.sender.clone()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let mut use_ = crate::sync::lock(&self.conn.use_);
        use_.streams -= 1;
        if use_.streams == 0 {
            use_.idle_since = Instant::now();
        }
        drop(use_);
        self.conn.freed.notify_waiters();
    }
}

/// The HTTP/2 connections to one upstream origin.
pub struct Pool {
    connector: Connector,
    builder: http2::Builder<TokioExecutor>,
    /// Oldest first.
    conns: Mutex<Vec<Arc<Shared>>>,
    idle_timeout: Duration,
    /// One permit per open connection (`connections.max_upstream`).
    slots: Arc<Semaphore>,
    /// Held while dialing, so that requests arriving meanwhile share the new connection.
    dialing: tokio::sync::Mutex<()>,
    /// Told when a stream ends: requests waiting at the cap look for room again.
    freed: Arc<Notify>,
    sweeper: Once,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("h2::Pool")
            .field("connector", &self.connector)
            .field("conns", &crate::sync::lock(&self.conns).len())
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

impl Pool {
    /// A pool of at most `max` HTTP/2 connections made by `connector`, each closed once it
    /// has had no stream for `idle_timeout`.
    pub fn new(
        connector: Connector,
        max: usize,
        idle_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        let mut builder = http2::Builder::new(TokioExecutor::new());
        // Answer heads as large as the HTTP/1.1 client reads (hyper's 408 KiB buffer), not
        // hyper's HTTP/2 default of 16 KiB: past the limit the stream is reset after the
        // upstream ran the request (its answer lost, the key held as outcome unknown), and
        // a head spanning CONTINUATION frames past it ends the whole connection
        // (GOAWAY COMPRESSION_ERROR), failing every other caller's stream open on it.
        builder.max_header_list_size(MAX_ANSWER_HEAD);
        // A connection window no set of streams can fill: the streams share it, so with
        // hyper's 5 MiB (under three 2 MiB stream windows) a few answers their clients
        // stopped reading held all of it, and no other answer on the connection moved
        // until those clients were cut off. What is buffered is bounded per stream by its
        // window instead, pinned with the rest (see `STREAM_WINDOW`, `SEND_BUFFER`).
        builder.initial_connection_window_size(CONNECTION_WINDOW);
        builder.initial_stream_window_size(STREAM_WINDOW);
        builder.adaptive_window(false);
        builder.max_send_buf_size(SEND_BUFFER);
        // Until the server's SETTINGS are applied, one stream (hyper assumes 100): a
        // connection's limit read before they were (see `dial`) makes the pool open or wait
        // for another rather than give h2 streams to queue past the server's real limit.
        builder.initial_max_send_streams(1);
        Self {
            connector,
            builder,
            conns: Mutex::new(Vec::new()),
            idle_timeout,
            slots: super::slots(max),
            dialing: tokio::sync::Mutex::new(()),
            freed: Arc::new(Notify::new()),
            sweeper: Once::new(),
            metrics,
        }
    }

    /// A stream on an open connection with room for it, else on a new one if the cap
    /// allows, else, once a stream ended or a connection closed, on whichever has room then.
    /// Unbounded in time: the caller bounds it, and until this returns nothing was sent.
    pub async fn checkout(self: &Arc<Self>) -> Result<Stream, ProxyError> {
        let mut counted = false;
        loop {
            // Made before looking: a stream that ends after the look still wakes it.
            let freed = self.freed.notified();
            if let Some(stream) = self.pick() {
                return Ok(stream);
            }
            let dialing = self.dialing.lock().await;
            if let Some(stream) = self.pick() {
                return Ok(stream);
            }
            if let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() {
                return self.open_new(slot, dialing).await;
            }
            drop(dialing);
            // At the cap, every stream the servers allow taken (or sockets still closing).
            if !counted {
                self.metrics.connections().upstream_waited.inc();
                counted = true;
            }
            let slot = tokio::select! {
                () = freed => continue,
                slot = Arc::clone(&self.slots).acquire_owned() => {
                    slot.map_err(|_| ProxyError::UpstreamUnreachable("pool closed".into()))?
                }
            };
            // A connection closed: its slot opens another, unless one has room by now.
            let dialing = self.dialing.lock().await;
            if let Some(stream) = self.pick() {
                return Ok(stream);
            }
            return self.open_new(slot, dialing).await;
        }
    }

    /// Dials a connection in `slot` (`dialing` held) and opens its first stream.
    async fn open_new(
        self: &Arc<Self>,
        slot: OwnedSemaphorePermit,
        _dialing: tokio::sync::MutexGuard<'_, ()>,
    ) -> Result<Stream, ProxyError> {
        let conn = Box::pin(self.dial(slot)).await?;
        crate::sync::lock(&self.conns).push(Arc::clone(&conn));
        Ok(Stream::open(conn))
    }

    /// Drops closed and expired connections; returns a stream on the first open one with
    /// room.
    fn pick(&self) -> Option<Stream> {
        let now = Instant::now();
        let mut conns = crate::sync::lock(&self.conns);
        conns.retain(|c| !c.is_closed() && !c.expired(now, self.idle_timeout));
        conns.iter().find_map(Stream::open_if_room)
    }

    /// Drops `stream`'s connection from the pool: hyper gave a request back on it, so its
    /// task ended, or the server refused the stream (a request sent again goes elsewhere).
    /// Its open streams run on; it closes when they end.
    pub fn forget(&self, stream: &Stream) {
        crate::sync::lock(&self.conns).retain(|c| !Arc::ptr_eq(c, &stream.conn));
    }

    /// Opens a connection in `slot`, starts its task and waits for the server's preface.
    async fn dial(self: &Arc<Self>, slot: OwnedSemaphorePermit) -> Result<Arc<Shared>, ProxyError> {
        let io = self.connector.connect().await?;
        let open = self.metrics.connections().upstream_open.clone();
        open.inc();
        let (heard, hear) = oneshot::channel();
        let io = Preface {
            io: Leased {
                io,
                _slot: slot,
                _open: OpenGuard(open),
            },
            head: [0; 4],
            seen: 0,
            heard: Some(heard),
        };
        let (sender, mut conn) = self
            .builder
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| ProxyError::UpstreamUnreachable(format!("HTTP/2 handshake: {e}")))?;
        // hyper reads the socket in a task of its own, so the server's preface arrives
        // before this connection's own task runs; it is processed in the same read, so
        // its stream limit is known by then (and refreshed whenever the task runs).
        let settings = tokio::time::timeout(CONNECT_TIMEOUT, hear).await;
        if !matches!(settings, Ok(Ok(true))) {
            return Err(ProxyError::UpstreamUnreachable(format!(
                "{}: the upstream did not answer the HTTP/2 preface with SETTINGS \
                 (connections.upstream_protocol: http2)",
                self.connector.address()
            )));
        }
        tokio::task::yield_now().await;
        self.sweeper
            .call_once(|| drop(tokio::spawn(sweep(Arc::downgrade(self), self.idle_timeout))));
        let limit = Arc::new(AtomicUsize::new(conn.current_max_send_streams()));
        let seen_limit = Arc::clone(&limit);
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let driven = std::future::poll_fn(|cx| {
                let polled = Pin::new(&mut conn).poll(cx);
                seen_limit.store(conn.current_max_send_streams(), Ordering::Relaxed);
                polled
            });
            tokio::select! {
                biased;
                _ = stopped => {}
                result = driven => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "upstream HTTP/2 connection ended with an error");
                    }
                }
            }
        });
        Ok(Arc::new(Shared {
            sender,
            limit,
            use_: Mutex::new(Use {
                streams: 0,
                idle_since: Instant::now(),
                used: false,
            }),
            freed: Arc::clone(&self.freed),
            _stop: stop,
        }))
    }
}

impl Expiring for Pool {
    /// Closes connections without streams past the idle timeout and those that ended;
    /// returns when to look next.
    fn close_expired(&self, now: Instant) -> Instant {
        let timeout = self.idle_timeout;
        let mut conns = crate::sync::lock(&self.conns);
        conns.retain(|c| !c.is_closed() && !c.expired(now, timeout));
        conns
            .iter()
            .filter_map(|c| {
                let use_ = crate::sync::lock(&c.use_);
                (use_.streams == 0).then_some(use_.idle_since + timeout)
            })
            .min()
            .unwrap_or(now + timeout)
    }
}

/// A new connection's socket that reports whether the first frame the server sent is a
/// SETTINGS frame (type 0x4, the fourth byte of its header): a server that does not speak
/// HTTP/2 answers something else, or closes.
struct Preface {
    io: Leased,
    head: [u8; 4],
    seen: usize,
    heard: Option<oneshot::Sender<bool>>,
}

impl AsyncRead for Preface {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if this.heard.is_some() {
            if let Poll::Ready(result) = &polled {
                let new = &buf.filled()[before..];
                let take = new.len().min(4 - this.seen);
                this.head[this.seen..this.seen + take].copy_from_slice(&new[..take]);
                this.seen += take;
                if this.seen == 4 || new.is_empty() || result.is_err() {
                    let settings = this.seen == 4 && this.head[3] == 0x4;
                    let _ = this.heard.take().map(|heard| heard.send(settings));
                }
            }
        }
        polled
    }
}

impl AsyncWrite for Preface {
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

#[cfg(test)]
mod tests;
