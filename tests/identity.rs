//! Never someone else's answer: with no `scope:` configured, two callers never share a key,
//! whether they are told apart by a session cookie (also behind one shared
//! `Authorization`), by an API key header, by their address, or by the address a trusted
//! proxy names (with or without a port); an `Authorization` without a credential names no
//! one; a spoofed `X-Forwarded-For` proves nothing; and one request to two hosts is two.
//! A client a trusted proxy could not name has `tests/unnamed_caller.rs`; a credential sent
//! twice or beside a shared one, `identity/repeated.rs`; cookies split over HTTP/2,
//! `identity/http2.rs`.

mod common;
#[path = "identity/http2.rs"]
mod http2;
#[path = "identity/repeated.rs"]
mod repeated;

use common::{post, raw_exchange_from, raw_post, start_proxy, start_recorder, start_upstream};

/// The body of an answer read off the wire, as JSON.
fn json_body(raw: &str) -> serde_json::Value {
    let body = raw.split("\r\n\r\n").nth(1).expect("an answer with a body");
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {raw}"))
}

fn replayed(raw: &str) -> bool {
    raw.to_ascii_lowercase()
        .contains("\r\nidempotent-replayed: true\r\n")
}

/// Two browsers of a cookie-session app, no `Authorization`, the same body: each gets its
/// own execution and its own `Set-Cookie`; a repeat within one session still replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_session_callers_never_get_each_others_answer() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let body = r#"{"sku":"A1","qty":1}"#;
    let alice = post(
        proxy.addr,
        "/cart/add",
        &[("cookie", "sessionid=alice-1")],
        body,
    )
    .await;
    let bob = post(
        proxy.addr,
        "/cart/add",
        &[("cookie", "sessionid=bob-2")],
        body,
    )
    .await;
    assert!(!alice.replayed() && !bob.replayed());
    assert_eq!(upstream.executed(), 2, "each browser's request executes");
    assert_eq!(bob.json()["session"], "bob-2");
    let bob_cookies: Vec<_> = bob.headers.get_all("set-cookie").iter().collect();
    assert_eq!(
        bob_cookies,
        ["session=bob-2-renewed"],
        "never alice's cookie"
    );
    // An unknown session cookie name: the whole Cookie header still keeps them apart.
    let carol = post(
        proxy.addr,
        "/cart/add",
        &[("cookie", "app_sess=carol")],
        body,
    )
    .await;
    let dave = post(
        proxy.addr,
        "/cart/add",
        &[("cookie", "app_sess=dave")],
        body,
    )
    .await;
    assert!(!carol.replayed() && !dave.replayed());
    assert_eq!(upstream.executed(), 4);
    // The same browser's double submit is still one execution.
    let again = post(
        proxy.addr,
        "/cart/add",
        &[("cookie", "theme=dark; sessionid=alice-1")],
        body,
    )
    .await;
    assert!(again.replayed());
    assert_eq!(again.body, alice.body);
    assert_eq!(upstream.executed(), 4);
}

/// Anonymous callers on different addresses, the same body: two executions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_callers_from_different_addresses_execute_separately() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let request = raw_post("/orders/signup", &[], r#"{"email":"victim@example.com"}"#);
    let attacker = raw_exchange_from("127.0.0.2", proxy.addr, &request).await;
    let victim = raw_exchange_from("127.0.0.3", proxy.addr, &request).await;
    assert!(!replayed(&attacker));
    assert!(
        !replayed(&victim),
        "the victim's request is not the attacker's replay"
    );
    assert_eq!(upstream.executed(), 2);
    let retry = raw_exchange_from("127.0.0.3", proxy.addr, &request).await;
    assert!(replayed(&retry), "the victim's own retry replays");
    assert_eq!(json_body(&retry)["n"], json_body(&victim)["n"]);
    assert_eq!(upstream.executed(), 2);
}

