//! A caller a trusted proxy could not name is nobody's twin: a trusted peer whose
//! `X-Forwarded-For` holds an entry that is no address (`unknown`, `_hidden`,
//! `203.0.113.9:`) before any untrusted one vouches for a client it cannot name. A key that
//! would hold that client's address could not tell it from any other client behind the
//! proxy, so such a request is forwarded unprotected (never claimed, never replayed),
//! counted as `caller_unknown`, on enforcing and observed routes, and on token routes (the
//! token endpoint refuses such a caller a token: it would protect nothing). A
//! caller named otherwise (`Authorization`, a session cookie), a trusted peer without
//! `X-Forwarded-For` (itself the caller) and a valid entry are protected as ever; a trusted
//! peer that names its client only in `Forwarded` or `X-Real-IP`, neither read, names no one.
//!
//! The test client, on 127.0.0.1, is the trusted proxy.

mod common;

use common::{explain_cli, post, start_proxy, start_upstream, Answer, ProxyHandle};
use http::StatusCode;

const BEHIND_A_PROXY: &str = r#"
trusted_proxies: [127.0.0.0/8]
tokens: { ttl: 5m, rate: 50, window: 1m }
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { fingerprint: { body: true } }
  - name: keyed
    match: { methods: [POST], path: /orders/keyed }
    key: { header: Idempotency-Key }
  - name: by-ip
    match: { methods: [POST], path: /orders/by-ip }
    key: { fingerprint: { body: true }, scope: [client_ip] }
  - name: watched
    match: { methods: [POST], path: /orders/watched }
    key: { fingerprint: { body: true } }
    idempotency: observe
  - name: pay
    match: { methods: [POST], path: /orders/pay }
    key: { token: { header: Idempotency-Token } }
"#;

fn counted(proxy: &ProxyHandle, route: &str, outcome: &str) -> f64 {
    proxy.metric(&format!(
        r#"idemgate_requests_total{{route="{route}",outcome="{outcome}"}}"#
    ))
}

