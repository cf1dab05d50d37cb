//! The SQL stores across replicas and through failures, on PostgreSQL and MariaDB: exactly
//! once between two proxy processes, the database restarted under load, what a request
//! costs in statements, the reaper, the table idemgate creates, the config section, and the
//! release of a claim whose answer never came.
//! Every test starts its own database server on a free loopback port (tests/common).

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::mariadb_server::MariadbServer;
use common::postgres_server::PostgresServer;
use common::{post, send, start_proxy, start_upstream, ProxyProcess};
use http::{Method, StatusCode};
use idemgate::config::{Config, StoreConfig};
use idemgate::key::Digest;
use idemgate::store::{
    Claim, ClaimArgs, Lapse, Lease, MysqlStore, PostgresStore, Settled, SqlSettings, Store,
    StoreError, StoredResponse,
};

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

// === Exactly once between replicas ===

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

// === The database restarted under load ===

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

/// Keeps sending requests over 20 keys, alternating between `targets`, until `stop`.
fn load(targets: [SocketAddr; 2], stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<Got>> {
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
                got.push(request.await.unwrap());
            }
            n += 10;
        }
        got
    })
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
    let background = load([a.addr, b.addr], Arc::clone(&stop));

    db.stop();
    for i in 0..10 {
        let key = format!("down-{i}");
        let target = if i % 2 == 0 { a.addr } else { b.addr };
        let answer = post(target, "/orders", &[("idempotency-key", &key)], "{}").await;
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
    // The load saw answers, the outage's 503s, and (for a request whose owner could not
    // reach the database) 409s; every answer of a key is the one execution's.
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
            other => panic!("{}: unexpected {other}", g.key),
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

// === Round trips ===

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
            "1 SELECT idemgate_keys_settle_v1($1, $2, $3, $4, $5, $6, $7, $8, $9)::bigint",
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
            "Execute CALL idemgate_keys_settle_v1"
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

// === The reaper ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_reaper_deletes_expired_rows_in_batches_and_counts_them() {
    let db = PostgresServer::start();
    let mut settings = SqlSettings::new(db.url());
    settings.reap_every = Duration::from_millis(200);
    let store = Store::Postgres(PostgresStore::connect(&settings).unwrap());
    let live = live_key(&store).await;
    // Three batches' worth of rows that expired a minute ago, and hit counters alike.
    db.psql(
        "INSERT INTO idemgate_keys (digest, kind, fingerprint, created_at, expires_at)
         SELECT sha256(n::text::bytea), 'D', '\\x00', now(), now() - interval '1 minute'
         FROM generate_series(1, 1200) n;
         INSERT INTO idemgate_keys_hits (digest, window_end, hits)
         SELECT sha256(n::text::bytea), now() - interval '1 minute', 1
         FROM generate_series(1, 30) n",
    );
    reaped(&store, 1230).await;
    assert_eq!(db.psql("SELECT count(*) FROM idemgate_keys").trim(), "1");
    assert_eq!(
        db.psql("SELECT count(*) FROM idemgate_keys_hits").trim(),
        "0"
    );
    still_replays(&store, live).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mariadb_reaper_deletes_expired_rows_in_batches_and_counts_them() {
    let db = MariadbServer::start();
    let mut settings = SqlSettings::new(db.url());
    settings.reap_every = Duration::from_millis(200);
    let store = Store::Mysql(MysqlStore::connect(&settings).unwrap());
    let live = live_key(&store).await;
    db.sql(
        "INSERT INTO idemgate.idemgate_keys (digest, kind, fingerprint, created_at, expires_at)
         SELECT UNHEX(SHA2(seq, 256)), 'D', '', UTC_TIMESTAMP(3),
                UTC_TIMESTAMP(3) - INTERVAL 1 MINUTE
         FROM idemgate.seq_1_to_1200;
         INSERT INTO idemgate.idemgate_keys_hits (digest, window_end, hits)
         SELECT UNHEX(SHA2(seq, 256)), UTC_TIMESTAMP(3) - INTERVAL 1 MINUTE, 1
         FROM idemgate.seq_1_to_30",
    );
    reaped(&store, 1230).await;
    assert_eq!(
        db.sql("SELECT count(*) FROM idemgate.idemgate_keys").trim(),
        "1"
    );
    assert_eq!(
        db.sql("SELECT count(*) FROM idemgate.idemgate_keys_hits")
            .trim(),
        "0"
    );
    still_replays(&store, live).await;
}

/// A key completed for an hour (so its row is live while the reaper runs).
async fn live_key(store: &Store) -> idemgate::key::Digest {
    let key = idemgate::key::Digest([7; 32]);
    let idemgate::store::Claim::Owner(lease) = store
        .claim(key, idemgate::key::Digest::NONE, Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("a fresh key is owned");
    };
    let answer = idemgate::store::StoredResponse::new(StatusCode::OK, &Default::default(), b"live");
    assert!(lease
        .complete(answer, Duration::from_secs(3600))
        .await
        .unwrap());
    key
}

/// Waits until the reaper counted `n` rows, and the metric says so.
async fn reaped(store: &Store, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.stats().reaped < n {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: reaped {} of {n}",
            store.stats().reaped
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.stats().reaped, n, "only expired rows");
    let text = idemgate::metrics::Metrics::new().render(store.stats());
    assert!(
        text.contains(&format!("idemgate_store_reaped_total {n}")),
        "{text}"
    );
}

async fn still_replays(store: &Store, key: idemgate::key::Digest) {
    match store
        .claim(key, idemgate::key::Digest::NONE, Duration::from_secs(30))
        .await
        .unwrap()
    {
        idemgate::store::Claim::Done(answer) => assert_eq!(&answer.body()[..], b"live"),
        other => panic!("the live key answered {}", other.as_str()),
    }
}

// === What the database holds ===

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

// === The table and the config ===

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

// === An unanswered claim's release ===

/// A store on `url` whose operations time out after 200 ms, its table created.
async fn timing_out(url: String, postgres: bool) -> Store {
    let settings = SqlSettings {
        timeout: Duration::from_millis(200),
        ..SqlSettings::new(url)
    };
    let store = if postgres {
        Store::Postgres(PostgresStore::connect(&settings).expect("store"))
    } else {
        Store::Mysql(MysqlStore::connect(&settings).expect("store"))
    };
    assert!(store.ready().await, "the database answers");
    store
}

/// Claims until the claim is owned (a lapsed claim's row must expire first).
async fn claim_until_owner(store: &Store, args: ClaimArgs) -> Lease {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Claim::Owner(lease) = store.claim_with(args).await.expect("claim") {
            return lease;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: never owned"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_claims_release_never_touches_a_later_owners_record_on_postgres() {
    let db = common::postgres_server::shared();
    unanswered_release_is_fenced(&timing_out(db.url(), true).await, 0x41).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_claims_release_never_touches_a_later_owners_record_on_mariadb() {
    let db = common::mariadb_server::shared();
    unanswered_release_is_fenced(&timing_out(db.url(), false).await, 0x42).await;
}

/// The release of a claim whose answer never came is fenced by that claim's token: its
/// own claim it frees, but run after the claim lapsed and another owner took the key over,
/// it leaves that owner's record as it is, with or without a token to hand back; the new
/// owner completes and its answer replays. Keys start with `salt`.
async fn unanswered_release_is_fenced(store: &Store, salt: u8) {
    let fp = Digest([1; 32]);
    let lease = Duration::from_millis(200);
    let args = |key: Digest| ClaimArgs {
        lapse: Lapse::Release { grace: lease },
        ..ClaimArgs::new(key, fp, lease)
    };
    let key = |n: u8| {
        let mut digest = [n; 32];
        digest[0] = salt;
        Digest(digest)
    };
    // A claim left as one whose answer never came leaves it: no lease renews or settles it.
    let unanswered = |key: Digest| async move {
        let Claim::Owner(lease) = store.claim_with(args(key)).await.expect("claim") else {
            panic!("a fresh key is owned");
        };
        let token = lease.token();
        lease.abandon();
        token
    };

    let own = key(2);
    let token = unanswered(own).await;
    let released = store.release_unanswered(&args(own), token).await;
    assert_eq!(released, Some(Settled::Written), "its own claim");
    let again = claim_until_owner(store, args(own)).await;
    assert!(again.release().await.unwrap());

    let taken = key(3);
    let token = unanswered(taken).await;
    let successor = claim_until_owner(store, args(taken)).await;
    for reissue in [None, Some(Duration::from_secs(3600))] {
        let late = ClaimArgs {
            reissue,
            ..args(taken)
        };
        let released = store.release_unanswered(&late, token).await;
        assert_eq!(released, Some(Settled::NotWritten), "reissue {reissue:?}");
        let info = store
            .inspect(taken)
            .await
            .unwrap()
            .expect("the successor's row");
        assert_eq!(info.state, "in_flight");
    }
    let answer = StoredResponse::new(StatusCode::CREATED, &Default::default(), b"successor");
    assert!(successor
        .complete(answer, Duration::from_secs(3600))
        .await
        .unwrap());
    match store.claim_with(args(taken)).await.unwrap() {
        Claim::Done(stored) => assert_eq!(&stored.body()[..], b"successor"),
        other => panic!("the successor's key answered {}", other.as_str()),
    }
}

/// How many statements calling the claim routine PostgreSQL is running, and how many of
/// them wait for a lock.
fn claims_running(db: &PostgresServer) -> (u32, u32) {
    let counts = db.psql(
        "SELECT count(*), count(*) FILTER (WHERE wait_event_type = 'Lock')
         FROM pg_stat_activity
         WHERE state = 'active' AND query LIKE '%claim_v1(%' AND pid <> pg_backend_pid()",
    );
    let (all, waiting) = counts.trim().split_once('|').expect("two counts");
    (all.parse().unwrap(), waiting.parse().unwrap())
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

/// A claim that times out while PostgreSQL runs it, and commits there afterwards (here it
/// waited on another transaction's uncommitted row of its key), is released once it has:
/// the release found nothing at first, looks again, and frees the key, rather than leaving
/// a claim nobody settles to lapse into an unknown outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_committed_after_its_timeout_is_released_on_postgres() {
    use sqlx::Connection as _;

    let db = common::postgres_server::shared();
    let store = timing_out(db.url(), true).await;
    let key = Digest([0x43; 32]);
    let args = ClaimArgs {
        lapse: Lapse::Hold {
            ttl: Duration::from_secs(3600),
        },
        ..ClaimArgs::new(key, Digest([1; 32]), Duration::from_secs(60))
    };
    let mut blocker = sqlx::PgConnection::connect(&db.url()).await.unwrap();
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query(
        "INSERT INTO idemgate_keys (digest, kind, fingerprint, created_at, expires_at)
         VALUES ($1, 'D', $1, now(), now() + interval '1 hour')",
    )
    .bind(&key.0[..])
    .execute(&mut blocker)
    .await
    .unwrap();

    let failed = store.claim_with(args).await;
    assert!(
        matches!(failed, Err(StoreError::Unavailable(_))),
        "{failed:?}"
    );
    until(
        || claims_running(&db) == (1, 1),
        "the claim waiting in PostgreSQL",
    )
    .await;
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    until(|| claims_running(&db).0 == 0, "the claim to commit").await;

    let lease = claim_until_owner(&store, args).await;
    assert!(lease.release().await.unwrap());
}
