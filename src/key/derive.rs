//! Key derivation: from a buffered request and its route's [`KeyRule`] to the store key and
//! the request fingerprint that detects a reused client key with another payload.

use std::borrow::Cow;
use std::cell::RefCell;
use std::net::IpAddr;

use http::{header, HeaderMap, Method};
use ring::digest::{Context, SHA256};

use super::client_key::ClientKeyError;
use super::identity::{names_someone, session_cookie, ClientAddress, Identity};
use super::{Digest, FingerprintRule, KeyRule, KeySource, ScopePart};
use crate::canonical::{extract_fields, JsonError};
use crate::route::Overrides;
pub use buckets::scope_digest;
use caller::{
    cookie_jar, describe_caller, has_credential, hash_address, hash_caller, identifying_cookies,
    Caller,
};
use request::{write_canonical_request, BodyType};

/// The parts of a request a key can depend on; the body is already buffered.
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    /// The matched route's name (`default` when none matched).
    pub route: &'a str,
    /// Request method.
    pub method: &'a Method,
    /// Request path, without the query.
    pub path: &'a str,
    /// Raw query string, if any.
    pub query: Option<&'a str>,
    /// Request headers.
    pub headers: &'a HeaderMap,
    /// The method-override headers `headers` holds ([`Overrides::find`]), found once per
    /// request: part of the key's operation.
    pub overrides: Overrides,
    /// The connecting peer (the TCP peer, before `trusted_proxies` are applied).
    pub peer: Option<IpAddr>,
    /// How callers are told apart: trusted proxies and session cookie names.
    pub identity: &'a Identity,
    /// SHA-256 of the client's TLS certificate, on mutual-TLS connections.
    pub client_cert: Option<&'a [u8]>,
    /// The buffered body.
    pub body: &'a [u8],
}

impl RequestView<'_> {
    /// The client's address: the peer, or behind a trusted proxy the address its
    /// `X-Forwarded-For` names (or none it could name); `None` without a peer (`explain`
    /// without `--client-ip`).
    pub fn client_address(&self) -> Option<ClientAddress> {
        self.peer.map(|peer| {
            self.identity
                .trusted_proxies
                .client_address(peer, self.headers)
        })
    }
}

/// What derivation made of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Derived {
    /// The key to claim.
    Key(DerivedKey),
    /// No key material, and the rule does not require it: the request passes unprotected.
    Unkeyed,
    /// The key would hold the address of a client a trusted proxy could not name
    /// ([`ClientAddress::Unnamed`]): it could not be told from any other such client, so
    /// the request passes unprotected, never claimed nor replayed.
    CallerUnnamed,
}

impl Derived {
    /// The key to claim, if there is one.
    pub fn key(self) -> Option<DerivedKey> {
        match self {
            Self::Key(key) => Some(key),
            Self::Unkeyed | Self::CallerUnnamed => None,
        }
    }
}

/// The outcome of derivation for a request that is to be protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DerivedKey {
    /// What the store claims.
    pub key: Digest,
    /// What a later request with the same key must match ([`Digest::NONE`] when the key
    /// already is the fingerprint or names the request's identity by itself).
    pub fingerprint: Digest,
}

