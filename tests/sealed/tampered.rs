//! Records whoever can write to the store tampered with: copied under another caller's
//! key, damaged or cut short, planted in clear, or given another fingerprint. None is
//! replayed as an answer and none runs its request again.

use std::path::Path;

use http::{Method, StatusCode};
use idemgate::key::Digest;

use super::common::postgres_server::PostgresServer;
use super::common::redis_server::RedisServer;
use super::common::{self, post, send, start_proxy, start_recorder};
use super::{digest_as, digest_of, holds, login, login_as, routes, write_key, SECRET};

/// The Redis name of the record of `digest` under the prefix `s:`.
fn redis_name(digest: Digest) -> String {
    format!("s:{{{digest}}}")
}

/// Writes `record` into Redis under the name of `digest`, as whoever can write to the store
/// could.
fn plant(redis: &RedisServer, digest: Digest, record: &[u8]) {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let _: () = redis::cmd("SET")
        .arg(redis_name(digest))
        .arg(record)
        .arg("PX")
        .arg(600_000)
        .query(&mut conn)
        .unwrap();
}

/// A Redis store under the prefix `s:` whose answers are sealed with the key in `key_file`;
/// `extra` is appended inside `encrypt: { … }` (`", clear_records: refuse"`).
fn sealed_in_redis(redis: &RedisServer, key_file: &Path, extra: &str) -> String {
    format!(
        "store:\n  redis: {{ url: \"{}\", prefix: \"s:\", timeout: 500ms }}\n  encrypt: {{ key_file: {}{extra} }}",
        redis.url(),
        key_file.display()
    )
}

/// The done record Redis holds for `digest`, as whoever can read the store sees it.
fn stored(redis: &RedisServer, digest: Digest) -> Vec<u8> {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let record: Vec<u8> = redis::cmd("GET")
        .arg(redis_name(digest))
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        record.first(),
        Some(&b'D'),
        "an answer is stored for {digest}"
    );
    record
}

/// Asserts `answer` is the 500 that says a stored answer cannot be read, showing nothing
/// of the stored answer.
fn assert_unreadable(answer: &common::Answer, what: &str) {
    assert_eq!(
        answer.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{what}: {:?}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(
        answer.json()["type"],
        "urn:idemgate:problem:stored-answer-unreadable",
        "{what}"
    );
    assert!(!holds(&answer.body, SECRET), "{what}: the answer leaked");
    assert!(!answer.replayed(), "{what}");
}

/// Whoever can write to Redis can copy one caller's sealed record under another caller's
/// key. The record is bound to the key it was sealed for: bob's request finds it and gets
/// a 500, never alice's answer (her session cookie), and nothing runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_record_copied_under_another_callers_key_is_not_replayed() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let k1 = write_key(dir.path(), "k1", 1);
    let upstream = start_recorder().await;
    let store = sealed_in_redis(&redis, &k1, "");
    let proxy = common::start_proxy_from(&routes(&store, upstream.addr), None).await;
    assert_eq!(login(proxy.addr, "same").await.status, StatusCode::CREATED);
    let alice = digest_of(&proxy, "same");
    let bob = digest_as(&proxy, "same", "bob-session");
    assert_ne!(alice, bob);
    let record = stored(&redis, alice);
    plant(&redis, bob, &record);

    let copied = login_as(proxy.addr, "same", "bob-session").await;
    assert_unreadable(&copied, "a record copied under bob's key");
    assert_eq!(upstream.executed(), 1);
}

