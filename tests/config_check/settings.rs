//! What parsed settings mean: the README's defaults, `fingerprint_ttl` and a fingerprint
//! beside a client key, admin tokens and store keys read from files, and whether records
//! in clear are still read.

use idemgate::config::{
    Config, ConfigError, InFlightMode, OnStoreError, OnUnknownOutcome, Protection, StatusPattern,
    StoreConfig,
};
use idemgate::key::{KeySource, ScopePart};
use idemgate::store::seal::ClearRecords;
use idemgate::store::WhenFull;

use crate::{invalid, route_with_key, top};

/// The README's Configuration block writes the defaults out: a config of `listen` and
/// `upstream` alone compiles to exactly those values. Each is written here as the README
/// writes it (not read from the code's own defaults), so a default changed in one place
/// only fails here.
#[test]
fn a_config_of_listen_and_upstream_alone_has_the_readme_defaults() {
    const S: u64 = 1;
    const M: u64 = 60;
    const H: u64 = 3600;
    const MIB: u64 = 1 << 20;
    let c = Config::parse(
        "listen: 0.0.0.0:8080\nupstream: http://127.0.0.1:3000\n",
        "min.yaml",
    )
    .unwrap();
    let secs = |d: std::time::Duration| d.as_secs_f64();
    // admin, tls, trusted_proxies: off unless written; no encryption.
    assert!(c.admin.is_none() && c.tls.is_none() && c.encrypt.is_none());
    assert!(c.identity.trusted_proxies.blocks().is_empty());
    assert_eq!(secs(c.drain_timeout), (30 * S) as f64, "drain_timeout: 30s");
    // The fallback is the `defaults:` policy, keyed by `defaults.key`.
    let Protection::On(fallback) = &c.fallback else {
        panic!("defaults.idempotency: on protects unrouted POST/PATCH")
    };
    let p = &fallback.policy;
    assert!(!p.observe, "idempotency: on");
    let KeySource::Fingerprint(rule) = &fallback.key.source else {
        panic!("defaults.key: a fingerprint")
    };
    assert!(
        rule.body && rule.query,
        "key: {{ fingerprint: {{ body: true, query: true }} }}"
    );
    assert_eq!(fallback.key.scope, [ScopePart::Caller], "scope: [caller]");
    assert_eq!(
        secs(p.ttl),
        (2 * M) as f64,
        "fingerprint_ttl: 2m (a derived key)"
    );
    assert_eq!(secs(p.lease), (30 * S) as f64, "lease: 30s");
    assert_eq!(
        secs(p.upstream_timeout),
        (60 * S) as f64,
        "upstream_timeout: 60s"
    );
    assert_eq!(
        secs(p.background_timeout),
        (10 * M) as f64,
        "background_timeout: 10m"
    );
    assert_eq!(
        p.on_unknown_outcome,
        OnUnknownOutcome::Hold,
        "on_unknown_outcome: hold"
    );
    assert_eq!(p.in_flight, InFlightMode::Wait, "in_flight: wait");
    assert_eq!(secs(p.wait_timeout), (10 * S) as f64, "wait_timeout: 10s");
    assert_eq!(
        p.replay_statuses,
        [StatusPattern::Class(2), StatusPattern::Class(4)],
        "replay_statuses: [2xx, 4xx]"
    );
    assert_eq!(p.max_body as u64, MIB, "max_body: 1MiB");
    assert_eq!(p.max_answer as u64, 8 * MIB, "max_answer: 8MiB");
    assert_eq!(
        p.on_store_error,
        OnStoreError::FailClosed,
        "on_store_error: fail_closed"
    );
    // Unprotected requests wait `upstream_timeout` for the response head.
    assert_eq!(secs(c.passthrough_timeout), (60 * S) as f64);
    // A client-supplied key on a route that sets nothing gets `ttl`.
    let keyed = Config::parse(
        &route_with_key("key: { header: Idempotency-Key }\n"),
        "keyed.yaml",
    )
    .unwrap();
    let Protection::On(keyed) = &keyed.routes[0].protection else {
        panic!("protected")
    };
    assert_eq!(secs(keyed.policy.ttl), (24 * H) as f64, "ttl: 24h");

    let conn = c.connections;
    assert_eq!(conn.max_client, 10_000, "connections.max_client");
    assert_eq!(conn.max_upstream, 1024, "connections.max_upstream");
    assert_eq!(
        conn.upstream_protocol,
        idemgate::config::UpstreamProtocol::Http1,
        "upstream_protocol: http1"
    );
    assert_eq!(
        secs(conn.upstream_read_timeout),
        (60 * S) as f64,
        "upstream_read_timeout: 60s"
    );
    assert_eq!(
        secs(conn.tunnel_idle_timeout),
        (60 * S) as f64,
        "tunnel_idle_timeout: 60s"
    );
    assert_eq!(
        secs(conn.upstream_idle_timeout),
        S as f64,
        "upstream_idle_timeout: 1s"
    );
    assert_eq!(
        secs(conn.client_send_timeout),
        (60 * S) as f64,
        "client_send_timeout: 60s"
    );
    assert_eq!(
        secs(conn.linger.time),
        (30 * S) as f64,
        "lingering_time: 30s"
    );
    assert_eq!(
        secs(conn.linger.timeout),
        (5 * S) as f64,
        "lingering_timeout: 5s"
    );
    assert_eq!(conn.linger.bytes, 64 * MIB, "lingering_bytes: 64MiB");
    assert_eq!(
        conn.max_buffered as u64,
        512 * MIB,
        "connections.max_buffered: 512MiB"
    );
    assert_eq!(
        conn.max_buffered_per_connection as u64,
        64 * MIB,
        "connections.max_buffered_per_connection: 64MiB"
    );

    let StoreConfig::Memory(memory) = &c.store else {
        panic!("store: memory by default, got {:?}", c.store)
    };
    assert_eq!(memory.max_entries, 100_000, "store.memory.max_entries");
    assert_eq!(
        memory.max_bytes as u64,
        256 * MIB,
        "store.memory.max_bytes: 256MiB"
    );
    assert_eq!(
        memory.when_full,
        WhenFull::Evict,
        "store.memory.when_full: evict"
    );
    assert_eq!(memory.caller_share, 100, "store.memory.caller_share: 100%");
    assert_eq!(
        memory.address_share, 100,
        "store.memory.address_share: 100%"
    );
    assert_eq!(memory.token_share, 10, "store.memory.token_share: 10%");
    let shared = Config::parse(
        &top("store:\n  memory: { token_share: 25% }\n"),
        "tokens.yaml",
    )
    .unwrap();
    let StoreConfig::Memory(shared) = &shared.store else {
        panic!("a memory store")
    };
    assert_eq!(
        shared.token_share, 25,
        "store.memory.token_share as written"
    );
    let per_address = Config::parse(
        &top("store:\n  memory: { address_share: 5% }\n"),
        "edge.yaml",
    )
    .unwrap();
    let StoreConfig::Memory(per_address) = &per_address.store else {
        panic!("a memory store")
    };
    assert_eq!(per_address.address_share, 5, "as written");
    for bad in ["0%", "101%", "30"] {
        let (line, _, key, message) = invalid(&top(&format!(
            "store:\n  memory: {{ address_share: {bad} }}\n"
        )));
        assert_eq!(
            (line, key.as_str()),
            (4, "store.memory.address_share"),
            "{bad}: {message}"
        );
        assert!(message.contains("from 1% to 100%"), "{bad}: {message}");
    }
    // The commented Redis line's values, when only its `url` is written.
    let redis = Config::parse(
        &top("store:\n  redis: { url: \"redis://127.0.0.1:6379\" }\n"),
        "redis.yaml",
    )
    .unwrap();
    let StoreConfig::Redis(redis) = &redis.store else {
        panic!("a redis store")
    };
    assert_eq!(redis.prefix, "idemgate:", "store.redis.prefix");
    assert_eq!(secs(redis.timeout), S as f64, "store.redis.timeout: 1s");
}

