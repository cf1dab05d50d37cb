//! The life of a claim around the operator and the process: an admin purge never frees a
//! key whose owner still runs, and a shutdown answers the requests it was holding, waits
//! for the settlements it still has to make, and leaves the claims of calls still running
//! exactly as they are (saying what it left, and, on the memory store, that it forgets).

mod common;

use common::{post, send, start_proxy_with_admin, start_upstream};
use http::{Method, StatusCode};

const ROUTES: &str = r#"
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key }
"#;

/// `DELETE /keys/{digest}` on a key whose owner is still running upstream is refused: a
/// purge there would let the owner's waiting duplicates and the next retry run the request
/// a second time while the first call still runs. Once the owner settled, the purge works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purging_a_key_in_flight_is_refused_while_its_owner_runs() {
    purge_in_flight_is_refused("").await;
}

/// The same on Redis, where a purged claim would also be written back by its owner's next
/// renewal, after a retry may have run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purging_a_key_in_flight_on_redis_is_refused_while_its_owner_runs() {
    let redis = common::redis_server::RedisServer::start();
    purge_in_flight_is_refused(&format!(
        "store:\n  redis: {{ url: \"{}\" }}\n",
        redis.url()
    ))
    .await;
}

async fn purge_in_flight_is_refused(store: &str) {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, &format!("{store}{ROUTES}"), None).await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [("idempotency-key", "purged"), ("x-test-gate", "owner")];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("owner", 1).await;
    let duplicate =
        tokio::spawn(
            async move { post(addr, "/orders", &[("idempotency-key", "purged")], "{}").await },
        );
    proxy.metric_reaches("idemgate_waiting", 1.0).await;
    let digest = common::stored_key(&proxy, "/orders", &[("idempotency-key", "purged")], b"{}");
    let path = format!("/keys/{digest}");

    let purge = send(proxy.admin, Method::DELETE, &path, &[], "").await;
    assert_eq!(
        purge.status,
        StatusCode::CONFLICT,
        "the owner still runs: {}",
        String::from_utf8_lossy(&purge.body)
    );
    let info = send(proxy.admin, Method::GET, &path, &[], "").await.json();
    assert_eq!(info["state"], "in_flight", "{info}");
    // A retry now is a duplicate of the running request, never a second run.
    let retry =
        tokio::spawn(
            async move { post(addr, "/orders", &[("idempotency-key", "purged")], "{}").await },
        );
    proxy.metric_reaches("idemgate_waiting", 2.0).await;

    upstream.open("owner");
    assert_eq!(owner.await.unwrap().status, StatusCode::CREATED);
    for waited in [duplicate, retry] {
        let waited = waited.await.unwrap();
        assert!(
            waited.replayed(),
            "a duplicate got the owner's answer: {waited:?}"
        );
    }
    assert_eq!(upstream.executed_for("purged"), 1, "never run twice");

    // Settled, the key is the operator's to purge.
    let purge = send(proxy.admin, Method::DELETE, &path, &[], "").await;
    assert_eq!(purge.status, StatusCode::NO_CONTENT);
}

/// One raw POST to `/orders` with `headers`: the client's result, a connection the proxy
/// cut without an answer included.
async fn try_post(
    addr: std::net::SocketAddr,
    headers: &[(&str, &str)],
) -> Result<common::Answer, String> {
    use http_body_util::BodyExt;
    let mut request = http::Request::post(format!("http://{addr}/orders"))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    let response = common::client()
        .request(request)
        .await
        .map_err(|e| format!("{e:?}"))?;
    let (head, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| format!("{e:?}"))?;
    Ok(common::Answer {
        status: head.status,
        headers: head.headers,
        body: body.to_bytes(),
    })
}

/// SIGTERM while a duplicate waits on an owner that outlives the drain: the duplicate is
/// answered before the process exits (a 409 `in-flight` with `Retry-After`, so its client
/// retries where the key's answer will be), never cut off without an answer, even when its
/// `wait_timeout` reaches past `drain_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waiting_at_shutdown_is_answered_before_the_exit() {
    let upstream = start_upstream().await;
    let config = format!("drain_timeout: 2s\ndefaults: {{ wait_timeout: 60s }}\n{ROUTES}");
    let mut proxy = common::ProxyProcess::start(upstream.addr, &config);
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        try_post(
            addr,
            &[("idempotency-key", "stop"), ("x-test-gate", "stop")],
        )
        .await
    });
    upstream.arrived("stop", 1).await;
    let duplicate =
        tokio::spawn(async move { try_post(addr, &[("idempotency-key", "stop")]).await });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while common::metric(proxy.admin, "idemgate_waiting").await < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: no waiter"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    proxy.signal("TERM");
    assert!(proxy.wait_exit().success());
    let duplicate = duplicate.await.unwrap();
    let duplicate = duplicate.expect("the waiting duplicate got an answer");
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(duplicate.json()["type"], "urn:idemgate:problem:in-flight");
    assert!(duplicate.headers.contains_key(http::header::RETRY_AFTER));
    let _ = owner.await;
    upstream.open("stop");
    assert_eq!(upstream.executed_for("stop"), 1);
}

