//! [`ProxyBody`], the one body type on both sides of the proxy: a buffered body (protected
//! requests, replays, problem answers) or a stream passed through without buffering. An
//! upstream's streamed answer loses the trailer fields [`is_forwardable_trailer`] refuses,
//! as a request's do on their way up.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::budget::{Budget, Charge, ConnBuffers, Refusal, Short};
use super::headers::is_forwardable_trailer;
use crate::error::ProxyError;

/// Why a streamed body stopped.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Reading the client's request body failed.
    #[error("client body: {0}")]
    Client(#[from] hyper::Error),
    /// The client sent no part of its body for this long.
    #[error("the client sent no part of its body for {0:?}")]
    ClientStalled(Duration),
    /// Reading the upstream's answer body failed (closed early, or framed wrongly).
    #[error("upstream body: {0}")]
    Upstream(hyper::Error),
    /// The same, read by the hand-written HTTP/1.1 client
    /// (`connections.upstream_http1: idemgate`).
    #[error("upstream body: {0}")]
    UpstreamWire(std::io::Error),
    /// An HTTP/2 answer's stream ended before its `END_STREAM`: reset with `NO_ERROR`,
    /// which hyper's client reports as the body's end, though RFC 9113 §8.1 allows it
    /// only after a complete answer. The answer is cut short.
    #[error("upstream body: the stream was reset before the answer ended")]
    UpstreamCutShort,
    /// The upstream sent more than this many bytes on an HTTP/2 stream after an answer
    /// that ends at its head (a 204, say): a hostile upstream's.
    #[error("upstream body: more than {0} bytes after an answer that ends at its head")]
    UpstreamStray(usize),
    /// The upstream sent no part of its answer's body for this long.
    #[error("the upstream sent no part of its answer's body for {0:?}")]
    UpstreamStalled(Duration),
}

/// A request or response body.
pub enum ProxyBody {
    /// Whole in memory; yields it in frames of at most [`FULL_FRAME`] bytes (slices of
    /// the one buffer, not copies).
    Full {
        /// The bytes, taken by the first poll.
        data: Option<Bytes>,
    },
    /// Streamed from the client as it arrives, its trailers filtered.
    Stream {
        /// hyper's body of the other connection (`Unpin`, so no pin projection is needed).
        inner: Incoming,
        /// How long the client may send nothing (nginx's `client_body_timeout`).
        gap: Gap,
    },
    /// Streamed from the upstream as it arrives, its trailers filtered; its connection
    /// goes back to the pool at the end.
    Upstream {
        /// The upstream connection's body. Boxed so that this module, which the upstream
        /// client builds on, does not depend on the upstream client's types.
        inner: Pin<Box<dyn Body<Data = Bytes, Error = BodyError> + Send>>,
        /// How long the upstream may send nothing after the head (nginx's
        /// `proxy_read_timeout`).
        gap: Gap,
    },
    /// Any other body (rare paths, such as an observed request too large to buffer that
    /// streams on after the part already read).
    Boxed {
        /// The body.
        inner: Pin<Box<dyn Body<Data = Bytes, Error = BodyError> + Send>>,
    },
}

impl std::fmt::Debug for ProxyBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Full { data } => f.debug_struct("Full").field("data", data).finish(),
            Self::Stream { inner, .. } => f.debug_struct("Stream").field("inner", inner).finish(),
            Self::Upstream { .. } => f.write_str("Upstream"),
            Self::Boxed { .. } => f.write_str("Boxed"),
        }
    }
}

impl ProxyBody {
    /// A buffered body (empty bodies yield no frame).
    pub fn full(data: Bytes) -> Self {
        Self::Full {
            data: (!data.is_empty()).then_some(data),
        }
    }

    /// No body.
    pub fn empty() -> Self {
        Self::Full { data: None }
    }

    /// A streamed request body, cut off with [`BodyError::ClientStalled`] when the client
    /// sends nothing for `gap` (never, if `None`).
    pub fn stream(inner: Incoming, gap: Option<Duration>) -> Self {
        Self::Stream {
            inner,
            gap: Gap::new(gap),
        }
    }

    /// Any body.
    pub fn boxed(inner: impl Body<Data = Bytes, Error = BodyError> + Send + 'static) -> Self {
        Self::Boxed {
            inner: Box::pin(inner),
        }
    }

    /// A buffered body, then `trailers` (an answer read whole, or replayed). Its length is
    /// left undeclared: HTTP/1.1 can send trailers only after a chunked body.
    pub fn full_with_trailers(data: Bytes, trailers: HeaderMap) -> Self {
        Self::boxed(Trailed {
            data: Self::full(data),
            trailers: Some(trailers),
        })
    }

