//! HTTP/1.1 to the upstream on one connection, in the forwarding request's own task: the
//! request is written and the answer's head read by the future that forwards it, and the
//! answer's body is decoded by whoever polls that body (RFC 9112).
//!
//! hyper's client runs each connection in a task of its own and passes the request, the
//! answer and every body chunk through channels to and from it. With one origin and one
//! request per connection at a time that machinery was a third of the proxy's own
//! instructions per forwarded request (callgrind, benches/load/INSTRUCTIONS.md). Kept here
//! is the wire format and the rule that keeps a pooled connection in step with the
//! upstream: a connection is reused only after an answer whose end its framing marked, with
//! no byte left over.

use std::future::poll_fn;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version};
use http_body::{Body, Frame};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::proxy::body::{BodyError, ProxyBody};
use crate::proxy::headers::{
    connection_names_no_header, is_chunked_alone, is_forwardable_trailer, is_hop_by_hop,
    parse_length, write_field, write_forwarded_fields, Forwarding,
};
use crate::read_buf::poll_read_more;

/// Bytes asked of the socket per read (and the least spare room before one).
const READ_CHUNK: usize = 16 * 1024;
/// The largest answer head accepted (nginx's `proxy_buffer_size` is 4-8 KiB; hyper's
/// default allows ~400 KiB): an upstream sending more is broken or hostile.
const MAX_HEAD: usize = 64 * 1024;
/// Header lines per answer head.
const MAX_HEADERS: usize = 128;
/// A chunk-size line, extensions included.
const MAX_CHUNK_LINE: usize = 4096;
/// A chunked body's trailer section.
const MAX_TRAILERS: usize = 16 * 1024;
/// Request bodies up to this size are copied behind the head and sent in one write.
const COALESCE_BODY: usize = 16 * 1024;

/// The byte stream to the upstream: TCP, or TLS over it.
pub enum Io {
    /// `http://` upstreams.
    Plain(TcpStream),
    /// `https://` upstreams.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Io {
    fn tcp(&self) -> &TcpStream {
        match self {
            Io::Plain(tcp) => tcp,
            Io::Tls(tls) => tls.get_ref().0,
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(io) => io.is_write_vectored(),
            Io::Tls(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_flush(cx),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Why a request did not get an answer head.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Not a byte of the request was written: it may go out again on another connection.
    #[error("{0}")]
    Unsent(io::Error),
    /// The connection failed or the upstream broke the protocol.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The request body could not be read from the client.
    #[error("{0}")]
    Body(BodyError),
}

/// How an answer's body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body: `HEAD`, `204`, `304`.
    Empty,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the upstream closes the connection.
    Close,
    /// `101 Switching Protocols`: the connection now carries another protocol.
    Upgrade,
}

/// An answer head as read from the upstream.
#[derive(Debug)]
pub struct Head {
    /// Status, version and headers as the upstream sent them, less the hop-by-hop ones
    /// that name no other header (kept on a `101`, whose `Upgrade` is forwarded).
    pub parts: http::response::Parts,
    /// Where the body ends.
    pub framing: Framing,
    /// Whether the upstream lets the connection carry another request after this answer.
    pub keep_alive: bool,
}

/// One upstream connection and what has been read from it but not yet consumed.
pub struct Connection {
    io: Io,
    read: BytesMut,
    /// A final answer head that arrived while the request was still being written (see
    /// [`Connection::poll_answered`]), for [`Connection::read_head`]. Boxed: rare, and
    /// the connection is moved in and out of the pool on every request.
    early: Option<Box<Head>>,
}

/// How far a request (or one write of it) got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Every byte went out.
    All,
    /// The upstream answered (or closed) first; the rest was not written.
    Answered,
}

impl Connection {
    /// A connection over `io`, nothing read yet.
    pub fn new(io: Io) -> Self {
        Self {
            io,
            read: BytesMut::new(),
            early: None,
        }
    }

    /// Whether an idle connection can carry a request: the upstream has neither closed it
    /// nor sent anything unasked. Looks at the readiness the runtime already has and reads
    /// only if the socket was reported readable, so a quiet connection costs no syscall.
    /// (Bytes read before it went idle are ruled out where it is pooled:
    /// [`Connection::nothing_unread`].)
    pub fn is_idle_and_open(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        match self.io.tcp().poll_read_ready(&mut cx) {
            Poll::Pending => return true,
            Poll::Ready(Err(_)) => return false,
            Poll::Ready(Ok(())) => {}
        }
        // Readable: a close, unasked bytes, or (TLS) a session ticket that the read consumes.
        let mut probe = [0u8; 64];
        let mut buf = ReadBuf::new(&mut probe);
        matches!(
            Pin::new(&mut self.io).poll_read(&mut cx, &mut buf),
            Poll::Pending
        )
    }

