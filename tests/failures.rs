//! Exactly once when things fail: an owner whose upstream answers 500 while duplicates
//! wait, an upstream that times out or resets after the request went out, answers too
//! large to store, a full memory store, and a store that fails under a claim (a client
//! gone mid-claim, a reply past the store timeout, a duplicate of a running request on a
//! route that fails open, a completion whose reply was lost). Each test counts the upstream's executions and
//! waits on the upstream's or the proxy's own signals (a request arrived at a gate,
//! duplicates parked waiting), never on a sleep winning a race.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::{post, start_proxy, start_proxy_with_admin, start_upstream, ProxyHandle};
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A header-keyed route `orders` on `/orders`, with `extra` policy keys.
fn route(extra: &str) -> String {
    format!(
        "routes:\n  - name: orders\n    match: {{ methods: [POST], path: /orders }}\n    key: {{ header: Idempotency-Key, required: true }}\n    {extra}\n"
    )
}

fn problem_type(answer: &common::Answer) -> String {
    answer.json()["type"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Sends `n` duplicates of `key` in the background and waits until the proxy reports all
/// of them parked waiting for the owner.
async fn park_duplicates(
    proxy: &ProxyHandle,
    key: &'static str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<common::Answer>> {
    let duplicates = (0..n)
        .map(|_| {
            let addr = proxy.addr;
            tokio::spawn(
                async move { post(addr, "/orders", &[("idempotency-key", key)], "{}").await },
            )
        })
        .collect();
    proxy.metric_reaches("idemgate_waiting", n as f64).await;
    duplicates
}

/// Three clicks on "pay" against an upstream that answers 500 after a partial commit:
/// the duplicates that were waiting get the owner's 500 (marked as a replay), never a
/// turn of their own. Only a request that comes after it executes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_waiting_on_a_failing_owner_share_its_500_and_do_not_execute() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &route("wait_timeout: 30s")).await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [
            ("idempotency-key", "pay"),
            ("x-test-gate", "pay"),
            ("x-test-status", "500"),
        ];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("pay", 1).await;
    let duplicates = park_duplicates(&proxy, "pay", 5).await;
    upstream.open("pay");
    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::INTERNAL_SERVER_ERROR);
    for duplicate in duplicates {
        let duplicate = duplicate.await.unwrap();
        assert_eq!(duplicate.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(duplicate.replayed(), "the owner's failure, shared");
        assert_eq!(duplicate.body, owner.body);
    }
    assert_eq!(upstream.executed(), 1, "the waiting duplicates ran nothing");
    assert_eq!(
        proxy.metric(r#"idemgate_requests_total{route="orders",outcome="failure_shared"}"#),
        5.0
    );

    // A retry after the failure is a new attempt.
    let later = post(proxy.addr, "/orders", &[("idempotency-key", "pay")], "{}").await;
    assert_eq!(later.status, StatusCode::CREATED);
    assert!(!later.replayed());
    assert_eq!(upstream.executed(), 2);
}

/// `upstream_timeout` passes while the upstream still works: the client gets a 504, the
/// owner keeps waiting in the background, and a retry meanwhile does not execute again;
/// once the answer comes it is stored, and the retry gets it replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_request_is_not_run_again_and_its_late_answer_is_replayed() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &route("upstream_timeout: 300ms\n    background_timeout: 60s\n    wait_timeout: 100ms"),
    )
    .await;
    let first = [("idempotency-key", "late"), ("x-test-gate", "late")];
    let timed_out = post(proxy.addr, "/orders", &first, "{}").await;
    assert_eq!(timed_out.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        problem_type(&timed_out),
        "urn:idemgate:problem:upstream-timeout"
    );
    upstream.arrived("late", 1).await;

    // While the first still runs, the retry waits, then hears it is in progress.
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "late")], "{}").await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert_eq!(problem_type(&retry), "urn:idemgate:problem:in-flight");
    assert_eq!(upstream.executed(), 1);

    upstream.open("late");
    let replayed = retry_until(&proxy, "late", |a| a.status != StatusCode::CONFLICT).await;
    assert_eq!(replayed.status, StatusCode::CREATED);
    assert!(replayed.replayed());
    assert_eq!(replayed.json()["n"], 1, "the first execution's answer");
    assert_eq!(upstream.executed(), 1);
}

