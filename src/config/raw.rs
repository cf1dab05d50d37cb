//! The YAML as written: serde structs that mirror `proxy.yaml` key for key. Leaf values that
//! can be checked alone (durations, sizes, patterns, pointers, header names) are checked
//! while parsing, so their errors carry the line and column of the offending value.

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::units::{ByteSize, ConfigDuration};
use crate::key::ScopePart;

/// Any `FromStr` value read from a YAML scalar, its parse error reported in place.
#[derive(Debug, Clone)]
pub struct Parsed<T>(pub T);

impl<'de, T> Deserialize<'de> for Parsed<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<T: FromStr> Visitor<'_> for V<T>
        where
            T::Err: fmt::Display,
        {
            type Value = Parsed<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                v.parse()
                    .map(Parsed)
                    .map_err(|e| E::custom(format!("{v:?}: {e}")))
            }
        }
        deserializer.deserialize_str(V(PhantomData))
    }
}

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub listen: Parsed<std::net::SocketAddr>,
    pub upstream: String,
    pub admin: Option<RawAdmin>,
    pub drain_timeout: Option<ConfigDuration>,
    pub tls: Option<RawTls>,
    pub upstream_ca: Option<String>,
    pub tokens: Option<RawTokens>,
    pub store: Option<RawStore>,
    pub defaults: Option<RawDefaults>,
    pub routes: Option<Vec<RawRoute>>,
    pub trusted_proxies: Option<Vec<Parsed<crate::key::identity::Cidr>>>,
    pub session_cookies: Option<Vec<String>>,
    pub connections: Option<RawConnections>,
}

/// `admin:` — an address, or `{ listen, token }`, or `{ listen, token_file }`.
#[derive(Debug)]
pub struct RawAdmin {
    pub listen: std::net::SocketAddr,
    pub token: Option<String>,
    pub token_file: Option<String>,
}

impl<'de> Deserialize<'de> for RawAdmin {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Full {
            listen: Parsed<std::net::SocketAddr>,
            token: Option<String>,
            token_file: Option<String>,
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawAdmin;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an address (127.0.0.1:9901) or { listen, token | token_file }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                let listen = v.parse().map_err(|e| E::custom(format!("{v:?}: {e}")))?;
                Ok(RawAdmin {
                    listen,
                    token: None,
                    token_file: None,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let full = Full::deserialize(de::value::MapAccessDeserializer::new(map))?;
                if full.token.as_deref() == Some("") {
                    return Err(de::Error::custom("an empty admin token"));
                }
                Ok(RawAdmin {
                    listen: full.listen.0,
                    token: full.token,
                    token_file: full.token_file,
                })
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// `tokens:` — the one-time token endpoint.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTokens {
    pub path: Option<String>,
    pub ttl: Option<ConfigDuration>,
    pub rate: Option<u64>,
    pub window: Option<ConfigDuration>,
    pub scope: Option<Vec<RawScope>>,
}

/// `fresh:` — reject requests whose timestamp is outside a window.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFresh {
    pub header: Option<Parsed<http::HeaderName>>,
    pub field: Option<Parsed<crate::canonical::JsonPointer>>,
    pub max_age: Option<ConfigDuration>,
    pub skew: Option<ConfigDuration>,
}

/// `tls:` — terminate TLS on the listener.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert: String,
    pub key: String,
    pub client_ca: Option<String>,
}

/// `store:` — exactly one backend.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub memory: Option<RawMemory>,
    pub redis: Option<RawRedis>,
    pub encrypt: Option<RawEncrypt>,
    pub postgres: Option<RawSql>,
    pub mysql: Option<RawSql>,
}

/// `store.encrypt` — keys that seal stored answers: `key_file` or `key_env` for one, or
/// `keys: [{file} | {env}, …]` for a rotation (the first key written seals).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEncrypt {
    pub key_file: Option<String>,
    pub key_env: Option<String>,
    pub keys: Option<Vec<RawKeySource>>,
}

/// One key of `store.encrypt.keys`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKeySource {
    pub file: Option<String>,
    pub env: Option<String>,
}

