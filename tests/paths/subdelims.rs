//! Escaped sub-delimiters, `:` and `@` (`%3A`, `%40`, `%21`, …): most upstreams (Go,
//! Spring, ASP.NET, Django, nginx) decode them before they route, so `%3A` is the `:` a
//! route is written with; Express routes the path as sent, escape and all. A path with one
//! is routed as the decoding upstreams read it, and refused where the escaped reading is
//! another route's; it is forwarded as sent.

use http::StatusCode;

use crate::common::{post, start_proxy, start_recorder};
use crate::not_normalizable;

const CANCEL: &str = r#"
routes:
  - name: cancel
    match: { methods: [POST], path: "/v1/orders:cancel" }
    key: { header: Idempotency-Key, required: true }
  - name: orders
    match: { methods: [POST], path: "/users/{email}/orders" }
    key: { header: Idempotency-Key, required: true }
"#;

/// `encodeURIComponent` escapes `:`: `/v1/orders%3Acancel` is the `:cancel` handler to an
/// upstream that decodes before it routes, so it is the route written with the `:` here
/// too (required key and all), not the fallback's (or, under `defaults.key: off`, no) key.
/// With its key it runs once, whoever sends it at once, and the retry is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percent_escaped_colon_cannot_step_around_a_route_written_with_the_colon() {
    for defaults in ["", "defaults: { key: off }\n"] {
        let upstream = start_recorder().await;
        let proxy = start_proxy(upstream.addr, &format!("{defaults}{CANCEL}")).await;
        for path in [
            "/v1/orders%3Acancel",
            "/v1/orders%3acancel",
            "/V1/Orders%3ACancel/",
        ] {
            let answer = post(proxy.addr, path, &[], "{}").await;
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{defaults}{path}");
            assert_eq!(
                answer.json()["type"],
                "urn:idemgate:problem:key-invalid",
                "{defaults}{path}"
            );
        }
        assert_eq!(upstream.executed(), 0, "{defaults}: it ran keyless");
        let path = "/v1/orders%3Acancel";
        let key = [("idempotency-key", "c1")];
        let addr = proxy.addr;
        let at_once: Vec<_> = (0..6)
            .map(|_| tokio::spawn(async move { post(addr, path, &key, r#"{"id":7}"#).await }))
            .collect();
        for task in at_once {
            let answer = task.await.unwrap();
            assert_eq!(answer.status, StatusCode::CREATED, "{defaults}");
        }
        let again = post(proxy.addr, path, &key, r#"{"id":7}"#).await;
        assert!(again.replayed(), "{defaults}: {:?}", again.status);
        assert_eq!(upstream.executed(), 1, "{defaults}: it ran twice");
        assert_eq!(upstream.seen()[0].target, path, "forwarded as sent");
    }
}

/// `/users/a%40b.com/orders` is one route read either way (`{email}` takes `a@b.com` and
/// `a%40b.com` alike): it is protected by it, runs once as sent and replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escaped_at_sign_under_one_route_either_way_runs_once_and_replays() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, CANCEL).await;
    let path = "/users/a%40b.com/orders";
    let answer = post(proxy.addr, path, &[], "{}").await;
    assert_eq!(answer.json()["type"], "urn:idemgate:problem:key-invalid");
    let key = [("idempotency-key", "u1")];
    let first = post(proxy.addr, path, &key, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = post(proxy.addr, path, &key, "{}").await;
    assert!(again.replayed(), "{:?}", again.status);
    assert_eq!(upstream.executed(), 1);
    assert_eq!(upstream.seen()[0].target, path);
}

const EXPRESS: &str = r#"
routes:
  - name: cancel
    match: { methods: [POST], path: "/v1/orders:cancel" }
    idempotency: off
  - name: anything
    match: { methods: [POST], path: "/v1/{action}" }
    key: { header: Idempotency-Key, required: true }
"#;

/// Express routes the path as sent: `/v1/orders%3Acancel` is `/v1/{action}`'s handler to
/// it (a required key), the unprotected `:cancel` one to upstreams that decode first. No
/// one rule holds for both, so it is a 400 before anything runs, with or without a key.
/// Each spelling alone is routed as its route says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escaped_colon_that_express_routes_elsewhere_is_a_400() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, EXPRESS).await;
    for path in ["/v1/orders%3Acancel", "/v1/orders%3acancel"] {
        for key in [&[][..], &[("idempotency-key", "k1")]] {
            let answer = post(proxy.addr, path, key, "{}").await;
            not_normalizable(&answer, path);
            let detail = answer.json()["detail"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(detail.contains("%3A"), "{path}: {detail}");
        }
    }
    assert_eq!(upstream.executed(), 0, "an escaped colon ran");
    // The plain spelling is the unprotected route's; another escaped name is one route
    // both ways, and its key is required.
    let answer = post(proxy.addr, "/v1/orders:cancel", &[], "{}").await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let answer = post(proxy.addr, "/v1/orders%3Aship", &[], "{}").await;
    assert_eq!(answer.json()["type"], "urn:idemgate:problem:key-invalid");
    assert_eq!(upstream.executed(), 1);
}

/// A route literal with an escaped `:` (`%3A`) would match only the reading Express has:
/// refused at load, naming the `:` to write.
#[test]
fn a_route_literal_with_an_escaped_colon_is_refused_at_load() {
    for (path, hint) in [
        ("/v1/orders%3Acancel", "/v1/orders:cancel"),
        ("/users/a%40b", "/users/a@b"),
        ("/x/a%2Bb%3Dc", "/x/a+b=c"),
    ] {
        let text = format!(
            "listen: 127.0.0.1:0\nupstream: http://127.0.0.1:1\nroutes:\n  - name: r\n    match: {{ methods: [POST], path: \"{path}\" }}\n    key: {{ header: K }}\n"
        );
        let err = idemgate::config::Config::parse(&text, "p.yaml")
            .map(|_| ())
            .expect_err(path)
            .to_string();
        assert!(err.contains(hint), "{path}: {err}");
    }
    // `%3B` is no parameter delimiter, and stays as written.
    let text = "listen: 127.0.0.1:0\nupstream: http://127.0.0.1:1\nroutes:\n  - name: r\n    match: { methods: [POST], path: \"/x/a%3Bb\" }\n    key: { header: K }\n";
    idemgate::config::Config::parse(text, "p.yaml").expect("%3B");
}

/// A `:search` route that enforces nothing (`idempotency: off`, or `observe` during a
/// rollout) and no other route: `/v1/orders%3Asearch` as sent is no route to Express, so
/// the fallback's (fingerprint) protects it there, while decoding upstreams run the
/// `:search` handler. It is run under the fallback, as it was before routes read `%3A`
/// decoded (an extra dedupe where `:search` runs), never refused: a duplicate runs once
/// and is replayed, whoever sends it at once. The plain `:search` spelling stays its
/// route's, and each of its posts runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escaped_colon_under_an_unenforced_route_runs_under_the_fallback() {
    for mode in ["off", "observe"] {
        let upstream = start_recorder().await;
        let rule = match mode {
            "off" => "idempotency: off",
            _ => "key: { header: Idempotency-Key }\n    idempotency: observe",
        };
        let routes = format!(
            "routes:\n  - name: search\n    match: {{ methods: [POST], path: \"/v1/orders:search\" }}\n    {rule}\n"
        );
        let proxy = start_proxy(upstream.addr, &routes).await;
        let path = "/v1/orders%3Asearch";
        let addr = proxy.addr;
        let at_once: Vec<_> = (0..6)
            .map(|_| tokio::spawn(async move { post(addr, path, &[], r#"{"q":1}"#).await }))
            .collect();
        for task in at_once {
            let answer = task.await.unwrap();
            assert_eq!(answer.status, StatusCode::CREATED, "{mode}");
        }
        let again = post(proxy.addr, path, &[], r#"{"q":1}"#).await;
        assert!(again.replayed(), "{mode}: {:?}", again.status);
        assert_eq!(upstream.executed(), 1, "{mode}: it ran twice");
        assert_eq!(upstream.seen()[0].target, path, "forwarded as sent");
        let other = post(proxy.addr, path, &[], r#"{"q":2}"#).await;
        assert_eq!(other.status, StatusCode::CREATED, "{mode}: another payload");
        assert!(!other.replayed(), "{mode}: another payload");
        assert_eq!(upstream.executed(), 2, "{mode}");
        for _ in 0..2 {
            let plain = post(proxy.addr, "/v1/orders:search", &[], r#"{"q":1}"#).await;
            assert_eq!(plain.status, StatusCode::CREATED, "{mode}");
            assert!(
                !plain.replayed(),
                "{mode}: the :search route does not enforce"
            );
        }
        assert_eq!(upstream.executed(), 4, "{mode}");
    }
}
