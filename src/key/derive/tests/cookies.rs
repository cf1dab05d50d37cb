//! Cookies beside a listed session, and `scope: [header: Cookie]`: which cookies could
//! name a caller, and which change between a request and its retry without doing so.
use super::*;

/// A listed session cookie sent alike by two users (a copy planted for the parent domain
/// by a sibling subdomain, a listed name the app does not use) beside the app's own
/// session under a name not listed (`next-auth.session-token`): keyed by the listed one
/// alone, two users sent one key, and the second got the first's answer. Beside a listed
/// session, a cookie whose name looks like a credential goes in too; analytics and
/// preference cookies, rewritten between a click and its retry, do not. One address
/// throughout, so only the cookies can tell the callers apart.
#[test]
fn a_listed_session_does_not_hide_a_credential_cookie_beside_it() {
    let (a, b) = ([192, 0, 2, 1], [192, 0, 2, 2]);
    let alice = with(&[("cookie", "next-auth.session-token=alice; sessionid=x")]);
    let bob = with(&[("cookie", "next-auth.session-token=bob; sessionid=x")]);
    assert_ne!(key_of(&alice, a), key_of(&bob, a), "bob got alice's answer");
    // The planted copy is sent by its planter alone and by the victim beside the
    // victim's own login.
    let planter = with(&[("cookie", "session=k")]);
    let victim = with(&[("cookie", "session=k; remember_web_59ba=v")]);
    assert_ne!(key_of(&planter, a), key_of(&victim, a));
    for (name, value) in [
        ("auth", "t"),
        ("JWT", "t"),
        ("user_id", "7"),
        ("wordpress_logged_in_1", "t"),
        ("csrftoken", "t"),
        ("account", "7"),
        ("PHPSESSID2", "t"),
        ("uid", "7"),
        ("ab_session", "t"),
    ] {
        let one = format!("sessionid=x; {name}={value}");
        let other = format!("sessionid=x; {name}={value}2");
        let one = with_owned(&one);
        let other = with_owned(&other);
        assert_ne!(key_of(&one, a), key_of(&other, a), "{name}");
    }
    // The same user's retry, its analytics and preference cookies rewritten meanwhile,
    // from another address, is still the same caller.
    let first = with(&[(
        "cookie",
        "_ga=GA1.1.1; sessionid=s1; _gid=1; consent=yes; next-auth.session-token=alice",
    )]);
    let retry = with(&[(
        "cookie",
        "_ga=GA1.1.2; sessionid=s1; _gid=2; consent=no; theme=dark; next-auth.session-token=alice",
    )]);
    assert_eq!(key_of(&first, a), key_of(&retry, b));
    // A cleared credential cookie is what every logged-out browser sends.
    let cleared = with(&[("cookie", "sessionid=s1; auth_token=deleted")]);
    assert_eq!(
        key_of(&cleared, a),
        key_of(&with(&[("cookie", "sessionid=s1")]), a)
    );
    // `explain` names both kinds, never their values.
    let h = with(&[(
        "cookie",
        "next-auth.session-token=alice; sessionid=s1; ab_session=x",
    )]);
    let mut trace = Trace::default();
    derive_key(&fingerprint_rule(), &view(&h, b"{}"), Some(&mut trace)).unwrap();
    assert_eq!(
        trace.scope,
        [
            "caller by session cookie (sessionid) + cookie named like a credential or a \
             session (next-auth.session-token, ab_session)"
        ]
    );
}

/// A key stored by an earlier version for a request whose cookies are all listed sessions
/// is still found: its key is hashed exactly as before.
#[test]
fn a_key_of_listed_sessions_alone_is_unchanged() {
    let h = with(&[(
        "cookie",
        "sessionid=s1; theme=dark; _ga=1; laravel_session=s2",
    )]);
    assert_eq!(
        hex(key_of(&h, [192, 0, 2, 1])),
        "ca6b4a1dabf689cf121b7190d32a9db434c3ab23c8d439e84b0900dd89442ee4"
    );
}

