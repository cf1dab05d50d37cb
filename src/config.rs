//! Configuration: `proxy.yaml` parsed into raw serde structs ([`raw`]), then checked and
//! compiled into the runtime [`Config`] the proxy serves from (durations, compiled patterns,
//! key rules). Every error names the file, line, column and key.

mod raw;
mod secrets;
pub mod units;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::Method;

use crate::key::identity::Identity;
use crate::key::{default_scope, FingerprintRule, KeyRule, KeySource};
use crate::store::seal::KeyRing;

use crate::route::RouteMatch;
use crate::store::redis::RedisSettings;
use crate::store::{MemoryLimits, SqlSettings};
pub use raw::{InFlightMode, OnStoreError, OnUnknownOutcome, StatusPattern};
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
    /// How callers are told apart (`trusted_proxies`, `session_cookies`).
    pub identity: Arc<Identity>,
    /// The keys stored answers are sealed with (`store.encrypt`), if any. Read at load, so
    /// a reload picks up a rotation.
    pub encrypt: Option<Arc<KeyRing>>,
    /// Connection caps, timeouts and lingering close (`connections:`).
    pub connections: Connections,
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
    /// How callers are told apart, for the token's scope.
    pub identity: Arc<Identity>,
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
    /// Bearer token required for everything but `/healthz` and `/readyz` (`token`, or
    /// the contents of `token_file`); stored bodies are shown only with one.
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
    /// A PostgreSQL table, shared by replicas and durable.
    Postgres(SqlSettings),
    /// A MySQL or MariaDB table, shared by replicas and durable.
    Mysql(SqlSettings),
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
    /// How callers are told apart (shared by all routes).
    pub identity: Arc<Identity>,
    /// The keys stored answers are sealed with, if `store.encrypt` is set.
    pub sealing: Option<Arc<KeyRing>>,
}

/// Timing and limits of a protected route.
#[derive(Debug, Clone)]
pub struct Policy {
    /// How long a completed response is replayed: the route's `ttl`, else
    /// `defaults.fingerprint_ttl` for a key idemgate derives itself (fingerprint) and
    /// `defaults.ttl` for one the client or the business supplies.
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
    /// What a key whose request may have run, with no known outcome, becomes.
    pub on_unknown_outcome: OnUnknownOutcome,
    /// How long an owner keeps waiting for the upstream after its client got a 504, to
    /// store the answer for retries (at least `upstream_timeout`).
    pub background_timeout: Duration,
    /// Largest answer buffered and stored; a larger one streams to its client and the key
    /// records "executed, answer not stored".
    pub max_answer: usize,
    /// `idempotency: observe`: every request is forwarded unchanged, and what enforcing
    /// would have done (replay, hold, refuse) is only counted and logged.
    pub observe: bool,
}

impl Policy {
    /// Whether a response with `status` is stored for replay. The transient statuses
    /// ([`TRANSIENT_STATUSES`]) are released like a 5xx unless listed exactly: a class
    /// such as `4xx` does not cover them.
    pub fn replays(&self, status: u16) -> bool {
        if TRANSIENT_STATUSES.contains(&status) {
            return self.replay_statuses.contains(&StatusPattern::Exact(status));
        }
        self.replay_statuses.iter().any(|p| p.covers(status))
    }

    /// What this route's claim means once its owner stopped renewing it: held as an
    /// unknown outcome for the route's window, or taken over once the dead owner's call
    /// cannot still run (its lease plus the background bound after its last renewal).
    pub fn lapse(&self) -> crate::store::Lapse {
        match self.on_unknown_outcome {
            OnUnknownOutcome::Hold => crate::store::Lapse::Hold { ttl: self.ttl },
            OnUnknownOutcome::Release => crate::store::Lapse::Release {
                grace: self.background_timeout,
            },
        }
    }
}

/// Answers that say "not now" rather than "no": request timeout, conflict, too early, too
/// many requests. Replaying one would refuse the caller's retry forever.
pub const TRANSIENT_STATUSES: [u16; 4] = [408, 409, 425, 429];

