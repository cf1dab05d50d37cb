//! Mistakes refused where they are written (file, line, column and key): unknown keys, bad
//! durations and JSON pointers, rule-level mistakes, timeouts that contradict each other or
//! are zero, identity settings, a client-cert scope without mutual TLS.

use std::process::Command;

use idemgate::config::Config;

use crate::{invalid, route_with_key, top};

/// "`background_timeout` set must be at least `upstream_timeout`": a file that sets it
/// below, in `defaults:` or on a route, is refused, the error naming where and both keys;
/// equal is accepted.
#[test]
fn a_background_timeout_set_below_the_upstream_timeout_is_refused() {
    let (line, _, key, message) = invalid(&top(
        "defaults:\n  upstream_timeout: 2m\n  background_timeout: 1m\n",
    ));
    // Where: the key itself (line 5), not its section.
    assert_eq!((line, key.as_str()), (5, "defaults.background_timeout"));
    assert!(
        message.contains("background_timeout (1m) must be at least upstream_timeout (2m)"),
        "{message}"
    );
    let on_a_route = top(
        "routes:\n  - name: slow\n    match: { path: /slow }\n    key: { header: K }\n    upstream_timeout: 15m\n    background_timeout: 12m\n",
    );
    let (line, _, key, message) = invalid(&on_a_route);
    assert_eq!((line, key.as_str()), (8, "routes[0].background_timeout"));
    assert!(
        message.contains("background_timeout (12m) must be at least upstream_timeout (15m)"),
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

/// A file that never sets `background_timeout` is not refused for its 10m default: an
/// `upstream_timeout` above it, in `defaults:` (as SPEC.md allows) or on a route, takes
/// it along, so the owner still waits at least as long as its client did.
#[test]
fn an_inherited_background_timeout_grows_to_a_longer_upstream_timeout() {
    let policy = |text: &str, route: usize| {
        let config = Config::parse(&top(text), "p.yaml").expect("accepted");
        let idemgate::config::Protection::On(rule) = &config.routes[route].protection else {
            panic!("protected")
        };
        (rule.policy.upstream_timeout, rule.policy.background_timeout)
    };
    let minutes = |m: u64| std::time::Duration::from_secs(60 * m);
    let routes = "routes:\n  - name: slow\n    match: { path: /slow }\n    key: { header: K }\n    upstream_timeout: 15m\n  - name: plain\n    match: { path: /plain }\n    key: { header: K }\n";
    assert_eq!(policy(routes, 0), (minutes(15), minutes(15)));
    assert_eq!(
        policy(routes, 1),
        (minutes(1), minutes(10)),
        "the default stays"
    );
    let defaults = format!("defaults:\n  upstream_timeout: 15m\n{routes}");
    assert_eq!(policy(&defaults, 1), (minutes(15), minutes(15)));
    let set_longer = format!("defaults:\n  background_timeout: 20m\n{routes}");
    assert_eq!(policy(&set_longer, 0), (minutes(15), minutes(20)));
    // Set in `defaults:` but below a route's own upstream_timeout: the route inherits it,
    // so it grows there (the route's owner waits at least as long as its client).
    let set_shorter = format!("defaults:\n  background_timeout: 12m\n{routes}");
    assert_eq!(policy(&set_shorter, 0), (minutes(15), minutes(15)));
    assert_eq!(policy(&set_shorter, 1), (minutes(1), minutes(12)));
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
fn unknown_upstream_protocol_names_its_place() {
    let text = "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\nconnections:\n  upstream_protocol: h3\n";
    let (line, column, key, message) = invalid(text);
    assert_eq!((line, column), (4, 22));
    assert_eq!(key, "connections.upstream_protocol");
    assert!(message.contains("unknown variant `h3`"), "{message}");
    let ok = "listen: 127.0.0.1:8080\nupstream: https://app.internal\nconnections:\n  upstream_protocol: http2\n";
    let config = Config::parse(ok, "proxy.yaml").unwrap();
    assert_eq!(
        config.connections.upstream_protocol,
        idemgate::config::UpstreamProtocol::Http2
    );
}

/// An upstream URL that carries credentials (`http://app:password@host`) is refused, and
/// the refusal does not repeat them. idemgate never authenticates with them; accepted, they
/// went into the log at every start (`idemgate serving upstream=…`) and into `check`'s
/// output, and were sent as the `Host` and `X-Forwarded-Host` of any HTTP/1.0 request that
/// names no host, so an application that echoes its host (an absolute redirect) handed the
/// password to whoever sent one.
#[test]
fn an_upstream_url_with_credentials_is_refused_without_repeating_them() {
    for url in [
        "http://app:s3cret@127.0.0.1:3000",
        "https://s3cret@app.internal",
        "http://app:s3cret@[::1]:3000/",
    ] {
        let text = format!("listen: 127.0.0.1:8080\nupstream: {url}\n");
        let (line, _, key, message) = invalid(&text);
        assert_eq!((line, key.as_str()), (2, "upstream"), "{url}");
        assert!(message.contains("credentials"), "{url}: {message}");
        let err = Config::parse(&text, "proxy.yaml").unwrap_err().to_string();
        assert!(!err.contains("s3cret"), "{url}: {err}");
    }
}
#[test]
fn the_hand_written_http1_client_is_opt_in_and_http1_only() {
    let base = "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\n";
    let config = Config::parse(base, "proxy.yaml").unwrap();
    assert_eq!(
        config.connections.upstream_http1,
        idemgate::config::UpstreamHttp1::Hyper
    );
    let own = format!("{base}connections:\n  upstream_http1: idemgate\n");
    let config = Config::parse(&own, "proxy.yaml").unwrap();
    assert_eq!(
        config.connections.upstream_http1,
        idemgate::config::UpstreamHttp1::Idemgate
    );
    let with_h2 =
        format!("{base}connections:\n  upstream_protocol: http2\n  upstream_http1: idemgate\n");
    let (line, _, key, message) = invalid(&with_h2);
    assert_eq!(line, 5);
    assert_eq!(key, "connections.upstream_http1");
    assert!(message.contains("upstream_protocol: http1"), "{message}");
    let unknown = format!("{base}connections:\n  upstream_http1: mine\n");
    let (_, _, key, message) = invalid(&unknown);
    assert_eq!(key, "connections.upstream_http1");
    assert!(message.contains("unknown variant `mine`"), "{message}");
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
    assert_eq!((line, key.as_str()), (6, "routes[1].name"));
    assert!(message.contains("used twice"), "{message}");
    let (_, _, key, _) = invalid("listen: 127.0.0.1:8080\nupstream: ftp://x\n");
    assert_eq!(key, "upstream");
    let (_, _, key, _) =
        invalid("listen: 127.0.0.1:8080\nupstream: http://x\ndefaults: { max_body: 1TB }\n");
    assert_eq!(key, "defaults.max_body");
}

/// The proxy answers every `CONNECT` with 501 (a reverse proxy, not a tunnel), so a route
/// for it would never match: the method is refused where it is written, as a safe one is.
#[test]
fn a_connect_route_is_refused_where_it_is_written() {
    let text =
        top("routes:\n  - name: tunnel\n    match: { methods: [POST, CONNECT], path: /t }\n");
    let (line, column, key, message) = invalid(&text);
    assert_eq!(
        (line, column, key.as_str()),
        (5, 23, "routes[0].match.methods[1]")
    );
    assert!(
        message.contains("CONNECT") && message.contains("501"),
        "{message}"
    );
    let err = Config::parse(&text, "proxy.yaml").unwrap_err().to_string();
    assert!(
        err.starts_with("proxy.yaml:5:23: routes[0].match.methods[1]"),
        "{err}"
    );
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

/// A tunnel's idle timeout follows `upstream_read_timeout` unless written (nginx's one
/// `proxy_read_timeout` for both), and a zero one, which would close every tunnel at once,
/// is refused where it is written rather than read as "no timeout".
#[test]
fn a_zero_tunnel_idle_timeout_is_refused_where_it_is_written() {
    let config = Config::parse(
        &top("connections: { upstream_read_timeout: 20s }\n"),
        "p.yaml",
    )
    .unwrap();
    assert_eq!(
        config.connections.tunnel_idle_timeout,
        std::time::Duration::from_secs(20)
    );
    let config = Config::parse(
        &top("connections: { upstream_read_timeout: 20s, tunnel_idle_timeout: 5m }\n"),
        "p.yaml",
    )
    .unwrap();
    assert_eq!(
        config.connections.tunnel_idle_timeout,
        std::time::Duration::from_secs(300)
    );
    let (line, column, key, message) = invalid(&top(
        "connections:\n  max_client: 8\n  tunnel_idle_timeout: 0s\n",
    ));
    assert_eq!((line, column), (5, 3));
    assert_eq!(key, "connections.tunnel_idle_timeout");
    assert_eq!(message, "must be above zero");
}

/// A zero buffer budget would refuse every protected body: refused, naming the key and
/// its place, rather than read as "no bound".
#[test]
fn a_zero_buffer_budget_is_refused_where_it_is_written() {
    let config = Config::parse(&top("connections: { max_buffered: 64MiB }\n"), "p.yaml").unwrap();
    assert_eq!(config.connections.max_buffered, 64 << 20);
    let (line, column, key, message) =
        invalid(&top("connections:\n  max_client: 8\n  max_buffered: 0B\n"));
    assert_eq!((line, column), (5, 3));
    assert_eq!(key, "connections.max_buffered");
    assert_eq!(message, "must be above zero");
}

/// One connection's share of the buffer budget is an eighth of it unless written, and one
/// written larger than the budget is refused where it is written: it would read as a
/// share while being none.
#[test]
fn a_connection_share_over_the_buffer_budget_is_refused_where_it_is_written() {
    let config = Config::parse(&top("connections: { max_buffered: 64MiB }\n"), "p.yaml").unwrap();
    assert_eq!(config.connections.max_buffered_per_connection, 8 << 20);
    let written = "connections: { max_buffered: 64MiB, max_buffered_per_connection: 64MiB }\n";
    let config = Config::parse(&top(written), "p.yaml").unwrap();
    assert_eq!(config.connections.max_buffered_per_connection, 64 << 20);
    let (line, column, key, message) = invalid(&top(
        "connections:\n  max_buffered: 64MiB\n  max_buffered_per_connection: 65MiB\n",
    ));
    assert_eq!((line, column), (5, 3));
    assert_eq!(key, "connections.max_buffered_per_connection");
    assert!(message.contains("must not exceed"), "{message}");
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

/// `ttl: 0` stores every answer for no time at all: each repeat of a key runs again, as if
/// the route were unprotected (and many tools read a zero TTL as "never expires", the
/// opposite). Refused where it is written, as a zero `fingerprint_ttl` is.
#[test]
fn a_zero_ttl_is_refused_where_it_is_written() {
    let (line, _, key, message) = invalid(&top("defaults:\n  ttl: 0\n"));
    assert_eq!((line, key.as_str()), (4, "defaults.ttl"));
    assert!(message.contains("above zero"), "{message}");
    let (line, _, key, message) = invalid(&top(
        "routes:\n  - name: pay\n    match: { path: /pay }\n    key: { header: Idempotency-Key }\n    ttl: 0s\n",
    ));
    assert_eq!((line, key.as_str()), (7, "routes[0].ttl"));
    assert!(message.contains("above zero"), "{message}");
}

/// A zero rate window forgets every issue at once: the rate limit would never refuse.
#[test]
fn a_zero_token_rate_window_is_refused() {
    let (line, _, key, message) = invalid(&top("tokens: { window: 0 }\n"));
    assert_eq!((line, key.as_str()), (3, "tokens"));
    assert!(message.contains("window"), "{message}");
}

/// The token endpoint answers before any route, at the exact normalised path: a `path` in
/// a form no request path has never answers (its POSTs go upstream), and one that a
/// route names literally takes that route's every POST away from the upstream.
#[test]
fn a_token_path_that_is_never_reached_or_hides_a_route_is_refused() {
    for path in [
        "/a/../token",
        "/tokens//new",
        "/.idemgate/%74oken",
        "/t/{id}",
        "/t/*",
    ] {
        let (line, _, key, message) = invalid(&top(&format!("tokens: {{ path: \"{path}\" }}\n")));
        assert_eq!(
            (line, key.as_str()),
            (3, "tokens.path"),
            "{path}: {message}"
        );
    }
    let hidden = "tokens: { path: /orders }\nroutes:\n  - name: orders\n    match: { path: /Orders/ }\n    key: { header: Idempotency-Key }\n";
    let (_, _, key, message) = invalid(&top(hidden));
    assert_eq!(key, "tokens.path", "{message}");
    assert!(message.contains("orders"), "{message}");
    // A route of other methods, or one that covers the path by a wildcard, keeps its own.
    Config::parse(
        &top("tokens: { path: /orders }\nroutes:\n  - name: orders\n    match: { methods: [PUT], path: /orders }\n  - name: rest\n    match: { path: \"/*\" }\n    idempotency: off\n"),
        "p.yaml",
    )
    .expect("no route named the token path");
}

/// `run` binds the admin listener after the proxy's: on the same address it fails there,
/// so `check` (and a reload's validation) refuse it first; port 0 is no address yet.
#[test]
fn an_admin_listener_on_the_proxy_address_is_refused() {
    for admin in [
        "127.0.0.1:8080",
        "0.0.0.0:8080",
        "\"[::]:8080\"",
        "{ listen: 127.0.0.1:8080, token: t }",
    ] {
        let (line, _, key, message) = invalid(&top(&format!("admin: {admin}\n")));
        assert_eq!((line, key.as_str()), (3, "admin"), "{admin}: {message}");
        assert!(message.contains("listen"), "{message}");
    }
    for admin in ["127.0.0.1:9901", "127.0.0.2:8080"] {
        Config::parse(&top(&format!("admin: {admin}\n")), "p.yaml")
            .unwrap_or_else(|e| panic!("{admin}: {e}"));
    }
    // Port 0 on both: the OS gives each listener a port of its own.
    Config::parse(
        "listen: 127.0.0.1:0\nupstream: http://127.0.0.1:3000\nadmin: 127.0.0.1:0\n",
        "p.yaml",
    )
    .expect("port 0 twice is two ports");
}

/// An admin token is compared with what follows `Bearer ` in the `Authorization` field: one
/// that no field value can carry (a control character, non-ASCII, or blanks at its ends,
/// which HTTP strips) would lock everyone out of the admin API.
#[test]
fn an_admin_token_no_request_can_send_is_refused() {
    for token in ["\"tøken\"", "\" padded \"", "\"tab\\there\""] {
        let (_, _, key, message) = invalid(&top(&format!(
            "admin: {{ listen: 127.0.0.1:9901, token: {token} }}\n"
        )));
        assert_eq!(key, "admin.token", "{token}: {message}");
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "line one\nline two\n").unwrap();
    let path = dir.path().join("proxy.yaml");
    std::fs::write(
        &path,
        top("admin: { listen: 127.0.0.1:9901, token_file: token }\n"),
    )
    .unwrap();
    let err = Config::load(&path).unwrap_err().to_string();
    assert!(err.contains("admin.token_file"), "{err}");
    Config::parse(
        &top("admin: { listen: 127.0.0.1:9901, token: \"a-Z_0.9~+/=\" }\n"),
        "p.yaml",
    )
    .expect("a token of visible ASCII");
}

/// What `run` would refuse when it opens the Redis store is refused by `check` and a reload
/// too: a `ca` beside a `redis://` URL (TLS needs `rediss://`), cluster seeds that mix the
/// two, and a `ca` file that holds no certificate.
#[test]
fn a_redis_store_that_run_cannot_open_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("garbage.pem"), "garbage\n").unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["redis.internal".to_owned()]).unwrap();
    std::fs::write(dir.path().join("ca.pem"), cert.cert.pem()).unwrap();
    let path = dir.path().join("proxy.yaml");
    let load = |store: &str| {
        std::fs::write(&path, top(&format!("store:\n  redis: {store}\n"))).unwrap();
        Config::load(&path)
    };
    for (store, key) in [
        (
            "{ url: \"redis://127.0.0.1:6379\", ca: ca.pem }",
            "store.redis.ca",
        ),
        (
            "{ url: \"rediss://127.0.0.1:6379\", ca: garbage.pem }",
            "store.redis.ca",
        ),
        (
            "{ cluster: [\"redis://10.0.0.1:6379\", \"rediss://10.0.0.2:6379\"] }",
            "store.redis.cluster",
        ),
    ] {
        match load(store) {
            Err(idemgate::config::ConfigError::Invalid {
                key: k, message, ..
            }) => {
                assert_eq!(k, key, "{store}: {message}")
            }
            other => panic!("{store}: expected an error, got {other:?}"),
        }
    }
    load("{ url: \"rediss://127.0.0.1:6379\", ca: ca.pem }").expect("TLS with its roots");
    load("{ cluster: [\"rediss://10.0.0.1:6379\", \"rediss://10.0.0.2:6379\"], ca: ca.pem }")
        .expect("a TLS cluster");
}
