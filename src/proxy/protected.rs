//! Protected requests, as a fixed sequence of phases: buffer the body, derive the key,
//! claim it, then forward (owner), wait and replay (duplicate), or replay at once (done);
//! finally complete or release the claim.
//!
//! The owner's upstream call runs in its own task: a client that disconnects does not
//! cancel it, so the answer is still stored for that client's retry.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::body::{read_limited, ProxyBody};
use super::headers::{prepare_request, strip_hop_by_hop};
use super::upstream::UpstreamClient;
use crate::config::{InFlightMode, OnStoreError, Protected};
use crate::error::ProxyError;
use crate::key::{derive_key, DerivedKey, RequestView};
use crate::store::{Claim, Lease, Store, StoredResponse};

/// The header added to every replayed response.
pub static IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");

/// How a protected request ended, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// This request owned the key and ran upstream.
    Executed,
    /// A stored response was replayed at once.
    Replayed,
    /// The request waited for an in-flight duplicate, then got its replay.
    Waited,
    /// No key material and none required: forwarded unprotected.
    Unkeyed,
    /// The store failed and the route fails open: forwarded unprotected.
    FailOpen,
}

impl Outcome {
    /// Label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::Waited => "waited",
            Self::Unkeyed => "unkeyed",
            Self::FailOpen => "fail_open",
        }
    }
}

/// What the protected path needs from the proxy.
pub struct Context<'a> {
    /// The store keys are claimed in.
    pub store: &'a Store,
    /// The pooled upstream client.
    pub client: &'a UpstreamClient,
    /// The connecting peer.
    pub peer: SocketAddr,
}

/// Runs the phases for one request on a protected route.
pub async fn handle(
    cx: Context<'_>,
    rule: &Arc<Protected>,
    request: Request<Incoming>,
) -> Result<(Response<ProxyBody>, Outcome), ProxyError> {
    let policy = &rule.policy;
    let (parts, body) = request.into_parts();
    // Phase 1: buffer (bounded).
    let body = read_limited(&parts.headers, body, policy.max_body).await?;
    // Phase 2: derive the key.
    let view = RequestView {
        route: &rule.route,
        method: &parts.method,
        path: parts.uri.path(),
        query: parts.uri.query(),
        headers: &parts.headers,
        client_ip: Some(cx.peer.ip()),
        body: &body,
    };
    let Some(DerivedKey { key, fingerprint }) = derive_key(&rule.key, &view, None)? else {
        let response = send_buffered(cx.client, parts, body, cx.peer, policy.upstream_timeout)
            .await?
            .into_response();
        return Ok((response, Outcome::Unkeyed));
    };
    let span = tracing::Span::current();
    if !span.is_disabled() {
        span.record("key", tracing::field::display(key.short()));
    }

    // Phase 3: claim; a duplicate in wait mode claims again each time it is woken.
    let deadline = Instant::now() + policy.wait_timeout;
    let mut waited = false;
    loop {
        let claim = match cx.store.claim(key, fingerprint, policy.lease).await {
            Ok(claim) => claim,
            Err(e) => {
                tracing::warn!(error = %e, "store failed during claim");
                return match policy.on_store_error {
                    OnStoreError::FailClosed => Err(e.into()),
                    OnStoreError::FailOpen => {
                        let answer =
                            send_buffered(cx.client, parts, body, cx.peer, policy.upstream_timeout)
                                .await?;
                        Ok((answer.into_response(), Outcome::FailOpen))
                    }
                };
            }
        };
        match claim {
            Claim::Owner(lease) => {
                let response = execute(cx, rule, lease, parts, body).await?;
                return Ok((response, Outcome::Executed));
            }
            Claim::Done(stored) => {
                let outcome = if waited {
                    Outcome::Waited
                } else {
                    Outcome::Replayed
                };
                return Ok((replay(&stored), outcome));
            }
            Claim::Mismatch => return Err(ProxyError::Mismatch),
            Claim::InFlight(waiter) => {
                let retry_after = RETRY_AFTER_SECS;
                if policy.in_flight == InFlightMode::Reject {
                    return Err(ProxyError::InFlight { retry_after });
                }
                waited = true;
                if !waiter.wait(deadline).await {
                    return Err(ProxyError::InFlight { retry_after });
                }
            }
        }
    }
}

