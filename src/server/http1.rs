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
//! - the head is complete in one read, HTTP/1.1, at most [`MAX_FIELDS`] fields and
//!   [`MAX_HEAD`] bytes, an origin-form target, not `CONNECT`;
//! - no `Transfer-Encoding`, `Expect` or `Upgrade`, at most one valid `Content-Length`
//!   of at most [`MAX_BODY`], and that body complete within [`BODY_GRACE`] of the head.
//!
//! So the HTTP/2 cleartext preface (not an HTTP/1.1 head), chunked and streamed uploads,
//! `100-continue`, tunnels and protocol switches, HTTP/1.0, slow or malformed heads (with
//! their 400, 408 and 431 answers) are all hyper's, as before. The fast path itself keeps
//! the connection alive (or closes it on `Connection: close`, after the proxy's idle
//! timeout without a request, or once the server stops), cancels a request whose client goes away (as hyper
//! does), frames the answer as hyper does (the known length, chunked otherwise, none for
//! `HEAD`, 1xx, 204 and 304, trailers dropped) and adds `Date` when the answer has none.

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
use crate::proxy::headers::{connection_has, parse_length, write_field};
use crate::proxy::{Connection, Proxy};
use crate::read_buf::poll_read_more;

/// Most header fields of a request the fast path takes.
pub const MAX_FIELDS: usize = 64;
/// Largest request head the fast path takes.
pub const MAX_HEAD: usize = 16 * 1024;
/// Largest request body the fast path takes (already read, with its head).
pub const MAX_BODY: usize = 64 * 1024;
/// How long a complete head waits for the rest of its body before the connection goes to
/// hyper (whose body timeout then applies).
pub const BODY_GRACE: Duration = Duration::from_secs(1);
/// Bytes asked of the socket per read (and the least spare room, a quarter, before one).
const READ_CHUNK: usize = 8 * 1024;
/// An answer body up to this size goes out in the same write as its head.
const COALESCE: usize = 16 * 1024;

/// A connection the fast path gives up: the bytes it read and did not use come first.
pub struct Handoff {
    /// Read from the client and not yet used: the start of the next request.
    pub read: BytesMut,
    /// The client connection.
    pub stream: TcpStream,
    /// What the proxy knows about it (formatted once, kept for hyper's requests).
    pub conn: Connection,
    /// Whether the fast path answered a request on it: the connection is HTTP/1.1 then, and
    /// an HTTP/2 preface only opens a connection (RFC 9113 §3.3), never follows a request.
    pub served: bool,
}

/// Serves `stream` until it closes (`None`) or needs hyper (the [`Handoff`]).
pub async fn serve(
    mut stream: TcpStream,
    peer: SocketAddr,
    proxy: &Proxy,
    stop: &StopSignal,
) -> Option<Handoff> {
    let conn = Connection::plain(peer);
    let mut read = BytesMut::with_capacity(READ_CHUNK);
    let mut stopped = pin!(stop.stopped());
    let idle_timeout = proxy.idle_timeout();
    let mut idle = pin!(tokio::time::sleep(idle_timeout));
    let mut served = false;
    loop {
        let mut awaiting_body = false;
        let request = loop {
            match parse(&mut read) {
                Parsed::Request(request) => break request,
                // Nothing read: wait for the next request, at most the idle timeout.
                Parsed::Partial if read.is_empty() => {
                    // A later deadline on the armed sleep only records it (no timer-wheel
                    // work).
                    idle.as_mut()
                        .reset(tokio::time::Instant::now() + idle_timeout);
                }
                // A complete head whose body is still coming (clients that write them
                // separately): wait a little for it here rather than give the connection up.
                Parsed::NeedBody if !awaiting_body => {
                    awaiting_body = true;
                    idle.as_mut()
                        .reset(tokio::time::Instant::now() + BODY_GRACE);
                }
                Parsed::NeedBody => {}
                // A head split over reads (large, slow or malicious) is hyper's, with its
                // header timeout and limits; so is the HTTP/2 preface.
                Parsed::Partial | Parsed::Hyper => {
                    return Some(Handoff {
                        read,
                        stream,
                        conn,
                        served,
                    })
                }
            }
            match fill(&mut stream, &mut read, idle.as_mut(), stopped.as_mut()).await {
                Filled::Read => {}
                // A body slower than the grace goes to hyper, whose body timeout (408 on a
                // protected route) then applies.
                Filled::Elapsed if awaiting_body => {
                    return Some(Handoff {
                        read,
                        stream,
                        conn,
                        served,
                    })
                }
                Filled::Elapsed | Filled::Closed => return None,
            }
        };
        let head_only = request.method == Method::HEAD;
        let asked_close = request.close;
        let handling = pin!(proxy.handle(request.into_http(), &conn));
        let mut response = until_client_leaves(handling, &mut stream, &mut read).await?;
        if response.status().is_informational() {
            // A 1xx cannot be the final answer (only an upgrade, which is hyper's, has one):
            // hyper answers 500 here too.
            response = Response::new(ProxyBody::empty());
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        }
        let announced = connection_has(response.headers(), "close");
        let close = asked_close || announced || stop.is_stopped();
        let written = write_response(&mut stream, response, head_only, close, announced).await;
        if written.is_err() || close {
            // FIN after the answer, rather than a bare drop, so the client reads it whole.
            let _ = stream.shutdown().await;
            return None;
        }
        served = true;
    }
}

