//! `defaults:` and `routes:` compiled into what requests are matched against: the base
//! [`Policy`] every route starts from, the fallback for POST and PATCH matching no route,
//! and each [`Route`] with its matcher and [`Protection`]. Route names are checked here
//! (unique, not the fallback's), and so is every policy (lease, timeouts, limits).

use std::sync::Arc;
use std::time::Duration;

use http::Method;

use super::error::CompileError;
use super::policy::{Policy, StatusPattern, DEFAULT_FINGERPRINT_TTL};
use super::protection::{
    default_key, FreshSource, Freshness, Protected, Protection, FALLBACK_ROUTE,
};
use super::raw::key::RawKeyOrOff;
use super::raw::routes::{Mode, RawDefaults, RawFresh, RawRoute};
use super::units;
use crate::key::identity::Identity;
use crate::key::{KeyRule, KeySource, ScopePart};
use crate::route::RouteMatch;
use crate::store::seal::KeyRing;

/// A named route.
#[derive(Debug, Clone)]
pub struct Route {
    /// Unique name; part of every key derived on it.
    pub name: String,
    /// What requests it covers.
    pub matcher: RouteMatch,
    /// What happens to them.
    pub protection: Protection,
}

/// The routed part of a config.
pub(super) struct Routing {
    /// What a POST or PATCH matching no route gets.
    pub fallback: Protection,
    /// Routes, first match wins.
    pub routes: Vec<Route>,
    /// `defaults.upstream_timeout`, which unprotected requests get too (unless their route
    /// sets its own).
    pub passthrough_timeout: Duration,
}

/// Compiles `defaults:` into the base policy and the fallback, then every route over them.
/// `identity` and `sealing` are what all protected routes share; without `mutual_tls` no
/// scope may name `client_cert`.
pub(super) fn compile_routing(
    defaults: Option<RawDefaults>,
    routes: Option<Vec<RawRoute>>,
    identity: &Arc<Identity>,
    sealing: Option<Arc<KeyRing>>,
    mutual_tls: bool,
) -> Result<Routing, CompileError> {
    let defaults = defaults.unwrap_or_default();
    if defaults.idempotency == Some(Mode::Off) {
        return Err(CompileError::new(
            "defaults.idempotency",
            "`defaults.idempotency` is `on` or `observe`; to let unrouted requests through, write `defaults.key: off`, and a route's own `idempotency: off`",
        ));
    }
    let base = policy_from_defaults(&defaults);
    check_policy(&base)
        .map_err(|e| CompileError::new(format!("defaults.{}", e.field), e.message))?;
    let shared = Shared {
        identity: Arc::clone(identity),
        sealing,
        fingerprint_ttl: defaults
            .fingerprint_ttl
            .map_or(DEFAULT_FINGERPRINT_TTL, |d| d.0),
    };
    if shared.fingerprint_ttl.is_zero() {
        return Err(CompileError::new(
            "defaults.fingerprint_ttl",
            "must be above zero",
        ));
    }
    // The fallback has no `ttl` of its own: `defaults.ttl` is what client-keyed routes get,
    // so a fingerprint fallback keeps the short window.
    let fallback = match defaults.key {
        Some(RawKeyOrOff::Off) => Protection::Off(None),
        Some(RawKeyOrOff::Rule(rule)) => protected(
            FALLBACK_ROUTE,
            *rule,
            base.clone(),
            None,
            RouteTtl::Inherited,
            &shared,
        ),
        None => protected(
            FALLBACK_ROUTE,
            default_key(),
            base.clone(),
            None,
            RouteTtl::Inherited,
            &shared,
        ),
    };
    let default_rule = match &fallback {
        Protection::On(p) => p.key.clone(),
        Protection::Off(_) => default_key(),
    };
    // Routes without a `key` inherit this rule: its error is reported here, once.
    if !mutual_tls && names_client_cert(&default_rule) {
        return Err(CompileError::new(
            "defaults.key.scope",
            client_cert_without_mtls("the default key (`defaults.key`)"),
        )
        .within("client_cert"));
    }
    let mut compiled = Vec::new();
    for (i, r) in routes.unwrap_or_default().into_iter().enumerate() {
        let key = format!("routes[{i}]");
        if r.name.is_empty() || r.name == FALLBACK_ROUTE {
            return Err(CompileError::new(
                format!("{key}.name"),
                format!("route name {:?} is empty or reserved", r.name),
            ));
        }
        if compiled.iter().any(|x: &Route| x.name == r.name) {
            return Err(CompileError::new(
                format!("{key}.name"),
                format!("route name {:?} is used twice", r.name),
            ));
        }
        if let Some(field) = unused_when_off(&r) {
            let off = if r.idempotency == Some(Mode::Off) {
                "an `idempotency: off`"
            } else {
                "a `key: off`"
            };
            return Err(CompileError::new(
                format!("{key}.{field}"),
                format!(
                    "`{field}` has no effect on {off} route: its requests pass through unprotected (only `upstream_timeout` applies)"
                ),
            ));
        }
        let route = compile_route(r, &base, &default_rule, &shared).map_err(|e| {
            let key = match e.field {
                Some(field) => format!("{key}.{field}"),
                None => key.clone(),
            };
            CompileError::new(key, e.message)
        })?;
        if !mutual_tls
            && matches!(&route.protection, Protection::On(p) if names_client_cert(&p.key))
        {
            return Err(CompileError::new(
                format!("{key}.key.scope"),
                client_cert_without_mtls(&format!("route {}", route.name)),
            )
            .within("client_cert"));
        }
        if let Some((j, earlier)) = compiled
            .iter()
            .enumerate()
            .find(|(_, earlier)| earlier.matcher.covers(&route.matcher))
        {
            return Err(CompileError::new(
                format!("{key}.match"),
                format!(
                    "route {:?} is never reached: routes[{j}] ({:?}) comes first and matches every request it does (routes match first to last); put it after {:?}, or narrow that route",
                    route.name, earlier.name, route.name
                ),
            ));
        }
        compiled.push(route);
    }
    Ok(Routing {
        fallback,
        routes: compiled,
        passthrough_timeout: base.upstream_timeout,
    })
}