/// A logged-out page sends `Authorization: Bearer null` (or an empty one, an empty
/// basic-auth pair `Basic Og==`, an unfilled template `Bearer {{token}}`, a placeholder in
/// quotes) like every other logged-out page: it names no one, so two such callers on different addresses, the same
/// body, each execute; a real token still names its caller from any address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorization_without_a_credential_names_no_caller() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let anonymous = [
        "authorization: Bearer null",
        "authorization:",
        "authorization: Bearer ",
        "authorization: bearer Undefined",
        "authorization: Basic Og==",
        "authorization: Basic Og",
        "authorization: Bearer {{token}}",
        "authorization: Bearer ${token}",
        "authorization: Bearer <token>",
        "authorization: Bearer %s",
        "authorization: Bearer \"undefined\"",
    ];
    for (i, auth) in anonymous.iter().enumerate() {
        let before = upstream.executed();
        let request = raw_post("/orders/signup", &[auth], &format!(r#"{{"case":{i}}}"#));
        let first = raw_exchange_from("127.0.0.1", proxy.addr, &request).await;
        let second = raw_exchange_from("127.0.0.2", proxy.addr, &request).await;
        assert!(!replayed(&first), "{auth:?}");
        assert!(
            !replayed(&second),
            "{auth:?}: not the other caller's answer"
        );
        assert_eq!(upstream.executed(), before + 2, "{auth:?}");
        let retry = raw_exchange_from("127.0.0.2", proxy.addr, &request).await;
        assert!(replayed(&retry), "{auth:?}: the caller's own retry replays");
        assert_eq!(json_body(&retry)["n"], json_body(&second)["n"]);
        assert_eq!(upstream.executed(), before + 2, "{auth:?}");
    }
    let before = upstream.executed();
    let token = raw_post(
        "/orders/signup",
        &["authorization: Bearer alice-token"],
        r#"{"case":"token"}"#,
    );
    let first = raw_exchange_from("127.0.0.1", proxy.addr, &token).await;
    let second = raw_exchange_from("127.0.0.2", proxy.addr, &token).await;
    assert!(!replayed(&first));
    assert!(replayed(&second), "one token, one caller, wherever it is");
    assert_eq!(upstream.executed(), before + 1);
}

const BEHIND_A_PROXY: &str = r#"
trusted_proxies: [127.0.0.2/32]
routes:
  - name: vote
    match: { path: /orders/vote }
    key: { fingerprint: { body: true }, scope: [client_ip] }
"#;

/// `X-Forwarded-For` names the client only when a trusted proxy sent it: from the trusted
/// 127.0.0.2, two forwarded clients are two callers; from 127.0.0.3 a forged header
/// borrows no other client's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_counts_only_from_a_trusted_proxy() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, BEHIND_A_PROXY).await;
    let body = r#"{"sku":"A1"}"#;
    for path in ["/orders/default", "/orders/vote"] {
        let before = upstream.executed();
        let from = |xff: &str| raw_post(path, &[&format!("x-forwarded-for: {xff}")], body);
        let first = raw_exchange_from("127.0.0.2", proxy.addr, &from("198.51.100.1")).await;
        let second = raw_exchange_from("127.0.0.2", proxy.addr, &from("198.51.100.2")).await;
        assert!(
            !replayed(&first) && !replayed(&second),
            "{path}: two clients"
        );
        assert_eq!(upstream.executed(), before + 2, "{path}");
        // The right-most untrusted entry counts: what the client put left of it does not.
        let repeat =
            raw_exchange_from("127.0.0.2", proxy.addr, &from("203.0.113.5, 198.51.100.1")).await;
        assert!(replayed(&repeat), "{path}: the first client's retry");
        assert_eq!(json_body(&repeat)["n"], json_body(&first)["n"]);
        // From an untrusted peer, the header is the sender's own word: it names no one, so
        // it borrows no one's answer; it goes with the peer's address, since such a peer
        // may be a balancer nobody listed, relaying many clients.
        let spoofed = raw_exchange_from("127.0.0.3", proxy.addr, &from("198.51.100.1")).await;
        assert!(
            !replayed(&spoofed),
            "{path}: a forged header gets no one's answer"
        );
        assert_eq!(upstream.executed(), before + 3, "{path}");
        let again = raw_exchange_from("127.0.0.3", proxy.addr, &from("198.51.100.1")).await;
        assert!(replayed(&again), "{path}: the same sender's retry");
        let other = raw_exchange_from("127.0.0.3", proxy.addr, &from("192.0.2.99")).await;
        assert!(
            !replayed(&other),
            "{path}: another client the untrusted peer relays got the first one's answer"
        );
        assert_eq!(upstream.executed(), before + 4, "{path}");
    }
}