/// Sends the same request twice and says how many of the two the upstream executed, and
/// whether either answer was a replay.
async fn twice(
    proxy: &ProxyHandle,
    upstream: &common::Upstream,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (usize, bool) {
    let before = upstream.executed();
    let first: Answer = post(proxy.addr, path, headers, body).await;
    let second: Answer = post(proxy.addr, path, headers, body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{path} {headers:?}");
    assert_eq!(second.status, StatusCode::CREATED, "{path} {headers:?}");
    (
        upstream.executed() - before,
        first.replayed() || second.replayed(),
    )
}

/// Two anonymous clients behind one trusted proxy that writes `unknown` (or an obfuscated
/// name, or a broken port) send the same body, or the same Idempotency-Key: each executes
/// and neither gets the other's answer, as when a key would hold the address explicitly
/// (`scope: [client_ip]`) or mix it into a cookie jar or an API key. The same pair with an
/// address the proxy names, or from the proxy itself without the header, is one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_a_trusted_proxy_cannot_name_never_share_an_answer() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, BEHIND_A_PROXY).await;
    let mut unnamed = 0.0;
    for (i, entry) in ["unknown", "_hidden", "203.0.113.9:", "unknown, 127.0.0.9"]
        .iter()
        .enumerate()
    {
        let xff = ("x-forwarded-for", *entry);
        let body = format!(r#"{{"sku":"A{i}"}}"#);
        let (ran, replayed) = twice(&proxy, &upstream, "/orders", &[xff], &body).await;
        assert_eq!((ran, replayed), (2, false), "fingerprint, {entry:?}");
        let key = ("idempotency-key", "k-shared");
        let (ran, replayed) = twice(&proxy, &upstream, "/orders/keyed", &[xff, key], &body).await;
        assert_eq!((ran, replayed), (2, false), "idempotency key, {entry:?}");
        unnamed += 2.0;
        assert_eq!(counted(&proxy, "orders", "caller_unknown"), unnamed);
        assert_eq!(counted(&proxy, "keyed", "caller_unknown"), unnamed);
    }
    let xff = ("x-forwarded-for", "unknown");
    let body = r#"{"sku":"B1"}"#;
    let (ran, replayed) = twice(&proxy, &upstream, "/orders/by-ip", &[xff], body).await;
    assert_eq!((ran, replayed), (2, false), "scope: [client_ip]");
    assert_eq!(counted(&proxy, "by-ip", "caller_unknown"), 2.0);
    for mixed_in in [("cookie", "theme=dark"), ("x-api-key", "public-app-key")] {
        let (ran, replayed) = twice(&proxy, &upstream, "/orders", &[xff, mixed_in], body).await;
        assert_eq!((ran, replayed), (2, false), "{mixed_in:?} with the address");
    }
    // A proxy that names its client only in `Forwarded` (RFC 7239, not read) names no one
    // idemgate can tell apart either.
    let rfc7239 = ("forwarded", "for=203.0.113.9;proto=https");
    let (ran, replayed) = twice(&proxy, &upstream, "/orders", &[rfc7239], body).await;
    assert_eq!((ran, replayed), (2, false), "Forwarded alone");
    // Nor does one that names it only in nginx's `X-Real-IP`.
    let real_ip = ("x-real-ip", "203.0.113.9");
    let (ran, replayed) = twice(&proxy, &upstream, "/orders", &[real_ip], body).await;
    assert_eq!((ran, replayed), (2, false), "X-Real-IP alone");
    assert_eq!(
        counted(&proxy, "orders", "executed"),
        0.0,
        "nothing claimed"
    );

    // Controls: an address the proxy names, and the proxy's own call, each run once.
    let named = ("x-forwarded-for", "198.51.100.7");
    let (ran, replayed) = twice(&proxy, &upstream, "/orders", &[named], body).await;
    assert_eq!((ran, replayed), (1, true), "a named client's double submit");
    let (ran, replayed) = twice(&proxy, &upstream, "/orders", &[], body).await;
    assert_eq!(
        (ran, replayed),
        (1, true),
        "the trusted peer is itself the caller"
    );
    // Whose answer an unnamed client's same body must not get either.
    let (ran, replayed) = twice(&proxy, &upstream, "/orders", &[xff], body).await;
    assert_eq!(
        (ran, replayed),
        (2, false),
        "not the trusted peer's own answer"
    );
    let key = ("idempotency-key", "k-named");
    let (ran, replayed) = twice(&proxy, &upstream, "/orders/keyed", &[named, key], body).await;
    assert_eq!((ran, replayed), (1, true), "a named client's key");
}

/// A caller named by a credential or a session needs no address: behind the same proxy
/// writing `unknown`, its double submit still runs once, and two such callers stay apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_named_by_a_credential_is_protected_without_an_address() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, BEHIND_A_PROXY).await;
    let xff = ("x-forwarded-for", "unknown");
    let body = r#"{"sku":"C1"}"#;
    let alice = ("authorization", "Bearer alice");
    let (ran, replayed) = twice(&proxy, &upstream, "/orders", &[xff, alice], body).await;
    assert_eq!((ran, replayed), (1, true), "Authorization names the caller");
    let bob = ("authorization", "Bearer bob");
    let (ran, _) = twice(&proxy, &upstream, "/orders", &[xff, bob], body).await;
    assert_eq!(ran, 1, "bob is not alice");
    let session = ("cookie", "sessionid=carol");
    let key = ("idempotency-key", "k1");
    let (ran, replayed) = twice(
        &proxy,
        &upstream,
        "/orders/keyed",
        &[xff, session, key],
        body,
    )
    .await;
    assert_eq!((ran, replayed), (1, true), "a session names the caller");
    assert_eq!(counted(&proxy, "orders", "caller_unknown"), 0.0);
    assert_eq!(counted(&proxy, "keyed", "caller_unknown"), 0.0);
}

/// Observe mode claims keys as enforcement would: an unnamed caller's request claims none,
/// so a second one is not counted as a duplicate (`would_replay`) of another client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observed_route_claims_nothing_for_an_unnamed_caller() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, BEHIND_A_PROXY).await;
    let xff = ("x-forwarded-for", "unknown");
    let (ran, replayed) = twice(&proxy, &upstream, "/orders/watched", &[xff], "{}").await;
    assert_eq!((ran, replayed), (2, false));
    assert_eq!(counted(&proxy, "watched", "caller_unknown"), 2.0);
    assert_eq!(counted(&proxy, "watched", "would_replay"), 0.0);
    assert_eq!(counted(&proxy, "watched", "executed"), 0.0);
}

