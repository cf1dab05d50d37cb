//! One-time tokens on a Redis shared by replicas: anyone may ask for one, and a made-up
//! `Authorization` is a new caller, so the per-caller rate bounds no total. One client
//! address gets at most `tokens.rate_per_address` a window, and all callers together at
//! most `tokens.budget` (one counter every replica shares): the token records Redis holds
//! stay within that budget however many addresses ask, and past it issuing answers `503`
//! (counted) while claims and replays go on.

use http::StatusCode;

use crate::common::redis_server::RedisServer;
use crate::common::{post, raw_exchange_from, start_proxy, start_upstream, ProxyHandle};

/// A token request as raw HTTP/1.1 from `source` (a loopback address of its own is a
/// client address of its own), as `caller`: the answer's head and body.
async fn token_from(proxy: &ProxyHandle, source: &str, caller: &str) -> String {
    let request = format!(
        "POST /.idemgate/token HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: {caller}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    raw_exchange_from(source, proxy.addr, request.as_bytes()).await
}

/// The status of each answer to `count` made-up callers asking from `source`.
async fn flood(proxy: &ProxyHandle, source: &str, count: usize) -> Vec<String> {
    let mut statuses = Vec::new();
    for i in 0..count {
        let answer = token_from(proxy, source, &format!("Bearer {source}-{i}")).await;
        statuses.push(answer.get(9..12).unwrap_or(&answer).to_owned());
    }
    statuses
}

/// The token records Redis holds (`t:{<digest>}`; rate counters are `t:rate:{…}`).
fn token_records(redis: &RedisServer) -> usize {
    redis
        .cli(&["KEYS", "t:{*"])
        .lines()
        .filter(|l| !l.is_empty())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_budget_bounds_the_token_records_redis_holds() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let yaml = format!(
        "store:\n  redis: {{ url: \"{}\", prefix: \"t:\" }}\ntokens: {{ rate_per_address: 4, budget: 6 }}\nroutes:\n  - name: create-order\n    match: {{ methods: [POST], path: /orders }}\n    key: {{ header: Idempotency-Key, required: true }}\n",
        redis.url()
    );
    let proxy = start_proxy(upstream.addr, &yaml).await;
    let order = [("authorization", "Bearer alice"), ("idempotency-key", "o1")];
    let first = post(proxy.addr, "/orders", &order, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);

    // One address: its share, then 429 whoever it claims to be.
    assert_eq!(
        flood(&proxy, "127.0.0.1", 6).await,
        ["201", "201", "201", "201", "429", "429"]
    );
    let limited = token_from(&proxy, "127.0.0.1", "Bearer yet-another").await;
    assert!(limited.contains("retry-after: 60"), "{limited}");
    assert!(
        limited.contains("urn:idemgate:problem:rate-limited"),
        "{limited}"
    );
    // Other addresses: what is left of the budget, then 503 for everyone.
    assert_eq!(
        flood(&proxy, "127.0.0.2", 4).await,
        ["201", "201", "503", "503"]
    );
    let spent = token_from(&proxy, "127.0.0.3", "Bearer newcomer").await;
    assert!(spent.starts_with("HTTP/1.1 503"), "{spent}");
    assert!(
        spent.contains("urn:idemgate:problem:store-unavailable"),
        "{spent}"
    );
    assert!(spent.contains("application/problem+json"), "{spent}");
    assert_eq!(
        token_records(&redis),
        6 + 1,
        "six tokens and alice's answer"
    );
    assert_eq!(proxy.metric("idemgate_store_tokens_refused_total"), 3.0);

    // The budget costs no one a claim nor a replay.
    let again = post(proxy.addr, "/orders", &order, "{}").await;
    assert!(again.replayed());
    let second = [("authorization", "Bearer bob"), ("idempotency-key", "o2")];
    assert_eq!(
        post(proxy.addr, "/orders", &second, "{}").await.status,
        StatusCode::CREATED
    );
    assert_eq!(upstream.executed(), 2);
}

/// A token handed back after a failed attempt keeps the expiry it was issued with: failing
/// an attempt now and then never keeps a token alive past `tokens.ttl`, so the budget
/// still bounds the tokens Redis holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_handed_back_keeps_the_expiry_it_was_issued_with() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let yaml = format!(
        "store:\n  redis: {{ url: \"{}\", prefix: \"t:\" }}\ntokens: {{ ttl: 10s }}\nroutes:\n  - name: pay\n    match: {{ methods: [POST], path: /orders/pay }}\n    key: {{ token: {{}} }}\n",
        redis.url()
    );
    let proxy = start_proxy(upstream.addr, &yaml).await;
    let alice = [("authorization", "Bearer alice")];
    let issued = post(proxy.addr, "/.idemgate/token", &alice, "").await;
    assert_eq!(issued.status, StatusCode::CREATED);
    let token = issued.json()["token"].as_str().unwrap().to_owned();
    let headers = |status| {
        [
            ("authorization", "Bearer alice"),
            ("idempotency-token", token.as_str()),
            ("x-test-status", status),
        ]
    };
    // Time passes before the attempt: its hand-back must not give that time back.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let failed = post(proxy.addr, "/orders/pay", &headers("503"), "{}").await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    let names = redis.cli(&["KEYS", "t:{*"]);
    let name = names
        .lines()
        .find(|l| !l.is_empty())
        .expect("the token's record");
    let left: u64 = redis.cli(&["PTTL", name]).trim().parse().unwrap();
    assert!(
        left <= 8600,
        "handed back for {left} ms: the token was issued for 10 s, 1.5 s before"
    );
    // Still the caller's to spend until then.
    let retry = post(proxy.addr, "/orders/pay", &headers("201"), "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(upstream.executed(), 2);
}

