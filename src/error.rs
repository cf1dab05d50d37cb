//! [`ProxyError`]: everything the proxy itself can answer instead of the upstream, each
//! variant mapped to one status here and rendered as RFC 9457 `application/problem+json`.
//! Details never include another caller's data, a key or a body.

use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};

use crate::key::KeyError;
use crate::metrics::Outcome;
use crate::proxy::budget::Short;
use crate::route::normalize::PathError;
use crate::store::seal::SealError;
use crate::store::StoreError;

/// An answer of the proxy's own.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The key is required but missing, repeated or malformed, or its fields are absent.
    #[error(transparent)]
    BadKey(#[from] KeyError),
    /// The client key was used before with another payload.
    #[error("this idempotency key was already used with a different request")]
    Mismatch,
    /// A request with this key is still running.
    #[error("a request with this idempotency key is still being processed")]
    InFlight {
        /// Seconds for `Retry-After`.
        retry_after: u64,
    },
    /// An earlier request with this key may have been executed, and its outcome is
    /// unknown (its upstream call timed out or broke after it went out, or its owner
    /// vanished): it is not executed again until the state ends or an operator purges it.
    #[error(
        "an earlier request with this idempotency key may have been executed, but its \
         outcome is unknown; it is not executed again until {}, or until an operator \
         purges the key",
        httpdate::fmt_http_date(*until)
    )]
    OutcomeUnknown {
        /// When the state ends.
        until: std::time::SystemTime,
    },
    /// An earlier request with this key was executed, but its answer was not kept.
    #[error(
        "an earlier request with this idempotency key was executed (status {status}), but \
         its answer {}; it is not executed again",
        why.as_str()
    )]
    AnswerNotStored {
        /// The upstream's status.
        status: StatusCode,
        /// Why its answer was not kept.
        why: NotKept,
    },
    /// This caller's records hold its share of the memory store (`caller_share`); it may
    /// retry once some have expired.
    #[error("this caller's idempotency records fill its share of the store; retry later")]
    CallerOverShare,
    /// The records of this client address, whatever callers it named, hold its share of
    /// the memory store (`address_share`); it may retry once some have expired.
    #[error(
        "the idempotency records of this client address fill its share of the store; retry \
         later"
    )]
    AddressOverShare,
    /// The request this duplicate waited on failed, and its answer is not kept.
    #[error("the request with this idempotency key that this one waited for failed; retry")]
    OwnerFailed,
    /// The body exceeds `max_body` on a protected route.
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge {
        /// The route's `max_body`.
        limit: usize,
    },
    /// The request body could not be read from the client.
    #[error("the request body could not be read: {0}")]
    BodyRead(String),
    /// The client stopped sending a protected request's body for longer than the body
    /// read timeout (seconds).
    #[error("no part of the request body arrived for {0} s")]
    BodyTimeout(u64),
    /// The proxy buffers as many bytes as `connections.max_buffered` allows, one client
    /// connection as many as `connections.max_buffered_per_connection`: a request's head,
    /// or a protected request's body, found no room, and was refused before anything was
    /// claimed or sent; or a replay of a stored answer found none, and the answer
    /// was neither sent cut short nor run again.
    #[error("{}; retry after {retry_after} s", buffering(*.short))]
    Overloaded {
        /// Seconds for `Retry-After`.
        retry_after: u64,
        /// Which limit the body found no room under.
        short: Short,
        /// A replay was refused: the request ran, and its retry with the same key
        /// gets the stored answer (never "not executed", which invites a new key).
        replay: bool,
    },
    /// The connection already has as many owners running as `connections.max_streams`
    /// allows (requests its client reset or gave up on run on): this one was refused
    /// before its key was claimed.
    #[error(
        "this connection has {limit} requests still running upstream, the most it may; \
         retry after {retry_after} s"
    )]
    ConnectionBusy {
        /// The connection's limit (`connections.max_streams`).
        limit: usize,
        /// Seconds for `Retry-After`.
        retry_after: u64,
    },
    /// The store failed and the route fails closed.
    #[error("the idempotency store is unavailable")]
    Store(#[from] StoreError),
    /// The upstream could not be reached: the request provably never went out (connect
    /// refused or timed out, TLS handshake failed, not a byte written).
    #[error("the upstream is unreachable")]
    UpstreamUnreachable(String),
    /// The request went out (or may have) and the exchange broke before a whole answer
    /// came back (reset, closed early, malformed answer): the upstream may have executed it.
    #[error("the upstream failed before answering")]
    UpstreamFailed(String),
    /// The upstream did not answer within `upstream_timeout`.
    #[error("the upstream did not answer in time")]
    UpstreamTimeout,
    /// The request cannot be forwarded as it is (e.g. no usable path).
    #[error("the request is malformed: {0}")]
    BadRequest(String),
    /// Too many tokens asked for by one caller, or from one client address.
    #[error("too many token requests; retry after {retry_after} s")]
    RateLimited {
        /// Seconds for `Retry-After`.
        retry_after: u64,
    },
    /// Every caller together asked for `tokens.budget` tokens this window: none is issued
    /// until it ends, so unspent tokens cannot fill a shared store. An answer of the
    /// store's, as one that is full: nothing was claimed, the caller may retry.
    #[error(
        "the one-time tokens issued to all callers reached their budget for now; retry \
         after {retry_after} s"
    )]
    TokenBudgetSpent {
        /// Seconds for `Retry-After`: the rest of the window at most.
        retry_after: u64,
    },
    /// A token asked for by a client a trusted proxy could not name (`X-Forwarded-For:
    /// unknown`) whose scope would hold its address: bound to it, the token could not be
    /// told from another such client's, so its every use would be forwarded unprotected.
    #[error(
        "a trusted proxy forwarded this request without naming its client (its \
         X-Forwarded-For holds no address), so a one-time token could not be told from \
         another client's and would protect nothing; none is issued"
    )]
    CallerUnnamed,
    /// The request's timestamp is outside the route's freshness window, or unreadable.
    #[error("{0}")]
    Stale(String),
    /// A non-safe request names no host (HTTP/1.0 without `Host`, an empty one) while a
    /// route bound to a host matches its method and path: the upstream would serve it from
    /// its default host, which may be the route's, so it is neither that route's nor not.
    #[error(
        "the request names no host, and a route bound to a host matches its method and \
         path: send the host in the Host field"
    )]
    HostRequired,
    /// The path has no one safe normal form (an encoded `/` or `\`, NUL, a bad escape).
    #[error("{0}: send the path in plain form")]
    BadPath(PathError),
    /// A stored answer was found but cannot be decrypted with the configured keys; it is
    /// not executed again (it ran), nor shown.
    #[error("{0}")]
    Unsealable(SealError),
    /// The request needs something a reverse proxy in front of one application does not
    /// do: a `CONNECT` tunnel, or a transfer coding other than `chunked`.
    #[error("{0}")]
    NotImplemented(&'static str),
}

