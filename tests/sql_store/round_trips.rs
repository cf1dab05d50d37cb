//! What a request costs the database in statements: two for a first-seen key, one for a
//! replay, on PostgreSQL and MariaDB.

use http::StatusCode;

use crate::common::mariadb_server::MariadbServer;
use crate::common::postgres_server::PostgresServer;
use crate::common::{post, start_proxy, start_upstream};
use crate::config;

/// The statements the database ran since the last reset, as `statement=calls`, without
/// the ones that belong to no request: per-connection setup, the `LISTEN`, the reaper.
fn pg_statements(db: &PostgresServer) -> Vec<String> {
    let rows = db.psql(
        "SELECT calls || ' ' || regexp_replace(query, '\\s+', ' ', 'g') FROM pg_stat_statements
         WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE 'SET SESSION%'
           AND query NOT LIKE 'LISTEN%' AND query NOT LIKE 'WITH gone AS%'
         ORDER BY query",
    );
    rows.lines().map(str::to_owned).collect()
}

/// A first-seen request costs PostgreSQL two statements (the claim and the settlement
/// function), a replay one, as pg_stat_statements counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_seen_costs_postgres_two_statements_and_a_replay_one() {
    let db = PostgresServer::start();
    db.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &config(&db, "")).await;
    // Warm up: the table is created and the statements prepared on first use.
    post(proxy.addr, "/orders", &[("idempotency-key", "warm")], "{}").await;
    db.psql("SELECT pg_stat_statements_reset()");
    let first = post(proxy.addr, "/orders", &[("idempotency-key", "rt")], "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        pg_statements(&db),
        [
            "1 SELECT * FROM idemgate_keys_claim_v1($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            "1 SELECT idemgate_keys_settle_v2($1, $2, $3, $4, $5, $6, $7, $8, $9)::bigint",
        ],
        "claim + settle"
    );
    db.psql("SELECT pg_stat_statements_reset()");
    let replay = post(proxy.addr, "/orders", &[("idempotency-key", "rt")], "{}").await;
    assert!(replay.replayed());
    assert_eq!(
        pg_statements(&db),
        ["1 SELECT * FROM idemgate_keys_claim_v1($1, $2, $3, $4, $5, $6, $7, $8, $9)"],
        "the claim only"
    );
    // What the table holds: digests and the answer, never the raw key.
    let dump = db.psql("SELECT encode(digest, 'escape') || ' ' || kind::text FROM idemgate_keys");
    assert!(!dump.contains("rt ") && !dump.contains("warm"), "{dump}");
}

/// The statements MariaDB's general log shows since it was cleared, without the ones that
/// belong to no request (per-connection setup, the reaper) and the log's own.
fn mariadb_statements(db: &MariadbServer) -> Vec<String> {
    let rows = db.sql(
        "SELECT command_type, REGEXP_REPLACE(CONVERT(argument USING utf8mb4), '\\\\s+', ' ')
         FROM mysql.general_log
         WHERE command_type IN ('Query', 'Execute')
           AND argument NOT LIKE '%general_log%' AND argument NOT LIKE 'SET SESSION%'
           AND argument NOT LIKE 'DELETE %'
         ORDER BY event_time",
    );
    rows.lines()
        .map(|l| {
            // The arguments are logged with the values; keep the statement's shape.
            let shape = l.split('(').next().unwrap_or(l);
            shape.trim().replace('\t', " ")
        })
        .collect()
}

/// The same on MariaDB: two `CALL`s for a first-seen request, one for a replay, as the
/// server's general log records what clients sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_seen_costs_mariadb_two_statements_and_a_replay_one() {
    let db = MariadbServer::start();
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &config(&db, "")).await;
    post(proxy.addr, "/orders", &[("idempotency-key", "warm")], "{}").await;
    let log = |on: &str| {
        db.sql(&format!(
            "SET GLOBAL log_output = 'TABLE'; SET GLOBAL general_log = {on}; TRUNCATE mysql.general_log"
        ))
    };
    log("1");
    let first = post(proxy.addr, "/orders", &[("idempotency-key", "rt")], "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        mariadb_statements(&db),
        [
            "Execute CALL idemgate_keys_claim_v1",
            "Execute CALL idemgate_keys_settle_v2"
        ],
        "claim + settle"
    );
    log("1");
    let replay = post(proxy.addr, "/orders", &[("idempotency-key", "rt")], "{}").await;
    assert!(replay.replayed());
    assert_eq!(
        mariadb_statements(&db),
        ["Execute CALL idemgate_keys_claim_v1"],
        "the claim only"
    );
    log("0");
}
