//! Keep-alive connections to the upstream: HTTP/1.1 over TCP (TLS for `https://`), handed
//! out most-recently-used first, and handed back by the response body once the upstream
//! has sent all of it.
//!
//! hyper-util's general-purpose pool spawned a task per request to notice a connection
//! becoming idle and hashed a pool key per checkout; with one origin and the end of the
//! body as the hand-back point neither is needed, which is about a tenth of the CPU of a
//! forwarded request.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::error::ProxyError;
use crate::proxy::body::ProxyBody;

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
    sender: SendRequest<ProxyBody>,
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
    /// The connection's request half.
    pub sender: SendRequest<ProxyBody>,
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
            let Some(idle) = self.lock().pop() else {
                // Boxed: dialing (TCP, TLS, HTTP handshake) is a future of kilobytes that
                // would otherwise be part of every request's future, which is moved
                // (copied) whenever a task is spawned or its output read, although a
                // connection is dialed only once per many requests.
                return Ok(Checkout {
                    sender: Box::pin(self.dialer.connect()).await?,
                    reused: false,
                });
            };
            if idle.sender.is_closed() || idle.since.elapsed() > IDLE_TIMEOUT {
                continue;
            }
            let mut sender = idle.sender;
            // Handed back at the end of its response body, the connection is normally
            // ready at once; if its task has not run since, this waits for that.
            if sender.is_ready() || sender.ready().await.is_ok() {
                return Ok(Checkout {
                    sender,
                    reused: true,
                });
            }
        }
    }

    /// Takes a connection back for the next request.
    fn put(&self, sender: SendRequest<ProxyBody>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.lock();
        if idle.len() >= MAX_IDLE {
            idle.remove(0);
        }
        idle.push(Idle {
            sender,
            since: Instant::now(),
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // The list stays consistent whatever a panicking holder was doing: recover it.
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Dialer {
    async fn connect(&self) -> Result<SendRequest<ProxyBody>, ProxyError> {
        let unreachable = |what: &str, e: &dyn std::fmt::Display| {
            ProxyError::UpstreamUnreachable(format!("{what} {}: {e}", self.address))
        };
        let dial = async {
            let tcp = TcpStream::connect(&self.address)
                .await
                .map_err(|e| unreachable("connect", &e))?;
            tcp.set_nodelay(true)
                .map_err(|e| unreachable("connect", &e))?;
            match &self.tls {
                None => handshake(TokioIo::new(tcp)).await,
                Some((connector, name)) => {
                    let name = ServerName::try_from(name.clone())
                        .map_err(|e| unreachable("TLS server name of", &e))?;
                    let tls = connector
                        .connect(name, tcp)
                        .await
                        .map_err(|e| unreachable("TLS handshake with", &e))?;
                    handshake(TokioIo::new(tls)).await
                }
            }
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, dial).await {
            Ok(result) => result,
            Err(_) => Err(unreachable("connect", &"timed out")),
        }
    }
}

/// Starts HTTP/1.1 on `io`; the connection runs in its own task until either side closes
/// it (or hands it over after a `101 Switching Protocols`).
async fn handshake<I>(io: I) -> Result<SendRequest<ProxyBody>, ProxyError>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::Builder::new()
        .handshake(io)
        .await
        .map_err(|e| ProxyError::UpstreamUnreachable(e.to_string()))?;
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(error = %e, "upstream connection ended");
        }
    });
    Ok(sender)
}

/// An upstream response body that hands its connection back to the pool once the
/// upstream has sent all of it. Dropped earlier, it drops the connection instead (the
/// rest of the body is still on the wire).
pub struct UpstreamBody {
    inner: Incoming,
    returning: Option<(SendRequest<ProxyBody>, Arc<Pool>)>,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("inner", &self.inner)
            .field("pooled", &self.returning.is_some())
            .finish()
    }
}

impl UpstreamBody {
    /// `inner`, handing `sender` back to `pool` at its end (`None`: never, e.g. after an
    /// upgrade took the connection over).
    pub(super) fn new(
        inner: Incoming,
        returning: Option<(SendRequest<ProxyBody>, Arc<Pool>)>,
    ) -> Self {
        let mut body = Self { inner, returning };
        // hyper never polls a body that says it is over (an empty one): hand back now.
        if body.inner.is_end_stream() {
            body.hand_back();
        }
        body
    }

    fn hand_back(&mut self) {
        if let Some((sender, pool)) = self.returning.take() {
            pool.put(sender);
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            // A chunked body ends with `None`; a sized one may say so with its last frame,
            // after which it is not polled again.
            Poll::Ready(None) => this.hand_back(),
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.hand_back(),
            Poll::Ready(Some(Ok(_))) => {}
            // A failed body leaves the connection in an unknown state: never reuse it.
            Poll::Ready(Some(Err(_))) => this.returning = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
