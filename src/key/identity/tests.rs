//! Caller identity: address blocks, `X-Forwarded-For` behind trusted proxies, credentials
//! and session cookies.
use super::*;
use http::HeaderValue;

fn trusted(list: &[&str]) -> TrustedProxies {
    list.iter().map(|c| c.parse().unwrap()).collect()
}

fn xff(values: &[&str]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for v in values {
        h.append(&X_FORWARDED_FOR, HeaderValue::from_str(v).unwrap());
    }
    h
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn named(s: &str) -> ClientAddress {
    ClientAddress::Named(ip(s))
}

#[test]
fn blocks_match_by_prefix_and_family() {
    let c: Cidr = "10.0.0.0/8".parse().unwrap();
    assert!(c.contains(ip("10.255.0.1")));
    assert!(!c.contains(ip("11.0.0.1")));
    assert!(c.contains(ip("::ffff:10.1.1.1")), "v4-mapped counts as v4");
    assert!(!c.contains(ip("::1")));
    let one: Cidr = "127.0.0.2".parse().unwrap();
    assert!(one.contains(ip("127.0.0.2")) && !one.contains(ip("127.0.0.3")));
    let v6: Cidr = "fd00::/8".parse().unwrap();
    assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
    let all: Cidr = "0.0.0.0/0".parse().unwrap();
    assert!(all.contains(ip("203.0.113.1")));
    for bad in ["10.0.0.1/8", "10.0.0.0/33", "ten", "10.0.0.0/x", "::/129"] {
        assert!(bad.parse::<Cidr>().is_err(), "{bad}");
    }
    assert!("10.0.0.1/8"
        .parse::<Cidr>()
        .unwrap_err()
        .contains("10.0.0.0/8"));
}

#[test]
fn an_untrusted_peer_is_the_client_whatever_it_sends() {
    let t = trusted(&["10.0.0.0/8"]);
    let h = xff(&["203.0.113.9"]);
    assert_eq!(t.client_address(ip("192.0.2.1"), &h), named("192.0.2.1"));
    assert_eq!(
        TrustedProxies::default().client_address(ip("10.0.0.1"), &h),
        named("10.0.0.1")
    );
}

#[test]
fn behind_trusted_peers_the_right_most_untrusted_entry_counts() {
    let t = trusted(&["10.0.0.0/8", "192.168.1.1"]);
    let h = xff(&["198.51.100.1, 203.0.113.9", "192.168.1.1 , 10.2.3.4"]);
    assert_eq!(t.client_address(ip("10.0.0.1"), &h), named("203.0.113.9"));
    // Every entry trusted: the left-most is as far as the chain goes.
    let h = xff(&["10.9.9.9, 10.8.8.8"]);
    assert_eq!(t.client_address(ip("10.0.0.1"), &h), named("10.9.9.9"));
    // No header: the peer.
    assert_eq!(
        t.client_address(ip("10.0.0.1"), &HeaderMap::new()),
        named("10.0.0.1")
    );
    // Bracketed IPv6 and empty list elements.
    let h = xff(&["[2001:db8::1],, "]);
    assert_eq!(t.client_address(ip("10.0.0.1"), &h), named("2001:db8::1"));
}

/// Balancers that write the client's port (Azure Application Gateway) name the client
/// as well as those that do not: read as the address, every client behind them would be
/// the balancer, one caller.
#[test]
fn an_entry_with_a_port_names_its_address() {
    let t = trusted(&["10.0.0.0/8"]);
    for (entry, client) in [
        ("203.0.113.9:51234", "203.0.113.9"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("[2001:db8::2]", "2001:db8::2"),
        ("198.51.100.7:1, 10.0.0.3:8080", "198.51.100.7"),
    ] {
        assert_eq!(
            t.client_address(ip("10.0.0.1"), &xff(&[entry])),
            named(client),
            "{entry}"
        );
    }
}

/// A trusted proxy that writes an entry that is no address (`unknown`, an obfuscated
/// name, a broken port) before any untrusted one forwards a client it cannot name; taken
/// as the proxy, every such client behind it would be one caller.
#[test]
fn a_malformed_entry_from_a_trusted_peer_names_no_client() {
    let t = trusted(&["10.0.0.0/8"]);
    for bad in [
        "unknown",
        "203.0.113.9:",
        "203.0.113.9:443x",
        "203.0.113.9:123456",
        "[2001:db8::1]443",
        "203.0.113.9 10.0.0.3",
        "_hidden",
        "unknown, 10.0.0.3",
    ] {
        let h = xff(&[bad]);
        assert_eq!(
            t.client_address(ip("10.0.0.1"), &h),
            ClientAddress::Unnamed,
            "{bad}"
        );
    }
    // A header with no entry at all names no one either; no header is the peer's own call.
    let empties: [&[&str]; 3] = [&[""], &[" , ,"], &["", ""]];
    for empty in empties {
        assert_eq!(
            t.client_address(ip("10.0.0.1"), &xff(empty)),
            ClientAddress::Unnamed,
            "{empty:?}"
        );
    }
    assert_eq!(
        t.client_address(ip("10.0.0.1"), &HeaderMap::new()),
        named("10.0.0.1")
    );
    // A proxy that names its client only in `Forwarded`, which is not read, names no one
    // this can tell apart; beside an `X-Forwarded-For`, that header decides.
    let mut forwarded = HeaderMap::new();
    forwarded.insert(
        http::header::FORWARDED,
        HeaderValue::from_static("for=203.0.113.9;proto=https"),
    );
    assert_eq!(
        t.client_address(ip("10.0.0.1"), &forwarded),
        ClientAddress::Unnamed
    );
    // nginx's `X-Real-IP` alone likewise.
    let mut real_ip = HeaderMap::new();
    real_ip.insert("x-real-ip", HeaderValue::from_static("203.0.113.9"));
    assert_eq!(
        t.client_address(ip("10.0.0.1"), &real_ip),
        ClientAddress::Unnamed
    );
    forwarded.insert(&X_FORWARDED_FOR, HeaderValue::from_static("203.0.113.9"));
    assert_eq!(
        t.client_address(ip("10.0.0.1"), &forwarded),
        named("203.0.113.9")
    );
    // From an untrusted peer neither is read.
    assert_eq!(
        t.client_address(ip("192.0.2.1"), &forwarded),
        named("192.0.2.1")
    );
    // Garbage left of the client's entry is never read.
    let h = xff(&["garbage, 203.0.113.9"]);
    assert_eq!(t.client_address(ip("10.0.0.1"), &h), named("203.0.113.9"));
    let h = xff(&["_hidden", "203.0.113.9:80, 10.0.0.3"]);
    assert_eq!(t.client_address(ip("10.0.0.1"), &h), named("203.0.113.9"));
    // From an untrusted peer the header is not read, garbage or not.
    assert_eq!(
        t.client_address(ip("192.0.2.1"), &xff(&["unknown"])),
        named("192.0.2.1")
    );
}

#[test]
fn only_an_authorization_with_credentials_names_a_caller() {
    for named in [
        "Bearer t0k",
        "Basic dXNlcjpwYXNz",
        "Token\tabc",
        "raw-api-key",
        "Bearer nullx",
    ] {
        assert!(carries_credential(named.as_bytes()), "{named:?}");
    }
    for anonymous in [
        "",
        "\t",
        "Bearer",
        "BEARER  ",
        "Bearer null",
        "Bearer   NULL ",
        "Bearer undefined",
        "Bearer \"\"",
        "Bearer [object Object]",
        "Basic",
        "undefined",
    ] {
        assert!(!carries_credential(anonymous.as_bytes()), "{anonymous:?}");
    }
}

/// What a client sends when it has no credential but a template or a login form did not
/// fill one in: an empty basic-auth pair (`Basic Og==`, base64 of `:`, in any padding,
/// or of `undefined:undefined`), an unfilled template (`{{token}}`, `${token}`, `<token>`,
/// `%s`), a placeholder in quotes. Every anonymous client sends it alike.
#[test]
fn an_empty_basic_pair_or_an_unfilled_template_is_no_credential() {
    for anonymous in [
        "Basic Og==",
        "Basic Og=",
        "Basic Og",
        "basic Og==",
        "Basic dW5kZWZpbmVkOnVuZGVmaW5lZA==",
        "Basic bnVsbDpudWxs",
        "Basic OnVuZGVmaW5lZA",
        "Bearer {{token}}",
        "Bearer {{ access_token }}",
        "Bearer ${token}",
        "Bearer ${TOKEN}",
        "Bearer <token>",
        "Bearer <YOUR_API_KEY>",
        "Bearer %s",
        "Bearer %v",
        "Bearer {token}",
        "Bearer \"undefined\"",
        "Bearer 'null'",
        "Bearer \"{{token}}\"",
        "\"null\"",
        "{{token}}",
        "${API_KEY}",
    ] {
        assert!(!carries_credential(anonymous.as_bytes()), "{anonymous:?}");
    }
    for named in [
        // A user with an empty password, or a password alone, is someone's.
        "Basic dXNlcjo=",
        "Basic OnBhc3M=",
        // Not base64 at all: an opaque value.
        "Basic Og==x",
        "Bearer %sabc",
        "Bearer a{{b}}",
        "Bearer \"t0k\"",
    ] {
        assert!(carries_credential(named.as_bytes()), "{named:?}");
    }
}

/// Rails names its session cookie `_<app>_session`, Laravel `<app>_session`: the
/// default pattern `*_session` takes both; a name only ending alike is no pattern match
/// without its `_`. A pattern's match is no session alone.
#[test]
fn session_cookie_patterns_match_app_named_sessions() {
    let identity = Identity::default();
    for session in ["_shop_session", "myapp_session", "_session", "sessionid"] {
        assert!(identity.is_session_cookie(session.as_bytes()), "{session}");
    }
    for other in ["theme", "usersession", "_session_x", "session_"] {
        assert!(!identity.is_session_cookie(other.as_bytes()), "{other}");
    }
    let listed = Identity {
        session_cookies: vec!["app_*".into()],
        ..Identity::default()
    };
    assert!(listed.is_session_cookie(b"app_sid") && listed.is_session_cookie(b"app_"));
    assert!(!listed.is_session_cookie(b"ap_sid"));
    // Only a name listed as such is a session alone; a pattern's match is not.
    assert!(identity.is_named_session_cookie(b"laravel_session"));
    assert!(!identity.is_named_session_cookie(b"_shop_session"));
    assert!(!listed.is_named_session_cookie(b"app_sid"));
}

#[test]
fn cookies_are_read_from_every_field() {
    let mut h = HeaderMap::new();
    h.append(header::COOKIE, HeaderValue::from_static("a=1; sid=xyz"));
    h.append(header::COOKIE, HeaderValue::from_static("b=2;c"));
    let cookie = |h: &HeaderMap, name: &str| session_cookie(h, name).map(|v| v.into_owned());
    assert_eq!(cookie(&h, "sid"), Some(b"xyz".to_vec()));
    assert_eq!(cookie(&h, "b"), Some(b"2".to_vec()));
    assert_eq!(cookie(&h, "id"), None);
    assert_eq!(cookie(&h, "c"), None);
    // A name sent twice is every copy: a cleared one beside a live one too.
    h.append(header::COOKIE, HeaderValue::from_static("sid=deleted"));
    assert_eq!(cookie(&h, "sid"), Some(b"xyz; deleted".to_vec()));
}
