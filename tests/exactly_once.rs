//! Exactly-once, proven by counting upstream executions under concurrent duplicates.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{post, start_proxy, start_upstream};
use http::StatusCode;
use tokio::io::AsyncWriteExt;

const HEADER_ROUTE: &str = r#"
routes:
  - name: create-order
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
"#;

async fn fire_concurrently(
    addr: std::net::SocketAddr,
    n: usize,
    headers: Vec<(&'static str, String)>,
    body: impl Fn(usize) -> String,
) -> Vec<common::Answer> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let headers = headers.clone();
        let body = body(i);
        tasks.push(tokio::spawn(async move {
            let refs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            post(addr, "/orders", &refs, &body).await
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    answers
}

/// Fires `n` requests with `headers` and `body(i)` at once, each carrying the upstream gate
/// `gate`: the first to claim the key is held there until the proxy reports the other
/// `n - 1` parked waiting for it, so every duplicate meets its owner in flight (none comes
/// after it finished and merely replays). A duplicate the proxy forwarded would be held at
/// the gate too and counted once it opens.
async fn fire_while_the_owner_is_held(
    proxy: &common::ProxyHandle,
    upstream: &common::Upstream,
    gate: &'static str,
    n: usize,
    mut headers: Vec<(&'static str, String)>,
    body: impl Fn(usize) -> String,
) -> Vec<common::Answer> {
    headers.push(("x-test-gate", gate.into()));
    let (answers, ()) = tokio::join!(fire_concurrently(proxy.addr, n, headers, body), async {
        upstream.arrived(gate, 1).await;
        proxy
            .metric_reaches("idemgate_waiting", (n - 1) as f64)
            .await;
        upstream.open(gate);
    });
    answers
}

/// `wait_timeout` as a hang guard: the duplicates wait for an owner held at a gate.
const WAIT_LONG: &str = "defaults: { wait_timeout: 30s }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_with_one_key_execute_once() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &format!("{WAIT_LONG}{HEADER_ROUTE}")).await;
    let answers = fire_while_the_owner_is_held(
        &proxy,
        &upstream,
        "one-key",
        50,
        vec![("idempotency-key", "order-42".into())],
        |_| r#"{"sku":"A1","qty":1}"#.into(),
    )
    .await;
    assert_eq!(upstream.executed(), 1);
    let first = &answers[0];
    for a in &answers {
        assert_eq!(a.status, StatusCode::CREATED);
        assert_eq!(a.body, first.body, "every duplicate gets the same body");
        let cookies: Vec<_> = a.headers.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1; Path=/", "b=2; Path=/"]);
    }
    let replayed = answers.iter().filter(|a| a.replayed()).count();
    assert_eq!(replayed, 49);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_on_a_fingerprint_route_execute_once() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        r#"
defaults: { wait_timeout: 30s }
routes:
  - name: vote
    match: { methods: [POST], path: /orders }
    key: { fingerprint: { body: true }, scope: [header: X-User-Id] }
"#,
    )
    .await;
    // Same business request, spelled 50 different ways: key order, spacing, timestamps, GPS.
    let answers = fire_while_the_owner_is_held(
        &proxy,
        &upstream,
        "fingerprint",
        50,
        vec![("x-user-id", "u-7".into())],
        |i| {
            if i % 2 == 0 {
                format!(r#"{{"item":"A1","amount":100,"timestamp":{i},"lat":{i}.5,"lng":1}}"#)
            } else {
                format!(r#"{{ "amount" : 1.00e2, "lng": 2, "item": "A1", "timestamp": "{i}" }}"#)
            }
        },
    )
    .await;
    assert_eq!(upstream.executed(), 1);
    assert!(answers
        .iter()
        .all(|a| a.status == StatusCode::CREATED && a.body == answers[0].body));
    assert_eq!(answers.iter().filter(|a| a.replayed()).count(), 49);

    // A different amount of the same thing is another request.
    let other = post(
        proxy.addr,
        "/orders",
        &[("x-user-id", "u-7")],
        r#"{"item":"A1","amount":101}"#,
    )
    .await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert!(!other.replayed());
    assert_eq!(upstream.executed(), 2);
}

/// In reject mode, duplicates of a running request get a 409 with `Retry-After` at once;
/// once it finished they replay. The owner is held at the upstream until all 49 were
/// answered, so every one of them meets it in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_mode_answers_409_while_in_flight_and_replays_after() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &format!("defaults: {{ in_flight: reject }}\n{HEADER_ROUTE}"),
    )
    .await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [("idempotency-key", "k-reject"), ("x-test-gate", "reject")];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("reject", 1).await;
    let duplicates = fire_concurrently(
        addr,
        49,
        vec![("idempotency-key", "k-reject".into())],
        |_| "{}".into(),
    )
    .await;
    for a in &duplicates {
        assert_eq!(a.status, StatusCode::CONFLICT);
        assert_eq!(a.headers["retry-after"], "1");
        assert_eq!(a.headers["content-type"], "application/problem+json");
    }
    upstream.open("reject");
    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::CREATED);
    assert!(!owner.replayed());
    let after = post(addr, "/orders", &[("idempotency-key", "k-reject")], "{}").await;
    assert!(after.replayed());
    assert_eq!(upstream.executed(), 1);
}

/// README flow step 3: in `wait` mode, a duplicate whose wait passes `wait_timeout`
/// gets `409 in-flight` with `Retry-After: 1`, and runs nothing. The owner is held at the
/// upstream's gate until the duplicate was answered, so the duplicate meets it in flight;
/// the proxy counts it waiting before its answer, so it is the wait that ended, not a
/// reject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_whose_wait_times_out_gets_409_with_retry_after_1() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &format!("defaults: {{ in_flight: wait, wait_timeout: 200ms }}\n{HEADER_ROUTE}"),
    )
    .await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [("idempotency-key", "k-wait"), ("x-test-gate", "wait")];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("wait", 1).await;
    let started = std::time::Instant::now();
    let duplicate = post(addr, "/orders", &[("idempotency-key", "k-wait")], "{}").await;
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "answered after its wait_timeout, not at once: {:?}",
        started.elapsed()
    );
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(duplicate.json()["type"], "urn:idemgate:problem:in-flight");
    assert_eq!(duplicate.headers["retry-after"], "1");
    assert_eq!(
        proxy.metric(r#"idemgate_wait_seconds_count{route="create-order"}"#),
        1.0,
        "one wait, ended by its timeout"
    );
    assert_eq!(upstream.executed(), 1, "the duplicate ran nothing");
    upstream.open("wait");
    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::CREATED);
    let retry = post(addr, "/orders", &[("idempotency-key", "k-wait")], "{}").await;
    assert!(retry.replayed(), "the retry Retry-After asks for replays");
    assert_eq!(upstream.executed(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_with_another_payload_is_422_without_calling_upstream() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, HEADER_ROUTE).await;
    let key = [("idempotency-key", "k-422")];
    assert_eq!(
        post(proxy.addr, "/orders", &key, r#"{"amount":10}"#)
            .await
            .status,
        StatusCode::CREATED
    );
    let again = post(proxy.addr, "/orders", &key, r#"{"amount":11}"#).await;
    assert_eq!(again.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(again.json()["type"], "urn:idemgate:problem:key-reused");
    assert_eq!(upstream.executed(), 1);
    // The same payload, respelled, is still a replay.
    let same = post(proxy.addr, "/orders", &key, r#"{ "amount": 10.0 }"#).await;
    assert!(same.replayed());
    assert_eq!(upstream.executed(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_callers_with_the_same_key_execute_separately() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, HEADER_ROUTE).await;
    let alice = post(
        proxy.addr,
        "/orders",
        &[
            ("idempotency-key", "shared"),
            ("authorization", "Bearer alice"),
        ],
        "{}",
    )
    .await;
    let bob = post(
        proxy.addr,
        "/orders",
        &[
            ("idempotency-key", "shared"),
            ("authorization", "Bearer bob"),
        ],
        "{}",
    )
    .await;
    assert_eq!(upstream.executed(), 2);
    assert!(!bob.replayed());
    assert_eq!(alice.json()["auth"], "Bearer alice");
    assert_eq!(
        bob.json()["auth"],
        "Bearer bob",
        "bob never sees alice's answer"
    );
    let bob_again = post(
        proxy.addr,
        "/orders",
        &[
            ("idempotency-key", "shared"),
            ("authorization", "Bearer bob"),
        ],
        "{}",
    )
    .await;
    assert!(bob_again.replayed());
    assert_eq!(bob_again.json()["auth"], "Bearer bob");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_answers_are_retried_and_successful_ones_are_not() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, HEADER_ROUTE).await;
    let failing = [("idempotency-key", "k-500"), ("x-test-status", "500")];
    assert_eq!(
        post(proxy.addr, "/orders", &failing, "{}").await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "k-500")], "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(upstream.executed(), 2, "the 500 released the key");
    let again = post(proxy.addr, "/orders", &[("idempotency-key", "k-500")], "{}").await;
    assert!(again.replayed());
    assert_eq!(upstream.executed(), 2, "the 201 was stored");
}

/// An owner held at the upstream for several of its leases keeps its key: a duplicate
/// then is answered "in flight" (reject mode), not executed, and replays afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_owner_slower_than_its_lease_keeps_the_key() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &format!("defaults: {{ lease: 200ms, in_flight: reject }}\n{HEADER_ROUTE}"),
    )
    .await;
    let addr = proxy.addr;
    let slow = tokio::spawn(async move {
        post(
            addr,
            "/orders",
            &[("idempotency-key", "slow"), ("x-test-gate", "slow")],
            "{}",
        )
        .await
    });
    upstream.arrived("slow", 1).await;
    // Five leases pass while the owner is held: the precondition, not a race.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let duplicate = post(addr, "/orders", &[("idempotency-key", "slow")], "{}").await;
    assert_eq!(
        duplicate.status,
        StatusCode::CONFLICT,
        "the claim did not lapse"
    );
    upstream.open("slow");
    let first = slow.await.unwrap();
    let again = post(addr, "/orders", &[("idempotency-key", "slow")], "{}").await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(upstream.executed(), 1);
}

/// The client leaves while the upstream holds its request at a gate (the proxy saw it go);
/// its retry comes while the owner still runs (the proxy reports it parked waiting) and gets the one answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_still_gets_its_answer_on_retry() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &format!("{WAIT_LONG}{HEADER_ROUTE}")).await;
    let body = r#"{"sku":"gone"}"#;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let request = format!(
        "POST /orders HTTP/1.1\r\nhost: {}\r\nidempotency-key: lost-answer\r\nx-test-gate: lost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        proxy.addr,
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    upstream.arrived("lost", 1).await;
    drop(stream); // the client times out and goes away mid-request
                  // The proxy's own signal that it saw the client go: its connection closed.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while proxy.metric("idemgate_client_connections") > 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: still connected"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let addr = proxy.addr;
    let retry = tokio::spawn(async move {
        post(addr, "/orders", &[("idempotency-key", "lost-answer")], body).await
    });
    proxy.metric_reaches("idemgate_waiting", 1.0).await;
    upstream.open("lost");
    let retry = retry.await.unwrap();
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed(), "the retry got the stored answer");
    assert_eq!(retry.json()["n"], 1);
    assert_eq!(upstream.executed(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_distinct_keys_each_execute_once() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, HEADER_ROUTE).await;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let addr = proxy.addr;
        tasks.push(tokio::spawn(async move {
            let key = format!("k-{}", i % 40);
            post(addr, "/orders", &[("idempotency-key", &key)], "{}").await
        }));
    }
    let mut bodies_per_key: std::collections::HashMap<String, HashSet<bytes::Bytes>> =
        Default::default();
    for (i, t) in tasks.into_iter().enumerate() {
        let a = t.await.unwrap();
        assert_eq!(a.status, StatusCode::CREATED);
        bodies_per_key
            .entry(format!("k-{}", i % 40))
            .or_default()
            .insert(a.body);
    }
    assert_eq!(upstream.executed(), 40);
    assert!(bodies_per_key.values().all(|b| b.len() == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_http1_duplicate_gets_replay_header() {
    // Guards the wire format: the replay marker must reach a plain HTTP/1.1 client.
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, HEADER_ROUTE).await;
    post(proxy.addr, "/orders", &[("idempotency-key", "wire")], "{}").await;
    // The same Host as the first request's (the host is part of the key).
    let request = format!(
        "POST /orders HTTP/1.1\r\nhost: {}\r\nidempotency-key: wire\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}",
        proxy.addr
    );
    let raw = common::raw_exchange(proxy.addr, request.as_bytes()).await;
    assert!(raw.starts_with("HTTP/1.1 201"), "{raw}");
    assert!(
        raw.to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "{raw}"
    );
}

/// The owner's upstream answers a 500 too large for the memory store to keep, so its
/// failure cannot be shared: the duplicate that waited on it gets the proxy's own `502
/// duplicate-of-failed-request`, never a turn of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_of_an_owner_that_failed_without_a_shareable_answer_gets_502() {
    let upstream = start_upstream().await;
    let config = format!("store:\n  memory: {{ max_bytes: 64KiB }}\n{HEADER_ROUTE}");
    let proxy = start_proxy(upstream.addr, &config).await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [
            ("idempotency-key", "too-big-to-share"),
            ("x-test-gate", "owner"),
            ("x-test-status", "500"),
            ("x-test-bytes", "131072"),
        ];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("owner", 1).await;
    let duplicate = tokio::spawn(async move {
        post(
            addr,
            "/orders",
            &[("idempotency-key", "too-big-to-share")],
            "{}",
        )
        .await
    });
    proxy.metric_reaches("idemgate_waiting", 1.0).await;
    upstream.open("owner");
    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        owner.body.len(),
        131_072,
        "the owner's client gets it whole"
    );
    let duplicate = duplicate.await.unwrap();
    assert_eq!(duplicate.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        duplicate.json()["type"],
        "urn:idemgate:problem:duplicate-of-failed-request"
    );
    assert_eq!(upstream.executed(), 1, "the duplicate ran nothing");
}