    /// A streamed upstream answer body, cut off with [`BodyError::UpstreamStalled`] when
    /// the upstream sends nothing for `gap` (never, if `None`); its trailers lose the
    /// fields [`is_forwardable_trailer`] refuses.
    pub fn upstream(
        inner: impl Body<Data = Bytes, Error = BodyError> + Send + 'static,
        gap: Option<Duration>,
    ) -> Self {
        Self::Upstream {
            inner: Box::pin(inner),
            gap: Gap::new(gap),
        }
    }
}

/// The largest frame a [`ProxyBody::Full`] hands on. hyper's HTTP/2 side queues a frame
/// whole in the connection as soon as the client's window has any room, and drops the body
/// once it queued the last: an answer handed as one frame would wait there, unseen by the
/// connection's watchdog (`crate::server`), for as long as the client leaves its window
/// shut and keeps another request open; in frames, the next one waits in the body, where
/// the watchdog sees it, and the connection queues at most one frame per stream. Its
/// HTTP/1.1 side copies each frame into its write buffer: a client that does not read then
/// holds about that buffer, not a copy of the whole answer.
pub const FULL_FRAME: usize = 64 * 1024;

/// An upstream answer's body, which knows the longest it may go without a frame once it
/// streams on to a client (`connections.upstream_read_timeout` of the client it came
/// from; `None` for no bound).
pub trait ReadGap {
    /// That bound.
    fn read_gap(&self) -> Option<Duration>;
}

/// The longest a streamed body may go without a frame; see [`ProxyBody::stream`]. Its
/// timer is made the first time the body has to wait, and re-armed only after a frame
/// came: a body that is always ready (most are) never touches the timer wheel.
#[derive(Debug, Default)]
pub struct Gap {
    limit: Option<Duration>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The sleep runs for the current wait.
    armed: bool,
}

impl Gap {
    fn new(limit: Option<Duration>) -> Self {
        Self {
            limit,
            sleep: None,
            armed: false,
        }
    }

    /// After the body returned `Pending`: the limit if it has passed since the last frame.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Option<Duration> {
        let limit = self.limit?;
        if !self.armed {
            let deadline = tokio::time::Instant::now() + limit;
            match &mut self.sleep {
                Some(sleep) => sleep.as_mut().reset(deadline),
                None => self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            self.armed = true;
        }
        let sleep = self.sleep.as_mut()?;
        sleep.as_mut().poll(cx).is_ready().then_some(limit)
    }

    /// A frame came: the next wait starts a new gap.
    fn progressed(&mut self) {
        self.armed = false;
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Self::Full { data } => Poll::Ready(match data {
                Some(rest) if rest.len() > FULL_FRAME => {
                    Some(Ok(Frame::data(rest.split_to(FULL_FRAME))))
                }
                _ => data.take().map(|d| Ok(Frame::data(d))),
            }),
            Self::Stream { inner, gap } => match Pin::new(inner).poll_frame(cx) {
                Poll::Pending => match gap.poll_expired(cx) {
                    Some(limit) => Poll::Ready(Some(Err(BodyError::ClientStalled(limit)))),
                    None => Poll::Pending,
                },
                // Filtered here whatever the upstream protocol: hyper's HTTP/1.1 client
                // sends only the trailers `request::prepare` declared, its HTTP/2 client
                // all of them.
                Poll::Ready(Some(Ok(frame))) if frame.is_trailers() => {
                    gap.progressed();
                    Poll::Ready(forwardable_trailers(frame).map(Ok))
                }
                Poll::Ready(frame) => {
                    gap.progressed();
                    Poll::Ready(frame.map(|result| result.map_err(BodyError::Client)))
                }
            },
            Self::Upstream { inner, gap } => match inner.as_mut().poll_frame(cx) {
                Poll::Pending => match gap.poll_expired(cx) {
                    Some(limit) => Poll::Ready(Some(Err(BodyError::UpstreamStalled(limit)))),
                    None => Poll::Pending,
                },
                Poll::Ready(Some(Ok(frame))) if frame.is_trailers() => {
                    gap.progressed();
                    Poll::Ready(forwardable_trailers(frame).map(Ok))
                }
                Poll::Ready(frame) => {
                    gap.progressed();
                    Poll::Ready(frame)
                }
            },
            Self::Boxed { inner } => inner.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Full { data } => data.is_none(),
            Self::Stream { inner, .. } => inner.is_end_stream(),
            Self::Upstream { inner, .. } => inner.is_end_stream(),
            Self::Boxed { inner } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Self::Stream { inner, .. } => inner.size_hint(),
            Self::Upstream { inner, .. } => inner.size_hint(),
            Self::Boxed { inner } => inner.size_hint(),
        }
    }
}

/// A buffered body and the trailers that follow it ([`ProxyBody::full_with_trailers`]).
struct Trailed {
    data: ProxyBody,
    trailers: Option<HeaderMap>,
}

