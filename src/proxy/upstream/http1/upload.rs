//! The request on its way out: the head and the body, framed as the head says
//! ([`BodyFraming`]), written as the socket takes them ([`Upload::poll_send`]). Poll-based,
//! so that it goes on beside the reading of an answer that came early, in one task.
//!
//! It knows whether a byte went out and whether a frame was taken from the client's
//! body: only a request of which neither happened may go out again on another connection.
//! A write call that fails sent nothing only if the socket took nothing of this request:
//! through TLS, records may have gone out in the same call before its error
//! ([`SocketSent`]).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::TRAILER;
use http::{HeaderMap, HeaderValue};
use http_body::Body;
use tokio::io::AsyncWrite;

use super::encode::{chunk_line, write_field, BodyFraming};
use super::head::invalid;
use crate::proxy::body::{BodyError, ProxyBody};
use crate::proxy::headers::is_forwardable_trailer;
use crate::proxy::upstream::connector::SocketSent;

/// A buffered body up to this size is copied behind the head and goes out in its write.
pub(crate) const COALESCE_BODY: usize = 16 * 1024;
/// Slices handed to one vectored write.
const MAX_SLICES: usize = 16;

/// Why a request did not get its answer head.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// Not a byte of the request went out: the upstream never saw it.
    #[error("{0}")]
    Unsent(io::Error),
    /// The connection failed, or the upstream broke the protocol, after the request may
    /// have reached it.
    #[error("{0}")]
    Io(io::Error),
    /// The client's body failed.
    #[error("{0}")]
    Body(BodyError),
}

/// A request being written.
pub(crate) struct Upload {
    /// What is ready to go out, in order.
    queue: VecDeque<Bytes>,
    body: ProxyBody,
    framing: BodyFraming,
    /// Body bytes the `Content-Length` still owes.
    owed: u64,
    /// The body has given its last frame (or was queued whole).
    ended: bool,
    /// The first body frame was looked for before the first write, to go out with the
    /// head.
    peeked: bool,
    flushed: bool,
    /// A byte of the request went out.
    wrote: bool,
    /// What the socket had taken when the upload began on it ([`Upload::begin`]), where
    /// it says more than the write calls' results (TLS).
    socket_from: Option<u64>,
    /// A frame was taken from the client's body: it cannot be sent again.
    took: bool,
    /// The trailer names the request declared (`Trailer`), the only ones sent, as hyper
    /// sends only those.
    declared: Option<HeaderValue>,
}

impl std::fmt::Debug for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upload")
            .field("queued", &self.queue.len())
            .field("ended", &self.ended)
            .field("wrote", &self.wrote)
            .finish()
    }
}

impl Upload {
    /// The request whose head [`super::encode::encode_head`] wrote into `head` (with room
    /// for a small body), its body framed by `framing`; `declared`: its `Trailer` field.
    pub(crate) fn new(
        mut head: BytesMut,
        framing: BodyFraming,
        body: ProxyBody,
        declared: Option<HeaderValue>,
    ) -> Self {
        let mut ended = body.is_end_stream();
        // A buffered body is queued whole without taking it from the body, which stays
        // as it was for a request sent again.
        let mut whole = None;
        if let (ProxyBody::Full { data: Some(data) }, BodyFraming::Length(n)) = (&body, framing) {
            if data.len() as u64 == n {
                if data.len() <= COALESCE_BODY {
                    head.extend_from_slice(data);
                } else {
                    whole = Some(data.clone());
                }
                ended = true;
            }
        }
        let mut queue = VecDeque::with_capacity(2);
        queue.push_back(head.freeze());
        queue.extend(whole);
        let owed = match framing {
            BodyFraming::Length(n) if !ended => n,
            _ => 0,
        };
        Self {
            queue,
            body,
            framing,
            owed,
            ended,
            peeked: false,
            flushed: false,
            wrote: false,
            socket_from: None,
            took: false,
            declared,
        }
    }

    /// Whether the whole request went out.
    pub(crate) fn is_done(&self) -> bool {
        self.flushed
    }

    /// Whether a byte of it went out.
    pub(crate) fn wrote(&self) -> bool {
        self.wrote
    }

    /// Whether it may go out again on another connection: not a byte went out, and the
    /// client's body is as it came.
    pub(crate) fn repeatable(&self) -> bool {
        !self.wrote && !self.took
    }

    /// The upload begins on the connection over `io` (again, after one on which nothing
    /// went out): what its socket took before (the TLS handshake, earlier requests) is
    /// not this request's. Without it, a failed write through TLS may have sent some.
    pub(crate) fn begin(&mut self, io: &impl SocketSent) {
        self.socket_from = io.socket_sent();
    }

    /// Stops sending (the connection failed under it): nothing more is written.
    pub(crate) fn abandon(&mut self) {
        self.queue.clear();
        self.ended = true;
        self.flushed = true;
    }

