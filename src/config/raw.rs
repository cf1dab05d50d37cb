//! The YAML as written: serde structs that mirror `proxy.yaml` key for key, before any
//! check that needs more than one value. Leaf values that can be checked alone (durations,
//! sizes, patterns, pointers, header names) are checked while parsing, so their errors
//! carry the line and column of the offending value. This file holds the shape of the whole
//! file and its small top-level sections; `store:` ([`store`]), `defaults:` and `routes:`
//! ([`routes`]) and key rules ([`key`]) have files of their own.

pub mod key;
pub mod routes;
pub mod store;

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::units::{ByteSize, ConfigDuration};
use key::RawScope;
use routes::{RawDefaults, RawRoute};
use store::RawStore;

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
    pub credential_headers: Option<Vec<String>>,
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
    pub rate_per_address: Option<u64>,
    pub budget: Option<u64>,
}

/// `tls:` — terminate TLS on the listener.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert: String,
    pub key: String,
    pub client_ca: Option<String>,
}

/// `connections.upstream_protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RawUpstreamProtocol {
    /// HTTP/1.1 connections, one request at a time each.
    Http1,
    /// HTTP/2 connections, many requests on each.
    Http2,
}

/// `connections.upstream_http1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RawUpstreamHttp1 {
    /// hyper's client connections.
    Hyper,
    /// The hand-written client.
    Idemgate,
}

/// `connections:` — caps on client and upstream connections, the idle timeout of kept-alive
/// upstream connections, the read timeout of pass-through answers, the idle timeout of
/// upgraded connections, the send timeout of answers to clients, and the lingering close
/// after an early answer.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConnections {
    pub max_client: Option<usize>,
    pub max_streams: Option<u32>,
    pub max_upstream: Option<usize>,
    pub upstream_idle_timeout: Option<ConfigDuration>,
    pub upstream_read_timeout: Option<ConfigDuration>,
    pub tunnel_idle_timeout: Option<ConfigDuration>,
    pub upstream_protocol: Option<RawUpstreamProtocol>,
    pub upstream_http1: Option<RawUpstreamHttp1>,
    pub client_send_timeout: Option<ConfigDuration>,
    pub lingering_time: Option<ConfigDuration>,
    pub lingering_timeout: Option<ConfigDuration>,
    pub lingering_bytes: Option<ByteSize>,
    pub max_buffered: Option<ByteSize>,
    pub max_buffered_per_connection: Option<ByteSize>,
}
