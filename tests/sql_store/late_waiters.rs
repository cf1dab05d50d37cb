//! A duplicate that waited on an owner that failed, and looks again only after the
//! failure's record expired, never executes the request itself (`common::shared_store`).

use crate::common::mariadb_server::MariadbServer;
use crate::common::postgres_server::PostgresServer;
use crate::common::relay::relay_to;
use crate::common::shared_store::a_duplicate_that_looks_after_its_owners_failure_expired_does_not_execute as scenario;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_duplicate_that_looks_after_its_owners_failure_expired_does_not_execute() {
    let db = PostgresServer::start();
    let relay = relay_to(db.port).await;
    let direct = format!("  postgres: {{ url: \"{}\" }}\n", db.url());
    let relayed = format!(
        "  postgres: {{ url: \"postgres://idemgate@127.0.0.1:{}/postgres\", timeout: 30s }}\n",
        relay.addr.port()
    );
    let gone = || {
        db.psql("SELECT count(*) FROM idemgate_keys WHERE kind = 'F' AND expires_at > now()")
            .trim()
            == "0"
    };
    scenario(&direct, &relayed, &relay, gone).await;
}

/// On MariaDB the duplicate is woken by the re-check of its key, which the hold holds
/// too: its look after the hold is the one that finds the key free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_duplicate_that_looks_after_its_owners_failure_expired_does_not_execute() {
    let db = MariadbServer::start();
    let relay = relay_to(db.port).await;
    let direct = format!("  mysql: {{ url: \"{}\" }}\n", db.url());
    let relayed = format!(
        "  mysql: {{ url: \"{}\", timeout: 30s }}\n",
        db.url().replace(
            &format!(":{}/", db.port),
            &format!(":{}/", relay.addr.port())
        )
    );
    let gone = || {
        db.sql(
            "SELECT count(*) FROM idemgate.idemgate_keys WHERE kind = 'F' AND expires_at > UTC_TIMESTAMP(3)",
        )
        .trim()
            == "0"
    };
    scenario(&direct, &relayed, &relay, gone).await;
}
