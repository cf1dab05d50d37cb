//! Listeners: the proxy port (HTTP/1.1 and cleartext HTTP/2, chosen per connection, served
//! by hyper-util's auto builder) and the optional admin port, each with a graceful drain: on
//! shutdown, stop accepting, let open connections finish their requests, then return. The
//! proxy port serves at most `connections.max_client` connections at once, a connection
//! holding its slot until the owners it started have ended too
//! ([`crate::proxy::conn_share`]), and closes each lingering ([`linger`]). On both, a
//! connection without a request for the head timeout, or whose client takes nothing of an
//! answer for `connections.client_send_timeout`, is closed ([`watchdog`]).

use std::convert::Infallible;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};

use crate::config::{Config, Linger, StoreConfig};
use crate::key::Digest;
use crate::metrics::Metrics;
use crate::proxy::body::{ProxyBody, RequestBody};
use crate::proxy::conn_share::ConnShare;
use crate::proxy::{ConnInfo, Proxy, Transport};
use crate::store::{MemoryStore, MysqlStore, PostgresStore, RedisStore, Store, StoreError};
use sha2::{Digest as _, Sha256};

pub mod linger;
mod watchdog;
use crate::signal::Signal;
use watchdog::{Expired, Metered, Watch, Watchdog, Watched};

/// Builds the store a config names. Redis and the SQL stores connect lazily: a server that
/// is down at start is reported (and `/readyz` fails) but does not stop the proxy.
pub fn open_store(config: &Config) -> Result<Store, StoreError> {
    Ok(match &config.store {
        StoreConfig::Memory(limits) => Store::Memory(Arc::new(MemoryStore::new(*limits))),
        StoreConfig::Redis(settings) => Store::Redis(Arc::new(RedisStore::connect(settings)?)),
        StoreConfig::Postgres(settings) => Store::Postgres(PostgresStore::connect(settings)?),
        StoreConfig::Mysql(settings) => Store::Mysql(MysqlStore::connect(settings)?),
    })
}

/// Serves the proxy on `listener` until `shutdown` resolves, then drains for at most
/// `drain` before returning. TLS follows the live config, so a reload renews certificates
/// for new connections (whether the port speaks TLS at all is kept from start, see
/// [`Proxy::reload`]). At most `connections.max_client` connections are served at once
/// (read at start); each closes lingering (see [`linger`]).
pub async fn serve_proxy(
    listener: TcpListener,
    proxy: Proxy,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let config = proxy.config();
    let limits = Limits {
        slots: Some(Arc::new(Semaphore::new(
            config.connections.max_client.min(Semaphore::MAX_PERMITS),
        ))),
        linger: Some(config.connections.linger),
        idle: proxy.idle_timeout(),
        send: config.connections.client_send_timeout,
        streams: config.connections.max_streams,
        metrics: Some(Arc::clone(proxy.metrics())),
    };
    // The drain starts with the shutdown: duplicates held waiting are answered before it
    // ends (see `crate::proxy::stopping`).
    let stopping = proxy.clone();
    let shutdown = async move {
        shutdown.await;
        stopping.stopping().begin(drain);
    };
    let tls_source = proxy.clone();
    let tls = move || tls_source.config().tls.clone();
    let service = move |conn: ConnInfo| {
        let proxy = proxy.clone();
        let conn = Arc::new(conn);
        service_fn(move |request: Request<Incoming>| {
            let (proxy, conn) = (proxy.clone(), Arc::clone(&conn));
            let request = request.map(RequestBody::Incoming);
            async move { Ok::<_, Infallible>(proxy.handle(request, &conn).await) }
        })
    };
    accept_loop(listener, service, tls, limits, shutdown, drain).await;
}

/// Serves the admin endpoints on `listener` until `shutdown` resolves.
pub async fn serve_admin(
    listener: TcpListener,
    proxy: Proxy,
    token: Option<String>,
    shutdown: impl Future<Output = ()>,
) {
    let limits = Limits {
        slots: None,
        linger: None,
        idle: proxy.idle_timeout(),
        send: proxy.config().connections.client_send_timeout,
        streams: proxy.config().connections.max_streams,
        metrics: None,
    };
    let listen = listener
        .local_addr()
        .unwrap_or((Ipv4Addr::UNSPECIFIED, 0).into());
    let access = Arc::new(crate::admin::Access::new(token, listen));
    let service = move |_conn: ConnInfo| {
        let (proxy, access) = (proxy.clone(), access.clone());
        service_fn(move |request: Request<Incoming>| {
            let (proxy, access) = (proxy.clone(), access.clone());
            async move { Ok::<_, Infallible>(crate::admin::handle(request, &proxy, &access).await) }
        })
    };
    accept_loop(
        listener,
        service,
        || None,
        limits,
        shutdown,
        Duration::from_secs(1),
    )
    .await;
}

