//! Key derivation: from a buffered request and its route's [`KeyRule`] to the store key and
//! the request fingerprint that detects a reused client key with another payload.

use std::borrow::Cow;
use std::cell::RefCell;
use std::net::IpAddr;
use std::sync::LazyLock;

use http::{header, HeaderMap, Method};
use sha2::{Digest as _, Sha256};

use super::client_key::{read_client_key, ClientKeyError};
use super::{Digest, KeyRule, KeySource, ScopePart};
use crate::canonical::query::canonical_form;
use crate::canonical::{
    canonical_json, canonical_query, extract_fields, IgnoreSet, JsonError, DEFAULT_IGNORED_FIELDS,
};

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
    /// The connecting peer.
    pub client_ip: Option<IpAddr>,
    /// SHA-256 of the client's TLS certificate, on mutual-TLS connections.
    pub client_cert: Option<&'a [u8]>,
    /// The buffered body.
    pub body: &'a [u8],
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
    /// Scope parts and whether each was present (never their values).
    pub scope: Vec<String>,
    /// Human-readable key material (client key, field values or canonical request).
    pub material: String,
    /// Fields and parameters left out of a fingerprint.
    pub ignored: Vec<String>,
    /// The canonical request the payload fingerprint was computed from.
    pub fingerprint_input: String,
}

/// The time and geo fields skipped by default, for fingerprints of client-keyed requests.
pub static DEFAULT_IGNORE: LazyLock<IgnoreSet> =
    LazyLock::new(|| IgnoreSet::new(DEFAULT_IGNORED_FIELDS.iter().copied(), Vec::new()));

thread_local! {
    // One canonicalization buffer per worker thread: the hot path reuses its capacity
    // instead of allocating per request.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Derives the key for `req` under `rule`. `Ok(None)` means the material is absent and the
/// rule does not require it: the request passes unprotected.
///
/// ```
/// use http::{HeaderMap, Method};
/// use idemgate::key::{derive_key, FingerprintRule, KeyRule, KeySource, RequestView};
/// use idemgate::key::derive::DEFAULT_IGNORE;
/// let rule = KeyRule {
///     source: KeySource::Fingerprint(Box::new(FingerprintRule { query: true, body: true, ignore: DEFAULT_IGNORE.clone() })),
///     required: true,
///     scope: idemgate::key::default_scope(),
/// };
/// let headers = HeaderMap::new();
/// let view = |body: &'static [u8]| RequestView {
///     route: "orders", method: &Method::POST, path: "/orders", query: None,
///     headers: &headers, client_ip: None, client_cert: None, body,
/// };
/// let a = derive_key(&rule, &view(br#"{"sku":"A1","qty":2,"timestamp":1}"#), None).unwrap();
/// let b = derive_key(&rule, &view(br#"{ "qty": 2.0, "sku": "A1", "timestamp": 2 }"#), None).unwrap();
/// assert_eq!(a, b);
/// ```
pub fn derive_key(
    rule: &KeyRule,
    req: &RequestView<'_>,
    mut trace: Option<&mut Trace>,
) -> Result<Option<DerivedKey>, KeyError> {
    let mut hasher = KeyHasher::new(b"idemgate:key:v1");
    hasher.field(req.route.as_bytes());
    hasher.field(req.method.as_str().as_bytes());
    for part in &rule.scope {
        let value = scope_value(part, req);
        if let Some(t) = trace.as_deref_mut() {
            let state = if value.is_some() { "present" } else { "absent" };
            t.scope.push(format!("{part} ({state})"));
        }
        hasher.label(part);
        match value {
            Some(v) => hasher.field(&v),
            // Distinct from every present value, including an empty one.
            None => hasher.absent(),
        }
    }
    hasher.field(rule.source.as_str().as_bytes());

    let fingerprint = match &rule.source {
        KeySource::Header(name) => {
            let client_key = match read_client_key(req.headers, name) {
                Ok(k) => k,
                Err(ClientKeyError::Missing(_)) if !rule.required => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            if let Some(t) = trace.as_deref_mut() {
                t.material = format!("{name}: {}", String::from_utf8_lossy(&client_key));
            }
            hasher.field(&client_key);
            payload_fingerprint(req, trace.as_deref_mut())
        }
        KeySource::Fields(pointers) => {
            let values = extract_fields(req.body, pointers)?;
            let mut shown = Vec::new();
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
                    None => return Ok(None),
                }
            }
            if let Some(t) = trace.as_deref_mut() {
                t.material = shown.join(" ");
            }
            Digest::NONE
        }
        KeySource::Token(token_rule) => {
            let token = match read_client_key(req.headers, &token_rule.header) {
                Ok(t) => t,
                Err(ClientKeyError::Missing(_)) if !rule.required => return Ok(None),
                Err(ClientKeyError::Missing(name)) => {
                    return Err(ClientKeyError::Missing(name).into())
                }
                Err(_) => return Err(KeyError::TokenInvalid),
            };
            if !is_token(&token) {
                return Err(KeyError::TokenInvalid);
            }
            if let Some(t) = trace.as_deref_mut() {
                t.material = format!("{}: {}", token_rule.header, String::from_utf8_lossy(&token));
            }
            // The token's own digest, not the route-bound one: see `token_digest`.
            return Ok(Some(DerivedKey {
                key: token_digest(&rule.scope, req, &token),
                fingerprint: payload_fingerprint(req, trace),
            }));
        }
        KeySource::Fingerprint(fp) => {
            SCRATCH.with_borrow_mut(|buf| {
                buf.clear();
                let ignored = trace.as_deref_mut().map(|t| &mut t.ignored);
                write_canonical_request(req, fp.query, fp.body, &fp.ignore, buf, ignored);
                hasher.field(buf);
                if let Some(t) = trace {
                    t.material = String::from_utf8_lossy(buf).into_owned();
                }
            });
            Digest::NONE
        }
    };
    Ok(Some(DerivedKey {
        key: hasher.finish(),
        fingerprint,
    }))
}