/// Retries `key` (each is answered at once or after a short wait) until `done` says so.
async fn retry_until(
    proxy: &ProxyHandle,
    key: &str,
    done: impl Fn(&common::Answer) -> bool,
) -> common::Answer {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let answer = post(proxy.addr, "/orders", &[("idempotency-key", key)], "{}").await;
        if done(&answer) {
            return answer;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: {key} never settled"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// An upstream that takes the request and never answers: past `background_timeout` the
/// key is held as an unknown outcome, counted, and every retry gets that problem instead
/// of a second execution, until an operator purges the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_never_answers_leaves_the_key_held_as_unknown() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(
        upstream.addr,
        &route("upstream_timeout: 200ms\n    background_timeout: 400ms\n    wait_timeout: 50ms"),
        Some("admin-token"),
    )
    .await;
    let first = [("idempotency-key", "lost"), ("x-test-gate", "never")];
    let timed_out = post(proxy.addr, "/orders", &first, "{}").await;
    assert_eq!(timed_out.status, StatusCode::GATEWAY_TIMEOUT);
    let held = retry_until(&proxy, "lost", |a| {
        problem_type(a) != "urn:idemgate:problem:in-flight"
    })
    .await;
    assert_eq!(held.status, StatusCode::CONFLICT);
    assert_eq!(problem_type(&held), "urn:idemgate:problem:outcome-unknown");
    assert_eq!(upstream.executed(), 1);
    assert_eq!(
        proxy.metric(r#"idemgate_unknown_outcomes_total{route="orders"}"#),
        1.0
    );

    // Support checked what happened and purges the key: the next retry executes.
    let digest = common::stored_key(&proxy, "/orders", &[("idempotency-key", "lost")], b"{}");
    let purge = common::send(
        proxy.admin,
        Method::DELETE,
        &format!("/keys/{digest}"),
        &[("authorization", "Bearer admin-token")],
        "",
    )
    .await;
    assert_eq!(purge.status, StatusCode::NO_CONTENT);
    let after = post(proxy.addr, "/orders", &[("idempotency-key", "lost")], "{}").await;
    assert_eq!(after.status, StatusCode::CREATED);
    assert_eq!(upstream.executed(), 2);
}

/// An upstream that reads the request and breaks the connection without an answer may
/// have executed it: the client gets a 502, and the key is held (no retry executes); with
/// `on_unknown_outcome: release` the retry executes, as the operator chose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_after_sending_holds_the_key_unless_release_is_configured() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &route("wait_timeout: 100ms")).await;
    let reset = [("idempotency-key", "reset"), ("x-test-reset", "1")];
    let broken = post(proxy.addr, "/orders", &reset, "{}").await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        problem_type(&broken),
        "urn:idemgate:problem:upstream-failed"
    );
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "reset")], "{}").await;
    assert_eq!(problem_type(&retry), "urn:idemgate:problem:outcome-unknown");
    assert_eq!(upstream.executed(), 1);
    // README Metrics: the owner's 502 after sending is `unknown`, the repeat of that
    // unknown outcome `held`, as `/metrics` on the admin listener shows them.
    let metrics = common::metrics_text(proxy.admin).await;
    let series = |outcome: &str| {
        common::metric_in(
            &metrics,
            &format!(r#"idemgate_requests_total{{route="orders",outcome="{outcome}"}}"#),
        )
    };
    assert_eq!(series("unknown"), 1.0, "{metrics}");
    assert_eq!(series("held"), 1.0, "{metrics}");
    assert_eq!(series("executed"), 0.0, "{metrics}");

    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &route("on_unknown_outcome: release")).await;
    let broken = post(proxy.addr, "/orders", &reset, "{}").await;
    assert_eq!(broken.status, StatusCode::BAD_GATEWAY);
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "reset")], "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(upstream.executed(), 2);
}

