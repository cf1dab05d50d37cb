//! What counts as a repeat, and for how long: a key idemgate derives itself is a short
//! window, business words about time and place are data, a "not now" answer is not kept,
//! and a header route's payload check is the route's own; an answer that is neither
//! replayed nor a failure is never run again; safe methods always pass and a listed
//! DELETE is protected, an unrouted POST or PATCH is keyed by `defaults.key` and an
//! unrouted PUT or DELETE passes; `ignore_defaults: false` makes the timestamp data; only
//! a replay says it is one, whatever the upstream says.

mod common;

use std::time::Duration;

use common::{post, start_proxy, start_upstream, ProxyHandle};
use http::StatusCode;
use idemgate::key::Digest;

/// The store key the proxy derives for a POST from 127.0.0.1, through `idemgate explain`'s
/// own code.
fn digest_of(proxy: &ProxyHandle, path: &str, headers: &[(&str, &str)], body: &str) -> Digest {
    let mut map = http::HeaderMap::new();
    map.insert("content-type", "application/json".parse().unwrap());
    // The host is part of the key; routes and keys read it without its port.
    map.insert("host", "127.0.0.1".parse().unwrap());
    for (n, v) in headers {
        map.insert(
            http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    let request = idemgate::explain::Request {
        method: http::Method::POST,
        uri: path.parse().unwrap(),
        headers: map,
        body: body.as_bytes().to_vec(),
        client_ip: Some([127, 0, 0, 1].into()),
        client_cert: None,
    };
    let text = idemgate::explain::explain(&proxy.proxy.config(), &request).unwrap();
    let hex = text
        .lines()
        .find_map(|l| l.strip_prefix("key digest:"))
        .unwrap_or_else(|| panic!("{text}"))
        .trim();
    Digest::from_hex(hex).unwrap_or_else(|| panic!("{text}"))
}

/// How long the store keeps `key`, as it recorded it.
async fn stored_for(proxy: &ProxyHandle, key: Digest) -> Duration {
    let info = proxy
        .store
        .inspect(key)
        .await
        .unwrap()
        .expect("a stored key");
    info.expires.duration_since(info.created).unwrap()
}

/// A fingerprint key lives `fingerprint_ttl`: the same user adding the same item again
/// once the window is over executes again. The test waits for the store to say the key is
/// gone (by its own clock), then sends: no sleep decides the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legitimate_repeat_after_the_fingerprint_window_executes_again() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "defaults: { fingerprint_ttl: 1s }\n").await;
    let body = r#"{"sku":"A1","qty":1}"#;
    let first = post(proxy.addr, "/orders/cart", &[], body).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let key = digest_of(&proxy, "/orders/cart", &[], body);
    let kept = stored_for(&proxy, key).await;
    assert!(kept < Duration::from_secs(2), "kept {kept:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while proxy.store.inspect(key).await.unwrap().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: never expired"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let later = post(proxy.addr, "/orders/cart", &[], body).await;
    assert!(!later.replayed(), "a new request after the window");
    assert_eq!(upstream.executed(), 2);
}

/// Out of the box: fingerprint keys (the default key) live two minutes, client keys a
/// day, and a route's own `ttl` wins over either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprint_keys_get_the_short_window_and_client_keys_the_ttl() {
    let upstream = start_upstream().await;
    let routes = r#"
defaults: { ttl: 24h }
routes:
  - name: keyed
    match: { path: /orders/keyed }
    key: { header: Idempotency-Key }
  - name: votes
    match: { path: /orders/votes }
    key: { fingerprint: { body: true } }
    ttl: 10m
"#;
    let proxy = start_proxy(upstream.addr, routes).await;
    let cases = [
        ("/orders/any", vec![], Duration::from_secs(120)),
        (
            "/orders/keyed",
            vec![("idempotency-key", "k1")],
            Duration::from_secs(24 * 3600),
        ),
        ("/orders/votes", vec![], Duration::from_secs(600)),
    ];
    for (path, headers, ttl) in cases {
        post(proxy.addr, path, &headers, "{}").await;
        let kept = stored_for(&proxy, digest_of(&proxy, path, &headers, "{}")).await;
        // From when the answer was recorded (whole milliseconds) to when the record
        // expires: the TTL, plus the moment between recording and completing.
        assert!(
            kept + Duration::from_millis(5) >= ttl && kept < ttl + Duration::from_secs(1),
            "{path}: {kept:?}"
        );
    }
}

/// Two bookings for different dates, two shipments to different places: two requests.
/// What only says when or where the request was sent is still ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn date_and_location_bodies_are_different_requests() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let pairs = [
        (
            r#"{"room":"A","date":"2025-06-01"}"#,
            r#"{"room":"A","date":"2025-06-02"}"#,
        ),
        (
            r#"{"parcel":7,"location":"Berlin"}"#,
            r#"{"parcel":7,"location":"Paris"}"#,
        ),
        (
            r#"{"slot":1,"time":"09:00","nonce":"a"}"#,
            r#"{"slot":1,"time":"10:00","nonce":"a"}"#,
        ),
        (
            r#"{"pin":1,"geo":{"x":1},"long":2,"accuracy":3}"#,
            r#"{"pin":1,"geo":{"x":2},"long":2,"accuracy":3}"#,
        ),
    ];
    for (i, (one, other)) in pairs.iter().enumerate() {
        let path = format!("/orders/book{i}");
        assert!(!post(proxy.addr, &path, &[], one).await.replayed());
        assert!(
            !post(proxy.addr, &path, &[], other).await.replayed(),
            "{other}"
        );
    }
    assert_eq!(upstream.executed(), 8);
    let sent = r#"{"room":"B","timestamp":1,"lat":52.5,"lng":13.4}"#;
    let resent = r#"{"room":"B","timestamp":2,"lat":52.6,"lng":13.3}"#;
    assert!(!post(proxy.addr, "/orders/b", &[], sent).await.replayed());
    assert!(post(proxy.addr, "/orders/b", &[], resent).await.replayed());
    assert_eq!(upstream.executed(), 9);
}

