//! Protected requests, as a fixed sequence of phases: buffer the body, derive the key,
//! claim it, then forward (owner), wait and replay (duplicate), or replay at once (done);
//! finally complete or release the claim.
//!
//! The owner's upstream call is [`Detachable`]: a client that disconnects does not cancel
//! it, so the answer is still stored for that client's retry.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Request, Response};

use super::body::{collect_bytes, read_limited, ProxyBody, RequestBody};
use super::detach::Detachable;
use super::headers::strip_hop_by_hop;
use super::upstream::UpstreamClient;
use crate::config::{InFlightMode, OnStoreError, Protected};
use crate::error::ProxyError;
use crate::key::{derive_key, DerivedKey, Digest, KeyError, KeySource, RequestView};
use crate::metrics::{Metrics, Outcome, RouteMetrics};
use crate::store::{Claim, ClaimMode, Lease, Store, StoredResponse};

/// The header added to every replayed response.
pub static IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");

/// `Retry-After` for a duplicate of a running request: most owners finish within a second,
/// and a sooner retry finds the replay; the lease only bounds owners that vanished.
const RETRY_AFTER_SECS: u64 = 1;

/// The owners running in this process right now, so a shutdown can wait for them and
/// then release the keys of those that did not finish within the drain time (retries on
/// other replicas can then run at once instead of after the lease).
///
/// Holding a claim here is two atomic operations. Which keys are still held at shutdown
/// the store says ([`Store::held_claims`]): only one that outlives the process (Redis)
/// has any, and it already keeps them, to renew their leases.
#[derive(Debug, Default)]
pub struct Owners {
    running: AtomicUsize,
    /// Set once a shutdown waits in [`Owners::finished`]; until then finishing owners
    /// notify no one (a notification takes a lock).
    draining: AtomicBool,
    changed: tokio::sync::Notify,
}

impl Owners {
    fn hold(self: &Arc<Self>) -> OwnedGuard {
        self.running.fetch_add(1, Ordering::SeqCst);
        OwnedGuard {
            owners: Arc::clone(self),
        }
    }

