//! One spelling of a path: a route cannot be stepped around by writing its path another
//! way the upstream reads the same, what the upstream gets is what was matched, and what
//! has no one safe reading (an encoded slash, a `Host` list) is refused.

mod common;
#[path = "paths/decoders.rs"]
mod decoders;
#[path = "paths/subdelims.rs"]
mod subdelims;

use common::{post, raw_exchange, start_proxy, start_recorder};
use http::StatusCode;

const REQUIRED: &str = r#"
routes:
  - name: pay
    match: { methods: [POST], path: /api/orders }
    key: { header: Idempotency-Key, required: true }
"#;

/// Asserts `answer`, to a POST of `path`, is the 400 of a path with no one safe normal form.
fn not_normalizable(answer: &common::Answer, path: &str) {
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{path}");
    assert_eq!(
        answer.json()["type"],
        "urn:idemgate:problem:path-not-normalizable",
        "{path}"
    );
}

const SPELLINGS: [&str; 6] = [
    "/api//orders",
    "/api/./orders",
    "/api/%6Frders",
    "/api/x/../orders",
    "//api///orders",
    "/api/%2e/orders",
];

/// Each spelling without a key is refused as the route requires, not let through on the
/// default key (or unprotected) while the upstream runs `/api/orders`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spelling_of_a_required_route_gets_past_it() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, REQUIRED).await;
    for path in SPELLINGS {
        let answer = post(proxy.addr, path, &[], r#"{"amount":5}"#).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(
            answer.json()["type"],
            "urn:idemgate:problem:key-invalid",
            "{path}"
        );
    }
    assert_eq!(upstream.executed(), 0);
}

/// With a key, every spelling is the one route's one key, and the upstream is sent the
/// path that was matched (the query as it came).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_is_one_key_and_the_upstream_gets_the_matched_path() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, REQUIRED).await;
    let first = post(
        proxy.addr,
        "/api/x/../%6Frders?b=2&a=%2F",
        &[("idempotency-key", "k1")],
        "{}",
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.json()["path"], "/api/orders");
    for path in SPELLINGS {
        let again = post(
            proxy.addr,
            &format!("{path}?b=2&a=%2F"),
            &[("idempotency-key", "k1")],
            "{}",
        )
        .await;
        assert!(again.replayed(), "{path}: {:?}", again.status);
    }
    assert_eq!(upstream.executed(), 1);
    assert_eq!(upstream.seen()[0].target, "/api/orders?b=2&a=%2F");
}

/// Forms whose reading depends on the upstream are a 400 problem before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_without_one_safe_reading_are_a_400() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, REQUIRED).await;
    for path in [
        "/api%2Forders",
        "/api/orders%5C",
        "/api/orders%00",
        "/api/%zzorders",
    ] {
        let answer = post(proxy.addr, path, &[("idempotency-key", "k")], "{}").await;
        not_normalizable(&answer, path);
    }
    // A raw backslash, sent as bytes (a client library would refuse to).
    let raw = raw_exchange(
        proxy.addr,
        b"POST /api\\orders HTTP/1.1\r\nhost: x\r\nidempotency-key: k\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
    assert_eq!(upstream.executed(), 0);
}

/// A segment's `;` parameters, which Java upstreams drop before they route, do not take a
/// request off the route written for the path without them; the plain path routes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_params_do_not_step_around_a_required_route() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, REQUIRED).await;
    for path in [
        "/api/orders",
        "/api/orders;jsessionid=x",
        "/api/orders;a=1;b=2/",
        "/api;v=2/orders",
        "/api/;x/orders",
        "/api/orders/;jsessionid=x",
    ] {
        let answer = post(proxy.addr, path, &[], r#"{"amount":5}"#).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(
            answer.json()["type"],
            "urn:idemgate:problem:key-invalid",
            "{path}"
        );
    }
    assert_eq!(upstream.executed(), 0);
}

/// The upstream gets the parameters as sent (a `jsessionid` must reach it), and they stay
/// part of what a key's payload is: another spelling with the same key is not replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_params_are_forwarded_and_a_different_one_is_another_payload() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, REQUIRED).await;
    let key = [("idempotency-key", "k1")];
    let first = post(proxy.addr, "/api/orders;jsessionid=a?x=1", &key, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(upstream.seen()[0].target, "/api/orders;jsessionid=a?x=1");
    let again = post(proxy.addr, "/api/orders;jsessionid=a?x=1", &key, "{}").await;
    assert!(again.replayed(), "{:?}", again.status);
    let other = post(proxy.addr, "/api/orders;jsessionid=b?x=1", &key, "{}").await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.json()["type"], "urn:idemgate:problem:key-reused");
    assert_eq!(upstream.executed(), 1);
}