/// What bounds a listener's connections.
struct Limits {
    /// One permit per connection served (`connections.max_client`); `None`: no cap.
    slots: Option<Arc<Semaphore>>,
    /// How connections close; `None`: at once.
    linger: Option<Linger>,
    /// How long a connection may go without a request: from accept to its first request
    /// head, and between an answer's end and the next head.
    idle: Duration,
    /// How long an answer may wait for its client to take something
    /// (`connections.client_send_timeout`, read at start).
    send: Duration,
    /// Requests one HTTP/2 connection may have open at once, and owners one connection may
    /// have running, its client there or not (`connections.max_streams`, read at start).
    streams: u32,
    /// Where connections are counted; `None`: not at all.
    metrics: Option<Arc<Metrics>>,
}

/// What a connection's requests are served by: the proxy's handler, for hyper.
trait ConnService:
    hyper::service::Service<
        Request<Incoming>,
        Response = Response<ProxyBody>,
        Error = Infallible,
        Future: Send + 'static,
    > + Send
    + 'static
{
}

impl<S> ConnService for S where
    S: hyper::service::Service<
            Request<Incoming>,
            Response = Response<ProxyBody>,
            Error = Infallible,
            Future: Send + 'static,
        > + Send
        + 'static
{
}

async fn accept_loop<F, S>(
    listener: TcpListener,
    make_service: F,
    tls: impl Fn() -> Option<Arc<rustls::ServerConfig>>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) where
    F: Fn(ConnInfo) -> S + Send + Sync + 'static,
    S: ConnService,
{
    let mut template = auto::Builder::new(TokioExecutor::new());
    // No HTTP/1.1 header-read timeout of hyper's: the connection's watchdog bounds a head
    // (from accept, or from the last answer's end) on every protocol, with a lazy timer
    // per connection rather than one sleep per head.
    template.http1().header_read_timeout(None);
    // Answers are written flattened, as upstream requests are (see `Pool::new`).
    template.http1().writev(false);
    template.http1().max_buf_size(H1_BUFFER);
    // HTTP/2's limits against the known attacks are set here, not left to hyper's and h2's
    // defaults, so that no dependency bump lifts them; tests/h2_abuse pins each. PING and
    // SETTINGS floods need none: h2 reads no further frame until its answer to the last one
    // is written, so a client that does not read stops being read.
    template
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.streams)
        .max_pending_accept_reset_streams(H2_RESET_STREAMS)
        .max_local_error_reset_streams(H2_ERROR_RESETS)
        .max_header_list_size(H2_HEADER_LIST)
        // What one connection buffers, pinned too: hyper's defaults (1 MiB windows, 400 KiB
        // of send buffer a stream) would let each connection hold a few MiB.
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .adaptive_window(false)
        .max_send_buf_size(H2_SEND_BUFFER);
    let template = Arc::new(template);
    let make_service = Arc::new(make_service);
    let linger = limits.linger;
    let (idle, send) = (limits.idle, limits.send);
    let metrics = limits.metrics;
    let streams = usize::try_from(limits.streams).unwrap_or(usize::MAX);
    // Each connection holds a sender; when all are dropped, every connection has closed.
    let (open_tx, mut open_rx) = mpsc::channel::<()>(1);
    let stop = Signal::default();
    tokio::pin!(shutdown);
    loop {
        // A slot first: over the cap, new connections wait in the listen backlog.
        let slot = match &limits.slots {
            None => None,
            Some(slots) => match Arc::clone(slots).try_acquire_owned() {
                Ok(slot) => Some(slot),
                Err(_) => {
                    if let Some(metrics) = &metrics {
                        metrics.connections().client_waited.inc();
                    }
                    tokio::select! {
                        _ = &mut shutdown => break,
                        slot = Arc::clone(slots).acquire_owned() => slot.ok(),
                    }
                }
            },
        };
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Typically EMFILE: back off a little instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let tls = tls();
        let make_service = Arc::clone(&make_service);
        let template = Arc::clone(&template);
        let open = open_tx.clone();
        let stop = stop.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _open = open;
            // The slot goes back once the connection and every owner it started have ended.
            let share = ConnShare::new(streams, slot);
            let _counted = metrics
                .as_ref()
                .map(|m| Counted::new(m.connections().client_open.clone()));
            // From accept: the head timeout counts the TLS handshake and the protocol choice.
            let watch = Watch::new(idle, send);
            let (stream, returned) = linger::Returning::new(stream);
            let stream = Metered::new(stream, Arc::clone(&watch));
            let builder = &*template;
            match tls {
                None => {
                    let conn = ConnInfo::cleartext(peer).with_share(Arc::clone(&share));
                    let service = make_service(conn);
                    let io = TokioIo::new(stream);
                    serve_one(builder, io, service, stop, peer, watch).await;
                }
                Some(config) => {
                    // The handshake runs here, off the accept loop, bounded so a silent
                    // client cannot hold a task forever.
                    let handshake = tokio_rustls::TlsAcceptor::from(config).accept(stream);
                    let bound = HANDSHAKE_TIMEOUT.min(idle);
                    let stream = match tokio::time::timeout(bound, handshake).await {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, %peer, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, ?bound, "TLS handshake timed out");
                            return;
                        }
                    };
                    let client_cert = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|chain| chain.first())
                        .map(|leaf| Digest(Sha256::digest(leaf.as_ref()).into()));
                    let conn = ConnInfo::new(peer, Transport::Tls { client_cert });
                    let service = make_service(conn.with_share(Arc::clone(&share)));
                    let io = TokioIo::new(stream);
                    serve_one(builder, io, service, stop, peer, watch).await;
                }
            }
            // hyper has dropped the socket by now (unless an upgrade took it along).
            if let (Some(bounds), Some(metrics)) = (linger, &metrics) {
                if let Ok(stream) = returned.await {
                    // Boxed: its buffer and timer stay off every connection's task.
                    Box::pin(linger::close(stream, bounds, metrics.connections())).await;
                }
            }
            if let Some(metrics) = &metrics {
                share.closed(&metrics.connections().client_outlived);
            }
        });
    }
    drop(listener);
    drop(open_tx);
    stop.send();
    if tokio::time::timeout(drain, open_rx.recv()).await.is_err() {
        tracing::warn!(?drain, "drain timeout: closing connections still open");
    }
}

