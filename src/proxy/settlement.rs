//! How an owner settles its key with what the upstream answered: the answer stored (sealed
//! under `store.encrypt`) for the route's `ttl`, a failure shared with the waiters for a
//! moment and the key freed, an unknown outcome held, or "executed, answer not stored".
//! The keys earlier configs gave the request, held beside it, are settled the same way
//! ([`super::previous::arm_earlier`]).
//!
//! The client is answered from a copy of the answer that lives until it has read it, as
//! slowly as it likes: a replay's copy does (see [`super::replay`]). Wherever the record
//! is kept (sent to Redis or SQL, sealed, not kept, a failure record that lingers only a
//! moment, or the memory store's own record in clear, which it evicts when full and drops
//! at its `ttl` while the client still holds it), that copy may outlive every bound: one
//! client sending requests with distinct keys on streams it never reads would hold
//! `max_answer` per stream. So the charge the answer's buffer took from the budget and its
//! connection's share goes on to that copy, held until its body is sent or dropped: kept,
//! never taken again, so an answer the request ran to is never refused after the fact.

use std::time::{Duration, SystemTime};

use http::Response;

use super::answer::{Answer, AnswerBody};
use super::body::ProxyBody;
use super::previous::{arm_earlier, settle_armed, Earlier};
use crate::config::OnUnknownOutcome;
use crate::error::ProxyError;
use crate::key::Digest;
use crate::metrics::{Outcome, RouteMetrics};
use crate::store::seal::KeyRing;
use crate::store::{Armed, Lease, Settled, Settlement, StoredResponse};

/// How long the duplicates that waited on a failed owner have to collect its failure
/// before the key is free for anyone: they are woken at once, or within a second on Redis
/// when a notification was missed.
const FAILURE_LINGER: Duration = Duration::from_secs(5);

/// Settles the owner's key with what the upstream answered, and the keys earlier configs
/// gave the request (`also`) alike; returns the client's answer with the request's outcome.
pub(super) async fn settle(
    lease: Lease,
    also: Vec<Earlier>,
    policy: &crate::config::Policy,
    sealing: Option<&KeyRing>,
    route_metrics: &RouteMetrics,
    answer: Result<Answer, ProxyError>,
) -> Result<(Response<ProxyBody>, Outcome), ProxyError> {
    let fingerprint = lease.fingerprint();
    let reissue = lease.reissue();
    let owner = Owner {
        lease,
        sealing,
        also,
    };
    let mut answer = match answer {
        Ok(answer) => answer,
        // Never sent: free for a retry; waiters share the 502.
        Err(e @ ProxyError::UpstreamUnreachable(_)) => {
            let failed = failure(stored_problem(&e, fingerprint), reissue);
            owner.write(failed).await;
            return Err(e);
        }
        // Sent, and no answer: the request may have run.
        Err(e) => {
            let settlement = match policy.on_unknown_outcome {
                OnUnknownOutcome::Hold => {
                    route_metrics.unknown_outcome();
                    tracing::warn!(error = %e, "upstream failed after the request went out: outcome unknown, key held");
                    Settlement::Unknown { ttl: policy.ttl }
                }
                OnUnknownOutcome::Release => failure(stored_problem(&e, fingerprint), reissue),
            };
            owner.write(settlement).await;
            return Err(e);
        }
    };
    let status = answer.status;
    // An answer neither replayed nor shared with the waiters of a failure (a `3xx` with the
    // default list), like one over `max_answer`, leaves only the record that the request
    // ran: no copy of it is made, let alone sealed.
    let kept = policy.replays(status.as_u16()) || policy.releases(status.as_u16());
    let body = match answer.body {
        // Taken out, so the answer's buffer is freed as soon as the record holds its copy;
        // its charge stays in `answer` until the client's answer takes it.
        AnswerBody::Whole(ref mut body) if kept => std::mem::take(body),
        // A failure says the work was not done, however long its page: its key is freed as
        // for one within the bound (recorded "executed", its retry would be refused for the
        // whole `ttl`); the duplicates that waited are told it failed, by a failure record
        // of their own: a key merely freed would look, to a waiter that saw its owner's
        // claim lapse meanwhile, like a lapsed claim it may take over.
        AnswerBody::TooLarge(_) if policy.releases(status.as_u16()) => {
            let told = stored_problem(&ProxyError::OwnerFailed, fingerprint);
            owner.write(failure(told, reissue)).await;
            return Ok((answer.into_response(), Outcome::Released));
        }
        AnswerBody::Whole(_) | AnswerBody::TooLarge(_) => {
            let settlement = Settlement::NotStored {
                status,
                ttl: policy.ttl,
            };
            owner.write(settlement).await;
            return Ok((answer.into_response(), Outcome::ExecutedNotStored));
        }
    };
    // Stamped while the record is this function's alone: in place, where the store, once
    // the client's answer shares the record, would have to copy it.
    let trailers = answer.trailers.as_ref();
    let stored = StoredResponse::with_trailers(status, &answer.headers, &body, trailers)
        .with_fingerprint(fingerprint);
    drop(body);
    // The client is answered from the record in clear (the store may keep a sealed one).
    let client = stored.clone();
    if policy.releases(status.as_u16()) {
        // The store keeps a failure a moment for the waiters: the client's copy outlives it.
        owner.write(failure(stored, reissue)).await;
        return Ok((answered(answer, &client), Outcome::Released));
    }
    let settled = owner
        .write(Settlement::Done {
            response: stored,
            ttl: policy.ttl,
        })
        .await;
    let outcome = match settled {
        Some(Settled::Written | Settled::WrittenBack) => Outcome::Executed,
        Some(Settled::AnswerNotKept | Settled::NotWritten) => Outcome::ExecutedNotStored,
        // Not settled: the claim lapses by its lease, as an unknown outcome when held.
        None => Outcome::Unknown,
    };
    Ok((answered(answer, &client), outcome))
}