/// `store.postgres` and `store.mysql`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSql {
    pub url: Parsed<SqlUrl>,
    pub table: Option<Parsed<TableName>>,
    pub timeout: Option<ConfigDuration>,
    pub max_connections: Option<u32>,
}

/// A `postgres://` or `mysql://` URL, checked when the config is read (which section it
/// belongs in is checked after).
#[derive(Debug, Clone)]
pub struct SqlUrl(pub String);

impl SqlUrl {
    /// Whether it names PostgreSQL (else MySQL).
    pub fn is_postgres(&self) -> bool {
        self.0.starts_with("postgres")
    }
}

impl FromStr for SqlUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once("://").map(|(scheme, _)| scheme) {
            Some("postgres" | "postgresql") => crate::store::sql::postgres::check_url(s)?,
            Some("mysql" | "mariadb") => crate::store::sql::mysql::check_url(s)?,
            _ => return Err("expected a postgres:// or mysql:// URL".into()),
        }
        Ok(Self(s.to_owned()))
    }
}

/// A table name idemgate can write into its SQL as it is.
#[derive(Debug, Clone)]
pub struct TableName(pub String);

impl FromStr for TableName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        crate::store::sql::valid_table(s)?;
        Ok(Self(s.to_owned()))
    }
}

/// `store.redis`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedis {
    pub url: Option<Parsed<RedisUrl>>,
    pub cluster: Option<Vec<Parsed<RedisUrl>>>,
    pub prefix: Option<String>,
    pub timeout: Option<ConfigDuration>,
    pub ca: Option<String>,
}

/// A `redis://` or `rediss://` URL, checked when the config is read.
#[derive(Debug, Clone)]
pub struct RedisUrl(pub String);

impl FromStr for RedisUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let scheme = s.split_once("://").map(|(scheme, _)| scheme);
        if !matches!(scheme, Some("redis" | "rediss")) {
            return Err("expected a redis:// or rediss:// URL".into());
        }
        redis::IntoConnectionInfo::into_connection_info(s).map_err(|e| e.to_string())?;
        Ok(Self(s.to_owned()))
    }
}

/// `store.memory`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMemory {
    pub max_entries: Option<usize>,
    pub max_bytes: Option<ByteSize>,
    pub when_full: Option<WhenFull>,
    pub caller_share: Option<Parsed<Percent>>,
}

/// A share written as a percentage: `25%`.
#[derive(Debug, Clone, Copy)]
pub struct Percent(pub u8);

impl FromStr for Percent {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected a percentage from 1% to 100%");
        let n: u8 = s
            .trim()
            .strip_suffix('%')
            .ok_or_else(bad)?
            .trim()
            .parse()
            .map_err(|_| bad())?;
        if (1..=100).contains(&n) {
            Ok(Self(n))
        } else {
            Err(bad())
        }
    }
}

/// `store.memory.when_full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenFull {
    /// Evict the live record closest to expiry (counted).
    Evict,
    /// Refuse new claims with 503.
    Reject,
}

/// `defaults:` — the policy of every protected route that does not override it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDefaults {
    pub idempotency: Option<Mode>,
    pub key: Option<RawKeyOrOff>,
    pub ttl: Option<ConfigDuration>,
    pub fingerprint_ttl: Option<ConfigDuration>,
    pub lease: Option<ConfigDuration>,
    pub upstream_timeout: Option<ConfigDuration>,
    pub in_flight: Option<InFlightMode>,
    pub wait_timeout: Option<ConfigDuration>,
    pub replay_statuses: Option<Vec<StatusPattern>>,
    pub max_body: Option<ByteSize>,
    pub on_store_error: Option<OnStoreError>,
    pub on_unknown_outcome: Option<OnUnknownOutcome>,
    pub background_timeout: Option<ConfigDuration>,
    pub max_answer: Option<ByteSize>,
}

