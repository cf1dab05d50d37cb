//! The admin listener: `/metrics` (Prometheus text), `/healthz`, `/readyz`, and key
//! inspection (`GET /keys/{digest}`, `DELETE /keys/{digest}` so support can let a customer
//! retry). With a token configured, everything but the probes needs
//! `Authorization: Bearer <token>`; without one, only a loopback listener deletes keys.
//! A stored answer's headers and body
//! (`GET /keys/{digest}?body=true`) are shown only with a token configured and given: they
//! hold other people's session cookies and personal data.
//!
//! `GET /keys/{digest}` answers an `ETag` naming the record it shows, and `DELETE` with
//! `If-Match` removes only that record (`if_match` reads the field).

mod if_match;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};

use crate::config::Config;
use crate::key::Digest;
use crate::proxy::body::ProxyBody;
use crate::proxy::Proxy;
use crate::store::{Purged, Revision, Store, StoreError};
use if_match::Condition;

/// What one admin listener lets its callers do.
#[derive(Debug, Clone)]
pub struct Access {
    /// The address it is bound to.
    listen: SocketAddr,
    /// The bearer token it started with, if one was set: the one it keeps while the
    /// running config names no admin listener at this address.
    token: Option<Arc<str>>,
}

impl Access {
    /// The access of a listener bound to `listen`, behind `token` if one is set.
    pub fn new(token: Option<String>, listen: SocketAddr) -> Self {
        Self {
            listen,
            token: token.map(Arc::from),
        }
    }

    /// The token everything but the probes needs: the running config's, so a reload that
    /// rotates a leaked token takes it away at once, even one that also moves the listener
    /// (which only a restart does). A config that names no token keeps the listener's
    /// open only where it names this very listener: one that moves it to loopback and
    /// drops the token must not open the port still listening elsewhere.
    fn token<'a>(&'a self, config: &'a Config) -> Option<&'a str> {
        match &config.admin {
            Some(admin) if admin.listen == self.listen || admin.token.is_some() => {
                admin.token.as_deref()
            }
            _ => self.token.as_deref(),
        }
    }

    /// Whether a key may be deleted without a token: only on a loopback listener. One off
    /// loopback without a token (`0.0.0.0`, for a kubelet's probes) is open to whoever
    /// reaches it, and a purge lets the key's request run again.
    fn purges_without_token(&self) -> bool {
        self.listen.ip().is_loopback()
    }
}

/// Answers one admin request.
pub async fn handle<B>(request: Request<B>, proxy: &Proxy, access: &Access) -> Response<ProxyBody> {
    let config = proxy.config();
    let token = access.token(&config);
    let path = request.uri().path();
    let method = request.method();
    // The probes answer HEAD as GET (hyper sends no body for it).
    let probe = matches!(*method, Method::GET | Method::HEAD);
    match (probe, path) {
        (true, "/healthz") => return text(StatusCode::OK, "ok\n"),
        (true, "/readyz") => {
            return if proxy.store().ready().await {
                text(StatusCode::OK, "ready\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "store unreachable\n")
            };
        }
        _ => {}
    }
    if let Some(expected) = token {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), expected.as_bytes())) {
            let mut r = text(StatusCode::UNAUTHORIZED, "admin token required\n");
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    if (method, path) == (&Method::GET, "/metrics") {
        let mut r = text(
            StatusCode::OK,
            proxy.metrics().render(proxy.store().stats()),
        );
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return r;
    }
    let Some(hex) = path.strip_prefix("/keys/") else {
        return text(StatusCode::NOT_FOUND, "not found\n");
    };
    let Some(digest) = Digest::from_hex(hex) else {
        return text(
            StatusCode::BAD_REQUEST,
            "a key is 64 hex digits (see idemgate explain)\n",
        );
    };
    let with_body = request
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "body=true" || p == "body=1"));
    if with_body && token.is_none() {
        return text(
            StatusCode::FORBIDDEN,
            "stored bodies are shown only behind an admin token: set admin.token or admin.token_file\n",
        );
    }
    match *method {
        Method::GET => match proxy.store().inspect(digest).await {
            Ok(Some(info)) => {
                let secs = |t: std::time::SystemTime| {
                    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
                };
                let mut doc = serde_json::json!({
                    "key": digest.to_hex(),
                    "state": info.state,
                    "created": secs(info.created),
                    "expires": secs(info.expires),
                });
                if let Some(status) = info.status {
                    doc["status"] = status.as_u16().into();
                }
                if let Some(waiters) = info.waiters {
                    doc["waiters"] = waiters.into();
                }
                if let Some(seen) = info.seen {
                    doc["seen"] =
                        serde_json::json!({ "times": seen.times, "last": secs(seen.last) });
                }
                let sealing = proxy.config().encrypt.clone();
                let opened = info
                    .response
                    .clone()
                    .map(|stored| stored.open(sealing.as_deref(), digest));
                if let Some(Err(e)) = &opened {
                    doc["error"] = e.to_string().into();
                }
                if let Some(Ok(stored)) = &opened {
                    doc["status"] = stored.status().as_u16().into();
                    doc["body_bytes"] = stored.body().len().into();
                    if with_body {
                        doc["headers"] = stored
                            .headers()
                            .iter()
                            .map(|(n, v)| {
                                serde_json::json!([
                                    n.as_str(),
                                    String::from_utf8_lossy(v.as_bytes())
                                ])
                            })
                            .collect();
                        doc["body"] = String::from_utf8_lossy(&stored.body()).into();
                    }
                }
                let mut r = json(StatusCode::OK, doc);
                if let Ok(tag) = HeaderValue::from_str(&info.revision.etag()) {
                    r.headers_mut().insert(header::ETAG, tag);
                }
                r
            }
            Ok(None) => text(StatusCode::NOT_FOUND, "no such key\n"),
            Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
        },
        Method::DELETE if token.is_none() && !access.purges_without_token() => text(
            StatusCode::FORBIDDEN,
            "this admin listener is off loopback and has no token: deleting a key (which lets \
             its request run again) needs admin.token_file, or a listener on 127.0.0.1\n",
        ),
        Method::DELETE => match if_match::condition(request.headers()) {
            Some(condition) => purge(proxy.store(), digest, condition).await,
            None => text(
                StatusCode::BAD_REQUEST,
                "If-Match is * or the ETag that GET /keys/{digest} answered\n",
            ),
        },
        _ => text(StatusCode::METHOD_NOT_ALLOWED, "GET or DELETE\n"),
    }
}

