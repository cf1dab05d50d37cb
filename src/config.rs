//! Configuration: `proxy.yaml` parsed into raw serde structs that mirror it (`raw`), then
//! checked and compiled section by section into the runtime [`Config`] the proxy serves
//! from (durations, compiled patterns, key rules). Every error names the file, line,
//! column and key ([`ConfigError`]).
//!
//! One file a section, each holding the section's runtime type and how it is built:
//! `upstream` and `listen` (where requests go and come in), `store` (the backend),
//! `secrets` (the admin token and sealing keys, read from files or variables), `identity`
//! (how callers are told apart), `routes` (defaults, fallback and routes, over the runtime
//! types in `protection` and `policy`), `tokens` (the token endpoint) and `connections`
//! (caps and lingering close). [`units`] reads durations and sizes. Their public types are
//! re-exported here. `rekey` compares two configs: what a reload changes in how keys are
//! made ([`Config::rekeyed_by`]).

mod connections;
mod error;
mod identity;
mod listen;
mod locate;
mod methods;
mod policy;
mod protection;
mod raw;
mod rekey;
mod routes;
mod secrets;
mod store;
mod tokens;
pub mod units;
mod upstream;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::Method;

use crate::key::identity::Identity;
use crate::route::Overrides;
use crate::store::seal::KeyRing;
use error::CompileError;
use raw::RawConfig;