/// A client that sends its request and leaves while its owner still waits for an upstream
/// connection (all taken): nothing has gone out, so the owner stops as its client leaves,
/// sends nothing even once a connection frees, and frees the key, so the client's retry
/// runs it (once). Owners of clients that left never pile up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_client_left_while_it_waited_for_a_connection_stops_and_sends_nothing() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        "connections: { max_upstream: 1 }\nroutes:\n  - name: create-order\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key, required: true }\n    upstream_timeout: 2s\n",
    )
    .await;
    let owners = proxy.proxy.owners().clone();
    // The only upstream connection is held by a request the upstream keeps at its gate.
    let addr = proxy.addr;
    let held = tokio::spawn(async move {
        post(
            addr,
            "/orders",
            &[("idempotency-key", "hold"), ("x-test-gate", "g")],
            "{}",
        )
        .await
    });
    upstream.arrived("g", 1).await;
    let until = |n: usize| {
        let owners = owners.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(30), async {
                while owners.len() != n {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("hang guard: {} owners, never {n}", owners.len()))
        }
    };
    let mut client = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let request = format!(
        "POST /orders HTTP/1.1\r\nhost: {}\r\nidempotency-key: left\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}",
        proxy.addr
    );
    client.write_all(request.as_bytes()).await.unwrap();
    // Its owner runs (waiting for the connection), then its client leaves.
    until(2).await;
    drop(client);
    // Its request never went out: the owner stops now; had it run on detached, it would
    // wait for background_timeout (10 min) and this wait would hit its hang guard.
    until(1).await;
    // The held request's client gets its 504 at its 2 s upstream_timeout; its owner,
    // detached, finishes once the gate opens and hands the connection back.
    upstream.open("g");
    held.await.unwrap();
    until(0).await;
    assert_eq!(upstream.executed_for("left"), 0, "nothing went out for it");
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "left")], "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "the key was freed");
    assert!(!retry.replayed());
    assert_eq!(upstream.executed_for("left"), 1);
}