/// 408, 409, 425, 429 say "not now": the caller's retry with the same key executes,
/// although `4xx` is replayed; a route that lists the exact status keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_answers_are_not_replayed_unless_listed() {
    let upstream = start_upstream().await;
    let routes = r#"
routes:
  - name: keyed
    match: { path: /orders/keyed }
    key: { header: Idempotency-Key }
    replay_statuses: [2xx, 4xx]
  - name: keeps-429
    match: { path: /orders/keeps }
    key: { header: Idempotency-Key }
    replay_statuses: [2xx, 4xx, 429]
"#;
    let proxy = start_proxy(upstream.addr, routes).await;
    for status in ["408", "409", "425", "429"] {
        let key = format!("k-{status}");
        let headers = [("idempotency-key", key.as_str()), ("x-test-status", status)];
        let first = post(proxy.addr, "/orders/keyed", &headers, "{}").await;
        assert_eq!(first.status.as_str(), status);
        let retry = post(
            proxy.addr,
            "/orders/keyed",
            &[("idempotency-key", &key)],
            "{}",
        )
        .await;
        assert!(!retry.replayed(), "{status} was replayed");
        assert_eq!(retry.status, StatusCode::CREATED, "{status}");
    }
    assert_eq!(upstream.executed(), 8);
    // Other 4xx stay replayed; a listed 429 too.
    let headers = [("idempotency-key", "k-404"), ("x-test-status", "404")];
    post(proxy.addr, "/orders/keyed", &headers, "{}").await;
    let again = post(
        proxy.addr,
        "/orders/keyed",
        &[("idempotency-key", "k-404")],
        "{}",
    )
    .await;
    assert!(again.replayed());
    assert_eq!(again.status, StatusCode::NOT_FOUND);
    let headers = [("idempotency-key", "k-429"), ("x-test-status", "429")];
    post(proxy.addr, "/orders/keeps", &headers, "{}").await;
    let kept = post(
        proxy.addr,
        "/orders/keeps",
        &[("idempotency-key", "k-429")],
        "{}",
    )
    .await;
    assert!(kept.replayed());
    assert_eq!(kept.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(upstream.executed(), 10);
}

/// A header route's 422 check follows its own `fingerprint:`: a field it ignores may
/// change under the same key; a business field may not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_routes_payload_check_is_its_own() {
    let upstream = start_upstream().await;
    let routes = r#"
routes:
  - name: pay
    match: { path: /orders/pay }
    key: { header: Idempotency-Key, fingerprint: { body: true, query: false, ignore: [note] } }
"#;
    let proxy = start_proxy(upstream.addr, routes).await;
    let key = [("idempotency-key", "pay-1")];
    let first = post(
        proxy.addr,
        "/orders/pay",
        &key,
        r#"{"amount":5,"note":"a"}"#,
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let noted = post(
        proxy.addr,
        "/orders/pay?x=1",
        &key,
        r#"{"amount":5,"note":"b"}"#,
    )
    .await;
    assert!(noted.replayed(), "note and query are outside the check");
    let other = post(
        proxy.addr,
        "/orders/pay",
        &key,
        r#"{"amount":6,"note":"a"}"#,
    )
    .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    // Without `fingerprint:`, the default list: a date is data.
    let plain = start_proxy(
        upstream.addr,
        "routes:\n  - name: p\n    match: { path: /orders/p }\n    key: { header: Idempotency-Key }\n",
    )
    .await;
    let k = [("idempotency-key", "p-1")];
    post(
        plain.addr,
        "/orders/p",
        &k,
        r#"{"date":"2025-06-01","ts":1}"#,
    )
    .await;
    let resent = post(
        plain.addr,
        "/orders/p",
        &k,
        r#"{"date":"2025-06-01","ts":2}"#,
    )
    .await;
    assert!(resent.replayed());
    let moved = post(
        plain.addr,
        "/orders/p",
        &k,
        r#"{"date":"2025-06-02","ts":1}"#,
    )
    .await;
    assert_eq!(moved.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.executed(), 2);
}