    /// How many claims are owned now.
    pub fn len(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Whether no claim is owned.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until every owner has finished, or `deadline`.
    pub async fn finished(&self, deadline: Instant) {
        // SeqCst on both sides: an owner finishing now either sees `draining` and notifies,
        // or finished before the count below is read.
        self.draining.store(true, Ordering::SeqCst);
        loop {
            let changed = self.changed.notified();
            if self.is_empty() {
                return;
            }
            if tokio::time::timeout_at(deadline.into(), changed)
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Releases every key still owned (fenced: a key completed meanwhile is left alone).
    /// Nothing to do on a store that ends with the process.
    pub async fn release_all(&self, store: &Store) -> usize {
        let mut released = 0;
        for (key, token) in store.held_claims() {
            if matches!(store.release(key, token).await, Ok(true)) {
                released += 1;
            }
        }
        released
    }
}

struct OwnedGuard {
    owners: Arc<Owners>,
}

impl Drop for OwnedGuard {
    fn drop(&mut self) {
        self.owners.running.fetch_sub(1, Ordering::SeqCst);
        if self.owners.draining.load(Ordering::SeqCst) {
            self.owners.changed.notify_waiters();
        }
    }
}

/// What the protected path needs from the proxy.
pub struct Context<'a> {
    /// The store keys are claimed in.
    pub store: &'a Store,
    /// The pooled upstream client.
    pub client: &'a UpstreamClient,
    /// The connection the request came on.
    pub conn: &'a super::Connection,
    /// Process-wide metrics (the in-flight gauge).
    pub metrics: &'a Arc<Metrics>,
    /// This route's metric handles.
    pub route_metrics: &'a Arc<RouteMetrics>,
    /// The keys this process owns.
    pub owners: &'a Arc<Owners>,
    /// How long the client may pause while sending the body.
    pub body_read_timeout: Duration,
}

/// What the access log and metrics learn about a protected request as it runs.
#[derive(Debug, Default, Clone, Copy)]
pub struct Report {
    /// How it ended; `None` until decided (errors decide it from the error).
    pub outcome: Option<Outcome>,
    /// The derived key, once there is one.
    pub key: Option<Digest>,
}

/// Runs the phases for one request on a protected route.
pub async fn handle(
    cx: Context<'_>,
    rule: &Arc<Protected>,
    request: Request<RequestBody>,
    report: &mut Report,
) -> Result<Response<ProxyBody>, ProxyError> {
    let policy = &rule.policy;
    let (parts, body) = request.into_parts();
    // Phase 1: buffer (bounded), then refuse stale or future timestamps before any store
    // work.
    let body = read_limited(&parts.headers, body, policy.max_body, cx.body_read_timeout).await?;
    if let Some(fresh) = &rule.fresh {
        super::fresh::check(fresh, &parts.headers, &body, std::time::SystemTime::now())?;
    }
    // Phase 2: derive the key.
    let view = RequestView {
        route: &rule.route,
        method: &parts.method,
        path: parts.uri.path(),
        query: parts.uri.query(),
        headers: &parts.headers,
        client_ip: Some(cx.conn.peer.ip()),
        client_cert: cx.conn.client_cert.as_ref().map(|d| &d.0[..]),
        body: &body,
    };
    let Some(DerivedKey { key, fingerprint }) = derive_key(&rule.key, &view, None)? else {
        report.outcome = Some(Outcome::Unkeyed);
        return forward_unprotected(&cx, parts, body, policy.upstream_timeout).await;
    };
    report.key = Some(key);

    // Phase 3: claim; a duplicate in wait mode claims again each time it is woken, until
    // wait_timeout after it first found the key in flight.
    // Token routes only start from an issued token; a failed attempt hands it back.
    let (mode, reissue) = match &rule.key.source {
        KeySource::Token(t) => (ClaimMode::IssuedOnly, Some(t.reissue_ttl)),
        _ => (ClaimMode::Any, None),
    };
    let mut waiting_since: Option<Instant> = None;
    let waited = |since: Option<Instant>| {
        if let Some(since) = since {
            cx.route_metrics.waited(since.elapsed());
        }
    };
    loop {
        let claim = match cx
            .store
            .claim_as(
                key,
                fingerprint,
                policy.lease,
                mode,
                policy.in_flight == InFlightMode::Wait,
            )
            .await
        {
            Ok(claim) => claim,
            Err(e) => {
                tracing::warn!(error = %e, "store failed during claim");
                waited(waiting_since);
                return match policy.on_store_error {
                    OnStoreError::FailClosed => Err(e.into()),
                    OnStoreError::FailOpen => {
                        report.outcome = Some(Outcome::FailOpen);
                        forward_unprotected(&cx, parts, body, policy.upstream_timeout).await
                    }
                };
            }
        };
        match claim {
            Claim::Owner(lease) => {
                waited(waiting_since);
                let (response, stored) =
                    execute(&cx, rule, lease, fingerprint, parts, body, reissue).await?;
                report.outcome = Some(if stored {
                    Outcome::Executed
                } else {
                    Outcome::Released
                });
                return Ok(response);
            }
            Claim::Done(stored) => {
                waited(waiting_since);
                report.outcome = Some(if waiting_since.is_some() {
                    Outcome::Waited
                } else {
                    Outcome::Replayed
                });
                return Ok(replay(&stored));
            }
            Claim::Mismatch => return Err(ProxyError::Mismatch),
            Claim::Unknown => return Err(KeyError::TokenInvalid.into()),
            Claim::InFlight(waiter) => {
                let in_flight = ProxyError::InFlight {
                    retry_after: RETRY_AFTER_SECS,
                };
                if policy.in_flight == InFlightMode::Reject {
                    return Err(in_flight);
                }
                let since = *waiting_since.get_or_insert_with(Instant::now);
                if !waiter.wait(since + policy.wait_timeout).await {
                    waited(waiting_since);
                    return Err(in_flight);
                }
            }
        }
    }
}

async fn forward_unprotected(
    cx: &Context<'_>,
    parts: Parts,
    body: Bytes,
    timeout: Duration,
) -> Result<Response<ProxyBody>, ProxyError> {
    let started = Instant::now();
    let answer = send_buffered(cx.client, parts, body, cx.conn, started + timeout).await;
    cx.route_metrics.upstream_latency(started.elapsed());
    Ok(answer?.into_response())
}

/// The owner's phase: forward, then complete or release. Not cancelled with the client's
/// request; returns the answer and whether it was stored.
async fn execute(
    cx: &Context<'_>,
    rule: &Arc<Protected>,
    lease: Lease,
    fingerprint: Digest,
    parts: Parts,
    body: Bytes,
    reissue: Option<Duration>,
) -> Result<(Response<ProxyBody>, bool), ProxyError> {
    let client = cx.client.clone();
    let rule = Arc::clone(rule);
    let conn = cx.conn.clone();
    let running = cx.metrics.owner_running();
    let owned = cx.owners.hold();
    let route_metrics = Arc::clone(cx.route_metrics);
    let owner = Detachable::new(async move {
        let _running = running;
        let _owned = owned;
        let policy = &rule.policy;
        let started = Instant::now();
        let deadline = started + policy.upstream_timeout;
        let answer = send_buffered(&client, parts, body, &conn, deadline).await;
        route_metrics.upstream_latency(started.elapsed());
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                release(lease, reissue).await;
                return Err(e);
            }
        };
        if !policy.replays(answer.status.as_u16()) {
            release(lease, reissue).await;
            return Ok((answer.into_response(), false));
        }
        // Stamped here, while the record is not shared: the store would copy it otherwise.
        let stored = StoredResponse::new(answer.status, &answer.headers, &answer.body)
            .with_fingerprint(fingerprint);
        let body = stored.body();
        let kept = match lease.complete(stored, policy.ttl).await {
            Ok(true) => true,
            Ok(false) => {
                tracing::warn!("claim was taken over before completion; answer not stored");
                false
            }
            Err(e) => {
                tracing::error!(error = %e, "could not store the answer");
                false
            }
        };
        Ok((BufferedAnswer { body, ..answer }.into_response(), kept))
    });
    match owner.await {
        Ok(result) => result,
        Err(_) => Err(ProxyError::UpstreamUnreachable(
            "the owner's upstream call panicked".into(),
        )),
    }
}

