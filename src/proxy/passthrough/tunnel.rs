//! An upgraded connection (WebSocket and the like) spliced to its upstream: bytes copied
//! both ways until both sides have closed, or until one of these ends it, dropping both
//! sides, which closes them:
//!
//! - no byte has moved either way for the idle timeout (`connections.tunnel_idle_timeout`,
//!   nginx's `proxy_read_timeout` on a tunnel);
//! - a write to one side has waited that long without a byte taken (nginx's
//!   `send_timeout`): a peer that keeps talking but never reads would otherwise keep the
//!   tunnel busy while what is sent to it waits for good;
//! - a shutdown began ([`Stopping::begun`]): a tunnel carries no request to finish, and
//!   one left open would hold the drain to its end, then be cut at the exit all the same.
//!
//! A tunnel holds an upstream connection (one of `connections.max_upstream`), and its
//! client connection's `max_client` slot: the connection's task holds its share until the
//! socket comes back from the tunnel (`crate::server::linger`). Without the timeouts,
//! clients that upgrade and go quiet would hold every upstream connection for good, and
//! every other request would wait for one until its deadline.
//!
//! The timer is lazy, as the client connections' watchdog is: a byte moved, or a write
//! that waits, only stores the time (an atomic, no timer touched); the timer, armed for
//! the timeout, reads those times when it fires and closes the tunnel or re-arms for what
//! is left.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::proxy::stopping::Stopping;

/// Copies between `client` and `upstream` until both have closed, or until the tunnel is
/// idle or stalled for `idle`, or `stopping` begins; see the [module docs](self).
pub async fn splice<C, U>(client: C, upstream: U, idle: Duration, stopping: &Stopping)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let times = Times::new();
    let mut client = Active::new(client, &times, Side::Client);
    let mut upstream = Active::new(upstream, &times, Side::Upstream);
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    tokio::pin!(copy);
    let stop = stopping.begun();
    tokio::pin!(stop);
    let mut due = times.epoch + idle;
    loop {
        tokio::select! {
            biased;
            ended = &mut copy => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "tunnel ended with an error");
                }
                return;
            }
            () = &mut stop => {
                tracing::debug!("tunnel closed: shutting down");
                return;
            }
            () = tokio::time::sleep_until(due) => {
                due = times.due(idle);
                if due <= Instant::now() {
                    tracing::debug!(?idle, "tunnel closed: idle, or a side takes nothing");
                    return;
                }
            }
        }
    }
}

/// Which side of a tunnel an [`Active`] is.
#[derive(Debug, Clone, Copy)]
enum Side {
    Client = 0,
    Upstream = 1,
}

/// No write waiting, in [`Times::waiting`].
const NONE: u64 = u64::MAX;

/// When a byte last moved through a tunnel, either way, and since when a write to each
/// side has waited: milliseconds since `epoch` (the timeout is seconds in practice; a
/// millisecond clock is fine). Only the tunnel's task touches them; atomics only because
/// its future must be `Send`, so no ordering is needed.
#[derive(Debug)]
struct Times {
    epoch: Instant,
    moved: AtomicU64,
    waiting: [AtomicU64; 2],
}

impl Times {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            moved: AtomicU64::new(0),
            waiting: [AtomicU64::new(NONE), AtomicU64::new(NONE)],
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    fn moved(&self) {
        self.moved.store(self.now(), Ordering::Relaxed);
    }

    /// A write to `side` could not go on: it waits from now, unless it already did.
    fn waits(&self, side: Side) {
        let waiting = &self.waiting[side as usize];
        if waiting.load(Ordering::Relaxed) == NONE {
            waiting.store(self.now(), Ordering::Relaxed);
        }
    }

    /// A write to `side` went on (or there was none to make).
    fn wrote(&self, side: Side) {
        self.waiting[side as usize].store(NONE, Ordering::Relaxed);
    }

    /// When the tunnel ends unless something moves: `idle` after the last byte, or after
    /// the oldest write still waiting.
    fn due(&self, idle: Duration) -> Instant {
        let since = self
            .waiting
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .fold(self.moved.load(Ordering::Relaxed), u64::min);
        self.epoch + Duration::from_millis(since) + idle
    }
}

/// One side of a tunnel, noting in [`Times`] each byte read from it or written to it, and
/// each write to it that has to wait.
#[derive(Debug)]
struct Active<'a, T> {
    inner: T,
    times: &'a Times,
    side: Side,
}

impl<'a, T> Active<'a, T> {
    fn new(inner: T, times: &'a Times, side: Side) -> Self {
        Self { inner, times, side }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Active<'_, T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.times.moved();
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Active<'_, T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        match written {
            Poll::Pending => this.times.waits(this.side),
            Poll::Ready(Ok(n)) if n > 0 => {
                this.times.moved();
                this.times.wrote(this.side);
            }
            Poll::Ready(_) => {}
        }
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A flush that waits is a write that waits (TLS's buffered records, say).
        let flushed = Pin::new(&mut this.inner).poll_flush(cx);
        match flushed {
            Poll::Pending => this.times.waits(this.side),
            Poll::Ready(Ok(())) => this.times.wrote(this.side),
            Poll::Ready(Err(_)) => {}
        }
        flushed
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