/// `..;` and `.;` are dot segments to servers that drop parameters first and names to the
/// others, in any spelling: a 400 before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_segments_with_params_are_a_400() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, REQUIRED).await;
    for path in [
        "/api/x/..;/orders",
        "/api/x/..;jsessionid=1/orders",
        "/api/orders/.;/",
        "/api/orders/.;x",
        "/api/x/%2E%2E%3B/orders",
        "/api/x/.%2e;/orders",
        "/api/x/..%3b/orders",
    ] {
        let answer = post(proxy.addr, path, &[("idempotency-key", "k")], "{}").await;
        not_normalizable(&answer, path);
    }
    assert_eq!(upstream.executed(), 0);
}

/// `Host: pay.example,evil.example` names two hosts: a 400, never routed by one while the
/// upstream (or `X-Forwarded-Host`) reads the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_list_is_a_400() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, REQUIRED).await;
    for host in [
        "pay.example,evil.example",
        "pay.example;x",
        "pay.example:80:81",
    ] {
        let request = format!(
            "POST /api/orders HTTP/1.1\r\nhost: {host}\r\nidempotency-key: k\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
        );
        let raw = raw_exchange(proxy.addr, request.as_bytes()).await;
        assert!(raw.starts_with("HTTP/1.1 400"), "{host}: {raw}");
    }
    assert_eq!(upstream.executed(), 0);
}

/// Method names are case-sensitive (RFC 9110 §9.1), yet Django and Flask (Werkzeug) upper-case
/// the method they are given: a `post` runs their POST view while no route, nor
/// `defaults.key`, took it for a POST. A method with a lower-case letter is a 400 problem
/// before anything runs, and the proxy goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_in_lower_case_is_a_400() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, REQUIRED).await;
    for method in [
        "post", "Post", "pOST", "patch", "put", "delete", "get", "purge",
    ] {
        let request = format!(
            "{method} /api/orders HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
        );
        let raw = raw_exchange(proxy.addr, request.as_bytes()).await;
        assert!(raw.starts_with("HTTP/1.1 400"), "{method}: {raw}");
        assert!(raw.contains("application/problem+json"), "{method}: {raw}");
        assert!(
            raw.contains("urn:idemgate:problem:bad-request"),
            "{method}: {raw}"
        );
    }
    assert_eq!(upstream.executed(), 0);
    let answer = post(proxy.addr, "/api/orders", &[("idempotency-key", "k")], "{}").await;
    assert_eq!(answer.status, StatusCode::CREATED);
}

const ANY_CASE: &str = r#"
routes:
  - name: pay
    match: { methods: [POST], path: /api/orders }
    key: { header: Idempotency-Key, required: true }
  - name: update-user
    match: { methods: [PUT], path: "/api/users/{id}" }
    key: { header: Idempotency-Key, required: true }
"#;

/// Express, ASP.NET Core and IIS route paths in any case: `/API/Orders` runs what
/// `/api/orders` runs there. A route's literal segments match in any ASCII case, so such a
/// spelling is refused as the route requires rather than let through on the default key
/// (a POST) or unprotected (a PUT); the upstream still gets the path as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_matches_its_path_in_any_case() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, ANY_CASE).await;
    for path in [
        "/API/orders",
        "/api/Orders",
        "/Api/ORDERS/",
        "/api/%4Frders",
    ] {
        let answer = post(proxy.addr, path, &[], r#"{"amount":5}"#).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(
            answer.json()["type"],
            "urn:idemgate:problem:key-invalid",
            "{path}"
        );
    }
    for path in ["/API/users/1", "/api/USERS/1"] {
        let answer = common::send(proxy.addr, http::Method::PUT, path, &[], "{}").await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{path}");
    }
    assert_eq!(upstream.executed(), 0);
    let key = [("idempotency-key", "k1")];
    let first = post(proxy.addr, "/API/Orders", &key, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(upstream.seen()[0].target, "/API/Orders");
    // The path is still part of the payload: another spelling under the same key is 422.
    let other = post(proxy.addr, "/api/orders", &key, "{}").await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.executed(), 1);
}

