//! [`ProxyError`]: everything the proxy itself can answer instead of the upstream, each
//! variant mapped to one status here and rendered as RFC 9457 `application/problem+json`.
//! Details never include another caller's data, a key or a body.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::key::KeyError;
use crate::metrics::Outcome;
use crate::proxy::body::ProxyBody;
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
    /// The store failed and the route fails closed.
    #[error("the idempotency store is unavailable")]
    Store(#[from] StoreError),
    /// The upstream could not be reached or broke the connection.
    #[error("the upstream is unreachable")]
    UpstreamUnreachable(String),
    /// The upstream did not answer within `upstream_timeout`.
    #[error("the upstream did not answer in time")]
    UpstreamTimeout,
    /// The request cannot be forwarded as it is (e.g. no usable path).
    #[error("the request is malformed: {0}")]
    BadRequest(String),
    /// Too many tokens asked for by one caller.
    #[error("too many token requests; retry after {retry_after} s")]
    RateLimited {
        /// Seconds for `Retry-After`.
        retry_after: u64,
    },
    /// The request's timestamp is outside the route's freshness window, or unreadable.
    #[error("{0}")]
    Stale(String),
    /// The request needs something a reverse proxy in front of one application does not
    /// do: a `CONNECT` tunnel, or a transfer coding other than `chunked`.
    #[error("{0}")]
    NotImplemented(&'static str),
}

impl ProxyError {
    /// The one place statuses are decided.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadKey(_) | Self::BodyRead(_) | Self::BadRequest(_) | Self::Stale(_) => {
                StatusCode::BAD_REQUEST
            }
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Mismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::InFlight { .. } => StatusCode::CONFLICT,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::UpstreamUnreachable(_) => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
        }
    }

    /// Whether the proxy or what is behind it failed (worth a warning), rather than the
    /// client asking for something it should not.
    pub fn is_fault(&self) -> bool {
        self.status().is_server_error() && !matches!(self, Self::NotImplemented(_))
    }

    /// Stable label for logs, metrics and the problem `type`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::BadKey(KeyError::ClientKey(_)) => "key-invalid",
            Self::BadKey(KeyError::InvalidJson(_)) => "body-invalid-json",
            Self::BadKey(KeyError::FieldMissing(_)) => "key-field-missing",
            Self::BadKey(KeyError::TokenInvalid) => "token-invalid",
            Self::RateLimited { .. } => "rate-limited",
            Self::Stale(_) => "stale-request",
            Self::Mismatch => "key-reused",
            Self::InFlight { .. } => "in-flight",
            Self::PayloadTooLarge { .. } => "payload-too-large",
            Self::BodyRead(_) => "body-unreadable",
            Self::BodyTimeout(_) => "body-timeout",
            Self::Store(_) => "store-unavailable",
            Self::UpstreamUnreachable(_) => "upstream-unreachable",
            Self::UpstreamTimeout => "upstream-timeout",
            Self::BadRequest(_) => "bad-request",
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
            | Self::RateLimited { .. }
            | Self::Stale(_)
            | Self::NotImplemented(_) => Outcome::Rejected,
            Self::Mismatch => Outcome::Mismatch,
            Self::InFlight { .. } => Outcome::Conflict,
            Self::Store(_) => Outcome::StoreError,
            Self::UpstreamUnreachable(_) | Self::UpstreamTimeout => Outcome::Released,
        }
    }

    /// Short human title.
    fn title(&self) -> &'static str {
        match self {
            Self::BadKey(_) => "Invalid idempotency key",
            Self::Mismatch => "Idempotency key reused with another request",
            Self::RateLimited { .. } => "Too many requests",
            Self::Stale(_) => "Request outside its freshness window",
            Self::InFlight { .. } => "Request in progress",
            Self::PayloadTooLarge { .. } => "Payload too large",
            Self::BodyRead(_) | Self::BadRequest(_) => "Bad request",
            Self::BodyTimeout(_) => "Request timeout",
            Self::Store(_) => "Idempotency store unavailable",
            Self::UpstreamUnreachable(_) => "Bad gateway",
            Self::UpstreamTimeout => "Gateway timeout",
            Self::NotImplemented(_) => "Not implemented",
        }
    }

    /// Whether the detail may say more than the title. Upstream and store errors carry
    /// internal addresses, so they are logged, not sent.
    fn public_detail(&self) -> String {
        match self {
            Self::Store(_) | Self::UpstreamUnreachable(_) | Self::UpstreamTimeout => {
                format!("{self}; the request was not stored, so it can be retried")
            }
            _ => self.to_string(),
        }
    }

    /// The problem+json answer.
    pub fn into_response(self) -> Response<ProxyBody> {
        let status = self.status();
        let body = serde_json::json!({
            "type": format!("urn:idemgate:problem:{}", self.as_str()),
            "title": self.title(),
            "status": status.as_u16(),
            "detail": self.public_detail(),
        });
        let mut response = Response::new(ProxyBody::full(Bytes::from(body.to_string())));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Self::InFlight { retry_after } | Self::RateLimited { retry_after } = self {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
        }
        response
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
    fn upstream_details_do_not_leak_addresses() {
        let e = ProxyError::UpstreamUnreachable("connect 10.0.0.7:3000 refused".into());
        assert!(!e.public_detail().contains("10.0.0.7"));
    }
}
