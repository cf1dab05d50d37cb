//! What the connection does when the server behind its address changes: a primary demoted
//! to a replica (a failover behind a DNS name or virtual IP) is left for the one now
//! behind the address.

use std::sync::atomic::Ordering;

use http::StatusCode;

use crate::common::redis_server::RedisServer;
use crate::common::relay::relay_to;
use crate::common::{post, start_proxy, start_upstream};
use crate::redis_yaml;

/// A failover behind one address: the proxy's connection still reaches the old primary,
/// now a replica that answers every write `READONLY`, while new connections reach the new
/// primary. The proxy reconnects instead of failing every claim until it restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_is_left_for_the_new_one() {
    let old = RedisServer::start();
    let new = RedisServer::start();
    let relay = relay_to(old.port).await;
    let upstream = start_upstream().await;
    let url = format!("redis://{}", relay.addr);
    let proxy = start_proxy(
        upstream.addr,
        &redis_yaml(&url, "on_store_error: fail_closed"),
    )
    .await;
    let warm = post(proxy.addr, "/orders", &[("idempotency-key", "warm")], "{}").await;
    assert_eq!(warm.status, StatusCode::CREATED);

    let port = new.port.to_string();
    assert_eq!(old.cli(&["REPLICAOF", "127.0.0.1", &port]).trim(), "OK");
    relay.target.store(new.port, Ordering::SeqCst);

    let first = post(proxy.addr, "/orders", &[("idempotency-key", "moved")], "{}").await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let again = post(proxy.addr, "/orders", &[("idempotency-key", "moved")], "{}").await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(upstream.executed_for("moved"), 1);
}