/// Why no key could be derived; each maps to a 400 in [`crate::error`].
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The client key header is missing, repeated or malformed.
    #[error(transparent)]
    ClientKey(#[from] ClientKeyError),
    /// A `fields` route got a body that is not JSON.
    #[error("the body is not valid JSON: {0}")]
    InvalidJson(#[from] JsonError),
    /// A `fields` route's body lacks a field the key is made of.
    #[error("the body has no field {0}")]
    FieldMissing(String),
    /// A one-time token that is malformed, unknown, expired, spent or another caller's:
    /// one answer for all, so nothing is revealed.
    #[error("the idempotency token is invalid, expired or not yours; request a new one")]
    TokenInvalid,
}

/// What `idemgate explain` shows of a derivation; filled only when asked for.
#[derive(Debug, Default, Clone)]
pub struct Trace {
    /// Scope parts and whether each was present, or which tier named the caller (never
    /// their values).
    pub scope: Vec<String>,
    /// Human-readable key material (client key, field values or canonical request).
    pub material: String,
    /// Fields and parameters left out of a fingerprint.
    pub ignored: Vec<String>,
    /// The canonical request the payload fingerprint was computed from.
    pub fingerprint_input: String,
    /// The key holds the client's address and none was given (`explain` without
    /// `--client-ip`): the proxy always has one, so no request it serves gets this key.
    pub address_unknown: bool,
}

impl Trace {
    /// Notes the default caller standing in the key, shown as `shown`, and whether the
    /// client address it holds was one no one gave.
    fn heard_caller(&mut self, shown: String, caller: Caller, req: &RequestView<'_>) {
        self.scope.push(shown);
        self.address_unknown |= caller.by_address() && req.peer.is_none();
    }
}

thread_local! {
    // One canonicalization buffer per worker thread: the hot path reuses its capacity
    // instead of allocating per request.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Derives the key for `req` under `rule`: [`Derived::Unkeyed`] when the material is absent
/// and the rule does not require it, [`Derived::CallerUnnamed`] when the key would hold
/// the address of a client no one named; either way the request passes unprotected. A
/// request the rule refuses (a required key missing, a malformed one) is refused whoever
/// sent it.
///
/// ```
/// use http::{HeaderMap, Method};
/// use idemgate::key::identity::Identity;
/// use idemgate::key::{derive_key, FingerprintRule, KeyRule, KeySource, RequestView};
/// use idemgate::route::Overrides;
/// let rule = KeyRule {
///     source: KeySource::Fingerprint(Box::new(FingerprintRule::standard())),
///     required: true,
///     scope: idemgate::key::default_scope(),
///     payload: Box::new(FingerprintRule::standard()),
/// };
/// let (headers, identity) = (HeaderMap::new(), Identity::default());
/// let view = |body: &'static [u8]| RequestView {
///     route: "orders", method: &Method::POST, path: "/orders", query: None,
///     headers: &headers, overrides: Overrides::NONE, peer: Some([192, 0, 2, 7].into()),
///     identity: &identity, client_cert: None, body,
/// };
/// let a = derive_key(&rule, &view(br#"{"sku":"A1","qty":2,"timestamp":1}"#), None).unwrap();
/// let b = derive_key(&rule, &view(br#"{ "qty": 2.0, "sku": "A1", "timestamp": 2 }"#), None).unwrap();
/// assert!(a.key().is_some());
/// assert_eq!(a, b);
/// ```
pub fn derive_key(
    rule: &KeyRule,
    req: &RequestView<'_>,
    mut trace: Option<&mut Trace>,
) -> Result<Derived, KeyError> {
    let mut hasher = KeyHasher::new(b"idemgate:key:v4");
    hasher.field(req.route.as_bytes());
    // The method with any override: hashed here and in the canonical request alike.
    let operation = method::operation(req.method, req.headers, req.overrides);
    hasher.field(&operation);
    hash_host(&mut hasher, req.headers);
    // Checked after the material: a request the rule refuses is refused whoever sent it.
    let unnamed = hash_scope(&mut hasher, &rule.scope, req, trace.as_deref_mut());
    hasher.field(rule.source.as_str().as_bytes());

    let fingerprint = match &rule.source {
        KeySource::Header(name) => {
            let Some(client_key) = head::client_key(rule, name, req.headers)? else {
                return Ok(Derived::Unkeyed);
            };
            if let Some(t) = trace.as_deref_mut() {
                t.material = format!("{name}: {}", String::from_utf8_lossy(&client_key));
            }
            hasher.field(&client_key);
            payload_fingerprint(
                req,
                &operation,
                &rule.payload,
                trace.as_deref_mut(),
                Host::InKey,
            )
        }
        KeySource::Fields(pointers) => {
            // A body that is not JSON has none of the fields: refused, or let through
            // unprotected where the route does not require them, as when one is absent.
            let values = match extract_fields(req.body, pointers) {
                Ok(values) => values,
                Err(_) if !rule.required => return Ok(Derived::Unkeyed),
                Err(e) => return Err(e.into()),
            };
            // The fields name a request within one resource: a route with path parameters
            // (or the fallback, which takes every path) serves many, and the same
            // identifiers sent to two of them are two requests.
            hasher.field(req.path.as_bytes());
            let mut shown = vec![req.path.to_owned()];
            for (pointer, value) in pointers.iter().zip(&values) {
                match value {
                    Some(v) => {
                        hasher.field(v);
                        if trace.is_some() {
                            shown.push(format!("{pointer}={}", String::from_utf8_lossy(v)));
                        }
                    }
                    None if rule.required => {
                        return Err(KeyError::FieldMissing(pointer.to_string()))
                    }
                    None => return Ok(Derived::Unkeyed),
                }
            }
            // A body the app does not parse as JSON (`text/plain`, a form) holds none of
            // its fields to the app, whatever it reads to us: not the JSON-typed request.
            if BodyType::of(req.headers) != BodyType::Json {
                let sent = req.headers.get(header::CONTENT_TYPE);
                let media_type = sent.map_or(&b""[..], |v| v.as_bytes());
                hasher.field(media_type);
                shown.push(format!("(typed {:?})", String::from_utf8_lossy(media_type)));
            }
            if let Some(t) = trace.as_deref_mut() {
                t.material = shown.join(" ");
            }
            Digest::NONE
        }
        KeySource::Token(token_rule) => {
            let Some(token) = head::token(rule, token_rule, req.headers)? else {
                return Ok(Derived::Unkeyed);
            };
            if let Some(t) = trace.as_deref_mut() {
                t.material = format!("{}: {}", token_rule.header, String::from_utf8_lossy(&token));
            }
            // Its spend could not be told from another unnamed caller's.
            if unnamed {
                return Ok(Derived::CallerUnnamed);
            }
            // The token's own digest, not the route-bound one: see `token_digest`. What
            // the token is spent on is its fingerprint, the host among it: the same request
            // to another tenant is other work.
            return Ok(Derived::Key(DerivedKey {
                key: token_digest(&rule.scope, req, &token),
                fingerprint: payload_fingerprint(
                    req,
                    &operation,
                    &rule.payload,
                    trace,
                    Host::Included,
                ),
            }));
        }
        KeySource::Fingerprint(fp) => {
            SCRATCH.with_borrow_mut(|buf| {
                buf.clear();
                let ignored = trace.as_deref_mut().map(|t| &mut t.ignored);
                write_canonical_request(
                    req, &operation, fp.query, fp.body, &fp.ignore, buf, ignored,
                );
                hasher.field(buf);
                if let Some(t) = trace {
                    t.material = String::from_utf8_lossy(buf).into_owned();
                }
            });
            Digest::NONE
        }
    };
    if unnamed {
        return Ok(Derived::CallerUnnamed);
    }
    Ok(Derived::Key(DerivedKey {
        key: hasher.finish(),
        fingerprint,
    }))
}

/// The host the request names (`Host`, which an HTTP/2 `:authority` or an absolute-form
/// target has set) as routes match it, in lower case, without port or trailing dot: one
/// route can serve many hosts (the fallback, a `*.domain` route), and the same request to
/// two tenants is two requests, while replicas reached on other ports share their keys.
fn hash_host(hasher: &mut KeyHasher, headers: &HeaderMap) {
    match headers.get(header::HOST) {
        Some(host) => match host.to_str() {
            Ok(host) => hasher.field_lowercase(crate::route::host_name(host).as_bytes()),
            // Not a host the proxy admits (it answers 400); `explain` may still ask.
            Err(_) => hasher.field_lowercase(host.as_bytes()),
        },
        None => hasher.absent(),
    }
}

/// The store key of a one-time token: the token bound to the caller's scope. Route,
/// method and host are left out because the token is issued before the request it is for
/// is known; the payload fingerprint (which holds method, path and, for tokens, the host)
/// catches its reuse elsewhere, and a token is only ever its own caller's.
///
/// A token issued to a caller a trusted proxy could not name is bound to a marker no
/// address hashes to: the proxy's own call cannot spend it, and a token route forwards an
/// unnamed caller's spend unprotected ([`Derived::CallerUnnamed`]), so no one does.
pub fn token_digest(scope: &[ScopePart], req: &RequestView<'_>, token: &[u8]) -> Digest {
    let mut hasher = KeyHasher::new(b"idemgate:token:v1");
    let _unnamed = hash_scope(&mut hasher, scope, req, None);
    hasher.field(token);
    hasher.finish()
}

/// Hashes each scope part's label and value; `trace` hears which were present, or which
/// tier named the caller, never a value, and whether an address no one gave went in. A
/// scope whose every part is absent (only headers or cookies, none sent: `[header:
/// Authorization]` from anonymous callers) would be one key for everyone who sends none:
/// the default caller stands in for it. A value that names no one (`Bearer null`, empty)
/// counts as not sent. Returns whether the scope holds the address of a client a trusted
/// proxy could not name (hashed as a marker no address hashes to, then the proxy's).
#[must_use]
fn hash_scope(
    hasher: &mut KeyHasher,
    scope: &[ScopePart],
    req: &RequestView<'_>,
    mut trace: Option<&mut Trace>,
) -> bool {
    let mut unnamed = false;
    let mut named = false;
    let mut sent = false;
    for part in scope {
        hasher.label(part);
        // Whether a `Cookie` jar sent holds a cookie that could name someone.
        let mut jar_names = true;
        named |= matches!(
            part,
            ScopePart::Caller | ScopePart::ClientIp | ScopePart::ClientCert
        );
        let value = match part {
            ScopePart::Caller => {
                let caller = hash_caller(hasher, req);
                unnamed |= caller.unnamed();
                if let Some(t) = trace.as_deref_mut() {
                    t.heard_caller(describe_caller(caller, req), caller, req);
                }
                continue;
            }
            ScopePart::ClientIp => {
                let address = hash_address(hasher, req);
                unnamed |= address == Some(ClientAddress::Unnamed);
                if let Some(t) = trace.as_deref_mut() {
                    let state = match address {
                        Some(ClientAddress::Named(_)) => "present",
                        Some(ClientAddress::Unnamed) => "unnamed: a trusted proxy named no client",
                        None => "absent",
                    };
                    t.scope.push(format!("{part} ({state})"));
                    t.address_unknown |= address.is_none();
                }
                continue;
            }
            ScopePart::ClientCert if req.client_cert.is_none() => {
                // Without a certificate (a listener without mutual TLS, which the config
                // refuses, or `explain`), "absent" alone would be one key for everyone:
                // the default caller stands in, after the marker no certificate can hash to.
                hasher.absent();
                let caller = hash_caller(hasher, req);
                unnamed |= caller.unnamed();
                if let Some(t) = trace.as_deref_mut() {
                    let shown = format!("{part} (absent: {})", describe_caller(caller, req));
                    t.heard_caller(shown, caller, req);
                }
                continue;
            }
            // One jar however the client split it (HTTP/2 may send a field per cookie). A
            // jar with no cookie that could name anyone (`token=null`, `sid=deleted`,
            // `lang=en`) is sent alike by every anonymous caller: it names no one, so
            // alone it lets the default caller stand in. It is still hashed: beside
            // another part (`[header: X-Tenant, header: Cookie]`) a session of a name no
            // rule knows (`CAKEPHP=…`) is what tells that part's users apart.
            ScopePart::Header(name) if *name == header::COOKIE => {
                let jar = req
                    .headers
                    .contains_key(header::COOKIE)
                    .then(|| cookie_jar(req.headers));
                // A cookie that could tell its sender apart, as the default caller reads
                // them beside a session.
                jar_names = identifying_cookies(req).next().is_some();
                jar.map(Cow::Owned)
            }
            // A value that names no one (`Bearer null`, an empty field, an emptied cookie) is
            // what every anonymous caller sends alike: it counts as not sent.
            ScopePart::Header(name) if *name == header::AUTHORIZATION => {
                header_value(req.headers, name).filter(|_| has_credential(req.headers))
            }
            ScopePart::Header(name) => header_value(req.headers, name)
                .filter(|v| v.split(|&b| b == b'\n').any(names_someone)),
            ScopePart::Cookie(name) => session_cookie(req.headers, name),
            ScopePart::ClientCert => req.client_cert.map(Cow::Borrowed),
        };
        if let Some(t) = trace.as_deref_mut() {
            let state = match (&value, jar_names) {
                (Some(_), true) => "present",
                (Some(_), false) => "present, names no one",
                (None, _) => "absent",
            };
            t.scope.push(format!("{part} ({state})"));
        }
        named |= value.is_some() && jar_names;
        sent |= value.is_some();
        match value {
            Some(v) => hasher.field(&v),
            // Distinct from every present value, including an empty one.
            None => hasher.absent(),
        }
    }
    if !named {
        // After the absent markers, where no present value can be.
        hasher.label(&ScopePart::Caller);
        let caller = hash_caller(hasher, req);
        unnamed |= caller.unnamed();
        if let Some(t) = trace {
            // A jar sent that names no one is hashed, but names no caller.
            let none = if sent {
                "none names a caller"
            } else {
                "none sent"
            };
            let shown = format!("{none}: {}", describe_caller(caller, req));
            t.heard_caller(shown, caller, req);
        }
    }
    unnamed
}

/// All values of a header, joined by newlines when repeated.
fn header_value<'r>(headers: &'r HeaderMap, name: &http::HeaderName) -> Option<Cow<'r, [u8]>> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    match values.next() {
        None => Some(Cow::Borrowed(first.as_bytes())),
        Some(second) => {
            let mut all = first.as_bytes().to_vec();
            for v in std::iter::once(second).chain(values) {
                all.push(b'\n');
                all.extend_from_slice(v.as_bytes());
            }
            Some(Cow::Owned(all))
        }
    }
}

