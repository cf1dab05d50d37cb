//! What the database holds (no client key, request body or authorization), the table
//! created at start with its unique key on the digest, and the SQL store config sections
//! with their mistakes named.

use std::time::Duration;

use http::StatusCode;
use idemgate::config::{Config, StoreConfig};

use crate::common::mariadb_server::MariadbServer;
use crate::common::postgres_server::PostgresServer;
use crate::common::{self, start_proxy, start_upstream, ProxyProcess};
use crate::until_ready;

/// Every row of every table idemgate's PostgreSQL store uses, as `row::text`, with each
/// `bytea` field (written `\\x` and hex digits) decoded back to its bytes.
fn pg_rows(db: &PostgresServer) -> (Vec<String>, Vec<u8>) {
    let tables: Vec<String> = db
        .psql(
            "SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) FROM pg_tables
             WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
        )
        .lines()
        .map(str::to_owned)
        .collect();
    let mut text = Vec::new();
    for table in &tables {
        text.extend(
            db.psql(&format!("SELECT t::text FROM {table} t"))
                .into_bytes(),
        );
        text.push(b'\n');
    }
    let mut all = text.clone();
    let mut i = 0;
    while let Some(at) = text[i..].windows(2).position(|w| w == b"\\x") {
        let start = i + at + 2;
        let end = start
            + text[start..]
                .iter()
                .take_while(|b| b.is_ascii_hexdigit())
                .count();
        let hex = std::str::from_utf8(&text[start..end - (end - start) % 2]).unwrap();
        all.push(b'\n');
        all.extend(
            (0..hex.len())
                .step_by(2)
                .map(|j| u8::from_str_radix(&hex[j..j + 2], 16).unwrap()),
        );
        i = end.max(start);
    }
    (tables, all)
}

/// README "How a request flows" 2, on PostgreSQL: "Only digests are stored, never a client
/// key, body or `Authorization` value." After a client-keyed request, an observed one and a
/// fingerprinted one (each sent twice: a claim and a settlement, then a replay), every row
/// of every table the store uses is read, its `bytea` fields decoded, and none of the three
/// appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_holds_no_client_key_request_body_or_authorization() {
    let db = PostgresServer::start();
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  postgres: {{ url: \"{}\" }}\n{}",
        db.url(),
        common::SECRET_ROUTES
    );
    let proxy = start_proxy(upstream.addr, &config).await;
    for answer in common::send_secrets(proxy.addr).await {
        assert_eq!(answer.status, StatusCode::OK);
    }
    // Three keys, three stored answers; the observed key is seen twice.
    let done =
        db.psql("SELECT count(*) FROM idemgate_keys WHERE kind = 'D' AND response IS NOT NULL");
    assert_eq!(done.trim(), "3");
    let (tables, rows) = pg_rows(&db);
    assert!(
        tables.iter().any(|t| t == "public.idemgate_keys_seen"),
        "{tables:?}"
    );
    for needle in common::SECRETS {
        assert!(
            !rows.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "a row holds {needle}"
        );
    }
}

/// `idemgate run` creates the configured table at start, keyed by the digest, before any
/// request (its readiness check asks for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_is_created_at_start_with_the_unique_key_on_the_digest() {
    let pg = PostgresServer::start();
    let upstream = start_upstream().await;
    let yaml = format!(
        "store:\n  postgres: {{ url: \"{}\", table: orders_dedupe }}\n",
        pg.url()
    );
    let proxy = ProxyProcess::start(upstream.addr, &yaml);
    until_ready([proxy.admin, proxy.admin]).await;
    let indexes = pg.psql("SELECT indexdef FROM pg_indexes WHERE tablename = 'orders_dedupe'");
    assert!(
        indexes.contains(
            "CREATE UNIQUE INDEX orders_dedupe_pkey ON public.orders_dedupe USING btree (digest)"
        ),
        "{indexes}"
    );

    let my = MariadbServer::start();
    let yaml = format!(
        "store:\n  mysql: {{ url: \"{}\", table: orders_dedupe }}\n",
        my.url()
    );
    let proxy = ProxyProcess::start(upstream.addr, &yaml);
    until_ready([proxy.admin, proxy.admin]).await;
    let indexes = my.sql(
        "SELECT index_name, non_unique, column_name FROM information_schema.statistics
         WHERE table_schema = 'idemgate' AND table_name = 'orders_dedupe'
         AND index_name = 'PRIMARY'",
    );
    assert_eq!(indexes.trim(), "PRIMARY\t0\tdigest");
}

/// The `postgres` and `mysql` sections as users write them, and their mistakes named with
/// file, line and key.
#[test]
fn the_sql_store_sections_are_read_and_their_mistakes_named() {
    let parse = |store: &str| {
        Config::parse(
            &format!("listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\nstore:\n{store}"),
            "proxy.yaml",
        )
    };
    let pg = parse("  postgres: { url: \"postgres://app:secret@db/app\", table: payments_keys, timeout: 3s, max_connections: 8 }\n")
        .unwrap();
    match pg.store {
        StoreConfig::Postgres(s) => {
            assert_eq!(s.table, "payments_keys");
            assert_eq!(s.timeout, Duration::from_secs(3));
            assert_eq!(s.max_connections, 8);
        }
        other => panic!("{other:?}"),
    }
    let my = parse("  mysql: { url: \"mysql://app@db/app\" }\n").unwrap();
    match my.store {
        StoreConfig::Mysql(s) => assert_eq!(s.table, "idemgate_keys"),
        other => panic!("{other:?}"),
    }
    for (store, key, line) in [
        (
            "  postgres: { url: \"postgres://db/app\", table: Bad-Name }\n",
            "store.postgres.table",
            4,
        ),
        (
            "  postgres: { url: \"redis://db\" }\n",
            "store.postgres.url",
            4,
        ),
        (
            "  mysql:\n    url: \"postgres://db/app\"\n",
            "store.mysql.url",
            5,
        ),
        (
            "  postgres: { url: \"postgres://db/app\", timeout: 0s }\n",
            "store.postgres.timeout",
            4,
        ),
        (
            "  postgres: { url: \"postgres://db/app\", pool: 3 }\n",
            "store.postgres",
            4,
        ),
        (
            "  postgres: { url: \"postgres://db/app\" }\n  mysql: { url: \"mysql://db/app\" }\n",
            "store",
            3,
        ),
    ] {
        let message = parse(store).expect_err(store).to_string();
        assert!(
            message.starts_with(&format!("proxy.yaml:{line}:")) && message.contains(key),
            "{store} → {message}"
        );
    }
}