/// One entry of `routes:`; policy keys override `defaults`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub name: String,
    #[serde(rename = "match")]
    pub matcher: RawMatch,
    pub idempotency: Option<Mode>,
    pub key: Option<RawKeyOrOff>,
    pub fresh: Option<RawFresh>,
    pub ttl: Option<ConfigDuration>,
    pub lease: Option<ConfigDuration>,
    pub upstream_timeout: Option<ConfigDuration>,
    pub in_flight: Option<InFlightMode>,
    pub wait_timeout: Option<ConfigDuration>,
    pub replay_statuses: Option<Vec<StatusPattern>>,
    pub max_body: Option<ByteSize>,
    pub on_store_error: Option<OnStoreError>,
    pub on_unknown_outcome: Option<OnUnknownOutcome>,
    pub background_timeout: Option<ConfigDuration>,
    pub max_answer: Option<ByteSize>,
}

/// `match:` of a route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    pub methods: Option<Vec<MethodName>>,
    pub path: Parsed<crate::route::PathPattern>,
    pub host: Option<Parsed<crate::route::HostPattern>>,
}

/// `key:` — a rule, or `off`.
#[derive(Debug)]
pub enum RawKeyOrOff {
    /// `key: off` (or `false`).
    Off,
    /// A key rule, already checked (one source, valid options).
    Rule(Box<crate::key::KeyRule>),
}

impl<'de> Deserialize<'de> for RawKeyOrOff {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawKeyOrOff;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key rule (header, fields or fingerprint) or `off`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                match v {
                    "off" => Ok(RawKeyOrOff::Off),
                    _ => Err(E::custom(format!(
                        "expected a key rule or `off`, found {v:?}"
                    ))),
                }
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                if v {
                    Err(E::custom("`key: true` says nothing; give a key rule"))
                } else {
                    Ok(RawKeyOrOff::Off)
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let raw = RawKey::deserialize(de::value::MapAccessDeserializer::new(map))?;
                raw.compile()
                    .map(|rule| RawKeyOrOff::Rule(Box::new(rule)))
                    .map_err(de::Error::custom)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A key rule as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKey {
    pub header: Option<Parsed<http::HeaderName>>,
    pub fields: Option<Vec<Parsed<crate::canonical::JsonPointer>>>,
    pub fingerprint: Option<RawFingerprint>,
    pub token: Option<RawTokenRule>,
    pub required: Option<bool>,
    pub scope: Option<Vec<RawScope>>,
}

/// `token:` in a key rule.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTokenRule {
    pub header: Option<Parsed<http::HeaderName>>,
}

impl RawKey {
    /// Checks that exactly one source is given and builds the runtime rule.
    fn compile(self) -> Result<crate::key::KeyRule, String> {
        use crate::key::{FingerprintRule, KeySource};
        let sources = [
            self.header.is_some(),
            self.fields.is_some(),
            self.token.is_some(),
        ];
        let client_keyed = self.header.is_some() || self.token.is_some();
        let given = sources.iter().filter(|g| **g).count();
        if given > 1 || (given == 1 && !client_keyed && self.fingerprint.is_some()) {
            return Err(
                "a key rule takes exactly one source: header, fields, fingerprint or token (`fingerprint` beside `header` or `token` sets their payload check)".into(),
            );
        }
        // Beside a client key, `fingerprint` is the payload check behind the 422; alone, it
        // is the key itself.
        let fingerprint = self.fingerprint.map(compile_fingerprint).transpose()?;
        let (fingerprint, payload) = if client_keyed {
            (None, fingerprint)
        } else {
            (fingerprint, None)
        };
        let source = match (self.header, self.fields, fingerprint) {
            (None, None, None) if self.token.is_some() => {
                let header = self
                    .token
                    .and_then(|t| t.header)
                    .map_or(http::HeaderName::from_static("idempotency-token"), |h| h.0);
                // The reissue window is the token TTL, filled in once `tokens:` is read.
                KeySource::Token(crate::key::TokenRule {
                    header,
                    reissue_ttl: std::time::Duration::ZERO,
                })
            }
            (Some(h), None, None) => KeySource::Header(h.0),
            (None, Some(fields), None) => {
                if fields.is_empty() {
                    return Err("`fields` needs at least one JSON pointer".into());
                }
                KeySource::Fields(fields.into_iter().map(|p| p.0).collect())
            }
            (None, None, Some(fp)) => KeySource::Fingerprint(Box::new(fp)),
            _ => {
                return Err(
                    "a key rule needs one source: header, fields, fingerprint or token".into(),
                )
            }
        };
        let required = self
            .required
            .unwrap_or(!matches!(source, KeySource::Header(_)));
        let scope = match self.scope {
            Some(parts) => parts.into_iter().map(|p| p.0).collect(),
            None => crate::key::default_scope(),
        };
        Ok(crate::key::KeyRule {
            source,
            required,
            scope,
            payload: Box::new(payload.unwrap_or_else(FingerprintRule::standard)),
        })
    }
}

/// A `fingerprint:` block as the runtime rule: the default ignore list (unless
/// `ignore_defaults: false`) plus the route's names and pointers.
fn compile_fingerprint(fp: RawFingerprint) -> Result<crate::key::FingerprintRule, String> {
    use crate::canonical::{IgnoreSet, JsonPointer, DEFAULT_IGNORED_FIELDS};
    let mut names: Vec<String> = Vec::new();
    let mut pointers = Vec::new();
    if fp.ignore_defaults.unwrap_or(true) {
        names.extend(DEFAULT_IGNORED_FIELDS.iter().map(|s| (*s).to_owned()));
    }
    for entry in fp.ignore.unwrap_or_default() {
        if entry.starts_with('/') {
            let pointer: JsonPointer = entry
                .parse()
                .map_err(|e| format!("ignore entry {entry:?}: {e}"))?;
            pointers.push(pointer);
        } else if entry.is_empty() {
            return Err("an empty name in `ignore`".into());
        } else {
            names.push(entry);
        }
    }
    let (query, body) = (fp.query.unwrap_or(true), fp.body.unwrap_or(true));
    if !query && !body {
        return Err("a fingerprint with neither query nor body would make every request of the route one key".into());
    }
    Ok(crate::key::FingerprintRule {
        query,
        body,
        ignore: IgnoreSet::new(names, pointers),
    })
}

/// `fingerprint:` options.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFingerprint {
    pub query: Option<bool>,
    pub body: Option<bool>,
    pub ignore: Option<Vec<String>>,
    pub ignore_defaults: Option<bool>,
}

