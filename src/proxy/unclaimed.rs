//! Requests forwarded with no claim, their answers read as an owner's are: buffered up to
//! `max_answer`, within `upstream_timeout`. For requests with no key material, a store that
//! failed under `fail_open`, and observed requests enforcement would not have run. One
//! whose claim failed may leave that claim behind: it is kept if the request may have gone
//! out, released if it certainly did not ([`forward_after_failed_claim`]).

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};

use super::answer;
use super::body::ProxyBody;
use super::protected::Context;
use super::upstream::timed_out;
use crate::config::OnStoreError;
use crate::error::ProxyError;
use crate::store::{StoreError, UnansweredClaim};

/// Forwards a buffered request with no claim (no key material, or a store that failed
/// with `fail_open`); its answer is buffered up to `max_answer`, as an owner's, and streams
/// past that.
pub(super) async fn forward_unprotected(
    cx: &Context<'_>,
    parts: Parts,
    body: Bytes,
    policy: &crate::config::Policy,
) -> Result<Response<ProxyBody>, ProxyError> {
    forward_whole(
        cx,
        Request::from_parts(parts, ProxyBody::full(body)),
        policy,
    )
    .await
}

/// Whether a protected request whose claim failed with `error` goes out all the same: with
/// `fail_open`, when the store could not say whether the key is taken, unless it `waited`
/// on an owner (any failure after the key was found in flight is answered, never
/// forwarded: the request may duplicate a running one; so is a store refusing new keys, or
/// an unreadable record).
pub(super) fn fails_open(policy: &crate::config::Policy, waited: bool, error: &StoreError) -> bool {
    policy.on_store_error == OnStoreError::FailOpen
        && !waited
        && matches!(error, StoreError::Unavailable(_))
}

/// [`forward_unprotected`] for a request whose claim failed, leaving `unanswered` (the
/// claim the store may have written all the same): whether that claim is kept is decided
/// by whether the request was handed to a connection, known only once the forward has
/// gone that far, so it is dropped after the forward (or with it, if the forward is
/// dropped): kept if the request may have gone out, as a retry must then not run it again;
/// released if it certainly did not (an upstream refusing the connection), so a retry is
/// not refused for a request never sent.
pub(super) async fn forward_after_failed_claim(
    cx: &Context<'_>,
    parts: Parts,
    body: Bytes,
    policy: &crate::config::Policy,
    unanswered: Option<Box<UnansweredClaim>>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let unclaimed = AtomicBool::new(false);
    let sending = unanswered
        .as_ref()
        .map_or(&unclaimed, |claim| claim.sending());
    let request = Request::from_parts(parts, ProxyBody::full(body));
    forward_marking(cx, request, policy, sending).await
}

/// Forwards `request` with no claim and reads its answer as an owner's is read: buffered
/// up to `max_answer` (streaming past that), the whole exchange within `upstream_timeout`,
/// as an owner's client waits, so an upstream that never ends its answer (or the stream of
/// a 204 it sent on HTTP/2) holds the client no longer.
pub(super) async fn forward_whole(
    cx: &Context<'_>,
    request: Request<ProxyBody>,
    policy: &crate::config::Policy,
) -> Result<Response<ProxyBody>, ProxyError> {
    forward_marking(cx, request, policy, &AtomicBool::new(false)).await
}

/// [`forward_whole`], setting `sending` once the request is handed to a connection.
async fn forward_marking(
    cx: &Context<'_>,
    request: Request<ProxyBody>,
    policy: &crate::config::Policy,
    sending: &AtomicBool,
) -> Result<Response<ProxyBody>, ProxyError> {
    let started = Instant::now();
    let exchange = async {
        let response = cx
            .client
            .send_untimed(request, cx.conn, cx.hop(), sending)
            .await?;
        let conn = cx.conn.share.buffers();
        Ok(answer::read(response, policy.max_answer, cx.budget, conn)
            .await?
            .into_response())
    };
    let answer = cx
        .conn
        .upstream_timer
        .timeout_at(started + policy.upstream_timeout, exchange)
        .await
        .unwrap_or_else(|| Err(timed_out(sending)));
    // The client's word that nothing went out, as an owner's settlement takes it: it may
    // have handed the request to a connection that gave it back unsent, or whose streams
    // were all refused, so the claim a failed store left is released, not kept.
    if matches!(answer, Err(ProxyError::UpstreamUnreachable(_))) {
        sending.store(false, std::sync::atomic::Ordering::Relaxed);
    }
    cx.route_metrics.upstream_latency(started.elapsed());
    answer
}