/// Issued tokens are 128 random bits in lower-case hex.
fn is_token(token: &[u8]) -> bool {
    token.len() == 32
        && token
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

/// The store key of a one-time token: the token bound to the caller's scope. Route and
/// method are left out because the token is issued before either is known; the payload
/// fingerprint (which holds method and path) catches its reuse elsewhere.
pub fn token_digest(scope: &[ScopePart], req: &RequestView<'_>, token: &[u8]) -> Digest {
    let mut hasher = KeyHasher::new(b"idemgate:token:v1");
    hash_scope(&mut hasher, scope, req);
    hasher.field(token);
    hasher.finish()
}

/// The rate-limit bucket of a caller.
pub fn scope_digest(scope: &[ScopePart], req: &RequestView<'_>) -> Digest {
    let mut hasher = KeyHasher::new(b"idemgate:scope:v1");
    hash_scope(&mut hasher, scope, req);
    hasher.finish()
}

fn hash_scope(hasher: &mut KeyHasher, scope: &[ScopePart], req: &RequestView<'_>) {
    for part in scope {
        hasher.label(part);
        match scope_value(part, req) {
            Some(v) => hasher.field(&v),
            None => hasher.absent(),
        }
    }
}

/// The fingerprint of the whole payload (path, query, body; default time/geo fields left
/// out), stored beside a client key so its reuse with another payload is caught.
fn payload_fingerprint(req: &RequestView<'_>, trace: Option<&mut Trace>) -> Digest {
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        let mut ignored = Vec::new();
        let want_trace = trace.is_some();
        write_canonical_request(
            req,
            true,
            true,
            &DEFAULT_IGNORE,
            buf,
            want_trace.then_some(&mut ignored),
        );
        if let Some(t) = trace {
            t.fingerprint_input = String::from_utf8_lossy(buf).into_owned();
            t.ignored.extend(ignored);
        }
        let mut hasher = KeyHasher::new(b"idemgate:fp:v1");
        hasher.field(buf);
        hasher.finish()
    })
}

