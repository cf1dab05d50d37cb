//! Operating idemgate: metrics move as requests happen, the admin API inspects and deletes
//! keys, `/readyz` follows the store, `explain` computes the stored digest, SIGHUP reloads
//! (refusing a broken file), SIGTERM drains and keeps the claims of calls still running,
//! and access logs never carry a raw key or `Authorization` value.

mod common;

use std::time::Duration;

use common::redis_server::{wait_until, RedisServer};
use common::{post, send, start_proxy_with_admin, start_upstream, ProxyProcess};
use http::{Method, StatusCode};

const ROUTES: &str = r#"
defaults: { max_body: 1KiB }
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key }
  - name: quick
    match: { methods: [POST], path: /orders/quick }
    key: { header: Idempotency-Key }
    in_flight: reject
"#;

fn metric(text: &str, route: &str, outcome: &str) -> u64 {
    let needle = format!("idemgate_requests_total{{route=\"{route}\",outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&needle))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_sequence_moves_each_counter() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, Some("s3cret")).await;
    let k = |key: &'static str| [("idempotency-key", key)];
    post(proxy.addr, "/orders", &k("a"), "{}").await; // executed
    post(proxy.addr, "/orders", &k("a"), "{}").await; // replayed
    post(proxy.addr, "/orders", &k("a"), r#"{"x":1}"#).await; // mismatch
    post(proxy.addr, "/orders", &k("bad key"), "{}").await; // rejected (400)
    post(proxy.addr, "/orders", &k("big"), &"x".repeat(2048)).await; // rejected (413)
    post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "e"), ("x-test-status", "503")],
        "{}",
    )
    .await; // released
    post(proxy.addr, "/orders", &[], "{}").await; // unkeyed (key optional)
    send(proxy.addr, Method::GET, "/orders", &[], "").await; // passthrough
                                                             // waited + conflict: two owners held at the upstream, one duplicate parked waiting on
                                                             // one, one duplicate rejected by the other.
    let addr = proxy.addr;
    let held = |path: &'static str, key: &'static str| {
        tokio::spawn(async move {
            post(
                addr,
                path,
                &[("idempotency-key", key), ("x-test-gate", "held")],
                "{}",
            )
            .await
        })
    };
    let (slow, slow2) = (held("/orders/quick", "w"), held("/orders", "w2"));
    upstream.arrived("held", 2).await;
    let conflict = post(addr, "/orders/quick", &k("w"), "{}").await;
    assert_eq!(conflict.status, StatusCode::CONFLICT);
    let waiting = tokio::spawn(async move { post(addr, "/orders", &k("w2"), "{}").await });
    proxy.metric_reaches("idemgate_waiting", 1.0).await;
    upstream.open("held");
    assert!(waiting.await.unwrap().replayed());
    slow.await.unwrap();
    slow2.await.unwrap();

    let unauthorized = send(proxy.admin, Method::GET, "/metrics", &[], "").await;
    assert_eq!(unauthorized.status, StatusCode::UNAUTHORIZED);
    let m = send(
        proxy.admin,
        Method::GET,
        "/metrics",
        &[("authorization", "Bearer s3cret")],
        "",
    )
    .await;
    assert_eq!(m.status, StatusCode::OK);
    let text = String::from_utf8_lossy(&m.body);
    for (route, outcome, expected) in [
        ("orders", "executed", 2),
        ("orders", "replayed", 1),
        ("orders", "mismatch", 1),
        ("orders", "rejected", 2),
        ("orders", "released", 1),
        ("orders", "unkeyed", 1),
        ("orders", "waited", 1),
        ("quick", "executed", 1),
        ("quick", "conflict", 1),
        ("", "passthrough", 1),
    ] {
        assert_eq!(
            metric(&text, route, outcome),
            expected,
            "{route}/{outcome} in\n{text}"
        );
    }
    assert!(text.contains("idemgate_upstream_seconds_bucket{"), "{text}");
    assert!(
        text.contains(r#"idemgate_wait_seconds_count{route="orders"} 1"#),
        "{text}"
    );
    assert!(text.contains("idemgate_in_flight 0"), "{text}");
    assert!(text.contains("idemgate_waiting 0"), "{text}");
    // a, w and w2, and e's failure, kept a few seconds for waiters (it had none).
    assert!(text.contains("idemgate_store_entries 4"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_errors_and_fail_open_are_counted_and_readyz_follows_the_store() {
    let mut redis = RedisServer::start();
    let upstream = start_upstream().await;
    let config = |mode: &str| {
        format!(
            "store:\n  redis: {{ url: \"{}\", timeout: 300ms }}\ndefaults: {{ on_store_error: {mode} }}\n",
            redis.url()
        )
    };
    let closed = start_proxy_with_admin(upstream.addr, &config("fail_closed"), None).await;
    let open = start_proxy_with_admin(upstream.addr, &config("fail_open"), None).await;
    let ready = |admin| async move { send(admin, Method::GET, "/readyz", &[], "").await.status };
    assert_eq!(ready(closed.admin).await, StatusCode::OK);
    redis.kill();
    assert_eq!(ready(closed.admin).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        post(closed.addr, "/x", &[], "{}").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        post(open.addr, "/x", &[], "{}").await.status,
        StatusCode::OK
    );
    let text = |admin| async move {
        String::from_utf8_lossy(&send(admin, Method::GET, "/metrics", &[], "").await.body)
            .into_owned()
    };
    assert_eq!(
        metric(&text(closed.admin).await, "default", "store_error"),
        1
    );
    assert_eq!(metric(&text(open.admin).await, "default", "fail_open"), 1);
    redis.restart();
    let admin = closed.admin;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while ready(admin).await != StatusCode::OK {
        assert!(
            std::time::Instant::now() < deadline,
            "readyz never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_digest_is_the_stored_key_and_admin_can_inspect_and_delete_it() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, Some("support-token")).await;
    let admin_auth = [("authorization", "Bearer support-token")];
    let body = r#"{"sku":"A1"}"#;
    let headers = [
        ("idempotency-key", "support-1"),
        ("authorization", "Bearer alice"),
    ];
    post(proxy.addr, "/orders", &headers, body).await;

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:1\nupstream: http://{}\n{ROUTES}",
            upstream.addr
        ),
    )
    .unwrap();
    let body_file = dir.path().join("body.json");
    std::fs::write(&body_file, body).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["explain", "--config"])
        .arg(&config)
        .args(["--method", "POST", "--path", "/orders"])
        .args([
            "-H",
            "Idempotency-Key: support-1",
            "-H",
            "Authorization: Bearer alice",
            "-H",
            "Host: 127.0.0.1",
            "--body",
        ])
        .arg(&body_file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        !text.contains("alice"),
        "explain never prints scope values: {text}"
    );
    let digest = text
        .lines()
        .find_map(|l| l.strip_prefix("key digest:"))
        .unwrap()
        .trim()
        .to_owned();

    let found = send(
        proxy.admin,
        Method::GET,
        &format!("/keys/{digest}?body=true"),
        &admin_auth,
        "",
    )
    .await;
    assert_eq!(
        found.status,
        StatusCode::OK,
        "explain's digest is the stored key"
    );
    let info = found.json();
    assert_eq!(info["state"], "done");
    assert_eq!(info["status"], 201);
    assert!(info["body"].as_str().unwrap().contains("A1"));
    let short = send(
        proxy.admin,
        Method::GET,
        &format!("/keys/{digest}"),
        &admin_auth,
        "",
    )
    .await
    .json();
    assert!(short.get("body").is_none(), "the body only when asked");

    let deleted = send(
        proxy.admin,
        Method::DELETE,
        &format!("/keys/{digest}"),
        &admin_auth,
        "",
    )
    .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let again = post(proxy.addr, "/orders", &headers, body).await;
    assert!(!again.replayed(), "support let the customer retry");
    assert_eq!(upstream.executed(), 2);
    let bad = send(proxy.admin, Method::GET, "/keys/xyz", &admin_auth, "").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_routes_and_a_broken_file_keeps_the_old_ones() {
    let upstream = start_upstream().await;
    let original = "routes:\n  - name: keyed\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key, required: true }\n";
    let proxy = ProxyProcess::start_logging(upstream.addr, original, "info");
    assert_eq!(
        post(proxy.addr, "/orders", &[], "{}").await.status,
        StatusCode::BAD_REQUEST
    );
    let text = std::fs::read_to_string(&proxy.config).unwrap();
    std::fs::write(&proxy.config, format!("{text}    ttl: never\n")).unwrap();
    proxy.signal("HUP");
    wait_until(
        || proxy.log().contains("reload refused"),
        "the refusal log line",
    );
    let log = proxy.log();
    let line = log.lines().find(|l| l.contains("reload refused")).unwrap();
    assert!(line.contains("proxy.yaml:8:10: routes[0].ttl"), "{line}");
    assert_eq!(
        post(proxy.addr, "/orders", &[], "{}").await.status,
        StatusCode::BAD_REQUEST,
        "old routes serve"
    );
    // A good file takes effect without a restart: the route is now unprotected.
    std::fs::write(
        &proxy.config,
        text.replace(
            "key: { header: Idempotency-Key, required: true }",
            "idempotency: off",
        ),
    )
    .unwrap();
    proxy.signal("HUP");
    wait_until(
        || proxy.log().contains("config reloaded"),
        "the reload log line",
    );
    assert_eq!(
        post(proxy.addr, "/orders", &[], "{}").await.status,
        StatusCode::CREATED
    );
    assert!(!proxy.log().contains("take effect on restart"));
    // What only a restart changes is named, not passed over quietly.
    let routes_only = std::fs::read_to_string(&proxy.config).unwrap();
    std::fs::write(&proxy.config, format!("{routes_only}drain_timeout: 7s\n")).unwrap();
    proxy.signal("HUP");
    wait_until(
        || proxy.log().matches("config reloaded").count() == 2,
        "the second reload log line",
    );
    let log = proxy.log();
    let line = log
        .lines()
        .find(|l| l.contains("take effect on restart"))
        .expect("a warning names the restart-only setting");
    assert!(line.contains("drain_timeout"), "{line}");
    assert!(!line.contains("admin"), "{line}");
}

/// SIGHUP swaps the upstream for the requests that follow, and a client's open keep-alive
/// connection goes on being served across the reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_swaps_the_upstream_and_open_client_connections_stay() {
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioIo;

    let first = start_upstream().await;
    let second = start_upstream().await;
    let proxy = ProxyProcess::start_logging(first.addr, ROUTES, "info");
    let stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let connection = tokio::spawn(conn);
    let order = |key: &str| {
        http::Request::post("/orders")
            .header("host", "127.0.0.1")
            .header("idempotency-key", key)
            .body(Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap()
    };
    let a = sender.send_request(order("before")).await.unwrap();
    assert_eq!(a.status(), StatusCode::CREATED);
    a.into_body().collect().await.unwrap();
    assert_eq!((first.executed(), second.executed()), (1, 0));

    let text = std::fs::read_to_string(&proxy.config).unwrap();
    let swapped = text.replace(&first.addr.to_string(), &second.addr.to_string());
    assert_ne!(swapped, text);
    std::fs::write(&proxy.config, swapped).unwrap();
    proxy.signal("HUP");
    wait_until(
        || proxy.log().contains("config reloaded"),
        "the reload log line",
    );
    sender
        .ready()
        .await
        .expect("the connection outlives the reload");
    let b = sender.send_request(order("after")).await.unwrap();
    assert_eq!(b.status(), StatusCode::CREATED);
    b.into_body().collect().await.unwrap();
    assert_eq!((first.executed(), second.executed()), (1, 1));
    assert!(!connection.is_finished());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_slow_call_finish_and_stores_its_answer() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  redis: {{ url: \"{}\" }}\ndrain_timeout: 20s\nroutes:\n  - name: o\n    match: {{ path: /orders }}\n    key: {{ header: Idempotency-Key }}\n",
        redis.url()
    );
    let mut a = ProxyProcess::start(upstream.addr, &config);
    let b = ProxyProcess::start(upstream.addr, &config);
    let addr = a.addr;
    let slow = tokio::spawn(async move {
        post(
            addr,
            "/orders",
            &[("idempotency-key", "drain"), ("x-test-delay-ms", "800")],
            "{}",
        )
        .await
    });
    while upstream.executed() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.signal("TERM");
    let answer = slow.await.unwrap();
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "the call in progress finished"
    );
    assert!(a.wait_exit().success());
    let retry = post(b.addr, "/orders", &[("idempotency-key", "drain")], "{}").await;
    assert!(retry.replayed(), "its answer was stored before exit");
    assert_eq!(upstream.executed(), 1);
}

/// SIGTERM past the drain: the call still running upstream went out, so its claim is not
/// released. Another replica's retry is told it is in flight, and once the dead process's
/// lease lapsed, that its outcome is unknown; it never executes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_the_drain_keeps_the_claims_of_calls_still_running() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  redis: {{ url: \"{}\" }}\ndrain_timeout: 300ms\ndefaults: {{ lease: 1s, wait_timeout: 200ms }}\nroutes:\n  - name: o\n    match: {{ path: /orders }}\n    key: {{ header: Idempotency-Key }}\n",
        redis.url()
    );
    let mut a = ProxyProcess::start(upstream.addr, &config);
    let b = ProxyProcess::start(upstream.addr, &config);
    let addr = a.addr;
    let stuck = tokio::spawn(async move {
        let client = common::client();
        let request = http::Request::post(format!("http://{addr}/orders"))
            .header("idempotency-key", "stuck")
            .header("x-test-gate", "stuck")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap();
        client.request(request).await
    });
    upstream.arrived("stuck", 1).await;
    a.signal("TERM");
    assert!(a.wait_exit().success());
    let _ = stuck.await;
    assert!(
        a.log().contains("their keys stay claimed"),
        "the exit said so: {}",
        a.log()
    );
    let retry = post(b.addr, "/orders", &[("idempotency-key", "stuck")], "{}").await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let held = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: still in flight"
        );
        let retry = post(b.addr, "/orders", &[("idempotency-key", "stuck")], "{}").await;
        assert_eq!(retry.status, StatusCode::CONFLICT);
        if retry.json()["type"] != "urn:idemgate:problem:in-flight" {
            break retry;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(held.json()["type"], "urn:idemgate:problem:outcome-unknown");
    assert_eq!(upstream.executed_for("stuck"), 1, "never run again");
    upstream.open("stuck");
}

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

/// `GET /keys/{digest}` counts the duplicates waiting on a key in flight: none while only
/// the owner runs, one once a duplicate is parked on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_key_info_counts_the_duplicates_waiting_on_it() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, None).await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [("idempotency-key", "watched"), ("x-test-gate", "owner")];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("owner", 1).await;
    let digest = common::stored_key(&proxy, "/orders", &[("idempotency-key", "watched")], b"{}");
    let info = || async {
        let answer = send(
            proxy.admin,
            Method::GET,
            &format!("/keys/{digest}"),
            &[],
            "",
        )
        .await;
        assert_eq!(answer.status, StatusCode::OK);
        answer.json()
    };
    let alone = info().await;
    assert_eq!(alone["state"], "in_flight", "{alone}");
    assert_eq!(alone["waiters"], 0, "{alone}");

    let duplicate = tokio::spawn(async move {
        post(addr, "/orders", &[("idempotency-key", "watched")], "{}").await
    });
    proxy.metric_reaches("idemgate_waiting", 1.0).await;
    let watched = info().await;
    assert_eq!(watched["state"], "in_flight", "{watched}");
    assert_eq!(watched["waiters"], 1, "{watched}");

    upstream.open("owner");
    assert_eq!(owner.await.unwrap().status, StatusCode::CREATED);
    assert!(duplicate.await.unwrap().replayed());
    assert_eq!(upstream.executed(), 1);
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
