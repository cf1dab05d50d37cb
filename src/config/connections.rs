//! `connections:` compiled into [`Connections`]: caps on client and upstream connections
//! and on the requests one HTTP/2 connection may have open, the protocol, HTTP/1.1 client
//! and idle timeout of upstream connections, the read timeout of pass-through answers, the
//! idle timeout of upgraded connections (tunnels), the send timeout of answers to clients,
//! the [`Linger`] settings of a client connection's close, and the bytes all requests
//! together, and those of one connection, may buffer.

use std::time::Duration;

use super::error::CompileError;
use super::raw::{RawConnections, RawUpstreamHttp1, RawUpstreamProtocol};

/// Bounds on connections, both sides (`connections:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connections {
    /// Client connections served at once; more wait in the listen backlog until one
    /// closes and the owners it started have ended. Read at start.
    pub max_client: usize,
    /// Requests one HTTP/2 connection may have open at once (its
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`), and owners one connection (either protocol) may
    /// have running, its client there or not (`crate::proxy::conn_share`). Read at start.
    pub max_streams: u32,
    /// Upstream connections open at once; requests beyond it wait for one (within their
    /// upstream timeout).
    pub max_upstream: usize,
    /// How long a kept-alive upstream connection may sit idle in the pool before the proxy
    /// closes it. It must stay below the upstream's own keep-alive timeout: a request sent
    /// on a connection the upstream is closing at that moment fails after it was written,
    /// which the proxy cannot tell from a request the upstream read, so on a protected
    /// route its key is held as outcome-unknown, and elsewhere it is a 502.
    pub upstream_idle_timeout: Duration,
    /// Longest gap between two reads of a pass-through answer's body.
    pub upstream_read_timeout: Duration,
    /// Longest an upgraded connection (WebSocket and the like) may carry no byte either
    /// way before the proxy closes both its sides (nginx's `proxy_read_timeout` on a
    /// tunnel): a tunnel holds an upstream connection and its client's slot, so one left
    /// idle must end; and longest a write to one of its sides may take no byte (nginx's
    /// `send_timeout`). By default `upstream_read_timeout`.
    pub tunnel_idle_timeout: Duration,
    /// What upstream connections speak (`connections.upstream_protocol`).
    pub upstream_protocol: UpstreamProtocol,
    /// Which client speaks HTTP/1.1 to the upstream (`connections.upstream_http1`; only
    /// with `upstream_protocol: http1`).
    pub upstream_http1: UpstreamHttp1,
    /// Longest a write of an answer to a client may make no progress (nginx's
    /// `send_timeout`): past it the client connection is closed, and with it the requests
    /// it carries (a protected owner runs on detached) and their upstream connections.
    pub client_send_timeout: Duration,
    /// How a client connection closes (after an answer sent before its request was read
    /// whole, above all).
    pub linger: Linger,
    /// Bytes all requests together may buffer at once: request heads held, protected
    /// request bodies and owners' upstream answers (`crate::proxy::budget`). A head or a
    /// body that finds no room is refused with `503 overloaded`, an answer streams on, not
    /// stored. Applies on reload.
    pub max_buffered: usize,
    /// Of those, what the requests of one client connection may hold at once, so that a
    /// few slow clients cannot hold all of it (`crate::proxy::budget`); by default an
    /// eighth of `max_buffered`. Refused the same way. Applies on reload.
    pub max_buffered_per_connection: usize,
}

/// The protocol of upstream connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamProtocol {
    /// HTTP/1.1: one request at a time on each connection (the default).
    #[default]
    Http1,
    /// HTTP/2, many requests on each connection: h2c with prior knowledge to an `http://`
    /// upstream, ALPN `h2` (and nothing else) to an `https://` one.
    Http2,
}

impl UpstreamProtocol {
    /// The name in the configuration, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http1 => "http1",
            Self::Http2 => "http2",
        }
    }
}

/// The client that speaks HTTP/1.1 to the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamHttp1 {
    /// hyper's client connections (the default).
    #[default]
    Hyper,
    /// The hand-written client (`crate::proxy::upstream::http1`), opt-in until the fuzz
    /// and differential tests of issue 24 prove it; protocol upgrades still go through
    /// hyper's.
    Idemgate,
}

impl UpstreamHttp1 {
    /// The name in the configuration, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hyper => "hyper",
            Self::Idemgate => "idemgate",
        }
    }
}

/// A lingering close (nginx's `lingering_close`): after the last answer the proxy closes
/// its sending side and reads and drops what the client still sends, so a client that
/// writes its whole request before reading gets the answer instead of a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linger {
    /// Longest the reading goes on in all (`lingering_time`).
    pub time: Duration,
    /// Longest wait for the next bytes (`lingering_timeout`).
    pub timeout: Duration,
    /// Most bytes read and dropped (`lingering_bytes`).
    pub bytes: u64,
}

