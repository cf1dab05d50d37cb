//! The one-time token endpoint (`POST /.idemgate/token` by default): issues 128 random bits
//! bound to the caller's scope for `tokens.ttl`, at most `tokens.rate` per caller per
//! `tokens.window` (429 + `Retry-After` beyond). Routes with `key: { token: … }` accept
//! each token once; its repeats replay.

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};

use super::body::ProxyBody;
use super::ConnInfo;
use crate::config::TokenIssuer;
use crate::error::ProxyError;
use crate::key::derive::scope_digest;
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
    let hits = store
        .hit(scope_digest(&issuer.scope, &view), issuer.window)
        .await?;
    if hits > issuer.rate {
        return Err(ProxyError::RateLimited {
            retry_after: issuer.window.as_secs().max(1),
        });
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
