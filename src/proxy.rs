//! The proxy pipeline. [`handler`] refuses what [`admission`] does not admit, matches the
//! route and picks a path: [`passthrough`] streams unprotected requests untouched;
//! [`protected`] runs the phases buffer → derive key → claim → forward, wait or replay →
//! complete or release.

pub mod admission;
pub mod answer;
pub mod body;
pub mod detach;
pub mod fresh;
pub mod handler;
pub mod headers;
pub mod observe;
pub mod passthrough;
mod problem;
pub mod protected;
pub mod tokens;
pub mod upstream;
pub mod upstream_timer;

pub use handler::Proxy;

/// What the proxy knows about the connection a request came on.
#[derive(Debug, Clone)]
pub struct Connection {
    /// The connecting peer.
    pub peer: std::net::SocketAddr,
    /// Whether TLS was terminated here (`X-Forwarded-Proto: https`).
    pub tls: bool,
    /// SHA-256 of the client's certificate, on mutual-TLS connections.
    pub client_cert: Option<crate::key::Digest>,
    /// The peer's IP as `X-Forwarded-For` writes it: formatted once per connection rather
    /// than once per request.
    pub forwarded_for: http::HeaderValue,
    /// The timer its requests' upstream timeouts take turns with.
    pub upstream_timer: upstream_timer::UpstreamTimer,
}

impl Connection {
    /// A connection from `peer`; `tls` and `client_cert` as the handshake left them.
    pub fn new(
        peer: std::net::SocketAddr,
        tls: bool,
        client_cert: Option<crate::key::Digest>,
    ) -> Self {
        let forwarded_for = http::HeaderValue::try_from(peer.ip().to_string())
            .unwrap_or_else(|_| http::HeaderValue::from_static("unknown"));
        Self {
            peer,
            tls,
            client_cert,
            forwarded_for,
            upstream_timer: upstream_timer::UpstreamTimer::default(),
        }
    }

    /// A cleartext connection from `peer`.
    pub fn plain(peer: std::net::SocketAddr) -> Self {
        Self::new(peer, false, None)
    }

    /// `http` or `https`, for `X-Forwarded-Proto`.
    pub fn proto(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }
}
