//! `idemgate check` and `idemgate explain`: the routes printed and the exit status by
//! validity, a key and what was ignored, the token endpoint, and the notes on scopes that
//! let callers share a key, on trusted proxies with public addresses and on methods
//! outside the registry.

use std::process::Command;

use idemgate::config::Config;

use crate::common;
use crate::{top, SPEC_PROXY};

#[test]
fn check_command_prints_routes_and_exits_by_validity() {
    let bin = env!("CARGO_BIN_EXE_idemgate");
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, SPEC_PROXY).unwrap();
    let table = common::cli("check", &good, &[]);
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

/// A config that issues one-time tokens shows the endpoint in `check`'s table, where a
/// user looks for what answers which path, and `explain` of a POST to it says so.
#[test]
fn check_and_explain_show_the_token_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tokens.yaml");
    let yaml = "listen: 127.0.0.1:1\nupstream: http://127.0.0.1:2\ntokens: { path: /issue, ttl: 10m }\nroutes:\n  - name: pay\n    match: { path: /pay }\n    key: { token: {} }\n";
    std::fs::write(&config, yaml).unwrap();
    let table = common::cli("check", &config, &[]);
    let row = table
        .lines()
        .find(|line| line.starts_with("(token endpoint)"))
        .unwrap_or_else(|| panic!("no token endpoint in\n{table}"));
    assert!(row.contains("/issue") && row.contains("10m"), "{row}");
    // Any spelling the proxy normalises to the endpoint's path is the endpoint.
    for path in ["/issue", "//issue", "/x/../issue"] {
        let explained = common::explain_cli(&config, &["--method", "POST", "--path", path]);
        assert!(
            explained.contains("route:             (token endpoint)"),
            "{path}: {explained}"
        );
        assert!(!explained.contains("key digest"), "{path}: {explained}");
    }
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

/// A shared store's renewals go out every `lease/3` and each may wait the store's whole
/// `timeout`: under three timeouts, one that times out and a slow one after it let a live
/// owner's claim lapse. `check` says so, naming the lease, the timeout and the least lease
/// that holds; a lease that holds, or the memory store (no renewals), draws no note.
#[test]
fn check_notes_a_lease_a_stalled_shared_store_lets_lapse() {
    let config = |store: &str, lease: &str| {
        let text = top(&format!(
            "store:\n  {store}\nroutes:\n  - name: orders\n    match: {{ path: /orders }}\n    key: {{ header: K }}\n    lease: {lease}\n"
        ));
        Config::parse(&text, "p.yaml").unwrap().notes()
    };
    let redis = r#"redis: { url: "redis://127.0.0.1:6379" }"#;
    let notes = config(redis, "2s");
    assert_eq!(
        notes.len(),
        1,
        "only the route, not the fallback's 30s: {notes:?}"
    );
    assert!(
        notes[0].contains("route orders")
            && notes[0].contains("lease 2s")
            && notes[0].contains("`store.redis.timeout` (1s)")
            && notes[0].contains("at least 3s"),
        "{notes:?}"
    );
    let postgres = r#"postgres: { url: "postgres://u@127.0.0.1/db" }"#;
    let notes = config(postgres, "5s");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("`store.postgres.timeout` (2s)") && notes[0].contains("at least 6s"),
        "{notes:?}"
    );
    let quick = r#"redis: { url: "redis://127.0.0.1:6379", timeout: 500ms }"#;
    assert_eq!(config(quick, "2s"), Vec::<String>::new());
    assert_eq!(config(redis, "3s"), Vec::<String>::new());
    assert_eq!(config("memory: {}", "100ms"), Vec::<String>::new());
}

/// `scope: []` names nothing, so every key on it is the caller's, the very key the default
/// scope makes: the note says that (not that callers share keys), and what to write.
#[test]
fn check_notes_that_an_empty_scope_is_the_caller_as_by_default() {
    let route = |scope: &str| {
        top(&format!(
            "routes:\n  - name: r\n    match: {{ path: /r }}\n    key: {{ header: K{scope} }}\n"
        ))
    };
    let empty = Config::parse(&route(", scope: []"), "p.yaml").unwrap();
    let notes = empty.notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("route r")
            && notes[0].contains("`scope: []`")
            && notes[0].contains("the default")
            && !notes[0].contains("shares"),
        "{notes:?}"
    );
    let request = idemgate::explain::Request {
        method: http::Method::POST,
        uri: "/r".parse().unwrap(),
        headers: [(
            http::HeaderName::from_static("k"),
            http::HeaderValue::from_static("k1"),
        )]
        .into_iter()
        .collect(),
        body: b"{}".to_vec(),
        client_ip: Some([192, 0, 2, 7].into()),
        client_cert: None,
    };
    let key = |config: &Config| idemgate::explain::explain_key(config, &request).unwrap().1;
    let default = Config::parse(&route(""), "p.yaml").unwrap();
    assert!(key(&empty).is_some());
    assert_eq!(key(&empty), key(&default), "the default scope's key");
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

