//! Logs: one access line per request without secrets, in text and JSON, warnings that name
//! their request's route and key, and `access=off`.

use http::StatusCode;

use crate::common::redis_server::wait_until;
use crate::common::{post, start_upstream, ProxyProcess};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_has_one_line_per_request_and_no_secrets() {
    let upstream = start_upstream().await;
    let routes = "routes:\n  - name: keyed\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key }\n";
    let proxy = ProxyProcess::start_logging(upstream.addr, routes, "info");
    let h = [
        ("idempotency-key", "very-secret-key-42"),
        ("authorization", "Bearer sk_live_zzz"),
    ];
    post(proxy.addr, "/orders", &h, r#"{"card":"4242424242424242"}"#).await;
    post(proxy.addr, "/orders", &h, r#"{"card":"4242424242424242"}"#).await;
    wait_until(
        || proxy.log().matches("outcome=replayed").count() == 1,
        "two access lines",
    );
    let log = proxy.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("access")).collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(
        lines[0].contains("route=keyed")
            && lines[0].contains("outcome=executed")
            && lines[0].contains("status=201"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("key="), "{}", lines[0]);
    for secret in ["very-secret-key-42", "sk_live_zzz", "4242424242424242"] {
        assert!(!log.contains(secret), "{secret} leaked into\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_access_fields() {
    let upstream = start_upstream().await;
    let routes = "routes:\n  - name: keyed\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key }\n";
    let proxy =
        ProxyProcess::start_with_args(upstream.addr, routes, "info", &["--log-format", "json"]);
    post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "json-1")],
        "{}",
    )
    .await;
    wait_until(|| proxy.log().contains("\"outcome\""), "a JSON access line");
    let log = proxy.log();
    let line = log.lines().find(|l| l.contains("\"outcome\"")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(line).expect("one JSON object per line");
    assert_eq!(doc["target"], "access");
    assert_eq!(doc["fields"]["outcome"], "executed");
    assert_eq!(doc["fields"]["route"], "keyed");
    assert_eq!(doc["fields"]["status"], 201);
    assert!(
        !log.contains("json-1"),
        "the client key never reaches the log"
    );
}

/// Every log line a request causes runs in its span, so a warning deep in the protected
/// path names the request's method, route and key prefix; written to a file, logs carry
/// no colour codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warning_inside_a_request_names_its_route_and_key() {
    let upstream = start_upstream().await;
    let routes = "routes:\n  - name: keyed\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key }\n";
    let proxy = ProxyProcess::start_logging(upstream.addr, routes, "info");
    let broken = [("idempotency-key", "broken"), ("x-test-reset", "1")];
    assert_eq!(
        post(proxy.addr, "/orders", &broken, "{}").await.status,
        StatusCode::BAD_GATEWAY
    );
    wait_until(
        || proxy.log().contains("outcome unknown, key held"),
        "the warning",
    );
    let log = proxy.log();
    let line = log
        .lines()
        .find(|l| l.contains("outcome unknown, key held"))
        .unwrap();
    assert!(line.contains("WARN"), "{line}");
    for field in ["request{", "method=POST", "route=keyed", "key="] {
        assert!(line.contains(field), "{field} in {line}");
    }
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a log file: {log:?}"
    );
}

/// `IDEMGATE_LOG=info,access=off` silences the access lines and nothing else: the same
/// requests log their access lines at `info`, none with `access=off`, where the other
/// `info` lines (serving, a reload) still appear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_off_silences_the_access_lines_and_keeps_the_other_info_lines() {
    let upstream = start_upstream().await;
    let routes = "routes:\n  - name: keyed\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key }\n";
    let on = ProxyProcess::start_logging(upstream.addr, routes, "info");
    let off = ProxyProcess::start_logging(upstream.addr, routes, "info,access=off");
    for proxy in [&on, &off] {
        let key = [("idempotency-key", "logged")];
        assert_eq!(
            post(proxy.addr, "/orders", &key, "{}").await.status,
            StatusCode::CREATED
        );
        assert!(post(proxy.addr, "/orders", &key, "{}").await.replayed());
        // Written after the requests' access lines, which each request writes before its
        // answer goes out.
        proxy.signal("HUP");
        wait_until(
            || proxy.log().contains("config reloaded"),
            "the reload log line",
        );
    }
    let logged = on.log();
    assert_eq!(
        logged.matches("outcome=").count(),
        2,
        "at info, one access line per request:\n{logged}"
    );
    let silenced = off.log();
    assert!(
        !silenced.contains("outcome=") && !silenced.contains("access"),
        "no access line with access=off:\n{silenced}"
    );
    assert!(silenced.contains("idemgate serving"), "{silenced}");
    assert!(silenced.contains("config reloaded"), "{silenced}");
}