/// An answer over `max_answer` streams to its client whole, and the key records
/// "executed, answer not stored": the duplicates that waited and every later repeat get
/// that problem, and nothing executes twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_too_large_to_store_streams_and_its_repeats_never_execute() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &route("max_answer: 64KiB\n    wait_timeout: 30s"),
    )
    .await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [
            ("idempotency-key", "big"),
            ("x-test-gate", "big"),
            ("x-test-bytes", "1048576"),
        ];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("big", 1).await;
    let duplicates = park_duplicates(&proxy, "big", 3).await;
    upstream.open("big");
    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::CREATED);
    assert_eq!(owner.body.len(), 1 << 20, "streamed whole");
    assert!(owner.body.iter().all(|b| *b == b'x'));
    for duplicate in duplicates {
        let duplicate = duplicate.await.unwrap();
        assert_eq!(duplicate.status, StatusCode::CONFLICT);
        assert_eq!(
            problem_type(&duplicate),
            "urn:idemgate:problem:answer-not-stored"
        );
    }
    let later = post(proxy.addr, "/orders", &[("idempotency-key", "big")], "{}").await;
    assert_eq!(
        problem_type(&later),
        "urn:idemgate:problem:answer-not-stored"
    );
    assert!(later.json()["detail"].as_str().unwrap().contains("201"));
    assert_eq!(upstream.executed(), 1);
    // README Metrics: the owner is `executed_not_stored`, each of the three duplicates
    // that waited and the later repeat `not_stored`; none of them `executed`.
    let metrics = common::metrics_text(proxy.admin).await;
    let series = |outcome: &str| {
        common::metric_in(
            &metrics,
            &format!(r#"idemgate_requests_total{{route="orders",outcome="{outcome}"}}"#),
        )
    };
    assert_eq!(series("executed_not_stored"), 1.0, "{metrics}");
    assert_eq!(series("not_stored"), 4.0, "{metrics}");
    assert_eq!(series("executed"), 0.0, "{metrics}");
}

/// A memory store full of live records evicts the ones closest to expiry, and each
/// eviction is counted by the evicted record's route; with `when_full: reject` a new key
/// gets a 503 instead and every stored answer stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_counts_its_evictions_or_refuses_new_keys() {
    let upstream = start_upstream().await;
    let store = |when_full: &str| {
        format!(
            "store:\n  memory: {{ max_entries: 4, when_full: {when_full} }}\n{}",
            route("")
        )
    };
    let proxy = start_proxy(upstream.addr, &store("evict")).await;
    for n in 0..6 {
        let key = format!("k{n}");
        let answer = post(proxy.addr, "/orders", &[("idempotency-key", &key)], "{}").await;
        assert_eq!(answer.status, StatusCode::CREATED);
    }
    assert_eq!(
        proxy.metric(r#"idemgate_store_evictions_total{route="orders"}"#),
        2.0
    );

    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &store("reject")).await;
    for n in 0..4 {
        let key = format!("k{n}");
        post(proxy.addr, "/orders", &[("idempotency-key", &key)], "{}").await;
    }
    let refused = post(proxy.addr, "/orders", &[("idempotency-key", "k4")], "{}").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    for n in 0..4 {
        let key = format!("k{n}");
        let again = post(proxy.addr, "/orders", &[("idempotency-key", &key)], "{}").await;
        assert!(again.replayed(), "{key} was kept");
    }
    assert_eq!(upstream.executed(), 4);
    assert_eq!(
        proxy.metric(r#"idemgate_store_evictions_total{route="orders"}"#),
        0.0
    );
}

/// A full store with `when_full: reject` refuses new keys with a 503 even on a route that
/// fails open: a full store is no outage, and forwarding would run the request unprotected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_refuses_new_keys_even_when_the_route_fails_open() {
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  memory: {{ max_entries: 2, when_full: reject }}\n{}",
        route("on_store_error: fail_open")
    );
    let proxy = start_proxy(upstream.addr, &config).await;
    for key in ["k0", "k1"] {
        let stored = post(proxy.addr, "/orders", &[("idempotency-key", key)], "{}").await;
        assert_eq!(stored.status, StatusCode::CREATED);
    }
    let refused = post(proxy.addr, "/orders", &[("idempotency-key", "k2")], "{}").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        problem_type(&refused),
        "urn:idemgate:problem:store-unavailable"
    );
    assert_eq!(
        upstream.executed_for("k2"),
        0,
        "never forwarded unprotected"
    );
    assert_eq!(
        proxy.metric(r#"idemgate_requests_total{route="orders",outcome="fail_open"}"#),
        0.0
    );
}

