//! One upstream answer through hyper's client and through the hand-written parser and
//! decoder, and what each made of it ([`Outcome`]), for the differential test.
//!
//! Both sides are what the proxy does with an answer on its path: hyper's side is the
//! default path (`hyper::client::conn::http1` as `pool.rs` builds it, then
//! `request::check_answer`, then `keeps_alive` to pool the connection); the hand-written
//! side is `head::parse_head` looped over interim answers as `Connection::poll_final_head`
//! does, `check_answer`, the `Decoder` as `Connection::poll_body` drives it, and reuse only
//! of a connection with nothing unread.
//!
//! The upstream is a test server on the other end of a `tokio::io::duplex`: it reads the
//! request, writes the answer's bytes in one write, and then waits for a second request,
//! which it answers with [`SECOND`]. Time is paused: the runtime advances the clock only
//! when every task waits, so the server's [`STUCK`] timeout fires exactly when the client
//! waits for bytes that are not coming (a body longer than what was sent, a body read to
//! the close); the server then closes, as an upstream eventually would. No wall-clock
//! time decides anything.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::super::decoder::{Decoder, Step};
use super::super::head::parse_head;
use crate::proxy::headers::is_forwardable_trailer;
use crate::proxy::upstream::request::{check_answer, keeps_alive};

/// The answer to a second request on the same connection.
pub(super) const SECOND: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nsecond";

/// Longer than anything takes on a paused clock that only advances when all tasks wait.
const STUCK: Duration = Duration::from_secs(3600);

/// Bytes, shown escaped and cut short.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Text(pub Vec<u8>);

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", show(&self.0))
    }
}

/// `bytes` escaped, at most 160 of them.
pub(crate) fn show(bytes: &[u8]) -> String {
    const SHOWN: usize = 160;
    let shown = bytes[..bytes.len().min(SHOWN)].escape_ascii();
    if bytes.len() > SHOWN {
        format!("\"{shown}\"... ({} bytes)", bytes.len())
    } else {
        format!("\"{shown}\"")
    }
}

/// What became of an upstream answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// No answer: the head was malformed, refused (by the parser or `check_answer`), or
    /// never came whole.
    Refused,
    /// A final answer head was taken.
    Answer(Answer),
}

/// An answer whose head was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub status: StatusCode,
    pub version: Version,
    /// Every field as received, sorted: a multiset.
    pub fields: Vec<(String, Text)>,
    /// The body and its forwardable trailers; `None` if the body failed.
    pub body: Option<Body>,
    /// What a second request on the same connection got.
    pub next: Next,
}

/// A body read to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Body {
    pub data: Text,
    /// The trailer fields the proxy passes on (`is_forwardable_trailer`), sorted.
    pub trailers: Vec<(String, Text)>,
}

/// What happens to a second request on the connection of the first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// It was sent and answered: status and body.
    Answered(StatusCode, Text),
    /// The connection was not reused, or failed the second exchange.
    Closed,
}

fn fields(headers: &HeaderMap) -> Vec<(String, Text)> {
    let mut fields: Vec<_> = headers
        .iter()
        .map(|(name, value)| (name.as_str().to_owned(), Text(value.as_bytes().to_vec())))
        .collect();
    fields.sort();
    fields
}

fn trailers(trailers: &HeaderMap) -> Vec<(String, Text)> {
    let mut kept = fields(trailers);
    kept.retain(|(name, _)| is_forwardable_trailer(&name.parse().expect("a field name")));
    kept
}

fn interim(status: StatusCode) -> bool {
    status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS
}

// === the hand-written side ===

/// Bytes as they arrive from the upstream, one read at a time.
struct Wire<'a> {
    read: BytesMut,
    reads: std::slice::Iter<'a, &'a [u8]>,
}

impl Wire<'_> {
    /// The next read into the buffer; `false` once the upstream has closed.
    fn fill(&mut self) -> bool {
        self.reads.next().is_some_and(|bytes| {
            self.read.extend_from_slice(bytes);
            true
        })
    }

    fn drained(&self) -> bool {
        self.read.is_empty() && self.reads.as_slice().is_empty()
    }
}