/// A misspelled method (`DELTE`) loads as a custom one, and the real method then matches
/// no route (a DELETE passing through unprotected): `check` notes a method outside the
/// IANA registry, naming the route and the nearest registered method, on an unprotected
/// route too; registered methods (WebDAV's among them) draw no note.
#[test]
fn check_notes_a_method_outside_the_registry_and_the_nearest_one() {
    let notes = |methods: &str, rest: &str| {
        let text = top(&format!(
            "routes:\n  - name: users\n    match: {{ methods: [{methods}], path: /users }}\n{rest}"
        ));
        Config::parse(&text, "p.yaml").unwrap().notes()
    };
    let found = notes("PUT, DELTE", "    key: { header: K }\n");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("route users")
            && found[0].contains("DELTE")
            && found[0].contains("did you mean DELETE?"),
        "{found:?}"
    );
    let found = notes("PSOT", "    idempotency: off\n");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("did you mean POST?"), "{found:?}");
    let found = notes("PURGE", "    key: { header: K }\n");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("PURGE") && !found[0].contains("did you mean"),
        "{found:?}"
    );
    let registered = notes(
        "POST, PUT, PATCH, DELETE, PROPPATCH, MKCOL, LOCK",
        "    key: { header: K }\n",
    );
    assert!(registered.is_empty(), "{registered:?}");
}

/// An admin listener off loopback without a token lets anyone who reaches it delete keys
/// (whose requests then run again) and read every key's state: `check` says so, as `run`
/// does; on loopback, or behind a token, no note.
#[test]
fn check_notes_an_admin_listener_open_to_the_network_without_a_token() {
    let notes = |admin: &str| {
        Config::parse(&top(&format!("admin: {admin}\n")), "p.yaml")
            .unwrap()
            .notes()
    };
    for open in ["0.0.0.0:9901", "\"[::]:9901\"", "10.1.2.3:9901"] {
        let found = notes(open);
        assert_eq!(found.len(), 1, "{open}: {found:?}");
        assert!(
            found[0].contains("admin") && found[0].contains("token"),
            "{found:?}"
        );
    }
    for closed in [
        "127.0.0.1:9901",
        "\"[::1]:9901\"",
        "{ listen: 0.0.0.0:9901, token: s3cret }",
    ] {
        assert!(notes(closed).is_empty(), "{closed}");
    }
}

/// On an observed route a request the key rule refuses (here a required key missing) is
/// forwarded unchanged, counted as `would_reject`: `explain` says so, rather than that the
/// proxy would answer 400, which only enforcement does.
#[test]
fn explain_of_a_refused_request_on_an_observed_route_says_it_is_forwarded() {
    let text = |mode: &str| {
        top(&format!(
            "routes:\n  - name: pay\n    match: {{ path: /pay }}\n    key: {{ header: Idempotency-Key, required: true }}\n    idempotency: {mode}\n"
        ))
    };
    let request = idemgate::explain::Request {
        method: http::Method::POST,
        uri: "/pay".parse().unwrap(),
        headers: [(http::header::HOST, "pay.example".parse().unwrap())]
            .into_iter()
            .collect(),
        body: b"{}".to_vec(),
        client_ip: Some([192, 0, 2, 1].into()),
        client_cert: None,
    };
    let enforced = Config::parse(&text("on"), "p.yaml").unwrap();
    let refused = idemgate::explain::explain(&enforced, &request).unwrap_err();
    assert_eq!(refused.status().as_u16(), 400);
    let observed = Config::parse(&text("observe"), "p.yaml").unwrap();
    let shown = idemgate::explain::explain(&observed, &request)
        .expect("observe forwards what enforcement refuses");
    assert!(shown.contains("route:             pay"), "{shown}");
    assert!(
        shown.contains("forwarded") && shown.contains("400"),
        "{shown}"
    );
}