async fn release(lease: Lease, reissue: Option<Duration>) {
    if let Err(e) = lease.release_as(reissue).await {
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

/// Forwards a buffered request and reads the whole answer by `deadline` (one deadline for
/// head and body, on the connection's reusable timer; the caller's start time is reused,
/// one clock read less).
async fn send_buffered(
    client: &UpstreamClient,
    parts: Parts,
    body: Bytes,
    conn: &super::Connection,
    deadline: Instant,
) -> Result<BufferedAnswer, ProxyError> {
    let exchange = async {
        let response = client
            .send_untimed(
                Request::from_parts(parts, ProxyBody::full(body)),
                conn,
                false,
            )
            .await?;
        let (mut head, incoming) = response.into_parts();
        let body = collect_bytes(incoming)
            .await
            .map_err(|e| ProxyError::UpstreamUnreachable(e.to_string()))?;
        strip_hop_by_hop(&mut head.headers, false);
        Ok(BufferedAnswer {
            status: head.status,
            headers: head.headers,
            body,
        })
    };
    conn.upstream_timer
        .timeout_at(deadline, exchange)
        .await
        .unwrap_or(Err(ProxyError::UpstreamTimeout))
}

/// The stored answer with `Idempotent-Replayed: true`.
pub fn replay(stored: &StoredResponse) -> Response<ProxyBody> {
    let (status, mut headers, body) = stored.parts();
    let mut response = Response::new(ProxyBody::full(body));
    *response.status_mut() = status;
    headers.insert(
        IDEMPOTENT_REPLAYED.clone(),
        HeaderValue::from_static("true"),
    );
    *response.headers_mut() = headers;
    response
}