/// The fingerprint of the payload as the route's payload check has it (by default path,
/// query and body, the default send-time and send-place fields left out), stored beside a
/// client key so its reuse with another payload is caught.
fn payload_fingerprint(
    req: &RequestView<'_>,
    operation: &[u8],
    rule: &FingerprintRule,
    trace: Option<&mut Trace>,
    host: Host,
) -> Digest {
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        let mut ignored = Vec::new();
        let want_trace = trace.is_some();
        write_canonical_request(
            req,
            operation,
            rule.query,
            rule.body,
            &rule.ignore,
            buf,
            want_trace.then_some(&mut ignored),
        );
        if let Some(t) = trace {
            t.fingerprint_input = String::from_utf8_lossy(buf).into_owned();
            t.ignored.extend(ignored);
        }
        let mut hasher = KeyHasher::new(b"idemgate:fp:v1");
        hasher.field(buf);
        if host == Host::Included {
            hash_host(&mut hasher, req.headers);
        }
        hasher.finish()
    })
}

/// Whether a payload fingerprint covers the host: a client key's store key has it already,
/// a one-time token's (issued before its request was known) does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Host {
    InKey,
    Included,
}

/// SHA-256 over length-prefixed fields, so no two field lists hash the same input.
///
/// ring's SHA-256 rather than sha2's: the same digest, but where the CPU has no SHA
/// instructions ring still has assembly (AVX2, AVX) and sha2 only portable code, and every
/// protected request hashes its whole payload here (benches/load/HISTORY.md).
struct KeyHasher(Context);

