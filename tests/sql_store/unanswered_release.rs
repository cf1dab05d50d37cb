//! The release of a claim whose answer never came (the store timed out): it never touches
//! a later owner's record, and a claim committed after its timeout is released once it has.

use std::time::Duration;

use http::StatusCode;
use idemgate::key::Digest;
use idemgate::store::{
    Claim, ClaimArgs, Lapse, Lease, MysqlStore, PostgresStore, Settled, SqlSettings, Store,
    StoreError, StoredResponse,
};

use crate::common::postgres_server::PostgresServer;
use crate::common::{self};
use crate::until;

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
    for reissue in [
        None,
        Some(std::time::SystemTime::now() + Duration::from_secs(3600)),
    ] {
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
