//! The classic idempotency playbook as route rules — one-time tokens, a freshness window,
//! caller serial numbers, message redelivery — each against the memory store and Redis;
//! `token_endpoint` holds the endpoint's checks beyond one route's tokens, `fresh_held_body`
//! a timestamp header whose body comes late.

#[path = "../common/mod.rs"]
mod common;

mod fresh_held_body;
mod token_endpoint;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::redis_server::RedisServer;
use common::{post, start_proxy, start_upstream, Answer, ProxyHandle, Upstream};
use http::StatusCode;

const ROUTES: &str = r#"
tokens: { ttl: 5m, rate: 5, window: 1m }
routes:
  - name: pay
    match: { methods: [POST], path: /orders/pay }
    key: { token: { header: Idempotency-Token } }
  - name: pay-short
    match: { methods: [POST], path: /orders/pay-short }
    key: { token: {} }
  - name: fresh-header
    match: { methods: [POST], path: /orders/fresh }
    key: { header: Idempotency-Key }
    fresh: { header: X-Timestamp, max_age: 5m, skew: 30s }
  - name: fresh-field
    match: { methods: [POST], path: /orders/fresh-body }
    key: { fingerprint: { body: true } }
    fresh: { field: /ts, max_age: 5m, skew: 30s }
  - name: fresh-short-key
    match: { methods: [POST], path: /orders/fresh-short-key }
    key: { fingerprint: { body: true } }
    ttl: 3s
    fresh: { field: /ts, max_age: 5m, skew: 1s }
  - name: fresh-short-header
    match: { methods: [POST], path: /orders/fresh-short-header }
    key: { header: Idempotency-Key, required: true }
    ttl: 3s
    fresh: { header: X-Timestamp, max_age: 5m, skew: 1s }
  - name: serial
    match: { methods: [POST], path: /orders/serial }
    key: { header: X-Serial, required: true, scope: [header: X-Caller-Id, caller] }
  - name: repayment-callback
    match: { methods: [POST], path: /orders/callbacks/repayment }
    key: { fields: [/alipayNo, /paymentOrderNo] }
    ttl: 30d
"#;

/// The store half of the config, and whatever must live as long as the test.
async fn setup(redis: bool, extra: &str) -> (Upstream, ProxyHandle, Option<RedisServer>) {
    let server = redis.then(RedisServer::start);
    let store = match &server {
        Some(s) => format!("store:\n  redis: {{ url: \"{}\" }}\n", s.url()),
        None => String::new(),
    };
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &format!("{store}{extra}{ROUTES}")).await;
    (upstream, proxy, server)
}

/// Runs a check once with the memory store and once with Redis.
macro_rules! against_both_stores {
    ($($name:ident),+ $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(false).await;
                }
            )+
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(true).await;
                }
            )+
        }
    };
}

against_both_stores!(
    a_token_is_used_once_and_its_repeats_replay,
    foreign_unknown_malformed_and_expired_tokens_get_the_same_400,
    concurrent_uses_of_one_token_execute_once,
    token_requests_are_rate_limited_per_caller,
    a_failed_attempt_gives_the_token_back,
    an_attempt_no_connection_took_in_time_gives_the_token_back,
    freshness_refuses_stale_future_and_unreadable_timestamps,
    a_captured_request_is_refused_once_its_key_has_expired,
    caller_serials_are_keyed_per_caller,
    redelivered_notices_apply_once_and_get_the_first_answer,
);

async fn new_token(proxy: &ProxyHandle, caller: &str) -> Answer {
    post(
        proxy.addr,
        "/.idemgate/token",
        &[("authorization", caller)],
        "",
    )
    .await
}

async fn token_for(proxy: &ProxyHandle, caller: &str) -> String {
    let a = new_token(proxy, caller).await;
    assert_eq!(
        a.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    assert_eq!(a.headers["cache-control"], "no-store");
    let doc = a.json();
    assert_eq!(doc["header"], "idempotency-token");
    assert_eq!(doc["expires_in"], 300);
    doc["token"].as_str().unwrap().to_owned()
}

async fn pay(proxy: &ProxyHandle, caller: &str, token: &str, body: &str) -> Answer {
    post(
        proxy.addr,
        "/orders/pay",
        &[("authorization", caller), ("idempotency-token", token)],
        body,
    )
    .await
}

/// The token endpoint reads no body: one sent with a token request ends the connection,
/// so whether a request pipelined behind it is read never depends on how much had arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_request_with_a_body_ends_its_connection() {
    let (_upstream, proxy, _server) = setup(false, "").await;
    let request = b"POST /.idemgate/token HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer a\r\ncontent-length: 5\r\n\r\nhelloGET /after HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n";
    let answer = common::raw_exchange(proxy.addr, request).await;
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
}

