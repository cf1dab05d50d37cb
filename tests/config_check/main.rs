//! Config parsing and `idemgate check`: every SPEC example parses; errors name
//! file:line:column and the offending key.

//!
//! The helpers and the SPEC examples are here; `settings.rs` checks what parsed settings
//! mean (defaults, derived keys, secrets from files), `mistakes.rs` that each mistake is
//! refused where it is written, `places.rs` that errors found after parsing point at
//! the key they name, `commands.rs` the `check` and `explain` commands.

#[path = "../common/mod.rs"]
mod common;

mod commands;
mod freshness;
mod mistakes;
mod places;
mod settings;

use idemgate::config::{Config, ConfigError, Protection};
use idemgate::key::KeySource;

const SPEC_PROXY: &str = include_str!("../fixtures/spec_proxy.yaml");
const SPEC_KEY_RULE: &str = include_str!("../fixtures/spec_key_rule.yaml");

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

fn top(rest: &str) -> String {
    format!("listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\n{rest}")
}