/// Longest a TLS handshake may take (and never longer than the head timeout).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Rapid reset (CVE-2023-44487): streams an HTTP/2 client may have reset before they were
/// taken up, at once; one more and the connection gets GOAWAY `ENHANCE_YOUR_CALM`. h2's
/// default. (A reset after the request was taken up ends it, unless it is an owner whose
/// request went out: those count against the connection, see
/// [`crate::proxy::conn_share`].)
const H2_RESET_STREAMS: usize = 20;

/// Streams the proxy may reset for an HTTP/2 client's errors (a malformed request) on one
/// connection before it gives up on the connection with GOAWAY `ENHANCE_YOUR_CALM`.
/// hyper's default.
const H2_ERROR_RESETS: usize = 1024;

/// The decoded size of an HTTP/2 request's fields (`SETTINGS_MAX_HEADER_LIST_SIZE`, RFC
/// 9113 §6.5.2; each field counts its name, value and 32): over it the stream is answered
/// `431`, over four times it the connection gets GOAWAY. It also bounds the CONTINUATION
/// frames of one head (CVE-2024-27316): h2 takes a little more than the frames needed to
/// carry this much, at least 5. hyper's default; h2's own would be 16 MiB.
const H2_HEADER_LIST: u32 = 16 << 10;

/// The receive window of each HTTP/2 request stream (`SETTINGS_INITIAL_WINDOW_SIZE`): the
/// most of one request's body that waits in h2's buffers for the proxy to read it (an
/// upload waiting for an upstream connection, or a slow upstream). Four times nginx's
/// `http2_body_preread_size` (64 KiB): a stream moves its window once a round trip, and
/// 64 KiB a round trip is 1.3 MB/s at 50 ms, slow for an upload; 256 KiB gives 5 MB/s.
const H2_STREAM_WINDOW: u32 = 256 << 10;

