//! `idempotency: observe`: every request is forwarded unchanged while the key is claimed
//! and settled as enforcement would, and what enforcement would have done is counted,
//! logged and shown per key. Switching the route to `on` keeps what observe wrote.

mod common;

use common::redis_server::wait_until;
use common::{post, start_proxy_with_admin, start_upstream, ProxyHandle, ProxyProcess};
use http::{Method, StatusCode};

const OBSERVED: &str = "defaults: { max_body: 1KiB }\nroutes:\n  - name: orders\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key, required: true }\n    idempotency: observe\n";

fn outcome(proxy: &ProxyHandle, outcome: &str) -> f64 {
    proxy.metric(&format!(
        r#"idemgate_requests_total{{route="orders",outcome="{outcome}"}}"#
    ))
}

/// Duplicates, another payload, a request still running, a missing key, an oversized
/// body: each reaches the upstream unchanged and gets the upstream's own answer, and is
/// counted as what enforcement would have done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_forwards_everything_and_counts_what_enforcement_would_do() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, OBSERVED, None).await;
    let key = [("idempotency-key", "k1")];
    for n in 1..=3 {
        let answer = post(proxy.addr, "/orders", &key, r#"{"amount":1}"#).await;
        assert_eq!(answer.status, StatusCode::CREATED);
        assert!(!answer.replayed(), "observe never replays");
        assert_eq!(answer.json()["n"], n, "the upstream ran it");
    }
    let other = post(proxy.addr, "/orders", &key, r#"{"amount":2}"#).await;
    assert_eq!(other.status, StatusCode::CREATED, "no 422 in observe mode");

    // A duplicate of a request still running is forwarded at once, not held.
    let addr = proxy.addr;
    let held = [("idempotency-key", "k2"), ("x-test-gate", "running")];
    let first = tokio::spawn(async move { post(addr, "/orders", &held, "{}").await });
    upstream.arrived("running", 1).await;
    let second = tokio::spawn(async move { post(addr, "/orders", &held, "{}").await });
    upstream.arrived("running", 2).await;
    upstream.open("running");
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(second.await.unwrap().status, StatusCode::CREATED);

    let missing = post(proxy.addr, "/orders", &[], "{}").await;
    assert_eq!(
        missing.status,
        StatusCode::CREATED,
        "no 400 in observe mode"
    );
    let big = "x".repeat(4096);
    let oversized = post(proxy.addr, "/orders", &[("idempotency-key", "k3")], &big).await;
    assert_eq!(
        oversized.status,
        StatusCode::CREATED,
        "no 413 in observe mode"
    );
    assert_eq!(oversized.json()["body"].as_str().unwrap().len(), 4096);

    assert_eq!(upstream.executed(), 8, "every request ran upstream");
    assert_eq!(outcome(&proxy, "executed"), 2.0);
    assert_eq!(outcome(&proxy, "would_replay"), 2.0);
    assert_eq!(outcome(&proxy, "would_mismatch"), 1.0);
    assert_eq!(outcome(&proxy, "would_wait"), 1.0);
    assert_eq!(outcome(&proxy, "would_reject"), 2.0);
    assert_eq!(outcome(&proxy, "replayed"), 0.0);
}

/// The admin API and `idemgate explain` show how often an observed key was seen, and
/// when last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_and_explain_show_how_often_an_observed_key_was_seen() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, OBSERVED, None).await;
    let key = [("idempotency-key", "seen-3")];
    for _ in 0..3 {
        post(proxy.addr, "/orders", &key, "{}").await;
    }
    let digest = common::stored_key(&proxy, "/orders", &key, b"{}");
    let info = common::send(
        proxy.admin,
        Method::GET,
        &format!("/keys/{digest}"),
        &[],
        "",
    )
    .await;
    assert_eq!(info.status, StatusCode::OK);
    let doc = info.json();
    assert_eq!(doc["state"], "done");
    assert_eq!(doc["seen"]["times"], 3, "{doc}");
    assert!(doc["seen"]["last"].as_u64().unwrap() >= doc["created"].as_u64().unwrap());

    // explain reads the key from the running proxy through the admin listener its config
    // names.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:1\nupstream: http://{}\nadmin: {}\n{OBSERVED}",
            upstream.addr, proxy.admin
        ),
    )
    .unwrap();
    let body = dir.path().join("body.json");
    std::fs::write(&body, "{}").unwrap();
    let text = common::explain_cli(
        &config,
        &[
            "--method",
            "POST",
            "--path",
            "/orders",
            "-H",
            "Idempotency-Key: seen-3",
            "-H",
            &format!("Host: {}", proxy.addr),
            "--client-ip",
            "127.0.0.1",
            "--body",
            body.to_str().unwrap(),
        ],
    );
    assert!(text.contains("protection:        observe"), "{text}");
    assert!(
        text.contains(&format!("key digest:        {digest}")),
        "{text}"
    );
    assert!(text.contains("in the store:      done"), "{text}");
    assert!(text.contains("seen:              3 times"), "{text}");
}

