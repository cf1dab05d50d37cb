//! Owners that are not dead: one cut off from the database while its call still runs is
//! never run a second time beside it (its lapsed claim is held at least
//! `background_timeout`), and a duplicate that found the owner in flight shares the
//! owner's failure even when it lands between the duplicate's two looks (PostgreSQL).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::common::mariadb_server::MariadbServer;
use crate::common::postgres_server::PostgresServer;
use crate::common::relay::relay_to;
use crate::common::{post, start_upstream, Answer, ProxyProcess};
use crate::{config, Database};

/// `db`'s `store:` section with its address replaced by `port` (a relay in front of it).
fn store_via(db: &dyn Database, db_port: u16, port: u16) -> String {
    db.store_yaml()
        .replace(&format!(":{db_port}/"), &format!(":{port}/"))
}

/// A replica's owner still waits on a slow upstream (well within `background_timeout`)
/// when its link to the database breaks, so its renewals fail and its claim lapses.
/// Retries through another replica hear "in flight", then "outcome unknown"; past the
/// route's `ttl` (shorter than `background_timeout`, as a fingerprint key's is by default)
/// they must still not run the request beside the first, which is still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_owner_cut_off_from_the_database_is_never_run_again_while_it_runs() {
    let db = PostgresServer::start();
    cut_off_owner_is_never_run_again(&db, db.port).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_owner_cut_off_from_the_database_is_never_run_again_while_it_runs() {
    let db = MariadbServer::start();
    cut_off_owner_is_never_run_again(&db, db.port).await;
}

