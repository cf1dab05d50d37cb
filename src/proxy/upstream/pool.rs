//! Keep-alive connections to the upstream: HTTP/1.1 over TCP (TLS for `https://`), handed
//! out most-recently-used first, and handed back by the response body once the upstream
//! has sent all of it.
//!
//! hyper-util's general-purpose pool spawned a task per request to notice a connection
//! becoming idle and hashed a pool key per checkout; with one origin and the end of the
//! body as the hand-back point neither is needed, which is about a tenth of the CPU of a
//! forwarded request.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::http1::{Connection, Decoder, Io};
use crate::error::ProxyError;
use crate::proxy::body::BodyError;

/// How long establishing a TCP connection (and its TLS handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle connections older than this are closed rather than reused: under the keep-alive
/// timeouts of common servers (nginx 75 s, Node 5 s is the exception and shows up as a
/// closed connection, which checkout skips).
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle connections kept at most; the oldest go first.
const MAX_IDLE: usize = 1024;

/// How to reach the upstream.
struct Dialer {
    /// `host:port` as `TcpStream::connect` resolves it (IPv6 hosts keep their brackets).
    address: String,
    /// For `https://`: the connector and the name the certificate must carry.
    tls: Option<(TlsConnector, String)>,
}

/// An idle connection.
struct Idle {
    conn: Connection,
    since: Instant,
}

/// The pool of one upstream origin.
pub(super) struct Pool {
    dialer: Dialer,
    idle: Mutex<Vec<Idle>>,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("address", &self.address)
            .field("tls", &self.tls.as_ref().map(|(_, name)| name))
            .finish()
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idle = self.idle.lock().map_or(0, |idle| idle.len());
        f.debug_struct("Pool")
            .field("dialer", &self.dialer)
            .field("idle", &idle)
            .finish()
    }
}

/// A connection checked out of the pool for one request.
pub(super) struct Checkout {
    /// The connection.
    pub conn: Connection,
    /// Whether it served an earlier request: only then may a request it failed to send be
    /// retried on another (the upstream may have closed it while it sat idle).
    pub reused: bool,
}