async fn a_token_is_used_once_and_its_repeats_replay(redis: bool) {
    let (upstream, proxy, _server) = setup(redis, "").await;
    let token = token_for(&proxy, "Bearer alice").await;
    assert_eq!(token.len(), 32);
    let first = pay(&proxy, "Bearer alice", &token, r#"{"amount":5}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    let again = pay(&proxy, "Bearer alice", &token, r#"{"amount":5}"#).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    let other_payload = pay(&proxy, "Bearer alice", &token, r#"{"amount":6}"#).await;
    assert_eq!(other_payload.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.executed(), 1);
}

async fn foreign_unknown_malformed_and_expired_tokens_get_the_same_400(redis: bool) {
    let (upstream, proxy, _server) = setup(redis, "").await;
    let alices = token_for(&proxy, "Bearer alice").await;
    let foreign = pay(&proxy, "Bearer bob", &alices, "{}").await;
    let unknown = pay(&proxy, "Bearer alice", &"0".repeat(32), "{}").await;
    let malformed = pay(&proxy, "Bearer alice", "not-a-token", "{}").await;
    for a in [&foreign, &unknown, &malformed] {
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
        assert_eq!(a.json()["type"], "urn:idemgate:problem:token-invalid");
        assert_eq!(
            a.body, foreign.body,
            "one answer for every case: nothing is revealed"
        );
    }
    assert_eq!(upstream.executed(), 0);
    // Bob's failed attempt did not spend Alice's token.
    assert_eq!(
        pay(&proxy, "Bearer alice", &alices, "{}").await.status,
        StatusCode::CREATED
    );

    // A proxy whose tokens live 200 ms, on a store of the same kind.
    let server = redis.then(RedisServer::start);
    let store = server.as_ref().map_or(String::new(), |s| {
        format!("store:\n  redis: {{ url: \"{}\" }}\n", s.url())
    });
    let short = start_proxy(
        upstream.addr,
        &format!("{store}tokens: {{ ttl: 200ms }}\nroutes:\n  - name: pay\n    match: {{ path: /orders/pay }}\n    key: {{ token: {{}} }}\n"),
    )
    .await;
    let token = token_for_ttl(&short, "Bearer carol").await;
    tokio::time::sleep(Duration::from_millis(600)).await; // three TTLs: certainly expired
    let expired = pay(&short, "Bearer carol", &token, "{}").await;
    assert_eq!(expired.status, StatusCode::BAD_REQUEST);
    assert_eq!(expired.body, foreign.body);
    assert_eq!(upstream.executed(), 1, "only alice's own use ran");
}

async fn token_for_ttl(proxy: &ProxyHandle, caller: &str) -> String {
    let a = new_token(proxy, caller).await;
    assert_eq!(a.status, StatusCode::CREATED);
    a.json()["token"].as_str().unwrap().to_owned()
}

/// The use that consumed the token is held at the upstream's gate until the proxy reports
/// the other 99 parked waiting for it: each meets it in flight (none merely replays a
/// finished answer), and one forwarded would be held at the gate too and counted.
async fn concurrent_uses_of_one_token_execute_once(redis: bool) {
    let (upstream, proxy, _server) = setup(redis, "defaults: { wait_timeout: 30s }\n").await;
    let token = token_for(&proxy, "Bearer alice").await;
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (addr, token) = (proxy.addr, token.clone());
        tasks.push(tokio::spawn(async move {
            post(
                addr,
                "/orders/pay",
                &[
                    ("authorization", "Bearer alice"),
                    ("idempotency-token", &token),
                    ("x-test-gate", "token"),
                ],
                "{}",
            )
            .await
        }));
    }
    upstream.arrived("token", 1).await;
    proxy.metric_reaches("idemgate_waiting", 99.0).await;
    upstream.open("token");
    let mut replayed = 0;
    for t in tasks {
        let a = t.await.unwrap();
        assert_eq!(
            a.status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&a.body)
        );
        replayed += usize::from(a.replayed());
    }
    assert_eq!(upstream.executed(), 1);
    assert_eq!(replayed, 99);
}

async fn token_requests_are_rate_limited_per_caller(redis: bool) {
    let (_upstream, proxy, _server) = setup(redis, "").await;
    for _ in 0..5 {
        assert_eq!(
            new_token(&proxy, "Bearer alice").await.status,
            StatusCode::CREATED
        );
    }
    let limited = new_token(&proxy, "Bearer alice").await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers["retry-after"], "60");
    assert_eq!(limited.json()["type"], "urn:idemgate:problem:rate-limited");
    assert_eq!(
        new_token(&proxy, "Bearer bob").await.status,
        StatusCode::CREATED,
        "per caller"
    );
}