/// `Retry-After` for a duplicate of a running request: most owners finish within a second,
/// and a sooner retry finds the replay; the lease only bounds owners that vanished.
const RETRY_AFTER_SECS: u64 = 1;

/// The owner's phase: forward, then complete or release. Runs detached from the client.
async fn execute(
    cx: Context<'_>,
    rule: &Arc<Protected>,
    lease: Lease,
    parts: Parts,
    body: Bytes,
) -> Result<Response<ProxyBody>, ProxyError> {
    let client = cx.client.clone();
    let rule = Arc::clone(rule);
    let peer = cx.peer;
    let task = tokio::spawn(async move {
        let policy = &rule.policy;
        let answer = match send_buffered(&client, parts, body, peer, policy.upstream_timeout).await
        {
            Ok(answer) => answer,
            Err(e) => {
                release(lease).await;
                return Err(e);
            }
        };
        if !policy.replays(answer.status.as_u16()) {
            release(lease).await;
            return Ok(answer.into_response());
        }
        let stored = StoredResponse::new(answer.status, &answer.headers, &answer.body);
        let body = stored.body().clone();
        match lease.complete(stored, policy.ttl).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!("claim was taken over before completion; answer not stored")
            }
            Err(e) => tracing::error!(error = %e, "could not store the answer"),
        }
        Ok(BufferedAnswer { body, ..answer }.into_response())
    });
    match task.await {
        Ok(result) => result,
        Err(e) => Err(ProxyError::UpstreamUnreachable(format!(
            "owner task failed: {e}"
        ))),
    }
}

async fn release(lease: Lease) {
    if let Err(e) = lease.release().await {
        tracing::warn!(error = %e, "could not release the claim");
    }
}

/// A fully read upstream answer.
struct BufferedAnswer {
    status: http::StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl BufferedAnswer {
    fn into_response(self) -> Response<ProxyBody> {
        let mut response = Response::new(ProxyBody::full(self.body));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers;
        response
    }
}

/// Forwards a buffered request and reads the whole answer within `timeout`.
async fn send_buffered(
    client: &UpstreamClient,
    mut parts: Parts,
    body: Bytes,
    peer: SocketAddr,
    timeout: Duration,
) -> Result<BufferedAnswer, ProxyError> {
    let started = Instant::now();
    parts.uri = {
        let uri = client.uri_for(parts.uri.path_and_query())?;
        let original = std::mem::replace(&mut parts.uri, uri);
        prepare_request(
            &mut parts.headers,
            original.authority(),
            peer.ip(),
            "http",
            false,
        );
        parts.uri
    };
    parts.version = http::Version::HTTP_11;
    let response = client
        .send(Request::from_parts(parts, ProxyBody::full(body)), timeout)
        .await?;
    let (mut head, incoming) = response.into_parts();
    let remaining = timeout.saturating_sub(started.elapsed());
    let body = match tokio::time::timeout(remaining, incoming.collect()).await {
        Err(_) => return Err(ProxyError::UpstreamTimeout),
        Ok(Err(e)) => return Err(ProxyError::UpstreamUnreachable(e.to_string())),
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    strip_hop_by_hop(&mut head.headers, false);
    Ok(BufferedAnswer {
        status: head.status,
        headers: head.headers,
        body,
    })
}

/// The stored answer with `Idempotent-Replayed: true`.
pub fn replay(stored: &StoredResponse) -> Response<ProxyBody> {
    let mut response = Response::new(ProxyBody::full(stored.body().clone()));
    *response.status_mut() = stored.status();
    let mut headers = stored.headers();
    headers.insert(
        IDEMPOTENT_REPLAYED.clone(),
        HeaderValue::from_static("true"),
    );
    *response.headers_mut() = headers;
    response
}