    /// Takes the connection apart after a protocol switch: the stream and the bytes of the
    /// new protocol that arrived with the `101` head.
    pub fn into_upgraded(self) -> (Io, Bytes) {
        (self.io, self.read.freeze())
    }

    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        poll_read_more(Pin::new(&mut self.io), cx, &mut self.read, READ_CHUNK)
    }

    /// Writes the request: its head (fields as [`write_forwarded_fields`] forwards them,
    /// framing fields set here from the body) and its body. Body bytes that are
    /// already there go out in the same write as the head: a small body usually arrives
    /// with its request head, and a write is a syscall and a wake-up of the upstream.
    pub async fn write_request(
        &mut self,
        parts: &http::request::Parts,
        forwarding: &Forwarding<'_>,
        fallback_host: impl FnOnce() -> Option<HeaderValue>,
        body: &mut ProxyBody,
    ) -> Result<Written, SendError> {
        let framing = RequestFraming::of(parts, body);
        let method = &parts.method;
        let mut out = encode_head(parts, forwarding, fallback_host, framing);
        if let ProxyBody::Full { data } = body {
            // Borrowed, not taken: a request that was not sent goes out again with its body.
            let data: &[u8] = data.as_deref().unwrap_or_default();
            if data.len() <= COALESCE_BODY {
                out.extend_from_slice(data);
                let written = self.write_first(method, &out).await?;
                return self.flushed(written).await;
            }
        }
        // Boxed: what a large or streamed body needs to go out (and to notice an early
        // answer) stays off the future of every other request, which is copied whole
        // wherever that future moves.
        Box::pin(self.write_body(method, out, framing, body)).await
    }

