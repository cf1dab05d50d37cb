//! Config parsing and `idemgate check`: every SPEC example parses; errors name
//! file:line:column and the offending key.

mod common;

use std::process::Command;

use idemgate::config::{
    Config, ConfigError, InFlightMode, OnStoreError, OnUnknownOutcome, Protection, StatusPattern,
    StoreConfig,
};
use idemgate::key::{KeySource, ScopePart};
use idemgate::store::WhenFull;

const SPEC_PROXY: &str = include_str!("fixtures/spec_proxy.yaml");
const SPEC_KEY_RULE: &str = include_str!("fixtures/spec_key_rule.yaml");

fn route_with_key(key_yaml: &str) -> String {
    format!(
        "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\nroutes:\n  - name: r\n    match: {{ path: /x }}\n{}",
        key_yaml
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    )
}

fn invalid(text: &str) -> (usize, usize, String, String) {
    match Config::parse(text, "proxy.yaml") {
        Err(ConfigError::Invalid {
            line,
            column,
            key,
            message,
            ..
        }) => (line, column, key, message),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn the_spec_config_example_parses() {
    let config = Config::parse(SPEC_PROXY, "spec.yaml").expect("SPEC example");
    assert_eq!(config.routes.len(), 4);
    let names: Vec<_> = config.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["create-order", "repayment-callback", "vote", "update-user"]
    );
    let Protection::On(cb) = &config.routes[1].protection else {
        panic!("callback protected")
    };
    assert_eq!(cb.policy.ttl.as_secs(), 30 * 86_400);
    assert!(matches!(&cb.key.source, KeySource::Fields(f) if f.len() == 2));
    assert_eq!(config.admin.unwrap().listen.port(), 9901);
}

#[test]
fn every_key_rule_form_of_the_spec_parses() {
    let header = Config::parse(&route_with_key(SPEC_KEY_RULE), "k.yaml").expect("header form");
    let Protection::On(p) = &header.routes[0].protection else {
        panic!()
    };
    assert!(p.key.required);
    for alternative in [
        "key:\n  fields: [/alipayNo, /paymentOrderNo]\n",
        "key:\n  fingerprint: { query: true, body: true, ignore: [timestamp, lat, lng] }\n  scope: [header: Authorization]\n",
        "key:\n  fingerprint: { body: true, ignore: [/order/note], ignore_defaults: false }\n  scope: [client_ip, cookie: sid]\n",
        "key: off\n",
        "idempotency: off\n",
    ] {
        Config::parse(&route_with_key(alternative), "k.yaml")
            .unwrap_or_else(|e| panic!("{alternative}: {e}"));
    }
}

#[test]
fn only_listen_and_upstream_are_required() {
    let c = Config::parse(
        "listen: 0.0.0.0:8080\nupstream: http://127.0.0.1:3000\n",
        "min.yaml",
    )
    .unwrap();
    assert!(c.routes.is_empty() && c.admin.is_none());
    assert!(matches!(c.fallback, Protection::On(_)));
    let (line, _, key, message) = invalid("listen: 0.0.0.0:8080\n");
    assert_eq!(line, 1);
    assert!(message.contains("upstream"), "{key}: {message}");
}

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
        secs(conn.upstream_read_timeout),
        (60 * S) as f64,
        "upstream_read_timeout: 60s"
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

/// "`background_timeout` must be at least `upstream_timeout`": a file that sets it below,
/// in `defaults:` or on a route (where the route's `upstream_timeout` outgrows the
/// inherited 10m), is refused, the error naming where and both keys; equal is accepted.
#[test]
fn a_background_timeout_below_the_upstream_timeout_is_refused() {
    let (line, _, key, message) = invalid(&top(
        "defaults:\n  upstream_timeout: 2m\n  background_timeout: 1m\n",
    ));
    // Where: the key, placed at its section (line 3).
    assert_eq!((line, key.as_str()), (3, "defaults.background_timeout"));
    assert!(
        message.contains("background_timeout (1m) must be at least upstream_timeout (2m)"),
        "{message}"
    );
    let on_a_route = top(
        "routes:\n  - name: slow\n    match: { path: /slow }\n    key: { header: K }\n    upstream_timeout: 15m\n",
    );
    let (line, _, key, message) = invalid(&on_a_route);
    assert_eq!((line, key.as_str()), (4, "routes[0].background_timeout"));
    assert!(
        message.contains("background_timeout") && message.contains("upstream_timeout"),
        "{message}"
    );
    let err = Config::parse(&on_a_route, "proxy.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("proxy.yaml:"), "{err}");
    Config::parse(
        &top("defaults:\n  upstream_timeout: 2m\n  background_timeout: 2m\n"),
        "p.yaml",
    )
    .expect("equal is at least");
}

#[test]
fn unknown_key_names_file_line_column_and_key() {
    let text = "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\nroutes:\n  - name: a\n    match: { path: /a }\n    tll: 5m\n";
    let (line, column, key, message) = invalid(text);
    assert_eq!((line, column), (6, 5));
    assert_eq!(key, "routes[0].tll");
    assert!(message.contains("unknown field `tll`"), "{message}");
    let err = Config::parse(text, "proxy.yaml").unwrap_err().to_string();
    assert!(
        err.starts_with("proxy.yaml:6:5: routes[0].tll: unknown field `tll`"),
        "{err}"
    );
}

#[test]
fn bad_duration_names_its_place() {
    let text = "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\ndefaults:\n  ttl: 24x\n";
    let (line, column, key, message) = invalid(text);
    assert_eq!((line, column), (4, 8));
    assert_eq!(key, "defaults.ttl");
    assert!(message.contains("invalid duration \"24x\""), "{message}");
}

#[test]
fn bad_json_pointer_names_its_place() {
    let text = "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\nroutes:\n  - name: cb\n    match: { path: /cb }\n    key: { fields: [/ok, alipayNo] }\n";
    let (line, column, key, message) = invalid(text);
    assert_eq!(line, 6);
    assert!(column > 1, "column {column}");
    assert_eq!(key, "routes[0].key.fields[1]");
    assert!(message.contains("alipayNo"), "{message}");
}

#[test]
fn rule_level_mistakes_are_refused() {
    let two_sources = route_with_key("key: { header: K, fields: [/a] }\n");
    let (line, _, _, message) = invalid(&two_sources);
    assert_eq!(line, 6);
    assert!(message.contains("exactly one source"), "{message}");
    let (_, _, key, message) = invalid(&route_with_key("match2: 1\n"));
    assert!(
        message.contains("unknown field `match2`"),
        "{key}: {message}"
    );
    let safe = "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\nroutes:\n  - name: g\n    match: { methods: [GET], path: /g }\n";
    let (line, _, key, message) = invalid(safe);
    assert_eq!((line, key.as_str()), (5, "routes[0].match.methods[0]"));
    assert!(message.contains("safe method"), "{message}");
    let dup = "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\nroutes:\n  - name: a\n    match: { path: /a }\n  - name: a\n    match: { path: /b }\n";
    let (line, _, key, message) = invalid(dup);
    assert_eq!((line, key.as_str()), (4, "routes[1].name"));
    assert!(message.contains("used twice"), "{message}");
    let (_, _, key, _) = invalid("listen: 127.0.0.1:8080\nupstream: ftp://x\n");
    assert_eq!(key, "upstream");
    let (_, _, key, _) =
        invalid("listen: 127.0.0.1:8080\nupstream: http://x\ndefaults: { max_body: 1TB }\n");
    assert_eq!(key, "defaults.max_body");
}

#[test]
fn check_command_prints_routes_and_exits_by_validity() {
    let bin = env!("CARGO_BIN_EXE_idemgate");
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, SPEC_PROXY).unwrap();
    let out = Command::new(bin)
        .args(["check", "--config"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "create-order",
        "repayment-callback",
        "/api/polls/{poll}/votes",
        "fields",
        "30d",
    ] {
        assert!(table.contains(expected), "{expected} missing from\n{table}");
    }
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "listen: 127.0.0.1:1\nupstream: http://x\ndefaults:\n  lease: soon\n",
    )
    .unwrap();
    let out = Command::new(bin)
        .args(["check", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.yaml:4:10: defaults.lease: invalid duration"),
        "{stderr}"
    );
}

#[test]
fn explain_command_shows_the_key_and_what_was_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.yaml");
    std::fs::write(&config, SPEC_PROXY).unwrap();
    let body = dir.path().join("body.json");
    std::fs::write(&body, r#"{"choice":"b","timestamp":1700000000,"lat":1.5}"#).unwrap();
    let run = |body_file: &std::path::Path| {
        let body_file = body_file.to_str().unwrap();
        common::explain_cli(
            &config,
            &[
                "--method",
                "POST",
                "--path",
                "/api/polls/7/votes",
                "-H",
                "X-User-Id: u1",
                "--body",
                body_file,
            ],
        )
    };
    let text = run(&body);
    assert!(text.contains("route:             vote"), "{text}");
    assert!(
        text.contains("/timestamp") && text.contains("/lat"),
        "{text}"
    );
    assert!(text.contains("header:x-user-id (present)"), "{text}");
    let digest = |t: &str| {
        t.lines()
            .find(|l| l.starts_with("key digest:"))
            .unwrap()
            .to_owned()
    };
    std::fs::write(&body, r#"{ "lat": 9, "choice": "b" }"#).unwrap();
    assert_eq!(
        digest(&text),
        digest(&run(&body)),
        "ignored fields do not change the key"
    );
}

fn top(rest: &str) -> String {
    format!("listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\n{rest}")
}

#[test]
fn identity_settings_parse_and_their_mistakes_name_the_fix() {
    let config = Config::parse(
        &top("trusted_proxies: [10.0.0.0/8, 192.168.1.7, \"fd00::/8\"]\nsession_cookies: [my_sess]\n"),
        "p.yaml",
    )
    .unwrap();
    assert_eq!(config.identity.trusted_proxies.blocks().len(), 3);
    assert_eq!(config.identity.session_cookies, ["my_sess"]);
    let (line, _, key, message) = invalid(&top("trusted_proxies: [10.0.0.1/8]\n"));
    assert_eq!((line, key.as_str()), (3, "trusted_proxies[0]"));
    assert!(message.contains("write 10.0.0.0/8"), "{message}");
    let (_, _, key, message) = invalid(&top("session_cookies: [\"a b\"]\n"));
    assert_eq!(key, "session_cookies");
    assert!(message.contains("not a cookie name"), "{message}");
}

/// A zero idle timeout would close every upstream connection the moment it came back:
/// refused, naming the key and its place, rather than read as "no keep-alive".
#[test]
fn a_zero_upstream_idle_timeout_is_refused_where_it_is_written() {
    let config = Config::parse(
        &top("connections: { upstream_idle_timeout: 250ms }\n"),
        "p.yaml",
    )
    .unwrap();
    assert_eq!(
        config.connections.upstream_idle_timeout,
        std::time::Duration::from_millis(250)
    );
    let (line, column, key, message) = invalid(&top(
        "connections:\n  max_upstream: 8\n  upstream_idle_timeout: 0s\n",
    ));
    assert_eq!((line, column), (5, 3));
    assert_eq!(key, "connections.upstream_idle_timeout");
    assert_eq!(message, "must be above zero");
}

/// A zero send timeout would close a client connection at the first write that has to
/// wait: refused, naming the key and its place, rather than read as "no timeout".
#[test]
fn a_zero_client_send_timeout_is_refused_where_it_is_written() {
    let config =
        Config::parse(&top("connections: { client_send_timeout: 5s }\n"), "p.yaml").unwrap();
    assert_eq!(
        config.connections.client_send_timeout,
        std::time::Duration::from_secs(5)
    );
    let (line, column, key, message) = invalid(&top(
        "connections:\n  max_client: 8\n  client_send_timeout: 0s\n",
    ));
    assert_eq!((line, column), (5, 3));
    assert_eq!(key, "connections.client_send_timeout");
    assert_eq!(message, "must be above zero");
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

/// A scope of only a header lets every request without it share one key: `check` says so,
/// and what to write instead; the default scope draws no note.
#[test]
fn check_notes_scopes_that_let_callers_share_a_key() {
    let config = Config::parse(SPEC_PROXY, "spec.yaml").unwrap();
    let notes = config.notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("route vote") && notes[0].contains("`scope: [header:x-user-id, caller]`"),
        "{notes:?}"
    );
    let plain = Config::parse(&top(""), "p.yaml").unwrap();
    assert!(plain.notes().is_empty());
}

/// A trusted proxy block with public addresses lets a client there name any client
/// address in `X-Forwarded-For`: `check` says so; private and loopback blocks draw no note.
#[test]
fn check_notes_trusted_proxies_with_public_addresses() {
    let config = |blocks: &[&str]| {
        let list: Vec<String> = blocks.iter().map(|b| format!("\"{b}\"")).collect();
        let yaml = format!("trusted_proxies: [{}]\n", list.join(", "));
        Config::parse(&top(&yaml), "p.yaml").unwrap()
    };
    for private in [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.1.0/24",
        "127.0.0.1",
        "100.64.0.0/10",
        "fd00::/8",
        "::1",
    ] {
        assert!(config(&[private]).notes().is_empty(), "{private}");
    }
    for public in [
        "0.0.0.0/0",
        "10.0.0.0/7",
        "203.0.113.7",
        "::/0",
        "2001:db8::/32",
    ] {
        let notes = config(&["10.0.0.0/8", public]).notes();
        assert_eq!(notes.len(), 1, "{public}: {notes:?}");
        assert!(
            notes[0].contains("trusted_proxies") && notes[0].contains("public addresses"),
            "{notes:?}"
        );
    }
}

/// `client_cert` has a value only on a mutual-TLS listener: scoped by it anywhere else,
/// every caller would share one key, so the config is refused (by `check`, `run` and a
/// reload alike) at the scope, naming the route.
#[test]
fn a_client_cert_scope_without_mutual_tls_is_refused_where_it_is_written() {
    let routes = "routes:\n  - name: a\n    match: { path: /a }\n    key: { fingerprint: {}, scope: [client_cert] }\n  - name: b\n    match: { path: /b }\n    key:\n      header: K\n      scope: [caller, client_cert]\n";
    let (line, column, key, message) = invalid(&top(routes));
    assert_eq!((line, column, key.as_str()), (6, 37, "routes[0].key.scope"));
    assert!(
        message.contains("route a:")
            && message.contains("`client_cert`")
            && message.contains("tls.client_ca"),
        "{message}"
    );
    // The error is placed at the scope of the route that names it.
    let later = routes.replace(
        "/a }\n    key: { fingerprint: {}, scope: [client_cert] }\n",
        "/a }\n    idempotency: off\n",
    );
    let (line, column, key, message) = invalid(&top(&later));
    assert_eq!(
        (line, column, key.as_str()),
        (11, 23, "routes[1].key.scope")
    );
    assert!(
        message.contains("route b:") && message.contains("`client_cert`"),
        "{message}"
    );
    let (line, _, key, message) = invalid(&top(
        "defaults:\n  key: { fingerprint: {}, scope: [client_cert] }\n",
    ));
    assert_eq!((line, key.as_str()), (4, "defaults.key.scope"));
    assert!(
        message.contains("defaults.key") && message.contains("`client_cert`"),
        "{message}"
    );
    let (line, _, key, _) = invalid(&top("tokens: { scope: [client_cert] }\n"));
    assert_eq!((line, key.as_str()), (3, "tokens.scope"));
    Config::parse(
        &top(&later.replace("caller, client_cert", "caller")),
        "p.yaml",
    )
    .expect("no client_cert, no error");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.yaml");
    std::fs::write(&path, top(routes)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(":6:37: routes[0].key.scope: route a:"),
        "{stderr}"
    );
}
