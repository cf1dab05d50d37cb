//! A client a trusted proxy could not name (`X-Forwarded-For: unknown`): any key that would
//! hold its address is none ([`Derived::CallerUnnamed`]); a key that names its caller
//! otherwise is made as ever.
use super::*;

/// Trusts the loopback block, as the integration tests' proxy does.
static BEHIND_A_PROXY: std::sync::LazyLock<Identity> = std::sync::LazyLock::new(|| Identity {
    trusted_proxies: ["127.0.0.0/8".parse().unwrap()].into_iter().collect(),
    ..Identity::default()
});

/// `headers` from the trusted 127.0.0.1, with `X-Forwarded-For: xff` when given.
fn derive(rule: &KeyRule, pairs: &[(&'static str, &'static str)], xff: Option<&str>) -> Derived {
    derive_traced(rule, pairs, xff, None)
}

fn derive_traced(
    rule: &KeyRule,
    pairs: &[(&'static str, &'static str)],
    xff: Option<&str>,
    trace: Option<&mut Trace>,
) -> Derived {
    let mut headers = with(pairs);
    if let Some(xff) = xff {
        headers.append("x-forwarded-for", HeaderValue::from_str(xff).unwrap());
    }
    let v = RequestView {
        peer: Some(IpAddr::from([127, 0, 0, 1])),
        identity: &BEHIND_A_PROXY,
        ..view(&headers, b"{}")
    };
    derive_key(rule, &v, trace).unwrap()
}

fn scoped(scope: Vec<ScopePart>) -> KeyRule {
    KeyRule {
        scope,
        ..fingerprint_rule()
    }
}

#[test]
fn a_key_holding_an_unnamed_address_is_no_key() {
    let header: &'static [(&str, &str)] = &[("idempotency-key", "k1")];
    for (rule, sent) in [
        (fingerprint_rule(), &[][..]),
        (header_rule(true), header),
        // The cookie jar and a credential header are mixed in with the address.
        (fingerprint_rule(), &[("cookie", "theme=dark")]),
        (fingerprint_rule(), &[("x-api-key", "shared-app-key")]),
        (scoped(vec![ScopePart::ClientIp]), &[]),
        // The address beside a header still holds the address.
        (
            scoped(vec![
                ScopePart::Header(header::AUTHORIZATION),
                ScopePart::ClientIp,
            ]),
            &[("authorization", "Bearer alice")],
        ),
        // Without a certificate, and with no part sent, the default caller stands in.
        (scoped(vec![ScopePart::ClientCert]), &[]),
        (
            scoped(vec![ScopePart::Header(http::HeaderName::from_static(
                "x-tenant",
            ))]),
            &[],
        ),
    ] {
        assert_eq!(
            derive(&rule, sent, Some("unknown")),
            Derived::CallerUnnamed,
            "{:?} {sent:?}",
            rule.scope
        );
        assert!(
            derive(&rule, sent, Some("198.51.100.7")).key().is_some(),
            "a named client: {:?} {sent:?}",
            rule.scope
        );
        assert!(
            derive(&rule, sent, None).key().is_some(),
            "the trusted peer itself: {:?} {sent:?}",
            rule.scope
        );
    }
}

#[test]
fn a_caller_named_without_its_address_keeps_its_key() {
    for (rule, sent) in [
        (fingerprint_rule(), &[("authorization", "Bearer alice")][..]),
        (
            fingerprint_rule(),
            &[("cookie", "sessionid=s1; theme=dark")],
        ),
        (
            scoped(vec![ScopePart::Header(http::HeaderName::from_static(
                "x-tenant",
            ))]),
            &[("x-tenant", "acme")],
        ),
    ] {
        let unnamed = derive(&rule, sent, Some("unknown")).key();
        let named = derive(&rule, sent, Some("198.51.100.7")).key();
        assert!(unnamed.is_some(), "{sent:?}");
        assert_eq!(unnamed, named, "{sent:?}: the address is not part of it");
    }
}

/// The rule's own refusals come first: a required key missing is a 400 for everyone.
#[test]
fn a_request_the_rule_refuses_is_refused_from_an_unnamed_caller_too() {
    let mut headers = HeaderMap::new();
    headers.insert("x-forwarded-for", HeaderValue::from_static("unknown"));
    let v = RequestView {
        peer: Some(IpAddr::from([127, 0, 0, 1])),
        identity: &BEHIND_A_PROXY,
        ..view(&headers, b"{}")
    };
    assert!(matches!(
        derive_key(&header_rule(true), &v, None),
        Err(KeyError::ClientKey(ClientKeyError::Missing(_)))
    ));
    assert_eq!(
        derive_key(&header_rule(false), &v, None).unwrap(),
        Derived::Unkeyed
    );
}

/// A token route cannot tell one unnamed caller's spend from another's; a token issued to
/// an unnamed caller is bound to none of the addresses a named caller hashes (the proxy's
/// own among them), so no one else can spend it.
#[test]
fn a_token_of_an_unnamed_caller_is_no_one_elses() {
    let rule = KeyRule {
        source: KeySource::Token(crate::key::TokenRule {
            header: http::HeaderName::from_static("idempotency-token"),
            reissue_ttl: std::time::Duration::from_secs(60),
        }),
        ..fingerprint_rule()
    };
    let token = "0123456789abcdef0123456789abcdef";
    let sent = &[("idempotency-token", token)];
    assert_eq!(derive(&rule, sent, Some("unknown")), Derived::CallerUnnamed);
    assert!(derive(&rule, sent, None).key().is_some());
    let digest = |xff: Option<&'static str>| {
        let mut headers = HeaderMap::new();
        if let Some(xff) = xff {
            headers.insert("x-forwarded-for", HeaderValue::from_static(xff));
        }
        let v = RequestView {
            peer: Some(IpAddr::from([127, 0, 0, 1])),
            identity: &BEHIND_A_PROXY,
            ..view(&headers, b"")
        };
        token_digest(&rule.scope, &v, token.as_bytes())
    };
    assert_ne!(digest(Some("unknown")), digest(None), "not the proxy's own");
    assert_ne!(digest(Some("unknown")), digest(Some("127.0.0.1")));
    assert_eq!(digest(Some("unknown")), digest(Some("_hidden")));
}

#[test]
fn explain_says_the_address_is_unnamed() {
    let mut trace = Trace::default();
    derive_traced(&fingerprint_rule(), &[], Some("unknown"), Some(&mut trace));
    assert_eq!(
        trace.scope,
        ["caller by client address (unnamed: a trusted proxy's X-Forwarded-For names no client)"]
    );
    let mut trace = Trace::default();
    derive_traced(
        &scoped(vec![ScopePart::ClientIp]),
        &[],
        Some("unknown"),
        Some(&mut trace),
    );
    assert_eq!(
        trace.scope,
        ["client_ip (unnamed: a trusted proxy named no client)"]
    );
    assert!(!trace.address_unknown, "an address was given: the peer's");
}