    /// [`Connection::write_request`] for a body that is streamed or too large to go out
    /// with the head: `out` (the head) first, then the body, ending early if the
    /// upstream answers first.
    async fn write_body(
        &mut self,
        method: &Method,
        mut out: Vec<u8>,
        framing: RequestFraming,
        body: &mut ProxyBody,
    ) -> Result<Written, SendError> {
        if let ProxyBody::Full { data } = body {
            let data: &[u8] = data.as_deref().unwrap_or_default();
            let written = match self.write_first(method, &out).await? {
                Written::All => self.write_all(method, &[data]).await?,
                answered => answered,
            };
            return self.flushed(written).await;
        }
        let chunked = framing == RequestFraming::Chunked;
        let mut first = true;
        let mut took_body = false;
        let mut trailers = None;
        loop {
            // Wait for the body only with nothing left to write; otherwise take what is
            // ready and write the rest first. An upstream that answers while the client is
            // still sending ends the request here: its answer is relayed at once.
            let frame = if out.is_empty() {
                let next = poll_fn(|cx| {
                    if self.poll_answered(method, cx)?.is_ready() {
                        return Poll::Ready(Ok::<_, io::Error>(None));
                    }
                    Pin::new(&mut *body)
                        .poll_frame(cx)
                        .map(|frame| Ok(Some(frame)))
                });
                match next.await? {
                    Some(frame) => frame,
                    None => return Ok(Written::Answered),
                }
            } else {
                match poll_fn(|cx| Poll::Ready(Pin::new(&mut *body).poll_frame(cx))).await {
                    Poll::Ready(frame) => frame,
                    Poll::Pending => {
                        if let Written::Answered = self
                            .write_out(method, &mut out, &[], &mut first, took_body)
                            .await?
                        {
                            return Ok(Written::Answered);
                        }
                        continue;
                    }
                }
            };
            let data = match frame {
                None => break,
                Some(Err(e)) => return Err(SendError::Body(e)),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => data,
                    Err(frame) => {
                        trailers = frame.into_trailers().ok();
                        continue;
                    }
                },
            };
            if data.is_empty() {
                continue;
            }
            took_body = true;
            if chunked {
                out.extend_from_slice(format!("{:X}\r\n", data.len()).as_bytes());
            }
            if out.len() + data.len() <= COALESCE_BODY {
                out.extend_from_slice(&data);
            } else if let Written::Answered = self
                .write_out(method, &mut out, &data, &mut first, took_body)
                .await?
            {
                return Ok(Written::Answered);
            }
            if chunked {
                out.extend_from_slice(b"\r\n");
            }
        }
        if chunked {
            out.extend_from_slice(b"0\r\n");
            for (name, value) in trailers.iter().flatten() {
                if is_forwardable_trailer(name) {
                    write_field(&mut out, name.as_str(), value.as_bytes());
                }
            }
            out.extend_from_slice(b"\r\n");
        }
        let written = self
            .write_out(method, &mut out, &[], &mut first, took_body)
            .await?;
        self.flushed(written).await
    }

    /// `written`, after a flush if the whole request went out (an answered one ends
    /// here: nothing more of it is sent).
    async fn flushed(&mut self, written: Written) -> Result<Written, SendError> {
        if written == Written::All {
            self.io.flush().await?;
        }
        Ok(written)
    }

    /// Writes `out` then `data`, and empties `out`. Only the request's first write may
    /// fail as [`SendError::Unsent`], and only if no body frame went into it: a frame
    /// taken from the client's body cannot be taken again for a retry.
    async fn write_out(
        &mut self,
        method: &Method,
        out: &mut Vec<u8>,
        data: &[u8],
        first: &mut bool,
        took_body: bool,
    ) -> Result<Written, SendError> {
        let written = if std::mem::take(first) {
            match self.write_first(method, out).await {
                Err(SendError::Unsent(e)) if took_body => return Err(SendError::Io(e)),
                Ok(Written::All) => self.write_all(method, &[data]).await?,
                result => result?,
            }
        } else {
            self.write_all(method, &[out, data]).await?
        };
        out.clear();
        Ok(written)
    }

    /// The request's first write: if the connection takes none of it (a kept-alive
    /// connection the upstream has reset), nothing was sent.
    async fn write_first(&mut self, method: &Method, bytes: &[u8]) -> Result<Written, SendError> {
        match self.io.write(bytes).await {
            Ok(0) => Err(SendError::Unsent(io::ErrorKind::WriteZero.into())),
            Ok(n) => Ok(self.write_all(method, &[&bytes[n..]]).await?),
            Err(e) => Err(SendError::Unsent(e)),
        }
    }

    /// Writes every byte of `parts`, in as few writes as the socket allows, unless the
    /// upstream answers to `method` first: an upstream that refuses a large upload
    /// answers and stops reading, and writing on would wait for the timeout with its
    /// answer unread (nginx, which buffers uploads by default, never meets this; Envoy
    /// and hyper relay such an answer as it arrives).
    async fn write_all(&mut self, method: &Method, parts: &[&[u8]]) -> io::Result<Written> {
        let mut slices: Vec<io::IoSlice<'_>> = parts
            .iter()
            .filter(|p| !p.is_empty())
            .map(|p| io::IoSlice::new(p))
            .collect();
        let mut slices = &mut slices[..];
        while !slices.is_empty() {
            let n = poll_fn(|cx| {
                if self.poll_answered(method, cx)?.is_ready() {
                    return Poll::Ready(Ok(None));
                }
                Pin::new(&mut self.io)
                    .poll_write_vectored(cx, slices)
                    .map_ok(Some)
            })
            .await?;
            match n {
                None => return Ok(Written::Answered),
                Some(0) => return Err(io::ErrorKind::WriteZero.into()),
                Some(n) => io::IoSlice::advance_slices(&mut slices, n),
            }
        }
        Ok(Written::All)
    }

    /// Ready once the upstream has answered `method` while the request is still going
    /// out: a final head, parsed and kept for [`Connection::read_head`] (interim `1xx`
    /// heads are skipped, as `read_head` skips them: a `100 Continue` asks for the body),
    /// or the end of the stream or an error, which `read_head` then reports. Either way
    /// the rest of the request is not sent, and the connection is not reused.
    fn poll_answered(&mut self, method: &Method, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.early.is_some() {
            return Poll::Ready(Ok(()));
        }
        if let Some(mut head) = ready!(self.poll_final_head(method, cx))? {
            head.keep_alive = false;
            self.early = Some(Box::new(head));
        }
        Poll::Ready(Ok(()))
    }

    /// Reads the answer head to `method`, skipping interim (1xx) answers other than `101`.
    pub async fn read_head(&mut self, method: &Method) -> io::Result<Head> {
        if let Some(head) = self.early.take() {
            return Ok(*head);
        }
        match poll_fn(|cx| self.poll_final_head(method, cx)).await? {
            Some(head) => Ok(head),
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the upstream closed the connection before answering",
            )),
        }
    }

    /// The next final answer head to `method`, reading as needed and skipping interim
    /// (1xx) answers other than `101`; `None` if the upstream closed first.
    fn poll_final_head(
        &mut self,
        method: &Method,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<Option<Head>>> {
        loop {
            if let Some(head) = parse_head(&mut self.read, method)? {
                if head.parts.status.is_informational()
                    && head.parts.status != StatusCode::SWITCHING_PROTOCOLS
                {
                    continue;
                }
                return Poll::Ready(Ok(Some(head)));
            }
            if self.read.len() >= MAX_HEAD {
                return Poll::Ready(Err(invalid("the upstream's answer head is too large")));
            }
            if ready!(self.poll_fill(cx))? == 0 {
                return Poll::Ready(Ok(None));
            }
        }
    }

    /// The next frame of a body framed by `decoder`; `None` at its end.
    pub fn poll_body(
        &mut self,
        decoder: &mut Decoder,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        loop {
            match decoder.step(&mut self.read) {
                Step::Frame(frame) => return Poll::Ready(Some(Ok(frame))),
                Step::Done => return Poll::Ready(None),
                Step::Failed(e) => return Poll::Ready(Some(Err(e))),
                Step::NeedMore => {}
            }
            let n = match ready!(self.poll_fill(cx)) {
                Ok(n) => n,
                Err(e) => return Poll::Ready(Some(Err(e))),
            };
            if n == 0 {
                return Poll::Ready(match decoder.at_eof() {
                    Ok(()) => None,
                    Err(e) => Some(Err(e)),
                });
            }
        }
    }

    /// Whether nothing past the end of the last answer has arrived.
    pub fn nothing_unread(&self) -> bool {
        self.read.is_empty()
    }
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// How a request body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestFraming {
    /// No body and no `Content-Length`.
    None,
    Length(u64),
    Chunked,
}