/// A retry of a request whose outcome is unknown (its upstream took it and never
/// answered within `background_timeout`) is what enforcement would hold with a 409: in
/// observe mode it is forwarded to the upstream, gets the upstream's own answer, and is
/// counted `would_hold`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_an_unknown_outcome_is_forwarded_and_counted_as_would_hold() {
    let upstream = start_upstream().await;
    let config = OBSERVED.replace(
        "idempotency: observe\n",
        "idempotency: observe\n    upstream_timeout: 200ms\n    background_timeout: 400ms\n",
    );
    let proxy = start_proxy_with_admin(upstream.addr, &config, None).await;
    let lost = [("idempotency-key", "lost"), ("x-test-gate", "never")];
    let timed_out = post(proxy.addr, "/orders", &lost, "{}").await;
    assert_eq!(timed_out.status, StatusCode::GATEWAY_TIMEOUT);
    wait_until(
        || proxy.metric(r#"idemgate_unknown_outcomes_total{route="orders"}"#) == 1.0,
        "the first request's outcome to be recorded as unknown",
    );

    let retry = post(proxy.addr, "/orders", &[("idempotency-key", "lost")], "{}").await;
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "observe mode never answers 409 outcome-unknown"
    );
    assert!(!retry.replayed());
    assert_eq!(retry.json()["n"], 2, "the upstream ran the retry");
    assert_eq!(upstream.executed(), 2);
    assert_eq!(outcome(&proxy, "would_hold"), 1.0);
    assert_eq!(outcome(&proxy, "unknown"), 1.0);
}

/// A route observed, then switched to `on` by a reload: the records observe wrote stay,
/// so the first duplicate after the switch already replays. Each duplicate observed was
/// logged with its route, key prefix and the age of its first request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_from_observe_to_on_replays_what_observe_stored() {
    let upstream = start_upstream().await;
    let proxy = ProxyProcess::start_logging(upstream.addr, OBSERVED, "info");
    let key = [("idempotency-key", "switch")];
    let first = post(proxy.addr, "/orders", &key, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let observed = post(proxy.addr, "/orders", &key, "{}").await;
    assert!(!observed.replayed());
    wait_until(
        || proxy.log().contains("observed a duplicate"),
        "the observe log line",
    );
    let log = proxy.log();
    let line = log
        .lines()
        .find(|l| l.contains("observed a duplicate"))
        .unwrap();
    for field in [
        "route=orders",
        "would=would_replay",
        "first_age_ms=",
        "key=",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }

    let text = std::fs::read_to_string(&proxy.config).unwrap();
    std::fs::write(
        &proxy.config,
        text.replace("idempotency: observe", "idempotency: on"),
    )
    .unwrap();
    proxy.signal("HUP");
    wait_until(
        || proxy.log().contains("config reloaded"),
        "the reload log line",
    );
    let after = post(proxy.addr, "/orders", &key, "{}").await;
    assert!(after.replayed(), "the record observe wrote is replayed");
    assert_eq!(after.json()["n"], first.json()["n"]);
    assert_eq!(upstream.executed(), 2);
}