pub use connections::{Connections, Linger, UpstreamHttp1, UpstreamProtocol};
pub use error::ConfigError;
pub use listen::Admin;
pub use policy::{
    InFlightMode, OnStoreError, OnUnknownOutcome, Policy, StatusPattern, DEFAULT_FINGERPRINT_TTL,
    TRANSIENT_STATUSES,
};
pub use protection::{default_key, FreshSource, Freshness, Protected, Protection, FALLBACK_ROUTE};
pub use routes::Route;
pub use store::StoreConfig;
pub use tokens::TokenIssuer;
pub use upstream::Upstream;

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
    /// The SHA-256 of the `tls.client_ca` file, when the listener verifies client
    /// certificates (which are then part of the caller).
    pub client_ca: Option<crate::key::Digest>,
    /// The one-time token endpoint, when `tokens:` is set or a route uses token keys.
    pub tokens: Option<TokenIssuer>,
    /// Store backend and bounds.
    pub store: StoreConfig,
    /// What a POST or PATCH matching no route gets.
    pub fallback: Protection,
    /// How long an unprotected request may wait for the upstream's response head
    /// (`defaults.upstream_timeout`), unless its route sets its own.
    pub passthrough_timeout: Duration,
    /// Routes, first match wins.
    pub routes: Vec<Route>,
    /// How callers are told apart (`trusted_proxies`, `session_cookies`, `credential_headers`).
    pub identity: Arc<Identity>,
    /// The keys stored answers are sealed with (`store.encrypt`), if any. Read at load, so
    /// a reload picks up a rotation.
    pub encrypt: Option<Arc<KeyRing>>,
    /// Connection caps, timeouts and lingering close (`connections:`).
    pub connections: Connections,
    /// The methods besides `POST` that protected routes list, and `PATCH` where the
    /// fallback protects: those a method override can route a POST by. None, and routing
    /// never looks at overrides.
    overridable: Vec<Method>,
}

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
        let raw: RawConfig = serde_path_to_error::deserialize(deserializer)
            .map_err(|e| error::from_serde(e, file))?;
        compile(raw, base).map_err(|e| e.place(text, file))
    }

    /// What `idemgate check` (and `run`, as warnings) points out in a config that loads:
    /// settings that work but let callers share keys, or let anyone delete them, a `lease`
    /// a stalled shared store lets lapse, a `fresh.max_age` shortened to what the route's
    /// key lifetime allows, or a method name no registry holds (a misspelling?), with
    /// what to write instead.
    pub fn notes(&self) -> Vec<String> {
        use crate::key::ScopePart;
        let fallback = std::iter::once((FALLBACK_ROUTE, &self.fallback));
        let routes = self.routes.iter().map(|r| (r.name.as_str(), &r.protection));
        let mut notes = Vec::new();
        let store_timeout = self.store_timeout();
        for (name, protection) in fallback.chain(routes) {
            let Protection::On(p) = protection else {
                continue;
            };
            if let Some(note) = store_timeout.and_then(|t| lease_note(name, p.policy.lease, t)) {
                notes.push(note);
            }
            if let Some(note) = p.fresh.as_ref().and_then(|f| f.note(name, p.policy.ttl)) {
                notes.push(note);
            }
            let scope = &p.key.scope;
            let names_a_caller = scope.iter().any(|part| {
                matches!(
                    part,
                    ScopePart::Caller | ScopePart::ClientIp | ScopePart::ClientCert
                )
            });
            if scope.is_empty() {
                // Nothing named, so nothing sent: the caller stands in, as for a scope whose
                // every part is absent (`crate::key::derive`), which is the default's key.
                notes.push(format!(
                    "route {name}: `scope: []` keys every request by caller, exactly as the default does (it does not share keys between callers); drop `scope`"
                ));
            } else if !names_a_caller {
                let parts: Vec<String> = scope.iter().map(ToString::to_string).collect();
                let mut with_caller = parts.clone();
                with_caller.push("caller".into());
                notes.push(format!(
                    "route {name}: scope [{}] names no caller, so every caller that sends the same values shares their keys (requests that send none are keyed by caller); unless a gateway in front sets them, write `scope: [{}]` (or drop `scope` for the default, `caller`)",
                    parts.join(", "),
                    with_caller.join(", ")
                ));
            }
        }
        for route in &self.routes {
            let unregistered = route.matcher.methods.iter();
            notes.extend(unregistered.filter_map(|m| methods::unregistered_note(&route.name, m)));
        }
        if let Some(admin) = self.admin.as_ref().filter(|a| a.token.is_none()) {
            if !admin.listen.ip().is_loopback() {
                notes.push(format!(
                    "admin: {} is not loopback and has no token, so anyone who reaches it can read every key's state and the metrics, and it refuses to delete keys; set `admin.token_file`, or listen on 127.0.0.1",
                    admin.listen
                ));
            }
        }
        for block in self.identity.trusted_proxies.blocks() {
            if !block.is_private() {
                notes.push(format!(
                    "trusted_proxies: {block} holds public addresses, so a client there can write its own X-Forwarded-For and be taken for another anonymous caller; list only your proxies' addresses"
                ));
            }
        }
        notes
    }

    /// A shared store's `timeout` and where it is set: the longest one renewal of a claim
    /// may wait. `None` for the memory store, which renews nothing.
    fn store_timeout(&self) -> Option<(&'static str, Duration)> {
        match &self.store {
            StoreConfig::Memory(_) => None,
            StoreConfig::Redis(r) => Some(("store.redis.timeout", r.timeout)),
            StoreConfig::Postgres(s) => Some(("store.postgres.timeout", s.timeout)),
            StoreConfig::Mysql(s) => Some(("store.mysql.timeout", s.timeout)),
        }
    }

    /// Whether a request with `method` may be routed by a method override: a `POST`, where
    /// a protected route lists a method an override can name, or the fallback protects
    /// `PATCH`. Only then does
    /// [`route_for`](Self::route_for) read the overrides, so only then need they be found.
    pub fn routes_by_override(&self, method: &Method) -> bool {
        *method == Method::POST && !self.overridable.is_empty()
    }

    /// Which route a request with `headers` belongs to, and what protection it gets: that
    /// of [`protection_for`](Self::protection_for), but for a `POST` that names another
    /// method in a method-override header (`overrides`, those `headers` holds, found where
    /// [`routes_by_override`](Self::routes_by_override)), which the app may run as that
    /// method. Which it does is not known here, so the POST's own route holds where it is
    /// written for the POST (not the fallback) and enforces; else the first route of a
    /// named method that enforces, else the fallback where a named `PATCH` falls to it and
    /// it enforces; only then (where the POST's own protection does not enforce) the first
    /// such route, then fallback, that only observes; else the POST's own route or
    /// fallback. A `PATCH` no route takes is the fallback's: a POST under an unprotected
    /// route of its own that names it gets the fallback's protection, as the PATCH would,
    /// but only where no named method (one named after the PATCH too) has a route of its
    /// own that applies as strictly.
    pub fn route_for(
        &self,
        host: Option<&str>,
        method: &Method,
        headers: &http::HeaderMap,
        overrides: Overrides,
        path: &str,
    ) -> (&str, &Protection) {
        let own = self.protection_for(host, method, path);
        if !self.routes_by_override(method) {
            return own;
        }
        debug_assert_eq!(overrides, Overrides::find(headers), "overrides not found");
        let own_enforces = own.1.enforces();
        if own_enforces && own.0 != FALLBACK_ROUTE {
            return own;
        }
        // Another rule than the POST's own (the fallback, where it is the POST's too, is
        // the one already found), that protects as the POST's does not.
        let takes = |found: &(&str, &Protection)| {
            found.0 != own.0
                && matches!(found.1, Protection::On(_))
                && (found.1.enforces() || !own_enforces)
        };
        // A rule that enforces before one that observes: a route that only observes, named
        // anywhere, must not lower to observing a request the fallback would have enforced
        // for. Within each, a named method's own route before the fallback, wherever it is
        // named: a `PATCH` ahead of it, which falls to the fallback, must not hide the
        // `DELETE` route after it. The first of the best rank wins; each named method's
        // rule is looked up once.
        let rank = |found: &(&str, &Protection)| {
            let fallback = found.0 == FALLBACK_ROUTE;
            takes(found).then_some((!found.1.enforces(), fallback))
        };
        overrides
            .methods(headers, &self.overridable)
            .map(|method| self.protection_for(host, method, path))
            .filter_map(|found| rank(&found).map(|rank| (rank, found)))
            .min_by_key(|(rank, _)| *rank)
            .map_or(own, |(_, found)| found)
    }

    /// Which route a request belongs to, and what protection it gets, by its method alone
    /// (see [`route_for`](Self::route_for)).
    pub fn protection_for(
        &self,
        host: Option<&str>,
        method: &Method,
        path: &str,
    ) -> (&str, &Protection) {
        if crate::route::is_safe(method) {
            return ("", &Protection::Off(None));
        }
        for route in &self.routes {
            if route.matcher.matches(host, method, path) {
                return (&route.name, &route.protection);
            }
        }
        if *method == Method::POST || *method == Method::PATCH {
            (FALLBACK_ROUTE, &self.fallback)
        } else {
            ("", &Protection::Off(None))
        }
    }
}

