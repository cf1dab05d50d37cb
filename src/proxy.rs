//! The proxy pipeline. [`handler`] matches the route and picks a path: [`passthrough`]
//! streams unprotected requests untouched; [`protected`] runs the phases buffer → derive
//! key → claim → forward, wait or replay → complete or release.

pub mod body;
pub mod fresh;
pub mod handler;
pub mod headers;
pub mod passthrough;
pub mod protected;
pub mod tokens;
pub mod upstream;

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
}

impl Connection {
    /// A cleartext connection from `peer`.
    pub fn plain(peer: std::net::SocketAddr) -> Self {
        Self {
            peer,
            tls: false,
            client_cert: None,
        }
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
