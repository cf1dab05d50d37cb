//! Stored answers are secret: with `store.encrypt` a session cookie or token the upstream
//! answered never sits in the store in clear (memory, Redis or PostgreSQL), keys rotate
//! without losing records, and the admin API shows stored bodies only behind its token.
//! They are bound too: a record moved to another key or given another fingerprint does not
//! open, and with `clear_records: refuse` neither does one planted in clear
//! (`tampered.rs`: records a store writer damaged, moved, rewrote or planted).

#[path = "../common/mod.rs"]
mod common;

mod tampered;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::postgres_server::PostgresServer;
use common::redis_server::RedisServer;
use common::{post, send, start_proxy, start_proxy_with_admin, start_recorder, ProxyHandle};
use http::{Method, StatusCode};
use idemgate::config::Config;
use idemgate::key::Digest;
use idemgate::store::seal::key_id;

pub(crate) const SECRET: &str = "s3cr3t-alice-session";

pub(crate) fn write_key(dir: &Path, name: &str, byte: u8) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{}\n", hex::encode([byte; 32]))).unwrap();
    path
}

pub(crate) fn routes(store: &str, upstream: std::net::SocketAddr) -> String {
    format!(
        "listen: 127.0.0.1:0\nupstream: http://{upstream}\n{store}\nroutes:\n  - name: login\n    match: {{ path: /login }}\n    key: {{ header: Idempotency-Key }}\n"
    )
}

/// The key the proxy derives for `key` on the `login` route (no Authorization, the
/// session cookie `sessionid`).
pub(crate) fn digest_of(proxy: &ProxyHandle, key: &str) -> Digest {
    digest_as(proxy, key, SECRET)
}

/// [`digest_of`] for the caller whose session cookie is `session`.
pub(crate) fn digest_as(proxy: &ProxyHandle, key: &str, session: &str) -> Digest {
    let mut headers = http::HeaderMap::new();
    headers.insert("idempotency-key", key.parse().unwrap());
    headers.insert("cookie", format!("sessionid={session}").parse().unwrap());
    // The host is part of the key; routes and keys read it without its port.
    headers.insert("host", "127.0.0.1".parse().unwrap());
    let request = idemgate::explain::Request {
        method: Method::POST,
        uri: "/login".parse().unwrap(),
        headers,
        body: b"{}".to_vec(),
        client_ip: Some([127, 0, 0, 1].into()),
        client_cert: None,
    };
    let text = idemgate::explain::explain(&proxy.proxy.config(), &request).unwrap();
    let hex = text
        .lines()
        .find_map(|l| l.strip_prefix("key digest:"))
        .unwrap()
        .trim();
    Digest::from_hex(hex).unwrap()
}

pub(crate) async fn login(addr: std::net::SocketAddr, key: &str) -> common::Answer {
    login_as(addr, key, SECRET).await
}

/// [`login`] by the caller whose session cookie is `session`.
pub(crate) async fn login_as(
    addr: std::net::SocketAddr,
    key: &str,
    session: &str,
) -> common::Answer {
    post(
        addr,
        "/login",
        &[
            ("idempotency-key", key),
            ("cookie", &format!("sessionid={session}")),
        ],
        "{}",
    )
    .await
}

pub(crate) fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Memory store: the record is sealed, replays are whole, a rotation keeps old records
/// readable and seals new ones under the new key; a key removed too early fails closed
/// (500) rather than executing the request again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_sealed_in_memory_and_keys_rotate() {
    let dir = tempfile::tempdir().unwrap();
    let (k1, k2) = (
        write_key(dir.path(), "k1", 1),
        write_key(dir.path(), "k2", 2),
    );
    let upstream = start_recorder().await;
    let one = format!("store: {{ encrypt: {{ key_file: {} }} }}", k1.display());
    let proxy = common::start_proxy_from(&routes(&one, upstream.addr), None).await;
    let first = login(proxy.addr, "a").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let stored = proxy
        .store
        .inspect(digest_of(&proxy, "a"))
        .await
        .unwrap()
        .unwrap()
        .response
        .unwrap();
    assert!(stored.is_sealed());
    assert!(
        !holds(stored.encode(), SECRET),
        "the secret is not in clear"
    );
    assert_eq!(stored.encode()[11..15], key_id(&[1; 32]));
    let replay = login(proxy.addr, "a").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(
        replay.headers["set-cookie"],
        format!("session={SECRET}-renewed")
    );

    // Rotation: k2 seals, k1 still opens.
    let both = format!(
        "store: {{ encrypt: {{ keys: [{{ file: {} }}, {{ file: {} }}] }} }}",
        k2.display(),
        k1.display()
    );
    let config = Config::parse(&routes(&both, upstream.addr), "t.yaml").unwrap();
    proxy.proxy.reload(Arc::new(config));
    assert!(
        login(proxy.addr, "a").await.replayed(),
        "an old record opens"
    );
    login(proxy.addr, "b").await;
    let newer = proxy
        .store
        .inspect(digest_of(&proxy, "b"))
        .await
        .unwrap()
        .unwrap()
        .response
        .unwrap();
    assert_eq!(
        newer.encode()[11..15],
        key_id(&[2; 32]),
        "the new key seals"
    );
    assert_eq!(upstream.executed(), 2);

    // k1 dropped while its records live: they cannot be read, and are not run again.
    let only_new = format!("store: {{ encrypt: {{ key_file: {} }} }}", k2.display());
    let config = Config::parse(&routes(&only_new, upstream.addr), "t.yaml").unwrap();
    proxy.proxy.reload(Arc::new(config));
    let lost = login(proxy.addr, "a").await;
    assert_eq!(lost.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        lost.json()["type"],
        "urn:idemgate:problem:stored-answer-unreadable"
    );
    assert!(login(proxy.addr, "b").await.replayed());
    assert_eq!(upstream.executed(), 2);
}

