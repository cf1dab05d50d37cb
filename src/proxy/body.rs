//! [`ProxyBody`], the one body type on both sides of the proxy: a buffered body (protected
//! requests, replays, problem answers) or a stream passed through without buffering.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::upstream::UpstreamBody;
use crate::error::ProxyError;

/// Why a streamed body stopped.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Reading the client's request body failed.
    #[error("client body: {0}")]
    Client(#[from] hyper::Error),
    /// Reading the upstream's answer body failed (closed early, or framed wrongly).
    #[error("upstream body: {0}")]
    Upstream(#[from] std::io::Error),
}

/// A request or response body.
#[derive(Debug)]
pub enum ProxyBody {
    /// Whole in memory; yields one frame.
    Full {
        /// The bytes, taken by the first poll.
        data: Option<Bytes>,
    },
    /// Streamed from the client as it arrives.
    Stream {
        /// hyper's body of the other connection (`Unpin`, so no pin projection is needed).
        inner: Incoming,
    },
    /// Streamed from the upstream as it arrives; its connection goes back to the pool at
    /// the end.
    Upstream {
        /// The upstream connection's body.
        inner: UpstreamBody,
    },
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

    /// A streamed request body.
    pub fn stream(inner: Incoming) -> Self {
        Self::Stream { inner }
    }

    /// A streamed upstream response body.
    pub fn upstream(inner: UpstreamBody) -> Self {
        Self::Upstream { inner }
    }

    /// Reads what is left of a client's streamed body and drops it, for at most
    /// [`LINGER`], in a task of its own. For an upload the upstream answered before it
    /// ended: a client still writing it would otherwise have its connection reset under
    /// it and lose the answer (nginx reads on for the same reason, `lingering_close`).
    pub fn drain_in_background(self) {
        let Self::Stream { mut inner } = self else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let drain = async { while let Some(Ok(_)) = inner.frame().await {} };
                let _ = tokio::time::timeout(LINGER, drain).await;
            });
        }
    }
}

/// The longest an answered upload is read on (nginx's `lingering_time` default).
pub const LINGER: Duration = Duration::from_secs(30);

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Self::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Self::Stream { inner } => Pin::new(inner)
                .poll_frame(cx)
                .map(|frame| frame.map(|result| result.map_err(BodyError::Client))),
            Self::Upstream { inner } => Pin::new(inner).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Full { data } => data.is_none(),
            Self::Stream { inner } => inner.is_end_stream(),
            Self::Upstream { inner } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Self::Stream { inner } => inner.size_hint(),
            Self::Upstream { inner } => inner.size_hint(),
        }
    }
}

/// A client's request body, as the handler gets it.
#[derive(Debug)]
pub enum RequestBody {
    /// Streamed by hyper: HTTP/2, and HTTP/1.1 requests the fast path hands over (see
    /// `server::http1`).
    Incoming(Incoming),
    /// Read whole with its head by the HTTP/1.1 fast path.
    Buffered(Bytes),
}

impl RequestBody {
    /// The body to forward: streamed on, or the buffered bytes.
    pub fn into_proxy_body(self) -> ProxyBody {
        match self {
            Self::Incoming(inner) => ProxyBody::stream(inner),
            Self::Buffered(data) => ProxyBody::full(data),
        }
    }
}

/// Buffers a request body of at most `limit` bytes. A declared `Content-Length` over the
/// limit is refused before a byte is read (and before `100 Continue` is sent). A client
/// that sends nothing for `gap` while the body is incomplete gets a 408 (nginx's
/// `client_body_timeout`): the key is derived from the whole body, so until it is in the
/// request holds its connection and buffer, and a stalled client would hold them forever.
pub async fn read_limited(
    headers: &HeaderMap,
    body: RequestBody,
    limit: usize,
    gap: Duration,
) -> Result<Bytes, ProxyError> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ProxyError::PayloadTooLarge { limit });
    }
    let body = match body {
        RequestBody::Buffered(data) if data.len() > limit => {
            return Err(ProxyError::PayloadTooLarge { limit })
        }
        RequestBody::Buffered(data) => return Ok(data),
        RequestBody::Incoming(body) => body,
    };
    let mut body = http_body_util::Limited::new(body, limit);
    let mut chunks: Vec<Bytes> = Vec::new();
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
                    if !data.is_empty() {
                        chunks.push(data);
                    }
                }
            }
            Some(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(ProxyError::PayloadTooLarge { limit })
            }
            Some(Err(e)) => return Err(ProxyError::BodyRead(e.to_string())),
        }
    }
    Ok(join(chunks))
}

/// Reads all of `body`'s data (trailers are dropped) into one `Bytes`. Unlike
/// http-body-util's `collect`, whose queue and copy cost an 8-byte answer about 900
/// instructions, a body of one chunk (most answers) is returned as that chunk.
pub async fn collect_bytes<B>(mut body: B) -> Result<Bytes, B::Error>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut chunks: Vec<Bytes> = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            if !data.is_empty() {
                chunks.push(data);
            }
        }
    }
    Ok(join(chunks))
}

/// One `Bytes` of `chunks`, copied only if there is more than one.
fn join(mut chunks: Vec<Bytes>) -> Bytes {
    match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().expect("one chunk"),
        _ => Bytes::from(chunks.concat()),
    }
}

/// Polls `future` once, without waiting.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *future).poll(cx))).await
}
