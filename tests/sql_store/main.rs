//! The SQL stores across replicas and through failures, on PostgreSQL and MariaDB: exactly
//! once between two proxy processes, the database restarted under load, what a request
//! costs in statements, the reaper, the table idemgate creates, the config section, and the
//! release of a claim whose answer never came.
//! Every test starts its own database server on a free loopback port (tests/common).
//!
//! The `Database` trait over both servers and the helpers every test uses are here; the
//! tests are in one module per topic: `replicas.rs` (two proxies on one database, and the
//! database restarted under their load), `lapses.rs` (owners cut off from the
//! database, a duplicate's two looks), `large_answers.rs` (an answer over MariaDB's
//! `max_allowed_packet`), `late_renewals.rs` (a renewal that lands after its
//! owner settled), `late_waiters.rs` (a duplicate that looks again only after its
//! owner's failure expired), `refused_answers.rs` (an answer the database refuses),
//! `round_trips.rs`, `reaper.rs`, `single_connection.rs` (a pool of one beside
//! PostgreSQL's `LISTEN`), `table.rs` (what the database holds, the table, the config
//! section) and `unanswered_release.rs`.

#[path = "../common/mod.rs"]
mod common;

mod lapses;
mod large_answers;
mod late_renewals;
mod late_waiters;
mod reaper;
mod refused_answers;
mod replicas;
mod round_trips;
mod single_connection;
mod table;
mod unanswered_release;

use std::net::SocketAddr;
use std::time::Duration;

use common::mariadb_server::MariadbServer;
use common::postgres_server::PostgresServer;
use common::send;
use http::{Method, StatusCode};

/// A database server a test can stop and start, as the tests below need it.
trait Database {
    /// The `store:` section for a proxy on it.
    fn store_yaml(&self) -> String;
    /// Stops it cleanly (open transactions rolled back, clients disconnected).
    fn stop(&mut self);
    /// Starts it again with its data.
    fn start_again(&mut self);
    /// Stops and starts it in one step.
    fn restart(&mut self);
}

impl Database for PostgresServer {
    fn store_yaml(&self) -> String {
        format!("  postgres: {{ url: \"{}\", timeout: 1s }}\n", self.url())
    }
    fn stop(&mut self) {
        PostgresServer::stop(self)
    }
    fn start_again(&mut self) {
        PostgresServer::start_again(self)
    }
    fn restart(&mut self) {
        PostgresServer::restart(self)
    }
}

impl Database for MariadbServer {
    fn store_yaml(&self) -> String {
        format!("  mysql: {{ url: \"{}\", timeout: 1s }}\n", self.url())
    }
    fn stop(&mut self) {
        MariadbServer::stop(self)
    }
    fn start_again(&mut self) {
        MariadbServer::start_again(self)
    }
    fn restart(&mut self) {
        MariadbServer::restart(self)
    }
}

/// A proxy config on `db` with a keyed route on /orders and these defaults.
fn config(db: &dyn Database, defaults: &str) -> String {
    format!(
        "store:\n{}defaults: {{ {defaults} }}\nroutes:\n  - name: create-order\n    match: {{ methods: [POST], path: /orders }}\n    key: {{ header: Idempotency-Key, required: true }}\n",
        db.store_yaml()
    )
}

async fn ready(admin: SocketAddr) -> bool {
    send(admin, Method::GET, "/readyz", &[], "").await.status == StatusCode::OK
}

async fn until_ready(admins: [SocketAddr; 2]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for admin in admins {
        while !ready(admin).await {
            assert!(
                std::time::Instant::now() < deadline,
                "hang guard: never ready"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Waits until `condition` holds (a hang guard of 30 s, never a timing assertion).
async fn until(mut condition: impl FnMut() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