#[test]
fn fingerprint_ttl_applies_to_derived_keys_only() {
    let text = top(
        "defaults: { ttl: 1h, fingerprint_ttl: 30s }\nroutes:\n  - name: h\n    match: { path: /h }\n    key: { header: K }\n  - name: f\n    match: { path: /f }\n    key: { fingerprint: { body: true } }\n  - name: own\n    match: { path: /o }\n    key: { fingerprint: { body: true } }\n    ttl: 5m\n",
    );
    let config = Config::parse(&text, "p.yaml").unwrap();
    let ttl = |p: &Protection| match p {
        Protection::On(p) => p.policy.ttl.as_secs(),
        Protection::Off(_) => panic!("protected"),
    };
    let ttls: Vec<u64> = config.routes.iter().map(|r| ttl(&r.protection)).collect();
    assert_eq!(ttls, [3600, 30, 300]);
    assert_eq!(
        ttl(&config.fallback),
        30,
        "the default key is a fingerprint"
    );
    let (_, _, key, _) = invalid(&top("defaults: { fingerprint_ttl: 0s }\n"));
    assert_eq!(key, "defaults.fingerprint_ttl");
}

#[test]
fn a_fingerprint_beside_a_client_key_is_its_payload_check_and_nowhere_else() {
    let config = Config::parse(
        &route_with_key("key: { header: K, fingerprint: { query: false, ignore: [note] } }\n"),
        "k.yaml",
    )
    .unwrap();
    let Protection::On(p) = &config.routes[0].protection else {
        panic!()
    };
    assert!(matches!(p.key.source, KeySource::Header(_)));
    assert!(!p.key.payload.query && p.key.payload.ignore.ignores_name(b"note"));
    let (_, _, _, message) = invalid(&route_with_key("key: { fields: [/a], fingerprint: {} }\n"));
    assert!(message.contains("exactly one source"), "{message}");
}