/// `session_cookies` replaces the default list of session cookie names: with `[my_sess]`,
/// `sessionid=abc` names no session, so the same cookie from two addresses is two callers
/// (the whole `Cookie` header with the address); `my_sess=abc` is one session, wherever it
/// comes from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_cookies_replaces_the_default_session_cookie_names() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "session_cookies: [my_sess]\n").await;
    let default_name = raw_post(
        "/orders/cart",
        &["cookie: sessionid=abc"],
        r#"{"sku":"A1"}"#,
    );
    let first = raw_exchange_from("127.0.0.1", proxy.addr, &default_name).await;
    let elsewhere = raw_exchange_from("127.0.0.2", proxy.addr, &default_name).await;
    assert!(!replayed(&first));
    assert!(
        !replayed(&elsewhere),
        "sessionid is no session cookie any more: two addresses, two callers"
    );
    assert_eq!(upstream.executed(), 2);
    let retry = raw_exchange_from("127.0.0.2", proxy.addr, &default_name).await;
    assert!(replayed(&retry), "each caller's own retry still replays");
    assert_eq!(json_body(&retry)["n"], json_body(&elsewhere)["n"]);

    let listed = raw_post("/orders/cart", &["cookie: my_sess=abc"], r#"{"sku":"B2"}"#);
    let first = raw_exchange_from("127.0.0.1", proxy.addr, &listed).await;
    let elsewhere = raw_exchange_from("127.0.0.2", proxy.addr, &listed).await;
    assert!(!replayed(&first));
    assert!(replayed(&elsewhere), "my_sess names one session");
    assert_eq!(json_body(&elsewhere)["n"], json_body(&first)["n"]);
    assert_eq!(upstream.executed(), 3);
}

/// A trusted balancer that writes the client's port into `X-Forwarded-For` (Azure
/// Application Gateway does: `203.0.113.9:51234`, `[2001:db8::1]:443`): the address before
/// the port names the client, so two clients are two callers, and one client's retry from
/// another source port is still the same caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_entries_with_ports_name_their_clients() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, BEHIND_A_PROXY).await;
    let body = r#"{"plan":"pro"}"#;
    let from = |xff: &str| raw_post("/orders/guest", &[&format!("x-forwarded-for: {xff}")], body);
    let alice = raw_exchange_from("127.0.0.2", proxy.addr, &from("198.51.100.1:50001")).await;
    let bob = raw_exchange_from("127.0.0.2", proxy.addr, &from("203.0.113.77:61002")).await;
    let carol = raw_exchange_from("127.0.0.2", proxy.addr, &from("[2001:db8::7]:443")).await;
    assert!(!replayed(&alice));
    assert!(!replayed(&bob), "bob got alice's answer");
    assert!(!replayed(&carol), "carol got another's answer");
    assert_eq!(upstream.executed(), 3);
    let retry = raw_exchange_from("127.0.0.2", proxy.addr, &from("198.51.100.1:50999")).await;
    assert!(replayed(&retry), "alice's retry from another port is alice");
    assert_eq!(json_body(&retry)["n"], json_body(&alice)["n"]);
    assert_eq!(upstream.executed(), 3);
}

/// A site behind one shared basic-auth password (a staging or intranet gate) whose users
/// are told apart by their session cookie: the shared `Authorization` does not hide the
/// session, so bob never gets alice's answer nor her `Set-Cookie`; alice's retry replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_authorization_does_not_merge_the_sessions_behind_it() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let gate = ("authorization", "Basic c3RhZmY6c3RhZmYtcGFzc3dvcmQ=");
    let alice = post(
        proxy.addr,
        "/cart/checkout",
        &[gate, ("cookie", "sessionid=alice")],
        "{}",
    )
    .await;
    let bob = post(
        proxy.addr,
        "/cart/checkout",
        &[gate, ("cookie", "sessionid=bob")],
        "{}",
    )
    .await;
    assert!(!alice.replayed());
    assert!(!bob.replayed(), "bob got alice's answer");
    assert_eq!(upstream.executed(), 2);
    let retry = post(
        proxy.addr,
        "/cart/checkout",
        &[gate, ("cookie", "sessionid=alice")],
        "{}",
    )
    .await;
    assert!(retry.replayed(), "alice's own retry replays");
    assert_eq!(retry.body, alice.body);
    assert_eq!(upstream.executed(), 2);
}

/// An API whose clients authenticate with `X-Api-Key`, reached from one address (an
/// integration platform, a NAT): the key header keeps the customers apart; each one's
/// retry still replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_told_apart_by_an_api_key_header_never_share_a_key() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let a = post(
        proxy.addr,
        "/orders/reports",
        &[("x-api-key", "customer-a")],
        "{}",
    )
    .await;
    let b = post(
        proxy.addr,
        "/orders/reports",
        &[("x-api-key", "customer-b")],
        "{}",
    )
    .await;
    assert!(!a.replayed());
    assert!(!b.replayed(), "customer-b got customer-a's answer");
    assert_eq!(upstream.executed(), 2);
    let retry = post(
        proxy.addr,
        "/orders/reports",
        &[("x-api-key", "customer-a")],
        "{}",
    )
    .await;
    assert!(retry.replayed(), "customer-a's own retry replays");
    assert_eq!(retry.json()["n"], a.json()["n"]);
    assert_eq!(upstream.executed(), 2);
}