impl Pool {
    /// A pool for `host:port`; `tls` is `Some` for `https://` upstreams.
    pub fn new(host: &str, port: u16, tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        let tls = tls.map(|config| {
            let mut config = (*config).clone();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            let name = host.trim_start_matches('[').trim_end_matches(']');
            (TlsConnector::from(Arc::new(config)), name.to_owned())
        });
        Self {
            dialer: Dialer {
                address: format!("{host}:{port}"),
                tls,
            },
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The most recently used idle connection that is still open, or a new one.
    pub async fn checkout(&self) -> Result<Checkout, ProxyError> {
        loop {
            let Some(mut idle) = self.lock().pop() else {
                // Boxed: dialing (TCP, TLS) is a future of kilobytes that would otherwise be
                // part of every request's future, which is moved (copied) whenever a task
                // is spawned or its output read, although a connection is dialed only once
                // per many requests.
                return Ok(Checkout {
                    conn: Box::pin(self.dialer.connect()).await?,
                    reused: false,
                });
            };
            if idle.since.elapsed() <= IDLE_TIMEOUT && idle.conn.is_idle_and_open() {
                return Ok(Checkout {
                    conn: idle.conn,
                    reused: true,
                });
            }
        }
    }

    /// Takes a connection back for the next request.
    fn put(&self, conn: Connection) {
        let mut idle = self.lock();
        if idle.len() >= MAX_IDLE {
            idle.remove(0);
        }
        idle.push(Idle {
            conn,
            since: Instant::now(),
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // The list stays consistent whatever a panicking holder was doing: recover it.
        crate::sync::lock(&self.idle)
    }
}

impl Dialer {
    async fn connect(&self) -> Result<Connection, ProxyError> {
        let unreachable = |what: &str, e: &dyn std::fmt::Display| {
            ProxyError::UpstreamUnreachable(format!("{what} {}: {e}", self.address))
        };
        let dial = async {
            let tcp = TcpStream::connect(&self.address)
                .await
                .map_err(|e| unreachable("connect", &e))?;
            tcp.set_nodelay(true)
                .map_err(|e| unreachable("connect", &e))?;
            let io = match &self.tls {
                None => Io::Plain(tcp),
                Some((connector, name)) => {
                    let name = ServerName::try_from(name.clone())
                        .map_err(|e| unreachable("TLS server name of", &e))?;
                    let tls = connector
                        .connect(name, tcp)
                        .await
                        .map_err(|e| unreachable("TLS handshake with", &e))?;
                    Io::Tls(Box::new(tls))
                }
            };
            Ok(Connection::new(io))
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, dial).await {
            Ok(result) => result,
            Err(_) => Err(unreachable("connect", &"timed out")),
        }
    }
}

/// An upstream answer's body, decoded from its connection as the client side reads it.
/// At its end the connection goes back to the pool if the answer let it; dropped earlier,
/// it drops the connection (the rest of the body is still on the wire).
pub struct UpstreamBody {
    conn: Option<Connection>,
    decoder: Decoder,
    /// Where the connection goes at the end; `None`: it is not reusable.
    returning: Option<Arc<Pool>>,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("decoder", &self.decoder)
            .field("pooled", &self.returning.is_some())
            .finish()
    }
}

impl UpstreamBody {
    /// The body of an answer read from `conn`, handing `conn` back to `pool` at its end
    /// (`None`: never, e.g. the upstream said it closes the connection).
    pub(super) fn new(conn: Connection, decoder: Decoder, pool: Option<Arc<Pool>>) -> Self {
        let mut body = Self {
            conn: Some(conn),
            decoder,
            returning: pool,
        };
        // hyper never polls a body that says it is over (an empty one): hand back now.
        if body.decoder.is_done() {
            body.hand_back();
        }
        body
    }

    /// The connection of a `101 Switching Protocols` answer, now carrying the new protocol.
    pub(super) fn upgraded(conn: Connection) -> Self {
        Self {
            conn: Some(conn),
            decoder: Decoder::new(super::http1::Framing::Upgrade),
            returning: None,
        }
    }

    /// Takes the switched connection out of a `101` answer's body.
    pub fn into_upgraded(mut self) -> Option<Upgraded> {
        let (io, read) = self.conn.take()?.into_upgraded();
        Some(Upgraded { io, read })
    }

    fn hand_back(&mut self) {
        let pool = self.returning.take();
        let conn = self.conn.take();
        if let (Some(pool), Some(conn)) = (pool, conn) {
            // Bytes past the answer's end: the upstream and the framing disagree, and the
            // next request would read them as its answer.
            if conn.nothing_unread() {
                pool.put(conn);
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let Some(conn) = this.conn.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = conn.poll_body(&mut this.decoder, cx);
        match &polled {
            Poll::Ready(None) => this.hand_back(),
            // A sized body may say it is over with its last frame, after which hyper does
            // not poll it again.
            Poll::Ready(Some(Ok(_))) if this.decoder.is_done() => this.hand_back(),
            Poll::Ready(Some(Ok(_))) | Poll::Pending => {}
            // A failed body leaves the connection in an unknown state: never reuse it.
            Poll::Ready(Some(Err(_))) => {
                this.returning = None;
                this.conn = None;
            }
        }
        polled.map(|frame| frame.map(|result| result.map_err(BodyError::Upstream)))
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// An upstream connection after `101 Switching Protocols`: the bytes of the new protocol
/// that arrived with the answer head come first, then the stream.
pub struct Upgraded {
    io: Io,
    read: Bytes,
}

impl AsyncRead for Upgraded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read.has_remaining() {
            let n = this.read.len().min(buf.remaining());
            buf.put_slice(&this.read[..n]);
            this.read.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Upgraded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
