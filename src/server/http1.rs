//! The HTTP/1.1 fast path for cleartext client connections: plain requests whose whole
//! body came with the head are parsed, handled and answered here; anything else goes to
//! hyper for the rest of the connection.
//!
//! hyper's server dispatcher (its message state machine, the body channel between the
//! connection and the handler, per-request timers) cost a proxied request about 13,000
//! instructions, more than the upstream side or the idempotency work; nginx proxies a
//! whole request in 26,000. Most requests a proxy in front of an API sees are a head and a
//! small body in one segment, on a kept-alive connection, and need none of that machinery.
//!
//! The fast path takes a request only when all of this holds; otherwise it hands the
//! connection over, with the bytes it has read, to hyper ([`Handoff`]), which serves that
//! request and every later one on the connection:
//! - the head is complete in what has been read, HTTP/1.1, at most [`MAX_FIELDS`] fields
//!   and [`MAX_HEAD`] bytes, an origin-form target;
//! - no `Transfer-Encoding`, `Expect` or `Upgrade`, at most one valid `Content-Length`,
//!   and that many body bytes already read (at most [`MAX_BODY`]).
//!
//! So the HTTP/2 cleartext preface (not an HTTP/1.1 head), chunked and streamed uploads, `100-continue`, protocol switches, HTTP/1.0, slow or
//! malformed heads (with their 400, 408 and 431 answers) are all hyper's, as before. The
//! fast path itself keeps the connection alive (or closes it on `Connection: close`,
//! after [`IDLE`] without a request, or once the server stops), frames the answer as hyper
//! does (`Content-Length` when known, chunked otherwise, none for `HEAD`, 1xx, 204 and
//! 304) and adds `Date` when the answer has none.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::stop::StopSignal;
use crate::proxy::body::{ProxyBody, RequestBody};
use crate::proxy::{Connection, Proxy};

/// Most header fields of a request the fast path takes.
pub const MAX_FIELDS: usize = 64;
/// Largest request head the fast path takes.
pub const MAX_HEAD: usize = 16 * 1024;
/// Largest request body the fast path takes (already read, with its head).
pub const MAX_BODY: usize = 64 * 1024;
/// A kept-alive connection with no new request for this long is closed (as hyper's header
/// read timeout did for the fast path's connections).
pub const IDLE: Duration = Duration::from_secs(30);
/// An answer body up to this size goes out in the same write as its head.
const COALESCE: usize = 16 * 1024;

/// A connection the fast path gives up: the bytes it read and did not use come first.
pub struct Handoff {
    /// Read from the client and not yet used: the start of the next request.
    pub read: BytesMut,
    /// The client connection.
    pub stream: TcpStream,
}

/// Serves `stream` until it closes (`None`) or needs hyper (the [`Handoff`]).
pub async fn serve(
    mut stream: TcpStream,
    peer: SocketAddr,
    proxy: &Proxy,
    stop: &StopSignal,
) -> Option<Handoff> {
    let conn = Connection::plain(peer);
    let mut read = BytesMut::with_capacity(8 * 1024);
    let mut stopped = pin!(stop.stopped());
    let mut idle = pin!(tokio::time::sleep(IDLE));
    loop {
        let request = loop {
            match parse(&mut read) {
                Parsed::Request(request) => break request,
                // Empty: wait for the next request.
                Parsed::Partial if read.is_empty() => {}
                // A head split over reads (large, slow or malicious) is hyper's, with its
                // header timeout and limits; so is the HTTP/2 preface.
                Parsed::Partial | Parsed::Hyper => return Some(Handoff { read, stream }),
            }
            // A later deadline on the armed sleep only records it (no timer-wheel work).
            idle.as_mut().reset(tokio::time::Instant::now() + IDLE);
            if !fill(&mut stream, &mut read, idle.as_mut(), stopped.as_mut()).await {
                return None;
            }
        };
        let head_only = request.method == Method::HEAD;
        let close = request.close;
        let mut response = proxy.handle(request.into_http(), &conn).await;
        if response.status().is_informational() {
            // A 1xx cannot be the final answer (only an upgrade, which is hyper's, has one):
            // hyper answers 500 here too.
            response = Response::new(ProxyBody::empty());
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        }
        let close = close || stop.is_stopped() || asks_to_close(response.headers());
        let written = write_response(&mut stream, response, head_only, close).await;
        if written.is_err() || close {
            return None;
        }
    }
}

/// Whether `Connection` names `close`.
fn asks_to_close(headers: &HeaderMap) -> bool {
    headers
        .get_all(http::header::CONNECTION)
        .iter()
        .any(|value| {
            value
                .as_bytes()
                .split(|&b| b == b',')
                .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"))
        })
}

