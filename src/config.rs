//! Configuration: `proxy.yaml` parsed into raw serde structs ([`raw`]), then checked and
//! compiled into the runtime [`Config`] the proxy serves from (durations, compiled patterns,
//! key rules). Every error names the file, line, column and key.

mod raw;
pub mod units;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::Method;

use crate::canonical::IgnoreSet;
use crate::key::derive::DEFAULT_IGNORE;
use crate::key::{default_scope, FingerprintRule, KeyRule, KeySource};

use crate::route::RouteMatch;
use crate::store::redis::RedisSettings;
use crate::store::MemoryLimits;
pub use raw::{InFlightMode, OnStoreError, StatusPattern};
use raw::{RawConfig, RawDefaults, RawKeyOrOff, RawRoute};

/// A config that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Read {
        /// Path as given.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid config.
    #[error("{file}:{line}:{column}: {key}: {message}")]
    Invalid {
        /// Path as given.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The offending key, e.g. `routes[1].ttl`.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// The validated runtime configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the proxy listens.
    pub listen: SocketAddr,
    /// The application behind it.
    pub upstream: Upstream,
    /// Admin listener, if any.
    pub admin: Option<Admin>,
    /// How long a shutdown waits for open requests (`drain_timeout`, default 30s).
    pub drain_timeout: Duration,
    /// TLS termination on the listener (`tls: { cert, key, client_ca }`), read at load so
    /// a reload picks up renewed certificates.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The one-time token endpoint, when `tokens:` is set or a route uses token keys.
    pub tokens: Option<TokenIssuer>,
    /// Store backend and bounds.
    pub store: StoreConfig,
    /// What a POST or PATCH matching no route gets.
    pub fallback: Protection,
    /// How long an unprotected request may wait for the upstream's response head
    /// (`defaults.upstream_timeout`).
    pub passthrough_timeout: Duration,
    /// Routes, first match wins.
    pub routes: Vec<Route>,
}

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
    /// Whose token it is; token routes must use the same scope.
    pub scope: Vec<crate::key::ScopePart>,
    /// The header token routes read it from, for the issue answer.
    pub header: http::HeaderName,
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

/// The admin listener.
#[derive(Debug, Clone)]
pub struct Admin {
    /// Address; keep it on loopback or a private interface.
    pub listen: SocketAddr,
    /// Bearer token required for everything but `/healthz` and `/readyz`.
    pub token: Option<String>,
}

/// The upstream origin.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// Host and port.
    pub authority: Authority,
    /// For `https`: roots from `upstream_ca`, or the system's.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// Store backend choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// The embedded memory store.
    Memory(MemoryLimits),
    /// Redis, shared by several replicas.
    Redis(RedisSettings),
}

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

/// Whether and how a request is made idempotent.
#[derive(Debug, Clone)]
pub enum Protection {
    /// Passed through untouched, streaming.
    Off,
    /// Buffered, keyed and claimed.
    On(Arc<Protected>),
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
}

/// Timing and limits of a protected route.
#[derive(Debug, Clone)]
pub struct Policy {
    /// How long a completed response is replayed.
    pub ttl: Duration,
    /// How long a claim outlives a vanished owner.
    pub lease: Duration,
    /// Longest wait for the upstream's full answer.
    pub upstream_timeout: Duration,
    /// What a duplicate of a running request gets.
    pub in_flight: InFlightMode,
    /// Longest hold of a duplicate in `wait` mode.
    pub wait_timeout: Duration,
    /// Which statuses are stored and replayed.
    pub replay_statuses: Vec<StatusPattern>,
    /// Largest request body buffered.
    pub max_body: usize,
    /// What a store failure means.
    pub on_store_error: OnStoreError,
}

impl Policy {
    /// Whether a response with `status` is stored for replay.
    pub fn replays(&self, status: u16) -> bool {
        self.replay_statuses.iter().any(|p| p.covers(status))
    }
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(30),
            upstream_timeout: Duration::from_secs(60),
            in_flight: InFlightMode::Wait,
            wait_timeout: Duration::from_secs(10),
            replay_statuses: vec![StatusPattern::Class(2), StatusPattern::Class(4)],
            max_body: 1 << 20,
            on_store_error: OnStoreError::FailClosed,
        }
    }
}

/// The default key for POST/PATCH matching no route: a fingerprint of query and body.
pub fn default_key() -> KeyRule {
    KeyRule {
        source: KeySource::Fingerprint(Box::new(FingerprintRule {
            query: true,
            body: true,
            ignore: IgnoreSet::clone(&DEFAULT_IGNORE),
        })),
        required: true,
        scope: default_scope(),
    }
}

