//! The connection to the application: a keep-alive pool over HTTP/1.1 (TLS for `https://`
//! upstreams) spoken in the request's own task ([`http1`]), requests rewritten to origin
//! form, and failures turned into 502/504.

mod http1;
mod pool;

use std::sync::Arc;
use std::time::Duration;

use http::uri::Scheme;
use http::{HeaderValue, Request, Response};

use super::body::ProxyBody;
use super::headers::{connection_names_headers, strip_hop_by_hop, Forwarding};
use crate::config::Upstream;
use crate::error::ProxyError;
use http1::{Decoder, Framing, SendError, Written};
use pool::Pool;
pub use pool::{Upgraded, UpstreamBody};

/// A pooled client for one upstream origin.
#[derive(Debug, Clone)]
pub struct UpstreamClient {
    pool: Arc<Pool>,
    /// `host[:port]`, the `Host` of requests that arrive without one (HTTP/1.0).
    host: Option<HeaderValue>,
}

impl UpstreamClient {
    /// A client with a keep-alive pool to `upstream`.
    pub fn new(upstream: &Upstream) -> Self {
        let authority = &upstream.authority;
        let https = upstream.scheme == Scheme::HTTPS;
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = https.then(|| {
            upstream.tls.clone().unwrap_or_else(|| {
                // Config loading always sets roots for https; never trust nothing by accident.
                Arc::new(
                    rustls::ClientConfig::builder()
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth(),
                )
            })
        });
        Self {
            pool: Arc::new(Pool::new(authority.host(), port, tls)),
            host: HeaderValue::from_str(authority.as_str()).ok(),
        }
    }

    /// Sends a client's request on to the upstream and waits at most `timeout` for the
    /// answer head. The request goes out in origin form (what an HTTP/1.1 origin server
    /// expects) with its fields cleaned and `X-Forwarded-*` added
    /// ([`super::headers::write_forwarded_fields`]); `upgrade` forwards a protocol switch.
    /// The answer's body hands the connection back to the pool once read to its end.
    pub async fn send(
        &self,
        request: Request<ProxyBody>,
        conn: &super::Connection,
        upgrade: bool,
        timeout: Duration,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        let deadline = tokio::time::Instant::now().into_std() + timeout;
        conn.upstream_timer
            .timeout_at(deadline, self.send_untimed(request, conn, upgrade))
            .await
            .unwrap_or(Err(ProxyError::UpstreamTimeout))
    }

    /// [`UpstreamClient::send`] without a timeout, for a caller that bounds a longer
    /// exchange (head and body) with one timer.
    pub async fn send_untimed(
        &self,
        request: Request<ProxyBody>,
        conn: &super::Connection,
        upgrade: bool,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        let (mut parts, mut body) = request.into_parts();
        // The rare `Connection` that names other fields: remove those first.
        if connection_names_headers(&parts.headers) {
            strip_hop_by_hop(&mut parts.headers, upgrade);
        }
        let forwarding = Forwarding {
            client_ip: &conn.forwarded_for,
            proto: conn.proto(),
            upgrade,
        };
        // HTTP/2 clients name the host in `:authority`; an HTTP/1.0 client may name none,
        // and then the upstream's own is sent.
        let authority = parts.uri.authority();
        let fallback_host = || {
            authority
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
                .or_else(|| self.host.clone())
        };
        loop {
            let mut checkout = self.pool.checkout().await?;
            let written = checkout
                .conn
                .write_request(&parts, &forwarding, fallback_host, &mut body)
                .await;
            let head = match written {
                Ok(written) => {
                    let head = checkout.conn.read_head(&parts.method).await;
                    if written == Written::Answered {
                        // The upstream answered before the client finished sending: the
                        // answer goes out now, and the rest of the upload is read and
                        // dropped, so the client, still writing, gets to read it.
                        std::mem::replace(&mut body, ProxyBody::empty()).drain_in_background();
                    }
                    head
                }
                // Not a byte was written: a kept-alive connection the upstream closed while
                // it sat idle. Safe to send again, on another connection.
                Err(SendError::Unsent(_)) if checkout.reused => continue,
                Err(SendError::Unsent(e) | SendError::Io(e)) => Err(e),
                Err(SendError::Body(e)) => {
                    return Err(ProxyError::BodyRead(e.to_string()));
                }
            };
            let head = head.map_err(|e| {
                tracing::warn!(error = %e, "upstream request failed");
                ProxyError::UpstreamUnreachable(e.to_string())
            })?;
            let body = if head.framing == Framing::Upgrade {
                // After `101 Switching Protocols` the connection belongs to the upgrade.
                UpstreamBody::upgraded(checkout.conn)
            } else {
                let pool = head.keep_alive.then(|| Arc::clone(&self.pool));
                UpstreamBody::new(checkout.conn, Decoder::new(head.framing), pool)
            };
            return Ok(Response::from_parts(head.parts, body));
        }
    }
}
