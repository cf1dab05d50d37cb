//! What a request gets once its route is known: [`Protection`] off or on, and for a
//! protected route the [`Protected`] bundle every one of its requests shares (key rule,
//! freshness window, policy, caller identity, sealing keys). Also the fallback "route"
//! that POST and PATCH matching no route fall into, and its default key.

use std::sync::Arc;
use std::time::Duration;

use super::policy::Policy;
use super::units::format_duration;
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

/// A freshness window: requests whose timestamp is too old, or more than `skew` in the
/// future, are refused before any store work (replayed captures). Too old is older than
/// `max_age`, or, on a route whose key is kept less than `max_age + skew`, as old as that
/// lifetime less `skew` ([`key_bound`](Self::key_bound)): a request accepted at `A` with a
/// timestamp up to `skew` ahead has its key kept at least `ttl` from `A`, so a repeat its
/// key no longer catches is at least `ttl - skew` old, and must be refused.
#[derive(Debug, Clone)]
pub struct Freshness {
    /// Where the timestamp is.
    pub source: FreshSource,
    /// Oldest accepted age, as written (`max_age`, default 5m).
    pub max_age: Duration,
    /// Clock skew tolerated into the future.
    pub skew: Duration,
    /// The route's key lifetime less `skew`, when it is not above `max_age`: the age from
    /// which a timestamp is refused, so that no request runs whose repeat its key would
    /// not catch.
    pub key_bound: Option<Duration>,
}

impl Freshness {
    /// Whether a timestamp `age_ms` milliseconds old is refused as too old.
    pub fn too_old(&self, age_ms: i128) -> bool {
        match self.key_bound {
            Some(bound) => age_ms >= bound.as_millis() as i128,
            None => age_ms > self.max_age.as_millis() as i128,
        }
    }

    /// The ages accepted, as a refused client is told them.
    pub fn accepted_ages(&self) -> String {
        match self.key_bound {
            Some(bound) => format!(
                "under {}, while its key still catches a repeat",
                format_duration(bound)
            ),
            None => format!("up to {}", format_duration(self.max_age)),
        }
    }

    /// What `check` says of a window its route's key lifetime `ttl` shortens.
    pub fn note(&self, route: &str, ttl: Duration) -> Option<String> {
        let bound = self.key_bound?;
        let (max_age, skew) = (self.max_age, self.skew);
        Some(format!(
            "route {route}: `fresh.max_age` {} is more than its key is kept ({}) less `skew` ({}): a request sent again once its key has expired would run again, so timestamps are accepted only while under {} old; to accept {} keep the key longer than {} (the route's `ttl`), or write a `max_age` under {}",
            format_duration(max_age),
            format_duration(ttl),
            format_duration(skew),
            format_duration(bound),
            format_duration(max_age),
            format_duration(max_age + skew),
            format_duration(bound),
        ))
    }
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