/// How long a key idemgate derives itself (fingerprint) lives by default: long enough for
/// double clicks and retries after an upstream timeout, short enough that the same user
/// doing the same thing again later is not swallowed.
pub const DEFAULT_FINGERPRINT_TTL: Duration = Duration::from_secs(120);

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
            on_unknown_outcome: OnUnknownOutcome::Hold,
            background_timeout: Duration::from_secs(600),
            max_answer: 8 << 20,
            observe: false,
        }
    }
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

    /// What `idemgate check` (and `run`, as warnings) points out in a config that loads:
    /// settings that work but let callers share keys, with what to write instead.
    pub fn notes(&self) -> Vec<String> {
        use crate::key::ScopePart;
        let fallback = std::iter::once((FALLBACK_ROUTE, &self.fallback));
        let routes = self.routes.iter().map(|r| (r.name.as_str(), &r.protection));
        let mut notes = Vec::new();
        for (name, protection) in fallback.chain(routes) {
            let Protection::On(p) = protection else {
                continue;
            };
            let scope = &p.key.scope;
            let names_a_caller = scope.iter().any(|part| {
                matches!(
                    part,
                    ScopePart::Caller | ScopePart::ClientIp | ScopePart::ClientCert
                )
            });
            if !names_a_caller {
                let parts: Vec<String> = scope.iter().map(ToString::to_string).collect();
                let mut with_caller = parts.clone();
                with_caller.push("caller".into());
                notes.push(format!(
                    "route {name}: scope [{}] has no part every request carries, so requests without it share one key across callers; write `scope: [{}]` (or drop `scope` for the default, `caller`)",
                    parts.join(", "),
                    with_caller.join(", ")
                ));
            }
        }
        notes
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
    let (store, encrypt) = match raw.store {
        None => (StoreConfig::Memory(MemoryLimits::default()), None),
        Some(mut s) => {
            let encrypt = s
                .encrypt
                .take()
                .map(|e| secrets::compile_encrypt(e, base))
                .transpose()?;
            let no_backend = s.memory.is_none()
                && s.redis.is_none()
                && s.postgres.is_none()
                && s.mysql.is_none();
            let store = if no_backend && encrypt.is_some() {
                // `store: { encrypt: … }` alone: the default backend, sealed.
                StoreConfig::Memory(MemoryLimits::default())
            } else {
                compile_store(s, base)?
            };
            (store, encrypt)
        }
    };
    let admin = raw
        .admin
        .map(|a| secrets::compile_admin(a, base))
        .transpose()?;
    let identity = Arc::new(Identity {
        trusted_proxies: raw
            .trusted_proxies
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.0)
            .collect(),
        session_cookies: match raw.session_cookies {
            Some(names) => {
                if let Some(bad) = names.iter().find(|n| !is_cookie_name(n)) {
                    return Err((
                        "session_cookies".into(),
                        format!("{bad:?} is not a cookie name"),
                        "session_cookies".into(),
                    ));
                }
                names
            }
            None => Identity::default().session_cookies,
        },
    });
    let defaults = raw.defaults.unwrap_or_default();
    if defaults.idempotency == Some(raw::Mode::Off) {
        return Err((
            "defaults.idempotency".into(),
            "`defaults.idempotency` is `on` or `observe`; to let unrouted requests through, write `defaults.key: off`, and a route's own `idempotency: off`".into(),
            "idempotency".into(),
        ));
    }
    let base = policy_from_defaults(&defaults);
    check_policy(&base).map_err(|m| ("defaults".to_owned(), m, "defaults:".to_owned()))?;
    let shared = Shared {
        identity: Arc::clone(&identity),
        sealing: encrypt.clone(),
        fingerprint_ttl: defaults
            .fingerprint_ttl
            .map_or(DEFAULT_FINGERPRINT_TTL, |d| d.0),
    };
    if shared.fingerprint_ttl.is_zero() {
        return Err((
            "defaults.fingerprint_ttl".into(),
            "must be above zero".into(),
            "fingerprint_ttl".into(),
        ));
    }
    let fallback = match defaults.key {
        Some(RawKeyOrOff::Off) => Protection::Off,
        // The fallback has no `ttl` of its own: `defaults.ttl` is what client-keyed routes
        // get, so a fingerprint fallback keeps the short window.
        Some(RawKeyOrOff::Rule(rule)) => {
            protected(FALLBACK_ROUTE, *rule, base.clone(), None, false, &shared)
        }
        None => protected(
            FALLBACK_ROUTE,
            default_key(),
            base.clone(),
            None,
            false,
            &shared,
        ),
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
        let route = compile_route(r, &base, &default_rule, &shared)
            .map_err(|m| (key.clone(), m, needle.clone()))?;
        routes.push(route);
    }
    let tokens = compile_tokens(raw.tokens, &mut routes, &identity)?;
    Ok(Config {
        listen: raw.listen.0,
        upstream,
        admin,
        drain_timeout: raw.drain_timeout.map_or(Duration::from_secs(30), |d| d.0),
        tls,
        tokens,
        store,
        passthrough_timeout: base.upstream_timeout,
        fallback,
        routes,
        identity,
        encrypt,
        connections: compile_connections(raw.connections.unwrap_or_default())?,
    })
}