/// Whether a key is scoped by the client certificate.
fn names_client_cert(rule: &KeyRule) -> bool {
    rule.scope.contains(&ScopePart::ClientCert)
}

/// Why `client_cert` needs mutual TLS, for `what` (a route, the default key, the tokens).
pub(super) fn client_cert_without_mtls(what: &str) -> String {
    format!(
        "{what}: `client_cert` in `scope` needs mutual TLS (`tls.client_ca`): without it no request carries a certificate to tell callers apart by; set `tls.client_ca`, or scope by `caller`"
    )
}

/// What every protected route takes from the top of the config.
struct Shared {
    identity: Arc<Identity>,
    sealing: Option<Arc<KeyRing>>,
    fingerprint_ttl: Duration,
}

/// Where a protected route's `ttl` comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RouteTtl {
    /// The route set `ttl` itself, which holds whatever the key source.
    Own,
    /// Taken from `defaults:`; a key idemgate derives itself (fingerprint) gets the short
    /// `fingerprint_ttl` instead of `defaults.ttl`.
    Inherited,
}

/// A protected route, its `ttl` settled by where it comes from ([`key_lifetime`]).
fn protected(
    route: &str,
    key: KeyRule,
    mut policy: Policy,
    fresh: Option<Freshness>,
    ttl: RouteTtl,
    shared: &Shared,
) -> Protection {
    policy.ttl = key_lifetime(&key, &policy, ttl, shared).0;
    Protection::On(Arc::new(Protected {
        route: route.to_owned(),
        key,
        fresh,
        policy,
        identity: Arc::clone(&shared.identity),
        sealing: shared.sealing.clone(),
    }))
}

/// How long a protected route keeps its keys, and the setting that says so: its own `ttl`,
/// else `defaults.fingerprint_ttl` for a key idemgate derives itself (fingerprint), else
/// `defaults.ttl`.
fn key_lifetime(
    key: &KeyRule,
    policy: &Policy,
    ttl: RouteTtl,
    shared: &Shared,
) -> (Duration, &'static str) {
    match ttl {
        RouteTtl::Own => (policy.ttl, "ttl"),
        RouteTtl::Inherited if matches!(key.source, KeySource::Fingerprint(_)) => {
            (shared.fingerprint_ttl, "defaults.fingerprint_ttl")
        }
        RouteTtl::Inherited => (policy.ttl, "defaults.ttl"),
    }
}