/// `DELETE /keys/{digest}`. A key in flight is refused: its owner is running (or, on a
/// shared store, its lease has not lapsed, or a takeover must wait for the dead owner's
/// call): removing it would tell the duplicates waiting on it that their owner failed and
/// let the next retry run the request beside the first. Once it settled, or lapsed as an
/// unknown outcome, it can be purged. The store decides and deletes in one step
/// ([`Store::purge`](crate::store::Store::purge)): a look first and a delete after would
/// remove a claim made in between (a failure record's retry, an issued token's request).
///
/// With `If-Match`, only the record its `ETag` names is deleted, compared in that same
/// step; another record (a retry's answer stored after the one the operator read expired,
/// or the same claim settled since) answers 412. As RFC 9110 §13.2.1 orders it, a key with
/// no record or a claim in flight answers 404 or 409 whatever the condition.
async fn purge(store: &Store, digest: Digest, condition: Condition) -> Response<ProxyBody> {
    match purge_if(store, digest, condition).await {
        Ok(Purged::Removed) => {
            tracing::info!(key = %digest.short(), "key deleted through the admin API");
            let mut r = Response::new(ProxyBody::empty());
            *r.status_mut() = StatusCode::NO_CONTENT;
            r
        }
        Ok(Purged::InFlight) => text(
            StatusCode::CONFLICT,
            "the key is in flight: its request may still be running upstream, and a \
             purge would let a retry run it again; purge it once it has settled\n",
        ),
        Ok(Purged::Changed) => text(
            StatusCode::PRECONDITION_FAILED,
            "the key changed since it was read (If-Match): nothing was deleted; read it \
             again before purging what it holds now\n",
        ),
        Ok(Purged::Absent) => text(StatusCode::NOT_FOUND, "no such key\n"),
        Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
    }
}

/// One atomic purge per revision the condition names: at most one of them is the record
/// the key holds, so deleting on the first that is leaves any other alone.
async fn purge_if(
    store: &Store,
    digest: Digest,
    condition: Condition,
) -> Result<Purged, StoreError> {
    let revisions = match condition {
        Condition::Any => return store.purge(digest, None).await,
        Condition::OneOf(revisions) if revisions.is_empty() => {
            // Tags that name no record: the purge answers what the key holds and deletes
            // nothing, as no record has this revision's state.
            vec![Revision::new("none", 0, None)]
        }
        Condition::OneOf(revisions) => revisions,
    };
    for revision in revisions {
        match store.purge(digest, Some(revision)).await? {
            Purged::Changed => continue,
            other => return Ok(other),
        }
    }
    Ok(Purged::Changed)
}

/// The credential of a `Bearer` authorization, its scheme name in any case (RFC 9110
/// §11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, credential) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credential.trim_start_matches(' '))
}

/// Compares without an early exit, so response timing does not reveal the token: the
/// SHA-256 digests of both, which have one length whatever was sent (comparing the
/// values themselves would return at once on another length, telling the token's).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use sha2::{Digest as _, Sha256};
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.iter().zip(&b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<ProxyBody> {
    let mut r = Response::new(ProxyBody::full(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn json(status: StatusCode, doc: serde_json::Value) -> Response<ProxyBody> {
    let mut r = text(status, doc.to_string());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(constant_time_eq(b"s3cret-token", b"s3cret-token"));
        assert!(!constant_time_eq(b"s3cret-token", b"s3cret-tokem"));
        assert!(!constant_time_eq(b"s3cret-token", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret", b"s3cret-token"));
        assert!(!constant_time_eq(b"", b"s3cret"));
    }
}