/// Writes `method path\nquery\nbody` in canonical form: query and form bodies sorted, JSON
/// canonicalized, anything else (or invalid JSON) as raw bytes. Each part carries a tag so a
/// raw body can never collide with a canonical one.
fn write_canonical_request(
    req: &RequestView<'_>,
    query: bool,
    body: bool,
    ignore: &IgnoreSet,
    out: &mut Vec<u8>,
    mut ignored: Option<&mut Vec<String>>,
) {
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.path.as_bytes());
    out.extend_from_slice(b"\nquery:");
    if query {
        if let Some(q) = req.query {
            canonical_query(q, ignore, out, ignored.as_deref_mut());
        }
    }
    if !body {
        return;
    }
    let start = out.len();
    if is_form(req.headers) {
        out.extend_from_slice(b"\nform:");
        canonical_form(req.body, ignore, out, ignored.as_deref_mut());
        return;
    }
    out.extend_from_slice(b"\njson:");
    let mut skipped = Vec::new();
    let collect = ignored.is_some().then_some(&mut skipped);
    match canonical_json(req.body, ignore, out, collect) {
        Ok(()) => {
            if let Some(list) = ignored {
                list.extend(skipped);
            }
        }
        Err(_) => {
            out.truncate(start);
            out.extend_from_slice(b"\nraw:");
            out.extend_from_slice(req.body);
        }
    }
}

fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| {
            v.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
}

fn scope_value<'r>(part: &ScopePart, req: &RequestView<'r>) -> Option<Cow<'r, [u8]>> {
    match part {
        ScopePart::Header(name) => {
            let mut values = req.headers.get_all(name).iter();
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
        ScopePart::Cookie(name) => find_cookie(req.headers, name).map(Cow::Borrowed),
        ScopePart::ClientIp => req
            .client_ip
            .map(|ip| Cow::Owned(ip.to_string().into_bytes())),
        ScopePart::ClientCert => req.client_cert.map(Cow::Borrowed),
    }
}

fn find_cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            (&pair[..eq] == name.as_bytes()).then(|| &pair[eq + 1..])
        })
}

/// SHA-256 over length-prefixed fields, so no two field lists hash the same input.
struct KeyHasher(Sha256);

impl KeyHasher {
    fn new(domain: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update(domain);
        Self(h)
    }

    fn field(&mut self, bytes: &[u8]) {
        self.0.update((bytes.len() as u64).to_be_bytes());
        self.0.update(bytes);
    }

    /// A scope part's label, as `field` of its `Display` text.
    fn label(&mut self, part: &ScopePart) {
        let (kind, name) = part.label();
        self.0
            .update(((kind.len() + name.len()) as u64).to_be_bytes());
        self.0.update(kind);
        self.0.update(name);
    }

    fn absent(&mut self) {
        self.0.update(u64::MAX.to_be_bytes());
    }

    fn finish(self) -> Digest {
        Digest(self.0.finalize().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{default_scope, FingerprintRule};
    use http::HeaderValue;

    /// Keys already stored (in Redis, by an earlier version) must still be found: a scope
    /// label is hashed exactly as the field of its `Display` text always was.
    #[test]
    fn scope_labels_hash_as_their_display_text() {
        let parts = [
            ScopePart::Header(header::AUTHORIZATION),
            ScopePart::Cookie("session".into()),
            ScopePart::ClientIp,
            ScopePart::ClientCert,
        ];
        for part in &parts {
            let mut by_label = KeyHasher::new(b"t");
            by_label.label(part);
            let mut by_text = KeyHasher::new(b"t");
            by_text.field(part.to_string().as_bytes());
            assert_eq!(by_label.finish(), by_text.finish(), "{part}");
        }
        assert_eq!(parts[0].to_string(), "header:authorization");
        assert_eq!(parts[1].to_string(), "cookie:session");
        assert_eq!(parts[2].to_string(), "client_ip");
    }

    fn view<'a>(headers: &'a HeaderMap, body: &'a [u8]) -> RequestView<'a> {
        RequestView {
            route: "r",
            method: &Method::POST,
            path: "/orders",
            query: None,
            headers,
            client_ip: None,
            client_cert: None,
            body,
        }
    }

    fn header_rule(required: bool) -> KeyRule {
        KeyRule {
            source: KeySource::Header(http::HeaderName::from_static("idempotency-key")),
            required,
            scope: default_scope(),
        }
    }

    fn keyed(key: &str, auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("idempotency-key", HeaderValue::from_str(key).unwrap());
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(a).unwrap());
        }
        h
    }