/// Every value Redis holds, read as bytes.
fn redis_values(redis: &RedisServer) -> Vec<Vec<u8>> {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    let mut values = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
        if kind == "string" {
            let value: Vec<u8> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
            values.push(value);
        }
    }
    values
}

/// Redis holds no secret in clear: the values themselves are read, not just key names.
/// A replica with the rotated ring reads what the first wrote; one without keys refuses
/// to replay it and does not execute it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_never_holds_an_answer_in_clear_and_old_keys_stay_readable() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (k1, k2) = (
        write_key(dir.path(), "k1", 1),
        write_key(dir.path(), "k2", 2),
    );
    let upstream = start_recorder().await;
    let redis_store = format!(
        "  redis: {{ url: \"{}\", prefix: \"s:\", timeout: 500ms }}",
        redis.url()
    );
    let sealed_with = |keys: &[&Path]| {
        let list: Vec<String> = keys
            .iter()
            .map(|k| format!("{{ file: {} }}", k.display()))
            .collect();
        format!(
            "store:\n{redis_store}\n  encrypt: {{ keys: [{}] }}",
            list.join(", ")
        )
    };
    let first = common::start_proxy_from(&routes(&sealed_with(&[&k1]), upstream.addr), None).await;
    let answer = login(first.addr, "r1").await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert!(
        holds(&answer.body, SECRET),
        "the upstream did echo the secret"
    );
    let values = redis_values(&redis);
    assert!(
        values.iter().any(|v| v.len() > 100),
        "the answer is in Redis: {values:?}"
    );
    for value in &values {
        assert!(!holds(value, SECRET), "a value holds the secret in clear");
        assert!(
            !holds(value, "set-cookie"),
            "a value holds headers in clear"
        );
    }

    let rotated =
        common::start_proxy_from(&routes(&sealed_with(&[&k2, &k1]), upstream.addr), None).await;
    let replay = login(rotated.addr, "r1").await;
    assert!(
        replay.replayed(),
        "the rotated replica reads the old record"
    );
    assert_eq!(replay.body, answer.body);

    let keyless = common::start_proxy_from(
        &routes(&format!("store:\n{redis_store}"), upstream.addr),
        None,
    )
    .await;
    let refused = login(keyless.addr, "r1").await;
    assert_eq!(refused.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(upstream.executed(), 1, "never executed twice");
}

/// Turning `store.encrypt` on keeps what was stored before it: a replica without
/// encryption stores an answer in clear in Redis, and a replica with a key replays it
/// rather than running it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_stored_before_encryption_stay_readable() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let k1 = write_key(dir.path(), "k1", 1);
    let upstream = start_recorder().await;
    let redis_store = format!(
        "store:\n  redis: {{ url: \"{}\", prefix: \"s:\", timeout: 500ms }}",
        redis.url()
    );
    let plain = common::start_proxy_from(&routes(&redis_store, upstream.addr), None).await;
    let answer = login(plain.addr, "before").await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert!(
        redis_values(&redis).iter().any(|v| holds(v, SECRET)),
        "stored in clear, before encryption"
    );

    let sealed = format!("{redis_store}\n  encrypt: {{ key_file: {} }}", k1.display());
    let encrypting = common::start_proxy_from(&routes(&sealed, upstream.addr), None).await;
    let replay = login(encrypting.addr, "before").await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert!(replay.replayed(), "the record from before encryption opens");
    assert_eq!(replay.body, answer.body);
    assert_eq!(upstream.executed(), 1, "never executed twice");
}