/// Reads more into `read`; `false` at end of stream, on an error, when `idle` fires or once
/// the server stops.
async fn fill(
    stream: &mut TcpStream,
    read: &mut BytesMut,
    mut idle: Pin<&mut tokio::time::Sleep>,
    mut stopped: Pin<&mut impl Future<Output = ()>>,
) -> bool {
    if read.capacity() - read.len() < 1024 {
        read.reserve(8 * 1024);
    }
    std::future::poll_fn(|cx| {
        // poll_read underneath: tokio clears the socket's readiness after a short read, so
        // the next request's read waits for the poller instead of failing once first.
        match tokio_util::io::poll_read_buf(Pin::new(&mut *stream), cx, read) {
            Poll::Ready(Ok(n)) => return Poll::Ready(n > 0),
            Poll::Ready(Err(_)) => return Poll::Ready(false),
            Poll::Pending => {}
        }
        if stopped.as_mut().poll(cx).is_ready() || idle.as_mut().poll(cx).is_ready() {
            return Poll::Ready(false);
        }
        Poll::Pending
    })
    .await
}

/// A request the fast path takes.
struct FastRequest {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
    /// `Connection: close`: answer, then close.
    close: bool,
}

impl FastRequest {
    fn into_http(self) -> Request<RequestBody> {
        let mut request = Request::new(RequestBody::Buffered(self.body));
        *request.method_mut() = self.method;
        *request.uri_mut() = self.uri;
        *request.headers_mut() = self.headers;
        request
    }
}

// Returned once per request and matched at once: boxing the request would only add an
// allocation per request.
#[allow(clippy::large_enum_variant)]
enum Parsed {
    Request(FastRequest),
    /// Not complete yet (or nothing read).
    Partial,
    /// Not one for the fast path.
    Hyper,
}

/// Byte offsets of one field in the read buffer.
#[derive(Clone, Copy, Default)]
struct Field {
    name: (usize, usize),
    value: (usize, usize),
}

/// Takes one request off the front of `read` if the fast path can serve it.
fn parse(read: &mut BytesMut) -> Parsed {
    // Uninitialised slots: zeroing them would cost more than parsing a typical head.
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut parsed = httparse::Request::new(&mut []);
    let head_len = match parsed.parse_with_uninit_headers(read, &mut slots) {
        Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => len,
        Ok(httparse::Status::Partial) if read.len() <= MAX_HEAD => return Parsed::Partial,
        _ => return Parsed::Hyper,
    };
    let (Some(1), Some(method), Some(target)) = (parsed.version, parsed.method, parsed.path) else {
        return Parsed::Hyper;
    };
    if !target.starts_with('/') {
        return Parsed::Hyper;
    }
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::Hyper;
    };
    let base = read.as_ptr() as usize;
    let at = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        (start, start + s.len())
    };
    let target = at(target.as_bytes());
    let mut fields = [Field::default(); MAX_FIELDS];
    let mut length: Option<usize> = None;
    let mut close = false;
    for (slot, field) in fields.iter_mut().zip(parsed.headers.iter()) {
        let (name, value) = (field.name.as_bytes(), field.value);
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = std::str::from_utf8(value)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<usize>().ok());
            match (n, length) {
                (Some(n), None) if n <= MAX_BODY => length = Some(n),
                _ => return Parsed::Hyper,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding")
            || name.eq_ignore_ascii_case(b"expect")
            || name.eq_ignore_ascii_case(b"upgrade")
        {
            return Parsed::Hyper;
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"upgrade") {
                    return Parsed::Hyper;
                }
            }
        }
        *slot = Field {
            name: at(name),
            value: at(value),
        };
    }
    let count = parsed.headers.len();
    let total = head_len + length.unwrap_or(0);
    if read.len() < total {
        return Parsed::Hyper;
    }
    // One buffer shared by the target, the values and the body: no copy of any.
    let message = read.split_to(total).freeze();
    match build(&message, method, target, &fields[..count], head_len, close) {
        Some(request) => Parsed::Request(request),
        None => {
            // Something http's types refuse though httparse took it: hyper answers it, so
            // it gets the bytes back in order.
            let mut all = BytesMut::with_capacity(message.len() + read.len());
            all.extend_from_slice(&message);
            all.extend_from_slice(read);
            *read = all;
            Parsed::Hyper
        }
    }
}

fn build(
    message: &Bytes,
    method: Method,
    target: (usize, usize),
    fields: &[Field],
    head_len: usize,
    close: bool,
) -> Option<FastRequest> {
    let uri = Uri::from_maybe_shared(message.slice(target.0..target.1)).ok()?;
    let mut headers = HeaderMap::with_capacity(fields.len());
    for field in fields {
        let name = HeaderName::from_bytes(&message[field.name.0..field.name.1]).ok()?;
        let value =
            HeaderValue::from_maybe_shared(message.slice(field.value.0..field.value.1)).ok()?;
        headers.append(name, value);
    }
    Some(FastRequest {
        method,
        uri,
        headers,
        body: message.slice(head_len..),
        close,
    })
}

