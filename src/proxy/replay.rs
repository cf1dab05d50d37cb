//! Replays: a stored answer sent again, with `Idempotent-Replayed: true`, and what it holds
//! of the buffer budget (`super::budget`) while it goes out.
//!
//! A replay's body is held until its client has read it, or leaves: as long as it likes,
//! when it reads slowly (within `client_send_timeout` per write). Whatever the record is,
//! a copy decoded from what Redis or SQL returned, a sealed record opened into a copy
//! (`store.encrypt`, whatever the store), or the memory store's own record in clear, the
//! replay may hold it past the store's bounds: a copy is this request's alone, and the
//! memory store evicts records when full (`when_full: evict`) and drops them at their
//! `ttl` while a replay still holds them. Without a charge, duplicates of a key whose
//! answer is `max_answer` bytes, or requests for many such keys, each on a stream whose
//! client reads nothing, would hold one each, on every stream of every connection. So a
//! replay is charged to the budget and its connection's share for its record before it is
//! opened, for as long as the replay's body is held: the charge rides inside the body
//! ([`super::budget::Charge::attach`]) and is given back when it is sent or dropped. A
//! replay without room is refused as a body without room is (`503 overloaded`): never run
//! again, never cut short.

use std::sync::Arc;

use http::{HeaderValue, Response};

use super::answer;
use super::body::{ProxyBody, OVERLOADED_RETRY_AFTER};
use super::budget::{Budget, Charge, ConnBuffers, Refusal, Short};
use crate::error::ProxyError;
use crate::key::Digest;
use crate::store::seal::KeyRing;
use crate::store::StoredResponse;

/// The header added to every replayed response.
pub static IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");

/// The replay of `stored`, found under the store key `key` and opened with `ring` if it is
/// sealed, its record charged to `budget` and the share of the connection `conn` counts
/// (see the [module docs](self)): refused with `503 overloaded` if it finds no room, with
/// the error of a record that does not open if it does not. `own`: what the request holds
/// of that share itself (its head), past which a replay alone on its connection may go.
pub fn charged(
    stored: StoredResponse,
    ring: Option<&KeyRing>,
    key: Digest,
    (budget, conn, own): (&Arc<Budget>, &Arc<ConnBuffers>, u64),
    what: Replaying,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (stored, charge) = open_charged(stored, ring, key, (budget, conn, own), what)?;
    Ok(with_charge(&stored, charge))
}

/// `stored` opened as [`charged`] opens it, with the charge that pays for the record it
/// holds, for [`with_charge`]: for a replay that also hands the record on (a key of an
/// earlier config, settled under the new key).
pub fn open_charged(
    stored: StoredResponse,
    ring: Option<&KeyRing>,
    key: Digest,
    (budget, conn, own): (&Arc<Budget>, &Arc<ConnBuffers>, u64),
    what: Replaying,
) -> Result<(StoredResponse, Charge), ProxyError> {
    // The record's size, before it is opened: a sealed record and the copy opening it
    // makes (no larger) are both alive only while it opens, a working copy as a
    // decryption's buffers are, so it is charged once. The record holds headers and
    // framing besides the body its owner's share fitted: a replay alone on its connection
    // may go past the share (the total still bounds it), or a record a little over it
    // would be refused on every retry, its answer lost.
    let mut charge = budget.charge(conn);
    charge
        .resize_alone(stored.size(), own)
        .map_err(|short| refused(budget, short, what))?;
    let stored = stored.open(ring, key).map_err(ProxyError::Unsealable)?;
    // What is left is the one record the body holds: the charge shrinks to it.
    charge.shrink_to(stored.size());
    Ok((stored, charge))
}

/// The stored answer with `Idempotent-Replayed: true`, its trailers (if any) after the
/// body, the body holding `charge` (what [`open_charged`] took for it) until it is sent or
/// dropped.
pub fn with_charge(stored: &StoredResponse, charge: Charge) -> Response<ProxyBody> {
    let (status, mut headers, body) = stored.parts();
    headers.insert(
        IDEMPOTENT_REPLAYED.clone(),
        HeaderValue::from_static("true"),
    );
    answer::whole(status, headers, charge.attach(body), stored.trailers())
}

/// What a replay sends again, which its refusal must tell its client truly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replaying {
    /// The answer the request ran to: a retry with the same key gets it, a new key would
    /// run the request again.
    Answer,
    /// A failure shared with the owner's waiters: the key is free, and a retry runs.
    Failure,
}

/// Counts a replay without room under `short`, and refuses it.
fn refused(budget: &Budget, short: Short, what: Replaying) -> ProxyError {
    budget.refused(Refusal::Replay, short);
    ProxyError::Overloaded {
        retry_after: OVERLOADED_RETRY_AFTER,
        short,
        replay: what == Replaying::Answer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused replay tells its client what a retry will meet: an answer the request ran
    /// to is there under the same key (a new key would run it again); a failure shared
    /// with the owner's waiters left its key free, so the retry runs, and nothing may say
    /// the request was executed.
    #[test]
    fn a_refusal_says_whether_the_request_ran() {
        let metrics = crate::metrics::Metrics::new();
        let budget = Budget::new(1024, 1024, metrics.buffers());
        let answer = refused(&budget, Short::Total, Replaying::Answer);
        assert!(answer.public_detail().contains("same key"));
        let failure = refused(&budget, Short::Total, Replaying::Failure);
        let detail = failure.public_detail();
        assert!(!detail.contains("was executed"), "{detail}");
        assert_eq!(failure.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    }
}