impl RequestFraming {
    fn of(parts: &http::request::Parts, body: &ProxyBody) -> Self {
        let length = match body {
            ProxyBody::Full { data } => Some(data.as_ref().map_or(0, |d| d.len() as u64)),
            other => other.size_hint().exact(),
        };
        match length {
            // Servers may insist on a length for these methods even when it is zero (411).
            Some(0)
                if !parts.headers.contains_key(CONTENT_LENGTH)
                    && !matches!(parts.method, Method::POST | Method::PUT | Method::PATCH) =>
            {
                Self::None
            }
            Some(n) => Self::Length(n),
            None => Self::Chunked,
        }
    }
}

/// The request line and header section: the client's fields as
/// [`write_forwarded_fields`] forwards them, then the framing fields of the body actually
/// sent (the client's were for the body it sent, which may have been re-framed).
fn encode_head(
    parts: &http::request::Parts,
    forwarding: &Forwarding<'_>,
    fallback_host: impl FnOnce() -> Option<HeaderValue>,
    framing: RequestFraming,
) -> Vec<u8> {
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    // Room for a body that is coalesced into the head's write, so it needs no regrowth.
    let body = match framing {
        RequestFraming::Length(n) if n <= COALESCE_BODY as u64 => n as usize,
        _ => 0,
    };
    let mut head = Vec::with_capacity(256 + parts.headers.len() * 48 + body);
    head.extend_from_slice(parts.method.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(target.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    write_forwarded_fields(&parts.headers, forwarding, fallback_host, &mut head);
    match framing {
        RequestFraming::None => {}
        RequestFraming::Length(n) => {
            write_field(
                &mut head,
                "content-length",
                itoa::Buffer::new().format(n).as_bytes(),
            );
        }
        RequestFraming::Chunked => write_field(&mut head, "transfer-encoding", b"chunked"),
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// Parses one answer head off the front of `read`; `None` if it is not complete yet.
fn parse_head(read: &mut BytesMut, method: &Method) -> io::Result<Option<Head>> {
    // Uninitialised slots: zeroing 128 of them cost more than parsing a typical head.
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        read,
        &mut fields,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(invalid("the upstream's answer has too many headers"))
        }
        Err(_) => return Err(invalid("the upstream's answer head is malformed")),
    };
    let status = response
        .code
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or_else(|| invalid("the upstream's answer has an invalid status"))?;
    let version = if response.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    let mut length: Option<u64> = None;
    let mut transfer_encoded = false;
    let mut close = false;
    let mut keep_alive_token = false;
    // Values are slices of one copy of the head instead of a copy each.
    let bytes = Bytes::copy_from_slice(&read[..len]);
    let base = read.as_ptr() as usize;
    for field in response.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| invalid("the upstream sent an invalid header name"))?;
        let start = field.value.as_ptr() as usize - base;
        let value = HeaderValue::from_maybe_shared(bytes.slice(start..start + field.value.len()))
            .map_err(|_| invalid("the upstream sent an invalid header value"))?;
        if name == CONTENT_LENGTH {
            // `5, 5` and repeated equal values are one length; anything else is ambiguous.
            for item in value.as_bytes().split(|&b| b == b',') {
                let n = parse_length(item)
                    .ok_or_else(|| invalid("the upstream sent an invalid Content-Length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(invalid("the upstream sent conflicting Content-Lengths"));
                }
                length = Some(n);
            }
        } else if name == TRANSFER_ENCODING {
            transfer_encoded = true;
        } else if name == CONNECTION {
            for token in value.to_str().unwrap_or("").split(',').map(str::trim) {
                close |= token.eq_ignore_ascii_case("close");
                keep_alive_token |= token.eq_ignore_ascii_case("keep-alive");
            }
        }
        // Hop-by-hop fields describe this connection only and would be stripped before the
        // answer goes on (inserting and then removing one is most of a header's cost), so
        // they are not kept; except on a protocol switch, whose `Upgrade` is forwarded, and
        // a `Connection` that names other fields, which strip_hop_by_hop must see to remove
        // those too.
        let hop_by_hop = status != StatusCode::SWITCHING_PROTOCOLS
            && is_hop_by_hop(name.as_str())
            && (name != CONNECTION || connection_names_no_header(value.as_bytes()));
        if !hop_by_hop {
            headers.append(name, value);
        }
    }
    let chunked = transfer_encoded
        && is_chunked_alone(
            response
                .headers
                .iter()
                .filter(|field| field.name.eq_ignore_ascii_case("transfer-encoding"))
                .map(|field| field.value),
        );
    // Both framings (RFC 9112 §6.3 says to treat it as an error: it may be an attempt to
    // desynchronise), or a coding besides chunked (gzip under the chunks would reach the
    // client unmarked).
    let odd = transfer_encoded && (!chunked || length.is_some());
    let bodiless = *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    if odd && !bodiless {
        // A 502, like two different lengths, never a guess (nginx answers these so too).
        return Err(invalid(
            "the upstream's answer is framed both ways or coded besides chunked",
        ));
    }
    read.advance(len);
    // A bodiless answer ends at its head whatever its fields say (§6.3 rule 1), but an
    // oddly framed one does not leave its connection for reuse.
    let framing = if status == StatusCode::SWITCHING_PROTOCOLS {
        Framing::Upgrade
    } else if bodiless {
        Framing::Empty
    } else if chunked {
        Framing::Chunked
    } else {
        match length {
            Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
            None => Framing::Close,
        }
    };
    let keep_alive = !close
        && !odd
        && (version == Version::HTTP_11 || keep_alive_token)
        && framing != Framing::Close;
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = version;
    parts.headers = headers;
    Ok(Some(Head {
        parts,
        framing,
        keep_alive,
    }))
}

/// Where in a body the decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoder {
    /// This many body bytes are still to come.
    Length(u64),
    /// Expecting a chunk-size line.
    ChunkSize,
    /// This many bytes of the current chunk are still to come.
    ChunkData(u64),
    /// Expecting the CRLF after a chunk's data.
    ChunkEnd,
    /// Expecting the trailer section after the last chunk.
    Trailers,
    /// Everything until the upstream closes.
    UntilClose,
    /// The body has ended.
    Done,
}

