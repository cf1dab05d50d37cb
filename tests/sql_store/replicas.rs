//! Exactly once between replicas: two proxy processes on one PostgreSQL or MariaDB execute
//! each key once, also while the database restarts under their load (503s meanwhile,
//! nothing lost).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;

use crate::common::mariadb_server::MariadbServer;
use crate::common::postgres_server::PostgresServer;
use crate::common::{self, post, start_upstream, ProxyProcess};
use crate::{config, until, until_ready, Database};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxy_processes_on_one_postgres_execute_each_key_once() {
    two_proxies_execute_each_key_once(&PostgresServer::start()).await;
}

/// On MariaDB a duplicate on the other replica is woken by the re-check of its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxy_processes_on_one_mariadb_execute_each_key_once() {
    two_proxies_execute_each_key_once(&MariadbServer::start()).await;
}

/// 200 concurrent requests over 10 keys, alternating between two proxy processes on `db`:
/// each key executes once and every answer for it is the same.
async fn two_proxies_execute_each_key_once(db: &dyn Database) {
    common::two_proxies_execute_each_key_once(&config(db, "wait_timeout: 30s")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_under_load_answers_503_meanwhile_and_loses_nothing() {
    restarted_under_load(&mut PostgresServer::start()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_restarted_under_load_answers_503_meanwhile_and_loses_nothing() {
    restarted_under_load(&mut MariadbServer::start()).await;
}

/// What one request of the background load got.
struct Got {
    key: String,
    status: StatusCode,
    body: Bytes,
}

/// Keeps sending requests over 20 keys, alternating between `targets`, until `stop`;
/// counts the 503s it gets in `unavailable` as they come.
fn load(
    targets: [SocketAddr; 2],
    stop: Arc<AtomicBool>,
    unavailable: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Vec<Got>> {
    tokio::spawn(async move {
        let mut got = Vec::new();
        let mut n = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let batch: Vec<_> = (0..10)
                .map(|i| {
                    let target = targets[(n + i) % 2];
                    let key = format!("load-{}", (n + i) % 20);
                    tokio::spawn(async move {
                        let answer =
                            post(target, "/orders", &[("idempotency-key", &key)], "{}").await;
                        Got {
                            key,
                            status: answer.status,
                            body: answer.body,
                        }
                    })
                })
                .collect();
            for request in batch {
                let request = request.await.unwrap();
                if request.status == StatusCode::SERVICE_UNAVAILABLE {
                    unavailable.fetch_add(1, Ordering::Relaxed);
                }
                got.push(request);
            }
            n += 10;
        }
        got
    })
}

/// Two proxies with `on_store_error: fail_closed` on `db`, under a steady load, with keys
/// answered before and owners running across the outage: while the database is down every
/// protected request gets 503 and reaches nobody; when it is back the running owners
/// settle, and every answer the store acknowledged replays, after a second restart too;
/// no key ever executes twice.
async fn restarted_under_load(db: &mut dyn Database) {
    let upstream = start_upstream().await;
    let config = config(db, "on_store_error: fail_closed, wait_timeout: 30s");
    let a = ProxyProcess::start(upstream.addr, &config);
    let b = ProxyProcess::start(upstream.addr, &config);
    until_ready([a.admin, b.admin]).await;
    // Answered (and stored) before the outage.
    let mut acknowledged: Vec<(String, Bytes)> = Vec::new();
    for i in 0..10 {
        let key = format!("before-{i}");
        let target = if i % 2 == 0 { a.addr } else { b.addr };
        let answer = post(target, "/orders", &[("idempotency-key", &key)], "{}").await;
        assert_eq!(answer.status, StatusCode::CREATED);
        acknowledged.push((key, answer.body));
    }
    // Owners whose upstream call runs across the outage.
    let held: Vec<_> = (0..5)
        .map(|i| {
            let key = format!("held-{i}");
            let target = if i % 2 == 0 { a.addr } else { b.addr };
            tokio::spawn(async move {
                let headers = [("idempotency-key", key.as_str()), ("x-test-gate", "held")];
                let answer = post(target, "/orders", &headers, "{}").await;
                (key, answer)
            })
        })
        .collect();
    upstream.arrived("held", 5).await;
    let stop = Arc::new(AtomicBool::new(false));
    let unavailable = Arc::new(AtomicUsize::new(0));
    let background = load(
        [a.addr, b.addr],
        Arc::clone(&stop),
        Arc::clone(&unavailable),
    );

    db.stop();
    // Sent together: each waits the store's timeout (1 s) before its 503.
    let down: Vec<_> = (0..10)
        .map(|i| {
            let key = format!("down-{i}");
            let target = if i % 2 == 0 { a.addr } else { b.addr };
            tokio::spawn(async move {
                let answer = post(target, "/orders", &[("idempotency-key", &key)], "{}").await;
                (key, answer)
            })
        })
        .collect();
    for request in down {
        let (key, answer) = request.await.unwrap();
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{key}");
        assert_eq!(
            answer.json()["type"],
            "urn:idemgate:problem:store-unavailable"
        );
        assert_eq!(
            upstream.executed_for(&key),
            0,
            "{key} went through unprotected"
        );
    }
    // The outage lasts until the load has met it, however slowly the load runs.
    until(
        || unavailable.load(Ordering::Relaxed) > 0,
        "the load to meet the outage",
    )
    .await;
    db.start_again();
    until_ready([a.admin, b.admin]).await;

    // The owners that ran across the outage settle now.
    upstream.open("held");
    for owner in held {
        let (key, answer) = owner.await.unwrap();
        assert_eq!(answer.status, StatusCode::CREATED, "{key}");
        acknowledged.push((key, answer.body));
    }
    // And the database restarted once more, still under load (`pg_ctl restart -m fast`).
    db.restart();
    until_ready([a.admin, b.admin]).await;
    stop.store(true, Ordering::Relaxed);
    let got = background.await.unwrap();

    for (key, body) in &acknowledged {
        for target in [a.addr, b.addr] {
            let replay = post(target, "/orders", &[("idempotency-key", key)], "{}").await;
            assert!(replay.replayed(), "{key}: {:?}", replay.status);
            assert_eq!(&replay.body, body, "{key}");
        }
    }
    // The load saw answers, the outage's 503s, (for a request whose owner could not
    // reach the database) 409s, and 502s for duplicates whose owner's claim was cut off
    // by the outage and then released (the owner got its 503; nothing ran); every answer
    // of a key is the one execution's.
    let mut bodies: HashMap<&str, &Bytes> = HashMap::new();
    let mut statuses: HashMap<StatusCode, usize> = HashMap::new();
    for g in &got {
        *statuses.entry(g.status).or_default() += 1;
        match g.status {
            StatusCode::CREATED => {
                let first = bodies.entry(&g.key).or_insert(&g.body);
                assert_eq!(*first, &g.body, "{} answered two executions", g.key);
            }
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::CONFLICT => {}
            StatusCode::BAD_GATEWAY
                if serde_json::from_slice::<serde_json::Value>(&g.body).is_ok_and(|p| {
                    p["type"] == "urn:idemgate:problem:duplicate-of-failed-request"
                }) => {}
            other => panic!(
                "{}: unexpected {other}: {}",
                g.key,
                String::from_utf8_lossy(&g.body)
            ),
        }
    }
    assert!(
        statuses.contains_key(&StatusCode::SERVICE_UNAVAILABLE),
        "the load never met the outage: {statuses:?}"
    );
    assert_eq!(
        upstream.most_executions_of_one_key(),
        1,
        "a key executed twice"
    );
}
