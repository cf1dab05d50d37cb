//! Unprotected requests: streamed both ways without buffering, protocol upgrades
//! (WebSocket) spliced through once both sides agreed to switch ([`tunnel`]). A client that
//! stops sending its body, or an upstream that stops sending its answer's, is cut off after
//! a bounded gap, and a tunnel after a bounded silence or stall ([`Timeouts`]), or at
//! shutdown.

mod tunnel;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::body::{ProxyBody, RequestBody};
use super::headers::{strip_hop_by_hop, wants_upgrade};
use super::stopping::Stopping;
use super::upstream::{Hop, UpstreamBody, UpstreamClient};
use crate::error::ProxyError;

/// The bounds on one pass-through exchange.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Until the answer's head (`upstream_timeout`).
    pub head: Duration,
    /// Between two parts of the client's body (the body read timeout).
    pub client_gap: Duration,
    /// Between two parts of the answer's body (`connections.upstream_read_timeout`).
    pub upstream_gap: Duration,
    /// Without a byte either way on an upgraded connection, or with a write to one side
    /// waiting (`connections.tunnel_idle_timeout`).
    pub tunnel_idle: Duration,
}

/// Forwards `request` with its body streaming; the response streams back. `trusted_peer`:
/// the connection's peer is a trusted proxy, whose forwarded fields go on. A tunnel it
/// opens ends when `stopping` begins.
pub async fn forward(
    client: &UpstreamClient,
    mut request: Request<RequestBody>,
    conn: &super::ConnInfo,
    trusted_peer: bool,
    timeouts: Timeouts,
    stopping: &Arc<Stopping>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let upgrade = request.version() <= http::Version::HTTP_11 && wants_upgrade(request.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
    let (parts, body) = request.into_parts();
    let upstream_request =
        Request::from_parts(parts, body.into_proxy_body(Some(timeouts.client_gap)));
    let deadline = Instant::now() + timeouts.head;
    let mut response = client
        .send(
            upstream_request,
            conn,
            Hop {
                upgrade,
                trusted_peer,
            },
            deadline,
        )
        .await?;

    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            // The answer's fields go to the client; the rest of it (hyper's upgrade in its
            // extensions, the body holding the connection) to the splicing task.
            let mut answer = Response::new(ProxyBody::empty());
            *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            *answer.headers_mut() = std::mem::take(response.headers_mut());
            // The connection's task outlives the switch: it holds the connection's share
            // (its `max_client` slot) until the tunnel gives the socket back.
            let stopping = Arc::clone(stopping);
            tokio::spawn(async move {
                let (down, up) = tokio::join!(client_upgrade, UpstreamBody::upgraded(response));
                match (down, up) {
                    (Ok(down), Some(up)) => {
                        tunnel::splice(TokioIo::new(down), up, timeouts.tunnel_idle, &stopping)
                            .await;
                    }
                    (Err(e), _) => tracing::debug!(error = %e, "upgrade failed"),
                    (_, None) => tracing::debug!("the upstream's upgrade failed"),
                }
            });
            strip_hop_by_hop(answer.headers_mut(), true);
            return Ok(answer);
        }
    }
    let (mut parts, body) = response.into_parts();
    // `Trailer` is end-to-end (RFC 9110 §6.6.2): declared again, less what only a head
    // may carry, it has hyper send an HTTP/1.1 client that asked (`TE: trailers`) the
    // trailers that follow; HTTP/2 clients get them whether declared or not. Trailers an
    // upstream did not declare (an HTTP/2 one need not) come after the head went out,
    // too late to name, so an HTTP/1.1 client gets none of them.
    if let Some(trailers) = strip_hop_by_hop(&mut parts.headers, false).declared_trailers {
        parts.headers.insert(http::header::TRAILER, trailers);
    }
    Ok(Response::from_parts(
        parts,
        ProxyBody::upstream(body, Some(timeouts.upstream_gap)),
    ))
}
