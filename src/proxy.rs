//! The proxy pipeline. [`handler`] refuses what [`admission`] does not admit, matches the
//! route and picks a path: [`passthrough`] streams unprotected requests untouched;
//! [`protected`] runs the phases check the [`head`] → buffer → derive key → claim →
//! forward, wait or [`replay`] → complete or release. [`stopping`] tells the duplicates and owners' clients it holds when a
//! shutdown must have answered them.

pub mod admission;
pub mod answer;
pub mod body;
pub mod budget;
pub mod conn_share;
pub mod detach;
pub mod fresh;
pub mod handler;
pub mod head;
pub mod headers;
pub mod observe;
pub mod passthrough;
pub mod previous;
mod problem;
pub mod protected;
pub mod replay;
mod settlement;
pub mod stopping;
pub mod tokens;
mod unclaimed;
pub mod upstream;
pub mod upstream_timer;

pub use handler::{Proxy, Reloaded};

/// How a client connection reached the proxy.
#[derive(Debug, Clone)]
pub enum Transport {
    /// Plain TCP (`X-Forwarded-Proto: http`).
    Cleartext,
    /// TLS terminated here (`X-Forwarded-Proto: https`).
    Tls {
        /// SHA-256 of the client's certificate, on mutual-TLS connections.
        client_cert: Option<crate::key::Digest>,
    },
}

/// What the proxy knows about the client connection a request came on (not the socket
/// itself, which hyper owns).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The connecting peer.
    pub peer: std::net::SocketAddr,
    /// Cleartext or TLS, with the client certificate if one was presented.
    pub transport: Transport,
    /// The peer's IP as `X-Forwarded-For` writes it: formatted once per connection rather
    /// than once per request.
    pub forwarded_for: http::HeaderValue,
    /// The timer its requests' upstream timeouts take turns with.
    pub upstream_timer: upstream_timer::UpstreamTimer,
    /// Its slot under `connections.max_client` and its owners running, which outlive it
    /// when its client leaves ([`conn_share`]).
    pub share: std::sync::Arc<conn_share::ConnShare>,
}

impl ConnInfo {
    /// A connection from `peer` over `transport`.
    pub fn new(peer: std::net::SocketAddr, transport: Transport) -> Self {
        let forwarded_for = http::HeaderValue::try_from(peer.ip().to_string())
            .unwrap_or_else(|_| http::HeaderValue::from_static("unknown"));
        Self {
            peer,
            transport,
            forwarded_for,
            upstream_timer: upstream_timer::UpstreamTimer::default(),
            share: conn_share::ConnShare::unbounded(),
        }
    }

    /// The same connection, holding `share`.
    pub fn with_share(self, share: std::sync::Arc<conn_share::ConnShare>) -> Self {
        Self { share, ..self }
    }

    /// A cleartext connection from `peer`.
    pub fn cleartext(peer: std::net::SocketAddr) -> Self {
        Self::new(peer, Transport::Cleartext)
    }

    /// `http` or `https`, for `X-Forwarded-Proto`.
    pub fn proto(&self) -> &'static str {
        match self.transport {
            Transport::Cleartext => "http",
            Transport::Tls { .. } => "https",
        }
    }

    /// The SHA-256 of the client's certificate, on mutual-TLS connections.
    pub fn client_cert(&self) -> Option<&[u8]> {
        match &self.transport {
            Transport::Tls {
                client_cert: Some(digest),
            } => Some(&digest.0[..]),
            _ => None,
        }
    }
}