/// With `caller_share`, one caller (here: one `Authorization`) cannot fill more than its
/// share of the memory store, so it cannot push the others' records out: past it, its new
/// keys get a 429 while its stored answers still replay and other callers store theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_caller_cannot_fill_more_than_its_share_of_the_store() {
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  memory: {{ max_entries: 10, caller_share: 30% }}\n{}",
        route("")
    );
    let proxy = start_proxy(upstream.addr, &config).await;
    let as_caller = |who: &'static str, key: &str| {
        let (addr, key) = (proxy.addr, key.to_owned());
        async move {
            let auth = format!("Bearer {who}");
            let headers = [
                ("idempotency-key", key.as_str()),
                ("authorization", auth.as_str()),
            ];
            post(addr, "/orders", &headers, "{}").await
        }
    };
    for n in 0..3 {
        let stored = as_caller("mallory", &format!("junk-{n}")).await;
        assert_eq!(stored.status, StatusCode::CREATED);
    }
    let refused = as_caller("mallory", "junk-3").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        problem_type(&refused),
        "urn:idemgate:problem:caller-over-share"
    );
    assert!(
        as_caller("mallory", "junk-0").await.replayed(),
        "its answers stay"
    );
    for n in 0..3 {
        let theirs = as_caller("alice", &format!("order-{n}")).await;
        assert_eq!(theirs.status, StatusCode::CREATED);
        assert!(!theirs.replayed());
    }
    assert_eq!(upstream.executed(), 6);
    assert_eq!(
        proxy.metric(r#"idemgate_store_evictions_total{route="orders"}"#),
        0.0
    );
}

/// Four clients download 200 MB answers of a protected route at once: each streams
/// through whole (none is stored: over `max_answer`), and the proxy's peak resident memory
/// (`VmHWM`, the kernel's high-water mark, so no moment is missed) stays under 300 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_concurrent_200_mb_answers_keep_the_proxy_under_300_mb() {
    const SIZE: usize = 200 << 20;
    let upstream = start_upstream().await;
    let proxy = common::ProxyProcess::start(upstream.addr, &route(""));
    let clients: Vec<_> = (0..4)
        .map(|n| {
            let addr = proxy.addr;
            tokio::spawn(async move {
                let key = format!("huge-{n}");
                let request = http::Request::post(format!("http://{addr}/orders"))
                    .header("idempotency-key", &key)
                    .header("x-test-bytes", SIZE.to_string())
                    .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
                    .unwrap();
                let response = common::client().request(request).await.unwrap();
                assert_eq!(response.status(), StatusCode::CREATED);
                let mut body = response.into_body();
                let mut received = 0usize;
                use http_body_util::BodyExt;
                while let Some(frame) = body.frame().await {
                    if let Ok(data) = frame.unwrap().into_data() {
                        received += data.len();
                    }
                }
                received
            })
        })
        .collect();
    for client in clients {
        assert_eq!(client.await.unwrap(), SIZE);
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", proxy.pid())).unwrap();
    let peak_kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    assert!(peak_kb < 300 * 1024, "peak RSS {peak_kb} kB");
    assert_eq!(upstream.executed(), 4);
}

/// A TCP relay to a Redis server whose replies can be held back: what the proxy sends
/// reaches Redis at once, what Redis answers waits while `hold` is set.
struct HeldReplies {
    addr: SocketAddr,
    hold: Arc<tokio::sync::watch::Sender<bool>>,
    /// Set: the next reply read from Redis goes through, and every one after it is held.
    hold_after_next: Arc<AtomicBool>,
    /// Set: the next reply read from Redis is dropped with its connection (the command
    /// ran, the proxy never hears so).
    drop_next: Arc<AtomicBool>,
    /// Set: Redis is cut off; a command sent through the relay is dropped with its
    /// connection (it never runs).
    cut: Arc<AtomicBool>,
    /// Bytes of replies the relay has read from Redis (held back or not): once a command
    /// sent through it has a reply here, Redis has run it.
    received: Arc<AtomicUsize>,
}