async fn cut_off_owner_is_never_run_again(db: &dyn Database, db_port: u16) {
    let link = relay_to(db_port).await;
    let upstream = start_upstream().await;
    let defaults =
        "lease: 600ms, ttl: 1s, upstream_timeout: 30s, background_timeout: 60s, wait_timeout: 100ms";
    let cut_off = config(db, defaults).replacen(
        &db.store_yaml(),
        &store_via(db, db_port, link.addr.port()),
        1,
    );
    let a = ProxyProcess::start(upstream.addr, &cut_off);
    let b = ProxyProcess::start(upstream.addr, &config(db, defaults));
    let owner = at_gate(a.addr, "slow", "slow");
    upstream.arrived("slow", 1).await;
    link.cut.store(true, Ordering::SeqCst);
    // Past lease + ttl, with room to spare: what the hold used to be.
    let until = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    while Instant::now() < until {
        let retry = post(b.addr, "/orders", &[("idempotency-key", "slow")], "{}").await;
        assert_eq!(
            retry.status,
            StatusCode::CONFLICT,
            "a retry ran beside the owner, which still runs, after {seen:?}: {:?}",
            retry.body
        );
        let kind = retry.problem();
        if seen.last() != Some(&kind) {
            seen.push(kind);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!owner.is_finished(), "the owner still runs");
    assert_eq!(upstream.executed_for("slow"), 1);
    assert_eq!(
        seen.last().map(String::as_str),
        Some("urn:idemgate:problem:outcome-unknown"),
        "the claim lapsed and is held: {seen:?}"
    );
    link.cut.store(false, Ordering::SeqCst);
    upstream.open("slow");
    let _ = owner.await;
}

/// Sends a request through `addr` that waits at the upstream's gate `gate`.
fn at_gate(
    addr: SocketAddr,
    key: &'static str,
    gate: &'static str,
) -> tokio::task::JoinHandle<Answer> {
    tokio::spawn(async move {
        post(
            addr,
            "/orders",
            &[("idempotency-key", key), ("x-test-gate", gate)],
            "{}",
        )
        .await
    })
}

/// On PostgreSQL a duplicate's claim looks twice: once plainly, then, after joining the
/// key's waiters, again. If the owner settles a failure (its 5xx) between the two looks,
/// the duplicate, which found the request in flight, must share the owner's 500, never
/// take the failure record over and run the request itself. A relay holds what b sends
/// after the first look's answer so that the owner's failure lands between them: after the
/// answer's row, since a look on a connection that has not prepared the claim first has the
/// statement parsed, a round trip of its own that answers no row (holding after that held
/// the first look itself: the failure landed before it, and the fresh request rightly ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_duplicate_shares_a_failure_its_owner_settles_between_its_two_looks() {
    let db = PostgresServer::start();
    let relay = relay_to(db.port).await;
    let upstream = start_upstream().await;
    let a = ProxyProcess::start(upstream.addr, &config(&db, "wait_timeout: 30s"));
    let b_store = format!(
        "  postgres: {{ url: \"postgres://idemgate@127.0.0.1:{}/postgres\", timeout: 30s }}\n",
        relay.addr.port()
    );
    let b = ProxyProcess::start(
        upstream.addr,
        &config(&db, "wait_timeout: 30s").replacen(&db.store_yaml(), &b_store, 1),
    );
    for (proxy, key) in [(&a, "warm-a"), (&b, "warm-b")] {
        let warm = post(proxy.addr, "/orders", &[("idempotency-key", key)], "{}").await;
        assert_eq!(warm.status, StatusCode::CREATED);
    }
    let aa = a.addr;
    let owner = tokio::spawn(async move {
        let headers = [
            ("idempotency-key", "fails"),
            ("x-test-gate", "fails"),
            ("x-test-status", "500"),
        ];
        post(aa, "/orders", &headers, "{}").await
    });
    upstream.arrived("fails", 1).await;
    // The duplicate's first look passes; what b sends after its answer waits. The claim
    // is the only statement b runs now that answers a row (its reaper, a new connection's
    // session setup and its listener answer none).
    relay
        .hold_requests_after_next_row
        .store(true, Ordering::SeqCst);
    let bb = b.addr;
    let duplicate =
        tokio::spawn(
            async move { post(bb, "/orders", &[("idempotency-key", "fails")], "{}").await },
        );
    let deadline = Instant::now() + Duration::from_secs(30);
    while relay.requests_held() == 0 {
        assert!(
            Instant::now() < deadline,
            "hang guard: the second look never came"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The first look ran in the database and found the owner in flight (its row went
    // through: outcome 2, the record as found, of kind `I`): what is held is the second.
    let row = relay.row_before_hold.lock().unwrap().clone();
    let row = row.expect("a row went through before the hold");
    assert_eq!(
        (row[0].as_deref(), row[1].as_deref()),
        (Some(&[0u8, 2][..]), Some(&b"I"[..])),
        "the first look found the owner in flight: {row:?}"
    );
    // The owner fails now, between the duplicate's two looks.
    upstream.open("fails");
    let owner = owner.await.unwrap();
    assert_eq!(
        owner.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{:?}",
        owner.body
    );
    relay.hold_requests.send_replace(false);
    let duplicate = duplicate.await.unwrap();
    assert_eq!(
        upstream.executed_for("fails"),
        1,
        "the duplicate that found the owner in flight ran it again: {:?} {:?}",
        duplicate.status,
        duplicate.body
    );
    assert_eq!(
        duplicate.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{:?}",
        duplicate.body
    );
    assert!(duplicate.replayed());
}

/// The owner's link to the database is down when its answer comes back, for longer than
/// the lease (the database stays up for another replica): its client gets the answer, the
/// claim lapses and is held, and once the link is back the owner's settlement, made again
/// in the background, lands: retries replay the answer instead of hearing "outcome unknown"
/// for the rest of the key's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_answer_the_database_missed_past_the_lease_is_recorded_once_it_is_back() {
    let db = PostgresServer::start();
    let link = relay_to(db.port).await;
    let upstream = start_upstream().await;
    let defaults = "lease: 1s, wait_timeout: 100ms";
    let cut_off = config(&db, defaults).replacen(
        &db.store_yaml(),
        &store_via(&db, db.port, link.addr.port()),
        1,
    );
    let a = ProxyProcess::start(upstream.addr, &cut_off);
    let b = ProxyProcess::start(upstream.addr, &config(&db, defaults));
    let owner = at_gate(a.addr, "late", "late");
    upstream.arrived("late", 1).await;
    link.cut.store(true, Ordering::SeqCst);
    upstream.open("late");
    assert_eq!(owner.await.unwrap().status, StatusCode::CREATED);
    // Past the lease: the claim lapsed unsettled and is held.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let retry = post(b.addr, "/orders", &[("idempotency-key", "late")], "{}").await;
        if retry.problem() == "urn:idemgate:problem:outcome-unknown" {
            break;
        }
        assert!(Instant::now() < deadline, "hang guard: never lapsed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    link.cut.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let retry = post(b.addr, "/orders", &[("idempotency-key", "late")], "{}").await;
        if retry.replayed() {
            assert_eq!(retry.status, StatusCode::CREATED);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "hang guard: the answer was never recorded: {}",
            retry.problem()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(upstream.executed_for("late"), 1);
}
