//! Running a vector: a fresh proxy in front of a fresh strict recorder, the vector's
//! frames written on a cleartext HTTP/2 connection (prior knowledge), the client's
//! outcome read back, then a follow-up request on the same connection, and the
//! [`Verdict`] judged from both and from what the recorder saw.

use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;

use crate::common;
use crate::corpus::{Body, Expect, HeadFrames, Route, Vector, CONFIG};
use crate::frames::*;
use crate::wire::{start_wire, Event};

/// Hang guard for one run.
pub(crate) const HANG: Duration = Duration::from_secs(10);

/// How a stream ended for the client.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    /// A final answer with this status.
    Answered(u16),
    /// An answer whose `:status` [`status_of`] cannot read.
    Undecodable,
    /// RST_STREAM with this error code before any answer.
    Reset(u32),
    /// GOAWAY with this error code before any answer.
    GoAway(u32),
    /// The connection closed before any answer.
    Closed,
}

/// What the proxy did with a vector.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// RST_STREAM with this code; nothing reached the upstream.
    Reset(u32),
    /// GOAWAY with this code; nothing reached the upstream.
    GoAway(u32),
    /// An answer with this status (4xx); nothing reached the upstream.
    Refused(u16),
    /// Answered 201, and the upstream read exactly this one request: method, target,
    /// Host, body.
    Forwarded(String, String, Option<String>, Vec<u8>),
    /// Anything else, said in words.
    Other(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Reset(code) => write!(f, "RST_STREAM {code}"),
            Verdict::GoAway(code) => write!(f, "GOAWAY {code}"),
            Verdict::Refused(status) => write!(f, "refused {status}"),
            Verdict::Forwarded(method, target, host, body) => write!(
                f,
                "forwarded {method} {target} host={host:?} body={:?}",
                String::from_utf8_lossy(body)
            ),
            Verdict::Other(what) => write!(f, "{what}"),
        }
    }
}

/// `expect` on `route` as a [`Verdict`].
pub(crate) fn expected(expect: Expect, route: Route) -> Verdict {
    match expect {
        Expect::Reset(code) => Verdict::Reset(code),
        Expect::GoAway(code) => Verdict::GoAway(code),
        Expect::Refused(status) => Verdict::Refused(status),
        Expect::Forwarded(f) => Verdict::Forwarded(
            f.method.into(),
            f.target.replace("$P", route.path()),
            Some(f.host.into()),
            f.body.to_vec(),
        ),
    }
}

/// A client connection's bytes: TCP, or TLS over it.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// How a client reaches the proxy.
pub(crate) enum Transport {
    /// Cleartext HTTP/2 with prior knowledge (h2c).
    Cleartext,
    /// TLS with ALPN `h2`: the `tls:` line of the proxy's config and a client for it.
    Tls(crate::tls::TlsClient),
}

impl Transport {
    /// The config's `tls:` line, if any.
    fn config_line(&self) -> String {
        match self {
            Transport::Cleartext => String::new(),
            Transport::Tls(tls) => tls.config_line.clone(),
        }
    }

    /// A new client connection to `addr`.
    async fn connect(&self, addr: SocketAddr) -> H2 {
        match self {
            Transport::Cleartext => H2::open(addr).await,
            Transport::Tls(tls) => H2::over(tls.connect(addr).await).await,
        }
    }
}

/// A client's HTTP/2 connection, written and read by hand.
pub(crate) struct H2 {
    reader: ReadHalf<Box<dyn Io>>,
    writer: WriteHalf<Box<dyn Io>>,
    buf: Vec<u8>,
}

impl H2 {
    /// Connects over TCP, and writes the preface and the client's SETTINGS.
    pub(crate) async fn open(addr: SocketAddr) -> H2 {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        H2::over(Box::new(stream)).await
    }

    /// Writes the preface and the client's SETTINGS on `io`.
    pub(crate) async fn over(io: Box<dyn Io>) -> H2 {
        let (reader, writer) = tokio::io::split(io);
        let mut h2 = H2 {
            reader,
            writer,
            buf: Vec::new(),
        };
        let mut hello = PREFACE.to_vec();
        hello.extend(client_settings());
        h2.send(&hello).await;
        h2
    }

    /// Writes `bytes`; a write the proxy no longer reads may fail, which is fine.
    pub(crate) async fn send(&mut self, bytes: &[u8]) {
        let _ = self.writer.write_all(bytes).await;
        let _ = self.writer.flush().await;
    }