/// A route path that no normalised request path can have would never match, and its
/// requests would go to `defaults.key` (a POST) or through unprotected (a PUT): it is
/// refused at load, the error naming the form to write.
#[test]
fn a_route_path_no_request_can_have_is_refused_at_load() {
    for (path, hint) in [
        ("/api/%6Frders", "/api/orders"),
        ("/api/./orders", "dot segment"),
        ("/api/x/../orders", "dot segment"),
        ("/api//orders", "empty segment"),
        ("/api/café", "/api/caf%C3%A9"),
        ("/api/order items", "/api/order%20items"),
        ("/api/a%2Fb", "%2F"),
        ("/api/orders?x=1", "/api/orders%3Fx=1"),
    ] {
        let text = format!(
            "listen: 127.0.0.1:0\nupstream: http://127.0.0.1:1\nroutes:\n  - name: r\n    match: {{ methods: [PUT], path: \"{path}\" }}\n    key: {{ header: K }}\n"
        );
        let err = idemgate::config::Config::parse(&text, "p.yaml")
            .map(|_| ())
            .expect_err(path)
            .to_string();
        assert!(err.contains(hint), "{path}: {err}");
    }
    for path in [
        "/api/caf%C3%A9",
        "/api/{id}/orders",
        "/api/*",
        "/",
        "/api/orders/",
        "/a:b@c!$&'()+,=",
    ] {
        let text = format!(
            "listen: 127.0.0.1:0\nupstream: http://127.0.0.1:1\nroutes:\n  - name: r\n    match: {{ methods: [PUT], path: \"{path}\" }}\n    key: {{ header: K }}\n"
        );
        idemgate::config::Config::parse(&text, "p.yaml").expect(path);
    }
}

const ESCAPED: &str = r#"
routes:
  - name: update-cafe
    match: { methods: [PUT], path: "/api/caf%C3%A9/{id}" }
    key: { header: Idempotency-Key, required: true }
  - name: update-pair
    match: { methods: [PUT], path: "/api/a%7Cb" }
    key: { header: Idempotency-Key, required: true }
"#;

/// A route's literal holds a non-ASCII letter, or a character such as `|`, only
/// percent-encoded (the config refuses them raw), yet hyper takes a request target with them
/// raw (`PUT /api/café/1`, as curl sends it), and upstreams decode both spellings to one path.
/// The raw spelling is the route's too: refused as the route requires, not let through
/// unprotected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_character_is_its_escape_to_a_route() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, ESCAPED).await;
    for path in ["/api/café/1", "/api/CAFé/1", "/api/a|b"] {
        let request = format!(
            "PUT {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
        );
        let raw = raw_exchange(proxy.addr, request.as_bytes()).await;
        assert!(raw.starts_with("HTTP/1.1 400"), "{path}: {raw}");
        assert!(
            raw.contains("urn:idemgate:problem:key-invalid"),
            "{path}: {raw}"
        );
    }
    assert_eq!(upstream.executed(), 0, "a raw spelling ran unprotected");
    // With a key, both spellings are the one route, and the upstream gets the escaped one.
    let request = "PUT /api/café/1 HTTP/1.1\r\nhost: x\r\nidempotency-key: k1\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
    let raw = raw_exchange(proxy.addr, request.as_bytes()).await;
    assert!(raw.starts_with("HTTP/1.1 201"), "{raw}");
    assert_eq!(upstream.seen()[0].target, "/api/caf%C3%A9/1");
}

const OVERRIDDEN: &str = r#"
defaults:
  key: off
routes:
  - name: pay
    match: { methods: [POST], path: /api/orders }
    key: { header: Idempotency-Key, required: true }
  - name: delete-user
    match: { methods: [DELETE], path: "/api/users/{id}" }
    key: { header: Idempotency-Key, required: true }
  - name: delete-any
    match: { methods: [DELETE], path: "/api/*" }
    key: { header: Idempotency-Key }
    idempotency: observe
"#;