/// What every protected route takes from the top of the config.
struct Shared {
    identity: Arc<Identity>,
    sealing: Option<Arc<KeyRing>>,
    fingerprint_ttl: Duration,
}

/// RFC 6265 cookie-name: a token (visible ASCII but separators).
fn is_cookie_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
}

/// Builds the token endpoint when `tokens:` is set or a route uses token keys, fills in
/// the routes' reissue window, and checks they bind tokens to the endpoint's scope.
fn compile_tokens(
    raw: Option<raw::RawTokens>,
    routes: &mut [Route],
    identity: &Arc<Identity>,
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
        identity: Arc::clone(identity),
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
    match (s.memory, s.redis, s.postgres, s.mysql) {
        (Some(m), None, None, None) => {
            let defaults = MemoryLimits::default();
            let limits = MemoryLimits {
                max_entries: m.max_entries.unwrap_or(defaults.max_entries),
                max_bytes: m.max_bytes.map_or(defaults.max_bytes, |b| b.0 as usize),
                when_full: match m.when_full {
                    None | Some(raw::WhenFull::Evict) => crate::store::WhenFull::Evict,
                    Some(raw::WhenFull::Reject) => crate::store::WhenFull::Reject,
                },
                caller_share: m.caller_share.map_or(100, |p| p.0 .0),
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
        (None, Some(r), None, None) => {
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
        (None, None, Some(p), None) => compile_sql(p, "postgres").map(StoreConfig::Postgres),
        (None, None, None, Some(m)) => compile_sql(m, "mysql").map(StoreConfig::Mysql),
        _ => Err(err(
            "store",
            "name exactly one backend: `memory`, `redis`, `postgres` or `mysql`",
            "store:",
        )),
    }
}

/// `store.postgres` or `store.mysql` (`section`).
fn compile_sql(s: raw::RawSql, section: &str) -> Result<SqlSettings, CompileError> {
    let err = |key: &str, message: &str, needle: &str| {
        (
            format!("store.{section}.{key}"),
            message.to_owned(),
            needle.to_owned(),
        )
    };
    let url = s.url.0;
    if url.is_postgres() != (section == "postgres") {
        return Err(err(
            "url",
            &format!("a {section} store needs a {section}:// URL"),
            "url",
        ));
    }
    let defaults = SqlSettings::new(url.0);
    let settings = SqlSettings {
        table: s.table.map_or(defaults.table.clone(), |t| t.0 .0),
        timeout: s.timeout.map_or(defaults.timeout, |d| d.0),
        max_connections: s.max_connections.unwrap_or(defaults.max_connections),
        ..defaults
    };
    if settings.timeout.is_zero() {
        return Err(err("timeout", "must be above zero", "timeout"));
    }
    if settings.max_connections == 0 {
        return Err(err(
            "max_connections",
            "must be above zero",
            "max_connections",
        ));
    }
    Ok(settings)
}

/// A protected route. `own_ttl`: whether the route set `ttl` itself; if not, a key
/// idemgate derives itself gets the short `fingerprint_ttl` instead of `defaults.ttl`.
fn protected(
    route: &str,
    key: KeyRule,
    mut policy: Policy,
    fresh: Option<Freshness>,
    own_ttl: bool,
    shared: &Shared,
) -> Protection {
    if matches!(key.source, KeySource::Fingerprint(_)) && !own_ttl {
        policy.ttl = shared.fingerprint_ttl;
    }
    Protection::On(Arc::new(Protected {
        route: route.to_owned(),
        key,
        fresh,
        policy,
        identity: Arc::clone(&shared.identity),
        sealing: shared.sealing.clone(),
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
/// `deny_unknown_fields`) that share these fields.
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
            on_unknown_outcome: $raw.on_unknown_outcome.unwrap_or(base.on_unknown_outcome),
            background_timeout: $raw
                .background_timeout
                .map_or(base.background_timeout, |d| d.0),
            max_answer: $raw.max_answer.map_or(base.max_answer, |b| b.0 as usize),
            observe: match $raw.idempotency {
                Some(raw::Mode::Observe) => true,
                Some(raw::Mode::On) => false,
                Some(raw::Mode::Off) | None => base.observe,
            },
        }
    }};
}

fn compile_route(
    r: RawRoute,
    base: &Policy,
    default_rule: &KeyRule,
    shared: &Shared,
) -> Result<Route, String> {
    let off =
        matches!(r.idempotency, Some(raw::Mode::Off)) || matches!(r.key, Some(RawKeyOrOff::Off));
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
    let own_ttl = r.ttl.is_some();
    let policy = overlay_policy!(r, *base);
    check_policy(&policy)?;
    let key = match r.key {
        Some(RawKeyOrOff::Rule(rule)) => *rule,
        _ => default_rule.clone(),
    };
    let fresh = r.fresh.map(compile_fresh).transpose()?;
    Ok(Route {
        protection: protected(&r.name, key, policy, fresh, own_ttl, shared),
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
    if p.background_timeout < p.upstream_timeout {
        return Err(format!(
            "background_timeout ({}) must be at least upstream_timeout ({}): it is how long \
             an owner keeps waiting after its client got the 504",
            units::format_duration(p.background_timeout),
            units::format_duration(p.upstream_timeout)
        ));
    }
    if p.max_answer == 0 {
        return Err("max_answer must be above zero".into());
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

// === connections ===

/// Bounds on connections, both sides (`connections:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connections {
    /// Client connections served at once; more wait in the listen backlog until one
    /// closes. Read at start.
    pub max_client: usize,
    /// Upstream connections open at once; requests beyond it wait for one (within their
    /// upstream timeout).
    pub max_upstream: usize,
    /// Longest gap between two reads of a pass-through answer's body.
    pub upstream_read_timeout: Duration,
    /// How a client connection closes (after an answer sent before its request was read
    /// whole, above all).
    pub linger: Linger,
}

/// A lingering close (nginx's `lingering_close`): after the last answer the proxy closes
/// its sending side and reads and drops what the client still sends, so a client that
/// writes its whole request before reading gets the answer instead of a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linger {
    /// Longest the reading goes on in all (`lingering_time`).
    pub time: Duration,
    /// Longest wait for the next bytes (`lingering_timeout`).
    pub timeout: Duration,
    /// Most bytes read and dropped (`lingering_bytes`).
    pub bytes: u64,
}

impl Default for Connections {
    fn default() -> Self {
        Self {
            max_client: 10_000,
            max_upstream: 1024,
            upstream_read_timeout: Duration::from_secs(60),
            linger: Linger {
                time: Duration::from_secs(30),
                timeout: Duration::from_secs(5),
                bytes: 64 << 20,
            },
        }
    }
}

fn compile_connections(raw: raw::RawConnections) -> Result<Connections, CompileError> {
    let d = Connections::default();
    let c = Connections {
        max_client: raw.max_client.unwrap_or(d.max_client),
        max_upstream: raw.max_upstream.unwrap_or(d.max_upstream),
        upstream_read_timeout: raw
            .upstream_read_timeout
            .map_or(d.upstream_read_timeout, |t| t.0),
        linger: Linger {
            time: raw.lingering_time.map_or(d.linger.time, |t| t.0),
            timeout: raw.lingering_timeout.map_or(d.linger.timeout, |t| t.0),
            bytes: raw.lingering_bytes.map_or(d.linger.bytes, |b| b.0),
        },
    };
    let zero = [
        ("max_client", c.max_client == 0),
        ("max_upstream", c.max_upstream == 0),
        ("upstream_read_timeout", c.upstream_read_timeout.is_zero()),
    ];
    if let Some((key, _)) = zero.iter().find(|(_, is_zero)| *is_zero) {
        return Err((
            format!("connections.{key}"),
            "must be above zero".into(),
            (*key).to_owned(),
        ));
    }
    Ok(c)
}