/// An answer that is neither replayed nor says the work was not done (a 5xx or a "not
/// now"), such as the `303` of a form's post/redirect/get, may come from work that was
/// done: its key records "executed, answer not stored", and the retry is refused, never
/// run. A route that lists `3xx` replays the redirect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_neither_replayed_nor_a_failure_is_never_run_again() {
    let upstream = start_upstream().await;
    let routes = r#"
routes:
  - name: form
    match: { path: /orders/form }
    key: { header: Idempotency-Key }
  - name: only-2xx
    match: { path: /orders/strict }
    key: { header: Idempotency-Key }
    replay_statuses: [2xx]
  - name: redirects
    match: { path: /orders/redirects }
    key: { header: Idempotency-Key }
    replay_statuses: [2xx, 3xx, 4xx]
"#;
    let proxy = start_proxy(upstream.addr, routes).await;
    for (path, status) in [("/orders/form", "303"), ("/orders/strict", "404")] {
        let key = format!("k{path}");
        let headers = [("idempotency-key", key.as_str()), ("x-test-status", status)];
        let first = post(proxy.addr, path, &headers, "{}").await;
        assert_eq!(first.status.as_str(), status);
        let retry = post(proxy.addr, path, &[("idempotency-key", &key)], "{}").await;
        assert_eq!(retry.status, StatusCode::CONFLICT, "{path}");
        assert_eq!(
            retry.json()["type"],
            "urn:idemgate:problem:answer-not-stored",
            "{path}"
        );
        // Its detail tells why: the route does not replay that status, not a size.
        let detail = retry.json()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(!detail.contains("too large"), "{path}: {detail}");
        assert!(
            detail.contains(&format!("status {status}")),
            "{path}: {detail}"
        );
        assert!(detail.contains("not replayed"), "{path}: {detail}");
    }
    assert_eq!(upstream.executed(), 2, "a retry ran again");

    let headers = [("idempotency-key", "k-303"), ("x-test-status", "303")];
    post(proxy.addr, "/orders/redirects", &headers, "{}").await;
    let again = post(
        proxy.addr,
        "/orders/redirects",
        &[("idempotency-key", "k-303")],
        "{}",
    )
    .await;
    assert!(again.replayed());
    assert_eq!(again.status, StatusCode::SEE_OTHER);
    assert_eq!(upstream.executed(), 3);
}

/// GET, HEAD, OPTIONS and TRACE always pass through, whatever key they carry, even on a
/// route that matches every method; DELETE is protected where a route lists it (once,
/// then replayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safe_methods_always_pass_and_a_listed_delete_runs_once() {
    use http::Method;
    let upstream = start_upstream().await;
    let routes = r#"
routes:
  - name: every-method
    match: { path: "/orders/any/*" }
    key: { header: Idempotency-Key }
  - name: orders
    match: { methods: [POST, DELETE], path: "/orders/*" }
    key: { header: Idempotency-Key }
"#;
    let proxy = start_proxy(upstream.addr, routes).await;
    let key = [("idempotency-key", "same")];
    for path in ["/orders/any/1", "/orders/1"] {
        for method in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            for _ in 0..2 {
                let answer = common::send(proxy.addr, method.clone(), path, &key, "").await;
                assert!(!answer.replayed(), "{method} {path} was replayed");
            }
        }
    }
    // The upstream counts all but GET.
    assert_eq!(
        upstream.executed(),
        12,
        "every safe request reached the upstream"
    );
    let key = [("idempotency-key", "delete-1")];
    let first = common::send(proxy.addr, Method::DELETE, "/orders/1", &key, "").await;
    let again = common::send(proxy.addr, Method::DELETE, "/orders/1", &key, "").await;
    assert!(!first.replayed());
    assert!(again.replayed(), "a listed DELETE ran twice");
    assert_eq!(upstream.executed(), 13);
}

/// A POST or PATCH that matches no route is keyed by `defaults.key` (the canonical
/// fingerprint by default): the same JSON twice, its keys reordered, runs once. A PUT or
/// DELETE no route lists passes through unprotected, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_and_patch_matching_no_route_are_fingerprinted_and_put_and_delete_pass() {
    use http::Method;
    let upstream = start_upstream().await;
    let routes = r#"