enum Step {
    Frame(Frame<Bytes>),
    NeedMore,
    Done,
    Failed(io::Error),
}

impl Decoder {
    /// The decoder for `framing` (`Empty` and `Upgrade` have no body).
    pub fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty | Framing::Upgrade | Framing::Length(0) => Self::Done,
            Framing::Length(n) => Self::Length(n),
            Framing::Chunked => Self::ChunkSize,
            Framing::Close => Self::UntilClose,
        }
    }

    /// Whether the body has ended.
    pub fn is_done(&self) -> bool {
        *self == Self::Done
    }

    /// Bytes still to come, when the framing says.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            Self::Length(n) => Some(*n),
            Self::Done => Some(0),
            _ => None,
        }
    }

    /// The upstream closed the connection with the decoder here.
    fn at_eof(&mut self) -> io::Result<()> {
        match self {
            Self::UntilClose | Self::Done => {
                *self = Self::Done;
                Ok(())
            }
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the upstream closed the connection mid-body",
            )),
        }
    }

    /// Advances over what `read` holds.
    fn step(&mut self, read: &mut BytesMut) -> Step {
        loop {
            match *self {
                Self::Done => return Step::Done,
                Self::Length(remaining) | Self::ChunkData(remaining) => {
                    if read.is_empty() {
                        return Step::NeedMore;
                    }
                    let n = (read.len() as u64).min(remaining) as usize;
                    let data = read.split_to(n).freeze();
                    let left = remaining - n as u64;
                    *self = match (*self, left) {
                        (Self::Length(_), 0) => Self::Done,
                        (Self::Length(_), left) => Self::Length(left),
                        (_, 0) => Self::ChunkEnd,
                        (_, left) => Self::ChunkData(left),
                    };
                    return Step::Frame(Frame::data(data));
                }
                Self::UntilClose => {
                    if read.is_empty() {
                        return Step::NeedMore;
                    }
                    return Step::Frame(Frame::data(read.split().freeze()));
                }
                Self::ChunkSize => {
                    let Some(end) = find_crlf(read, MAX_CHUNK_LINE) else {
                        if read.len() > MAX_CHUNK_LINE {
                            return Step::Failed(invalid(
                                "the upstream sent an overlong chunk line",
                            ));
                        }
                        return Step::NeedMore;
                    };
                    let size = match parse_chunk_size(&read[..end]) {
                        Ok(size) => size,
                        Err(e) => return Step::Failed(e),
                    };
                    read.advance(end + 2);
                    *self = if size == 0 {
                        Self::Trailers
                    } else {
                        Self::ChunkData(size)
                    };
                }
                Self::ChunkEnd => {
                    if read.len() < 2 {
                        return Step::NeedMore;
                    }
                    if &read[..2] != b"\r\n" {
                        return Step::Failed(invalid("the upstream sent a chunk without its CRLF"));
                    }
                    read.advance(2);
                    *self = Self::ChunkSize;
                }
                Self::Trailers => {
                    if read.len() < 2 {
                        return Step::NeedMore;
                    }
                    if &read[..2] == b"\r\n" {
                        read.advance(2);
                        *self = Self::Done;
                        continue;
                    }
                    let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") else {
                        if read.len() > MAX_TRAILERS {
                            return Step::Failed(invalid("the upstream sent overlong trailers"));
                        }
                        return Step::NeedMore;
                    };
                    let section = read.split_to(end + 4);
                    *self = Self::Done;
                    let trailers = match parse_trailers(&section) {
                        Ok(trailers) => trailers,
                        Err(e) => return Step::Failed(e),
                    };
                    return Step::Frame(Frame::trailers(trailers));
                }
            }
        }
    }
}