/// One `scope:` entry: `caller`, `client_ip`, `client_cert`, `{header: X}` or `{cookie: X}`.
#[derive(Debug)]
pub struct RawScope(pub ScopePart);

impl<'de> Deserialize<'de> for RawScope {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawScope;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`caller`, `client_ip`, `header: NAME` or `cookie: NAME`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                match v {
                    "caller" => Ok(RawScope(ScopePart::Caller)),
                    "client_ip" => Ok(RawScope(ScopePart::ClientIp)),
                    "client_cert" => Ok(RawScope(ScopePart::ClientCert)),
                    _ => Err(E::custom(format!(
                        "unknown scope {v:?}; expected `caller`, `client_ip`, `client_cert`, `header: NAME` or `cookie: NAME`"
                    ))),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let Some(kind) = map.next_key::<String>()? else {
                    return Err(de::Error::custom("an empty scope entry"));
                };
                let value: String = map.next_value()?;
                let part = match kind.as_str() {
                    "header" => ScopePart::Header(value.parse().map_err(|_| {
                        de::Error::custom(format!("{value:?} is not a header name"))
                    })?),
                    "cookie" if !value.is_empty() => ScopePart::Cookie(value),
                    "cookie" => return Err(de::Error::custom("a cookie name cannot be empty")),
                    other => {
                        return Err(de::Error::custom(format!(
                            "unknown scope kind {other:?}; expected header or cookie"
                        )))
                    }
                };
                if map.next_key::<String>()?.is_some() {
                    return Err(de::Error::custom("one scope part per list entry"));
                }
                Ok(RawScope(part))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// An HTTP method name, upper case as on the wire.
#[derive(Debug, Clone)]
pub struct MethodName(pub http::Method);

impl<'de> Deserialize<'de> for MethodName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let upper = text.to_ascii_uppercase();
        if upper != text {
            return Err(de::Error::custom(format!(
                "method {text:?} must be upper case ({upper})"
            )));
        }
        let method = http::Method::from_bytes(text.as_bytes())
            .map_err(|_| de::Error::custom(format!("{text:?} is not a method name")))?;
        if crate::route::is_safe(&method) {
            return Err(de::Error::custom(format!(
                "{text} is a safe method; safe methods always pass through and cannot be routed"
            )));
        }
        Ok(MethodName(method))
    }
}

