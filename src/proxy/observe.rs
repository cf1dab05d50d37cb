//! `idempotency: observe`: a dry run of enforcement. Every request is forwarded unchanged
//! (no hold, no replay, no 409, 413 or 422, the upstream's answer untouched), while its key
//! is derived, claimed and settled in the store exactly as enforcement would, so a switch
//! to `on` finds the records already there. What enforcement would have done to each
//! duplicate is counted (`idemgate_requests_total{outcome="would_…"}`), logged with the
//! route, the key's prefix and the age of its first request, and counted on the key
//! (`seen` in the admin API and `idemgate explain`).
//!
//! A team measures its duplicates this way before it turns enforcement on, as nginx's
//! `limit_req_dry_run` or a WAF's detection-only mode let one measure before blocking.

use std::sync::Arc;
use std::time::SystemTime;

use http::{Request, Response};

use super::answer::{self, AnswerBody};
use super::body::{BodyError, ProxyBody, RequestBody};
use super::protected::{caller_unnamed, claim_args, execute, request_view, Context, Report};
use super::unclaimed::{forward_after_failed_claim, forward_unprotected, forward_whole};
use crate::config::{InFlightMode, Protected};
use crate::error::ProxyError;
use crate::key::{derive_key, Derived, DerivedKey};
use crate::metrics::Outcome;
use crate::store::{Claim, ClaimArgs, ClaimFailure, StoreError};

/// Runs one request on an observed route.
pub async fn handle(
    cx: Context<'_>,
    rule: &Arc<Protected>,
    request: Request<RequestBody>,
    report: &mut Report,
) -> Result<Response<ProxyBody>, ProxyError> {
    let policy = &rule.policy;
    // Its head holds its room while its body comes and its owner runs, as an enforced
    // one's does; without room it goes on uncharged, as a body without room does: observe
    // mode refuses nothing.
    let _ = cx.head.take(super::budget::head_size(&request));
    let (parts, body) = request.into_parts();
    // Buffered up to max_body, as enforcement does; a larger body, or one the buffer budget
    // has no room for (enforcement would answer 503), goes on as it comes.
    let body = body.into_proxy_body(Some(cx.body_read_timeout));
    let conn = cx.conn.share.buffers();
    let body = match answer::bounded(body, policy.max_body, cx.budget, conn).await {
        Ok(AnswerBody::Whole(body)) => body,
        Ok(AnswerBody::TooLarge(body)) => {
            would(report, Outcome::WouldReject, false, None);
            // Forwarded as it comes; its answer read as an owner's is.
            return forward_whole(&cx, Request::from_parts(parts, body), policy).await;
        }
        Err(BodyError::ClientStalled(gap)) => return Err(ProxyError::BodyTimeout(gap.as_secs())),
        Err(e) => return Err(ProxyError::BodyRead(e.to_string())),
    };
    let stale = match &rule.fresh {
        Some(fresh) => {
            super::fresh::check(fresh, &parts.headers, &body, SystemTime::now()).is_err()
        }
        None => false,
    };
    let view = request_view(&cx, rule, &parts, &body);
    let (key, fingerprint) = match derive_key(&rule.key, &view, None) {
        _ if stale => {
            would(report, Outcome::WouldReject, false, None);
            return forward_unprotected(&cx, parts, body, policy).await;
        }
        Ok(Derived::Key(DerivedKey { key, fingerprint })) => (key, fingerprint),
        Ok(Derived::Unkeyed) => {
            report.outcome = Some(Outcome::Unkeyed);
            return forward_unprotected(&cx, parts, body, policy).await;
        }
        // Enforcement would claim nothing: neither would a dry run.
        Ok(Derived::CallerUnnamed) => {
            caller_unnamed(report);
            return forward_unprotected(&cx, parts, body, policy).await;
        }
        Err(_) => {
            would(report, Outcome::WouldReject, false, None);
            return forward_unprotected(&cx, parts, body, policy).await;
        }
    };
    report.key = Some(key);
    let span = tracing::Span::current();
    if !span.is_disabled() {
        span.record("key", tracing::field::display(key.short()));
    }
    // Enforcement would refuse it (`503 connection-busy`) before claiming: it goes out
    // unclaimed instead, and, not an owner, ends with its client (so resetting streams buys
    // no more upstream calls here than under enforcement).
    let Some(owning) = cx.conn.share.try_own() else {
        would(report, Outcome::WouldReject, false, None);
        return forward_unprotected(&cx, parts, body, policy).await;
    };
    let args = claim_args(&cx, rule, &view, key, fingerprint);
    // A dry run never holds a request: nobody waits, nothing is refused.
    let args = ClaimArgs {
        waits: false,
        ..args
    };
    let claim = match cx.store.claim_or_unanswered(args).await {
        Ok(claim) => claim,
        Err(ClaimFailure { error, unanswered }) => {
            match error {
                // A store refusing new keys is no outage: enforcement would answer 503 (or
                // 429 past the caller's or the address's share) whatever `on_store_error`
                // says.
                StoreError::Full
                | StoreError::CallerFull
                | StoreError::AddressFull
                | StoreError::Evicting(_) => would(report, Outcome::WouldReject, false, None),
                e => {
                    tracing::warn!(route = %rule.route, error = %e, "store failed during an observed claim; forwarded");
                    report.outcome = Some(Outcome::FailOpen);
                }
            }
            // It goes out whatever the store said, so a claim the store may have written
            // all the same (an outage, or one after the key was found taken and then taken
            // over) is kept if it was sent, as it stands for a request that ran, and
            // released if it certainly was not (`store::unanswered`).
            return forward_after_failed_claim(&cx, parts, body, policy, unanswered).await;
        }
    };
    let would_do = match claim {
        Claim::Owner(lease) => {
            let (response, outcome) =
                execute(&cx, rule, lease, Vec::new(), owning, parts, body).await?;
            report.outcome = Some(outcome);
            return Ok(response);
        }
        Claim::Done(_) | Claim::Failed(_) => Outcome::WouldReplay,
        // Its first request still runs: enforcement would refuse it, or hold it and answer
        // from an outcome not known yet (so neither a replay nor a 409 is counted).
        Claim::InFlight(_) if policy.in_flight == InFlightMode::Reject => Outcome::WouldConflict,
        Claim::InFlight(_) => Outcome::WouldWait,
        Claim::Mismatch => Outcome::WouldMismatch,
        Claim::OutcomeUnknown(_) | Claim::NotStored(_) => Outcome::WouldHold,
        Claim::NotIssued => Outcome::WouldReject,
    };
    // Not an owner: forwarded as any request, it ends with its client.
    drop(owning);
    let first = match cx.store.saw_duplicate(key).await {
        Ok(made) => made,
        Err(e) => {
            tracing::warn!(route = %rule.route, error = %e, "could not count an observed duplicate");
            None
        }
    };
    would(report, would_do, true, first);
    forward_unprotected(&cx, parts, body, policy).await
}

/// Records what enforcement would have done: the request's outcome, and for a `duplicate`
/// a log line with the age of its first request (its route and key prefix come with the
/// request's span).
fn would(report: &mut Report, outcome: Outcome, duplicate: bool, first: Option<SystemTime>) {
    report.outcome = Some(outcome);
    if duplicate {
        let age_ms = first
            .and_then(|at| SystemTime::now().duration_since(at).ok())
            .map(|age| age.as_millis() as u64);
        tracing::info!(
            would = %outcome.as_str(),
            first_age_ms = age_ms,
            "observed a duplicate"
        );
    }
}
