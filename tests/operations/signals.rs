//! SIGHUP reloads (refusing a broken file, swapping the upstream under open connections) and
//! SIGTERM drains, keeping the claims of calls still running.

use std::time::Duration;

use http::StatusCode;

use crate::common::redis_server::{wait_until, RedisServer};
use crate::common::{self, post, start_upstream, ProxyProcess};
use crate::ROUTES;

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
    // The bad line goes right under the route (not at the end of the file, where a test
    // matrix may have added a `connections:` line).
    let key_line = "required: true }\n";
    assert!(text.contains(key_line), "{text}");
    std::fs::write(
        &proxy.config,
        text.replace(key_line, &format!("{key_line}    ttl: never\n")),
    )
    .unwrap();
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

/// A reload that renames a route gives its requests new keys: the reload says so in a
/// warning naming the route and until when the previous keys are honoured, and a retry of
/// a request answered before it is replayed from its previous key, not run again. A reload
/// that changes no key says nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_across_a_reload_that_renames_its_route_is_replayed() {
    let upstream = start_upstream().await;
    let proxy = ProxyProcess::start_logging(upstream.addr, ROUTES, "info");
    let key = [("idempotency-key", "before-rename")];
    assert_eq!(
        post(proxy.addr, "/orders", &key, "{}").await.status,
        StatusCode::CREATED
    );
    let text = std::fs::read_to_string(&proxy.config).unwrap();
    std::fs::write(&proxy.config, format!("{text}drain_timeout: 5s\n")).unwrap();
    proxy.signal("HUP");
    wait_until(
        || proxy.log().contains("config reloaded"),
        "the first reload log line",
    );
    assert!(!proxy.log().contains("re-keys"), "{}", proxy.log());
    std::fs::write(
        &proxy.config,
        text.replace("- name: orders\n", "- name: purchases\n"),
    )
    .unwrap();
    proxy.signal("HUP");
    wait_until(
        || proxy.log().matches("config reloaded").count() == 2,
        "the second reload log line",
    );
    let log = proxy.log();
    let line = log
        .lines()
        .find(|l| l.contains("reload re-keys requests"))
        .unwrap_or_else(|| panic!("no re-key warning in\n{log}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(
        line.contains(r#"route "orders" renamed to "purchases""#)
            && line.contains("the previous keys are honoured until"),
        "{line}"
    );
    assert!(
        !line.contains("quick"),
        "an unchanged route is not named: {line}"
    );
    let retry = post(proxy.addr, "/orders", &key, "{}").await;
    assert!(
        retry.replayed(),
        "the retry was answered from its previous key"
    );
    assert_eq!(upstream.executed_for("before-rename"), 1);
    let found = r#"idemgate_rekeyed_total{route="purchases",found="done"}"#;
    assert_eq!(common::metric(proxy.admin, found).await, 1.0);
    let again = post(proxy.addr, "/orders", &key, "{}").await;
    assert!(again.replayed(), "and from its new key after that");
    assert_eq!(common::metric(proxy.admin, found).await, 1.0);
    assert_eq!(upstream.executed_for("before-rename"), 1);
}

/// A reload warns of what `check` points out, as a start does: a route's scope edited to
/// name no caller lets callers share keys from the moment the file is swapped in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_warns_of_a_scope_that_lets_callers_share_keys() {
    let upstream = start_upstream().await;
    let keyed = "routes:\n  - name: keyed\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key, required: true }\n";
    let proxy = ProxyProcess::start_logging(upstream.addr, keyed, "info");
    let text = std::fs::read_to_string(&proxy.config).unwrap();
    let key_line = "required: true }\n";
    std::fs::write(
        &proxy.config,
        text.replace(key_line, "required: true, scope: [header: X-Tenant] }\n"),
    )
    .unwrap();
    proxy.signal("HUP");
    wait_until(
        || proxy.log().contains("config reloaded"),
        "the reload log line",
    );
    let log = proxy.log();
    let line = log
        .lines()
        .find(|l| l.contains("names no caller"))
        .unwrap_or_else(|| panic!("no warning of the shared scope in\n{log}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("route keyed"), "{line}");
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

/// The call is held at the upstream's gate until the process logged that it is draining,
/// so the SIGTERM always meets it in progress. A second SIGTERM and a Ctrl-C sent then do
/// not cut the drain short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_slow_call_finish_and_stores_its_answer() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  redis: {{ url: \"{}\" }}\ndrain_timeout: 20s\nroutes:\n  - name: o\n    match: {{ path: /orders }}\n    key: {{ header: Idempotency-Key }}\n",
        redis.url()
    );
    let mut a = ProxyProcess::start_logging(upstream.addr, &config, "info");
    let b = ProxyProcess::start(upstream.addr, &config);
    let addr = a.addr;
    let slow = tokio::spawn(async move {
        post(
            addr,
            "/orders",
            &[("idempotency-key", "drain"), ("x-test-gate", "drain")],
            "{}",
        )
        .await
    });
    upstream.arrived("drain", 1).await;
    a.signal("TERM");
    wait_until(
        || a.log().contains("stopping: no new connections, draining"),
        "the drain to start",
    );
    a.signal("TERM");
    a.signal("INT");
    upstream.open("drain");
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
            .header("content-type", "application/json")
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