/// A full store with `when_full: reject`, on an observed route that fails open: the new key
/// is forwarded (a dry run refuses nothing) and counted as the refusal enforcement would
/// have answered, not as a store outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_a_full_store_refuses_is_counted_as_would_reject() {
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  memory: {{ max_entries: 1, when_full: reject }}\n{}",
        OBSERVED.replace(
            "idempotency: observe\n",
            "idempotency: observe\n    on_store_error: fail_open\n"
        )
    );
    let proxy = start_proxy_with_admin(upstream.addr, &config, None).await;
    let first = post(proxy.addr, "/orders", &[("idempotency-key", "k0")], "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let refused = post(proxy.addr, "/orders", &[("idempotency-key", "k1")], "{}").await;
    assert_eq!(
        refused.status,
        StatusCode::CREATED,
        "no 503 in observe mode"
    );
    assert_eq!(upstream.executed(), 2);
    assert_eq!(outcome(&proxy, "would_reject"), 1.0);
    assert_eq!(outcome(&proxy, "fail_open"), 0.0);
}

/// A duplicate of a request still running is counted as what the route's `in_flight`
/// would have done: a 409 with `reject`; with `wait`, a hold whose answer depends on an
/// outcome not known yet, so neither a 409 nor a replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_duplicate_counts_as_the_routes_in_flight_mode_would_answer() {
    for (mode, counted, not) in [
        ("wait", "would_wait", "would_conflict"),
        ("reject", "would_conflict", "would_wait"),
    ] {
        let upstream = start_upstream().await;
        let config = OBSERVED.replace(
            "idempotency: observe\n",
            &format!("idempotency: observe\n    in_flight: {mode}\n"),
        );
        let proxy = start_proxy_with_admin(upstream.addr, &config, None).await;
        let addr = proxy.addr;
        let held = [("idempotency-key", "k"), ("x-test-gate", "running")];
        let first = tokio::spawn(async move { post(addr, "/orders", &held, "{}").await });
        upstream.arrived("running", 1).await;
        let second = tokio::spawn(async move { post(addr, "/orders", &held, "{}").await });
        upstream.arrived("running", 2).await;
        upstream.open("running");
        assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
        assert_eq!(second.await.unwrap().status, StatusCode::CREATED);
        assert_eq!(outcome(&proxy, counted), 1.0, "in_flight: {mode}");
        assert_eq!(outcome(&proxy, not), 0.0, "in_flight: {mode}");
        assert_eq!(outcome(&proxy, "would_replay"), 0.0, "in_flight: {mode}");
    }
}

/// `idempotency: observe` written in `defaults`, with no routes: the fallback that keys
/// every POST by its fingerprint observes too. A POST sent twice reaches the upstream
/// twice, and the second is counted as the replay enforcement would have answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_in_defaults_applies_to_requests_matching_no_route() {
    let upstream = start_upstream().await;
    let proxy =
        start_proxy_with_admin(upstream.addr, "defaults: { idempotency: observe }\n", None).await;
    for n in 1..=2 {
        let answer = post(proxy.addr, "/orders/unrouted", &[], r#"{"sku":"A1"}"#).await;
        assert_eq!(answer.status, StatusCode::CREATED);
        assert!(!answer.replayed(), "observe never replays");
        assert_eq!(answer.json()["n"], n, "the upstream ran it");
    }
    assert_eq!(upstream.executed(), 2);
    let counted = |outcome: &str| {
        proxy.metric(&format!(
            r#"idemgate_requests_total{{route="default",outcome="{outcome}"}}"#
        ))
    };
    assert_eq!(counted("executed"), 1.0);
    assert_eq!(counted("would_replay"), 1.0);
    assert_eq!(counted("replayed"), 0.0);
}

/// A dry run answers with the upstream's answer, whatever the store does meanwhile: an
/// observed owner whose store is slow to record the outcome (Redis answers the claim,
/// then nothing until its `timeout`, longer than the route's `upstream_timeout`) gets the
/// upstream's `201` once the store has failed, not a `504` for an upstream that did
/// answer: observe replays nothing, so the 504 would only make the client retry, and the
/// retry run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observed_answer_is_never_turned_into_a_504_by_a_slow_store() {
    use std::sync::atomic::Ordering;
    let redis = common::redis_server::RedisServer::start();
    let relay = common::relay::relay_to(redis.port).await;
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  redis: {{ url: \"redis://{}\", timeout: 1s }}\n{}",
        relay.addr,
        OBSERVED.replace(
            "idempotency: observe\n",
            "idempotency: observe\n    upstream_timeout: 300ms\n"
        )
    );
    let proxy = common::start_proxy(upstream.addr, &config).await;
    // The connection to Redis is open, and how it swaps is known.
    let warm = post(proxy.addr, "/orders", &[("idempotency-key", "warm")], "{}").await;
    assert_eq!(warm.status, StatusCode::CREATED);
    // The claim is answered; the outcome's write then gets no reply.
    relay.hold_after_next.store(true, Ordering::SeqCst);
    let answer = post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "slow-store")],
        "{}",
    )
    .await;
    relay.hold.send_replace(false);
    assert_eq!(upstream.executed(), 2);
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "the upstream answered 201; the client got {} {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(answer.json()["n"], 2);
}

