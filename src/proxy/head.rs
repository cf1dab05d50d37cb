//! The first phase of a protected request: what its head alone decides is refused before
//! its body is read. A declared length over `max_body`, buffers that already hold their
//! share (the connection's or the proxy's), and, when the body is not on its way yet
//! ([`Announced`]), a stale `fresh:` header or a client key or token the route would refuse
//! whatever the body.
//!
//! Refused here, the body is never polled, and hyper writes `100 Continue` only when a
//! request's body is first polled: a client that sent `Expect: 100-continue` gets the
//! final answer instead and never sends the body (RFC 9110 §10.1.1), as nginx and Envoy
//! answer such a head. hyper then reads no part of the unread body as a request: it closes
//! the connection after the answer, which says so (`Connection: close`, see
//! [`super::handler`]), and the server closes it lingering ([`crate::server::linger`]).
//!
//! A client that sends its body unasked has it read first (at most `max_body`) before a
//! key or freshness refusal: answered earlier, its connection would have to close, since
//! the rest of the body stands before its next request. Reading it keeps the connection.
//!
//! Every check is a pure function of the head, the clock and the buffer counts: nothing is
//! claimed in the store, and a request refused here leaves its key as free as it found it.

use std::sync::Arc;
use std::time::SystemTime;

use http::HeaderMap;

use super::budget::{Budget, ConnBuffers, HeadCharge, Refusal};
use super::fresh;
use crate::config::{FreshSource, Protected};
use crate::error::ProxyError;

/// Where a request's body is when its head has arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announced {
    /// It has none (or an empty one): nothing is left to read.
    Nothing,
    /// The client waits for `100 Continue` before it sends it.
    Waiting,
    /// It is on its way, or has arrived.
    Sent,
}

impl Announced {
    /// What a head with `headers` announces; `empty`: hyper knows the body is empty.
    pub fn of(headers: &HeaderMap, empty: bool) -> Self {
        let expects = |v: &http::HeaderValue| v.as_bytes().eq_ignore_ascii_case(b"100-continue");
        if empty {
            Self::Nothing
        } else if headers.get(http::header::EXPECT).is_some_and(expects) {
            Self::Waiting
        } else {
            Self::Sent
        }
    }
}

/// The refusal of a request on `rule` with `headers`, whose body is `announced`, that its
/// body cannot change, if any; see the [module docs](self) for which are looked at when.
pub fn refusal(
    rule: &Protected,
    headers: &HeaderMap,
    announced: Announced,
    budget: &Budget,
    conn: &Arc<ConnBuffers>,
) -> Result<(), ProxyError> {
    let limit = rule.policy.max_body;
    if declared_length(headers).is_some_and(|len| len > limit as u64) {
        return Err(ProxyError::PayloadTooLarge { limit });
    }
    if announced != Announced::Sent {
        head_alone(rule, headers)?;
    }
    // Looked at last: a request its head refuses anyway gets that answer, which a retry
    // cannot change, rather than a 503 that asks it to come back. The first part of a body
    // sent unasked would be refused the same.
    if announced != Announced::Nothing {
        if let Some(short) = budget.full(conn) {
            budget.refused(Refusal::RequestBody, short);
            return Err(ProxyError::Overloaded {
                retry_after: super::body::OVERLOADED_RETRY_AFTER,
                short,
                replay: false,
            });
        }
    }
    Ok(())
}

/// What the head alone refuses: a stale or future timestamp in a header, a missing or
/// malformed key.
fn head_alone(rule: &Protected, headers: &HeaderMap) -> Result<(), ProxyError> {
    if let Some(window) = rule.fresh.as_ref().filter(|w| reads_head(w)) {
        fresh::check(window, headers, &[], SystemTime::now())?;
    }
    crate::key::head_refusal(&rule.key, headers)?;
    Ok(())
}

/// Takes `size` bytes of the budget for the request's head into `head`, or refuses the
/// request as a body without room is: `503 overloaded`, counted as a head's refusal. A
/// request its head refuses anyway gets that answer instead, even one whose body was sent
/// unasked (whose key [`refusal`] leaves for after the body, to keep the connection): a
/// retry cannot change it.
pub fn take_room(
    head: &HeadCharge<'_>,
    size: usize,
    budget: &Budget,
    rule: &Protected,
    headers: &HeaderMap,
) -> Result<(), ProxyError> {
    let Err(short) = head.take(size) else {
        return Ok(());
    };
    head_alone(rule, headers)?;
    budget.refused(Refusal::RequestHead, short);
    Err(ProxyError::Overloaded {
        retry_after: super::body::OVERLOADED_RETRY_AFTER,
        short,
        replay: false,
    })
}

/// Whether `window` reads its timestamp from a header, which [`refusal`] checks unless the
/// body was [`Announced::Sent`].
pub fn reads_head(window: &crate::config::Freshness) -> bool {
    matches!(window.source, FreshSource::Header(_))
}

/// The body length the head declares, if it declares a readable one (hyper has refused
/// a head whose `Content-Length` it cannot frame the body by).
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}
