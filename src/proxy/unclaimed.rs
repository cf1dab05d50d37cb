//! Requests forwarded with no claim, their answers read as an owner's are: buffered up to
//! `max_answer`, within `upstream_timeout`. For requests with no key material, a store that
//! failed under `fail_open`, and observed requests enforcement would not have run.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};

use super::answer;
use super::body::ProxyBody;
use super::protected::Context;
use super::upstream::timed_out;
use crate::error::ProxyError;

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

/// Forwards `request` with no claim and reads its answer as an owner's is read: buffered
/// up to `max_answer` (streaming past that), the whole exchange within `upstream_timeout`,
/// as an owner's client waits, so an upstream that never ends its answer (or the stream of
/// a 204 it sent on HTTP/2) holds the client no longer.
pub(super) async fn forward_whole(
    cx: &Context<'_>,
    request: Request<ProxyBody>,
    policy: &crate::config::Policy,
) -> Result<Response<ProxyBody>, ProxyError> {
    let started = Instant::now();
    let sending = AtomicBool::new(false);
    let exchange = async {
        let response = cx
            .client
            .send_untimed(request, cx.conn, cx.hop(), &sending)
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
        .unwrap_or_else(|| Err(timed_out(&sending)));
    cx.route_metrics.upstream_latency(started.elapsed());
    answer
}
