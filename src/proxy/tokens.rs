//! The one-time token endpoint (`POST /.idemgate/token` by default): issues 128 random bits
//! bound to the caller's scope for `tokens.ttl`. Anyone may ask, and a made-up
//! `Authorization` is a new caller, so three counters bound what asking costs, each per
//! `tokens.window`: `tokens.rate_per_address` per client address and `tokens.rate` per
//! caller (429 + `Retry-After` beyond), then `tokens.budget` for every caller on every
//! replica sharing the store (503 beyond, counted), which bounds the unspent tokens a
//! shared store holds however many addresses ask. Routes with `key: { token: … }` accept
//! each token once; its repeats replay.

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};

use super::body::ProxyBody;
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
    let token = hex::encode(rand::random::<[u8; 16]>());
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
