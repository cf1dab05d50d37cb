//! A reload that changes how keys are made keeps honouring the keys the config before it
//! made: retries of requests answered before it are replayed, duplicates of requests still
//! running across it wait for them, a key reused with another payload is still a 422; and
//! a reload that changes no key makes no second claim.

use http::StatusCode;

use crate::common::redis_server::RedisServer;
use crate::common::{self, post, reload, start_proxy_with_admin, start_upstream, ProxyHandle};
use crate::ROUTES;

/// `ROUTES` with the `orders` route renamed: every key of its requests changes.
fn renamed() -> String {
    ROUTES.replace("- name: orders\n", "- name: purchases\n")
}

/// One route keyed by its body's fingerprint.
const FINGERPRINTED: &str = r#"
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { fingerprint: { body: true } }
"#;

fn rekeyed(proxy: &ProxyHandle, route: &str, found: &str) -> f64 {
    proxy.metric(&format!(
        "idemgate_rekeyed_total{{route=\"{route}\",found=\"{found}\"}}"
    ))
}

/// The owner is held at the upstream's gate across the reload; the duplicate sent after it
/// has a new key, finds the key the old config gave it in flight, waits, and gets the
/// owner's answer; the upstream ran it once. Its retry is replayed from the new key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_sent_after_a_rekeying_reload_waits_for_the_request_still_running() {
    duplicate_across_a_rekeying_reload(ROUTES).await;
}

/// The same on Redis, where the duplicate waits on the earlier key's channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_across_a_rekeying_reload_waits_on_redis_too() {
    let redis = RedisServer::start();
    let store = format!("store:\n  redis: {{ url: \"{}\" }}\n", redis.url());
    duplicate_across_a_rekeying_reload(&format!("{store}{ROUTES}")).await;
}

async fn duplicate_across_a_rekeying_reload(config: &str) {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, config, None).await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [("idempotency-key", "across"), ("x-test-gate", "across")];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("across", 1).await;
    let renamed = config.replace("- name: orders\n", "- name: purchases\n");
    let reloaded = reload(&proxy, upstream.addr, &renamed);
    assert!(reloaded.honoured_until.is_some(), "{reloaded:?}");
    let duplicate =
        tokio::spawn(
            async move { post(addr, "/orders", &[("idempotency-key", "across")], "{}").await },
        );
    proxy.metric_reaches("idemgate_waiting", 1.0).await;
    upstream.open("across");
    let first = owner.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let second = duplicate.await.unwrap();
    assert!(second.replayed(), "the duplicate got the owner's answer");
    assert_eq!(second.body, first.body);
    assert_eq!(upstream.executed_for("across"), 1);
    assert_eq!(rekeyed(&proxy, "purchases", "done"), 1.0);
    let retry = post(addr, "/orders", &[("idempotency-key", "across")], "{}").await;
    assert!(retry.replayed());
    assert_eq!(upstream.executed_for("across"), 1);
}