/// `credential_headers` replaces the default list: a header it names tells callers apart,
/// and `X-Api-Key`, no longer listed, does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_headers_replaces_the_default_list() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "credential_headers: [X-Partner-Token]\n").await;
    let a = post(
        proxy.addr,
        "/orders/sync",
        &[("x-partner-token", "p-1")],
        "{}",
    )
    .await;
    let b = post(
        proxy.addr,
        "/orders/sync",
        &[("x-partner-token", "p-2")],
        "{}",
    )
    .await;
    assert!(!a.replayed() && !b.replayed(), "two partners, two callers");
    assert_eq!(upstream.executed(), 2);
    let c = post(proxy.addr, "/orders/pull", &[("x-api-key", "k-1")], "{}").await;
    let d = post(proxy.addr, "/orders/pull", &[("x-api-key", "k-2")], "{}").await;
    assert!(!c.replayed());
    assert!(
        d.replayed(),
        "x-api-key is not listed: one address, one caller"
    );
    assert_eq!(upstream.executed(), 3);
}

/// One route serving several hosts (here the fallback): the same request from the same
/// caller to tenant A and to tenant B executes for each; a repeat to tenant A replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_request_to_two_hosts_is_two_requests() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let to = |host: &str| {
        format!(
            "POST /api/invite HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
        )
        .into_bytes()
    };
    let a = raw_exchange_from("127.0.0.1", proxy.addr, &to("tenant-a.example.com")).await;
    let b = raw_exchange_from("127.0.0.1", proxy.addr, &to("tenant-b.example.com")).await;
    assert!(!replayed(&a));
    assert!(!replayed(&b), "tenant-b's request got tenant-a's answer");
    let hosts: Vec<_> = upstream
        .seen()
        .iter()
        .map(|s| s.headers.get("host").cloned())
        .collect();
    assert_eq!(
        hosts.len(),
        2,
        "each tenant's request reached the upstream: {hosts:?}"
    );
    let again = raw_exchange_from("127.0.0.1", proxy.addr, &to("TENANT-A.example.com")).await;
    assert!(replayed(&again), "host names are case-insensitive");
    assert_eq!(upstream.seen().len(), 2);
}

/// An absolute-form target names the host its request is keyed by, over any `Host` field
/// (RFC 9112 §3.2.2), in the proxy and in `explain` alike: the digest `explain` prints is
/// the key the proxy stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absolute_form_target_keys_by_its_authority_in_explain_too() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let request = b"POST http://tenant-b.example.com/orders/invite HTTP/1.1\r\nhost: tenant-a.example.com\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
    let answer = raw_exchange_from("127.0.0.1", proxy.addr, request).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let digest =
        |path: &str, host: &str| common::stored_key(&proxy, path, &[("host", host)], b"{}");
    let explained = digest(
        "http://tenant-b.example.com/orders/invite",
        "tenant-a.example.com",
    );
    assert_eq!(explained, digest("/orders/invite", "tenant-b.example.com"));
    assert_ne!(explained, digest("/orders/invite", "tenant-a.example.com"));
    let stored = proxy
        .store
        .inspect(idemgate::key::Digest::from_hex(&explained).unwrap())
        .await
        .unwrap();
    assert!(
        stored.is_some(),
        "explain's digest is the key the proxy stored"
    );
}

/// Behind one shared basic-auth password, a Rails app's users (`_<app>_session`, matched
/// only by the default pattern `*_session`, so no session alone) are told apart by the
/// cookies sent beside the `Authorization`; each one's retry replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_named_session_cookie_keeps_users_behind_a_shared_gate_apart() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let gate = ("authorization", "Basic c3RhZmY6c3RhZmYtcGFzc3dvcmQ=");
    let as_user = |user: &'static str| [gate, ("cookie", user)];
    let alice = post(
        proxy.addr,
        "/cart/pay",
        &as_user("_shop_session=alice"),
        "{}",
    )
    .await;
    let bob = post(proxy.addr, "/cart/pay", &as_user("_shop_session=bob"), "{}").await;
    assert!(!alice.replayed());
    assert!(!bob.replayed(), "bob got alice's answer");
    let retry = post(
        proxy.addr,
        "/cart/pay",
        &as_user("_shop_session=alice"),
        "{}",
    )
    .await;
    assert!(retry.replayed(), "alice's own retry replays");
    assert_eq!(retry.body, alice.body);
    assert_eq!(upstream.executed(), 2);
}

