//! `key:` as written (`header`, `fields`, `fingerprint` or `token`, with `required` and
//! `scope`), built into a [`crate::key::KeyRule`] while parsing: a rule that names no
//! source, or two, is reported at its line. `key: off` reads as [`RawKeyOrOff::Off`].

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::Parsed;
use crate::key::ScopePart;

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