/// A record damaged in Redis (a byte flipped, or cut short by a bad restore or a tool that
/// rewrote it) belongs to a request that ran: its retry gets a 500 that says the stored
/// answer cannot be read, never a replay of garbage and never a second run, even on a
/// route that fails open (the store answered; it is not down), and never a 503 that tells
/// the client the request was not executed. So does a record of a version this build does
/// not know, as a record with trailers (version 4 or 5) is to builds before them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_in_redis_is_never_run_again_even_failing_open() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let k1 = write_key(dir.path(), "k1", 1);
    let upstream = start_recorder().await;
    let store = sealed_in_redis(&redis, &k1, "");
    let closed = common::start_proxy_from(&routes(&store, upstream.addr), None).await;
    let open_routes = routes(&store, upstream.addr).replace(
        "routes:\n",
        "defaults:\n  on_store_error: fail_open\nroutes:\n",
    );
    let open = common::start_proxy_from(&open_routes, None).await;
    let damage = |key: &str, how: &dyn Fn(&mut Vec<u8>)| {
        let digest = digest_of(&closed, key);
        let mut record = stored(&redis, digest);
        how(&mut record);
        plant(&redis, digest, &record);
    };
    for key in ["flipped", "cut", "newer"] {
        assert_eq!(login(closed.addr, key).await.status, StatusCode::CREATED);
    }
    // A byte of the ciphertext flipped: it does not authenticate.
    damage("flipped", &|r| {
        let at = r.len() - 20;
        r[at] ^= 1;
    });
    // Cut inside the sealed part's header: not even a sealed record's length.
    damage("cut", &|r| r.truncate(40));
    // The version byte (after `D` and the fingerprint) of a record a later build wrote.
    damage("newer", &|r| r[33] = 6);
    let executed = upstream.executed();
    for key in ["flipped", "cut", "newer"] {
        for (proxy, policy) in [(&open, "fail_open"), (&closed, "fail_closed")] {
            let retry = login(proxy.addr, key).await;
            assert_unreadable(&retry, &format!("{key}, {policy}"));
            assert_eq!(upstream.executed(), executed, "{key}, {policy}: ran again");
        }
    }
    // Support can still let the customer retry: the damaged record is purged.
    let cut = digest_of(&closed, "cut");
    let purged = send(
        closed.admin,
        Method::DELETE,
        &format!("/keys/{cut}"),
        &[],
        "",
    )
    .await;
    assert_eq!(
        purged.status,
        StatusCode::NO_CONTENT,
        "{:?}",
        String::from_utf8_lossy(&purged.body)
    );
    assert_eq!(login(closed.addr, "cut").await.status, StatusCode::CREATED);
    assert_eq!(upstream.executed(), executed + 1);
}

/// The same in PostgreSQL: an answer cut short in the dedupe table is not run again and
/// answers the 500 that says it cannot be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_answer_in_postgres_is_never_run_again() {
    let pg = PostgresServer::start();
    let dir = tempfile::tempdir().unwrap();
    let key = write_key(dir.path(), "k1", 1);
    let upstream = start_recorder().await;
    let store = format!(
        "store:\n  postgres: {{ url: \"{}\", table: cut_keys, timeout: 2s }}\n  encrypt: {{ key_file: {} }}",
        pg.url(),
        key.display()
    );
    let open_routes = routes(&store, upstream.addr).replace(
        "routes:\n",
        "defaults:\n  on_store_error: fail_open\nroutes:\n",
    );
    let proxy = common::start_proxy_from(&open_routes, None).await;
    assert_eq!(login(proxy.addr, "p").await.status, StatusCode::CREATED);
    pg.psql("UPDATE cut_keys SET response = substring(response from 1 for 8) WHERE response IS NOT NULL");
    let retry = login(proxy.addr, "p").await;
    assert_unreadable(&retry, "a truncated row");
    assert_eq!(upstream.executed(), 1, "ran again");
}