/// A client that goes away while its owner's call runs: the owner runs on, stores the
/// answer for the retry, and is counted as `executed` like any owner, so the executions
/// `/metrics` reports match the upstream's even when clients time out first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_client_left_is_counted_when_it_finishes() {
    use tokio::io::AsyncWriteExt;
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, None).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let request = format!(
        "POST /orders HTTP/1.1\r\nhost: {}\r\nidempotency-key: left\r\nx-test-gate: left\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}",
        proxy.addr
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    upstream.arrived("left", 1).await;
    drop(stream);
    // The proxy's own signal that the client is gone: its connection closed.
    let gone = "idemgate_client_connections";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while proxy.metric(gone) > 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: still connected"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    upstream.open("left");
    let series = |outcome: &str| {
        proxy.metric(&format!(
            r#"idemgate_requests_total{{route="orders",outcome="{outcome}"}}"#
        ))
    };
    // Counted once it finished (hang guard: 30 s), after its answer was stored: the retry
    // then finds that answer, a replay, not a wait.
    proxy
        .metric_reaches(
            r#"idemgate_requests_total{route="orders",outcome="executed"}"#,
            1.0,
        )
        .await;
    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "left")], "{}").await;
    assert!(retry.replayed(), "the retry got the stored answer");
    assert_eq!(upstream.executed_for("left"), 1);
    assert_eq!(series("replayed"), 1.0);
    assert_eq!(series("waited"), 0.0);
    assert_eq!(
        series("executed"),
        1.0,
        "the owner that ran is counted once"
    );
}

/// SIGTERM past the drain while an owner still waits for an upstream connection (all of
/// `max_upstream` busy): its request never went out, so its claim must not outlive the
/// process as a held "outcome unknown" that no retry can get past for the key's `ttl`.
/// Another replica's retry executes it once the dead process's claim is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_still_unsent_at_the_end_of_the_drain_leaves_its_key_free() {
    let redis = common::redis_server::RedisServer::start();
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  redis: {{ url: \"{}\" }}\ndrain_timeout: 2s\nconnections: {{ max_upstream: 1 }}\ndefaults: {{ lease: 1s, wait_timeout: 100ms }}\n{ROUTES}",
        redis.url()
    );
    let mut a = common::ProxyProcess::start(upstream.addr, &config);
    let b = common::ProxyProcess::start(upstream.addr, &config);
    let addr = a.addr;
    let busy = tokio::spawn(async move {
        try_post(
            addr,
            &[("idempotency-key", "busy"), ("x-test-gate", "busy")],
        )
        .await
    });
    upstream.arrived("busy", 1).await;
    let queued =
        tokio::spawn(async move { try_post(addr, &[("idempotency-key", "queued")]).await });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while common::metric(a.admin, "idemgate_upstream_connections_waited_total").await < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: nothing queued"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    a.signal("TERM");
    assert!(a.wait_exit().success());
    let _ = (busy.await, queued.await);
    assert_eq!(upstream.executed_for("queued"), 0, "it never went out");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let retry = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: still in flight"
        );
        let retry = post(b.addr, "/orders", &[("idempotency-key", "queued")], "{}").await;
        if retry.status != StatusCode::CONFLICT
            || retry.json()["type"] != "urn:idemgate:problem:in-flight"
        {
            break retry;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "the retry ran it: {}",
        String::from_utf8_lossy(&retry.body)
    );
    assert_eq!(upstream.executed_for("queued"), 1);
    upstream.open("busy");
}

