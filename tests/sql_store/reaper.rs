//! The reaper: expired rows deleted in batches and counted, live keys left to replay.

use std::time::Duration;

use http::StatusCode;
use idemgate::store::{MysqlStore, PostgresStore, SqlSettings, Store};

use crate::common::mariadb_server::MariadbServer;
use crate::common::postgres_server::PostgresServer;

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