    /// Writes what the socket takes; ready once all of it went out and was flushed.
    pub(crate) fn poll_send<W: AsyncWrite + SocketSent + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), SendError>> {
        loop {
            if !self.peeked && !self.ended {
                // A small body usually arrives with its head: one write for both.
                self.peeked = true;
                if let Poll::Ready(Err(e)) = self.poll_body(cx) {
                    return Poll::Ready(Err(e));
                }
                continue;
            }
            if !self.queue.is_empty() {
                let mut slices = [IoSlice::new(&[]); MAX_SLICES];
                let count = self.queue.len().min(MAX_SLICES);
                for (slice, bytes) in slices.iter_mut().zip(&self.queue) {
                    *slice = IoSlice::new(bytes);
                }
                let n = match ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..count])) {
                    Ok(0) => {
                        return Poll::Ready(Err(
                            self.write_failed(io, io::ErrorKind::WriteZero.into())
                        ))
                    }
                    Ok(n) => n,
                    Err(e) => return Poll::Ready(Err(self.write_failed(io, e))),
                };
                self.wrote = true;
                self.advance(n);
                continue;
            }
            if !self.ended {
                match self.poll_body(cx) {
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {
                        // Everything so far goes out before waiting for the client.
                        if let Poll::Ready(Err(e)) = Pin::new(&mut *io).poll_flush(cx) {
                            return Poll::Ready(Err(self.write_failed(io, e)));
                        }
                        return Poll::Pending;
                    }
                }
            }
            if !self.flushed {
                if let Err(e) = ready!(Pin::new(&mut *io).poll_flush(cx)) {
                    return Poll::Ready(Err(self.write_failed(io, e)));
                }
                self.flushed = true;
            }
            return Poll::Ready(Ok(()));
        }
    }

    /// Drops the first `n` queued bytes, which went out.
    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.queue.front_mut() else {
                return;
            };
            if n < front.len() {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.queue.pop_front();
        }
    }

    /// The error of a write or flush call on `io`. Some of the request went out if the
    /// socket took a byte since the upload began on it, though no call returned it (and
    /// may have, if it is not known when the upload began).
    fn write_failed(&mut self, io: &impl SocketSent, e: io::Error) -> SendError {
        match (self.socket_from, io.socket_sent()) {
            (_, None) => {}
            (Some(from), Some(now)) => self.wrote |= now != from,
            (None, Some(_)) => self.wrote = true,
        }
        self.failed(e)
    }

    /// The error of a write: [`SendError::Unsent`] while not a byte went out.
    fn failed(&self, e: io::Error) -> SendError {
        if self.wrote {
            SendError::Io(e)
        } else {
            SendError::Unsent(e)
        }
    }

    /// Takes one frame of the client's body into the queue, framed.
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        let frame = match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
            None => return Poll::Ready(self.end(None)),
            Some(Err(e)) => return Poll::Ready(Err(SendError::Body(e))),
            Some(Ok(frame)) => frame,
        };
        self.took = true;
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => return Poll::Ready(self.end(frame.into_trailers().ok())),
        };
        if data.is_empty() {
            return Poll::Ready(Ok(()));
        }
        match self.framing {
            BodyFraming::Length(_) => {
                if data.len() as u64 > self.owed {
                    return Poll::Ready(Err(self.failed(invalid(
                        "the request body is longer than its Content-Length",
                    ))));
                }
                self.owed -= data.len() as u64;
                self.queue.push_back(data);
            }
            BodyFraming::Chunked => {
                self.queue.push_back(chunk_line(data.len()).freeze());
                self.queue.push_back(data);
                self.queue.push_back(Bytes::from_static(b"\r\n"));
            }
            BodyFraming::None => {
                return Poll::Ready(Err(self.failed(invalid("a request body without framing"))))
            }
        }
        Poll::Ready(Ok(()))
    }

    /// The body ended (with `trailers`): its last chunk and trailers are queued.
    fn end(&mut self, trailers: Option<HeaderMap>) -> Result<(), SendError> {
        self.ended = true;
        match self.framing {
            BodyFraming::Chunked => {
                let mut last = BytesMut::from(&b"0\r\n"[..]);
                for (name, value) in trailers.iter().flatten() {
                    if is_forwardable_trailer(name) && self.declares(name.as_str()) {
                        write_field(&mut last, name.as_str().as_bytes(), value.as_bytes());
                    }
                }
                last.extend_from_slice(b"\r\n");
                self.queue.push_back(last.freeze());
                Ok(())
            }
            BodyFraming::Length(_) if self.owed > 0 => Err(self.failed(invalid(
                "the request body is shorter than its Content-Length",
            ))),
            _ => Ok(()),
        }
    }

    /// Whether the request's `Trailer` field names `name`.
    fn declares(&self, name: &str) -> bool {
        self.declared.as_ref().is_some_and(|declared| {
            declared
                .as_bytes()
                .split(|&b| b == b',')
                .any(|item| item.trim_ascii().eq_ignore_ascii_case(name.as_bytes()))
        })
    }
}

/// The `Trailer` field of a request's head, for [`Upload::new`].
pub(crate) fn declared_trailers(headers: &HeaderMap) -> Option<HeaderValue> {
    headers.get(TRAILER).cloned()
}

#[cfg(test)]
mod tests;