#[test]
fn admin_tokens_and_store_keys_come_from_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "s3cret\n").unwrap();
    std::fs::write(dir.path().join("store.key"), "ab".repeat(32)).unwrap();
    std::fs::write(dir.path().join("short.key"), "abcd").unwrap();
    let path = dir.path().join("proxy.yaml");
    let write = |rest: &str| std::fs::write(&path, top(rest)).unwrap();
    write("admin: { listen: 127.0.0.1:9901, token_file: token }\nstore: { encrypt: { key_file: store.key } }\n");
    let config = Config::load(&path).unwrap();
    assert_eq!(config.admin.unwrap().token.as_deref(), Some("s3cret"));
    assert_eq!(config.encrypt.unwrap().key_ids().len(), 1);
    for (rest, key, says) in [
        (
            "admin: { listen: 127.0.0.1:9901, token: a, token_file: token }\n",
            "admin",
            "not both",
        ),
        (
            "admin: { listen: 127.0.0.1:9901, token_file: missing }\n",
            "admin.token_file",
            "missing",
        ),
        (
            "store: { encrypt: { key_file: short.key } }\n",
            "store.encrypt",
            "64 hex digits",
        ),
        (
            "store: { encrypt: { keys: [{ file: store.key }, { file: store.key }] } }\n",
            "store.encrypt",
            "twice",
        ),
        (
            "store: { encrypt: { key_env: IDEMGATE_TEST_UNSET_KEY } }\n",
            "store.encrypt",
            "IDEMGATE_TEST_UNSET_KEY",
        ),
    ] {
        write(rest);
        match Config::load(&path) {
            Err(ConfigError::Invalid {
                key: k, message, ..
            }) => {
                assert_eq!(k, key, "{rest}");
                assert!(message.contains(says), "{rest}: {message}");
            }
            other => panic!("{rest}: {other:?}"),
        }
    }
}

/// `store.encrypt.clear_records`: `accept` unless written (answers stored before encryption
/// stay readable), `refuse` once the migration is over; another word is an error at its
/// place.
#[test]
fn clear_records_are_accepted_unless_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("store.key"), "ab".repeat(32)).unwrap();
    let path = dir.path().join("proxy.yaml");
    let load = |encrypt: &str| {
        std::fs::write(&path, top(&format!("store: {{ encrypt: {encrypt} }}\n"))).unwrap();
        Config::load(&path)
    };
    for (encrypt, expected) in [
        ("{ key_file: store.key }", ClearRecords::Accept),
        (
            "{ key_file: store.key, clear_records: accept }",
            ClearRecords::Accept,
        ),
        (
            "{ keys: [{ file: store.key }], clear_records: refuse }",
            ClearRecords::Refuse,
        ),
    ] {
        let ring = load(encrypt).unwrap().encrypt.unwrap();
        assert_eq!(ring.clear_records(), expected, "{encrypt}");
    }
    match load("{ key_file: store.key, clear_records: reject }") {
        Err(ConfigError::Invalid { key, message, .. }) => {
            assert_eq!(key, "store.encrypt.clear_records");
            assert!(message.contains("unknown variant `reject`"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// A host written as a fully qualified name (`pay.example.`) names the same host as
/// `pay.example`, as requests are matched: the route covers that host's requests, sent
/// with or without the dot, rather than none (which would leave them to `defaults.key`).
#[test]
fn a_host_pattern_with_a_trailing_dot_matches_its_host() {
    let config = Config::parse(
        &top("routes:\n  - name: pay\n    match: { path: /pay, host: \"pay.example.\" }\n    key: { header: Idempotency-Key }\n  - name: shop\n    match: { path: /shop, host: \"*.shop.example.\" }\n"),
        "p.yaml",
    )
    .unwrap();
    for (host, path, route) in [
        ("pay.example", "/pay", "pay"),
        ("Pay.Example.:8443", "/pay", "pay"),
        ("a.shop.example", "/shop", "shop"),
        ("a.shop.example.", "/shop", "shop"),
        ("other.example", "/pay", "default"),
    ] {
        let (matched, _) = config.protection_for(Some(host), &http::Method::POST, path);
        assert_eq!(matched, route, "{host}{path}");
    }
}