fn hex(d: Digest) -> String {
    d.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn with_owned(cookie: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(header::COOKIE, HeaderValue::from_str(cookie).unwrap());
    h
}

/// `scope: [header: Cookie]` reads the whole jar, however split. A jar holding no cookie
/// that could name anyone (a language, a theme; `token=null` from a logged-out page, an
/// emptied `session=`, `sid=deleted`) is what every anonymous caller sends alike, so it
/// names no one and the default caller (here with the address) stands in: two anonymous
/// callers never share a key. One real session value still names.
#[test]
fn a_cookie_jar_without_an_identifying_cookie_is_not_sent() {
    let rule = KeyRule {
        scope: vec![ScopePart::Header(header::COOKIE)],
        ..fingerprint_rule()
    };
    let key = |h: &HeaderMap, peer: [u8; 4]| {
        let v = RequestView {
            peer: Some(IpAddr::from(peer)),
            ..view(h, b"{}")
        };
        derive_key(&rule, &v, None).unwrap().key().unwrap().key
    };
    let (a, b) = ([192, 0, 2, 1], [192, 0, 2, 2]);
    for anonymous in [
        "lang=en",
        "theme=dark; _ga=GA1.1.1",
        "lang",
        "ab_session=null",
        "token=null",
        "session=; sid=deleted",
    ] {
        let h = with_owned(anonymous);
        assert_ne!(key(&h, a), key(&h, b), "{anonymous:?}");
    }
    let split = with(&[("cookie", "a=undefined"), ("cookie", "b=\"\"")]);
    assert_ne!(key(&split, a), key(&split, b));
    let split = with(&[("cookie", "token=null"), ("cookie", "session=s-7")]);
    assert_eq!(key(&split, a), key(&split, b));
    for named in [
        "session=s-7",
        "lang=en; sessionid=s1",
        "lang=en; auth_token=t",
        "_app_session=s",
    ] {
        let h = with_owned(named);
        assert_eq!(key(&h, a), key(&h, b), "{named:?}");
    }
}

/// Beside another part that names someone (a tenant), a jar that names no one by any rule
/// is still hashed: a session of a name no rule knows (`CAKEPHP`, Magento's `frontend`) is
/// what tells that tenant's users apart, and dropping it gave two of them one key.
#[test]
fn a_jar_that_names_no_one_still_tells_a_tenants_users_apart() {
    let rule = KeyRule {
        scope: vec![
            ScopePart::Header(http::HeaderName::from_static("x-tenant")),
            ScopePart::Header(header::COOKIE),
        ],
        ..fingerprint_rule()
    };
    let key = |cookie: &str| {
        let mut h = with_owned(cookie);
        h.insert("x-tenant", HeaderValue::from_static("acme"));
        derive_key(&rule, &view(&h, b"{}"), None)
            .unwrap()
            .key()
            .unwrap()
            .key
    };
    assert_ne!(
        key("CAKEPHP=alice"),
        key("CAKEPHP=bob"),
        "bob got alice's answer"
    );
    assert_eq!(key("frontend=s1"), key("frontend=s1"));
}

/// A cookie only the pattern `*_session` takes (an A/B test's `ab_session` many users send
/// alike, a copy a sibling subdomain planted) is no session on its own: keyed by it (and
/// the cookies named like a credential) without the address and the rest of the jar, two
/// users of an app whose session has a name no rule knows (CakePHP's `CAKEPHP`), from two
/// addresses or behind one basic-auth gate, shared a key and the second got the first's
/// answer. An exact listed name, or one the operator lists, is still trusted alone.
#[test]
fn a_cookie_only_a_pattern_names_is_no_session_alone() {
    let (a, b) = ([192, 0, 2, 1], [192, 0, 2, 2]);
    let alice = with(&[("cookie", "ab_session=x; CAKEPHP=alice")]);
    let bob = with(&[("cookie", "ab_session=x; CAKEPHP=bob")]);
    assert_ne!(key_of(&alice, a), key_of(&bob, b), "bob got alice's answer");
    let shared = with(&[("cookie", "ab_session=x")]);
    assert_ne!(
        key_of(&shared, a),
        key_of(&shared, b),
        "two visitors, one key"
    );
    let gate = "Basic c3RhZmY6cGFzcw==";
    let alice_gated = with(&[
        ("authorization", gate),
        ("cookie", "ab_session=x; CAKEPHP=alice"),
    ]);
    let bob_gated = with(&[
        ("authorization", gate),
        ("cookie", "ab_session=x; CAKEPHP=bob"),
    ]);
    assert_ne!(
        key_of(&alice_gated, a),
        key_of(&bob_gated, a),
        "behind one gate"
    );
    // The same caller's repeat: the same jar from the same address, or behind the gate
    // (which names the caller with the jar) from anywhere.
    assert_eq!(key_of(&alice, a), key_of(&alice, a));
    assert_eq!(key_of(&alice_gated, a), key_of(&alice_gated, b));
    // An exact listed name is the session wherever it comes from.
    let laravel = with(&[("cookie", "laravel_session=s1; theme=dark")]);
    assert_eq!(key_of(&laravel, a), key_of(&laravel, b));
    // So is a name the operator lists, though the default pattern takes it too.
    let listed = Identity {
        session_cookies: vec!["_myapp_session".into()],
        ..Identity::default()
    };
    let rails = with(&[("cookie", "_myapp_session=s1; ab_session=x")]);
    let from = |peer: [u8; 4], identity: &Identity| {
        fingerprint_key(&RequestView {
            peer: Some(IpAddr::from(peer)),
            identity,
            ..view(&rails, b"{}")
        })
    };
    assert_eq!(from(a, &listed), from(b, &listed));
    assert_ne!(from(a, &Identity::default()), from(b, &Identity::default()));
    // `explain` says why the pattern's cookie did not name the caller.
    let mut trace = Trace::default();
    derive_key(&fingerprint_rule(), &view(&alice, b"{}"), Some(&mut trace)).unwrap();
    assert_eq!(
        trace.scope,
        [
            "caller by whole Cookie header and client address (no session cookie of a listed \
             name; ab_session matches only a pattern)"
        ]
    );
}