/// PostgreSQL holds no secret in clear either: the dedupe table's columns are read, the
/// answer replays whole from it, and a replica without the key refuses to replay it rather
/// than executing it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_never_holds_an_answer_in_clear() {
    let pg = PostgresServer::start();
    let dir = tempfile::tempdir().unwrap();
    let key = write_key(dir.path(), "k1", 1);
    let upstream = start_recorder().await;
    let pg_store = format!(
        "  postgres: {{ url: \"{}\", table: sealed_keys, timeout: 2s }}",
        pg.url()
    );
    let sealed = format!(
        "store:\n{pg_store}\n  encrypt: {{ key_file: {} }}",
        key.display()
    );
    let first = common::start_proxy_from(&routes(&sealed, upstream.addr), None).await;
    let answer = login(first.addr, "p1").await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert!(
        holds(&answer.body, SECRET),
        "the upstream did echo the secret"
    );
    let rows =
        pg.psql("SELECT encode(response, 'hex') FROM sealed_keys WHERE response IS NOT NULL");
    let stored: Vec<Vec<u8>> = rows
        .lines()
        .map(|l| hex::decode(l.trim()).unwrap())
        .collect();
    assert_eq!(stored.len(), 1, "one stored answer: {rows}");
    assert!(stored[0].len() > 100, "the whole answer is stored");
    assert!(
        !holds(&stored[0], SECRET),
        "the table holds the secret in clear"
    );
    assert!(
        !holds(&stored[0], "set-cookie"),
        "the table holds headers in clear"
    );

    let replay = login(first.addr, "p1").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, answer.body);

    let keyless =
        common::start_proxy_from(&routes(&format!("store:\n{pg_store}"), upstream.addr), None)
            .await;
    let refused = login(keyless.addr, "p1").await;
    assert_eq!(refused.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(upstream.executed(), 1, "never executed twice");
}

/// `?body=true` shows another caller's stored answer: only behind a configured and given
/// token, and then opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_bodies_are_shown_only_behind_the_admin_token() {
    let dir = tempfile::tempdir().unwrap();
    let k1 = write_key(dir.path(), "k1", 1);
    let upstream = start_recorder().await;
    let store = format!("store: {{ encrypt: {{ key_file: {} }} }}\n", k1.display());
    let route = "routes:\n  - name: login\n    match: { path: /login }\n    key: { header: Idempotency-Key }\n";
    let open = start_proxy(upstream.addr, &format!("{store}{route}")).await;
    login(open.addr, "a").await;
    let digest = digest_of(&open, "a");
    let refused = send(
        open.admin,
        Method::GET,
        &format!("/keys/{digest}?body=true"),
        &[],
        "",
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(String::from_utf8_lossy(&refused.body).contains("admin.token"));
    let summary = send(open.admin, Method::GET, &format!("/keys/{digest}"), &[], "").await;
    assert_eq!(summary.status, StatusCode::OK);
    assert_eq!(
        summary.json()["status"],
        201,
        "the status is opened to show"
    );
    assert!(!holds(&summary.body, SECRET));

    let guarded =
        start_proxy_with_admin(upstream.addr, &format!("{store}{route}"), Some("t0ken")).await;
    login(guarded.addr, "a").await;
    let digest = digest_of(&guarded, "a");
    let path = format!("/keys/{digest}?body=true");
    let anonymous = send(guarded.admin, Method::GET, &path, &[], "").await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let shown = send(
        guarded.admin,
        Method::GET,
        &path,
        &[("authorization", "Bearer t0ken")],
        "",
    )
    .await;
    assert_eq!(shown.status, StatusCode::OK);
    assert!(shown.json()["body"].as_str().unwrap().contains(SECRET));
}

/// README "How a request flows" 2: "Only digests are stored, never a client key, body or
/// `Authorization` value." Redis's key names and values are scanned after a client-keyed
/// request, a fingerprinted one and an observed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holds_no_client_key_request_body_or_authorization() {
    let redis = RedisServer::start();
    let upstream = common::start_upstream().await;
    let store = format!(
        "store:\n  redis: {{ url: \"{}\", prefix: \"p:\" }}\n{}",
        redis.url(),
        common::SECRET_ROUTES
    );
    let proxy = common::start_proxy(upstream.addr, &store).await;
    common::send_secrets(proxy.addr).await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    let names: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert!(!names.is_empty());
    let values = redis_values(&redis);
    for needle in common::SECRETS {
        for name in &names {
            assert!(!name.contains(needle), "key name {name} holds {needle}");
        }
        for value in &values {
            assert!(!holds(value, needle), "a value holds {needle}");
        }
    }
}