/// A key reused with another payload is refused across the reload as before it, and the
/// new key is left free: the retry with the first payload is still replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_with_another_payload_across_a_rekeying_reload_is_a_422() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, None).await;
    let key = [("idempotency-key", "reused")];
    let first = post(proxy.addr, "/orders", &key, r#"{"sku":"A1"}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    reload(&proxy, upstream.addr, &renamed());
    let other = post(proxy.addr, "/orders", &key, r#"{"sku":"B2"}"#).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(rekeyed(&proxy, "purchases", "mismatch"), 1.0);
    let retry = post(proxy.addr, "/orders", &key, r#"{"sku":"A1"}"#).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.executed_for("reused"), 1);
}

/// A reload that changes no key (a policy) keeps no previous config, and requests make
/// one claim; after a rename, requests on a route whose keys did not change make one
/// claim too, and a new request on the renamed one runs once, its earlier key held beside
/// and settled with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_requests_whose_keys_changed_claim_their_earlier_key() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, None).await;
    let policies = ROUTES.replace("in_flight: reject\n", "in_flight: reject\n    ttl: 1h\n");
    assert_ne!(policies, ROUTES);
    let reloaded = reload(&proxy, upstream.addr, &policies);
    assert!(reloaded.rekeyed.is_empty(), "{reloaded:?}");
    assert!(reloaded.honoured_until.is_none());
    for path in ["/orders", "/orders/quick"] {
        let key = [("idempotency-key", "plain")];
        assert!(!post(proxy.addr, path, &key, "{}").await.replayed());
        assert!(post(proxy.addr, path, &key, "{}").await.replayed());
    }
    let text = proxy.proxy.metrics().render(proxy.store.stats());
    assert!(!text.contains("idemgate_rekeyed_total{"), "{text}");

    reload(
        &proxy,
        upstream.addr,
        &renamed().replace("in_flight: reject\n", "in_flight: reject\n    ttl: 1h\n"),
    );
    let key = [("idempotency-key", "new")];
    assert!(!post(proxy.addr, "/orders/quick", &key, "{}")
        .await
        .replayed());
    assert!(!post(proxy.addr, "/orders", &key, "{}").await.replayed());
    assert!(post(proxy.addr, "/orders", &key, "{}").await.replayed());
    assert_eq!(upstream.executed_for("new"), 2);
    let text = proxy.proxy.metrics().render(proxy.store.stats());
    assert!(
        !text.contains("idemgate_rekeyed_total{route=\"quick\""),
        "{text}"
    );
    assert_eq!(rekeyed(&proxy, "purchases", "free"), 1.0, "{text}");
    assert_eq!(
        proxy.store.stats().in_flight,
        0,
        "the earlier key was settled"
    );
}

/// With `store.encrypt`, a reload that renames the route and rotates the sealing key at
/// once: the answer sealed for the old key under the old ring is opened, replayed, and
/// stored again sealed for the new key under the new ring, whose next retry replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_answer_is_carried_to_the_new_key_under_the_new_ring() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, byte: u8| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{}\n", hex::encode([byte; 32]))).unwrap();
        path
    };
    let (k1, k2) = (write("k1", 1), write("k2", 2));
    let sealed = |key: &std::path::Path| {
        format!(
            "store: {{ encrypt: {{ key_file: {} }} }}\n{ROUTES}",
            key.display()
        )
    };
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, &sealed(&k1), None).await;
    let key = [("idempotency-key", "sealed")];
    let first = post(proxy.addr, "/orders", &key, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let rotated = sealed(&k2).replace("- name: orders\n", "- name: purchases\n");
    reload(&proxy, upstream.addr, &rotated);
    for _ in 0..2 {
        let retry = post(proxy.addr, "/orders", &key, "{}").await;
        assert_eq!(retry.status, StatusCode::CREATED);
        assert!(retry.replayed());
        assert_eq!(retry.body, first.body);
    }
    assert_eq!(rekeyed(&proxy, "purchases", "done"), 1.0);
    assert_eq!(upstream.executed_for("sealed"), 1);
}

/// On a route with `in_flight: reject`, the duplicate across the reload gets the 409 its
/// earlier key's request in flight gives, and leaves its new key free: once the owner
/// answered, the next retry is replayed, not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_across_a_rekeying_reload_on_a_rejecting_route_gets_409_and_frees_its_key() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, None).await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [("idempotency-key", "quick"), ("x-test-gate", "quick")];
        post(addr, "/orders/quick", &headers, "{}").await
    });
    upstream.arrived("quick", 1).await;
    reload(
        &proxy,
        upstream.addr,
        &ROUTES.replace("- name: quick\n", "- name: fast\n"),
    );
    let key = [("idempotency-key", "quick")];
    let refused = post(addr, "/orders/quick", &key, "{}").await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert_eq!(refused.json()["type"], "urn:idemgate:problem:in-flight");
    assert_eq!(rekeyed(&proxy, "fast", "in_flight"), 1.0);
    upstream.open("quick");
    let first = owner.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = post(addr, "/orders/quick", &key, "{}").await;
    assert!(retry.replayed(), "the new key was freed: {}", retry.status);
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.executed_for("quick"), 1);
}

/// A reload that tells callers apart more finely (a credential header joins the caller)
/// must not hand a caller another's answer from a key the old config shared between them:
/// the other caller's request runs, and the first caller's retry is still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_tells_callers_apart_does_not_share_the_old_keys_between_them() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, None).await;
    let as_caller = |who: &'static str| [("idempotency-key", "shared"), ("x-tenant-key", who)];
    let alice = post(proxy.addr, "/orders", &as_caller("alice"), "{}").await;
    assert_eq!(alice.status, StatusCode::CREATED);
    let reloaded = reload(
        &proxy,
        upstream.addr,
        &format!("credential_headers: [X-Tenant-Key]\n{ROUTES}"),
    );
    assert!(reloaded
        .rekeyed
        .iter()
        .any(|r| r.contains("credential_headers")));
    let bob = post(proxy.addr, "/orders", &as_caller("bob"), "{}").await;
    assert!(!bob.replayed(), "bob never gets alice's answer");
    assert_eq!(upstream.executed_for("shared"), 2);
}