/// The client's answer from `record` (the answer's copy in clear), with the headers and
/// trailers of `answer`, its body holding the charge `answer` took for its buffer. The
/// charge is kept, never taken again, so it cannot fail: only what it held past the
/// record's size is given back.
fn answered(mut answer: Answer, record: &StoredResponse) -> Response<ProxyBody> {
    let mut charge = std::mem::take(&mut answer.charge);
    charge.shrink_to(record.size());
    Answer {
        body: AnswerBody::Whole(record.body()),
        charge,
        ..answer
    }
    .into_response()
}

/// What the owner's waiters get when it failed; a one-time token goes back to issued.
fn failure(response: StoredResponse, reissue: Option<SystemTime>) -> Settlement {
    Settlement::Failed {
        response,
        linger: FAILURE_LINGER,
        reissue,
    }
}

/// The proxy's own problem answer for `error`, as a record waiters can be answered from
/// (sealed, when it is written, like an upstream answer, so a ring that refuses records in
/// clear still shares it).
fn stored_problem(error: &ProxyError, fingerprint: Digest) -> StoredResponse {
    let (status, headers, body) = error.problem_parts();
    StoredResponse::new(status, &headers, &body).with_fingerprint(fingerprint)
}

/// The owner's lease with what its settlement is written with.
struct Owner<'a> {
    lease: Lease,
    /// The route's ring (`store.encrypt`).
    sealing: Option<&'a KeyRing>,
    /// The keys earlier configs gave the request, settled before the owner's.
    also: Vec<Earlier>,
}

impl Owner<'_> {
    /// Writes `plain` (its record stamped with the owner's fingerprint, not sealed) as each
    /// earlier key's settlement, then as the owner's. Earlier keys first: a request that
    /// finds the owner's key settled and claims it finds them settled too, so whoever
    /// waits on an earlier key waited on a request keyed before the reload, and takes its
    /// outcome as a duplicate does (`previous::claim_one`).
    ///
    /// Every lease is armed with its settlement before the first wait: the earlier keys'
    /// writes may take up to the store's timeout each, and a detached owner is dropped at
    /// its `background_timeout` wherever it waits. Dropped so, a lease not yet written
    /// would record what its drop knows (the request went out: an unknown outcome, or a
    /// release) over the answer in hand; armed, it makes that answer in the background, as
    /// the write cut short is made again. Those are then made together, in no set order:
    /// the owner's key may be settled first. Harmless: an answer (or an outcome refused
    /// as unknown or not stored) under the owner's key is all its requests ever look at,
    /// and a failure or release freeing it lets a retry claim the earlier key, still
    /// pending, only to wait on it and share the same failure (see `previous::claim_one`).
    async fn write(self, plain: Settlement) -> Option<Settled> {
        let (key, fingerprint) = (self.lease.key(), self.lease.fingerprint());
        if self.also.is_empty() {
            return write(
                self.lease
                    .armed(for_key(plain, fingerprint, self.sealing, key)),
            )
            .await;
        }
        let earlier = arm_earlier(self.also, &plain);
        let own = self
            .lease
            .armed(for_key(plain, fingerprint, self.sealing, key));
        settle_armed(earlier).await;
        write(own).await
    }
}

/// `plain` as the settlement of the claim of `key` and `fingerprint`: the record it holds
/// (an answer, or what a failure's waiters get) stamped with that fingerprint, then sealed
/// for `key` when `sealing` is set (the seal binds both).
pub(super) fn for_key(
    plain: Settlement,
    fingerprint: Digest,
    sealing: Option<&KeyRing>,
    key: Digest,
) -> Settlement {
    let record = |stored: StoredResponse| {
        let stored = stored.with_fingerprint(fingerprint);
        match sealing {
            Some(ring) => stored.seal(ring, key),
            None => stored,
        }
    };
    match plain {
        Settlement::Done { response, ttl } => Settlement::Done {
            response: record(response),
            ttl,
        },
        Settlement::Failed {
            response,
            linger,
            reissue,
        } => Settlement::Failed {
            response: record(response),
            linger,
            reissue,
        },
        other => other,
    }
}

/// Settles the lease with what it was armed with; a store failure is logged, and the
/// lease makes the settlement again in the background while the claim's record lasts (see
/// `Lease::settle`).
async fn write(lease: Armed) -> Option<Settled> {
    let what = lease.settlement().as_str();
    match lease.settle().await {
        Ok(Settled::NotWritten) => {
            tracing::warn!(
                settled = what,
                "another owner holds the key; outcome not written"
            );
            Some(Settled::NotWritten)
        }
        Ok(Settled::AnswerNotKept) => {
            tracing::warn!(
                "answer too large for the store: recorded as executed, answer not stored"
            );
            Some(Settled::AnswerNotKept)
        }
        Ok(settled) => Some(settled),
        Err(e) => {
            tracing::error!(
                settled = what,
                error = %e,
                "could not settle the claim; retrying in the background while its record lasts"
            );
            None
        }
    }
}