impl HeldReplies {
    fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

async fn relay_to(port: u16) -> HeldReplies {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (hold, held) = tokio::sync::watch::channel(false);
    let hold = Arc::new(hold);
    let hold_after_next = Arc::<AtomicBool>::default();
    let drop_next = Arc::<AtomicBool>::default();
    let received = Arc::<AtomicUsize>::default();
    let counted = Arc::clone(&received);
    let (holding, then_hold) = (Arc::clone(&hold), Arc::clone(&hold_after_next));
    let dropping = Arc::clone(&drop_next);
    let cut = Arc::<AtomicBool>::default();
    let cutting = Arc::clone(&cut);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            // Redis is gone once a test ends; the proxy may still try to reconnect.
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                continue;
            };
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            let cutting = Arc::clone(&cutting);
            // Returning drops both halves: Redis sees the connection end, and so does the
            // proxy once Redis has closed it.
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match from_client.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    if cutting.load(Ordering::SeqCst)
                        || to_server.write_all(&buf[..n]).await.is_err()
                    {
                        return;
                    }
                }
            });
            let mut held = held.clone();
            let counted = Arc::clone(&counted);
            let (holding, then_hold) = (Arc::clone(&holding), Arc::clone(&then_hold));
            let dropping = Arc::clone(&dropping);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match from_server.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    counted.fetch_add(n, Ordering::SeqCst);
                    // Returning drops the reply and closes the proxy's side.
                    if dropping.swap(false, Ordering::SeqCst) {
                        return;
                    }
                    if held.wait_for(|hold| !*hold).await.is_err() {
                        return;
                    }
                    // Held before this reply is passed on: whatever the proxy sends in
                    // answer to it gets its reply held.
                    if then_hold.swap(false, Ordering::SeqCst) {
                        holding.send_replace(true);
                    }
                    if to_client.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    HeldReplies {
        addr,
        hold,
        hold_after_next,
        drop_next,
        cut,
        received,
    }
}

/// Waits until `condition` holds (a hang guard of 30 s, never a timing assertion).
async fn until(mut condition: impl FnMut() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The first byte of each idemgate record in Redis (its kind: `I` in flight, `D` done, `T`
/// an issued token…), the rate-limit counters left out.
fn record_kinds(redis: &RedisServer) -> Vec<String> {
    let keys = redis.cli(&["KEYS", "*"]);
    let mut kinds: Vec<String> = keys
        .lines()
        .filter(|key| !key.is_empty() && !key.contains("rate:"))
        .map(|key| redis.cli(&["GETRANGE", key, "0", "0"]).trim().to_owned())
        .collect();
    kinds.sort();
    kinds
}

/// A proxy on Redis through a relay whose replies can be held, with `routes`.
async fn behind_held_replies(
    routes: &str,
) -> (RedisServer, HeldReplies, common::Upstream, ProxyHandle) {
    let redis = RedisServer::start();
    let relay = relay_to(redis.port).await;
    let upstream = start_upstream().await;
    // The store timeout is a hang guard here: the claim must outlast the held reply.
    let config = format!(
        "store:\n  redis: {{ url: \"redis://{}\", timeout: 30s }}\n{routes}",
        relay.addr
    );
    let proxy = start_proxy(upstream.addr, &config).await;
    (redis, relay, upstream, proxy)
}

/// Sends `request` on a connection of its own, waits until Redis holds a claim in flight
/// while its reply is held back, then leaves, and lets the reply through once the proxy
/// has seen the client go (its connection closed, the request's future dropped).
async fn leave_mid_claim(
    redis: &RedisServer,
    relay: &HeldReplies,
    proxy: &ProxyHandle,
    request: &[u8],
) {
    relay.hold.send_replace(true);
    let mut client = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    client.write_all(request).await.unwrap();
    until(
        || record_kinds(redis).contains(&"I".to_owned()),
        "the claim written in Redis",
    )
    .await;
    drop(client);
    until(
        || proxy.metric("idemgate_client_connections") == 0.0,
        "the proxy to see its client leave",
    )
    .await;
    relay.hold.send_replace(false);
}

/// A client that leaves while its claim is at Redis (written there, the reply not back
/// yet) sent nothing upstream: its key is freed, not left claimed by no one to lapse into
/// an unknown outcome, and its retry executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_claim_leaves_its_key_free() {
    let (redis, relay, upstream, proxy) = behind_held_replies(&route("")).await;
    // The connection to Redis is open before replies are held.
    warm_up(&proxy).await;
    let request = common::raw_post("/orders", &["idempotency-key: left"], "{}");
    leave_mid_claim(&redis, &relay, &proxy, &request).await;
    until(|| record_kinds(&redis) == ["D"], "the key freed").await;
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "left")], "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "not a 409");
    assert!(!retry.replayed());
    assert_eq!(upstream.executed_for("left"), 1);
}