/// Rack, Express's `method-override`, Symfony and ASP.NET run a `POST` with
/// `X-HTTP-Method-Override: DELETE` as the DELETE: such a POST is routed by the method it
/// names, so it cannot step around the DELETE route's rule (here, with `defaults.key: off`,
/// it would run unprotected). An app that ignores overrides runs the POST: a route written
/// for the POST itself that enforces holds, whatever the named method's route (none, or
/// one that only observes). A comma list names each of its elements: Express runs the
/// first, others may run another, so none steps around its route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_override_cannot_step_around_the_route_of_the_method_it_names() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, OVERRIDDEN).await;
    for name in [
        "x-http-method-override",
        "X-HTTP-Method",
        "x-method-override",
    ] {
        for value in [
            "DELETE",
            "delete",
            "DELETE, POST",
            "DELETE,",
            " delete ",
            "POST,DELETE",
            "PATCH , delete",
        ] {
            let answer = post(proxy.addr, "/api/users/7", &[(name, value)], "{}").await;
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{name}: {value}");
            assert_eq!(
                answer.json()["type"],
                "urn:idemgate:problem:key-invalid",
                "{name}: {value}"
            );
        }
    }
    // Overridden to a method no route has, a safe one, or one whose route only observes:
    // the POST's route holds.
    for value in ["PUT", "GET", "DELETE"] {
        let answer = post(
            proxy.addr,
            "/api/orders",
            &[("x-http-method-override", value)],
            "{}",
        )
        .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{value}");
    }
    assert_eq!(upstream.executed(), 0, "an overridden POST ran unprotected");
    // With a key it runs once, and a repeat is replayed.
    let headers = [
        ("x-http-method-override", "DELETE"),
        ("idempotency-key", "k1"),
    ];
    let first = post(proxy.addr, "/api/users/7", &headers, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = post(proxy.addr, "/api/users/7", &headers, "{}").await;
    assert!(again.replayed());
    assert_eq!(upstream.executed(), 1);
}

const POST_OFF: &str = r#"
routes:
  - name: items
    match: { methods: [POST], path: "/api/items/{id}" }
    idempotency: off
"#;

/// A `POST` whose own route is unprotected but that names `PATCH`, which Rack, Express and
/// Symfony run as the PATCH: a PATCH of that path is no route's, so the fallback
/// (`defaults.key`) protects it when sent as one, and the override gets that protection
/// too (the first route of a named method that protects it). The POST without the
/// override is its own route's, and passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_override_to_patch_gets_the_fallback_s_protection() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, POST_OFF).await;
    let named = [("x-http-method-override", "PATCH")];
    let first = post(proxy.addr, "/api/items/7", &named, r#"{"qty":2}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = post(proxy.addr, "/api/items/7", &named, r#"{"qty":2}"#).await;
    assert!(again.replayed(), "an overridden PATCH ran twice");
    assert_eq!(upstream.executed(), 1);
    for _ in 0..2 {
        let plain = post(proxy.addr, "/api/items/7", &[], r#"{"qty":2}"#).await;
        assert!(!plain.replayed());
    }
    assert_eq!(upstream.executed(), 3);
}

const POST_OFF_DELETE_KEYED: &str = r#"
routes:
  - name: users-post
    match: { methods: [POST], path: "/api/users/{id}" }
    idempotency: off
  - name: delete-user
    match: { methods: [DELETE], path: "/api/users/{id}" }
    key: { header: Idempotency-Key, required: true }
"#;

/// A `PATCH` named ahead of another method does not take the override past that method's
/// own route: the fallback a PATCH no route takes would get is the last resort, after
/// every named method's route, whether the names share one header or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_named_first_does_not_hide_another_method_s_route() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, POST_OFF_DELETE_KEYED).await;
    let spellings: [&[(&str, &str)]; 2] = [
        &[("x-http-method-override", "PATCH, DELETE")],
        &[
            ("x-http-method-override", "PATCH"),
            ("x-http-method", "DELETE"),
        ],
    ];
    for named in spellings {
        let answer = post(proxy.addr, "/api/users/7", named, "{}").await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{named:?}");
        assert_eq!(answer.json()["type"], "urn:idemgate:problem:key-invalid");
    }
    assert_eq!(
        upstream.executed(),
        0,
        "the DELETE route was stepped around"
    );
}

const HOSTED: &str = r#"
routes:
  - name: update-user
    match: { methods: [PUT], path: "/api/users/{id}", host: pay.example }
    key: { header: Idempotency-Key, required: true }
"#;

const HOSTED_OFF: &str = r#"
routes:
  - name: admin-users
    match: { methods: [PUT], path: "/api/users/{id}", host: admin.example }
    idempotency: off
  - name: admin-notes
    match: { methods: [PUT], path: "/api/notes/{id}", host: admin.example }
    key: { header: Idempotency-Key, required: true }
    idempotency: observe
