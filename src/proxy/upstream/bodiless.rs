//! The rest of an HTTP/2 answer that ends at its head (a `204`, a `304`, an answer to
//! `HEAD`: [`super::request::bodiless`]) whose HEADERS came without `END_STREAM`, as from
//! a server that flushes the head while its handler still runs (Go's `net/http`).
//!
//! Such a stream is read to its `END_STREAM` and whatever DATA it carries is thrown away:
//! HTTP/1.1 frames the answer as ending at its head, and a body kept would be stored, then
//! sent on to HTTP/2 clients. Dropped at the head instead, h2 resets the stream with
//! `CANCEL`, and Go's server cancels the handler's context on that: a handler still
//! committing its transaction may roll back the work its 204 says was done.
//!
//! The body ends only once the stream has, so the owner's answer and the settlement that
//! stores it wait for the upstream to finish rather than race a handler still running. By
//! HTTP's rules the answer was whole at its head, but it is the upstream's complete answer
//! only once the upstream ends it: one that resets the stream instead, or sends more than
//! [`MAX_STRAY`] bytes, fails it as an answer cut short does (the outcome is unknown, and
//! nothing is stored). The wait is bounded as that of any answer read whole (the owner's
//! `upstream_timeout`, then `background_timeout`). A body dropped before its end (its
//! client left; hyper's HTTP/1.1 server drops a 204's body unread) is read on in a task of
//! its own, for at most `connections.upstream_read_timeout` and [`MAX_STRAY`] bytes.
//!
//! Over HTTP/1.1 nothing is left to read: both clients take such an answer to end at its
//! head (a length of 0), and its connection goes back to the pool at once.

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::pool::h2::Stream;
use crate::proxy::body::BodyError;

/// The most stray DATA read after an answer that ends at its head before the upstream is
/// taken for a hostile one (a frame counts as at least one byte, so empty ones count too):
/// one initial stream window.
pub const MAX_STRAY: usize = 64 * 1024;

/// An HTTP/2 answer's stream after a head that ends the answer, read until `END_STREAM`.
#[derive(Debug)]
pub struct Drain {
    /// hyper's body and the hold on the connection; `None` once the stream ended.
    rest: Option<(Incoming, Stream)>,
    /// Stray bytes read so far.
    stray: usize,
    /// `connections.upstream_read_timeout`: how long it is read on once dropped.
    gap: Duration,
}

impl Drain {
    /// The stream of `body` (whose head ended the answer), held by `stream`.
    pub fn new(body: Incoming, stream: Stream, gap: Duration) -> Self {
        Self {
            rest: Some((body, stream)),
            stray: 0,
            gap,
        }
    }

    /// Reads the stream to its end, throwing its DATA and trailers away: `None` at its
    /// `END_STREAM`, an error if it was reset first (even with `NO_ERROR`: see
    /// [`BodyError::UpstreamCutShort`]), failed, or carried more than [`MAX_STRAY`]. Either
    /// way the stream is let go.
    pub fn poll_end(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let Some((body, _)) = &mut self.rest else {
            return Poll::Ready(None);
        };
        let read = ready!(poll_rest(body, &mut self.stray, cx));
        self.rest = None;
        Poll::Ready(read.err().map(Err))
    }

    /// Whether the stream ended.
    pub fn is_end_stream(&self) -> bool {
        self.rest.is_none()
    }

    /// Nothing, but not exactly until the end: hyper's HTTP/2 server sends
    /// `Content-Length` for an exact size, which a 204 must not carry.
    pub fn size_hint(&self) -> SizeHint {
        if self.rest.is_none() {
            SizeHint::with_exact(0)
        } else {
            SizeHint::default()
        }
    }
}

/// Reads `body` on to its `END_STREAM`, `stray` counting what it carried: `Ok` there, the
/// error if it was reset first, failed, or carried more than [`MAX_STRAY`].
fn poll_rest(
    body: &mut Incoming,
    stray: &mut usize,
    cx: &mut Context<'_>,
) -> Poll<Result<(), BodyError>> {
    loop {
        match ready!(Pin::new(&mut *body).poll_frame(cx)) {
            Some(Ok(frame)) => {
                *stray += stray_len(&frame);
                if *stray > MAX_STRAY {
                    return Poll::Ready(Err(BodyError::UpstreamStray(MAX_STRAY)));
                }
            }
            Some(Err(e)) => return Poll::Ready(Err(BodyError::Upstream(e))),
            None if body.is_end_stream() => return Poll::Ready(Ok(())),
            None => return Poll::Ready(Err(BodyError::UpstreamCutShort)),
        }
    }
}

/// What `frame` counts toward [`MAX_STRAY`].
fn stray_len(frame: &Frame<Bytes>) -> usize {
    frame.data_ref().map_or(1, |data| data.len().max(1))
}

impl Drop for Drain {
    /// Dropped before the stream ended, it is read on elsewhere: dropped with it, h2 would
    /// reset the stream (`CANCEL`) under a handler that may still be finishing.
    fn drop(&mut self) {
        let Some((mut body, stream)) = self.rest.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (gap, mut stray) = (self.gap, self.stray);
        runtime.spawn(async move {
            let _stream = stream;
            let read = std::future::poll_fn(|cx| poll_rest(&mut body, &mut stray, cx));
            if !matches!(tokio::time::timeout(gap, read).await, Ok(Ok(()))) {
                tracing::debug!("stopped reading an upstream stream after a bodiless answer");
            }
        });
    }
}