/// Why an executed request's answer was not kept, as its repeats are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotKept {
    /// Over `max_answer`, without room in the buffers, or refused by the store.
    TooLarge,
    /// Of a status the route's `replay_statuses` does not list (a `3xx` by default).
    NotReplayed,
}

impl NotKept {
    /// Why the answer with `status` of a request on a route with `policy` was not kept: a
    /// status the route replays was kept unless too large (the record holds only the
    /// status, so the route's rule tells which).
    pub fn of(policy: &crate::config::Policy, status: StatusCode) -> Self {
        if policy.replays(status.as_u16()) {
            Self::TooLarge
        } else {
            Self::NotReplayed
        }
    }

    /// The end of the sentence its repeats are told.
    fn as_str(self) -> &'static str {
        match self {
            Self::TooLarge => "was too large to keep",
            Self::NotReplayed => {
                "is not replayed on this route, whose replay_statuses do not list that status"
            }
        }
    }
}

/// What a body refused under `short` was told is buffering all it may: a client that
/// holds its connection's share learns that its own requests hold it, not the proxy's load.
fn buffering(short: Short) -> &'static str {
    match short {
        Short::Total => "the proxy is buffering as much as it may at once",
        Short::Connection => {
            "this connection is buffering as much as one connection may at once (its \
             requests' heads, bodies, answers and replays)"
        }
    }
}

