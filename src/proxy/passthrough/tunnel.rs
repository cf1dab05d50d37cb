//! An upgraded connection (WebSocket and the like) spliced to its upstream: bytes copied
//! both ways until both sides have closed, or until no byte has moved either way for the
//! idle timeout (`connections.tunnel_idle_timeout`, nginx's `proxy_read_timeout` on a
//! tunnel). Then both sides are dropped, which closes them.
//!
//! A tunnel holds an upstream connection (one of `connections.max_upstream`) and its
//! client connection's share ([`ConnShare`], with its `max_client` slot) for as long as it
//! lives: without the timeout, clients that upgrade and go quiet would hold every upstream
//! connection for good, and every other request would wait for one until its deadline.
//!
//! The timer is lazy, as the client connections' watchdog is: a byte moved only stores
//! the time (an atomic, no timer touched); the timer, armed for the timeout, reads that
//! time when it fires and closes the tunnel or re-arms for what is left.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::proxy::conn_share::ConnShare;

/// Copies between `client` and `upstream` until both have closed, or until nothing has
/// moved either way for `idle`; see the [module docs](self). `share` is the client
/// connection's, held until the tunnel ends.
pub async fn splice<C, U>(client: C, upstream: U, idle: Duration, share: Arc<ConnShare>)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let _share = share;
    let last = Activity::new();
    let (mut client, mut upstream) = (Active::new(client, &last), Active::new(upstream, &last));
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    tokio::pin!(copy);
    let mut due = last.epoch + idle;
    loop {
        tokio::select! {
            biased;
            ended = &mut copy => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "tunnel ended with an error");
                }
                return;
            }
            () = tokio::time::sleep_until(due) => {
                due = last.at() + idle;
                if due <= Instant::now() {
                    tracing::debug!(?idle, "tunnel closed: idle");
                    return;
                }
            }
        }
    }
}

/// When a byte last moved through a tunnel, either way: milliseconds since `epoch` (the
/// timeout is seconds in practice; a millisecond clock is fine).
#[derive(Debug)]
struct Activity {
    epoch: Instant,
    millis: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            millis: AtomicU64::new(0),
        }
    }

    fn moved(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        // Only the time matters, and only this task reads it: no ordering needed.
        self.millis.store(now, Ordering::Relaxed);
    }

    fn at(&self) -> Instant {
        self.epoch + Duration::from_millis(self.millis.load(Ordering::Relaxed))
    }
}

/// One side of a tunnel, noting each byte read from it or written to it in [`Activity`].
#[derive(Debug)]
struct Active<'a, T> {
    inner: T,
    last: &'a Activity,
}

impl<'a, T> Active<'a, T> {
    fn new(inner: T, last: &'a Activity) -> Self {
        Self { inner, last }
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
            this.last.moved();
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
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.last.moved();
        }
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