/// Name of the fallback "route" in keys, logs and metrics.
pub const FALLBACK_ROUTE: &str = "default";

impl Config {
    /// Reads and validates a config file; relative paths in it (certificates) are relative
    /// to the file's directory.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: file.clone(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse_in(&text, &file, base)
    }

    /// Validates config text; `file` is only used in error messages, relative paths are
    /// taken from the working directory.
    pub fn parse(text: &str, file: &str) -> Result<Self, ConfigError> {
        Self::parse_in(text, file, Path::new("."))
    }

    /// Validates config text whose relative paths are relative to `base`.
    pub fn parse_in(text: &str, file: &str, base: &Path) -> Result<Self, ConfigError> {
        let deserializer = serde_yaml_ng::Deserializer::from_str(text);
        let raw: RawConfig = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let (line, column) = inner.location().map_or((1, 1), |l| (l.line(), l.column()));
            ConfigError::Invalid {
                file: file.to_owned(),
                line,
                column,
                message: tidy_message(&inner.to_string(), &key),
                key: if key == "." { "(top)".into() } else { key },
            }
        })?;
        compile(raw, base).map_err(|(key, message, needle)| {
            let (line, column) = locate(text, &needle);
            ConfigError::Invalid {
                file: file.to_owned(),
                line,
                column,
                key,
                message,
            }
        })
    }

    /// Which route a request belongs to, and what protection it gets.
    pub fn protection_for(
        &self,
        host: Option<&str>,
        method: &Method,
        path: &str,
    ) -> (&str, &Protection) {
        if crate::route::is_safe(method) {
            return ("", &Protection::Off);
        }
        for route in &self.routes {
            if route.matcher.matches(host, method, path) {
                return (&route.name, &route.protection);
            }
        }
        if *method == Method::POST || *method == Method::PATCH {
            (FALLBACK_ROUTE, &self.fallback)
        } else {
            ("", &Protection::Off)
        }
    }
}

/// serde_yaml_ng writes "routes[0]: unknown field … at line L column C"; we print the
/// place and key in front instead, so both are cut from the message.
fn tidy_message(message: &str, key: &str) -> String {
    let message = match message.rfind(" at line ") {
        Some(at) => &message[..at],
        None => message,
    };
    match message.split_once(": ") {
        Some((path, rest)) if !path.is_empty() && key.starts_with(path) => rest.to_owned(),
        _ => message.to_owned(),
    }
}

/// The line and column where `needle` first appears, for errors found after parsing.
fn locate(text: &str, needle: &str) -> (usize, usize) {
    if needle.is_empty() {
        return (1, 1);
    }
    for (i, line) in text.lines().enumerate() {
        if let Some(col) = line.find(needle) {
            return (i + 1, col + 1);
        }
    }
    (1, 1)
}

/// (key, message, text to locate) of an error found after parsing.
type CompileError = (String, String, String);

fn compile(raw: RawConfig, base: &Path) -> Result<Config, CompileError> {
    let mut upstream = parse_upstream(&raw.upstream).map_err(|m| {
        (
            "upstream".to_owned(),
            m,
            format!("upstream: {}", raw.upstream),
        )
    })?;
    let path = |p: &str| base.join(p);
    if upstream.scheme == Scheme::HTTPS {
        let ca = raw.upstream_ca.as_deref().map(path);
        let client = crate::tls::upstream_client_config(ca.as_deref()).map_err(|e| {
            (
                "upstream_ca".to_owned(),
                e.to_string(),
                "upstream_ca".to_owned(),
            )
        })?;
        upstream.tls = Some(Arc::new(client));
    } else if raw.upstream_ca.is_some() {
        return Err((
            "upstream_ca".into(),
            "only an https:// upstream uses a CA".into(),
            "upstream_ca".into(),
        ));
    }
    let tls = match &raw.tls {
        None => None,
        Some(t) => Some(
            crate::tls::server_config(
                &path(&t.cert),
                &path(&t.key),
                t.client_ca.as_deref().map(path).as_deref(),
            )
            .map_err(|e| ("tls".to_owned(), e.to_string(), "tls:".to_owned()))?,
        ),
    };
    let store = match raw.store {
        None => StoreConfig::Memory(MemoryLimits::default()),
        Some(s) => compile_store(s, base)?,
    };
    let defaults = raw.defaults.unwrap_or_default();
    let base = policy_from_defaults(&defaults);
    check_policy(&base).map_err(|m| ("defaults".to_owned(), m, "defaults:".to_owned()))?;
    let fallback = match defaults.key {
        Some(RawKeyOrOff::Off) => Protection::Off,
        Some(RawKeyOrOff::Rule(rule)) => protected(FALLBACK_ROUTE, *rule, base.clone()),
        None => protected(FALLBACK_ROUTE, default_key(), base.clone()),
    };
    let default_rule = match &fallback {
        Protection::On(p) => p.key.clone(),
        Protection::Off => default_key(),
    };
    let mut routes = Vec::new();
    for (i, r) in raw.routes.unwrap_or_default().into_iter().enumerate() {
        let key = format!("routes[{i}]");
        let needle = format!("name: {}", r.name);
        if r.name.is_empty() || r.name == FALLBACK_ROUTE {
            return Err((
                format!("{key}.name"),
                format!("route name {:?} is empty or reserved", r.name),
                needle,
            ));
        }
        if routes.iter().any(|x: &Route| x.name == r.name) {
            return Err((
                format!("{key}.name"),
                format!("route name {:?} is used twice", r.name),
                needle,
            ));
        }
        let route =
            compile_route(r, &base, &default_rule).map_err(|m| (key.clone(), m, needle.clone()))?;
        routes.push(route);
    }
    let tokens = compile_tokens(raw.tokens, &mut routes)?;
    Ok(Config {
        listen: raw.listen.0,
        upstream,
        admin: raw.admin.map(|a| Admin {
            listen: a.listen,
            token: a.token,
        }),
        drain_timeout: raw.drain_timeout.map_or(Duration::from_secs(30), |d| d.0),
        tls,
        tokens,
        store,
        passthrough_timeout: base.upstream_timeout,
        fallback,
        routes,
    })
}