/// A scope of headers only (`[header: Authorization]`, as a gateway-fed route might write
/// it) from callers that send none of them: the default caller stands in, so two
/// anonymous callers with one client key never share its answer, and each one's retry
/// still replays. Callers that send the header are keyed by it, as configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_whose_parts_are_all_absent_falls_back_to_the_caller() {
    let upstream = start_upstream().await;
    let routes = r#"
routes:
  - name: orders
    match: { path: /orders }
    key: { header: Idempotency-Key, scope: [header: Authorization] }
"#;
    let proxy = start_proxy(upstream.addr, routes).await;
    let request = raw_post("/orders", &["idempotency-key: k1"], r#"{"amount":10}"#);
    let first = raw_exchange_from("127.0.0.2", proxy.addr, &request).await;
    let other = raw_exchange_from("127.0.0.3", proxy.addr, &request).await;
    assert!(!replayed(&first));
    assert!(!replayed(&other), "another anonymous caller got the answer");
    assert_eq!(upstream.executed(), 2);
    let retry = raw_exchange_from("127.0.0.3", proxy.addr, &request).await;
    assert!(replayed(&retry), "the caller's own retry ran again");

    let token = ["idempotency-key: k2", "authorization: Bearer t-1"];
    let request = raw_post("/orders", &token, r#"{"amount":10}"#);
    raw_exchange_from("127.0.0.2", proxy.addr, &request).await;
    let elsewhere = raw_exchange_from("127.0.0.3", proxy.addr, &request).await;
    assert!(replayed(&elsewhere), "the same token from another address");
    assert_eq!(upstream.executed(), 3);
}

/// A scope part sent with no one in it is not sent: an `Authorization` without a
/// credential (`Bearer null`, what every logged-out page of a single-page app sends), an
/// empty header, an emptied cookie. Keyed by it, every anonymous caller anywhere would
/// share one key; the default caller stands in, as for a part that is absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_part_that_names_no_one_falls_back_to_the_caller() {
    let upstream = start_upstream().await;
    let routes = r#"
routes:
  - name: orders
    match: { path: /orders }
    key: { header: Idempotency-Key, scope: [header: Authorization] }
  - name: votes
    match: { path: /orders/votes }
    key: { fingerprint: { body: true }, scope: [header: X-User-Id, cookie: uid] }
"#;
    let proxy = start_proxy(upstream.addr, routes).await;
    let anonymous = [
        ("/orders", "authorization: Bearer null"),
        ("/orders", "authorization: Bearer"),
        ("/orders/votes", "x-user-id: "),
        ("/orders/votes", "cookie: uid="),
    ];
    anonymous_callers_are_told_apart(&proxy, &upstream, &anonymous).await;
}

/// Each request, sent alike from two addresses (two anonymous callers), runs for each,
/// and each caller's own retry replays.
async fn anonymous_callers_are_told_apart(
    proxy: &common::ProxyHandle,
    upstream: &common::Upstream,
    cases: &[(&str, &str)],
) {
    let mut executed = 0;
    for (n, (path, anonymous)) in cases.iter().enumerate() {
        let client_key = format!("idempotency-key: k{n}");
        let request = raw_post(path, &[&client_key, anonymous], r#"{"n":1}"#);
        let first = raw_exchange_from("127.0.0.2", proxy.addr, &request).await;
        let other = raw_exchange_from("127.0.0.3", proxy.addr, &request).await;
        assert!(!replayed(&first), "{anonymous}");
        assert!(
            !replayed(&other),
            "{anonymous}: another anonymous caller got the answer"
        );
        executed += 2;
        assert_eq!(upstream.executed(), executed);
        let retry = raw_exchange_from("127.0.0.3", proxy.addr, &request).await;
        assert!(
            replayed(&retry),
            "{anonymous}: the caller's own retry ran again"
        );
    }
}

/// `scope: [header: Cookie]` keys by the whole jar. A jar whose every cookie names no one
/// (`token=null`, what a logged-out single-page app writes; an emptied `session=`), or
/// holds none that could (`lang=en`: no session, no credential-like name), is sent alike
/// by every anonymous caller: keyed by it, one caller got another's answer. It counts as
/// not sent, and the default caller stands in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_jar_that_names_no_one_falls_back_to_the_caller() {
    let upstream = start_upstream().await;
    let routes = r#"
routes:
  - name: orders
    match: { path: /orders }
    key: { header: Idempotency-Key, scope: [header: Cookie] }
"#;
    let proxy = start_proxy(upstream.addr, routes).await;
    let anonymous = [
        ("/orders", "cookie: token=null"),
        ("/orders", "cookie: session=; sid=deleted"),
        ("/orders", "cookie: lang=en"),
    ];
    anonymous_callers_are_told_apart(&proxy, &upstream, &anonymous).await;
}