/// The receive window of a whole HTTP/2 client connection, shared by its streams: what its
/// request bodies hold in h2's buffers at most, whatever the number of streams. Eight
/// stream windows: uploads the proxy is not reading yet (waiting for an upstream
/// connection, or behind a slow upstream) hold theirs, and with only two such streams a
/// connection's every other request body stopped. Envoy's edge guidance keeps sixteen
/// (64 KiB streams, 1 MiB connection). Not hyper's default (1 MiB), so the test that pins
/// it sees the setting dropped. All connections may hold `max_client` times this (the
/// docs say so). Not adaptive: h2's BDP estimate would grow it without a bound of ours.
const H2_CONNECTION_WINDOW: u32 = 2 << 20;

/// What h2 queues of each HTTP/2 answer stream beyond what the client's window lets out
/// (hyper's default: 400 KiB): hyper hands h2 the answer's next part whole once the queue
/// has any room, then takes the one after and holds it until there is room again, so an
/// answer its client does not read holds this much here plus those two parts, the rest
/// upstream. A queue does not limit throughput (the client's window does), only what
/// waits.
const H2_SEND_BUFFER: usize = 64 << 10;

/// The most an HTTP/1.1 client connection's read buffer grows to, and so the longest head
/// it takes: one that does not fit is answered `431`. A third of hyper's default (about
/// 400 KiB), which every connection could hold with a head still arriving, outside the
/// buffer budget (`crate::proxy::budget` charges a head once it is whole). Still room for
/// the longest target hyper parses (65,534 bytes, a longer one gets its `414`) with its
/// fields; nginx takes 4 × 8 KiB of head, Envoy 60 KiB.
const H1_BUFFER: usize = 128 << 10;

/// A gauge up while the value lives.
struct Counted(Gauge);

impl Counted {
    fn new(gauge: Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Serves one connection (HTTP/1.1 or HTTP/2 by ALPN or preface) until it closes, or until
/// `stop` fires: then the request in progress finishes and no new one is taken; or until
/// its `watch` says it should close (see [`watchdog`]).
async fn serve_one<I, S>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    service: S,
    stop: Signal,
    peer: SocketAddr,
    watch: Arc<Watch>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: ConnService,
{
    let idle = watch.head();
    let service = Watched::new(service, Arc::clone(&watch));
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    let watchdog = Watchdog::new(watch);
    until_stopped(
        conn,
        |conn| conn.graceful_shutdown(),
        stop,
        peer,
        watchdog,
        idle,
    )
    .await;
}

/// Drives `conn` until it ends, or until `stop` fires: then `shutdown` lets the request in
/// progress finish and takes no new one. When `watchdog` fires, an idle connection is shut
/// down the same way, given `grace` to end; one whose client does not take its answer is
/// dropped at once, and with it the requests it carries (a protected owner detaches and
/// runs on, see [`crate::proxy::detach`]). (`conn` is pinned by the caller: moved in, it
/// would take room in both futures' state.)
async fn until_stopped<C, E>(
    mut conn: Pin<&mut C>,
    shutdown: impl FnOnce(Pin<&mut C>),
    stop: Signal,
    peer: SocketAddr,
    mut watchdog: Watchdog,
    grace: Duration,
) where
    C: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    // Biased: the connection first, and no random pick per poll.
    let result = tokio::select! {
        biased;
        result = conn.as_mut() => result,
        () = stop.sent() => {
            shutdown(conn.as_mut());
            tokio::select! {
                biased;
                result = conn.as_mut() => result,
                expired = &mut watchdog => return closed(expired, peer),
            }
        }
        expired = &mut watchdog => match expired {
            Expired::Send => return closed(expired, peer),
            Expired::Idle => {
                shutdown(conn.as_mut());
                match tokio::time::timeout(grace, conn.as_mut()).await {
                    Ok(result) => result,
                    Err(_) => return closed(expired, peer),
                }
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, %peer, "connection ended with an error");
    }
}

/// Logs why the proxy closed a connection; dropping it is the caller's.
fn closed(expired: Expired, peer: SocketAddr) {
    match expired {
        Expired::Idle => tracing::debug!(%peer, "connection closed: no request"),
        Expired::Send => tracing::debug!(%peer, "connection closed: the client takes nothing"),
    }
}
