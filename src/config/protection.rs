//! What a request gets once its route is known: [`Protection`] off or on, and for a
//! protected route the [`Protected`] bundle every one of its requests shares (key rule,
//! freshness window, policy, caller identity, sealing keys). Also the fallback "route"
//! that POST and PATCH matching no route fall into, and its default key.

use std::sync::Arc;
use std::time::Duration;

use super::policy::Policy;
use crate::key::identity::Identity;
use crate::key::{default_scope, FingerprintRule, KeyRule, KeySource};
use crate::store::seal::KeyRing;

/// Whether and how a request is made idempotent.
#[derive(Debug, Clone)]
pub enum Protection {
    /// Passed through untouched, streaming; the route's own `upstream_timeout` for the
    /// answer's head, if it sets one (else `defaults.upstream_timeout`).
    Off(Option<Duration>),
    /// Buffered, keyed and claimed.
    On(Arc<Protected>),
}

impl Protection {
    /// Whether it enforces a rule: protected, and not only observed.
    pub fn enforces(&self) -> bool {
        matches!(self, Self::On(rule) if !rule.policy.observe)
    }
}

/// A protected route's rule and policy, shared by all its requests.
#[derive(Debug, Clone)]
pub struct Protected {
    /// The route's name (`default` for the fallback).
    pub route: String,
    /// How the key is derived.
    pub key: KeyRule,
    /// Optional timestamp window checked before anything else.
    pub fresh: Option<Freshness>,
    /// Timing and limits.
    pub policy: Policy,
    /// How callers are told apart (shared by all routes).
    pub identity: Arc<Identity>,
    /// The keys stored answers are sealed with, if `store.encrypt` is set.
    pub sealing: Option<Arc<KeyRing>>,
}

/// A freshness window: requests whose timestamp is older than `max_age` or more than
/// `skew` in the future are refused before any store work (replayed captures).
#[derive(Debug, Clone)]
pub struct Freshness {
    /// Where the timestamp is.
    pub source: FreshSource,
    /// Oldest accepted age.
    pub max_age: Duration,
    /// Clock skew tolerated into the future.
    pub skew: Duration,
}

/// Where a freshness timestamp is read from.
#[derive(Debug, Clone)]
pub enum FreshSource {
    /// A request header.
    Header(http::HeaderName),
    /// A JSON body field.
    Field(crate::canonical::JsonPointer),
}

/// The default key for POST/PATCH matching no route: a fingerprint of query and body.
pub fn default_key() -> KeyRule {
    KeyRule {
        source: KeySource::Fingerprint(Box::new(FingerprintRule::standard())),
        required: true,
        scope: default_scope(),
        payload: Box::new(FingerprintRule::standard()),
    }
}

/// Name of the fallback "route" in keys, logs and metrics.
pub const FALLBACK_ROUTE: &str = "default";