routes:
  - name: orders
    match: { methods: [POST], path: /orders/placed }
    key: { header: Idempotency-Key }
"#;
    let proxy = start_proxy(upstream.addr, routes).await;
    // The test upstream counts what reaches `/orders…`; no route matches these paths.
    let json = [("content-type", "application/json")];
    for method in [Method::POST, Method::PATCH] {
        let path = format!("/orders/cart/{method}");
        let first =
            common::send(proxy.addr, method.clone(), &path, &json, r#"{"a":1,"b":2}"#).await;
        let again =
            common::send(proxy.addr, method.clone(), &path, &json, r#"{"b":2,"a":1}"#).await;
        assert_eq!(first.status, StatusCode::CREATED, "{method}");
        assert!(!first.replayed(), "{method}");
        assert!(again.replayed(), "an unrouted {method} ran twice");
    }
    assert_eq!(upstream.executed(), 2);
    for method in [Method::PUT, Method::DELETE] {
        for _ in 0..2 {
            let answer =
                common::send(proxy.addr, method.clone(), "/orders/cart/1", &[], "{}").await;
            assert!(!answer.replayed(), "an unrouted {method} was replayed");
        }
    }
    assert_eq!(upstream.executed(), 6, "every unrouted PUT and DELETE ran");
}

/// `ignore_defaults: false` drops the default list of fields that say when a request was
/// sent: two requests that differ only in `timestamp` are then two requests, where the
/// default route takes them for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_defaults_false_counts_the_timestamp() {
    let upstream = start_upstream().await;
    let routes = r#"
routes:
  - name: strict
    match: { path: /orders/strict }
    key: { fingerprint: { body: true, ignore_defaults: false } }
  - name: usual
    match: { path: /orders/usual }
    key: { fingerprint: { body: true } }
"#;
    let proxy = start_proxy(upstream.addr, routes).await;
    let (one, two) = (
        r#"{"sku":"A","timestamp":1}"#,
        r#"{"sku":"A","timestamp":2}"#,
    );
    post(proxy.addr, "/orders/usual", &[], one).await;
    let usual = post(proxy.addr, "/orders/usual", &[], two).await;
    assert!(usual.replayed(), "the default list ignores timestamp");
    post(proxy.addr, "/orders/strict", &[], one).await;
    let strict = post(proxy.addr, "/orders/strict", &[], two).await;
    assert!(!strict.replayed(), "without the list, timestamp is data");
    assert_eq!(upstream.executed(), 3);
}

/// An upstream's own `Idempotent-Replayed` never reaches the client of a protected route:
/// a first execution that said it would look like a replay, and its stored answer would
/// carry it into replays beside the proxy's. The owner's answer, read whole or streamed
/// on, has none; a replay has the proxy's one `true`. An unprotected route passes the
/// upstream's answer on untouched, and so does a request a protected route forwards with
/// no claim (no key to claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_replay_says_it_is_one() {
    let upstream = start_upstream().await;
    let routes = r#"
routes:
  - name: keyed
    match: { path: /orders/keyed }
    key: { header: Idempotency-Key }
  - name: large
    match: { path: /orders/large }
    key: { header: Idempotency-Key }
    max_answer: 1KiB
  - name: open
    match: { path: /orders/open }
    idempotency: off
"#;
    let proxy = start_proxy(upstream.addr, routes).await;
    let said = |answer: &common::Answer| -> Vec<String> {
        let values = answer.headers.get_all("idempotent-replayed").iter();
        values.map(|v| v.to_str().unwrap().to_owned()).collect()
    };
    let headers = [("idempotency-key", "k1"), ("x-test-replayed", "true")];
    let first = post(proxy.addr, "/orders/keyed", &headers, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(
        said(&first).is_empty(),
        "a first execution: {:?}",
        said(&first)
    );
    let again = post(proxy.addr, "/orders/keyed", &headers, "{}").await;
    assert_eq!(said(&again), ["true"]);
    assert_eq!(upstream.executed(), 1);
    // Over `max_answer`, streamed on and not stored.
    let large = [
        ("idempotency-key", "k2"),
        ("x-test-replayed", "true"),
        ("x-test-bytes", "4096"),
    ];
    let streamed = post(proxy.addr, "/orders/large", &large, "{}").await;
    assert_eq!(streamed.body.len(), 4096);
    assert!(
        said(&streamed).is_empty(),
        "streamed: {:?}",
        said(&streamed)
    );
    let open = post(
        proxy.addr,
        "/orders/open",
        &[("x-test-replayed", "yes")],
        "{}",
    )
    .await;
    assert_eq!(said(&open), ["yes"]);
    let unkeyed = [("x-test-replayed", "yes")];
    let unclaimed = post(proxy.addr, "/orders/keyed", &unkeyed, "{}").await;
    assert_eq!(said(&unclaimed), ["yes"]);
}