impl Body for Trailed {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match Pin::new(&mut self.data).poll_frame(cx) {
            Poll::Ready(None) => Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t)))),
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_end_stream() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = SizeHint::new();
        hint.set_lower(self.data.size_hint().lower());
        hint
    }
}

/// A trailers frame without the fields [`is_forwardable_trailer`] refuses; `None` when
/// none is left.
fn forwardable_trailers(frame: Frame<Bytes>) -> Option<Frame<Bytes>> {
    match frame.into_trailers() {
        Ok(trailers) => forwardable(trailers).map(Frame::trailers),
        Err(frame) => Some(frame),
    }
}

/// `trailers` without the fields [`is_forwardable_trailer`] refuses (a length, a
/// `Set-Cookie` or `Authorization`, a client address the recipient would take as the
/// message's own); `None` when none is left. Copied only when one has to go.
pub(crate) fn forwardable(trailers: HeaderMap) -> Option<HeaderMap> {
    if trailers.keys().all(is_forwardable_trailer) {
        return (!trailers.is_empty()).then_some(trailers);
    }
    let mut kept = HeaderMap::new();
    let mut current = None;
    for (name, value) in trailers {
        // The name comes with the first of its values only.
        if name.is_some() {
            current = name.filter(is_forwardable_trailer);
        }
        if let Some(name) = &current {
            kept.append(name.clone(), value);
        }
    }
    (!kept.is_empty()).then_some(kept)
}

/// A client's request body, as the handler gets it: streamed by hyper.
#[derive(Debug)]
pub enum RequestBody {
    /// As hyper's connection delivers it (HTTP/1.1 or HTTP/2).
    Incoming(Incoming),
}

impl RequestBody {
    /// Whether the client declared no body (or an empty one): nothing is left to read.
    pub fn is_empty(&self) -> bool {
        match self {
            Self::Incoming(inner) => inner.is_end_stream(),
        }
    }

    /// The body to forward: streamed on, cut off once the client sends nothing for `gap`.
    pub fn into_proxy_body(self, gap: Option<Duration>) -> ProxyBody {
        match self {
            Self::Incoming(inner) => ProxyBody::stream(inner, gap),
        }
    }
}

/// Buffers a request body of at most `limit` bytes. A declared `Content-Length` over the
/// limit is refused before a byte is read (and before `100 Continue` is sent). A client
/// that sends nothing for `gap` while the body is incomplete gets a 408 (nginx's
/// `client_body_timeout`): the key is derived from the whole body, so until it is in the
/// request holds its connection and buffer, and a stalled client would hold them forever.
/// The body is held in about its own size however it is cut into frames ([`Joined`]),
/// taken from `budget` and the share of its connection `conn` counts as it comes: a body
/// that finds no room is refused with [`ProxyError::Overloaded`] (nothing claimed or sent
/// yet), and the body returned holds its bytes until its last part drops.
pub async fn read_limited(
    headers: &HeaderMap,
    body: RequestBody,
    limit: usize,
    gap: Duration,
    budget: &Arc<Budget>,
    conn: &Arc<ConnBuffers>,
) -> Result<Bytes, ProxyError> {
    let declared = super::head::declared_length(headers);
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ProxyError::PayloadTooLarge { limit });
    }
    let RequestBody::Incoming(body) = body;
    let mut body = http_body_util::Limited::new(body, limit);
    let mut joined = Joined::new(declared, limit, budget.charge(conn));
    loop {
        // A body that has arrived with the head (most do) is read without arming a timer.
        let mut next = body.frame();
        let frame = match poll_once(&mut next).await {
            Poll::Ready(frame) => frame,
            Poll::Pending => tokio::time::timeout(gap, next)
                .await
                .map_err(|_| ProxyError::BodyTimeout(gap.as_secs()))?,
        };
        match frame {
            None => break,
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    if let Err((_, short)) = joined.push(data) {
                        budget.refused(Refusal::RequestBody, short);
                        return Err(ProxyError::Overloaded {
                            retry_after: OVERLOADED_RETRY_AFTER,
                            short,
                            replay: false,
                        });
                    }
                }
            }
            Some(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(ProxyError::PayloadTooLarge { limit })
            }
            Some(Err(e)) => return Err(ProxyError::BodyRead(e.to_string())),
        }
    }
    Ok(joined.into_bytes())
}

/// `Retry-After` of a body refused for want of buffer room: the buffers that fill the
/// budget are mostly requests on their way, gone within a second or so.
pub const OVERLOADED_RETRY_AFTER: u64 = 1;