/// Whoever can write to Redis can plant an answer in clear under any caller's key; while
/// `clear_records: accept` keeps the migration path open it is replayed as alice's own.
/// Once the migration is over, `clear_records: refuse` answers it `500` as unreadable: never
/// replayed, never run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_record_planted_in_redis_is_not_replayed_once_clear_records_are_refused() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let k1 = write_key(dir.path(), "k1", 1);
    let upstream = start_recorder().await;
    let sealed = |clear_records: &str| sealed_in_redis(&redis, &k1, clear_records);
    let refusing = common::start_proxy_from(
        &routes(&sealed(", clear_records: refuse"), upstream.addr),
        None,
    )
    .await;
    let accepting = common::start_proxy_from(&routes(&sealed(""), upstream.addr), None).await;
    // A clear done record matching any payload (no fingerprint), with a body of the
    // writer's choosing.
    let mut headers = http::HeaderMap::new();
    headers.insert("set-cookie", "session=planted".parse().unwrap());
    let forged =
        idemgate::store::StoredResponse::new(StatusCode::CREATED, &headers, b"{\"planted\":1}");
    let mut record = vec![b'D'];
    record.extend_from_slice(&Digest::NONE.0);
    record.extend_from_slice(forged.encode());
    for key in ["accepted", "refused"] {
        plant(&redis, digest_of(&refusing, key), &record);
    }

    let accepted = login(accepting.addr, "accepted").await;
    assert!(
        accepted.replayed() && holds(&accepted.body, "planted"),
        "accept: the migration path replays what is in clear"
    );
    let refused = login(refusing.addr, "refused").await;
    assert_unreadable(&refused, "a clear record, clear_records: refuse");
    assert!(!holds(&refused.body, "planted"));
    assert_eq!(upstream.executed(), 0, "nothing ran again");

    // What the refusing replica seals itself, it replays.
    assert_eq!(
        login(refusing.addr, "own").await.status,
        StatusCode::CREATED
    );
    assert!(login(refusing.addr, "own").await.replayed());
    assert!(login(accepting.addr, "own").await.replayed());
    assert_eq!(upstream.executed(), 1);
}

/// The payload fingerprint a sealed record keeps in clear (the store compares it) is bound
/// by the seal: a store writer who sets it to none, which matches any payload, does not turn
/// alice's `422` (same key, another payload) into a replay of her first answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_records_fingerprint_rewritten_in_redis_does_not_turn_a_422_into_a_replay() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let k1 = write_key(dir.path(), "k1", 1);
    let upstream = start_recorder().await;
    let store = sealed_in_redis(&redis, &k1, "");
    let proxy = common::start_proxy_from(&routes(&store, upstream.addr), None).await;
    let cookie = format!("sessionid={SECRET}");
    let other = |addr| {
        let cookie = cookie.clone();
        async move {
            post(
                addr,
                "/login",
                &[("idempotency-key", "fp"), ("cookie", &cookie)],
                "{\"amount\":2}",
            )
            .await
        }
    };
    assert_eq!(login(proxy.addr, "fp").await.status, StatusCode::CREATED);
    assert_eq!(
        other(proxy.addr).await.status,
        StatusCode::UNPROCESSABLE_ENTITY
    );

    let digest = digest_of(&proxy, "fp");
    let mut record = stored(&redis, digest);
    record[1..33].copy_from_slice(&Digest::NONE.0);
    plant(&redis, digest, &record);

    let rewritten = other(proxy.addr).await;
    assert_unreadable(&rewritten, "a fingerprint rewritten to none");
    assert_eq!(upstream.executed(), 1, "nothing ran again");
}

/// With `clear_records: refuse`, the proxy's own problem answer a failed owner shares with
/// the duplicates waiting on it is sealed like any answer: they get the owner's 502, not a
/// 500 for a record in clear, and run nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_shared_with_waiters_opens_when_clear_records_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let k1 = write_key(dir.path(), "k1", 1);
    let upstream = common::start_upstream().await;
    let config = format!(
        "store: {{ encrypt: {{ key_file: {}, clear_records: refuse }} }}\nroutes:\n  - name: orders\n    match: {{ path: /orders }}\n    key: {{ header: Idempotency-Key }}\n    wait_timeout: 30s\n    on_unknown_outcome: release\n",
        k1.display()
    );
    let proxy = start_proxy(upstream.addr, &config).await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [
            ("idempotency-key", "reset"),
            ("x-test-gate", "reset"),
            ("x-test-reset", "1"),
        ];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("reset", 1).await;
    let duplicates: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async move {
                post(addr, "/orders", &[("idempotency-key", "reset")], "{}").await
            })
        })
        .collect();
    proxy.metric_reaches("idemgate_waiting", 2.0).await;
    upstream.open("reset");
    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::BAD_GATEWAY);
    for duplicate in duplicates {
        let duplicate = duplicate.await.unwrap();
        assert_eq!(
            duplicate.status,
            StatusCode::BAD_GATEWAY,
            "{:?}",
            String::from_utf8_lossy(&duplicate.body)
        );
        assert!(duplicate.replayed(), "the owner's failure, shared");
    }
    assert_eq!(upstream.executed(), 1, "the waiting duplicates ran nothing");
}