/// `fresh:` for a route that keeps its keys `lifetime` (and the setting that says so). A
/// timestamp is accepted only while the key would still catch its repeat, which is under
/// the lifetime less `skew` ([`Freshness`]); with no such age, the window is refused.
fn compile_fresh(
    f: RawFresh,
    (lifetime, setting): (Duration, &str),
) -> Result<Freshness, RouteError> {
    let source = match (f.header, f.field) {
        (Some(h), None) => FreshSource::Header(h.0),
        (None, Some(p)) => FreshSource::Field(p.0),
        _ => return Err("fresh: give either `header` or `field`".into()),
    };
    let max_age = f.max_age.map_or(Duration::from_secs(300), |d| d.0);
    let skew = f.skew.map_or(Duration::from_secs(30), |d| d.0);
    if lifetime <= skew {
        return Err(RouteError {
            field: Some("fresh.skew"),
            message: format!(
                "`skew` ({}) must be under the time this route keeps its keys ({}, `{setting}`): a request stamped up to `skew` ahead may be sent again as long after its key has expired, so no timestamp could be accepted safely; keep keys longer (the route's `ttl`) or allow less skew",
                units::format_duration(skew),
                units::format_duration(lifetime)
            ),
        });
    }
    let bound = lifetime - skew;
    Ok(Freshness {
        source,
        max_age,
        skew,
        key_bound: (bound <= max_age).then_some(bound),
    })
}

/// The policy keys a raw `defaults:` or route sets, laid over `$base`. A macro because the
/// two raw structs are distinct serde types (`flatten` cannot be combined with
/// `deny_unknown_fields`) that share these fields.
macro_rules! overlay_policy {
    ($raw:expr, $base:expr) => {{
        // Field by field, so a route whose `match` was already moved out still works.
        let base = &$base;
        let upstream_timeout = $raw.upstream_timeout.map_or(base.upstream_timeout, |d| d.0);
        Policy {
            ttl: $raw.ttl.map_or(base.ttl, |d| d.0),
            lease: $raw.lease.map_or(base.lease, |d| d.0),
            upstream_timeout,
            in_flight: $raw.in_flight.unwrap_or(base.in_flight),
            wait_timeout: $raw.wait_timeout.map_or(base.wait_timeout, |d| d.0),
            replay_statuses: $raw
                .replay_statuses
                .clone()
                .unwrap_or_else(|| base.replay_statuses.clone()),
            max_body: $raw.max_body.map_or(base.max_body, |b| b.0 as usize),
            on_store_error: $raw.on_store_error.unwrap_or(base.on_store_error),
            on_unknown_outcome: $raw.on_unknown_outcome.unwrap_or(base.on_unknown_outcome),
            // Inherited, it grows to a longer `upstream_timeout` set here (`defaults: {
            // upstream_timeout: 15m }` is not refused for the 10m it never set); set here,
            // it is checked against it.
            background_timeout: $raw
                .background_timeout
                .map_or(base.background_timeout.max(upstream_timeout), |d| d.0),
            max_answer: $raw.max_answer.map_or(base.max_answer, |b| b.0 as usize),
            observe: match $raw.idempotency {
                Some(Mode::Observe) => true,
                Some(Mode::On) => false,
                Some(Mode::Off) | None => base.observe,
            },
        }
    }};
}

/// Whether a route passes its requests through unprotected.
fn is_off(r: &RawRoute) -> bool {
    matches!(r.idempotency, Some(Mode::Off)) || matches!(r.key, Some(RawKeyOrOff::Off))
}

/// The first key an unprotected route sets that would do nothing there: a key rule, a
/// freshness window, any policy key but `upstream_timeout` (which bounds the answer's
/// head). Refused rather than ignored, so a config never seems to say what it does not.
fn unused_when_off(r: &RawRoute) -> Option<&'static str> {
    if !is_off(r) {
        return None;
    }
    let set = [
        ("key", matches!(r.key, Some(RawKeyOrOff::Rule(_)))),
        ("fresh", r.fresh.is_some()),
        ("ttl", r.ttl.is_some()),
        ("lease", r.lease.is_some()),
        ("in_flight", r.in_flight.is_some()),
        ("wait_timeout", r.wait_timeout.is_some()),
        ("replay_statuses", r.replay_statuses.is_some()),
        ("max_body", r.max_body.is_some()),
        ("on_store_error", r.on_store_error.is_some()),
        ("on_unknown_outcome", r.on_unknown_outcome.is_some()),
        ("background_timeout", r.background_timeout.is_some()),
        ("max_answer", r.max_answer.is_some()),
    ];
    set.into_iter().find_map(|(field, on)| on.then_some(field))
}