/// A status or class in `replay_statuses`: `201`, `"2xx"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusPattern {
    /// One status code.
    Exact(u16),
    /// A class: the hundreds digit.
    Class(u16),
}

impl StatusPattern {
    /// Whether `status` is covered.
    pub fn covers(self, status: u16) -> bool {
        match self {
            Self::Exact(s) => s == status,
            Self::Class(c) => status / 100 == c,
        }
    }
}

impl fmt::Display for StatusPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(s) => write!(f, "{s}"),
            Self::Class(c) => write!(f, "{c}xx"),
        }
    }
}

impl FromStr for StatusPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a status (201) or class (2xx)");
        if let Some(digit) = s.strip_suffix("xx") {
            let c: u16 = digit.parse().map_err(|_| bad())?;
            return (1..=5)
                .contains(&c)
                .then_some(Self::Class(c))
                .ok_or_else(bad);
        }
        let code: u16 = s.parse().map_err(|_| bad())?;
        (100..=599)
            .contains(&code)
            .then_some(Self::Exact(code))
            .ok_or_else(bad)
    }
}

impl<'de> Deserialize<'de> for StatusPattern {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StatusPattern;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a status (201) or class (2xx)")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                v.to_string().parse().map_err(E::custom)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
                Err(de::Error::custom("expected a status, found a list"))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// `in_flight:` — what a duplicate of a running request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlightMode {
    /// Hold it until the first finishes, then replay (409 when `wait_timeout` passes).
    Wait,
    /// Answer 409 with `Retry-After` at once.
    Reject,
}

impl InFlightMode {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Wait => "wait",
            Self::Reject => "reject",
        }
    }
}

/// `on_store_error:` — what a protected request gets when the store fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// 503: never forward a protected request unprotected.
    FailClosed,
    /// Forward it unprotected (and count it).
    FailOpen,
}

impl OnStoreError {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailClosed => "fail_closed",
            Self::FailOpen => "fail_open",
        }
    }
}

/// `on_unknown_outcome:` — what a key whose request may have run, with no known outcome,
/// becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUnknownOutcome {
    /// Held: its repeats get an "outcome unknown" problem until the window ends or an
    /// operator purges the key. Never executed twice.
    Hold,
    /// Released: a repeat executes again (for upstreams that are idempotent themselves).
    Release,
}

impl OnUnknownOutcome {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hold => "hold",
            Self::Release => "release",
        }
    }
}

/// `idempotency:` — `on` (enforce), `observe` (forward every request unchanged and count
/// what enforcing would have done) or `off` (YAML 1.2 reads `off` as a string; `false`
/// and `true` work too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Enforce: hold, replay, refuse.
    On,
    /// Forward everything, count would-be duplicates.
    Observe,
    /// Unprotected.
    Off,
}

impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Mode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`on`, `observe` or `off`")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(if v { Mode::On } else { Mode::Off })
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                match v {
                    "on" => Ok(Mode::On),
                    "observe" => Ok(Mode::Observe),
                    "off" => Ok(Mode::Off),
                    _ => Err(E::custom(format!(
                        "expected `on`, `observe` or `off`, found {v:?}"
                    ))),
                }
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// `connections:` — caps on client and upstream connections, the read timeout of
/// pass-through answers, and the lingering close after an early answer.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConnections {
    pub max_client: Option<usize>,
    pub max_upstream: Option<usize>,
    pub upstream_read_timeout: Option<ConfigDuration>,
    pub lingering_time: Option<ConfigDuration>,
    pub lingering_timeout: Option<ConfigDuration>,
    pub lingering_bytes: Option<ByteSize>,
}