/// A shared store's renewals of a claim go out every `lease/3`, one at a time, and each
/// may wait the store's whole timeout. With a lease of three timeouts or more, a renewal
/// that times out is answered by the time the next is due (two thirds of the lease), and
/// that one lands before the lease ends however slow it is. Under three timeouts the next
/// goes out only when the first timed out, and may land a third of the lease plus two
/// timeouts after the claim's last renewal, past its end: one stalled renewal and a slow
/// one lapse a claim whose owner still runs (the store need not be down: slow). Duplicates then
/// find the claim lapsed: held as an unknown outcome (409) though its answer is on its
/// way, or, with `on_unknown_outcome: release`, taken over, and the request run again, once
/// the lapse's grace has passed too. Noted rather than refused: a short lease is also how
/// soon a crashed replica's keys are freed, and a store quick enough keeps it.
fn lease_note(route: &str, lease: Duration, (key, timeout): (&str, Duration)) -> Option<String> {
    const TIMEOUTS_PER_LEASE: u32 = 3;
    let least = timeout.saturating_mul(TIMEOUTS_PER_LEASE);
    (lease < least).then(|| {
        let (lease, timeout, least) = (
            units::format_duration(lease),
            units::format_duration(timeout),
            units::format_duration(least),
        );
        format!(
            "route {route}: lease {lease} is under three times `{key}` ({timeout}): its claim is renewed every lease/3 and each renewal may wait the whole timeout, so one renewal that times out, followed by a slow one, lets the claim lapse while its owner still runs (duplicates hear 409 outcome unknown, or with `on_unknown_outcome: release` may run it again once the lapse's grace has passed); write a lease of at least {least}, or a shorter `{key}`"
        )
    })
}

