//! What a reload changes in how keys are made. A key holds its route's name, the caller's
//! scope and the rule's material ([`crate::key`]); a reload that changes one of them, or
//! which route a request falls to, gives the requests it covers new keys. Retries of
//! earlier requests and duplicates of requests still running would run again, so such a
//! reload keeps the config before it, whose keys requests claim too
//! (`crate::proxy::previous`). `run` warns of it on SIGHUP, naming each route and why;
//! `check` cannot, not knowing the previous config.

use super::{Config, Protection, Route};
use crate::key::{KeyRule, KeySource};

impl Config {
    /// What reloading from `self` to `new` changes in how keys are made, one entry a route
    /// or shared setting, saying why (`route "orders": key changed`); empty when every
    /// request keeps its key. Compares the compiled values, so a changed `defaults.key`
    /// shows on each route that inherits it and on the requests no route matches.
    pub fn rekeyed_by(&self, new: &Config) -> Vec<String> {
        let mut changes = compare_routes(&self.routes, &new.routes);
        let fallback = compare_protection(&self.fallback, &new.fallback);
        if !fallback.is_empty() {
            changes.push(format!(
                "requests no route matches (defaults.key): {}",
                fallback.join(", ")
            ));
        }
        let (was, now) = (&self.identity, &new.identity);
        // A reload that adds or drops `tls` keeps the listener as it was (`Proxy::reload`),
        // and with it the client certificates it verifies.
        let same_listener = self.tls.is_some() == new.tls.is_some();
        let shared = [
            (
                "trusted_proxies",
                was.trusted_proxies != now.trusted_proxies,
            ),
            (
                "session_cookies",
                was.session_cookies != now.session_cookies,
            ),
            (
                "credential_headers",
                was.credential_headers != now.credential_headers,
            ),
            (
                "tls.client_ca",
                same_listener && self.client_ca != new.client_ca,
            ),
        ];
        for (setting, changed) in shared {
            if changed {
                changes.push(format!("{setting} changed"));
            }
        }
        changes
    }
}

/// Routes by name. One that disappears while a new name appears with the same `match` is
/// most likely a rename; any other that appears or disappears moves requests between it
/// and another route or the fallback; and as the first match wins, so does a new order.
fn compare_routes(old: &[Route], new: &[Route]) -> Vec<String> {
    let named = |routes: &[Route], name: &str| routes.iter().position(|r| r.name == name);
    let mut added: Vec<&Route> = new
        .iter()
        .filter(|r| named(old, &r.name).is_none())
        .collect();
    let mut changes = Vec::new();
    for was in old {
        let Some(at) = named(new, &was.name) else {
            match added.iter().position(|r| r.matcher == was.matcher) {
                Some(i) => {
                    let now = added.remove(i);
                    changes.push(format!("route {:?} renamed to {:?}", was.name, now.name));
                }
                None => changes.push(format!("route {:?} removed", was.name)),
            }
            continue;
        };
        let now = &new[at];
        let mut why = Vec::new();
        if was.matcher != now.matcher {
            why.push("match changed");
        }
        why.extend(compare_protection(&was.protection, &now.protection));
        if !why.is_empty() {
            changes.push(format!("route {:?}: {}", was.name, why.join(", ")));
        }
    }
    for now in added {
        changes.push(format!("route {:?} added", now.name));
    }
    let kept = |these: &[Route], others: &[Route]| -> Vec<String> {
        these
            .iter()
            .filter(|r| named(others, &r.name).is_some())
            .map(|r| r.name.clone())
            .collect()
    };
    if kept(old, new) != kept(new, old) {
        changes.push("route order changed (the first route that matches takes a request)".into());
    }
    changes
}

/// Why one protected route's keys change: its key rule's source or its scope. Turning
/// protection on or off makes no key of its own (that is what `idempotency` says).
fn compare_protection(old: &Protection, new: &Protection) -> Vec<&'static str> {
    let (Protection::On(was), Protection::On(now)) = (old, new) else {
        return Vec::new();
    };
    let mut why = Vec::new();
    if key_changed(&was.key, &now.key) {
        why.push("key changed");
    }
    if was.key.scope != now.key.scope {
        why.push("scope changed");
    }
    why
}

