//! Key rules end to end: what makes two requests "the same" on each kind of route.

mod common;

use std::net::SocketAddr;

use common::{post, send, start_proxy, start_upstream};
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ROUTES: &str = r#"
routes:
  - name: form
    match: { methods: [POST], path: /orders/form }
    key: { fingerprint: { query: true, body: true } }
  - name: by-ip
    match: { methods: [POST], path: /orders/ip }
    key: { fingerprint: { body: true }, scope: [client_ip] }
  - name: by-cookie
    match: { methods: [POST], path: /orders/cookie }
    key: { fingerprint: { body: true }, scope: [cookie: sid] }
  - name: callback
    match: { methods: [POST], path: /orders/callback }
    key: { fields: [/alipayNo, /paymentOrderNo] }
  - name: ignore-note
    match: { methods: [POST], path: /orders/note }
    key: { fingerprint: { body: true, ignore: [Note, /meta/id] } }
  - name: raw
    match: { methods: [POST], path: "/orders/raw/*" }
    idempotency: off
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn form_bodies_and_queries_are_canonicalized() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let form = |path: &'static str, body: &'static str| {
        send(
            proxy.addr,
            Method::POST,
            path,
            &[("content-type", "application/x-www-form-urlencoded")],
            body,
        )
    };
    assert!(!form("/orders/form?b=2&a=1", "qty=1&sku=A%201")
        .await
        .replayed());
    assert!(form("/orders/form?a=1&b=2", "sku=A+1&qty=1&timestamp=99")
        .await
        .replayed());
    assert!(!form("/orders/form?a=1&b=3", "sku=A+1&qty=1")
        .await
        .replayed());
    assert_eq!(upstream.executed(), 2);
    // `force` and `force=` are `nil` and `""` to Rack: two requests, never one.
    assert!(!form("/orders/form?force", "qty=1").await.replayed());
    assert!(!form("/orders/form?force=", "qty=1").await.replayed());
    assert!(form("/orders/form?force", "qty=1").await.replayed());
    assert_eq!(upstream.executed(), 4);
}

