//! Key derivation: scopes, caller tiers, client keys, fields and fingerprints.
use super::*;
use crate::key::default_scope;
use http::HeaderValue;

mod cert;
mod cookies;
mod media_type;
mod unnamed;

static IDENTITY: std::sync::LazyLock<Identity> = std::sync::LazyLock::new(Identity::default);

/// Keys already stored (in Redis, by an earlier version) must still be found: a scope
/// label is hashed exactly as the field of its `Display` text always was.
#[test]
fn scope_labels_hash_as_their_display_text() {
    let parts = [
        ScopePart::Header(header::AUTHORIZATION),
        ScopePart::Cookie("session".into()),
        ScopePart::ClientIp,
        ScopePart::ClientCert,
        ScopePart::Caller,
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

/// Keys already stored by a version that hashed with sha2 must still be found: the key
/// hasher is plain SHA-256 over domain, then length-prefixed fields, whatever computes it.
#[test]
fn the_key_hasher_is_sha256_of_its_length_prefixed_fields() {
    use sha2::{Digest as _, Sha256};
    let body = vec![b'{'; 1500];
    let mut hasher = KeyHasher::new(b"idemgate:fp:v1");
    hasher.field(&body);
    hasher.field_lowercase(b"API.Example.COM");
    hasher.absent();
    let mut expected = Sha256::new();
    expected.update(b"idemgate:fp:v1");
    expected.update(1500u64.to_be_bytes());
    expected.update(&body);
    expected.update(15u64.to_be_bytes());
    expected.update(b"api.example.com");
    expected.update(u64::MAX.to_be_bytes());
    assert_eq!(hasher.finish(), Digest(expected.finalize().into()));
}

fn view<'a>(headers: &'a HeaderMap, body: &'a [u8]) -> RequestView<'a> {
    RequestView {
        route: "r",
        method: &Method::POST,
        path: "/orders",
        query: None,
        headers,
        overrides: Overrides::find(headers),
        peer: Some(IpAddr::from([192, 0, 2, 1])),
        identity: &IDENTITY,
        client_cert: None,
        body,
    }
}

fn header_rule(required: bool) -> KeyRule {
    KeyRule {
        source: KeySource::Header(http::HeaderName::from_static("idempotency-key")),
        required,
        scope: default_scope(),
        payload: Box::new(FingerprintRule::standard()),
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
    let (a, b) = (a.key().unwrap(), b.key().unwrap());
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
        .key()
        .unwrap();
    let kb = derive_key(&header_rule(true), &view(&b, b""), None)
        .unwrap()
        .key()
        .unwrap();
    let kn = derive_key(&header_rule(true), &view(&anon, b""), None)
        .unwrap()
        .key()
        .unwrap();
    assert_ne!(ka.key, kb.key);
    assert_ne!(ka.key, kn.key);
}

#[test]
fn missing_key_passes_unless_required() {
    let h = HeaderMap::new();
    assert_eq!(
        derive_key(&header_rule(false), &view(&h, b""), None).unwrap(),
        Derived::Unkeyed
    );
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
        payload: Box::new(FingerprintRule::standard()),
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
        source: KeySource::Fingerprint(Box::new(FingerprintRule::standard())),
        required: true,
        scope: default_scope(),
        payload: Box::new(FingerprintRule::standard()),
    };
    let h = HeaderMap::new();
    let base = view(&h, b"not json");
    let k = |v: RequestView<'_>| derive_key(&rule, &v, None).unwrap().key().unwrap().key;
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

fn fingerprint_rule() -> KeyRule {
    KeyRule {
        source: KeySource::Fingerprint(Box::new(FingerprintRule::standard())),
        required: true,
        scope: default_scope(),
        payload: Box::new(FingerprintRule::standard()),
    }
}

fn key_of(headers: &HeaderMap, peer: [u8; 4]) -> Digest {
    fingerprint_key(&RequestView {
        peer: Some(IpAddr::from(peer)),
        ..view(headers, b"{}")
    })
}

/// The key [`fingerprint_rule`] gives `v`.
fn fingerprint_key(v: &RequestView<'_>) -> Digest {
    derive_key(&fingerprint_rule(), v, None)
        .unwrap()
        .key()
        .unwrap()
        .key
}

fn with(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.append(*n, HeaderValue::from_static(v));
    }
    h
}

#[test]
fn the_caller_is_authorization_and_session_else_cookies_else_address() {
    let a = [192, 0, 2, 1];
    let b = [192, 0, 2, 2];
    // Authorization names the caller wherever it comes from, with the cookies it sends
    // when none has a session name: one of another name may be the app's session.
    let alice = with(&[("authorization", "Bearer alice"), ("cookie", "theme=1")]);
    let alice2 = with(&[("authorization", "Bearer alice"), ("cookie", "theme=2")]);
    assert_eq!(key_of(&alice, a), key_of(&alice, b));
    assert_ne!(key_of(&alice, a), key_of(&alice2, a));
    assert_ne!(
        key_of(&alice, a),
        key_of(&with(&[("authorization", "Bearer bob")]), a)
    );
    // A session cookie names the caller, whatever else is sent and from where.
    let s1 = with(&[("cookie", "theme=dark; sessionid=s1")]);
    let s1b = with(&[("cookie", "sessionid=s1; theme=light")]);
    let s2 = with(&[("cookie", "theme=dark; sessionid=s2")]);
    assert_eq!(key_of(&s1, a), key_of(&s1b, b));
    assert_ne!(key_of(&s1, a), key_of(&s2, a));
    // Cookies of unknown names: the whole header, and the address with it.
    let c1 = with(&[("cookie", "app_sess=x1")]);
    let c2 = with(&[("cookie", "app_sess=x2")]);
    assert_ne!(key_of(&c1, a), key_of(&c2, a));
    assert_eq!(key_of(&c1, a), key_of(&c1, a));
    assert_ne!(key_of(&c1, a), key_of(&c1, b));
    // A cleared session cookie names no one.
    let cleared = with(&[("cookie", "sessionid=")]);
    assert_ne!(key_of(&cleared, a), key_of(&cleared, b));
    // Nothing but the address.
    let none = HeaderMap::new();
    assert_eq!(key_of(&none, a), key_of(&none, a));
    assert_ne!(key_of(&none, a), key_of(&none, b));
}

/// One `Authorization` shared by many people (a staging site's basic-auth gate, a
/// gateway's service token) in front of per-user sessions: the session still tells them
/// apart, and each one's retry still finds its own key from anywhere.
#[test]
fn a_shared_authorization_does_not_hide_the_session() {
    let (a, b) = ([192, 0, 2, 1], [192, 0, 2, 2]);
    let gate = "Basic c3RhZmY6cGFzcw==";
    let alice = with(&[("authorization", gate), ("cookie", "sessionid=alice")]);
    let bob = with(&[("authorization", gate), ("cookie", "sessionid=bob")]);
    assert_ne!(key_of(&alice, a), key_of(&bob, a));
    assert_eq!(key_of(&alice, a), key_of(&alice, b));
    // Each part alone is another caller than both together.
    let gate_only = with(&[("authorization", gate)]);
    let session_only = with(&[("cookie", "sessionid=alice")]);
    assert_ne!(key_of(&alice, a), key_of(&gate_only, a));
    assert_ne!(key_of(&alice, a), key_of(&session_only, a));
}

/// Callers told apart by an API key header rather than `Authorization`, from one address
/// (an integration platform, a NAT): the key header keeps them apart. It is mixed in,
/// never instead of the address: one public key shared by every user of an app must not
/// merge them.
#[test]
fn a_credential_header_is_mixed_into_the_caller() {
    let (a, b) = ([192, 0, 2, 1], [192, 0, 2, 2]);
    let ka = with(&[("x-api-key", "customer-a")]);
    let kb = with(&[("x-api-key", "customer-b")]);
    assert_ne!(key_of(&ka, a), key_of(&kb, a));
    assert_ne!(key_of(&ka, a), key_of(&HeaderMap::new(), a));
    // The address still counts beside it.
    assert_ne!(key_of(&ka, a), key_of(&ka, b));
    // Beside an Authorization credential it is mixed in too, and the address is not.
    let auth_ka = with(&[("authorization", "Bearer t"), ("x-api-key", "customer-a")]);
    let auth_kb = with(&[("authorization", "Bearer t"), ("x-api-key", "customer-b")]);
    assert_ne!(key_of(&auth_ka, a), key_of(&auth_kb, a));
    assert_eq!(key_of(&auth_ka, a), key_of(&auth_ka, b));
    // Every default name counts; a name not listed does not.
    for name in crate::key::identity::DEFAULT_CREDENTIAL_HEADERS {
        let mut one = HeaderMap::new();
        one.insert(
            http::HeaderName::from_static(name),
            HeaderValue::from_static("k1"),
        );
        let mut two = HeaderMap::new();
        two.insert(
            http::HeaderName::from_static(name),
            HeaderValue::from_static("k2"),
        );
        assert_ne!(key_of(&one, a), key_of(&two, a), "{name}");
    }
    let unlisted = with(&[("x-tenant-key", "k1")]);
    assert_eq!(key_of(&unlisted, a), key_of(&HeaderMap::new(), a));
}

/// One route can serve several hosts: the same request from the same caller to two hosts
/// is two requests. The host is taken as routes match it: any case, without port or
/// trailing dot.
#[test]
fn the_host_is_part_of_every_key() {
    let a = [192, 0, 2, 1];
    let tenant_a = with(&[("host", "tenant-a.example.com")]);
    let tenant_b = with(&[("host", "tenant-b.example.com")]);
    assert_ne!(key_of(&tenant_a, a), key_of(&tenant_b, a));
    assert_eq!(
        key_of(&tenant_a, a),
        key_of(&with(&[("host", "Tenant-A.Example.COM")]), a)
    );
    for same in ["tenant-a.example.com:8443", "tenant-a.example.com."] {
        assert_eq!(
            key_of(&tenant_a, a),
            key_of(&with(&[("host", same)]), a),
            "{same}"
        );
    }
    assert_ne!(
        key_of(&with(&[("host", "[2001:db8::1]:8080")]), a),
        key_of(&with(&[("host", "[2001:db8::2]:8080")]), a)
    );
    assert_ne!(key_of(&tenant_a, a), key_of(&HeaderMap::new(), a));
    // A name longer than the lower-casing buffer is still compared whole.
    let long = "x".repeat(100) + ".example.com";
    let long_b = "x".repeat(100) + ".example.org";
    let mut one = HeaderMap::new();
    one.insert("host", HeaderValue::from_str(&long).unwrap());
    let mut two = HeaderMap::new();
    two.insert("host", HeaderValue::from_str(&long_b).unwrap());
    assert_ne!(key_of(&one, a), key_of(&two, a));
    // Client keys and fields too, not only fingerprints.
    let rule = KeyRule {
        source: KeySource::Header(http::HeaderName::from_static("idempotency-key")),
        required: true,
        scope: default_scope(),
        payload: Box::new(FingerprintRule::standard()),
    };
    let keyed = |host: &'static str| {
        let h = with(&[("host", host), ("idempotency-key", "k-1")]);
        let v = RequestView {
            peer: Some(IpAddr::from(a)),
            ..view(&h, b"{}")
        };
        derive_key(&rule, &v, None).unwrap().key().unwrap().key
    };
    assert_ne!(keyed("tenant-a.example.com"), keyed("tenant-b.example.com"));
}

/// The tier is hashed with the value: a header value equal to an address's octets, or
/// to a session value, still makes another key.
#[test]
fn tiers_never_collide() {
    let a = [192, 0, 2, 1];
    let auth = with(&[("authorization", "sid=v")]);
    let whole = with(&[("cookie", "sid=v")]);
    assert_ne!(key_of(&auth, a), key_of(&whole, a));
    let by_session = with(&[("cookie", "sid=v")]);
    let by_cookie = with(&[("cookie", "sid2=v")]);
    assert_ne!(key_of(&by_session, a), key_of(&by_cookie, a));
}

#[test]
fn explain_names_the_tier_and_never_the_value() {
    let h = with(&[("cookie", "sessionid=secret-value; x=1")]);
    let mut trace = Trace::default();
    derive_key(&fingerprint_rule(), &view(&h, b"{}"), Some(&mut trace)).unwrap();
    assert_eq!(trace.scope, ["caller by session cookie (sessionid)"]);
    let h = with(&[("authorization", "Bearer secret-value")]);
    let mut trace = Trace::default();
    derive_key(&fingerprint_rule(), &view(&h, b"{}"), Some(&mut trace)).unwrap();
    assert_eq!(trace.scope, ["caller by Authorization header"]);
    assert!(!trace.material.contains("secret"));
    let h = with(&[
        ("authorization", "Basic c2VjcmV0"),
        ("cookie", "sessionid=deleted; sid=secret-value"),
        ("x-api-key", "secret-value"),
    ]);
    let mut trace = Trace::default();
    derive_key(&fingerprint_rule(), &view(&h, b"{}"), Some(&mut trace)).unwrap();
    // `sessionid=deleted` is a cleared session: the key does not use it, so neither does
    // the explanation.
    assert_eq!(
        trace.scope,
        ["caller by Authorization header + session cookie (sid) + credential header (x-api-key)"]
    );
    let h = with(&[("x-api-key", "secret-value")]);
    let mut trace = Trace::default();
    derive_key(&fingerprint_rule(), &view(&h, b"{}"), Some(&mut trace)).unwrap();
    assert_eq!(
        trace.scope,
        ["caller by client address + credential header (x-api-key)"]
    );
}

/// An `Authorization` that carries no credential is what every logged-out page sends: it
/// names no one, and the caller is told by the next tier (here the address).
#[test]
fn an_authorization_without_a_credential_names_no_one() {
    let (a, b) = ([192, 0, 2, 1], [192, 0, 2, 2]);
    for anonymous in [
        "",
        "Bearer null",
        "Bearer undefined",
        "Bearer",
        "bearer NULL",
        "null",
    ] {
        let h = with(&[("authorization", anonymous)]);
        assert_ne!(key_of(&h, a), key_of(&h, b), "{anonymous:?}");
        assert_eq!(key_of(&h, a), key_of(&HeaderMap::new(), a), "{anonymous:?}");
    }
    // A session cookie beside it still names the caller.
    let s1 = with(&[("authorization", "Bearer null"), ("cookie", "sid=s1")]);
    let s2 = with(&[("authorization", "Bearer null"), ("cookie", "sid=s2")]);
    assert_eq!(key_of(&s1, a), key_of(&s1, b));
    assert_ne!(key_of(&s1, a), key_of(&s2, a));
    // A real token names its caller from anywhere, even repeated beside a placeholder.
    let token = with(&[("authorization", "Bearer abc")]);
    assert_eq!(key_of(&token, a), key_of(&token, b));
    let both = with(&[
        ("authorization", "Bearer null"),
        ("authorization", "Bearer abc"),
    ]);
    assert_eq!(key_of(&both, a), key_of(&both, b));
    assert_ne!(key_of(&both, a), key_of(&token, a));
    let mut trace = Trace::default();
    let h = with(&[("authorization", "Bearer null")]);
    derive_key(&fingerprint_rule(), &view(&h, b"{}"), Some(&mut trace)).unwrap();
    assert_eq!(
        trace.scope,
        ["caller by client address (the Authorization header carries no credential)"]
    );
}

/// A missing token formatted into the header by another language (Python's `None`, Go's
/// `<nil>`, JavaScript's `NaN`…) is as anonymous as `null`: callers on two addresses sending
/// it with one body are two callers.
#[test]
fn a_placeholder_from_any_language_is_no_credential() {
    let (a, b) = ([192, 0, 2, 1], [192, 0, 2, 2]);
    for anonymous in [
        "Bearer None",
        "Bearer nil",
        "Bearer <nil>",
        "Bearer false",
        "Bearer NaN",
        "Bearer [object Undefined]",
        "Bearer [object Null]",
        "bearer NONE",
        "None",
    ] {
        let h = with(&[("authorization", anonymous)]);
        assert_ne!(key_of(&h, a), key_of(&h, b), "{anonymous:?}");
        assert_eq!(key_of(&h, a), key_of(&HeaderMap::new(), a), "{anonymous:?}");
    }
    // Real credentials that merely contain those words still name their caller.
    let h = with(&[("authorization", "Bearer None123")]);
    assert_eq!(key_of(&h, a), key_of(&h, b));
}

#[test]
fn a_cleared_session_cookie_names_no_one() {
    let (a, b) = ([192, 0, 2, 1], [192, 0, 2, 2]);
    for cleared in [
        "sid=",
        "sid=deleted",
        "sid=null",
        "sid=undefined",
        "sid=DELETED",
    ] {
        let h = with(&[("cookie", cleared)]);
        assert_ne!(key_of(&h, a), key_of(&h, b), "{cleared:?}");
    }
    let live = with(&[("cookie", "sid=s1")]);
    assert_eq!(key_of(&live, a), key_of(&live, b));
}

/// `scope: [header: Cookie]` reads one jar however the client split it into fields.
#[test]
fn a_cookie_header_scope_reads_one_jar() {
    let rule = KeyRule {
        scope: vec![ScopePart::Header(http::header::COOKIE)],
        ..fingerprint_rule()
    };
    let key = |h: &HeaderMap| {
        derive_key(&rule, &view(h, b"{}"), None)
            .unwrap()
            .key()
            .unwrap()
            .key
    };
    let split = with(&[("cookie", "a=1"), ("cookie", "b=2")]);
    assert_eq!(key(&split), key(&with(&[("cookie", "a=1; b=2")])));
    assert_ne!(key(&split), key(&with(&[("cookie", "a=1; b=3")])));
}

/// A scope part whose value names no one (`Bearer null`, an empty header, an emptied
/// cookie or jar) counts as not sent: the caller stands in, so anonymous callers at two
/// addresses never share a key, while a real value still names its caller from anywhere.
#[test]
fn a_scope_part_that_names_no_one_is_not_sent() {
    let key = |part: &ScopePart, h: &HeaderMap, peer: [u8; 4]| {
        let rule = KeyRule {
            scope: vec![part.clone()],
            ..fingerprint_rule()
        };
        let v = RequestView {
            peer: Some(IpAddr::from(peer)),
            ..view(h, b"{}")
        };
        derive_key(&rule, &v, None).unwrap().key().unwrap().key
    };
    let auth = ScopePart::Header(header::AUTHORIZATION);
    let user = ScopePart::Header(http::HeaderName::from_static("x-user-id"));
    let uid = ScopePart::Cookie("uid".into());
    let jar = ScopePart::Header(header::COOKIE);
    let (a, b) = ([192, 0, 2, 1], [192, 0, 2, 2]);
    for (part, anonymous) in [
        (&auth, &[("authorization", "Bearer null")][..]),
        (&auth, &[("authorization", "Basic")]),
        (&user, &[("x-user-id", "")]),
        (&user, &[("x-user-id", "undefined")]),
        (&uid, &[("cookie", "uid=deleted")]),
        (&uid, &[("cookie", "uid=")]),
        (&jar, &[("cookie", ";")]),
    ] {
        let h = with(anonymous);
        assert_ne!(key(part, &h, a), key(part, &h, b), "{anonymous:?}");
    }
    for (part, named) in [
        (&auth, &[("authorization", "Bearer t-1")][..]),
        (&user, &[("x-user-id", "u-7")]),
        (&user, &[("x-user-id", ""), ("x-user-id", "u-7")]),
        (&uid, &[("cookie", "uid=u-7")]),
    ] {
        let h = with(named);
        assert_eq!(key(part, &h, a), key(part, &h, b), "{named:?}");
    }
}

/// One client is one caller whether a dual-stack listener saw its IPv4 address mapped
/// into IPv6 or not, and whether a trusted proxy wrote it mapped; two clients stay two.
#[test]
fn an_ipv4_mapped_address_is_its_ipv4_caller() {
    let identity = Identity {
        trusted_proxies: ["10.0.0.0/8"].iter().map(|c| c.parse().unwrap()).collect(),
        ..Identity::default()
    };
    let key = |peer: &str, xff: Option<&str>| {
        let mut h = HeaderMap::new();
        if let Some(xff) = xff {
            h.insert("x-forwarded-for", HeaderValue::from_str(xff).unwrap());
        }
        fingerprint_key(&RequestView {
            peer: Some(peer.parse().unwrap()),
            identity: &identity,
            ..view(&h, b"{}")
        })
    };
    assert_eq!(key("192.0.2.1", None), key("::ffff:192.0.2.1", None));
    assert_ne!(key("192.0.2.1", None), key("::ffff:192.0.2.2", None));
    let behind = key("10.0.0.2", Some("203.0.113.9"));
    assert_eq!(behind, key("::ffff:10.0.0.2", Some("::ffff:203.0.113.9")));
    assert_eq!(behind, key("203.0.113.9", None));
    assert_ne!(behind, key("10.0.0.2", Some("203.0.113.8")));
}