    #[test]
    fn same_client_key_with_other_payload_keeps_key_but_changes_fingerprint() {
        let h = keyed("k1", None);
        let a = derive_key(&header_rule(true), &view(&h, b"{\"amount\":1}"), None).unwrap();
        let b = derive_key(&header_rule(true), &view(&h, b"{\"amount\":2}"), None).unwrap();
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.key, b.key);
        assert_ne!(a.fingerprint, b.fingerprint);
    }

    #[test]
    fn different_callers_never_share_a_key() {
        let a = keyed("k1", Some("Bearer alice"));
        let b = keyed("k1", Some("Bearer bob"));
        let anon = keyed("k1", None);
        let ka = derive_key(&header_rule(true), &view(&a, b""), None)
            .unwrap()
            .unwrap();
        let kb = derive_key(&header_rule(true), &view(&b, b""), None)
            .unwrap()
            .unwrap();
        let kn = derive_key(&header_rule(true), &view(&anon, b""), None)
            .unwrap()
            .unwrap();
        assert_ne!(ka.key, kb.key);
        assert_ne!(ka.key, kn.key);
    }

    #[test]
    fn missing_key_passes_unless_required() {
        let h = HeaderMap::new();
        assert!(derive_key(&header_rule(false), &view(&h, b""), None)
            .unwrap()
            .is_none());
        assert!(matches!(
            derive_key(&header_rule(true), &view(&h, b""), None),
            Err(KeyError::ClientKey(ClientKeyError::Missing(_)))
        ));
    }

    #[test]
    fn fields_key_ignores_everything_but_the_fields() {
        let rule = KeyRule {
            source: KeySource::Fields(vec!["/a".parse().unwrap(), "/b".parse().unwrap()]),
            required: true,
            scope: default_scope(),
        };
        let h = HeaderMap::new();
        let one = derive_key(&rule, &view(&h, br#"{"a":1,"b":"x","ts":1}"#), None);
        let two = derive_key(&rule, &view(&h, br#"{"b":"x","note":"y","a":1.0}"#), None);
        assert_eq!(one.unwrap(), two.unwrap());
        assert!(matches!(
            derive_key(&rule, &view(&h, br#"{"a":1}"#), None),
            Err(KeyError::FieldMissing(p)) if p == "/b"
        ));
        assert!(matches!(
            derive_key(&rule, &view(&h, b"{oops"), None),
            Err(KeyError::InvalidJson(_))
        ));
    }

    #[test]
    fn fingerprint_covers_path_and_query_and_falls_back_to_raw_bytes() {
        let rule = KeyRule {
            source: KeySource::Fingerprint(Box::new(FingerprintRule {
                query: true,
                body: true,
                ignore: DEFAULT_IGNORE.clone(),
            })),
            required: true,
            scope: default_scope(),
        };
        let h = HeaderMap::new();
        let base = view(&h, b"not json");
        let k = |v: RequestView<'_>| derive_key(&rule, &v, None).unwrap().unwrap().key;
        assert_eq!(k(base), k(base));
        assert_ne!(
            k(base),
            k(RequestView {
                path: "/other",
                ..base
            })
        );
        assert_ne!(
            k(base),
            k(RequestView {
                query: Some("a=1"),
                ..base
            })
        );
        assert_eq!(
            k(RequestView {
                query: Some("b=2&a=1&ts=5"),
                ..base
            }),
            k(RequestView {
                query: Some("a=1&b=2"),
                ..base
            })
        );
        assert_ne!(
            k(base),
            k(RequestView {
                body: b"not json!",
                ..base
            })
        );
    }

    #[test]
    fn cookie_scope_reads_the_named_cookie() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; sid=xyz; b=2"),
        );
        assert_eq!(find_cookie(&h, "sid"), Some(&b"xyz"[..]));
        assert_eq!(find_cookie(&h, "id"), None);
    }
}