/// Where the first CRLF is, looking at most `limit` bytes in.
fn find_crlf(read: &[u8], limit: usize) -> Option<usize> {
    let window = &read[..read.len().min(limit + 2)];
    window.windows(2).position(|w| w == b"\r\n")
}

/// `1*HEXDIG [ BWS ";" chunk-ext ]`.
fn parse_chunk_size(line: &[u8]) -> io::Result<u64> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return Err(invalid("the upstream sent an invalid chunk size"));
    }
    let rest = &line[digits..];
    let rest_ok = rest
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .is_none_or(|i| rest[i] == b';');
    if !rest_ok {
        return Err(invalid("the upstream sent an invalid chunk size"));
    }
    let digits = std::str::from_utf8(&line[..digits]).expect("hex digits are ASCII");
    u64::from_str_radix(digits, 16).map_err(|_| invalid("the upstream sent an invalid chunk size"))
}

fn parse_trailers(section: &[u8]) -> io::Result<HeaderMap> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match httparse::parse_headers(section, &mut fields) {
        Ok(httparse::Status::Complete((_, fields))) => {
            let mut trailers = HeaderMap::with_capacity(fields.len());
            for field in fields {
                let name = HeaderName::from_bytes(field.name.as_bytes());
                let value = HeaderValue::from_bytes(field.value);
                if let (Ok(name), Ok(value)) = (name, value) {
                    if is_forwardable_trailer(&name) {
                        trailers.append(name, value);
                    }
                }
            }
            Ok(trailers)
        }
        _ => Err(invalid("the upstream sent malformed trailers")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str, method: Method) -> io::Result<Option<Head>> {
        parse_head(&mut BytesMut::from(raw.as_bytes()), &method)
    }

    fn decode(framing: Framing, wire: &[u8]) -> (Vec<u8>, Option<HeaderMap>, Decoder, usize) {
        let mut read = BytesMut::from(wire);
        let mut decoder = Decoder::new(framing);
        let (mut body, mut trailers) = (Vec::new(), None);
        loop {
            match decoder.step(&mut read) {
                Step::Frame(frame) => match frame.into_data() {
                    Ok(data) => body.extend_from_slice(&data),
                    Err(frame) => trailers = frame.into_trailers().ok(),
                },
                Step::NeedMore | Step::Done => break,
                Step::Failed(e) => panic!("{e}"),
            }
        }
        (body, trailers, decoder, read.len())
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let framing = |raw: &str, method: Method| head(raw, method).unwrap().unwrap().framing;
        let ok = "HTTP/1.1 200 OK\r\n";
        assert_eq!(
            framing(&format!("{ok}content-length: 5\r\n\r\n"), Method::POST),
            Framing::Length(5)
        );
        assert_eq!(
            framing(&format!("{ok}content-length: 5\r\n\r\n"), Method::HEAD),
            Framing::Empty
        );
        assert_eq!(
            framing(
                &format!("{ok}transfer-encoding: chunked\r\n\r\n"),
                Method::GET
            ),
            Framing::Chunked
        );
        assert_eq!(framing(&format!("{ok}\r\n"), Method::GET), Framing::Close);
        assert_eq!(
            framing("HTTP/1.1 204 No Content\r\n\r\n", Method::GET),
            Framing::Empty
        );
        assert_eq!(
            framing("HTTP/1.1 101 Switching Protocols\r\n\r\n", Method::GET),
            Framing::Upgrade
        );
    }

    #[test]
    fn only_well_delimited_answers_keep_the_connection() {
        let keep = |raw: &str| head(raw, Method::POST).unwrap().unwrap().keep_alive;
        assert!(keep("HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n"));
        assert!(!keep(
            "HTTP/1.1 201 Created\r\nconnection: close\r\ncontent-length: 2\r\n\r\n"
        ));
        assert!(!keep("HTTP/1.0 201 Created\r\ncontent-length: 2\r\n\r\n"));
        assert!(keep(
            "HTTP/1.0 201 Created\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\n"
        ));
        assert!(!keep("HTTP/1.1 200 OK\r\n\r\n"));
        // Bodiless answers end at their head whatever their framing fields say (RFC 9112
        // §6.3 rule 1), so they are not refused; oddly framed ones do not keep the
        // connection.
        let bodiless = |raw: &str, method: Method| {
            let head = head(raw, method).unwrap().unwrap();
            assert_eq!(head.framing, Framing::Empty, "{raw}");
            head.keep_alive
        };
        let both = "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n";
        assert!(!bodiless(both, Method::HEAD));
        assert!(!bodiless(
            "HTTP/1.1 304 Not Modified\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            Method::GET
        ));
        assert!(bodiless(
            "HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n",
            Method::GET
        ));
    }

    #[test]
    fn ambiguous_or_malformed_heads_are_refused() {
        let refused = |raw: &str| head(raw, Method::GET).is_err();
        assert!(refused(
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n"
        ));
        assert!(refused("HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n"));
        assert!(refused("HTTP/1.1 200 OK\r\ncontent-length: 3x\r\n\r\n"));
        assert!(refused("HTTP/1.1 2000 OK\r\n\r\n"));
        assert!(refused("NOTHTTP\r\n\r\n"));
        // Both framings (RFC 9112 §6.3: "ought to be handled as an error"); forwarding it
        // with the length kept truncated or lost the answer.
        assert!(refused(
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n"
        ));
        assert!(refused(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n"
        ));
        // Codings this proxy does not decode would reach the client unmarked.
        for coding in ["gzip, chunked", "gzip", "chunked, chunked", "identity"] {
            assert!(
                refused(&format!(
                    "HTTP/1.1 200 OK\r\ntransfer-encoding: {coding}\r\n\r\n"
                )),
                "{coding}"
            );
        }
        assert!(refused(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n"
        ));
        assert!(refused(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n"
        ));
        // Repeated equal lengths are one length.
        let same = "HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\ncontent-length: 3\r\n\r\n";
        assert_eq!(
            head(same, Method::GET).unwrap().unwrap().framing,
            Framing::Length(3)
        );
        // Incomplete: wait for more.
        assert!(head("HTTP/1.1 200 OK\r\ncontent-le", Method::GET)
            .unwrap()
            .is_none());
    }

    #[test]
    fn hop_by_hop_fields_are_dropped_unless_they_name_others_or_switch_protocols() {
        let raw = "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\
                   Transfer-Encoding: chunked\r\nX-App: 1\r\n\r\n";
        let parsed = head(raw, Method::GET).unwrap().unwrap();
        assert_eq!(parsed.framing, Framing::Chunked);
        assert_eq!(parsed.parts.headers.len(), 1);
        assert_eq!(parsed.parts.headers["x-app"], "1");
        let naming = "HTTP/1.1 200 OK\r\nConnection: close, X-Secret\r\nX-Secret: s\r\ncontent-length: 0\r\n\r\n";
        let parsed = head(naming, Method::GET).unwrap().unwrap();
        assert!(parsed.parts.headers.contains_key("connection"));
        assert!(!parsed.keep_alive);
        let switch =
            "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n";
        let parsed = head(switch, Method::GET).unwrap().unwrap();
        assert_eq!(parsed.parts.headers["upgrade"], "echo");
    }

    #[test]
    fn a_head_leaves_the_body_bytes_behind() {
        let mut read =
            BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\nhiHTTP"[..]);
        let parsed = parse_head(&mut read, &Method::GET).unwrap().unwrap();
        assert_eq!(parsed.parts.headers["x-a"], "b");
        assert_eq!(&read[..], b"hiHTTP");
        let (body, _, decoder, left) = decode(Framing::Length(2), &read);
        assert_eq!(body, b"hi");
        assert!(decoder.is_done());
        assert_eq!(
            left, 4,
            "bytes past the body stay unread (and the connection unused)"
        );
    }

    #[test]
    fn answer_trailers_lose_the_fields_only_a_header_section_may_carry() {
        let wire = b"2\r\nhi\r\n0\r\nx-sum: 42\r\ncontent-length: 0\r\nhost: evil\r\n\
                     connection: close\r\nset-cookie: a=1\r\ngrpc-status: 0\r\n\r\n";
        let (body, trailers, decoder, _) = decode(Framing::Chunked, wire);
        assert_eq!(body, b"hi");
        assert!(decoder.is_done());
        let trailers = trailers.unwrap();
        let mut names: Vec<_> = trailers.keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["grpc-status", "x-sum"]);
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers() {
        let wire = b"5;name=x\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 42\r\n\r\n";
        let (body, trailers, decoder, left) = decode(Framing::Chunked, wire);
        assert_eq!(body, b"hello world");
        assert_eq!(trailers.unwrap()["x-sum"], "42");
        assert!(decoder.is_done());
        assert_eq!(left, 0);
        // Byte by byte gives the same.
        let mut read = BytesMut::new();
        let mut decoder = Decoder::new(Framing::Chunked);
        let mut body = Vec::new();
        for &b in wire.iter() {
            read.extend_from_slice(&[b]);
            while let Step::Frame(frame) = decoder.step(&mut read) {
                if let Ok(data) = frame.into_data() {
                    body.extend_from_slice(&data);
                }
            }
        }
        assert_eq!(body, b"hello world");
        assert!(decoder.is_done());
    }

    #[test]
    fn malformed_chunks_fail() {
        for wire in [
            &b"zz\r\n"[..],
            b"5\r\nhelloXX",
            b"5 x\r\nhello\r\n",
            b"1234567890abcdef0\r\n",
        ] {
            let mut read = BytesMut::from(wire);
            let mut decoder = Decoder::new(Framing::Chunked);
            let failed = loop {
                match decoder.step(&mut read) {
                    Step::Frame(_) => continue,
                    Step::Failed(_) => break true,
                    Step::NeedMore | Step::Done => break false,
                }
            };
            assert!(failed, "{:?} was accepted", String::from_utf8_lossy(wire));
        }
    }

    #[test]
    fn request_heads_carry_the_framing_of_the_body_sent() {
        let ip = HeaderValue::from_static("10.0.0.1");
        let forwarding = Forwarding {
            client_ip: &ip,
            proto: "http",
            upgrade: false,
        };
        let (mut parts, _) = http::Request::post("/orders?x=1")
            .header("host", "shop.example")
            .header("content-length", "999")
            .header("transfer-encoding", "chunked")
            .body(())
            .unwrap()
            .into_parts();
        let body = ProxyBody::full(Bytes::from_static(b"{}"));
        let framing = RequestFraming::of(&parts, &body);
        let head = encode_head(&parts, &forwarding, || None, framing);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /orders?x=1 HTTP/1.1\r\nhost: shop.example\r\nx-forwarded-for: 10.0.0.1\r\n\
             x-forwarded-proto: http\r\nx-forwarded-host: shop.example\r\ncontent-length: 2\r\n\r\n"
        );
        parts.method = Method::GET;
        parts.headers.remove("content-length");
        let framing = RequestFraming::of(&parts, &ProxyBody::empty());
        let head = encode_head(&parts, &forwarding, || None, framing);
        assert!(String::from_utf8(head)
            .unwrap()
            .ends_with("x-forwarded-host: shop.example\r\n\r\n"));
    }
}