/// The same on a token route: the token the claim consumed goes back to issued, and the
/// retry with it executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_claim_keeps_its_token() {
    let (redis, relay, upstream, proxy) = behind_held_replies(TOKEN_ROUTE).await;
    let token = warm_token_route(&proxy).await;
    assert_eq!(record_kinds(&redis), ["D", "T"]);
    let request = common::raw_post(
        "/orders/pay",
        &[
            "authorization: Bearer alice",
            &format!("idempotency-token: {token}"),
        ],
        "{}",
    );
    leave_mid_claim(&redis, &relay, &proxy, &request).await;
    token_issued_again_and_retried(&redis, &upstream, &proxy, &token).await;
}

/// A token route (`Bearer alice` asks for tokens) for the tests of claims left behind.
const TOKEN_ROUTE: &str = "tokens: { ttl: 5m }\nroutes:\n  - name: pay\n    match: { methods: [POST], path: /orders/pay }\n    key: { token: { header: Idempotency-Token } }\n";

/// Uses one token while replies still flow (the connection is open, the claim script
/// loaded), then returns a fresh one, issued and unused.
async fn warm_token_route(proxy: &ProxyHandle) -> String {
    let token = || async {
        let auth = [("authorization", "Bearer alice")];
        let issued = post(proxy.addr, "/.idemgate/token", &auth, "").await;
        assert_eq!(issued.status, StatusCode::CREATED);
        issued.json()["token"].as_str().unwrap().to_owned()
    };
    let warm = token().await;
    let headers = [
        ("authorization", "Bearer alice"),
        ("idempotency-token", warm.as_str()),
    ];
    let used = post(proxy.addr, "/orders/pay", &headers, "{}").await;
    assert_eq!(used.status, StatusCode::CREATED);
    token().await
}

/// The claim consumed `token` (`T` became `I`); once its release issues it again, the
/// retry with it executes once.
async fn token_issued_again_and_retried(
    redis: &RedisServer,
    upstream: &common::Upstream,
    proxy: &ProxyHandle,
    token: &str,
) {
    until(
        || record_kinds(redis) == ["D", "T"],
        "the token issued again",
    )
    .await;
    let headers = [
        ("authorization", "Bearer alice"),
        ("idempotency-token", token),
    ];
    let retry = post(proxy.addr, "/orders/pay", &headers, "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "not a 400 token-invalid");
    assert!(!retry.replayed());
    assert_eq!(upstream.executed(), 2, "the warm-up and the retry");
}

/// A proxy on Redis through a relay whose replies can be held, with a store `timeout` of
/// 200 ms (`routes` after the store section), its connection to Redis opened by one
/// request with `warm`'s headers.
async fn timing_out_behind_held_replies(
    routes: &str,
) -> (RedisServer, HeldReplies, common::Upstream, ProxyHandle) {
    let redis = RedisServer::start();
    let relay = relay_to(redis.port).await;
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  redis: {{ url: \"redis://{}\", timeout: 200ms }}\n{routes}",
        relay.addr
    );
    let proxy = start_proxy(upstream.addr, &config).await;
    (redis, relay, upstream, proxy)
}

/// Sends `headers` to `path` while Redis's replies are held past the store timeout: the
/// client gets a 503 (`fail_closed`), and the claim has run in Redis all the same (its
/// reply reached the relay). The replies stay held: let them through.
async fn claim_unanswered(
    relay: &HeldReplies,
    proxy: &ProxyHandle,
    path: &str,
    headers: &[(&str, &str)],
) {
    let before = relay.received();
    relay.hold.send_replace(true);
    let failed = post(proxy.addr, path, headers, "{}").await;
    assert_eq!(failed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        problem_type(&failed),
        "urn:idemgate:problem:store-unavailable"
    );
    until(|| relay.received() > before, "Redis to run the claim").await;
}

/// A claim Redis answered only after the store `timeout` may have been written, with no
/// owner to settle it: the client gets a 503, and the claim, under which nothing was sent,
/// is released in the background instead of lapsing into an unknown outcome (a 409 for a
/// day). The retry executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answered_past_the_store_timeout_leaves_its_key_free() {
    let (redis, relay, upstream, proxy) = timing_out_behind_held_replies(&route("")).await;
    warm_up(&proxy).await;
    claim_unanswered(&relay, &proxy, "/orders", &[("idempotency-key", "late")]).await;
    relay.hold.send_replace(false);
    until(
        || record_kinds(&redis) == ["D"],
        "the unanswered claim released",
    )
    .await;
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "late")], "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "not a 409");
    assert!(!retry.replayed());
    assert_eq!(upstream.executed_for("late"), 1);
}