/// Starts a proxy on `redis` with one token route, `/orders/pay`, and `tokens.ttl` of
/// `ttl`; issues alice a token: the proxy and the token.
async fn token_route(
    redis: &RedisServer,
    upstream: std::net::SocketAddr,
    ttl: &str,
) -> (ProxyHandle, String) {
    let yaml = format!(
        "store:\n  redis: {{ url: \"{}\", prefix: \"t:\" }}\ntokens: {{ ttl: {ttl} }}\nroutes:\n  - name: pay\n    match: {{ methods: [POST], path: /orders/pay }}\n    key: {{ token: {{}} }}\n",
        redis.url()
    );
    let proxy = start_proxy(upstream, &yaml).await;
    let alice = [("authorization", "Bearer alice")];
    let issued = post(proxy.addr, "/.idemgate/token", &alice, "").await;
    assert_eq!(issued.status, StatusCode::CREATED);
    let token = issued.json()["token"].as_str().unwrap().to_owned();
    (proxy, token)
}

/// The name of the one token record Redis holds.
fn token_record(redis: &RedisServer) -> String {
    let names = redis.cli(&["KEYS", "t:{*"]);
    names
        .lines()
        .find(|l| !l.is_empty())
        .expect("the token's record")
        .to_owned()
}

/// A failure's answer (up to `max_answer`) is kept for its waiters' linger like any other
/// key's, never for the rest of a handed-back token's life: with more than the linger
/// left, the record that keeps the token spendable holds no body from the moment it is
/// written (the failure's waiters are told their owner failed without it), and the token
/// still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_back_tokens_failure_body_lives_only_its_linger() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let (proxy, token) = token_route(&redis, upstream.addr, "60s").await;
    let headers = |status| {
        [
            ("authorization", "Bearer alice"),
            ("idempotency-token", token.as_str()),
            ("x-test-status", status),
            ("x-test-bytes", "1048576"),
        ]
    };
    let failed = post(proxy.addr, "/orders/pay", &headers("503"), "{}").await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    // Written before the client is answered: kept a whole minute with the token, the body
    // would be there now.
    let len: u64 = redis
        .cli(&["STRLEN", &token_record(&redis)])
        .trim()
        .parse()
        .unwrap();
    assert!(len < 1024, "the token's record holds {len} bytes");
    let retry = post(proxy.addr, "/orders/pay", &headers("201"), "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(upstream.executed(), 2);
}

/// A token handed back with a failure less than the failure's linger (5 s) before its
/// expiry is not spendable after that expiry, though the failure's waiters have the
/// linger to collect it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_handed_back_with_a_failure_is_not_spent_after_its_expiry() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    // Under the linger, so the failure's record keeps the token. A second or more on
    // either side: load can neither make the failing attempt find the token expired (a
    // 400 where the 503 is due) nor easily push the retry past the linger (where it could
    // no longer tell a token kept by the linger).
    let (proxy, token) = token_route(&redis, upstream.addr, "3s").await;
    let issued = tokio::time::Instant::now();
    let headers = |status| {
        [
            ("authorization", "Bearer alice"),
            ("idempotency-token", token.as_str()),
            ("x-test-status", status),
        ]
    };
    let failed = post(proxy.addr, "/orders/pay", &headers("503"), "{}").await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    // A second past the token's expiry as issued (3 s), a second or more within the
    // failure's linger (5 s from the failure, which came after the issue).
    tokio::time::sleep_until(issued + std::time::Duration::from_secs(4)).await;
    let late = post(proxy.addr, "/orders/pay", &headers("201"), "{}").await;
    assert_eq!(late.status, StatusCode::BAD_REQUEST);
    assert!(
        String::from_utf8_lossy(&late.body).contains("token-invalid"),
        "{}",
        String::from_utf8_lossy(&late.body)
    );
    assert_eq!(upstream.executed(), 1);
}