/// The hand-written side, the answer arriving in `reads`.
pub(crate) fn hand_written(method: &Method, reads: &[&[u8]]) -> Outcome {
    let mut wire = Wire {
        read: BytesMut::new(),
        reads: reads.iter(),
    };
    let head = loop {
        match parse_head(&mut wire.read, method) {
            Err(_) => return Outcome::Refused,
            Ok(Some(head)) if interim(head.parts.status) => continue,
            Ok(Some(head)) => break head,
            Ok(None) if wire.fill() => continue,
            Ok(None) => return Outcome::Refused,
        }
    };
    let mut headers = head.parts.headers.clone();
    if check_answer(method, head.parts.status, &mut headers, false).is_err() {
        return Outcome::Refused;
    }
    let mut decoder = Decoder::new(head.framing);
    let (mut data, mut kept) = (Vec::new(), Vec::new());
    let mut closed = false;
    let ended = loop {
        match decoder.step(&mut wire.read) {
            Step::Frame(frame) => match frame.into_data() {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(frame) => kept = trailers(&frame.into_trailers().expect("data or trailers")),
            },
            Step::Done => break true,
            Step::Failed(_) => break false,
            Step::NeedMore if wire.fill() => {}
            Step::NeedMore => {
                closed = true;
                break decoder.at_eof().is_ok();
            }
        }
    };
    let reused = ended && !closed && head.keep_alive && wire.drained();
    Outcome::Answer(Answer {
        status: head.parts.status,
        version: head.parts.version,
        fields: fields(&head.parts.headers),
        body: ended.then_some(Body {
            data: Text(data),
            trailers: kept,
        }),
        next: if reused {
            Next::Answered(StatusCode::OK, Text(b"second".to_vec()))
        } else {
            Next::Closed
        },
    })
}

// === hyper's side ===

/// hyper's side: the answer `wire` from a test upstream, to a request with `method`.
pub(crate) fn hyper(method: &Method, wire: &[u8]) -> Outcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(exchange(method.clone(), Bytes::copy_from_slice(wire)))
}

async fn exchange(method: Method, wire: Bytes) -> Outcome {
    // Room for all of it at once: the upstream's write never waits for the client to read.
    let (client, server) = tokio::io::duplex(wire.len() + SECOND.len() + 64 * 1024);
    let upstream = tokio::spawn(upstream(server, wire));
    let mut builder = hyper::client::conn::http1::Builder::new();
    builder.writev(false);
    let (mut sender, conn) = builder
        .handshake::<_, Empty<Bytes>>(TokioIo::new(client))
        .await
        .expect("a handshake over a duplex");
    tokio::spawn(conn.with_upgrades());
    let outcome = match sender.send_request(request(&method, "/first")).await {
        Err(_) => Outcome::Refused,
        Ok(response) => {
            let (mut head, incoming) = response.into_parts();
            let fields = fields(&head.headers);
            if check_answer(&method, head.status, &mut head.headers, false).is_err() {
                Outcome::Refused
            } else {
                let body = read_body(incoming).await;
                let next = if body.is_some() && keeps_alive(head.version, &head.headers) {
                    second(&mut sender).await
                } else {
                    Next::Closed
                };
                Outcome::Answer(Answer {
                    status: head.status,
                    version: head.version,
                    fields,
                    body,
                    next,
                })
            }
        }
    };
    drop(sender);
    upstream.abort();
    outcome
}

fn request(method: &Method, target: &str) -> Request<Empty<Bytes>> {
    Request::builder()
        .method(method.clone())
        .uri(target)
        .header("host", "upstream")
        .body(Empty::new())
        .expect("a request")
}

async fn read_body(mut incoming: Incoming) -> Option<Body> {
    let mut body = Body {
        data: Text(Vec::new()),
        trailers: Vec::new(),
    };
    while let Some(frame) = incoming.frame().await {
        let frame = frame.ok()?;
        match frame.into_data() {
            Ok(data) => body.data.0.extend_from_slice(&data),
            Err(frame) => body.trailers = trailers(frame.trailers_ref().expect("trailers")),
        }
    }
    Some(body)
}

/// A second request on the connection, as the pool would send it.
async fn second(sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>) -> Next {
    if sender.ready().await.is_err() {
        return Next::Closed;
    }
    let Ok(response) = sender.send_request(request(&Method::GET, "/second")).await else {
        return Next::Closed;
    };
    let status = response.status();
    match read_body(response.into_body()).await {
        Some(body) => Next::Answered(status, body.data),
        None => Next::Closed,
    }
}

/// The test upstream: answers the first request with `wire` and a second with
/// [`SECOND`]; closes once everyone waits.
async fn upstream(mut io: DuplexStream, wire: Bytes) {
    let mut seen = BytesMut::new();
    if !read_request(&mut io, &mut seen).await || io.write_all(&wire).await.is_err() {
        return;
    }
    match tokio::time::timeout(STUCK, read_request(&mut io, &mut seen)).await {
        Ok(true) => {
            let _ = io.write_all(SECOND).await;
        }
        Ok(false) => return,
        // The client waits for more of the answer: it gets the close instead.
        Err(_) => {}
    }
    let _ = io.shutdown().await;
    // Kept open for reading until the client is done, so that it sees a close, not a
    // broken pipe.
    let _ = tokio::time::timeout(STUCK, io.read_to_end(&mut Vec::new())).await;
}

/// Reads one request head (the requests sent have no body); `false` at a close.
async fn read_request(io: &mut DuplexStream, seen: &mut BytesMut) -> bool {
    loop {
        if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            let _ = seen.split_to(end + 4);
            return true;
        }
        match io.read_buf(seen).await {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
    }
}