async fn post_from(ip: &str, proxy: SocketAddr, path: &str, body: &str) -> String {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    let mut stream = socket.connect(proxy).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    raw.to_ascii_lowercase()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ip_scope_separates_callers() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let body = r#"{"vote":"yes"}"#;
    let first = post_from("127.0.0.1", proxy.addr, "/orders/ip", body).await;
    assert!(!first.contains("idempotent-replayed"));
    let other_ip = post_from("127.0.0.2", proxy.addr, "/orders/ip", body).await;
    assert!(
        !other_ip.contains("idempotent-replayed"),
        "another caller executes"
    );
    let again = post_from("127.0.0.2", proxy.addr, "/orders/ip", body).await;
    assert!(again.contains("idempotent-replayed: true"));
    assert_eq!(upstream.executed(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookie_scope_separates_sessions() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let addr = proxy.addr;
    let with = |cookie: &'static str| async move {
        post(addr, "/orders/cookie", &[("cookie", cookie)], "{}").await
    };
    assert!(!with("theme=dark; sid=s1").await.replayed());
    assert!(!with("sid=s2").await.replayed());
    assert!(with("sid=s1; theme=light").await.replayed());
    assert_eq!(upstream.executed(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivered_callbacks_apply_once_whatever_else_changes() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let mut bodies = Vec::new();
    for attempt in 0..5 {
        let notice = format!(
            r#"{{"alipayNo":"2026112100001","paymentOrderNo":"PO-77","amount":"12.50","timestamp":{},"notifyId":"n{attempt}"}}"#,
            1_763_700_000 + attempt
        );
        let a = post(proxy.addr, "/orders/callback", &[], &notice).await;
        assert_eq!(a.status, StatusCode::CREATED);
        assert_eq!(a.replayed(), attempt > 0);
        bodies.push(a.body);
    }
    assert_eq!(upstream.executed(), 1, "the payment is applied once");
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "each redelivery gets the first answer"
    );
    let next = post(
        proxy.addr,
        "/orders/callback",
        &[],
        r#"{"alipayNo":"2026112100001","paymentOrderNo":"PO-78"}"#,
    )
    .await;
    assert!(!next.replayed());
    assert_eq!(upstream.executed(), 2);
}

/// A field named twice is ambiguous: an app may read either occurrence. The key holds
/// every occurrence, so a body naming `PO-1` then `PO-2` is not taken for one naming only
/// `PO-2` (or only `PO-1`): each runs, while a redelivery of the same bytes is replayed.
/// Before, the last occurrence alone was keyed and the first body's answer was replayed
/// for the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_named_twice_is_keyed_by_every_occurrence() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let twice = r#"{"alipayNo":"A","paymentOrderNo":"PO-1","paymentOrderNo":"PO-2"}"#;
    let bodies = [
        twice,
        r#"{"alipayNo":"A","paymentOrderNo":"PO-2"}"#,
        r#"{"alipayNo":"A","paymentOrderNo":"PO-1"}"#,
    ];
    for (n, body) in bodies.into_iter().enumerate() {
        let answer = post(proxy.addr, "/orders/callback", &[], body).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{body}");
        assert!(!answer.replayed(), "{body} was taken for an earlier body");
        assert_eq!(upstream.executed(), n + 1);
    }
    let again = post(proxy.addr, "/orders/callback", &[], twice).await;
    assert!(again.replayed(), "the same bytes again");
    assert_eq!(upstream.executed(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_ignore_adds_names_at_any_depth_and_pointers() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let p = |body: &'static str| post(proxy.addr, "/orders/note", &[], body);
    assert!(
        !p(r#"{"sku":"A","note":"x","meta":{"id":1,"ts":5,"lot":"L"}}"#)
            .await
            .replayed()
    );
    assert!(p(r#"{"sku":"A","NOTE":"y","meta":{"id":2,"lot":"L"}}"#)
        .await
        .replayed());
    // `/meta/id` is ignored only at that path; `lot` is not ignored at all.
    assert!(!p(r#"{"sku":"A","meta":{"lot":"M"}}"#).await.replayed());
    assert!(!p(r#"{"sku":"A","id":1,"meta":{"lot":"L"}}"#)
        .await
        .replayed());
    assert_eq!(upstream.executed(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprotected_routes_and_key_off_pass_every_request() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    for _ in 0..3 {
        let a = post(proxy.addr, "/orders/raw/x", &[], "{}").await;
        assert!(!a.replayed());
    }
    assert_eq!(upstream.executed(), 3);

    let off = start_proxy(upstream.addr, "defaults: { key: off }\n").await;
    for _ in 0..2 {
        assert!(!post(off.addr, "/orders/any", &[], "{}").await.replayed());
    }
    assert_eq!(upstream.executed(), 5);
    // With the default key, an unmatched POST is protected by its fingerprint.
    let on = start_proxy(upstream.addr, "").await;
    assert!(!post(on.addr, "/orders/any", &[], r#"{"a":1}"#)
        .await
        .replayed());
    assert!(post(on.addr, "/orders/any", &[], r#"{"a":1.0,"ts":3}"#)
        .await
        .replayed());
    assert_eq!(upstream.executed(), 6);
}

/// `idemgate explain` says which identity scopes the key, never its value, and shows the
/// path routes match.
#[test]
fn explain_names_the_caller_tier_and_never_its_value() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.yaml");
    std::fs::write(
        &config,
        format!("listen: 127.0.0.1:1\nupstream: http://127.0.0.1:2\n{ROUTES}"),
    )
    .unwrap();
    let explain = |extra: &[&str]| {
        let mut args = vec!["--method", "POST", "--path", "/orders//x/../cart"];
        args.extend_from_slice(extra);
        common::explain_cli(&config, &args)
    };
    let session = explain(&["-H", "Cookie: theme=dark; sessionid=top-secret-session"]);
    assert!(
        session.contains("caller by session cookie (sessionid)"),
        "{session}"
    );
    assert!(!session.contains("top-secret"), "{session}");
    assert!(
        session.contains("path:              /orders/cart (normalised from /orders//x/../cart)"),
        "{session}"
    );
    assert!(session.contains("ttl:               2m"), "{session}");
    let bearer = explain(&["-H", "Authorization: Bearer top-secret-token"]);
    assert!(
        bearer.contains("caller by Authorization header"),
        "{bearer}"
    );
    assert!(!bearer.contains("top-secret"), "{bearer}");
    let address = explain(&["--client-ip", "192.0.2.44"]);
    assert!(address.contains("caller by client address"), "{address}");
    assert!(!address.contains("192.0.2.44"), "{address}");
}

/// Repeated parameters are an ordered list to the applications that read them (Rails'
/// `a[]=`, PHP arrays, servlet `getParameterValues`, `URLSearchParams.getAll`): a form
/// that reorders a list (drag and drop) sends the same values in another order, and that
/// is another request. Parameters of different names still sort.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_parameters_keep_their_order() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let form = |path: &'static str, body: &'static str| {
        send(
            proxy.addr,
            Method::POST,
            path,
            &[("content-type", "application/x-www-form-urlencoded")],
            body,
        )
    };
    assert!(!form("/orders/form", "list=7&order=3&order=1&order=2")
        .await
        .replayed());
    assert!(
        !form("/orders/form", "list=7&order=1&order=2&order=3")
            .await
            .replayed(),
        "the reordered list got the first order's answer"
    );
    assert!(form("/orders/form", "order=1&order=2&list=7&order=3")
        .await
        .replayed());
    assert!(!form("/orders/form?pick=b&pick=a", "").await.replayed());
    assert!(
        !form("/orders/form?pick=a&pick=b", "").await.replayed(),
        "the reordered query got the first one's answer"
    );
    assert_eq!(upstream.executed(), 4);
}

/// A `fields` key names the business request within its route, but a route whose path has
/// parameters (or the fallback, which takes every path) serves many resources: the same
/// identifiers sent to two of them by one caller are two requests, never one replayed for
/// the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fields_key_is_per_path_on_a_route_with_parameters() {
    let upstream = start_upstream().await;
    let config = r#"
routes:
  - name: merchant-callback
    match: { methods: [POST], path: "/orders/{merchant}/callbacks" }
    key: { fields: [/paymentOrderNo] }
"#;
    let proxy = start_proxy(upstream.addr, config).await;
    let notice = r#"{"paymentOrderNo":"PO-1","amount":"12.50"}"#;
    let m1 = post(proxy.addr, "/orders/m1/callbacks", &[], notice).await;
    assert!(!m1.replayed());
    let m2 = post(proxy.addr, "/orders/m2/callbacks", &[], notice).await;
    assert!(
        !m2.replayed(),
        "merchant m2's callback got merchant m1's answer"
    );
    let again = post(proxy.addr, "/orders/m1/callbacks", &[], notice).await;
    assert!(
        again.replayed(),
        "a redelivery to the same path still replays"
    );
    assert_eq!(upstream.executed(), 2);
    // `explain` derives the key the proxy stored, path and all.
    let explained = common::stored_key(&proxy, "/orders/m2/callbacks", &[], notice.as_bytes());
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

/// A one-time token is never accepted twice for different work: its key is the token and
/// the caller, so what it was spent on (method, path, query, body and host) is its stored
/// fingerprint, and the same request to another tenant's host is refused as a reuse,
/// never answered with the first tenant's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_spent_on_one_host_is_not_replayed_on_another() {
    let upstream = start_upstream().await;
    let config = r#"
tokens: { ttl: 5m }
routes:
  - name: pay
    match: { methods: [POST], path: /orders/pay }
    key: { token: { header: Idempotency-Token } }
"#;
    let proxy = start_proxy(upstream.addr, config).await;
    let caller = ("authorization", "Bearer alice");
    let issued = post(proxy.addr, "/.idemgate/token", &[caller], "").await;
    assert_eq!(issued.status, StatusCode::CREATED);
    let token = issued.json()["token"].as_str().unwrap().to_owned();
    let pay = |host: &'static str| {
        let token = token.clone();
        async move {
            post(
                proxy.addr,
                "/orders/pay",
                &[caller, ("idempotency-token", &token), ("host", host)],
                r#"{"amount":5}"#,
            )
            .await
        }
    };
    let a = pay("tenant-a.example").await;
    assert_eq!(a.status, StatusCode::CREATED);
    assert!(pay("tenant-a.example").await.replayed());
    let b = pay("tenant-b.example").await;
    assert!(!b.replayed(), "tenant-b's payment got tenant-a's answer");
    assert_eq!(b.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.executed(), 1);
}

/// An app behind Rack, Express's method-override or Symfony runs `POST` with
/// `X-HTTP-Method-Override: DELETE` as a DELETE: the override names another operation,
/// so it is part of every key (`fields` and `header` keys too), and a token spent on one
/// operation is refused for the other. The value is read as those frameworks read it,
/// in any case; a comma list is its own operation, since one may run either element.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_override_header_is_another_operation() {
    let upstream = start_upstream().await;
    let config = r#"
tokens: { ttl: 5m }
routes:
  - name: callback
    match: { methods: [POST], path: /orders/callback }
    key: { fields: [/paymentOrderNo] }
  - name: keyed
    match: { methods: [POST], path: /orders/keyed }
    key: { header: Idempotency-Key, required: true }
  - name: pay
    match: { methods: [POST], path: /orders/pay }
    key: { token: { header: Idempotency-Token } }
"#;
    let proxy = start_proxy(upstream.addr, config).await;
    let body = r#"{"paymentOrderNo":"PO-1"}"#;
    let key = ("idempotency-key", "k-1");
    for (path, extra) in [
        ("/orders/1", None),
        ("/orders/callback", None),
        ("/orders/keyed", Some(key)),
    ] {
        let with = |name: &'static str, value: &'static str| {
            let mut headers = vec![(name, value)];
            headers.extend(extra);
            headers
        };
        let before = upstream.executed();
        assert!(!post(proxy.addr, path, &with("x-a", "1"), body)
            .await
            .replayed());
        for name in [
            "x-http-method-override",
            "x-http-method",
            "x-method-override",
        ] {
            let delete = post(proxy.addr, path, &with(name, "DELETE"), body).await;
            assert!(
                !delete.replayed(),
                "{path}: the DELETE ({name}) got the POST's answer"
            );
        }
        let again = post(
            proxy.addr,
            path,
            &with("x-http-method-override", "delete"),
            body,
        )
        .await;
        assert!(again.replayed(), "{path}: a repeated DELETE runs once");
        // A framework may run either element of a list: another operation than DELETE.
        let listed = with("x-http-method-override", "DELETE, PUT");
        let listed = post(proxy.addr, path, &listed, body).await;
        assert!(
            !listed.replayed(),
            "{path}: `DELETE, PUT` got the DELETE's answer"
        );
        assert_eq!(upstream.executed(), before + 5, "{path}");
    }

    let caller = ("authorization", "Bearer alice");
    let issued = post(proxy.addr, "/.idemgate/token", &[caller], "").await;
    let token = issued.json()["token"].as_str().unwrap().to_owned();
    let pay = |over: Option<&'static str>| {
        let token = token.clone();
        async move {
            let mut headers = vec![caller, ("idempotency-token", token.as_str())];
            headers.extend(over.map(|m| ("x-http-method-override", m)));
            post(proxy.addr, "/orders/pay", &headers, body).await
        }
    };
    let before = upstream.executed();
    assert_eq!(pay(None).await.status, StatusCode::CREATED);
    let other = pay(Some("DELETE")).await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a token spent on a POST was accepted for a DELETE"
    );
    assert_eq!(upstream.executed(), before + 1);
}

/// A peer not in `trusted_proxies` that sends `X-Forwarded-For`, `Forwarded` or
/// `X-Real-IP` is a load balancer nobody listed, relaying many clients from one address:
/// what it relays is part of each anonymous caller, so two of its clients sending the same
/// request are two callers, never one answered with the other's answer, while one client's
/// retry through it (the same header again) is still replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlisted_proxy_s_clients_are_told_apart_by_what_it_relays() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let body = r#"{"vote":"A"}"#;
    for name in ["x-forwarded-for", "forwarded", "x-real-ip"] {
        let path = format!("/orders/votes/{name}");
        let before = upstream.executed();
        let a = post(proxy.addr, &path, &[(name, "203.0.113.1")], body).await;
        assert!(!a.replayed());
        let b = post(proxy.addr, &path, &[(name, "203.0.113.2")], body).await;
        assert!(
            !b.replayed(),
            "{name}: a second client behind the balancer got the first's answer"
        );
        assert!(post(proxy.addr, &path, &[(name, "203.0.113.1")], body)
            .await
            .replayed());
        assert_eq!(upstream.executed(), before + 2, "{name}");
    }
    // The port some balancers write (Azure Application Gateway: `ip:port`) changes with
    // every connection: a retry on a new one is the same client.
    let path = "/orders/votes/ported";
    let relayed = |entry: &'static str| [("x-forwarded-for", entry)];
    let before = upstream.executed();
    assert!(!post(proxy.addr, path, &relayed("203.0.113.1:51234"), body)
        .await
        .replayed());
    let retry = post(proxy.addr, path, &relayed("203.0.113.1:40000"), body).await;
    assert!(
        retry.replayed(),
        "a retry from another port of the same client ran again"
    );
    assert!(!post(proxy.addr, path, &relayed("203.0.113.2:51234"), body)
        .await
        .replayed());
    assert_eq!(upstream.executed(), before + 2);
    // A client that sends none is the peer alone, as before.
    assert!(!post(proxy.addr, "/orders/votes/direct", &[], body)
        .await
        .replayed());
    assert!(post(proxy.addr, "/orders/votes/direct", &[], body)
        .await
        .replayed());
}