/// The same on a token route: the token the unanswered claim consumed goes back to
/// issued, and the retry with it executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answered_past_the_store_timeout_keeps_its_token() {
    let (redis, relay, upstream, proxy) = timing_out_behind_held_replies(TOKEN_ROUTE).await;
    let token = warm_token_route(&proxy).await;
    let headers = [
        ("authorization", "Bearer alice"),
        ("idempotency-token", token.as_str()),
    ];
    claim_unanswered(&relay, &proxy, "/orders/pay", &headers).await;
    relay.hold.send_replace(false);
    token_issued_again_and_retried(&redis, &upstream, &proxy, &token).await;
}

/// A fail-open route on Redis through a relay whose replies can be held, with a store
/// `timeout` of 200 ms; its connection to Redis is open.
async fn failing_open_behind_held_replies(
) -> (RedisServer, HeldReplies, common::Upstream, ProxyHandle) {
    let (redis, relay, upstream, proxy) =
        timing_out_behind_held_replies(&route("on_store_error: fail_open\n    wait_timeout: 30s"))
            .await;
    warm_up(&proxy).await;
    (redis, relay, upstream, proxy)
}

/// An owner held at the upstream's gate `pay` ([`owner_at_gate`]), and any duplicate of it.
const PAY: [(&str, &str); 2] = [("idempotency-key", "pay"), ("x-test-gate", "pay")];

/// The proxy's first request, so its connection to Redis is open (and, on Redis, how it
/// swaps is known) before replies are held or dropped.
async fn warm_up(proxy: &ProxyHandle) {
    let warm = post(proxy.addr, "/orders", &[("idempotency-key", "warm")], "{}").await;
    assert_eq!(warm.status, StatusCode::CREATED);
}

/// An owner of key `pay`, once the upstream holds it at its gate.
async fn owner_at_gate(
    proxy: &ProxyHandle,
    upstream: &common::Upstream,
) -> tokio::task::JoinHandle<common::Answer> {
    let addr = proxy.addr;
    let owner = tokio::spawn(async move { post(addr, "/orders", &PAY, "{}").await });
    upstream.arrived("pay", 1).await;
    owner
}

/// The duplicate's answer, or a panic if it reached the upstream first (it arrived at
/// gate `pay` as the second request there).
async fn answered_without_running(
    upstream: &common::Upstream,
    duplicate: tokio::task::JoinHandle<common::Answer>,
) -> common::Answer {
    tokio::select! {
        answer = duplicate => answer.unwrap(),
        () = upstream.arrived("pay", 2) => {
            panic!("the duplicate of a running request was forwarded and ran a second time")
        }
    }
}

/// Once the store has failed the duplicate, the owner finishes: it executed once, and
/// the duplicate got the in-flight 409 with `Retry-After`.
async fn the_duplicate_got_409_and_the_owner_ran_once(
    relay: &HeldReplies,
    upstream: &common::Upstream,
    owner: tokio::task::JoinHandle<common::Answer>,
    duplicate: common::Answer,
) {
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(problem_type(&duplicate), "urn:idemgate:problem:in-flight");
    assert_eq!(
        duplicate.headers.get(http::header::RETRY_AFTER).unwrap(),
        "1"
    );
    relay.hold.send_replace(false);
    upstream.open("pay");
    assert_eq!(owner.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(upstream.executed_for("pay"), 1);
}

/// `on_store_error: fail_open` forwards a request only when the store cannot say whether
/// its key is taken. A duplicate waiting on a running owner whose store fails while it
/// waits (its next look gets no reply within the store timeout) knows the key is in
/// flight: it gets the in-flight 409 with `Retry-After`, never a run of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fail_open_a_waiting_duplicate_is_never_forwarded_when_the_store_fails() {
    let (_redis, relay, upstream, proxy) = failing_open_behind_held_replies().await;
    let owner = owner_at_gate(&proxy, &upstream).await;
    let addr = proxy.addr;
    let duplicate = tokio::spawn(async move { post(addr, "/orders", &PAY, "{}").await });
    proxy.metric_reaches("idemgate_waiting", 1.0).await;
    // Its next look (within a second, or when woken) gets no reply.
    relay.hold.send_replace(true);
    let duplicate = answered_without_running(&upstream, duplicate).await;
    the_duplicate_got_409_and_the_owner_ran_once(&relay, &upstream, owner, duplicate).await;
}