/// A real upstream that answers every request on `/orders` with `answer` (raw HTTP/1.1
/// bytes) after reading its body, and counts them.
async fn raw_upstream(
    answer: &'static [u8],
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let executed = std::sync::Arc::clone(&count);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let executed = std::sync::Arc::clone(&executed);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while common::read_one_request(&mut stream, &mut buf).await {
                    executed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if stream.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, count)
}

/// gRPC says how a call ended in its trailers (`grpc-status`): an observed route forwards
/// them to its client, the first request's and its duplicates' alike, as the route did
/// before it was observed; dropped, every call would end without a status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observed_answer_keeps_its_trailers() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    let (upstream, executed) = raw_upstream(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ntransfer-encoding: chunked\r\n\
          trailer: grpc-status, grpc-message\r\n\r\n\
          5\r\nhello\r\n0\r\ngrpc-status: 13\r\ngrpc-message: boom\r\n\r\n",
    )
    .await;
    // The upstream speaks HTTP/1.1 only, whatever protocol the suite's run asks for.
    let config = format!("connections: {{ upstream_protocol: http1 }}\n{OBSERVED}");
    let proxy = start_proxy_with_admin(upstream, &config, None).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    for n in 1..=2 {
        let request = http::Request::post(format!("http://{}/orders", proxy.addr))
            .header("idempotency-key", "grpc-1")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected.trailers().cloned();
        assert_eq!(collected.to_bytes(), "hello", "request {n}");
        let trailers = trailers.unwrap_or_else(|| panic!("request {n} lost its trailers"));
        assert_eq!(trailers["grpc-status"], "13", "request {n}");
        assert_eq!(trailers["grpc-message"], "boom", "request {n}");
    }
    assert_eq!(executed.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// An observed request too large to buffer is forwarded as it streams in; its answer is
/// read within the route's `upstream_timeout`, as an owner's client waits: an upstream
/// that sends a head and then stalls in its body gets the client a 504 then, not after the
/// body's own read gap (a minute by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observed_request_too_large_to_buffer_waits_no_longer_than_upstream_timeout() {
    let (upstream, executed) =
        raw_upstream(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nab").await;
    let config = format!(
        "connections: {{ upstream_protocol: http1 }}\n{}",
        OBSERVED.replace("max_body: 1KiB", "max_body: 1KiB, upstream_timeout: 300ms")
    );
    let proxy = start_proxy_with_admin(upstream, &config, None).await;
    let large = "x".repeat(4096);
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        common::post(proxy.addr, "/orders", &[("idempotency-key", "big")], &large),
    )
    .await
    .expect("hang guard: the client waited past upstream_timeout");
    assert_eq!(answer.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(executed.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// Observe forwards the upstream's answer untouched, its own `Idempotent-Replayed` too:
/// only an answer the proxy stores and replays loses it, and a dry run replays nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_passes_the_upstream_s_own_replayed_header_on() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, OBSERVED, None).await;
    let headers = [("idempotency-key", "said-1"), ("x-test-replayed", "yes")];
    for n in 1..=2 {
        let answer = post(proxy.addr, "/orders", &headers, "{}").await;
        assert_eq!(answer.status, StatusCode::CREATED, "request {n}");
        let said: Vec<_> = answer
            .headers
            .get_all("idempotent-replayed")
            .iter()
            .collect();
        assert_eq!(said, ["yes"], "request {n}");
    }
    assert_eq!(upstream.executed(), 2);
}