/// A `fields` route keyed by one field alone, as the first config has it.
const REFUNDS: &str = r#"
routes:
  - name: refunds
    match: { methods: [POST], path: /orders/refunds }
    key: { fields: [/refund_id] }
"#;

/// A reload that adds a field to a route's key tells apart requests the old key merged:
/// the old key (one refund id) must not hand the second refund of that id the first one's
/// answer, since the new config says they are two requests (when unsure, they are).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_adds_a_field_to_the_key_does_not_answer_a_new_request_from_the_old_key() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, REFUNDS, None).await;
    let tag = [("idempotency-key", "refund")];
    let first = post(
        proxy.addr,
        "/orders/refunds",
        &tag,
        r#"{"refund_id":"r1","order_id":"o1"}"#,
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let finer = REFUNDS.replace("[/refund_id]", "[/refund_id, /order_id]");
    assert!(!reload(&proxy, upstream.addr, &finer).rekeyed.is_empty());
    let other = post(
        proxy.addr,
        "/orders/refunds",
        &tag,
        r#"{"refund_id":"r1","order_id":"o2"}"#,
    )
    .await;
    assert!(!other.replayed(), "order o2's refund is not order o1's");
    assert_eq!(upstream.executed_for("refund"), 2);
}

/// A reload from derived fingerprints to client keys tells apart two identical orders the
/// client sends with two keys: the second must not get the first's answer from the
/// fingerprint key the old config gave both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_from_fingerprints_to_client_keys_does_not_merge_two_keyed_requests() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, FINGERPRINTED, None).await;
    let order = r#"{"sku":"A1"}"#;
    let first = post(proxy.addr, "/orders", &[("idempotency-key", "one")], order).await;
    assert_eq!(first.status, StatusCode::CREATED);
    reload(&proxy, upstream.addr, ROUTES);
    let second = post(proxy.addr, "/orders", &[("idempotency-key", "two")], order).await;
    assert!(!second.replayed(), "the client named it another request");
    assert_eq!(upstream.executed_for("two"), 1);
}

/// A reload that drops a field from a route's key merges nothing the old key told apart:
/// the retry of a request answered before it is still replayed from the old key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_drops_a_field_from_the_key_still_replays_earlier_answers() {
    let upstream = start_upstream().await;
    let both = REFUNDS.replace("[/refund_id]", "[/refund_id, /order_id]");
    let proxy = start_proxy_with_admin(upstream.addr, &both, None).await;
    let tag = [("idempotency-key", "refund")];
    let body = r#"{"refund_id":"r1","order_id":"o1"}"#;
    let first = post(proxy.addr, "/orders/refunds", &tag, body).await;
    assert_eq!(first.status, StatusCode::CREATED);
    reload(&proxy, upstream.addr, REFUNDS);
    let retry = post(proxy.addr, "/orders/refunds", &tag, body).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.executed_for("refund"), 1);
    assert_eq!(rekeyed(&proxy, "refunds", "done"), 1.0);
}

/// The duplicate across the reload owns its new key while it waits on the old one; its
/// client leaving then frees the new key (nothing went out under it), so the retry that
/// follows owns it, finds the owner's answer under the old key, and is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_whose_client_leaves_while_it_waits_on_the_old_key_frees_its_new_key() {
    use tokio::io::AsyncWriteExt;
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, None).await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [("idempotency-key", "leaves"), ("x-test-gate", "leaves")];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("leaves", 1).await;
    reload(&proxy, upstream.addr, &renamed());
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /orders HTTP/1.1\r\nhost: {addr}\r\nidempotency-key: leaves\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    proxy.metric_reaches("idemgate_waiting", 1.0).await;
    assert_eq!(proxy.store.stats().in_flight, 2, "the old key and the new");
    drop(stream);
    // The proxy's own signal that the new key was let go: one claim is left, the owner's.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while proxy.store.stats().in_flight > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: the new key stayed claimed after its client left"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    upstream.open("leaves");
    let first = owner.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = post(addr, "/orders", &[("idempotency-key", "leaves")], "{}").await;
    assert!(retry.replayed(), "{}", retry.status);
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.executed_for("leaves"), 1);
    assert_eq!(proxy.store.stats().in_flight, 0);
}