/// Runs the handler while watching the client, as hyper does: a client that closes its
/// side or fails cancels its request (an owner's upstream call still finishes in a task of
/// its own, see `proxy::detach`; a waiting duplicate or a pass-through call stops). Bytes
/// a client pipelines meanwhile are kept for after the answer, up to a bound.
async fn until_client_leaves<F: Future>(
    mut handling: Pin<&mut F>,
    stream: &mut TcpStream,
    read: &mut BytesMut,
) -> Option<F::Output> {
    let mut watching = true;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = handling.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        while watching {
            if read.len() >= MAX_HEAD + MAX_BODY {
                watching = false;
                break;
            }
            match poll_read_more(Pin::new(&mut *stream), cx, read, READ_CHUNK) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(None),
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => break,
            }
        }
        Poll::Pending
    })
    .await
}

enum Filled {
    Read,
    /// End of stream, an error, or the server stopped.
    Closed,
    /// The deadline armed in `idle` passed.
    Elapsed,
}

/// Reads more into `read`.
async fn fill(
    stream: &mut TcpStream,
    read: &mut BytesMut,
    mut idle: Pin<&mut tokio::time::Sleep>,
    mut stopped: Pin<&mut impl Future<Output = ()>>,
) -> Filled {
    std::future::poll_fn(|cx| {
        match poll_read_more(Pin::new(&mut *stream), cx, read, READ_CHUNK) {
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(Filled::Closed),
            Poll::Ready(Ok(_)) => return Poll::Ready(Filled::Read),
            Poll::Pending => {}
        }
        if stopped.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Filled::Closed);
        }
        if idle.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Filled::Elapsed);
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
    /// A head the fast path takes, whose body has not all arrived.
    NeedBody,
    /// Not one for the fast path.
    Hyper,
}

/// Byte offsets of one field in the read buffer (a head is at most [`MAX_HEAD`] bytes, so
/// they fit 16 bits: the array zeroed per request stays at 512 bytes).
#[derive(Clone, Copy, Default)]
struct Field {
    name: (u16, u16),
    value: (u16, u16),
}