    /// The next frame: type, flags, stream, payload; `None` at the end of the connection.
    async fn next_frame(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        loop {
            if self.buf.len() >= 9 {
                let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
                if self.buf.len() >= 9 + len {
                    let head: Vec<u8> = self.buf.drain(..9).collect();
                    let payload = self.buf.drain(..len).collect();
                    let stream =
                        u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
                    return Some((head[3], head[4], stream, payload));
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.reader.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Reads until `stream` ends and says how; acknowledges SETTINGS and PING on the way.
    pub(crate) async fn outcome(&mut self, stream: u32) -> Outcome {
        let mut answered = None;
        let read = tokio::time::timeout(HANG, async {
            loop {
                let Some((kind, flags, id, payload)) = self.next_frame().await else {
                    return answered.clone().unwrap_or(Outcome::Closed);
                };
                match kind {
                    SETTINGS if flags & ACK == 0 => self.send(&frame(SETTINGS, ACK, 0, &[])).await,
                    PING if flags & ACK == 0 => self.send(&frame(PING, ACK, 0, &payload)).await,
                    GOAWAY => {
                        let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
                        return answered.clone().unwrap_or(Outcome::GoAway(code));
                    }
                    RST_STREAM if id == stream => {
                        let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
                        return answered.clone().unwrap_or(Outcome::Reset(code));
                    }
                    HEADERS if id == stream && answered.is_none() => {
                        match status_of(&payload) {
                            Some(s) if s < 200 => continue,
                            Some(s) => answered = Some(Outcome::Answered(s)),
                            None => answered = Some(Outcome::Undecodable),
                        }
                        if flags & END_STREAM != 0 {
                            return answered.clone().unwrap();
                        }
                    }
                    HEADERS | DATA if id == stream && flags & END_STREAM != 0 => {
                        return answered.clone().unwrap_or(Outcome::Closed);
                    }
                    _ => {}
                }
            }
        })
        .await;
        read.unwrap_or_else(|_| panic!("hang guard: stream {stream} did not end within {HANG:?}"))
    }
}

impl H2 {
    /// Reads until every stream of `streams` ended, and gives each one's `:status` (when
    /// it was answered) and body; acknowledges SETTINGS and PING on the way.
    pub(crate) async fn answers(&mut self, streams: &[u32]) -> Vec<(Option<u16>, Vec<u8>)> {
        let mut got: Vec<(Option<u16>, Vec<u8>, bool)> =
            vec![(None, Vec::new(), false); streams.len()];
        let read = tokio::time::timeout(HANG, async {
            while got.iter().any(|g| !g.2) {
                let Some((kind, flags, id, payload)) = self.next_frame().await else {
                    return;
                };
                if kind == SETTINGS && flags & ACK == 0 {
                    self.send(&frame(SETTINGS, ACK, 0, &[])).await;
                    continue;
                }
                if kind == PING && flags & ACK == 0 {
                    self.send(&frame(PING, ACK, 0, &payload)).await;
                    continue;
                }
                if kind == GOAWAY {
                    return;
                }
                let Some(i) = streams.iter().position(|&s| s == id) else {
                    continue;
                };
                match kind {
                    HEADERS if got[i].0.is_none() => got[i].0 = status_of(&payload),
                    DATA => got[i].1.extend_from_slice(&payload),
                    RST_STREAM => got[i].2 = true,
                    _ => {}
                }
                if matches!(kind, HEADERS | DATA) && flags & END_STREAM != 0 {
                    got[i].2 = true;
                }
            }
        })
        .await;
        assert!(
            read.is_ok(),
            "hang guard: streams {streams:?} did not end within {HANG:?}"
        );
        got.into_iter()
            .map(|(status, body, _)| (status, body))
            .collect()
    }
}

/// The frames of `vector` on `stream` for `route`, with `key` as its Idempotency-Key.
pub(crate) fn frames_of(vector: &Vector, route: Route, stream: u32, key: &str) -> Vec<u8> {
    let fields = vector.head.fields(route, key);
    let mut out = Vec::new();
    let block = header_block(&fields);
    let end = if matches!(vector.body, Body::End) {
        END_STREAM
    } else {
        0
    };
    match vector.head_frames {
        HeadFrames::One => out.extend(frame(HEADERS, end | END_HEADERS, stream, &block)),
        HeadFrames::Continuation => {
            let half = block.len() / 2;
            out.extend(frame(HEADERS, end, stream, &block[..half]));
            out.extend(frame(CONTINUATION, END_HEADERS, stream, &block[half..]));
        }
        HeadFrames::Padded(pad) => {
            let mut payload = vec![pad];
            payload.extend_from_slice(&block);
            payload.extend(std::iter::repeat_n(0, usize::from(pad)));
            out.extend(frame(HEADERS, end | END_HEADERS | PADDED, stream, &payload));
        }
        HeadFrames::Priority => {
            // Depends on stream 0, not exclusive, weight 16.
            let mut payload = vec![0, 0, 0, 0, 15];
            payload.extend_from_slice(&block);
            out.extend(frame(
                HEADERS,
                end | END_HEADERS | PRIORITY,
                stream,
                &payload,
            ));
        }
    }
    match vector.body {
        Body::End => {}
        Body::Data(chunks) => {
            for (i, chunk) in chunks.iter().enumerate() {
                let last = if i + 1 == chunks.len() { END_STREAM } else { 0 };
                out.extend(frame(DATA, last, stream, chunk));
            }
        }
        Body::Padded(data, pad) => {
            let mut payload = vec![pad];
            payload.extend_from_slice(data);
            payload.extend(std::iter::repeat_n(0, usize::from(pad)));
            out.extend(frame(DATA, END_STREAM | PADDED, stream, &payload));
        }
        Body::Trailers(chunks, trailers) => {
            for chunk in chunks {
                out.extend(frame(DATA, 0, stream, chunk));
            }
            let owned: Vec<(Vec<u8>, Vec<u8>)> = trailers
                .iter()
                .map(|(n, v)| (n.to_vec(), v.to_vec()))
                .collect();
            out.extend(frame(
                HEADERS,
                END_STREAM | END_HEADERS,
                stream,
                &header_block(&owned),
            ));
        }
    }
    out
}

/// Runs `vector` on `route`, the client reaching the proxy by `transport`, and says what
/// happened: the vector's verdict, and whether a follow-up request on the same connection
/// was then served (`None` when the proxy had sent GOAWAY, which ends the connection for
/// new streams).
pub(crate) async fn run_over(
    vector: &Vector,
    route: Route,
    transport: &Transport,
) -> (Verdict, Option<bool>) {
    let (wire, log) = start_wire().await;
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{wire}\n{}{CONFIG}",
        transport.config_line()
    );
    let proxy = common::start_proxy_tuned(&text, None, |p| {
        p.with_idle_timeout(Duration::from_secs(5))
            .with_body_read_timeout(Duration::from_secs(5))
    })
    .await;
    let started = Instant::now();
    let mut h2 = transport.connect(proxy.addr).await;
    h2.send(&frames_of(vector, route, 1, "k1")).await;
    let first = h2.outcome(1).await;
    let next = if matches!(first, Outcome::GoAway(_) | Outcome::Closed) {
        None
    } else {
        let next = follow_up(route);
        h2.send(&next).await;
        Some(h2.outcome(3).await)
    };
    // Protected owners outlive their client stream (SPEC: a client that leaves does not
    // cancel the upstream call): wait until none runs before looking at the upstream.
    proxy.proxy.owners().finished(started + HANG).await;
    let events = log.events.lock().unwrap().clone();
    judge(first, next, &events, route)
}

/// The follow-up on the same connection, stream 3: `POST $P?next` (the mark that tells
/// it apart at the upstream) with key `k2` and body `next`.
pub(crate) fn follow_up(route: Route) -> Vec<u8> {
    let target = format!("{}?next", route.path());
    let fields = vec![
        (b":method".to_vec(), b"POST".to_vec()),
        (b":scheme".to_vec(), b"http".to_vec()),
        (b":authority".to_vec(), b"a".to_vec()),
        (b":path".to_vec(), target.into_bytes()),
        (b"idempotency-key".to_vec(), b"k2".to_vec()),
        (b"content-length".to_vec(), b"4".to_vec()),
    ];
    let mut out = frame(HEADERS, END_HEADERS, 3, &header_block(&fields));
    out.extend(frame(DATA, END_STREAM, 3, b"next"));
    out
}

/// The verdict from the client's outcomes and the upstream's events.
fn judge(
    first: Outcome,
    next: Option<Outcome>,
    events: &[Event],
    route: Route,
) -> (Verdict, Option<bool>) {
    let mut requests = Vec::new();
    let mut noise = Vec::new();
    let mut partial = Vec::new();
    let mut next_seen = 0;
    for event in events {
        match event {
            Event::Request(w) if w.target.ends_with("?next") && w.body == b"next" => next_seen += 1,
            Event::Request(w) => requests.push(w.clone()),
            Event::Malformed { conn, why } => {
                noise.push(format!("malformed on conn {conn}: {why}"))
            }
            Event::Partial { conn, bytes } => {
                partial.push(format!("partial request ({bytes} bytes) on conn {conn}"))
            }
        }
    }
    // The streamed route sends the head on once it is read: a stream reset for a body
    // that broke its length may leave the upstream a request cut off mid-body, which no
    // upstream can take for a whole one (the strict reader checked it began validly).
    // Nowhere else: the protected route buffers the body first.
    if route != Route::Open || !requests.is_empty() {
        noise.extend(partial);
    }
    let served = next
        .as_ref()
        .map(|n| *n == Outcome::Answered(201) && next_seen == 1);
    if next.is_none() && next_seen > 0 {
        noise.push("a follow-up reached the upstream unsent".into());
    }
    let shown: Vec<String> = requests
        .iter()
        .map(|w| {
            format!(
                "{} {} host={:?} body={:?}",
                w.method,
                w.target,
                w.host,
                String::from_utf8_lossy(&w.body)
            )
        })
        .collect();
    if !noise.is_empty() {
        return (
            Verdict::Other(format!(
                "upstream saw {noise:?}; client {first:?}; requests {shown:?}"
            )),
            served,
        );
    }
    let verdict = match (first, &requests[..]) {
        (Outcome::Reset(code), []) => Verdict::Reset(code),
        (Outcome::GoAway(code), []) => Verdict::GoAway(code),
        (Outcome::Answered(status), []) if status >= 400 => Verdict::Refused(status),
        (Outcome::Answered(201), [w]) => Verdict::Forwarded(
            w.method.clone(),
            w.target.clone(),
            w.host.clone(),
            w.body.clone(),
        ),
        (first, _) => Verdict::Other(format!("client {first:?}; upstream read {shown:?}")),
    };
    (verdict, served)
}