/// Replicas sharing a store are reloaded one after the other: while one runs the new
/// config and the other still the old, a request answered on the reloaded one and retried
/// on the other is replayed there, from the key the old config gives it, not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_a_replica_not_yet_reloaded_is_replayed_not_run_again() {
    let redis = RedisServer::start();
    let config = format!("store:\n  redis: {{ url: \"{}\" }}\n{ROUTES}", redis.url());
    let upstream = start_upstream().await;
    let reloaded = start_proxy_with_admin(upstream.addr, &config, None).await;
    let behind = start_proxy_with_admin(upstream.addr, &config, None).await;
    let renamed = config.replace("- name: orders\n", "- name: purchases\n");
    assert!(!reload(&reloaded, upstream.addr, &renamed)
        .rekeyed
        .is_empty());
    let key = [("idempotency-key", "rolling")];
    let first = post(reloaded.addr, "/orders", &key, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let retry = post(behind.addr, "/orders", &key, "{}").await;
    assert!(retry.replayed(), "{}", retry.status);
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.executed_for("rolling"), 1);
}

/// A request routed before a re-keying reload (its head read, the proxy asking for its
/// body with `100 Continue`) and claimed after it is keyed as the old config keys it. Its
/// duplicate, sent after the reload, ran and was answered meanwhile: the straggler finds
/// that answer under its old key and is replayed, not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_routed_before_a_rekeying_reload_and_claimed_after_it_is_replayed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, None).await;
    let mut straggler = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = "POST /orders HTTP/1.1\r\nhost: 127.0.0.1\r\nidempotency-key: straggler\r\n\
                content-type: application/json\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\
                connection: close\r\n\r\n";
    straggler.write_all(head.as_bytes()).await.unwrap();
    // The proxy's signal that it routed the request and is reading its body.
    let mut interim = Vec::new();
    while !interim.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            straggler.read(&mut byte),
        )
        .await
        .expect("hang guard: no 100 Continue");
        assert_eq!(read.unwrap(), 1, "closed before 100 Continue");
        interim.push(byte[0]);
    }
    assert!(interim.starts_with(b"HTTP/1.1 100"), "{interim:?}");
    reload(&proxy, upstream.addr, &renamed());
    let key = [("idempotency-key", "straggler")];
    let first = post(proxy.addr, "/orders", &key, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    straggler.write_all(b"{}").await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        straggler.read_to_end(&mut answer),
    )
    .await
    .expect("hang guard: the straggler got no answer")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(answer.contains("idempotent-replayed: true"), "{answer}");
    assert_eq!(upstream.executed_for("straggler"), 1);
}

/// The request the reloaded replica runs gets no answer within `background_timeout`: its
/// owner gives up, and its key is held as an unknown outcome. The previous config's key
/// held beside it is held alike, not freed: the retry on the replica not yet reloaded gets
/// the unknown outcome's 409, and the request, which may have run, does not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_gives_up_unanswered_holds_the_previous_configs_key_too() {
    let redis = RedisServer::start();
    let routes = ROUTES.replace(
        "defaults: { max_body: 1KiB }",
        "defaults: { max_body: 1KiB, upstream_timeout: 300ms, background_timeout: 600ms }",
    );
    let config = format!("store:\n  redis: {{ url: \"{}\" }}\n{routes}", redis.url());
    let upstream = start_upstream().await;
    let reloaded = start_proxy_with_admin(upstream.addr, &config, None).await;
    let behind = start_proxy_with_admin(upstream.addr, &config, None).await;
    let renamed = config.replace("- name: orders\n", "- name: purchases\n");
    assert!(!reload(&reloaded, upstream.addr, &renamed)
        .rekeyed
        .is_empty());
    let addr = reloaded.addr;
    let first = tokio::spawn(async move {
        let held = [("idempotency-key", "given-up"), ("x-test-gate", "given-up")];
        post(addr, "/orders", &held, "{}").await
    });
    upstream.arrived("given-up", 1).await;
    assert_eq!(first.await.unwrap().status, StatusCode::GATEWAY_TIMEOUT);
    let key = [("idempotency-key", "given-up")];
    let old_key = common::stored_key(&behind, "/orders", &key, b"{}");
    // The store's own signal that the owner gave up: the old key is no longer in flight.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let state = loop {
        let path = format!("/keys/{old_key}");
        let info = common::send(behind.admin, http::Method::GET, &path, &[], "").await;
        let state = match info.status {
            StatusCode::NOT_FOUND => "absent".to_owned(),
            _ => info.json()["state"].as_str().unwrap().to_owned(),
        };
        if state != "in_flight" {
            break state;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: the owner never gave up"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(state, "outcome_unknown");
    let retry = post(behind.addr, "/orders", &key, "{}").await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{}", retry.problem());
    assert_eq!(upstream.executed_for("given-up"), 1);
    upstream.open("given-up");
}

