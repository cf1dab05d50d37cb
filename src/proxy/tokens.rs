//! The one-time token endpoint (`POST /.idemgate/token` by default): issues a token bound
//! to the caller's scope for `tokens.ttl`, 80 random bits over its issue time in ms (48
//! bits), in 32 hex digits, so a token handed back after a failed attempt keeps the expiry
//! it was issued with ([`expires_at`]) on every store, with no record to read it from. Anyone may ask, and a made-up
//! `Authorization` is a new caller, so three counters bound what asking costs, each per
//! `tokens.window`: `tokens.rate_per_address` per client address and `tokens.rate` per
//! caller (429 + `Retry-After` beyond), then `tokens.budget` for every caller on every
//! replica sharing the store (503 beyond, counted), which bounds the unspent tokens a
//! shared store holds however many addresses ask. The first token request a peer outside
//! `trusted_proxies` relays is logged once, since all its clients share one address's
//! limit. Routes with `key: { token: … }` accept
//! each token once; its repeats replay.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};

use super::body::ProxyBody;
use super::headers::X_FORWARDED_FOR;
use super::ConnInfo;
use crate::config::TokenIssuer;
use crate::error::ProxyError;
use crate::key::derive::buckets::{address_digest, named_scope_digest, token_budget_digest};
use crate::key::{token_digest, RequestView};
use crate::route::Overrides;
use crate::store::Store;

/// Issues one token to the caller of `request`.
pub async fn issue<B>(
    store: &Store,
    issuer: &TokenIssuer,
    request: &Request<B>,
    conn: &ConnInfo,
) -> Result<Response<ProxyBody>, ProxyError> {
    let view = RequestView {
        route: "",
        method: request.method(),
        path: request.uri().path(),
        query: None,
        headers: request.headers(),
        overrides: Overrides::find(request.headers()),
        peer: Some(conn.peer.ip()),
        identity: &issuer.identity,
        client_cert: conn.client_cert(),
        body: &[],
    };
    // Refused before anything is counted: such a token would only look like protection.
    let caller = named_scope_digest(&issuer.scope, &view).ok_or(ProxyError::CallerUnnamed)?;
    warn_unlisted_relay(&view);
    let retry_after = issuer.window.as_secs().max(1);
    // The address first: a flood of made-up callers from one address then makes no
    // counter per caller, and spends none of the budget everyone shares.
    if let Some(address) = address_digest(&view) {
        if store.hit(address, issuer.window).await? > issuer.rate_per_address {
            return Err(ProxyError::RateLimited { retry_after });
        }
    }
    if store.hit(caller, issuer.window).await? > issuer.rate {
        return Err(ProxyError::RateLimited { retry_after });
    }
    if store.hit(token_budget_digest(), issuer.window).await? > issuer.budget {
        store.token_refused();
        return Err(ProxyError::TokenBudgetSpent { retry_after });
    }
    let token = mint(SystemTime::now());
    store
        .issue(
            token_digest(&issuer.scope, &view, token.as_bytes()),
            issuer.ttl,
        )
        .await?;
    let body = serde_json::json!({
        "token": token,
        "header": issuer.header.as_str(),
        "expires_in": issuer.ttl.as_secs(),
    });
    let mut response = Response::new(ProxyBody::full(Bytes::from(body.to_string())));
    *response.status_mut() = StatusCode::CREATED;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// Whether [`warn_unlisted_relay`] has warned, in this process.
static UNLISTED_RELAY_WARNED: AtomicBool = AtomicBool::new(false);

/// Warns once per process when a peer outside `trusted_proxies` relays a token request
/// (it sends `X-Forwarded-For` or `Forwarded`): most likely a balancer nobody listed, all
/// of whose clients then share its address's `tokens.rate_per_address`. After the first,
/// one atomic load a request.
fn warn_unlisted_relay(view: &RequestView<'_>) {
    if UNLISTED_RELAY_WARNED.load(Ordering::Relaxed) {
        return;
    }
    let relays =
        view.headers.contains_key(&X_FORWARDED_FOR) || view.headers.contains_key(header::FORWARDED);
    let Some(peer) = view.peer.filter(|_| relays) else {
        return;
    };
    if view.identity.trusted_proxies.contains(peer.to_canonical())
        || UNLISTED_RELAY_WARNED.swap(true, Ordering::Relaxed)
    {
        return;
    }
    tracing::warn!(
        %peer,
        "token request relayed by a peer outside trusted_proxies (it sent X-Forwarded-For or \
         Forwarded): its clients share one address's token limit (tokens.rate_per_address) \
         until it is listed in trusted_proxies; logged once"
    );
}

/// The bits of a token that hold its issue time in ms.
const ISSUED_MASK: u128 = (1 << 48) - 1;

/// A new token issued at `now`: 80 random bits over its issue ms, in lower-case hex.
fn mint(now: SystemTime) -> String {
    let random = rand::random::<u128>() << 48;
    let issued = u128::from(crate::store::unix_ms(now)) & ISSUED_MASK;
    format!("{:032x}", random | issued)
}

/// When a token (as sent, already checked to be 32 hex digits) expires as issued, for
/// `ttl`: its issue ms plus `ttl`, never later than `ttl` from `now`. The issue time needs
/// no check of its own: another would be another token, which no one was issued. A token
/// an earlier build issued (128 random bits), or one from a replica whose clock runs
/// ahead, reads as issued later than it was, so it lives at most `ttl` from `now`.
pub(super) fn expires_at(token: &[u8], ttl: Duration, now: SystemTime) -> SystemTime {
    let issued = std::str::from_utf8(token)
        .ok()
        .and_then(|hex| u128::from_str_radix(hex, 16).ok())
        .map(|bits| (bits & ISSUED_MASK) as u64);
    let latest = now + ttl;
    issued.map_or(latest, |ms| {
        (UNIX_EPOCH + Duration::from_millis(ms) + ttl).min(latest)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_expires_as_issued_however_late_it_is_handed_back() {
        let ttl = Duration::from_secs(300);
        let issued = UNIX_EPOCH + Duration::from_millis(1_764_000_000_123);
        let token = mint(issued);
        assert_eq!(token.len(), 32);
        assert!(token
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(mint(issued), token, "80 random bits");
        let later = issued + Duration::from_secs(120);
        assert_eq!(expires_at(token.as_bytes(), ttl, later), issued + ttl);
        // Read as issued in the future (an earlier build's random bits, a clock ahead):
        // never more than `ttl` from now.
        let before = issued - Duration::from_secs(60);
        assert_eq!(expires_at(token.as_bytes(), ttl, before), before + ttl);
        assert_eq!(expires_at(b"not hex", ttl, later), later + ttl);
    }
}
