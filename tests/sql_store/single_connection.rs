//! `max_connections` counts the connections statements run on: PostgreSQL's `LISTEN`
//! has one of its own beside them, so a pool of one still claims, settles and wakes the
//! duplicates waiting on an owner.

use http::StatusCode;

use crate::common::postgres_server::PostgresServer;
use crate::common::{post, start_proxy, start_upstream};

/// With `max_connections: 1` a repeat gets the replay, and so does a duplicate that waited
/// on a running owner (it waits only once the `LISTEN` connection listens, and is woken
/// by its `NOTIFY`); the upstream runs each key once, and the database sees no more than
/// the pooled connection and the listener's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_works_with_a_single_connection() {
    let db = PostgresServer::start();
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  postgres: {{ url: \"{}\", timeout: 1s, max_connections: 1 }}\ndefaults: {{ wait_timeout: 30s }}\nroutes:\n  - name: create-order\n    match: {{ methods: [POST], path: /orders }}\n    key: {{ header: Idempotency-Key, required: true }}\n",
        db.url()
    );
    let proxy = start_proxy(upstream.addr, &config).await;

    let first = post(proxy.addr, "/orders", &[("idempotency-key", "one")], "{}").await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let repeat = post(proxy.addr, "/orders", &[("idempotency-key", "one")], "{}").await;
    assert_eq!(repeat.status, StatusCode::CREATED, "{:?}", repeat.body);
    assert!(repeat.replayed());
    assert_eq!(upstream.executed_for("one"), 1);

    let pay = [("idempotency-key", "pay"), ("x-test-gate", "pay")];
    let addr = proxy.addr;
    let owner = tokio::spawn(async move { post(addr, "/orders", &pay, "{}").await });
    upstream.arrived("pay", 1).await;
    let duplicate = tokio::spawn(async move { post(addr, "/orders", &pay, "{}").await });
    proxy.metric_reaches("idemgate_waiting", 1.0).await;
    upstream.open("pay");
    assert_eq!(owner.await.unwrap().status, StatusCode::CREATED);
    let duplicate = duplicate.await.unwrap();
    assert_eq!(
        duplicate.status,
        StatusCode::CREATED,
        "{:?}",
        duplicate.body
    );
    assert!(duplicate.replayed());
    assert_eq!(upstream.executed_for("pay"), 1);

    let connections =
        db.psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idemgate'");
    assert!(
        connections.trim().parse::<u32>().unwrap() <= 2,
        "idemgate holds {connections} connections"
    );
}