"#;

/// A request naming no host is refused only where a host-bound route would enforce on it:
/// one that protects nothing, or only observes (and forwards whatever it sees), has
/// nothing to step around, and the request goes on by the routes that name no host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_bound_route_that_protects_nothing_requires_no_host() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, HOSTED_OFF).await;
    let nameless = "PUT /api/users/1 HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}";
    let raw = raw_exchange(proxy.addr, nameless.as_bytes()).await;
    assert!(raw.contains(" 201 "), "{raw}");
    let observed = "PUT /api/notes/1 HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}";
    let raw = raw_exchange(proxy.addr, observed.as_bytes()).await;
    assert!(raw.contains(" 201 "), "{raw}");
    assert_eq!(upstream.executed(), 2);
}

/// Every spelling of a route's host is the route's: any case, a port (the default one or
/// another), a fully qualified name's trailing dot, the authority of an absolute-form
/// target (which wins over the `Host` field, RFC 9112 §3.2.2, and is what the upstream
/// gets). A name with an empty label (`pay.example..`, `.pay.example`) has no one reading
/// (nginx refuses it, others strip dots): a 400, not a request past the route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spelling_of_a_route_s_host_gets_past_it() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, HOSTED).await;
    let put = |target: &str, host: &str| {
        format!(
            "PUT {target} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
        )
    };
    for host in [
        "PAY.Example",
        "pay.example:80",
        "pay.example:443",
        "pay.example:8443",
        "pay.example.",
        "pay.example.:80",
    ] {
        let raw = raw_exchange(proxy.addr, put("/api/users/1", host).as_bytes()).await;
        assert!(raw.starts_with("HTTP/1.1 400"), "{host}: {raw}");
        assert!(raw.contains("key-invalid"), "{host}: {raw}");
    }
    let absolute = put("http://pay.example/api/users/1", "other.example");
    let raw = raw_exchange(proxy.addr, absolute.as_bytes()).await;
    assert!(raw.contains("key-invalid"), "absolute form: {raw}");
    for host in [
        "pay.example..",
        ".pay.example",
        "pay..example",
        "pay.example..:80",
    ] {
        let raw = raw_exchange(proxy.addr, put("/api/users/1", host).as_bytes()).await;
        assert!(raw.starts_with("HTTP/1.1 400"), "{host}: {raw}");
        assert!(
            raw.contains("urn:idemgate:problem:bad-request"),
            "{host}: {raw}"
        );
    }
    // A request that names no host (HTTP/1.0 without `Host`, an empty `Host`) is no
    // host's to routes, but the upstream serves it from its default host, which may be
    // the route's: where a host-bound route matches its method and path, it is refused.
    let nameless = [
        "PUT /api/users/1 HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}".to_owned(),
        put("/api/users/1", ""),
        "PUT /api/users/1 HTTP/1.1\r\nhost:\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
            .to_owned(),
        "POST /api/users/1 HTTP/1.0\r\nx-http-method-override: PUT\r\ncontent-length: 2\r\n\r\n{}"
            .to_owned(),
    ];
    for raw in &nameless {
        let answer = raw_exchange(proxy.addr, raw.as_bytes()).await;
        assert!(answer.contains(" 400 "), "{raw:?}: {answer}");
        assert!(
            answer.contains("urn:idemgate:problem:host-required"),
            "{raw:?}: {answer}"
        );
    }
    assert_eq!(
        upstream.executed(),
        0,
        "a spelling of the host ran unprotected"
    );
    // Where no host-bound route matches, a request without a host is routed as before.
    let unbound = "PUT /api/other HTTP/1.0\r\ncontent-length: 2\r\n\r\n{}";
    let raw = raw_exchange(proxy.addr, unbound.as_bytes()).await;
    assert!(raw.contains(" 201 "), "{raw}");
    assert_eq!(upstream.executed(), 1);
    // The target's authority is the host the upstream gets, as the route matched it.
    let absolute = "PUT http://pay.example/api/users/1 HTTP/1.1\r\nhost: other.example\r\nidempotency-key: k1\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
    let raw = raw_exchange(proxy.addr, absolute.as_bytes()).await;
    assert!(raw.starts_with("HTTP/1.1 201"), "{raw}");
    let seen = &upstream.seen()[1];
    assert_eq!(seen.target, "/api/users/1");
    assert_eq!(seen.headers["host"], "pay.example");
}
