//! `tokens:` compiled: the one-time token endpoint ([`TokenIssuer`]), built when the
//! section is set or any route keys on tokens. Token routes get the endpoint's TTL as their
//! reissue window and must bind tokens to the same scope the endpoint issues them for.

use std::sync::Arc;
use std::time::Duration;

use super::error::CompileError;
use super::protection::Protection;
use super::raw::RawTokens;
use super::routes::{client_cert_without_mtls, Route};
use crate::key::identity::Identity;
use crate::key::{default_scope, KeySource, ScopePart};

/// `POST {path}` issues one-time tokens bound to the caller's scope.
#[derive(Debug, Clone)]
pub struct TokenIssuer {
    /// Where tokens are issued (`/.idemgate/token`).
    pub path: String,
    /// How long an unused token stays valid (5m).
    pub ttl: Duration,
    /// Tokens per caller per window before 429 (20).
    pub rate: u64,
    /// The rate window (1m).
    pub window: Duration,
    /// Tokens per client address (an IPv6 one by its /64) per window before 429 (100),
    /// whoever the requests claim to be: a made-up `Authorization` is a new caller, so
    /// `rate` alone would let one client ask for any number.
    pub rate_per_address: u64,
    /// Tokens issued per window by every replica on the store together before 503
    /// (10,000): many addresses can still ask, and unspent tokens must not fill a shared
    /// store (at most `budget` × (⌈`ttl`/`window`⌉ + 1) live at once).
    pub budget: u64,
    /// Whose token it is; token routes must use the same scope.
    pub scope: Vec<crate::key::ScopePart>,
    /// The header token routes read it from, for the issue answer.
    pub header: http::HeaderName,
    /// How callers are told apart, for the token's scope.
    pub identity: Arc<Identity>,
}

/// Builds the token endpoint when `tokens:` is set or a route uses token keys, fills in
/// the routes' reissue window, and checks they bind tokens to the endpoint's scope (which
/// names `client_cert` only with `mutual_tls`).
pub(super) fn compile_tokens(
    raw: Option<RawTokens>,
    routes: &mut [Route],
    fallback: &mut Protection,
    identity: &Arc<Identity>,
    mutual_tls: bool,
) -> Result<Option<TokenIssuer>, CompileError> {
    let keys_on_tokens = |protection: &Protection| matches!(protection, Protection::On(p) if matches!(p.key.source, KeySource::Token(_)));
    let uses_tokens =
        keys_on_tokens(fallback) || routes.iter().any(|r| keys_on_tokens(&r.protection));
    if raw.is_none() && !uses_tokens {
        return Ok(None);
    }
    let raw = raw.unwrap_or_default();
    let issuer = TokenIssuer {
        path: raw.path.unwrap_or_else(|| "/.idemgate/token".to_owned()),
        ttl: raw.ttl.map_or(Duration::from_secs(300), |d| d.0),
        rate: raw.rate.unwrap_or(20),
        window: raw.window.map_or(Duration::from_secs(60), |d| d.0),
        rate_per_address: raw.rate_per_address.unwrap_or(100),
        budget: raw.budget.unwrap_or(10_000),
        scope: raw.scope.map_or_else(default_scope, |parts| {
            parts.into_iter().map(|p| p.0).collect()
        }),
        header: http::HeaderName::from_static("idempotency-token"),
        identity: Arc::clone(identity),
    };
    if !issuer.path.starts_with('/')
        || issuer.rate == 0
        || issuer.rate_per_address == 0
        || issuer.budget == 0
        || issuer.ttl.is_zero()
        || issuer.window.is_zero()
    {
        return Err(CompileError::new(
            "tokens",
            "path must start with '/'; rate, rate_per_address, budget, ttl and window must be above zero",
        ));
    }
    check_path(&issuer.path, routes)?;
    if !mutual_tls && issuer.scope.contains(&ScopePart::ClientCert) {
        return Err(CompileError::new(
            "tokens.scope",
            client_cert_without_mtls("the token endpoint (`tokens`)"),
        )
        .within("client_cert"));
    }
    let mut header = None;
    // The fallback (`defaults.key`, for POST and PATCH matching no route) like a route.
    let fallback = std::iter::once(("defaults.key.scope".to_owned(), fallback));
    let routes = routes
        .iter_mut()
        .enumerate()
        .map(|(i, route)| (format!("routes[{i}].key.scope"), &mut route.protection));
    for (key_path, protection) in fallback.chain(routes) {
        let Protection::On(p) = protection else {
            continue;
        };
        let KeySource::Token(rule) = &p.key.source else {
            continue;
        };
        if p.key.scope != issuer.scope {
            return Err(CompileError::new(
                key_path,
                "a token route must use the same scope as `tokens.scope` (whose token it is)",
            ));
        }
        header.get_or_insert(rule.header.clone());
        let mut updated = (**p).clone();
        if let KeySource::Token(rule) = &mut updated.key.source {
            rule.reissue_ttl = issuer.ttl;
        }
        *p = Arc::new(updated);
    }
    Ok(Some(TokenIssuer {
        header: header.unwrap_or(issuer.header.clone()),
        ..issuer
    }))
}

/// The endpoint answers a POST whose normalised path is exactly `path`, before any route is
/// looked at. A path in a form no normalised request path has (a dot segment, `//`, an
/// escape the normal form decodes, a placeholder) would never answer, its POSTs going on
/// upstream; one a route names literally would take that route's every POST.
fn check_path(path: &str, routes: &[Route]) -> Result<(), CompileError> {
    let err = |m: String| CompileError::new("tokens.path", m);
    if path.contains(['{', '}', '*', '?', '#']) {
        return Err(err(format!(
            "{path:?}: the token endpoint is one literal path, without placeholders or query"
        )));
    }
    crate::route::PathPattern::parse(path).map_err(|e| err(format!("{path:?}: {e}")))?;
    let hidden = routes.iter().find(|r| {
        r.matcher.path.is_literal()
            && r.matcher.methods.contains(&http::Method::POST)
            && r.matcher.path.matches(path)
    });
    if let Some(route) = hidden {
        return Err(err(format!(
            "route {} matches POST {path}, where the token endpoint answers before any route: its requests would never reach the upstream; give the endpoint another `path`",
            route.name
        )));
    }
    Ok(())
}
