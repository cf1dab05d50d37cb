//! What a key rule decides from the request head alone: a `header` or `token` route reads
//! its key from a header, so a key that is missing where required, repeated or malformed
//! is refused before the body is read ([`refusal`]), and [`derive_key`](super::derive_key)
//! reads it through the same functions: the two cannot disagree.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName};

use super::KeyError;
use crate::key::client_key::{read_client_key, ClientKeyError};
use crate::key::{KeyRule, KeySource, TokenRule};

/// The refusal a request with `headers` gets under `rule` whatever its body, if any.
/// `fields` and `fingerprint` rules read the body, so they refuse nothing here.
///
/// ```
/// use http::{HeaderMap, HeaderName};
/// use idemgate::key::{head_refusal, FingerprintRule, KeyRule, KeySource};
/// let rule = KeyRule {
///     source: KeySource::Header(HeaderName::from_static("idempotency-key")),
///     required: true,
///     scope: idemgate::key::default_scope(),
///     payload: Box::new(FingerprintRule::standard()),
/// };
/// assert!(head_refusal(&rule, &HeaderMap::new()).is_err());
/// let mut headers = HeaderMap::new();
/// headers.insert("idempotency-key", "k-1".parse().unwrap());
/// assert!(head_refusal(&rule, &headers).is_ok());
/// ```
pub fn refusal(rule: &KeyRule, headers: &HeaderMap) -> Result<(), KeyError> {
    match &rule.source {
        KeySource::Header(name) => client_key(rule, name, headers).map(drop),
        KeySource::Token(token_rule) => token(rule, token_rule, headers).map(drop),
        KeySource::Fields(_) | KeySource::Fingerprint(_) => Ok(()),
    }
}

/// A `header` rule's client key; `None` when it is absent and not required.
pub(super) fn client_key<'h>(
    rule: &KeyRule,
    name: &HeaderName,
    headers: &'h HeaderMap,
) -> Result<Option<Cow<'h, [u8]>>, KeyError> {
    match read_client_key(headers, name) {
        Ok(key) => Ok(Some(key)),
        Err(ClientKeyError::Missing(_)) if !rule.required => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A `token` rule's token; `None` when it is absent and not required. One that is repeated
/// or is not what the proxy issues gets the one answer every invalid token gets.
pub(super) fn token<'h>(
    rule: &KeyRule,
    token_rule: &TokenRule,
    headers: &'h HeaderMap,
) -> Result<Option<Cow<'h, [u8]>>, KeyError> {
    let token = match read_client_key(headers, &token_rule.header) {
        Ok(t) => t,
        Err(ClientKeyError::Missing(_)) if !rule.required => return Ok(None),
        Err(ClientKeyError::Missing(name)) => return Err(ClientKeyError::Missing(name).into()),
        Err(_) => return Err(KeyError::TokenInvalid),
    };
    if !is_token(&token) {
        return Err(KeyError::TokenInvalid);
    }
    Ok(Some(token))
}

/// Issued tokens are 128 random bits in lower-case hex.
fn is_token(token: &[u8]) -> bool {
    token.len() == 32
        && token
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}