/// Whether two listeners would contend for one socket: the same port on the same address,
/// or on a wildcard address that covers the other (`0.0.0.0` its family, `[::]` both).
fn same_socket(a: SocketAddr, b: SocketAddr) -> bool {
    let covers = |w: SocketAddr, o: SocketAddr| {
        w.ip().is_unspecified() && (w.is_ipv6() || w.is_ipv4() == o.is_ipv4())
    };
    // Port 0 is a port the OS picks at bind, a different one for each listener.
    a.port() != 0 && a.port() == b.port() && (a.ip() == b.ip() || covers(a, b) || covers(b, a))
}

/// The parsed file checked and built one section at a time; of several errors, the one in
/// the section checked first is reported.
fn compile(raw: RawConfig, base: &Path) -> Result<Config, CompileError> {
    let upstream = upstream::compile_upstream(&raw.upstream, raw.upstream_ca.as_deref(), base)?;
    let tls = listen::compile_tls(raw.tls.as_ref(), base)?;
    let client_ca = listen::client_ca_digest(raw.tls.as_ref(), base)?;
    // Only a listener that asks for client certificates gives `client_cert` a value.
    let mutual_tls = raw.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
    let (store, encrypt) = store::compile_store_section(raw.store, base)?;
    let admin = raw
        .admin
        .map(|a| secrets::compile_admin(a, base))
        .transpose()?;
    if let Some(a) = admin
        .as_ref()
        .filter(|a| same_socket(a.listen, raw.listen.0))
    {
        return Err(CompileError::new(
            "admin",
            format!(
                "the admin listener {} takes the address the proxy listens on ({}): give it a port of its own",
                a.listen, raw.listen.0
            ),
        ));
    }
    let identity = identity::compile_identity(
        raw.trusted_proxies,
        raw.session_cookies,
        raw.credential_headers,
    )?;
    let routing = routes::compile_routing(
        raw.defaults,
        raw.routes,
        &identity,
        encrypt.clone(),
        mutual_tls,
    )?;
    let mut routes = routing.routes;
    let mut fallback = routing.fallback;
    let tokens = tokens::compile_tokens(
        raw.tokens,
        &mut routes,
        &mut fallback,
        &identity,
        mutual_tls,
    )?;
    let overridable = overridable(&routes, &fallback);
    Ok(Config {
        listen: raw.listen.0,
        upstream,
        admin,
        drain_timeout: raw.drain_timeout.map_or(Duration::from_secs(30), |d| d.0),
        tls,
        client_ca,
        tokens,
        store,
        passthrough_timeout: routing.passthrough_timeout,
        fallback,
        routes,
        identity,
        encrypt,
        connections: connections::compile_connections(raw.connections.unwrap_or_default())?,
        overridable,
    })
}