/// Whether the material a key is made of changed. Not `required`, which decides whether a
/// request without it is keyed at all, nor the `payload` check beside a client key, whose
/// change makes a retry a 422 rather than a re-run; and a one-time token's key is the token
/// and the scope alone, whatever header it comes in.
fn key_changed(old: &KeyRule, new: &KeyRule) -> bool {
    match (&old.source, &new.source) {
        (KeySource::Token(_), KeySource::Token(_)) => false,
        (was, now) => was != now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rest: &str) -> Config {
        let text = format!("listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\n{rest}");
        Config::parse(&text, "proxy.yaml").unwrap()
    }

    const ORDERS: &str = "  - name: orders\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key }\n";
    const REFUNDS: &str = "  - name: refunds\n    match: { methods: [POST], path: /refunds }\n    key: { fields: [/refund_id] }\n";

    fn routes(routes: &[&str]) -> Config {
        config(&format!("routes:\n{}", routes.concat()))
    }

    #[test]
    fn a_reload_that_changes_no_key_says_nothing() {
        let base = routes(&[ORDERS, REFUNDS]);
        assert!(base.rekeyed_by(&routes(&[ORDERS, REFUNDS])).is_empty());
        // Policies, timeouts and what a key covers beside it are not how keys are made.
        let policies =
            ORDERS.to_owned() + "    ttl: 1h\n    in_flight: reject\n    max_body: 1KiB\n";
        assert!(base.rekeyed_by(&routes(&[&policies, REFUNDS])).is_empty());
        for beside in [
            "required: true",
            "fingerprint: { body: true, ignore: [/at] }",
        ] {
            let rule = ORDERS.replace(
                "Idempotency-Key }",
                &format!("Idempotency-Key, {beside} }}"),
            );
            assert!(
                base.rekeyed_by(&routes(&[&rule, REFUNDS])).is_empty(),
                "{beside}"
            );
        }
        // A one-time token's key is the token and its scope, not its header.
        let token = |header: &str| {
            routes(&[&ORDERS.replace(
                "key: { header: Idempotency-Key }",
                &format!("key: {{ token: {{ header: {header} }} }}"),
            )])
        };
        assert!(token("X-Token").rekeyed_by(&token("X-Other")).is_empty());
        let upstream = config(&format!("routes:\n{ORDERS}drain_timeout: 5s\n"));
        assert!(routes(&[ORDERS]).rekeyed_by(&upstream).is_empty());
    }

    #[test]
    fn a_route_that_disappears_while_one_with_its_match_appears_is_a_rename() {
        let base = routes(&[ORDERS, REFUNDS]);
        let renamed = routes(&[&ORDERS.replace("orders\n", "purchases\n"), REFUNDS]);
        assert_eq!(
            base.rekeyed_by(&renamed),
            [r#"route "orders" renamed to "purchases""#]
        );
        let moved = ORDERS
            .replace("orders\n", "purchases\n")
            .replace("path: /orders", "path: /purchases");
        assert_eq!(
            base.rekeyed_by(&routes(&[&moved, REFUNDS])),
            [r#"route "orders" removed"#, r#"route "purchases" added"#]
        );
        assert_eq!(
            base.rekeyed_by(&routes(&[REFUNDS])),
            [r#"route "orders" removed"#]
        );
        assert_eq!(
            routes(&[REFUNDS]).rekeyed_by(&base),
            [r#"route "orders" added"#]
        );
    }

    #[test]
    fn a_route_whose_key_scope_or_match_changed_is_named_with_each_reason() {
        let base = routes(&[ORDERS, REFUNDS]);
        let cases = [
            (
                ORDERS.replace("header: Idempotency-Key", "header: X-Request-Id"),
                "key changed",
            ),
            (
                ORDERS.replace("{ header: Idempotency-Key }", "{ fingerprint: {} }"),
                "key changed",
            ),
            (
                ORDERS.replace("Idempotency-Key }", "Idempotency-Key, scope: [client_ip] }"),
                "scope changed",
            ),
            (
                ORDERS.replace("methods: [POST]", "methods: [POST, PATCH]"),
                "match changed",
            ),
            (
                ORDERS
                    .replace("/orders }", "/orders, host: shop.example }")
                    .replace(
                        "Idempotency-Key }",
                        "Idempotency-Key, scope: [caller, client_ip] }",
                    ),
                "match changed, scope changed",
            ),
        ];
        for (route, why) in cases {
            assert_eq!(
                base.rekeyed_by(&routes(&[&route, REFUNDS])),
                [format!("route \"orders\": {why}")],
                "{route}"
            );
        }
        assert_eq!(
            base.rekeyed_by(&routes(&[REFUNDS, ORDERS])),
            ["route order changed (the first route that matches takes a request)"]
        );
    }

    /// `defaults.key` reaches every route without a key of its own and the requests no
    /// route matches; the identity settings reach every caller-scoped key.
    #[test]
    fn defaults_key_and_the_identity_settings_are_named() {
        let inherits = "  - name: votes\n    match: { path: /votes }\n";
        let base = routes(&[ORDERS, inherits]);
        let new = config(&format!(
            "defaults:\n  key: {{ fingerprint: {{ query: false }} }}\nroutes:\n{ORDERS}{inherits}"
        ));
        assert_eq!(
            base.rekeyed_by(&new),
            [
                r#"route "votes": key changed"#,
                "requests no route matches (defaults.key): key changed"
            ]
        );
        for (setting, text) in [
            ("trusted_proxies", "trusted_proxies: [10.0.0.0/8]\n"),
            ("session_cookies", "session_cookies: [sid]\n"),
            ("credential_headers", "credential_headers: [X-Api-Key]\n"),
        ] {
            assert_eq!(
                config("").rekeyed_by(&config(text)),
                [format!("{setting} changed")]
            );
        }
    }

    /// A client CA is told by its contents: another file changes the callers' keys, a
    /// renewed server certificate does not; and one a reload adds or drops with `tls`
    /// itself is not in use until a restart.
    #[test]
    fn a_changed_client_ca_is_named_and_a_renewed_certificate_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str| {
            let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
            let (cert, key) = (
                dir.path().join(format!("{name}.pem")),
                dir.path().join(format!("{name}.key")),
            );
            std::fs::write(&cert, certified.cert.pem()).unwrap();
            std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
            (cert, key)
        };
        let (server, renewed, ca, other_ca) = (
            write("server"),
            write("renewed"),
            write("ca"),
            write("other"),
        );
        let tls = |(cert, key): &(std::path::PathBuf, std::path::PathBuf),
                   ca: Option<&std::path::PathBuf>| {
            let ca = ca.map_or(String::new(), |p| format!(", client_ca: {p:?}"));
            config(&format!("tls: {{ cert: {cert:?}, key: {key:?}{ca} }}\n"))
        };
        let base = tls(&server, Some(&ca.0));
        assert!(base.rekeyed_by(&tls(&renewed, Some(&ca.0))).is_empty());
        assert_eq!(
            base.rekeyed_by(&tls(&server, Some(&other_ca.0))),
            ["tls.client_ca changed"]
        );
        assert_eq!(
            base.rekeyed_by(&tls(&server, None)),
            ["tls.client_ca changed"]
        );
        assert!(base.rekeyed_by(&config("")).is_empty());
    }
}