/// A fingerprint route whose `ignore` list a reload extends (`note` joins it) merges only
/// requests that differed in what it now ignores: two requests equal under the old list are
/// equal under the new one. The duplicate sent after the reload, while its first request
/// still runs, waits for it under the old key rather than running again; its retry is
/// replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_ignores_one_more_field_still_holds_duplicates_of_running_requests() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, FINGERPRINTED, None).await;
    let addr = proxy.addr;
    // The fingerprint reads no header: the `idempotency-key` only tags the upstream's count.
    let order = r#"{"sku":"A1","note":"gift"}"#;
    let owner = tokio::spawn(async move {
        let headers = [("idempotency-key", "noted"), ("x-test-gate", "noted")];
        post(addr, "/orders", &headers, order).await
    });
    upstream.arrived("noted", 1).await;
    let ignoring = FINGERPRINTED.replace("{ body: true }", "{ body: true, ignore: [note] }");
    assert!(!reload(&proxy, upstream.addr, &ignoring).rekeyed.is_empty());
    let mut duplicate =
        tokio::spawn(
            async move { post(addr, "/orders", &[("idempotency-key", "noted")], order).await },
        );
    tokio::select! {
        answered = &mut duplicate => panic!(
            "the duplicate was answered while its first request still ran ({}), the upstream ran it {} times",
            answered.unwrap().status,
            upstream.executed_for("noted"),
        ),
        () = proxy.metric_reaches("idemgate_waiting", 1.0) => {}
    }
    upstream.open("noted");
    let first = owner.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let second = duplicate.await.unwrap();
    assert!(second.replayed(), "the duplicate got the owner's answer");
    assert_eq!(second.body, first.body);
    let retry = post(addr, "/orders", &[("idempotency-key", "noted")], order).await;
    assert!(retry.replayed());
    assert_eq!(upstream.executed_for("noted"), 1);
    assert_eq!(rekeyed(&proxy, "orders", "done"), 1.0);
}

/// A team that observed a route turns enforcement on and, in the same reload, renames it:
/// the request observe mode forwarded and recorded before the reload is a request that
/// ran, and its retry after the reload is replayed from the key observe mode wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_an_observed_request_is_replayed_after_a_reload_that_enforces_and_rekeys() {
    let observed = ROUTES.replace(
        "key: { header: Idempotency-Key }\n  - name: quick",
        "key: { header: Idempotency-Key }\n    idempotency: observe\n  - name: quick",
    );
    assert_ne!(observed, ROUTES);
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, &observed, None).await;
    let key = [("idempotency-key", "watched")];
    let first = post(proxy.addr, "/orders", &key, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!reload(&proxy, upstream.addr, &renamed()).rekeyed.is_empty());
    let retry = post(proxy.addr, "/orders", &key, "{}").await;
    assert_eq!(upstream.executed_for("watched"), 1, "the retry ran again");
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
}

/// A path with an escaped `:` whose route enforces nothing runs under the fallback, which
/// protects its spelling as sent (`docs/reverse-proxy.md`); the previous config is looked
/// up by the same rule, so a retry across a reload that re-keys the fallback is replayed
/// from the key the fallback gave it before, not looked up under the unprotected route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_an_escaped_path_the_fallback_protects_is_replayed_across_a_rekeying_reload() {
    let upstream = start_upstream().await;
    let search = "routes:\n  - name: search\n    match: { methods: [POST], path: \"/orders:search\" }\n    idempotency: off\n";
    let proxy = start_proxy_with_admin(upstream.addr, search, None).await;
    let tag = [("idempotency-key", "escaped-search")];
    let body = r#"{"q":"late orders","note":"second try"}"#;
    let first = post(proxy.addr, "/orders%3Asearch", &tag, body).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let ignoring = format!(
        "defaults:\n  key: {{ fingerprint: {{ body: true, query: true, ignore: [note] }} }}\n{search}"
    );
    let reloaded = reload(&proxy, upstream.addr, &ignoring);
    assert!(
        reloaded.honoured_until.is_some(),
        "the reload re-keys the fallback"
    );
    let retry = post(proxy.addr, "/orders%3Asearch", &tag, body).await;
    assert!(retry.replayed(), "{}", retry.status);
    assert_eq!(retry.body, first.body);
    assert_eq!(upstream.executed_for("escaped-search"), 1);
}
