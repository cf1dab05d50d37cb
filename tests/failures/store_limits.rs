//! The store's limits: answers too large to store, a full memory store (evicting or
//! refusing new keys, also on a route that fails open), one caller's share of the store,
//! and the proxy's memory under several huge answers at once.

use http::StatusCode;

use crate::common::{self, post, start_proxy, start_upstream};
use crate::{park_duplicates, route};

/// A route with `max_answer: 64KiB`, and a request with client key `key` whose 1 MiB
/// answer (status `status`) the upstream holds until `waiters` duplicates wait on it: the
/// upstream, the proxy, the owner's answer and the duplicates still to be answered.
async fn a_1_mib_answer_with_waiters(
    key: &'static str,
    status: &'static str,
    waiters: usize,
) -> (
    common::Upstream,
    common::ProxyHandle,
    common::Answer,
    Vec<tokio::task::JoinHandle<common::Answer>>,
) {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &route("max_answer: 64KiB\n    wait_timeout: 30s"),
    )
    .await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [
            ("idempotency-key", key),
            ("x-test-gate", key),
            ("x-test-status", status),
            ("x-test-bytes", "1048576"),
        ];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived(key, 1).await;
    let duplicates = park_duplicates(&proxy, key, waiters).await;
    upstream.open(key);
    let owner = owner.await.unwrap();
    (upstream, proxy, owner, duplicates)
}

/// An answer over `max_answer` streams to its client whole, and the key records
/// "executed, answer not stored": the duplicates that waited and every later repeat get
/// that problem, and nothing executes twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_too_large_to_store_streams_and_its_repeats_never_execute() {
    let (upstream, proxy, owner, duplicates) = a_1_mib_answer_with_waiters("big", "201", 3).await;
    assert_eq!(owner.status, StatusCode::CREATED);
    assert_eq!(owner.body.len(), 1 << 20, "streamed whole");
    assert!(owner.body.iter().all(|b| *b == b'x'));
    for duplicate in duplicates {
        let duplicate = duplicate.await.unwrap();
        assert_eq!(duplicate.status, StatusCode::CONFLICT);
        assert_eq!(
            duplicate.problem(),
            "urn:idemgate:problem:answer-not-stored"
        );
    }
    let later = post(proxy.addr, "/orders", &[("idempotency-key", "big")], "{}").await;
    assert_eq!(later.problem(), "urn:idemgate:problem:answer-not-stored");
    assert!(later.json()["detail"].as_str().unwrap().contains("201"));
    assert_eq!(upstream.executed(), 1);
    // docs/operations.md, Metrics: the owner is `executed_not_stored`, each of the three duplicates
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

/// A 5xx says the work was not done, however long its page: one over `max_answer` still
/// streams to its client and releases the key as a small one does, so the client's retry
/// runs (rather than `409 answer-not-stored` for the key's whole `ttl`), and the duplicates
/// that waited on it are told it failed (its body was not kept to share), never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_too_large_to_store_still_releases_its_key() {
    let (upstream, proxy, owner, duplicates) =
        a_1_mib_answer_with_waiters("big-500", "503", 2).await;
    assert_eq!(owner.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(owner.body.len(), 1 << 20, "streamed whole");
    for duplicate in duplicates {
        let duplicate = duplicate.await.unwrap();
        assert_eq!(duplicate.status, StatusCode::BAD_GATEWAY);
        assert_eq!(
            duplicate.problem(),
            "urn:idemgate:problem:duplicate-of-failed-request"
        );
    }
    assert_eq!(upstream.executed(), 1, "a duplicate that waited ran");
    let retry = post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "big-500")],
        "{}",
    )
    .await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert!(!retry.replayed());
    assert_eq!(upstream.executed(), 2);
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

/// The failure an owner shares with its waiters is kept a few seconds only: it never
/// evicts a stored answer to make room (whose repeats would then run again). Without room
/// the waiters are told their owner failed, without its answer, and every stored answer
/// still replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_to_share_never_evicts_a_stored_answer() {
    let upstream = start_upstream().await;
    let config = format!("store:\n  memory: {{ max_bytes: 4KiB }}\n{}", route(""));
    let proxy = start_proxy(upstream.addr, &config).await;
    for key in ["k0", "k1", "k2"] {
        let stored = post(proxy.addr, "/orders", &[("idempotency-key", key)], "{}").await;
        assert_eq!(stored.status, StatusCode::CREATED);
    }
    let headers = [
        ("idempotency-key", "boom"),
        ("x-test-status", "500"),
        ("x-test-bytes", "3000"),
    ];
    let failed = post(proxy.addr, "/orders", &headers, "{}").await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        failed.body.len(),
        3000,
        "the owner's client got the answer whole"
    );
    for key in ["k0", "k1", "k2"] {
        let again = post(proxy.addr, "/orders", &[("idempotency-key", key)], "{}").await;
        assert!(again.replayed(), "{key} was evicted and ran again");
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
    assert_eq!(refused.problem(), "urn:idemgate:problem:store-unavailable");
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
    assert_eq!(refused.problem(), "urn:idemgate:problem:caller-over-share");
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