async fn a_failed_attempt_gives_the_token_back(redis: bool) {
    let (upstream, proxy, _server) = setup(redis, "").await;
    let token = token_for(&proxy, "Bearer alice").await;
    let failed = post(
        proxy.addr,
        "/orders/pay",
        &[
            ("authorization", "Bearer alice"),
            ("idempotency-token", &token),
            ("x-test-status", "503"),
        ],
        "{}",
    )
    .await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    let retry = pay(&proxy, "Bearer alice", &token, "{}").await;
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "the token is usable again after a 5xx"
    );
    assert!(!retry.replayed());
    assert!(pay(&proxy, "Bearer alice", &token, "{}").await.replayed());
    assert_eq!(upstream.executed(), 2);
}

/// The only upstream connection is busy (a request held at a gate) until the token's
/// attempt gives up at its `upstream_timeout`: nothing was sent, so it gets a 502 and its
/// token back, and the retry with the same token executes once.
async fn an_attempt_no_connection_took_in_time_gives_the_token_back(redis: bool) {
    let extra = "connections: { max_upstream: 1 }\ndefaults: { upstream_timeout: 1s }\n";
    let (upstream, proxy, _server) = setup(redis, extra).await;
    let token = token_for(&proxy, "Bearer alice").await;
    let addr = proxy.addr;
    // Its client gets a 504 at 1 s; its owner keeps the connection until the gate opens.
    let busy = [
        ("x-serial", "1"),
        ("x-caller-id", "bob"),
        ("x-test-gate", "busy"),
    ];
    let holder = tokio::spawn(async move { post(addr, "/orders/serial", &busy, "{}").await });
    upstream.arrived("busy", 1).await;
    let unsent = pay(&proxy, "Bearer alice", &token, "{}").await;
    assert_eq!(unsent.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        unsent.json()["type"],
        "urn:idemgate:problem:upstream-unreachable"
    );
    assert_eq!(
        upstream.executed(),
        1,
        "only the holder reached the upstream"
    );
    upstream.open("busy");
    holder.await.unwrap();
    // Its repeat waits for the holder's owner and replays its answer: the connection is
    // back in the pool by then.
    let repeat = post(proxy.addr, "/orders/serial", &busy, "{}").await;
    assert!(repeat.replayed());
    let retry = pay(&proxy, "Bearer alice", &token, "{}").await;
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert!(!retry.replayed());
    assert_eq!(upstream.executed(), 2, "the retry executed once");
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

async fn freshness_refuses_stale_future_and_unreadable_timestamps(redis: bool) {
    let (upstream, proxy, _server) = setup(redis, "").await;
    let stamped = |ts: String, key: &'static str| {
        let addr = proxy.addr;
        async move {
            post(
                addr,
                "/orders/fresh",
                &[("x-timestamp", &ts), ("idempotency-key", key)],
                "{}",
            )
            .await
        }
    };
    let now = unix_now();
    assert_eq!(
        stamped(now.to_string(), "s").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        stamped((now * 1000).to_string(), "ms").await.status,
        StatusCode::CREATED
    );
    for (ts, key) in [
        ("946684800".to_owned(), "y2000"),               // far past
        ("4102444800".to_owned(), "y2100"),              // far future
        ("4102444800000".to_owned(), "y2100ms"),         // far future, milliseconds
        ("2000-01-01T00:00:00Z".to_owned(), "rfc-past"), // far past, RFC 3339
        ("yesterday".to_owned(), "garbage"),
    ] {
        let a = stamped(ts.clone(), key).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{ts}");
        assert_eq!(a.json()["type"], "urn:idemgate:problem:stale-request");
    }
    let missing = post(
        proxy.addr,
        "/orders/fresh",
        &[("idempotency-key", "none")],
        "{}",
    )
    .await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    // A fresh stamp put ahead of a captured one the upstream may read instead: refused.
    let repeated = post(
        proxy.addr,
        "/orders/fresh",
        &[
            ("x-timestamp", &now.to_string()),
            ("x-timestamp", "946684800"),
            ("idempotency-key", "repeated"),
        ],
        "{}",
    )
    .await;
    assert_eq!(repeated.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        repeated.json()["type"],
        "urn:idemgate:problem:stale-request"
    );
    assert_eq!(
        upstream.executed(),
        2,
        "refused before the upstream (and the store)"
    );

    let body = |ts: String| format!(r#"{{"ts":{ts},"item":"A"}}"#);
    let fresh = post(
        proxy.addr,
        "/orders/fresh-body",
        &[],
        &body(now.to_string()),
    )
    .await;
    assert_eq!(fresh.status, StatusCode::CREATED);
    let rfc = post(
        proxy.addr,
        "/orders/fresh-body",
        &[],
        &body("\"2000-01-01T00:00:00Z\"".into()),
    )
    .await;
    assert_eq!(rfc.status, StatusCode::BAD_REQUEST);
    let future = post(
        proxy.addr,
        "/orders/fresh-body",
        &[],
        &body("4102444800".into()),
    )
    .await;
    assert_eq!(future.status, StatusCode::BAD_REQUEST);
    assert_eq!(upstream.executed(), 3);
}

fn unix_now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// A stamp is accepted only while the route's key would still catch its repeat: with the
/// key kept 3s and 1s of skew, under 2s old, however long `max_age`. The same bytes sent
/// again once the key has expired are refused, not run a second time.
async fn a_captured_request_is_refused_once_its_key_has_expired(redis: bool) {
    let (upstream, proxy, _server) = setup(redis, "").await;
    let send = |body: String| {
        let addr = proxy.addr;
        async move { post(addr, "/orders/fresh-short-key", &[], &body).await }
    };
    let captured = format!(r#"{{"ts":{},"item":"A"}}"#, unix_now_ms());
    assert_eq!(send(captured.clone()).await.status, StatusCode::CREATED);
    assert!(
        send(captured.clone()).await.replayed(),
        "the key catches it"
    );
    // Time passing is the subject: the answer is kept 3s from its completion.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let late = send(captured).await;
    assert_eq!(late.status, StatusCode::BAD_REQUEST);
    assert_eq!(late.json()["type"], "urn:idemgate:problem:stale-request");
    let detail = late.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("under 2s"), "{detail}");
    assert_eq!(upstream.executed(), 1, "the captured request ran once");

    // Within the window a stamp runs; past it (though under `max_age`) it is refused.
    let recent = format!(r#"{{"ts":{},"item":"B"}}"#, unix_now_ms() - 1_000);
    assert_eq!(send(recent).await.status, StatusCode::CREATED);
    let older = format!(r#"{{"ts":{},"item":"C"}}"#, unix_now_ms() - 2_500);
    assert_eq!(send(older).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(upstream.executed(), 2);
}

async fn caller_serials_are_keyed_per_caller(redis: bool) {
    let (upstream, proxy, _server) = setup(redis, "").await;
    let send = |caller: &'static str, serial: &'static str| {
        let addr = proxy.addr;
        async move {
            post(
                addr,
                "/orders/serial",
                &[("x-caller-id", caller), ("x-serial", serial)],
                "{}",
            )
            .await
        }
    };
    assert!(!send("shop-1", "000417").await.replayed());
    assert!(send("shop-1", "000417").await.replayed());
    assert!(
        !send("shop-2", "000417").await.replayed(),
        "another caller's serial is another key"
    );
    assert!(!send("shop-1", "000418").await.replayed());
    // A client that names shop-1 without being it (another credential) gets a key of its
    // own, never shop-1's answer.
    let impostor = post(
        proxy.addr,
        "/orders/serial",
        &[
            ("x-caller-id", "shop-1"),
            ("x-serial", "000417"),
            ("authorization", "Bearer mallory"),
        ],
        "{}",
    )
    .await;
    assert!(!impostor.replayed());
    assert_eq!(upstream.executed(), 4);
    let missing = post(
        proxy.addr,
        "/orders/serial",
        &[("x-caller-id", "shop-1")],
        "{}",
    )
    .await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
}

async fn redelivered_notices_apply_once_and_get_the_first_answer(redis: bool) {
    let (upstream, proxy, _server) = setup(redis, "").await;
    let mut answers = Vec::new();
    for attempt in 0..5u64 {
        let notice = format!(
            r#"{{"alipayNo":"2026112122001","paymentOrderNo":"PO-9","amount":"88.00","timestamp":{}}}"#,
            1_763_726_400 + attempt * 60
        );
        answers.push(
            post(
                proxy.addr,
                "/orders/callbacks/repayment",
                &[("x-test-status", "200")],
                &notice,
            )
            .await,
        );
    }
    assert!(answers.iter().all(|a| a.status == StatusCode::OK));
    assert!(
        answers.iter().all(|a| a.body == answers[0].body),
        "the first 200 each time"
    );
    assert_eq!(answers.iter().filter(|a| a.replayed()).count(), 4);
    assert_eq!(upstream.executed(), 1, "the app applied the payment once");
}
