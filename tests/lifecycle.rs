//! The life of a claim around the operator and the process: an admin purge never frees a
//! key whose owner still runs, and a shutdown answers the duplicates it was holding.

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
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, ROUTES, None).await;
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
