//! Operating idemgate: metrics move as requests happen, the admin API inspects and deletes
//! keys, `/readyz` follows the store, `explain` computes the stored digest; signals
//! (`signals.rs`: SIGHUP reloads, SIGTERM drains and keeps the claims of calls still
//! running) and logs (`logs.rs`: access lines never carry a raw key or `Authorization`).

#[path = "../common/mod.rs"]
mod common;

mod logs;
mod rekey;
mod rekey_failures;
mod rekey_payload;
mod signals;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::{post, send, start_proxy_with_admin, start_upstream};
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

/// `GET /keys/{digest}` answers an `ETag` naming the record it shows, and a `DELETE` with
/// `If-Match` deletes only that record: an operator read an answer, someone else purged the
/// key and the retry stored a new one; the stale tag answers 412, nothing is deleted and
/// the next retry replays. The current tag answers 204 and the next retry executes. An
/// `If-Match` that is no entity tag is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_purges_only_the_record_its_if_match_names() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, None).await;
    let headers = [("idempotency-key", "tagged")];
    let digest = common::stored_key(&proxy, "/orders", &headers, b"{}");
    let path = format!("/keys/{digest}");
    let read = || async {
        let answer = send(proxy.admin, Method::GET, &path, &[], "").await;
        assert_eq!(answer.status, StatusCode::OK);
        let tag = answer.headers.get(http::header::ETAG).expect("an ETag");
        tag.to_str().unwrap().to_owned()
    };
    let delete = |if_match: &str| {
        let if_match = if_match.to_owned();
        let path = path.clone();
        async move {
            let fields = [("if-match", if_match.as_str())];
            let fields = if if_match.is_empty() {
                &[][..]
            } else {
                &fields[..]
            };
            send(proxy.admin, Method::DELETE, &path, fields, "").await
        }
    };

    assert!(!post(proxy.addr, "/orders", &headers, "{}").await.replayed());
    let seen = read().await;
    assert_eq!(read().await, seen, "the same record, the same tag");
    assert_eq!(delete("").await.status, StatusCode::NO_CONTENT);
    assert!(!post(proxy.addr, "/orders", &headers, "{}").await.replayed());
    let current = read().await;
    assert_ne!(current, seen, "a new claim's answer has a tag of its own");

    let stale = delete(&seen).await;
    assert_eq!(
        stale.status,
        StatusCode::PRECONDITION_FAILED,
        "{}",
        String::from_utf8_lossy(&stale.body)
    );
    assert!(post(proxy.addr, "/orders", &headers, "{}").await.replayed());
    assert_eq!(
        upstream.executed_for("tagged"),
        2,
        "the new answer was left"
    );
    assert_eq!(delete("not-a-tag").await.status, StatusCode::BAD_REQUEST);

    assert_eq!(delete(&current).await.status, StatusCode::NO_CONTENT);
    assert!(!post(proxy.addr, "/orders", &headers, "{}").await.replayed());
    assert_eq!(upstream.executed_for("tagged"), 3);
}

/// An `If-Match` field sent with no entity tag in it (`If-Match:` from a script whose tag
/// variable was empty) is a list of none, which no record matches (RFC 9110 §13.1.1): 412,
/// nothing deleted, the retry replays. Read as no condition, it deleted the answer and the
/// retry ran the request again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_purge_with_an_if_match_of_no_tag_deletes_nothing() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, None).await;
    let headers = [("idempotency-key", "untagged")];
    let digest = common::stored_key(&proxy, "/orders", &headers, b"{}");
    let path = format!("/keys/{digest}");
    assert!(!post(proxy.addr, "/orders", &headers, "{}").await.replayed());
    for no_tag in ["", " ", ",", " , ,"] {
        let answer = send(
            proxy.admin,
            Method::DELETE,
            &path,
            &[("if-match", no_tag)],
            "",
        )
        .await;
        assert_eq!(
            answer.status,
            StatusCode::PRECONDITION_FAILED,
            "If-Match: {no_tag:?}: {}",
            String::from_utf8_lossy(&answer.body)
        );
    }
    assert!(post(proxy.addr, "/orders", &headers, "{}").await.replayed());
    assert_eq!(upstream.executed_for("untagged"), 1, "the answer was left");
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

