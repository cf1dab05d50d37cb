//! `defaults:` and `routes:` as written: the policy keys both share, a route's `match:`,
//! `fresh:` and `idempotency:`. Method names are checked while parsing (upper case, not a
//! safe method, which always passes through, nor `CONNECT`, which is never forwarded).

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::key::RawKeyOrOff;
use super::Parsed;
use crate::config::policy::{InFlightMode, OnStoreError, OnUnknownOutcome, StatusPattern};
use crate::config::units::{ByteSize, ConfigDuration};

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

/// One entry of `routes:`; policy keys override `defaults`. They repeat [`RawDefaults`]'s
/// because serde's `flatten` cannot be combined with `deny_unknown_fields`, and spelling
/// them out keeps the keys an unknown-field error lists in the order they are written here.
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

/// `fresh:` — reject requests whose timestamp is outside a window.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFresh {
    pub header: Option<Parsed<http::HeaderName>>,
    pub field: Option<Parsed<crate::canonical::JsonPointer>>,
    pub max_age: Option<ConfigDuration>,
    pub skew: Option<ConfigDuration>,
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
        if method == http::Method::CONNECT {
            return Err(de::Error::custom(
                "CONNECT is answered 501 by the proxy (a reverse proxy, not a tunnel), so a route for it would never match",
            ));
        }
        Ok(MethodName(method))
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