/// A token route cannot tell an unnamed caller's spend from another's, so a token issued
/// to one would protect nothing (its every use forwarded unprotected): the endpoint
/// refuses it, `400 caller-unknown` saying why, rather than answer `201` with a token
/// that only looks like protection, and keeps serving. A caller a credential names is
/// issued one behind the same proxy, as is one its `X-Forwarded-For` names; an unnamed
/// caller spending a token anyway is forwarded unprotected, as on any route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unnamed_caller_is_refused_a_token_that_would_protect_nothing() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, BEHIND_A_PROXY).await;
    let xff = ("x-forwarded-for", "unknown");
    let refused = post(proxy.addr, "/.idemgate/token", &[xff], "").await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.headers["content-type"], "application/problem+json");
    assert_eq!(
        refused.json()["type"],
        "urn:idemgate:problem:caller-unknown"
    );
    let credential = ("authorization", "Bearer carol");
    let carols = post(proxy.addr, "/.idemgate/token", &[xff, credential], "").await;
    assert_eq!(carols.status, StatusCode::CREATED, "a credential names her");
    let named = ("x-forwarded-for", "203.0.113.9");
    let issued = post(proxy.addr, "/.idemgate/token", &[named], "").await;
    assert_eq!(issued.status, StatusCode::CREATED);
    let token = issued.json()["token"].as_str().unwrap().to_owned();
    let spend = ("idempotency-token", token.as_str());
    let (ran, replayed) = twice(&proxy, &upstream, "/orders/pay", &[xff, spend], "{}").await;
    assert_eq!((ran, replayed), (2, false), "never claimed, never replayed");
    assert_eq!(counted(&proxy, "pay", "caller_unknown"), 2.0);
    let owner = post(proxy.addr, "/orders/pay", &[named, spend], "{}").await;
    assert_eq!(
        owner.status,
        StatusCode::CREATED,
        "still its caller's to spend"
    );
}

/// `idemgate explain` says a request from an unnamed caller would pass unprotected, and why.
#[test]
fn explain_says_an_unnamed_caller_passes_unprotected() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.yaml");
    let text = format!("listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\n{BEHIND_A_PROXY}");
    std::fs::write(&config, text).unwrap();
    let from = |xff: &str| {
        explain_cli(
            &config,
            &[
                "--method",
                "POST",
                "--path",
                "/orders",
                "--client-ip",
                "127.0.0.1",
                "-H",
                xff,
            ],
        )
    };
    let unnamed = from("X-Forwarded-For: unknown");
    let digest = unnamed
        .lines()
        .find_map(|l| l.strip_prefix("key digest:"))
        .unwrap_or_else(|| panic!("no key digest line in {unnamed}"));
    assert!(digest.contains("unnamed"), "{unnamed}");
    assert!(digest.contains("unprotected"), "{unnamed}");
    let named = from("X-Forwarded-For: 198.51.100.7");
    let digest = named
        .lines()
        .find_map(|l| l.strip_prefix("key digest:"))
        .unwrap();
    assert_eq!(digest.trim().len(), 64, "a key: {named}");
}