/// The same when the store fails right after the duplicate's first look found the key in
/// flight (on Redis: the look is answered, the subscription to the owner's channel is
/// not): the store tells it was found in flight, and the duplicate gets the 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fail_open_a_duplicate_found_in_flight_is_never_forwarded_when_the_store_fails() {
    let (_redis, relay, upstream, proxy) = failing_open_behind_held_replies().await;
    let owner = owner_at_gate(&proxy, &upstream).await;
    let addr = proxy.addr;
    // The duplicate's first look is the next command (the owner renews every 10 s).
    relay.hold_after_next.store(true, Ordering::SeqCst);
    let duplicate = tokio::spawn(async move { post(addr, "/orders", &PAY, "{}").await });
    let duplicate = answered_without_running(&upstream, duplicate).await;
    the_duplicate_got_409_and_the_owner_ran_once(&relay, &upstream, owner, duplicate).await;
}

/// An owner's completion that Redis carried out but whose reply was lost with its
/// connection is retried on a new one (a swap, then the settle script): the answer is
/// stored, and the owner counts it as stored (`executed`), not as "executed, answer not
/// stored" by another owner. Its repeat gets the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_retried_after_its_reply_was_lost_counts_as_stored() {
    let (_redis, relay, upstream, proxy) = behind_held_replies(&route("")).await;
    // The connection is open, and the server's way of swapping is known.
    warm_up(&proxy).await;
    let owner = owner_at_gate(&proxy, &upstream).await;
    // The owner's next command is its completion (it renews every 10 s).
    relay.drop_next.store(true, Ordering::SeqCst);
    upstream.open("pay");
    assert_eq!(owner.await.unwrap().status, StatusCode::CREATED);
    assert!(
        !relay.drop_next.load(Ordering::SeqCst),
        "no reply was dropped"
    );
    let executed = |outcome: &str| {
        proxy.metric(&format!(
            r#"idemgate_requests_total{{route="orders",outcome="{outcome}"}}"#
        ))
    };
    until(
        || executed("executed") + executed("executed_not_stored") >= 2.0,
        "the owner's outcome counted",
    )
    .await;
    assert_eq!(executed("executed_not_stored"), 0.0);
    assert_eq!(executed("executed"), 2.0, "the warm-up and the owner");
    let repeat = post(proxy.addr, "/orders", &PAY, "{}").await;
    assert_eq!(repeat.status, StatusCode::CREATED);
    assert!(repeat.replayed());
    assert_eq!(upstream.executed_for("pay"), 1);
}

/// An owner whose completion fails (Redis cut off as the upstream answers, the write and
/// its retry on a new connection both lost) still gives its client the answer, and makes
/// the completion again in the background: once Redis is back the answer is stored, and
/// the repeat gets the replay instead of finding the claim lapsed (a 409 for a day).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_the_store_failed_is_made_again_once_it_is_back() {
    let (redis, relay, upstream, proxy) = behind_held_replies(&route("")).await;
    warm_up(&proxy).await;
    let owner = owner_at_gate(&proxy, &upstream).await;
    relay.cut.store(true, Ordering::SeqCst);
    upstream.open("pay");
    assert_eq!(owner.await.unwrap().status, StatusCode::CREATED);
    let unknown = r#"idemgate_requests_total{route="orders",outcome="unknown"}"#;
    until(|| proxy.metric(unknown) == 1.0, "the completion to fail").await;
    assert_eq!(
        record_kinds(&redis),
        ["D", "I"],
        "the claim is left in flight"
    );
    relay.cut.store(false, Ordering::SeqCst);
    until(
        || record_kinds(&redis) == ["D", "D"],
        "the completion made again",
    )
    .await;
    let repeat = post(proxy.addr, "/orders", &PAY, "{}").await;
    assert_eq!(repeat.status, StatusCode::CREATED);
    assert!(repeat.replayed());
    assert_eq!(upstream.executed_for("pay"), 1);
}