impl Default for Connections {
    fn default() -> Self {
        Self {
            max_client: 10_000,
            // nginx's `http2_max_concurrent_streams` (hyper's own default is 200).
            max_streams: 128,
            max_upstream: 1024,
            // 1 s: below the keep-alive timeouts of common servers, the shortest of which
            // is gunicorn's 2 s (Node, uvicorn and Apache: 5 s; nginx: 75 s), with a second
            // to spare for a request taken just before it. Under load connections are
            // reused long before it, so it barely matters there; after an idle second, a
            // new connection (to the usual upstream nearby) costs little.
            upstream_idle_timeout: Duration::from_secs(1),
            upstream_read_timeout: Duration::from_secs(60),
            // nginx closes a tunnel by `proxy_read_timeout` (60 s), the same timeout as a
            // gap in an answer's body.
            tunnel_idle_timeout: Duration::from_secs(60),
            upstream_protocol: UpstreamProtocol::Http1,
            upstream_http1: UpstreamHttp1::Hyper,
            // nginx's `send_timeout` default.
            client_send_timeout: Duration::from_secs(60),
            linger: Linger {
                time: Duration::from_secs(30),
                timeout: Duration::from_secs(5),
                bytes: 64 << 20,
            },
            // A bound a small host holds besides everything else: 512 bodies or answers of
            // the default `max_body` (1 MiB) at once, 64 of the largest `max_answer` (8 MiB).
            max_buffered: 512 << 20,
            // An eighth: 64 MiB, 64 bodies of the default `max_body` or 8 answers of the
            // largest `max_answer` at once for one connection, HTTP/2 or not, while eight
            // connections holding all they may leave nothing for anyone else.
            max_buffered_per_connection: 64 << 20,
        }
    }
}

/// The default `max_buffered_per_connection`, as a fraction of `max_buffered`.
const PER_CONNECTION_SHARE: usize = 8;

pub(super) fn compile_connections(raw: RawConnections) -> Result<Connections, CompileError> {
    let d = Connections::default();
    let max_buffered = raw.max_buffered.map_or(d.max_buffered, |b| {
        usize::try_from(b.0).unwrap_or(usize::MAX)
    });
    let upstream_read_timeout = raw
        .upstream_read_timeout
        .map_or(d.upstream_read_timeout, |t| t.0);
    let c = Connections {
        max_client: raw.max_client.unwrap_or(d.max_client),
        max_streams: raw.max_streams.unwrap_or(d.max_streams),
        max_upstream: raw.max_upstream.unwrap_or(d.max_upstream),
        upstream_idle_timeout: raw
            .upstream_idle_timeout
            .map_or(d.upstream_idle_timeout, |t| t.0),
        upstream_read_timeout,
        tunnel_idle_timeout: raw
            .tunnel_idle_timeout
            .map_or(upstream_read_timeout, |t| t.0),
        upstream_protocol: match raw.upstream_protocol {
            None => d.upstream_protocol,
            Some(RawUpstreamProtocol::Http1) => UpstreamProtocol::Http1,
            Some(RawUpstreamProtocol::Http2) => UpstreamProtocol::Http2,
        },
        upstream_http1: match raw.upstream_http1 {
            None => d.upstream_http1,
            Some(RawUpstreamHttp1::Hyper) => UpstreamHttp1::Hyper,
            Some(RawUpstreamHttp1::Idemgate) => UpstreamHttp1::Idemgate,
        },
        client_send_timeout: raw
            .client_send_timeout
            .map_or(d.client_send_timeout, |t| t.0),
        linger: Linger {
            time: raw.lingering_time.map_or(d.linger.time, |t| t.0),
            timeout: raw.lingering_timeout.map_or(d.linger.timeout, |t| t.0),
            bytes: raw.lingering_bytes.map_or(d.linger.bytes, |b| b.0),
        },
        max_buffered,
        max_buffered_per_connection: raw
            .max_buffered_per_connection
            .map_or((max_buffered / PER_CONNECTION_SHARE).max(1), |b| {
                usize::try_from(b.0).unwrap_or(usize::MAX)
            }),
    };
    let zero = [
        ("max_client", c.max_client == 0),
        ("max_streams", c.max_streams == 0),
        ("max_upstream", c.max_upstream == 0),
        ("upstream_idle_timeout", c.upstream_idle_timeout.is_zero()),
        ("upstream_read_timeout", c.upstream_read_timeout.is_zero()),
        ("tunnel_idle_timeout", c.tunnel_idle_timeout.is_zero()),
        ("client_send_timeout", c.client_send_timeout.is_zero()),
        ("max_buffered", c.max_buffered == 0),
        (
            "max_buffered_per_connection",
            c.max_buffered_per_connection == 0,
        ),
    ];
    if let Some((key, _)) = zero.iter().find(|(_, is_zero)| *is_zero) {
        return Err(CompileError::new(
            format!("connections.{key}"),
            "must be above zero",
        ));
    }
    if c.max_buffered_per_connection > c.max_buffered {
        return Err(CompileError::new(
            "connections.max_buffered_per_connection",
            "must not exceed connections.max_buffered (equal: no share per connection)",
        ));
    }
    if c.upstream_http1 == UpstreamHttp1::Idemgate && c.upstream_protocol != UpstreamProtocol::Http1
    {
        return Err(CompileError::new(
            "connections.upstream_http1",
            "idemgate is an HTTP/1.1 client: it needs upstream_protocol: http1",
        ));
    }
    Ok(c)
}