/// The methods besides `POST` protected routes list, each once, and `PATCH` where the
/// fallback protects (a PATCH no route takes is its): all an override can route a POST
/// by, since [`Config::route_for`] takes only a protected rule for one (a config can list
/// no safe method).
fn overridable(routes: &[Route], fallback: &Protection) -> Vec<Method> {
    let mut methods: Vec<Method> = Vec::new();
    if matches!(fallback, Protection::On(_)) {
        methods.push(Method::PATCH);
    }
    let protected = routes
        .iter()
        .filter(|r| matches!(r.protection, Protection::On(_)));
    for method in protected.flat_map(|r| &r.matcher.methods) {
        if *method != Method::POST && !methods.contains(method) {
            methods.push(method.clone());
        }
    }
    methods
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(routes: &str) -> Config {
        let text = format!(
            "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\ndefaults:\n  key: off\nroutes:\n{routes}"
        );
        Config::parse(&text, "proxy.yaml").unwrap()
    }

    /// Only a protected route of another method can take an overridden POST, so where
    /// there is none the overrides are never looked for; where there is, any element of
    /// any override value routes to it.
    #[test]
    fn overrides_route_a_post_only_to_a_protected_route_of_the_method_named() {
        let off = config(
            "  - name: purge\n    match: { methods: [DELETE], path: /x }\n    idempotency: off\n",
        );
        assert!(!off.routes_by_override(&Method::POST));
        let on = config(
            "  - name: purge\n    match: { methods: [DELETE], path: /x }\n    key: { header: Idempotency-Key }\n",
        );
        assert!(on.routes_by_override(&Method::POST));
        assert!(!on.routes_by_override(&Method::PUT));
        assert_eq!(on.overridable, [Method::DELETE]);
        let mut headers = http::HeaderMap::new();
        headers.insert("x-http-method", "get , Delete".parse().unwrap());
        let overrides = Overrides::find(&headers);
        let routed = |path| {
            on.route_for(None, &Method::POST, &headers, overrides, path)
                .0
        };
        assert_eq!(routed("/x"), "purge");
        assert_eq!(routed("/y"), FALLBACK_ROUTE);
    }

    /// A PATCH no route takes is the fallback's, so where the fallback protects, a POST
    /// that names PATCH under an unprotected route of its own gets the fallback's rule.
    #[test]
    fn an_override_to_patch_gets_the_fallback_where_it_protects() {
        let text = "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\nroutes:\n  - name: items\n    match: { methods: [POST], path: /x }\n    idempotency: off\n";
        let on = Config::parse(text, "proxy.yaml").unwrap();
        assert_eq!(on.overridable, [Method::PATCH]);
        let mut headers = http::HeaderMap::new();
        headers.insert("x-http-method-override", "patch".parse().unwrap());
        let overrides = Overrides::find(&headers);
        let routed = on.route_for(None, &Method::POST, &headers, overrides, "/x");
        assert_eq!(routed.0, FALLBACK_ROUTE);
        assert!(routed.1.enforces());
        let none = http::HeaderMap::new();
        let plain = on.route_for(None, &Method::POST, &none, Overrides::NONE, "/x");
        assert_eq!(plain.0, "items");
        // Under `defaults.key: off` the fallback protects nothing to route to.
        let off = config(
            "  - name: items\n    match: { methods: [POST], path: /x }\n    idempotency: off\n",
        );
        assert!(!off.routes_by_override(&Method::POST));
    }

    /// An override never lowers an overridden POST to observing where a method it names
    /// enforces: a `PATCH`'s enforcing fallback, named first, outranks a `DELETE` route
    /// that only observes, named after it; with no enforcing rule, the observer applies.
    #[test]
    fn an_override_prefers_an_enforcing_fallback_to_an_observing_route() {
        let routes = "routes:\n  - name: items\n    match: { methods: [POST], path: /x }\n    idempotency: off\n  - name: purge\n    match: { methods: [DELETE], path: /x }\n    idempotency: observe\n";
        let enforcing =
            format!("listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\n{routes}");
        let on = Config::parse(&enforcing, "proxy.yaml").unwrap();
        let mut headers = http::HeaderMap::new();
        headers.insert("x-http-method-override", "PATCH, DELETE".parse().unwrap());
        let overrides = Overrides::find(&headers);
        let routed = on.route_for(None, &Method::POST, &headers, overrides, "/x");
        assert_eq!(routed.0, FALLBACK_ROUTE);
        assert!(routed.1.enforces());
        // The fallback protecting nothing, the observing route is the only one that applies.
        let off = config(
            "  - name: items\n    match: { methods: [POST], path: /x }\n    idempotency: off\n  - name: purge\n    match: { methods: [DELETE], path: /x }\n    idempotency: observe\n",
        );
        let routed = off.route_for(None, &Method::POST, &headers, overrides, "/x");
        assert_eq!(routed.0, "purge");
    }
}