/// Builds the token endpoint when `tokens:` is set or a route uses token keys, fills in
/// the routes' reissue window, and checks they bind tokens to the endpoint's scope.
fn compile_tokens(
    raw: Option<raw::RawTokens>,
    routes: &mut [Route],
) -> Result<Option<TokenIssuer>, CompileError> {
    let uses_tokens = routes.iter().any(|r| {
        matches!(&r.protection, Protection::On(p) if matches!(p.key.source, KeySource::Token(_)))
    });
    if raw.is_none() && !uses_tokens {
        return Ok(None);
    }
    let raw = raw.unwrap_or_default();
    let issuer = TokenIssuer {
        path: raw.path.unwrap_or_else(|| "/.idemgate/token".to_owned()),
        ttl: raw.ttl.map_or(Duration::from_secs(300), |d| d.0),
        rate: raw.rate.unwrap_or(20),
        window: raw.window.map_or(Duration::from_secs(60), |d| d.0),
        scope: raw.scope.map_or_else(default_scope, |parts| {
            parts.into_iter().map(|p| p.0).collect()
        }),
        header: http::HeaderName::from_static("idempotency-token"),
    };
    if !issuer.path.starts_with('/') || issuer.rate == 0 || issuer.ttl.is_zero() {
        return Err((
            "tokens".into(),
            "path must start with '/', rate and ttl must be above zero".into(),
            "tokens:".into(),
        ));
    }
    let mut header = None;
    for (i, route) in routes.iter_mut().enumerate() {
        let Protection::On(p) = &mut route.protection else {
            continue;
        };
        let KeySource::Token(rule) = &p.key.source else {
            continue;
        };
        if p.key.scope != issuer.scope {
            return Err((
                format!("routes[{i}].key.scope"),
                "a token route must use the same scope as `tokens.scope` (whose token it is)"
                    .into(),
                format!("name: {}", route.name),
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

fn compile_store(s: raw::RawStore, base: &Path) -> Result<StoreConfig, CompileError> {
    let err = |key: &str, message: &str, needle: &str| {
        (key.to_owned(), message.to_owned(), needle.to_owned())
    };
    match (s.memory, s.redis) {
        (Some(m), None) => {
            let defaults = MemoryLimits::default();
            let limits = MemoryLimits {
                max_entries: m.max_entries.unwrap_or(defaults.max_entries),
                max_bytes: m.max_bytes.map_or(defaults.max_bytes, |b| b.0 as usize),
            };
            if limits.max_entries == 0 || limits.max_bytes == 0 {
                return Err(err(
                    "store.memory",
                    "max_entries and max_bytes must be above zero",
                    "memory",
                ));
            }
            Ok(StoreConfig::Memory(limits))
        }
        (None, Some(r)) => {
            let cluster: Vec<String> = r
                .cluster
                .unwrap_or_default()
                .into_iter()
                .map(|u| u.0 .0)
                .collect();
            let url = r.url.map(|u| u.0 .0);
            // Both given, or neither.
            if url.is_some() != cluster.is_empty() {
                return Err(err(
                    "store.redis",
                    "give either `url` (one server) or `cluster` (seed nodes)",
                    "redis",
                ));
            }
            let timeout = r.timeout.map_or(Duration::from_secs(1), |d| d.0);
            if timeout.is_zero() {
                return Err(err("store.redis.timeout", "must be above zero", "timeout"));
            }
            let ca = match &r.ca {
                Some(path) => Some(
                    std::fs::read(base.join(path))
                        .map_err(|e| err("store.redis.ca", &format!("{path}: {e}"), "ca:"))?,
                ),
                None => None,
            };
            Ok(StoreConfig::Redis(RedisSettings {
                url,
                cluster,
                prefix: r.prefix.unwrap_or_else(|| "idemgate:".to_owned()),
                timeout,
                ca,
            }))
        }
        _ => Err(err(
            "store",
            "name exactly one backend: `memory` or `redis`",
            "store:",
        )),
    }
}

fn protected(route: &str, key: KeyRule, policy: Policy) -> Protection {
    protected_with(route, key, policy, None)
}

fn protected_with(
    route: &str,
    key: KeyRule,
    policy: Policy,
    fresh: Option<Freshness>,
) -> Protection {
    Protection::On(Arc::new(Protected {
        route: route.to_owned(),
        key,
        fresh,
        policy,
    }))
}

fn compile_fresh(f: raw::RawFresh) -> Result<Freshness, String> {
    let source = match (f.header, f.field) {
        (Some(h), None) => FreshSource::Header(h.0),
        (None, Some(p)) => FreshSource::Field(p.0),
        _ => return Err("fresh: give either `header` or `field`".into()),
    };
    Ok(Freshness {
        source,
        max_age: f.max_age.map_or(Duration::from_secs(300), |d| d.0),
        skew: f.skew.map_or(Duration::from_secs(30), |d| d.0),
    })
}

/// The policy keys a raw `defaults:` or route sets, laid over `$base`. A macro because the
/// two raw structs are distinct serde types (`flatten` cannot be combined with
/// `deny_unknown_fields`) that share these eight fields.
macro_rules! overlay_policy {
    ($raw:expr, $base:expr) => {{
        // Field by field, so a route whose `match` was already moved out still works.
        let base = &$base;
        Policy {
            ttl: $raw.ttl.map_or(base.ttl, |d| d.0),
            lease: $raw.lease.map_or(base.lease, |d| d.0),
            upstream_timeout: $raw.upstream_timeout.map_or(base.upstream_timeout, |d| d.0),
            in_flight: $raw.in_flight.unwrap_or(base.in_flight),
            wait_timeout: $raw.wait_timeout.map_or(base.wait_timeout, |d| d.0),
            replay_statuses: $raw
                .replay_statuses
                .clone()
                .unwrap_or_else(|| base.replay_statuses.clone()),
            max_body: $raw.max_body.map_or(base.max_body, |b| b.0 as usize),
            on_store_error: $raw.on_store_error.unwrap_or(base.on_store_error),
        }
    }};
}

fn compile_route(r: RawRoute, base: &Policy, default_rule: &KeyRule) -> Result<Route, String> {
    let off =
        matches!(r.idempotency, Some(raw::OnOff(false))) || matches!(r.key, Some(RawKeyOrOff::Off));
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
        return Ok(Route {
            name: r.name,
            matcher,
            protection: Protection::Off,
        });
    }
    let policy = overlay_policy!(r, *base);
    check_policy(&policy)?;
    let key = match r.key {
        Some(RawKeyOrOff::Rule(rule)) => *rule,
        _ => default_rule.clone(),
    };
    let fresh = r.fresh.map(compile_fresh).transpose()?;
    Ok(Route {
        protection: protected_with(&r.name, key, policy, fresh),
        name: r.name,
        matcher,
    })
}

fn policy_from_defaults(d: &RawDefaults) -> Policy {
    overlay_policy!(d, Policy::default())
}

fn check_policy(p: &Policy) -> Result<(), String> {
    if p.lease < Duration::from_millis(100) {
        return Err("lease must be at least 100ms: renewals run at a third of it".into());
    }
    if p.upstream_timeout.is_zero() {
        return Err("upstream_timeout must be above zero".into());
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

fn parse_upstream(text: &str) -> Result<Upstream, String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    let scheme = uri
        .scheme()
        .cloned()
        .ok_or("the upstream needs a scheme: http://")?;
    if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
        return Err(format!("upstream scheme {scheme}: use http:// or https://"));
    }
    let authority = uri
        .authority()
        .cloned()
        .ok_or("the upstream needs a host")?;
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err("the upstream is an origin (scheme, host, port), without a path".into());
    }
    Ok(Upstream {
        scheme,
        authority,
        tls: None,
    })
}