const _: () = assert!(MAX_HEAD <= u16::MAX as usize);

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
    // CONNECT turns the connection into a tunnel (hyper treats it as an upgrade): the bytes
    // after it must never be read as requests here.
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::Hyper;
    };
    if method == Method::CONNECT {
        return Parsed::Hyper;
    }
    let base = read.as_ptr() as usize;
    // Within the head, so below MAX_HEAD.
    let at = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        (start as u16, (start + s.len()) as u16)
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
        return Parsed::NeedBody;
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
    target: (u16, u16),
    fields: &[Field],
    head_len: usize,
    close: bool,
) -> Option<FastRequest> {
    let range = |(start, end): (u16, u16)| usize::from(start)..usize::from(end);
    let uri = Uri::from_maybe_shared(message.slice(range(target))).ok()?;
    let mut headers = HeaderMap::with_capacity(fields.len());
    for field in fields {
        let name = HeaderName::from_bytes(&message[range(field.name)]).ok()?;
        let value = HeaderValue::from_maybe_shared(message.slice(range(field.value))).ok()?;
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
/// `close`: say `connection: close` (unless the answer already does, `announced`).
async fn write_response(
    stream: &mut TcpStream,
    response: Response<ProxyBody>,
    head_only: bool,
    close: bool,
    announced: bool,
) -> io::Result<()> {
    let (parts, mut body) = response.into_parts();
    let status = parts.status;
    let no_content = status.is_informational() || status == StatusCode::NO_CONTENT;
    let bodiless = head_only || no_content || status == StatusCode::NOT_MODIFIED;
    let hint = http_body::Body::size_hint(&body).exact();
    // A length the body knows is the one that goes out (as with hyper); a field that does
    // not parse counts only when the body knows none.
    let declared = match parts.headers.get(CONTENT_LENGTH) {
        Some(value) => match (content_length(value.as_bytes()), hint) {
            (Some(n), _) => Some(n),
            (None, Some(n)) => Some(n),
            (None, None) => return Err(invalid("the answer has an invalid Content-Length")),
        },
        None => None,
    };
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
        write_field(&mut out, name.as_str(), value.as_bytes());
    }
    // hyper's rules: a length where one can be known, chunked otherwise; HEAD and 304
    // keep a declared length (it describes the representation), 1xx and 204 have none.
    let length = if bodiless { None } else { declared.or(hint) };
    let chunked = !bodiless && length.is_none();
    // HEAD and 304 announce the representation's length: the declared one, else a known
    // non-zero one (a problem answer's, for a HEAD).
    let announce = declared.or(hint.filter(|&n| n > 0 && head_only));
    if let Some(n) = length.or(announce.filter(|_| !no_content)) {
        write_field(
            &mut out,
            "content-length",
            itoa::Buffer::new().format(n).as_bytes(),
        );
    } else if chunked {
        write_field(&mut out, "transfer-encoding", b"chunked");
    }
    if !has_date {
        DATE_CACHE.with(|cache| write_field(&mut out, "date", cache.borrow_mut().now()));
    }
    if close && !announced {
        write_field(&mut out, "connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
    if bodiless {
        return stream.write_all(&out).await;
    }
    let mut sent: u64 = 0;
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
                // Trailers are dropped, as hyper drops them here: it sends only fields the
                // answer's `Trailer` names, and that field is hop-by-hop, so never present.
                Err(_trailers) => continue,
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
        out.extend_from_slice(b"0\r\n\r\n");
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

/// A `Content-Length` value: a length, or a list of equal ones (`3, 3`), read as the
/// upstream parser reads them.
fn content_length(value: &[u8]) -> Option<u64> {
    let mut length = None;
    for item in value.split(|&b| b == b',') {
        let n = parse_length(item)?;
        if length.is_some_and(|l| l != n) {
            return None;
        }
        length = Some(n);
    }
    length
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

impl Prefixed {
    /// `stream` as hyper reads it, `read` first.
    pub fn new(read: BytesMut, stream: TcpStream) -> Self {
        Self {
            read,
            io: hyper_util::rt::TokioIo::new(stream),
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
            if self.read.is_empty() {
                // Not held for the connection's life (a WebSocket can last hours).
                self.read = BytesMut::new();
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(raw: &[u8]) -> (Parsed, BytesMut) {
        let mut read = BytesMut::from(raw);
        (parse(&mut read), read)
    }

    #[test]
    fn a_plain_request_is_taken_with_its_body_and_the_rest_is_left() {
        let (request, rest) = parsed(
            b"POST /a?b=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabcGET /next",
        );
        let Parsed::Request(request) = request else {
            panic!("not taken");
        };
        assert_eq!(request.method, Method::POST);
        assert_eq!(request.uri, "/a?b=1");
        assert_eq!(request.headers["host"], "x");
        assert_eq!(&request.body[..], b"abc");
        assert!(request.close);
        assert_eq!(&rest[..], b"GET /next");
    }

    /// Each of these is hyper's, and the bytes stay where they were.
    #[test]
    fn what_the_fast_path_does_not_take_is_left_untouched() {
        for raw in [
            &b"CONNECT /x HTTP/1.1\r\nhost: x\r\n\r\nPOST /orders HTTP/1.1\r\n\r\n"[..],
            b"CONNECT example.com:443 HTTP/1.1\r\nhost: x\r\n\r\n",
            b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 1\r\n\r\nab",
            b"POST / HTTP/1.1\r\ncontent-length: +1\r\n\r\na",
            b"POST / HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 1\r\n\r\n",
            b"GET / HTTP/1.1\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\r\n",
            b"GET / HTTP/1.0\r\n\r\n",
            b"GET http://x/ HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nx: a\r\n b\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            b"GET /\x7f HTTP/1.1\r\n\r\n",
        ] {
            let (result, rest) = parsed(raw);
            assert!(
                matches!(result, Parsed::Hyper),
                "{}",
                String::from_utf8_lossy(raw)
            );
            assert_eq!(&rest[..], raw, "{}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn a_head_waits_for_its_body_and_a_partial_head_is_partial() {
        let raw = b"POST / HTTP/1.1\r\ncontent-length: 5\r\n\r\nab";
        let (result, rest) = parsed(raw);
        assert!(matches!(result, Parsed::NeedBody));
        assert_eq!(&rest[..], raw);
        assert!(matches!(
            parsed(b"POST / HTTP/1.1\r\nhos").0,
            Parsed::Partial
        ));
        assert!(matches!(parsed(b"").0, Parsed::Partial));
    }

    #[test]
    fn answer_lengths_parse_as_the_upstream_parser_accepts_them() {
        assert_eq!(content_length(b"3"), Some(3));
        assert_eq!(content_length(b"3, 3"), Some(3));
        assert_eq!(content_length(b"3, 4"), None);
        assert_eq!(content_length(b"+3"), None);
        assert_eq!(content_length(b""), None);
    }
}
