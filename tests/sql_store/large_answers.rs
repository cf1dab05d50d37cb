//! An answer larger than one statement may carry to MySQL/MariaDB (`max_allowed_packet`,
//! 16 MiB by default on MariaDB) cannot be stored; the request ran all the same, so its
//! key records "executed, answer not stored" and a repeat never runs it again. A failure
//! that large cannot be shared with waiters, and frees its key as any failure does.

use http::StatusCode;

use crate::common::mariadb_server;
use crate::common::{post, start_proxy, start_upstream};
use crate::until;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_an_answer_over_max_allowed_packet_is_recorded_as_not_stored_and_never_rerun() {
    let db = mariadb_server::shared();
    let upstream = start_upstream().await;
    // A claim that went unrecorded would be taken over after a second: lease, then grace.
    let defaults =
        "max_answer: 48MiB, lease: 300ms, upstream_timeout: 700ms, background_timeout: 700ms, \
                    on_unknown_outcome: release";
    let proxy = start_proxy(
        upstream.addr,
        &format!(
            "store:\n  mysql: {{ url: \"{}\", table: big_answers, timeout: 1s }}\n\
             defaults: {{ {defaults} }}\nroutes:\n  - name: create-order\n    \
             match: {{ methods: [POST], path: /orders }}\n    \
             key: {{ header: Idempotency-Key, required: true }}\n",
            db.url()
        ),
    )
    .await;
    let big = (20usize << 20).to_string();
    let headers = [("idempotency-key", "big"), ("x-test-bytes", big.as_str())];
    let first = post(proxy.addr, "/orders", &headers, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        first.body.len(),
        20 << 20,
        "the client gets the whole answer"
    );
    // The key is settled one way or the other: recorded, or its claim gone past lease
    // and grace, to be taken over.
    let live = "SELECT kind FROM idemgate.big_answers WHERE expires_at > UTC_TIMESTAMP(3)";
    until(|| db.sql(live).trim() != "I", "the claim to end").await;
    let repeat = post(proxy.addr, "/orders", &headers, "{}").await;
    assert_eq!(
        upstream.executed_for("big"),
        1,
        "ran again: the repeat answered {}",
        repeat.status
    );
    assert_ne!(repeat.status, StatusCode::CREATED);
}

/// A `5xx` frees its key for the next request, its waiters sharing the answer a moment; an
/// answer of that size cannot be shared, but must not keep the key either: left as it
/// was, the claim would lapse into an unknown outcome and refuse every retry for `ttl`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_failure_over_max_allowed_packet_still_frees_its_key() {
    let db = mariadb_server::shared();
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &format!(
            "store:\n  mysql: {{ url: \"{}\", table: big_failures, timeout: 1s }}\n\
             defaults: {{ max_answer: 48MiB, lease: 300ms }}\nroutes:\n  - name: create-order\n    \
             match: {{ methods: [POST], path: /orders }}\n    \
             key: {{ header: Idempotency-Key, required: true }}\n",
            db.url()
        ),
    )
    .await;
    let big = (20usize << 20).to_string();
    let headers = [
        ("idempotency-key", "big-failure"),
        ("x-test-bytes", big.as_str()),
        ("x-test-status", "503"),
    ];
    let first = post(proxy.addr, "/orders", &headers, "{}").await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    // Freed, or its claim's lease run out without a renewal.
    let live = "SELECT 1 FROM idemgate.big_failures
                WHERE expires_at > UTC_TIMESTAMP(3) AND kind = 'I'
                AND lease_until > UTC_TIMESTAMP(3)";
    until(|| db.sql(live).trim().is_empty(), "the claim to end").await;
    let retry = post(proxy.addr, "/orders", &headers, "{}").await;
    assert_eq!(
        retry.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "the retry runs: {:?}",
        retry.headers.get("content-type")
    );
    assert_eq!(upstream.executed_for("big-failure"), 2);
}