/// SIGTERM while an owner's request is out at the upstream and outlives the drain: its
/// client gets, before the process exits, what a client whose `upstream_timeout` passed
/// gets (a `504` problem saying the outcome is unknown and the key held), never a cut
/// connection it cannot read. The claim stays exactly as before: the request went out, so
/// no replica runs it again (another replica's retry is told it is in flight, then that its
/// outcome is unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_still_upstream_at_the_end_of_the_drain_is_answered_504_and_keeps_its_key() {
    let redis = common::redis_server::RedisServer::start();
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  redis: {{ url: \"{}\" }}\ndrain_timeout: 2s\ndefaults: {{ lease: 1s, wait_timeout: 200ms, upstream_timeout: 60s }}\n{ROUTES}",
        redis.url()
    );
    let mut a = common::ProxyProcess::start(upstream.addr, &config);
    let b = common::ProxyProcess::start(upstream.addr, &config);
    let addr = a.addr;
    let owner = tokio::spawn(async move {
        try_post(
            addr,
            &[("idempotency-key", "sent"), ("x-test-gate", "sent")],
        )
        .await
    });
    upstream.arrived("sent", 1).await;
    a.signal("TERM");
    assert!(a.wait_exit().success());
    let owner = owner.await.unwrap();
    let owner = owner.expect("the owner's client got an answer before the exit");
    assert_eq!(owner.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        owner.headers[http::header::CONTENT_TYPE],
        "application/problem+json"
    );
    let problem = owner.json();
    assert_eq!(problem["type"], "urn:idemgate:problem:upstream-timeout");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("may still be running")),
        "{problem}"
    );
    assert!(
        a.log().contains("their keys stay claimed"),
        "the exit said so: {}",
        a.log()
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let held = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: still in flight"
        );
        let retry = post(b.addr, "/orders", &[("idempotency-key", "sent")], "{}").await;
        assert_eq!(retry.status, StatusCode::CONFLICT);
        if retry.json()["type"] != "urn:idemgate:problem:in-flight" {
            break retry;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(held.json()["type"], "urn:idemgate:problem:outcome-unknown");
    assert_eq!(upstream.executed_for("sent"), 1, "never run again");
    upstream.open("sent");
}

/// A Redis config for the shutdown tests below: `drain` and `defaults`, the store's timeout
/// short so a store that is down fails a settlement at once.
fn redis_config(redis: &common::redis_server::RedisServer, drain: &str, defaults: &str) -> String {
    store_config(
        &format!("redis: {{ url: \"{}\", timeout: 500ms }}", redis.url()),
        drain,
        defaults,
    )
}

/// A config with `store` (one line of YAML under `store:`), `drain` and `defaults`.
fn store_config(store: &str, drain: &str, defaults: &str) -> String {
    format!("store:\n  {store}\ndrain_timeout: {drain}\ndefaults: {{ {defaults} }}\n{ROUTES}")
}

/// Sends SIGTERM to `proxy` while its owner of `key` is held at the upstream's gate, waits
/// until the drain started, then lets the upstream answer: the owner's client's result.
async fn answer_during_the_drain(
    upstream: &common::Upstream,
    proxy: &common::ProxyProcess,
    key: &'static str,
    before_the_answer: impl FnOnce(),
) -> Result<common::Answer, String> {
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        try_post(addr, &[("idempotency-key", key), ("x-test-gate", key)]).await
    });
    upstream.arrived(key, 1).await;
    before_the_answer();
    proxy.signal("TERM");
    common::redis_server::wait_until(
        || {
            proxy
                .log()
                .contains("stopping: no new connections, draining")
        },
        "the drain to start",
    );
    upstream.open(key);
    owner.await.unwrap()
}

/// SIGTERM while an owner's call runs, and the store down when the answer comes: the
/// settlement fails, and is made again in the background. The drain waits for it (within
/// `drain_timeout`) rather than exiting with it pending: once Redis is back (empty, as a
/// restart without persistence leaves it), the answer is written, and a retry after the
/// exit is replayed, not run a second time on a key that nothing holds any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_the_store_refused_during_the_drain_is_made_before_the_exit() {
    let mut redis = common::redis_server::RedisServer::start();
    let upstream = start_upstream().await;
    let config = redis_config(&redis, "30s", "lease: 30s");
    let mut a = common::ProxyProcess::start_logging(upstream.addr, &config, "info");
    let answer = answer_during_the_drain(&upstream, &a, "down", || redis.kill()).await;
    let answer = answer.expect("the owner's client got its answer");
    assert_eq!(answer.status, StatusCode::CREATED, "the upstream's answer");
    redis.restart();
    assert!(a.wait_exit().success());
    let b = common::ProxyProcess::start(upstream.addr, &config);
    let retry = post(b.addr, "/orders", &[("idempotency-key", "down")], "{}").await;
    assert!(
        retry.replayed(),
        "the answer was written before the exit: {} {}\n{}",
        retry.status,
        String::from_utf8_lossy(&retry.body),
        a.log()
    );
    assert_eq!(upstream.executed_for("down"), 1, "never run again");
}