/// A body's data frames joined into one `Bytes` as they arrive, in memory about the size
/// of the data: a body of one frame (most are) is kept as that frame, without a copy; from
/// the second frame on, every frame is copied into one buffer and dropped.
///
/// No frame is kept as a handle once a second one comes, however large: a handle holds the
/// whole read buffer it was cut from (hyper's grows to 128 KiB on a client connection,
/// about 400 KiB on an upstream one) and costs a handle's size besides, so a client or upstream that sends small frames would make `limit` bytes
/// of data hold many times `limit`, and keeping only large frames (say from 4 KiB) would
/// still let each pin a buffer many times its size. A body of several frames has to be
/// copied into one `Bytes` anyway: copying as they come is that same one copy.
///
/// The buffer grows by doubling with the data, never past the declared length, or `limit`
/// without one (the caller keeps the data within it): with the copy of a growth step, the
/// peak is under twice `limit`. It is not made at once of the declared length: a client
/// that declares `max_body` and sends two bytes, then a byte per body timeout, would make
/// the proxy hold `max_body` for each of its connections and streams for the price of a
/// few bytes; grown with the data, it holds at most about twice what came.
///
/// What it holds (the first frame, then the buffer's capacity) is taken from its
/// [`Charge`] before it is held; a growth step the budget has no room for is tried again
/// at the size the data needs.
pub(crate) struct Joined {
    /// The only frame so far, or nothing.
    first: Bytes,
    /// The frames so far, copied, once a second came.
    copied: Vec<u8>,
    /// The most the buffer grows to: the declared length if any, at most `limit`.
    cap: usize,
    /// What it holds, taken from the budget.
    charge: Charge,
}

impl Joined {
    /// The smallest buffer made for a body of unknown length.
    const MIN_BUFFER: usize = 8 * 1024;

    /// Nothing yet, for a body of at most `limit` bytes that declared `declared` bytes,
    /// paid for by `charge`.
    pub(crate) fn new(declared: Option<u64>, limit: usize, charge: Charge) -> Self {
        Self {
            first: Bytes::new(),
            copied: Vec::new(),
            cap: declared.map_or(limit, |n| n.min(limit as u64) as usize),
            charge,
        }
    }

    /// The bytes so far.
    pub(crate) fn len(&self) -> usize {
        self.first.len() + self.copied.len()
    }

    /// Charges `more` bytes besides the data (an answer's trailers, which come last); the
    /// limit it found no room under if the budget or the connection's share has none.
    pub(crate) fn charge_more(&mut self, more: usize) -> Result<(), Short> {
        self.charge.grow(more)
    }

    /// Adds `data`, which the caller keeps within the limit; hands it back with the
    /// limit it found no room under, the body unchanged, if the budget or the connection's
    /// share has no room for it.
    pub(crate) fn push(&mut self, data: Bytes) -> Result<(), (Bytes, Short)> {
        if data.is_empty() {
            return Ok(());
        }
        if self.copied.is_empty() && self.first.is_empty() {
            if let Err(short) = self.charge.resize(data.len()) {
                return Err((data, short));
            }
            self.first = data;
            return Ok(());
        }
        if let Err(short) = self.reserve(self.len() + data.len()) {
            return Err((data, short));
        }
        if !self.first.is_empty() {
            let first = std::mem::take(&mut self.first);
            self.copied.extend_from_slice(&first);
        }
        self.copied.extend_from_slice(&data);
        Ok(())
    }

    /// Room for `needed` bytes in all: twice the buffer, within the cap, or just `needed`
    /// when the budget has no room for more; the limit it found no room under if it has
    /// none for that either.
    fn reserve(&mut self, needed: usize) -> Result<(), Short> {
        if needed <= self.copied.capacity() {
            return Ok(());
        }
        let size = (self.copied.capacity() * 2)
            .max(Self::MIN_BUFFER)
            .min(self.cap)
            .max(needed);
        let size = match self.charge.resize(size) {
            Ok(()) => size,
            Err(short) if size == needed => return Err(short),
            Err(_) => {
                self.charge.resize(needed)?;
                needed
            }
        };
        self.copied.reserve_exact(size - self.copied.len());
        Ok(())
    }

    /// The whole data (a buffer's spare room, if any, is kept rather than copied away),
    /// holding its charge until its last part drops.
    pub(crate) fn into_bytes(self) -> Bytes {
        if self.copied.is_empty() {
            self.charge.attach(self.first)
        } else {
            self.charge.attach(self.copied)
        }
    }

    /// The whole data, as [`Joined::into_bytes`] holds it, and apart from it the charge
    /// that pays for it: for an owner's answer, whose charge goes on to the copy its
    /// client is answered from.
    pub(crate) fn into_parts(self) -> (Bytes, Charge) {
        let data = if self.copied.is_empty() {
            self.first
        } else {
            Bytes::from(self.copied)
        };
        (data, self.charge)
    }
}

/// Polls `future` once, without waiting.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *future).poll(cx))).await
}

#[cfg(test)]
mod tests;