/// Writes `response` in HTTP/1.1 framing, then its body. An error (the client went away,
/// or the body failed or did not match its length) means the connection must close.
async fn write_response(
    stream: &mut TcpStream,
    response: Response<ProxyBody>,
    head_only: bool,
    close: bool,
) -> io::Result<()> {
    let (parts, mut body) = response.into_parts();
    let status = parts.status;
    let no_content = status.is_informational() || status == StatusCode::NO_CONTENT;
    let bodiless = head_only || no_content || status == StatusCode::NOT_MODIFIED;
    let declared = match parts.headers.get(CONTENT_LENGTH) {
        Some(value) => Some(
            std::str::from_utf8(value.as_bytes())
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| invalid("the answer has an invalid Content-Length"))?,
        ),
        None => None,
    };
    let hint = http_body::Body::size_hint(&body).exact();
    let small = hint.filter(|&n| n <= COALESCE as u64).unwrap_or(0) as usize;
    let mut out = Vec::with_capacity(128 + parts.headers.len() * 48 + small);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut has_date = false;
    for (name, value) in &parts.headers {
        // Framing is this writer's: the length is written below, and a transfer coding of
        // an answer read whole does not describe what goes out.
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING {
            continue;
        }
        has_date |= name == DATE;
        field(&mut out, name.as_str().as_bytes(), value.as_bytes());
    }
    // hyper's rules: a length where one can be known, chunked otherwise; HEAD and 304
    // keep a declared length (it describes the representation), 1xx and 204 have none.
    let length = if bodiless { None } else { declared.or(hint) };
    let chunked = !bodiless && length.is_none();
    if let Some(n) = length.or(declared.filter(|_| !no_content)) {
        field(
            &mut out,
            b"content-length",
            itoa::Buffer::new().format(n).as_bytes(),
        );
    } else if chunked {
        field(&mut out, b"transfer-encoding", b"chunked");
    }
    if !has_date {
        DATE_CACHE.with(|cache| field(&mut out, b"date", cache.borrow_mut().now()));
    }
    if close && !asks_to_close(&parts.headers) {
        field(&mut out, b"connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
    if bodiless {
        return stream.write_all(&out).await;
    }
    let mut sent: u64 = 0;
    let mut trailers = None;
    loop {
        // With the head (or earlier chunks) still unwritten, take only what is ready; the
        // rest waits until they are out.
        let frame = if out.is_empty() {
            body.frame().await
        } else {
            let mut next = body.frame();
            match std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut next).poll(cx))).await {
                Poll::Ready(frame) => frame,
                Poll::Pending => {
                    stream.write_all(&out).await?;
                    out.clear();
                    continue;
                }
            }
        };
        let data = match frame {
            None => break,
            Some(Err(e)) => return Err(io::Error::other(e)),
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
        sent += data.len() as u64;
        if length.is_some_and(|n| sent > n) {
            return Err(invalid("the answer body is longer than its Content-Length"));
        }
        if chunked {
            out.extend_from_slice(format!("{:X}\r\n", data.len()).as_bytes());
        }
        if out.len() + data.len() <= COALESCE {
            out.extend_from_slice(&data);
        } else {
            stream.write_all(&out).await?;
            out.clear();
            stream.write_all(&data).await?;
        }
        if chunked {
            out.extend_from_slice(b"\r\n");
        }
    }
    if chunked {
        out.extend_from_slice(b"0\r\n");
        for (name, value) in trailers.iter().flatten() {
            field(&mut out, name.as_str().as_bytes(), value.as_bytes());
        }
        out.extend_from_slice(b"\r\n");
    } else if length.is_some_and(|n| sent != n) {
        return Err(invalid(
            "the answer body is shorter than its Content-Length",
        ));
    }
    if !out.is_empty() {
        stream.write_all(&out).await?;
    }
    Ok(())
}

fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

thread_local! {
    static DATE_CACHE: RefCell<DateCache> = const { RefCell::new(DateCache { second: u64::MAX, text: [0; 29] }) };
}

/// `Date` for answers that have none, formatted once per second per thread.
struct DateCache {
    second: u64,
    text: [u8; 29],
}

impl DateCache {
    fn now(&mut self) -> &[u8] {
        let now = SystemTime::now();
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if second != self.second {
            let text = httpdate::fmt_http_date(now);
            if text.len() == self.text.len() {
                self.text.copy_from_slice(text.as_bytes());
                self.second = second;
            }
        }
        &self.text
    }
}

/// The client connection after a [`Handoff`], as hyper reads it: the bytes the fast path
/// read and did not use, then the socket.
pub struct Prefixed {
    read: BytesMut,
    io: hyper_util::rt::TokioIo<TcpStream>,
}

impl From<Handoff> for Prefixed {
    fn from(handoff: Handoff) -> Self {
        Self {
            read: handoff.read,
            io: hyper_util::rt::TokioIo::new(handoff.stream),
        }
    }
}

impl hyper::rt::Read for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.read.is_empty() {
            let n = self.read.len().min(buf.remaining());
            buf.put_slice(&self.read[..n]);
            bytes::Buf::advance(&mut self.read, n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