/// The admin token is a bearer credential, whose scheme name is case-insensitive (RFC 9110
/// §11.1: `bearer`, `BEARER` are `Bearer`); and the probes answer HEAD as they answer GET
/// (RFC 9110 §9.3.2), with no token, as load balancers send them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reads_the_bearer_scheme_in_any_case_and_answers_head_probes() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, Some("s3cret")).await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let auth = format!("{scheme} s3cret");
        let answer = send(
            proxy.admin,
            Method::GET,
            "/metrics",
            &[("authorization", &auth)],
            "",
        )
        .await;
        assert_eq!(answer.status, StatusCode::OK, "{scheme}");
    }
    for wrong in ["Bearer s3cre", "Basic s3cret", "Bearers3cret", "s3cret"] {
        let answer = send(
            proxy.admin,
            Method::GET,
            "/metrics",
            &[("authorization", wrong)],
            "",
        )
        .await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{wrong}");
    }
    for probe in ["/healthz", "/readyz"] {
        let answer = send(proxy.admin, Method::HEAD, probe, &[], "").await;
        assert_eq!(answer.status, StatusCode::OK, "HEAD {probe}");
        assert!(answer.body.is_empty(), "HEAD {probe}");
    }
}

/// Without a token, an admin listener off loopback (`0.0.0.0`, as probes from a kubelet
/// need) still answers its probes and key states, but deletes no key: a purge lets the
/// key's request run again, which only the token's holder, or someone on the host with a
/// loopback listener, may ask for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_listener_off_loopback_without_a_token_deletes_no_key() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, None).await;
    let headers = [("idempotency-key", "open-1")];
    let body = r#"{"sku":"A1"}"#;
    post(proxy.addr, "/orders", &headers, body).await;
    let digest = common::stored_key(&proxy, "/orders", &headers, body.as_bytes());
    let path = format!("/keys/{digest}");
    let wildcard = [("if-match", "*")];

    let open = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = open.local_addr().unwrap().port();
    tokio::spawn(idemgate::server::serve_admin(
        open,
        proxy.proxy.clone(),
        None,
        std::future::pending(),
    ));
    let open: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let refused = send(open, Method::DELETE, &path, &wildcard, "").await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{:?}", refused.body);
    assert_eq!(
        send(open, Method::GET, "/healthz", &[], "").await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(open, Method::GET, &path, &[], "").await.status,
        StatusCode::OK
    );
    assert!(post(proxy.addr, "/orders", &headers, body).await.replayed());
    assert_eq!(upstream.executed(), 1);

    // On loopback, the same purge is the support tool it is meant to be.
    let purged = send(proxy.admin, Method::DELETE, &path, &wildcard, "").await;
    assert_eq!(purged.status, StatusCode::NO_CONTENT);
    assert!(!post(proxy.addr, "/orders", &headers, body).await.replayed());
    assert_eq!(upstream.executed(), 2);
}

/// A reload that rotates the admin token (a leaked one, say) takes effect at once: the
/// old token is refused and the new one admitted, on the listener the config names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_rotates_the_admin_token() {
    let upstream = start_upstream().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = listener.local_addr().unwrap();
    let config = |token: &str| {
        format!(
            "listen: 127.0.0.1:0\nupstream: http://{}\nadmin: {{ listen: \"{admin}\", token: {token} }}\n",
            upstream.addr
        )
    };
    let proxy = common::start_proxy_from(&config("old-token"), None).await;
    tokio::spawn(idemgate::server::serve_admin(
        listener,
        proxy.proxy.clone(),
        Some("old-token".to_owned()),
        std::future::pending(),
    ));
    let metrics = |token: &'static str| async move {
        let auth = format!("Bearer {token}");
        send(
            admin,
            Method::GET,
            "/metrics",
            &[("authorization", &auth)],
            "",
        )
        .await
        .status
    };
    assert_eq!(metrics("old-token").await, StatusCode::OK);
    let text = config("new-token");
    let new = idemgate::config::Config::parse(&text, "test.yaml").unwrap();
    proxy.proxy.reload(std::sync::Arc::new(new));
    assert_eq!(metrics("old-token").await, StatusCode::UNAUTHORIZED);
    assert_eq!(metrics("new-token").await, StatusCode::OK);
    // A reload that rotates the token and moves the listener (a restart-only change) takes
    // the leaked token away from the listener still running, too.
    let moved = text
        .replace(&admin.to_string(), "127.0.0.1:1")
        .replace("new-token", "third-token");
    let moved = idemgate::config::Config::parse(&moved, "test.yaml").unwrap();
    proxy.proxy.reload(std::sync::Arc::new(moved));
    assert_eq!(metrics("new-token").await, StatusCode::UNAUTHORIZED);
    assert_eq!(metrics("third-token").await, StatusCode::OK);
    // One that moves it and names no token does not open the listener still running.
    let open = config("third-token")
        .replace(&admin.to_string(), "127.0.0.1:1")
        .replace(", token: third-token", "");
    let open = idemgate::config::Config::parse(&open, "test.yaml").unwrap();
    proxy.proxy.reload(std::sync::Arc::new(open));
    let bare = send(admin, Method::GET, "/metrics", &[], "").await.status;
    assert_eq!(bare, StatusCode::UNAUTHORIZED);
}