impl ProxyError {
    /// The one place statuses are decided.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadKey(_)
            | Self::BodyRead(_)
            | Self::BadRequest(_)
            | Self::BadPath(_)
            | Self::HostRequired
            | Self::CallerUnnamed
            | Self::Stale(_) => StatusCode::BAD_REQUEST,
            Self::Unsealable(_) | Self::Store(StoreError::Unreadable(_)) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            Self::RateLimited { .. } | Self::CallerOverShare | Self::AddressOverShare => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Self::Mismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::InFlight { .. } | Self::OutcomeUnknown { .. } | Self::AnswerNotStored { .. } => {
                StatusCode::CONFLICT
            }
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Store(_)
            | Self::TokenBudgetSpent { .. }
            | Self::Overloaded { .. }
            | Self::ConnectionBusy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::UpstreamUnreachable(_) | Self::UpstreamFailed(_) | Self::OwnerFailed => {
                StatusCode::BAD_GATEWAY
            }
            Self::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
        }
    }

    /// Whether the proxy or what is behind it failed (worth a warning), rather than the
    /// client asking for something it should not (a connection busy with its own client's
    /// requests is the client's doing, a token budget spent a flood's: a warning each
    /// would let it flood the log; the budget's refusals are counted instead).
    pub fn is_fault(&self) -> bool {
        self.status().is_server_error()
            && !matches!(
                self,
                Self::NotImplemented(_)
                    | Self::ConnectionBusy { .. }
                    | Self::TokenBudgetSpent { .. }
                    // Counted in `idemgate_buffer_refusals_total`; a warning each would
                    // flood the log in just the flood of duplicates that meets it.
                    | Self::Overloaded { replay: true, .. }
            )
    }

    /// Whether this answer may come before the request's body was read to its end: the
    /// request was refused for its head (before routing) or for its body (too large,
    /// stalled, unreadable). Such an answer ends an HTTP/1.1 connection (`Connection:
    /// close`, RFC 9112 §9.6): where the unread body ends is unknown, so whether a request
    /// pipelined behind it would be read as one must not depend on how much of the body
    /// had arrived (hyper keeps a connection only if the rest was already buffered).
    pub fn leaves_body_unread(&self) -> bool {
        matches!(
            self,
            Self::BadRequest(_)
                | Self::BadPath(_)
                | Self::HostRequired
                | Self::NotImplemented(_)
                | Self::PayloadTooLarge { .. }
                | Self::BodyTimeout(_)
                | Self::BodyRead(_)
                | Self::Overloaded { replay: false, .. }
        )
    }

    /// Stable label for logs, metrics and the problem `type`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::BadKey(KeyError::ClientKey(_)) => "key-invalid",
            Self::BadKey(KeyError::InvalidJson(_)) => "body-invalid-json",
            Self::BadKey(KeyError::FieldMissing(_)) => "key-field-missing",
            Self::BadKey(KeyError::TokenInvalid) => "token-invalid",
            Self::RateLimited { .. } => "rate-limited",
            Self::CallerOverShare => "caller-over-share",
            Self::AddressOverShare => "address-over-share",
            Self::Stale(_) => "stale-request",
            Self::Mismatch => "key-reused",
            Self::InFlight { .. } => "in-flight",
            Self::OutcomeUnknown { .. } => "outcome-unknown",
            Self::AnswerNotStored { .. } => "answer-not-stored",
            Self::OwnerFailed => "duplicate-of-failed-request",
            Self::PayloadTooLarge { .. } => "payload-too-large",
            Self::BodyRead(_) => "body-unreadable",
            Self::BodyTimeout(_) => "body-timeout",
            Self::Overloaded { .. } => "overloaded",
            Self::ConnectionBusy { .. } => "connection-busy",
            Self::Store(StoreError::Unreadable(_)) => "stored-answer-unreadable",
            Self::Store(_) | Self::TokenBudgetSpent { .. } => "store-unavailable",
            Self::CallerUnnamed => "caller-unknown",
            Self::UpstreamUnreachable(_) => "upstream-unreachable",
            Self::UpstreamFailed(_) => "upstream-failed",
            Self::UpstreamTimeout => "upstream-timeout",
            Self::BadRequest(_) => "bad-request",
            Self::BadPath(_) => "path-not-normalizable",
            Self::HostRequired => "host-required",
            Self::Unsealable(_) => "stored-answer-unreadable",
            Self::NotImplemented(_) => "not-implemented",
        }
    }

    /// The outcome a request ending in this error is counted as.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::BadKey(_)
            | Self::PayloadTooLarge { .. }
            | Self::BodyRead(_)
            | Self::BodyTimeout(_)
            | Self::BadRequest(_)
            | Self::BadPath(_)
            | Self::HostRequired
            | Self::RateLimited { .. }
            | Self::CallerUnnamed
            | Self::CallerOverShare
            | Self::AddressOverShare
            | Self::Stale(_)
            | Self::NotImplemented(_)
            | Self::Overloaded { .. }
            | Self::ConnectionBusy { .. } => Outcome::Rejected,
            Self::Mismatch => Outcome::Mismatch,
            Self::InFlight { .. } => Outcome::Conflict,
            Self::OutcomeUnknown { .. } => Outcome::Held,
            Self::AnswerNotStored { .. } => Outcome::NotStored,
            Self::OwnerFailed => Outcome::FailureShared,
            Self::Store(_) | Self::TokenBudgetSpent { .. } | Self::Unsealable(_) => {
                Outcome::StoreError
            }
            Self::UpstreamUnreachable(_) => Outcome::Released,
            Self::UpstreamFailed(_) | Self::UpstreamTimeout => Outcome::Unknown,
        }
    }

    /// Short human title.
    fn title(&self) -> &'static str {
        match self {
            Self::BadKey(_) => "Invalid idempotency key",
            Self::Mismatch => "Idempotency key reused with another request",
            Self::RateLimited { .. } | Self::CallerOverShare | Self::AddressOverShare => {
                "Too many requests"
            }
            Self::Stale(_) => "Request outside its freshness window",
            Self::InFlight { .. } => "Request in progress",
            Self::OutcomeUnknown { .. } => "Outcome of an earlier request unknown",
            Self::AnswerNotStored { .. } => "Already executed, answer not stored",
            Self::OwnerFailed => "The original request failed",
            Self::PayloadTooLarge { .. } => "Payload too large",
            Self::BodyRead(_) | Self::BadRequest(_) | Self::BadPath(_) => "Bad request",
            Self::HostRequired => "Host required",
            Self::Unsealable(_) | Self::Store(StoreError::Unreadable(_)) => {
                "Stored answer unreadable"
            }
            Self::BodyTimeout(_) => "Request timeout",
            Self::Store(_) | Self::TokenBudgetSpent { .. } => "Idempotency store unavailable",
            Self::CallerUnnamed => "Caller not named",
            Self::Overloaded { .. } => "Proxy overloaded",
            Self::ConnectionBusy { .. } => "Connection busy",
            Self::UpstreamUnreachable(_) | Self::UpstreamFailed(_) => "Bad gateway",
            Self::UpstreamTimeout => "Gateway timeout",
            Self::NotImplemented(_) => "Not implemented",
        }
    }

    /// Whether the detail may say more than the title. Upstream and store errors carry
    /// internal addresses, so they are logged, not sent; what is sent says what a retry
    /// with the same key will meet.
    pub(crate) fn public_detail(&self) -> String {
        match self {
            // The record says the key was taken: the request may have run.
            Self::Store(StoreError::Unreadable(_)) => "the stored record of this request \
                 cannot be read; it may have been executed and is not executed again"
                .into(),
            Self::Overloaded { replay: true, .. } => format!(
                "{self}; the request was executed and its answer is stored: retry with the \
                 same key to get it (a new key would run it again)"
            ),
            Self::Store(_) | Self::Overloaded { .. } | Self::ConnectionBusy { .. } => {
                format!("{self}; the request was not executed, so it can be retried")
            }
            Self::UpstreamUnreachable(_) => {
                // A one-time token may be gone: expired as issued, or (memory store) no
                // room in `token_share` to hand it back.
                format!(
                    "{self}; the request was not sent, so it can be retried (with a one-time \
                     token, the same one while it is handed back and unexpired; if that \
                     gets token-invalid, with a new one)"
                )
            }
            // True of every route: one that releases unknown outcomes (and an unprotected
            // one) runs the retry, so promising otherwise would invite a second payment.
            Self::UpstreamFailed(_) => format!(
                "{self}; the request may have been executed: a retry runs it again unless \
                 its route holds unknown outcomes (on_unknown_outcome: hold, the default), \
                 where a retry with the same idempotency key is answered outcome-unknown"
            ),
            // As for `UpstreamFailed`: a route that releases unknown outcomes (and an
            // unprotected one) runs the retry once the owner gave up.
            Self::UpstreamTimeout => format!(
                "{self}; the request may still be running: where its route holds unknown \
                 outcomes (on_unknown_outcome: hold, the default), a retry with the same \
                 idempotency key gets its answer once it is known, or outcome-unknown; \
                 elsewhere a retry runs it again"
            ),
            // Key ids are the operator's business.
            Self::Unsealable(_) => "the stored answer of this request cannot be read; it was \
                                    executed and is not executed again"
                .into(),
            _ => self.to_string(),
        }
    }

    /// The problem+json answer's status, headers and body.
    pub fn problem_parts(&self) -> (StatusCode, http::HeaderMap, Bytes) {
        let status = self.status();
        let body = serde_json::json!({
            "type": format!("urn:idemgate:problem:{}", self.as_str()),
            "title": self.title(),
            "status": status.as_u16(),
            "detail": self.public_detail(),
        });
        let mut headers = http::HeaderMap::with_capacity(3);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Self::InFlight { retry_after }
        | Self::RateLimited { retry_after }
        | Self::TokenBudgetSpent { retry_after }
        | Self::Overloaded { retry_after, .. }
        | Self::ConnectionBusy { retry_after, .. } = self
        {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
        }
        if let Self::CallerOverShare | Self::AddressOverShare = self {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
        }
        (status, headers, Bytes::from(body.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_too_large_maps_to_413() {
        assert_eq!(
            ProxyError::PayloadTooLarge { limit: 1 }.status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }

    #[test]
    fn a_stalled_body_maps_to_408() {
        let e = ProxyError::BodyTimeout(60);
        assert_eq!(e.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(e.as_str(), "body-timeout");
    }

    #[test]
    fn in_flight_answers_carry_retry_after() {
        let r = ProxyError::InFlight { retry_after: 2 }.into_response();
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
    }

    #[test]
    fn overloaded_maps_to_503_with_retry_after() {
        let e = ProxyError::Overloaded {
            retry_after: 1,
            short: Short::Connection,
            replay: false,
        };
        assert_eq!(e.as_str(), "overloaded");
        assert!(e
            .public_detail()
            .starts_with("this connection is buffering"));
        assert!(e.leaves_body_unread());
        let r = e.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }

    /// A replay refused for room ran before: its client is told to retry with the same key
    /// (a new one would run it again), never that it was not executed; its body was read,
    /// so its connection stays open, and a flood of them logs no warning each.
    #[test]
    fn a_refused_replay_says_the_request_ran_and_to_keep_the_key() {
        let e = ProxyError::Overloaded {
            retry_after: 1,
            short: Short::Total,
            replay: true,
        };
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.as_str(), "overloaded");
        let detail = e.public_detail();
        assert!(detail.contains("was executed"), "{detail}");
        assert!(detail.contains("same key"), "{detail}");
        assert!(!detail.contains("not executed"), "{detail}");
        assert!(!e.leaves_body_unread());
        assert!(!e.is_fault());
    }

    #[test]
    fn a_busy_connection_maps_to_503_with_retry_after_and_is_no_fault() {
        let e = ProxyError::ConnectionBusy {
            limit: 128,
            retry_after: 1,
        };
        assert_eq!(e.as_str(), "connection-busy");
        assert!(!e.is_fault() && !e.leaves_body_unread());
        let r = e.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn upstream_details_do_not_leak_addresses() {
        let e = ProxyError::UpstreamUnreachable("connect 10.0.0.7:3000 refused".into());
        assert!(!e.public_detail().contains("10.0.0.7"));
    }
}
