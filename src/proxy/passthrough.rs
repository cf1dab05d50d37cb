//! Unprotected requests: streamed both ways without buffering, protocol upgrades
//! (WebSocket) spliced through once both sides agreed to switch.

use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::body::{ProxyBody, RequestBody};
use super::headers::{strip_hop_by_hop, wants_upgrade};
use super::upstream::UpstreamClient;
use crate::error::ProxyError;

/// Forwards `request` with its body streaming; the response streams back.
pub async fn forward(
    client: &UpstreamClient,
    mut request: Request<RequestBody>,
    conn: &super::Connection,
    timeout: std::time::Duration,
) -> Result<Response<ProxyBody>, ProxyError> {
    let upgrade = request.version() <= http::Version::HTTP_11 && wants_upgrade(request.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
    let (parts, body) = request.into_parts();
    let upstream_request = Request::from_parts(parts, body.into_proxy_body());
    let response = client
        .send(upstream_request, conn, upgrade, timeout)
        .await?;

    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let (mut parts, body) = response.into_parts();
            if let Some(mut up) = body.into_upgraded() {
                tokio::spawn(async move {
                    match client_upgrade.await {
                        Ok(down) => {
                            let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(down), &mut up)
                                .await;
                        }
                        Err(e) => tracing::debug!(error = %e, "upgrade failed"),
                    }
                });
            }
            strip_hop_by_hop(&mut parts.headers, true);
            return Ok(Response::from_parts(parts, ProxyBody::empty()));
        }
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    Ok(Response::from_parts(parts, ProxyBody::upstream(body)))
}