impl KeyHasher {
    fn new(domain: &[u8]) -> Self {
        let mut h = Context::new(&SHA256);
        h.update(domain);
        Self(h)
    }

    fn field(&mut self, bytes: &[u8]) {
        self.0.update(&(bytes.len() as u64).to_be_bytes());
        self.0.update(bytes);
    }

    /// `field` of `bytes` in ASCII lower case, without allocating.
    fn field_lowercase(&mut self, bytes: &[u8]) {
        self.0.update(&(bytes.len() as u64).to_be_bytes());
        let mut buf = [0u8; 64];
        for chunk in bytes.chunks(buf.len()) {
            let lower = &mut buf[..chunk.len()];
            lower.copy_from_slice(chunk);
            lower.make_ascii_lowercase();
            self.0.update(lower);
        }
    }

    /// A scope part's label, as `field` of its `Display` text.
    fn label(&mut self, part: &ScopePart) {
        let (kind, name) = part.label();
        self.0
            .update(&((kind.len() + name.len()) as u64).to_be_bytes());
        self.0.update(kind.as_bytes());
        self.0.update(name.as_bytes());
    }

    fn absent(&mut self) {
        self.0.update(&u64::MAX.to_be_bytes());
    }

    fn finish(self) -> Digest {
        let mut digest = [0; 32];
        digest.copy_from_slice(self.0.finish().as_ref());
        Digest(digest)
    }
}

pub mod buckets;
mod caller;
pub mod head;
mod method;
mod request;
#[cfg(test)]
mod tests;