/// The same with the store down for the whole drain: the exit waits no longer than
/// `drain_timeout`, and says how many settlements it leaves unwritten, rather than losing
/// them silently (their claims lapse as a dead owner's do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_still_unwritten_when_the_drain_ends_are_logged_at_the_exit() {
    let mut redis = common::redis_server::RedisServer::start();
    let upstream = start_upstream().await;
    let config = redis_config(&redis, "1s", "lease: 30s");
    let mut a = common::ProxyProcess::start_logging(upstream.addr, &config, "info");
    let answer = answer_during_the_drain(&upstream, &a, "lost", || redis.kill()).await;
    assert_eq!(answer.expect("answered").status, StatusCode::CREATED);
    assert!(a.wait_exit().success());
    let log = a.log();
    assert!(
        log.contains("settlements still unwritten") && log.contains("unwritten=1"),
        "the exit named what it left: {log}"
    );
}

/// The memory store ends with its process: a call still running when the drain ends
/// leaves no claim anywhere. The exit says so, not that its key stays claimed, and a
/// retry after the restart runs again (the documented limit of the memory store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_the_drain_on_the_memory_store_says_its_running_calls_are_forgotten() {
    let upstream = start_upstream().await;
    let config = format!("drain_timeout: 300ms\n{ROUTES}");
    let mut a = common::ProxyProcess::start(upstream.addr, &config);
    let addr = a.addr;
    let owner = tokio::spawn(async move {
        try_post(addr, &[("idempotency-key", "mem"), ("x-test-gate", "mem")]).await
    });
    upstream.arrived("mem", 1).await;
    a.signal("TERM");
    assert!(a.wait_exit().success());
    let _ = owner.await;
    let log = a.log();
    assert!(
        !log.contains("their keys stay claimed") && log.contains("the memory store forgets"),
        "the exit told the truth: {log}"
    );
    upstream.open("mem");
    let b = common::ProxyProcess::start(upstream.addr, &config);
    let retry = post(b.addr, "/orders", &[("idempotency-key", "mem")], "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(upstream.executed_for("mem"), 2, "the limit the docs state");
}

/// SIGTERM past the drain on a route with `on_unknown_outcome: release`: the call still
/// running keeps its claim through the exit (no lease is dropped at the exit, which would
/// settle it as released, and log that it did). Another replica's retries are told it is
/// in flight, and take it over only once `lease + background_timeout` has passed since
/// the dead process's last renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_the_drain_on_a_release_route_keeps_the_claim_until_its_grace() {
    let redis = common::redis_server::RedisServer::start();
    let store = format!("redis: {{ url: \"{}\" }}", redis.url());
    release_route_keeps_the_claim_through_the_exit(&store).await;
}

/// The same on PostgreSQL, whose lapses the database's clock decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_the_drain_on_a_postgres_release_route_keeps_the_claim_until_its_grace() {
    let db = common::postgres_server::PostgresServer::start();
    let store = format!("postgres: {{ url: \"{}\" }}", db.url());
    release_route_keeps_the_claim_through_the_exit(&store).await;
}

async fn release_route_keeps_the_claim_through_the_exit(store: &str) {
    let upstream = start_upstream().await;
    let grace = std::time::Duration::from_secs(2);
    let config = store_config(
        store,
        "300ms",
        // Retries are refused, not held: one held as the lapsed claim is released would get
        // the released owner's outcome (a 502), as a waiting duplicate does.
        "lease: 1s, upstream_timeout: 1s, background_timeout: 2s, on_unknown_outcome: release, in_flight: reject",
    );
    let mut a = common::ProxyProcess::start(upstream.addr, &config);
    let b = common::ProxyProcess::start(upstream.addr, &config);
    let addr = a.addr;
    let owner = tokio::spawn(async move {
        try_post(addr, &[("idempotency-key", "rel"), ("x-test-gate", "rel")]).await
    });
    upstream.arrived("rel", 1).await;
    a.signal("TERM");
    assert!(a.wait_exit().success());
    let exited = std::time::Instant::now();
    let _ = owner.await;
    let log = a.log();
    assert!(
        !log.contains("claim dropped unsettled") && !log.contains("within background_timeout"),
        "the exit gave nothing up, and did not say it did: {log}"
    );
    let deadline = exited + std::time::Duration::from_secs(30);
    let taken_over = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: never taken over"
        );
        let retry = post(b.addr, "/orders", &[("idempotency-key", "rel")], "{}").await;
        let now = std::time::Instant::now();
        if retry.status == StatusCode::CREATED {
            break now;
        }
        assert_eq!(retry.status, StatusCode::CONFLICT);
        assert_eq!(retry.problem(), "urn:idemgate:problem:in-flight");
        assert_eq!(
            upstream.executed_for("rel"),
            1,
            "not run again while in flight"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(taken_over - exited >= grace, "{:?}", taken_over - exited);
    assert_eq!(upstream.executed_for("rel"), 2);
    upstream.open("rel");
}