/// Why a route does not compile: a message, and the route's key it is about when one is.
struct RouteError {
    field: Option<&'static str>,
    message: String,
}

impl From<String> for RouteError {
    fn from(message: String) -> Self {
        Self {
            field: None,
            message,
        }
    }
}

impl From<&str> for RouteError {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

impl From<PolicyError> for RouteError {
    fn from(e: PolicyError) -> Self {
        Self {
            field: Some(e.field),
            message: e.message,
        }
    }
}

fn compile_route(
    r: RawRoute,
    base: &Policy,
    default_rule: &KeyRule,
    shared: &Shared,
) -> Result<Route, RouteError> {
    let off = is_off(&r);
    let methods = match r.matcher.methods {
        Some(m) if m.is_empty() => return Err("match.methods is empty".into()),
        Some(m) => m.into_iter().map(|m| m.0).collect(),
        // An unprotected route covers every method; a protected one the two unsafe by default.
        None if off => vec![Method::POST, Method::PATCH, Method::PUT, Method::DELETE],
        None => vec![Method::POST, Method::PATCH],
    };
    let matcher = RouteMatch {
        host: r.matcher.host.map(|h| h.0),
        methods,
        path: r.matcher.path.0,
    };
    if off {
        let head = r.upstream_timeout.map(|d| d.0);
        if head.is_some_and(|d| d.is_zero()) {
            return Err("upstream_timeout must be above zero".into());
        }
        return Ok(Route {
            name: r.name,
            matcher,
            protection: Protection::Off(head),
        });
    }
    let ttl = if r.ttl.is_some() {
        RouteTtl::Own
    } else {
        RouteTtl::Inherited
    };
    let policy = overlay_policy!(r, *base);
    check_policy(&policy)?;
    let key = match r.key {
        Some(RawKeyOrOff::Rule(rule)) => *rule,
        _ => default_rule.clone(),
    };
    let lifetime = key_lifetime(&key, &policy, ttl, shared);
    let fresh = r.fresh.map(|f| compile_fresh(f, lifetime)).transpose()?;
    Ok(Route {
        protection: protected(&r.name, key, policy, fresh, ttl, shared),
        name: r.name,
        matcher,
    })
}

fn policy_from_defaults(d: &RawDefaults) -> Policy {
    overlay_policy!(d, Policy::default())
}

/// A policy value out of range: the policy key it is about, and why.
struct PolicyError {
    field: &'static str,
    message: String,
}

fn check_policy(p: &Policy) -> Result<(), PolicyError> {
    let refuse = |field, message: String| Err(PolicyError { field, message });
    // No answer would outlive its own request: every repeat would run again, as on an
    // unprotected route (and a zero read as "never expires" would be the opposite).
    if p.ttl.is_zero() {
        return refuse(
            "ttl",
            "ttl must be above zero: answers stored for no time are never replayed, so every repeat runs again".into(),
        );
    }
    if p.lease < Duration::from_millis(100) {
        return refuse(
            "lease",
            "lease must be at least 100ms: renewals run at a third of it".into(),
        );
    }
    if p.upstream_timeout.is_zero() {
        return refuse(
            "upstream_timeout",
            "upstream_timeout must be above zero".into(),
        );
    }
    if p.background_timeout < p.upstream_timeout {
        return refuse(
            "background_timeout",
            format!(
                "background_timeout ({}) must be at least upstream_timeout ({}): it is how long \
                 an owner keeps waiting after its client got the 504",
                units::format_duration(p.background_timeout),
                units::format_duration(p.upstream_timeout)
            ),
        );
    }
    if p.max_answer == 0 {
        return refuse("max_answer", "max_answer must be above zero".into());
    }
    if p.replay_statuses
        .iter()
        .any(|s| s.covers(500) || matches!(s, StatusPattern::Class(5)))
    {
        tracing::warn!(
            "replay_statuses includes 5xx: failed answers will be replayed, not retried"
        );
    }
    Ok(())
}
