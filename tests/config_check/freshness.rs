//! A freshness window against the route's key lifetime: a request is accepted only while
//! its key would still catch its repeat, so a `skew` the key's lifetime does not outlast
//! is refused, and a `max_age` it shortens is noted by `check`.

use idemgate::config::{Config, Protection};

use crate::{common, invalid, top};

fn route(key: &str, rest: &str) -> String {
    top(&format!(
        "routes:\n  - name: stamped\n    match: {{ path: /stamped }}\n    key: {key}\n{rest}"
    ))
}

/// A request stamped `skew` ahead may be sent again that long after its key expired, so
/// with `skew` at least the key's lifetime no timestamp is safe: refused at the route,
/// naming the setting the lifetime comes from. Equal is refused too.
#[test]
fn a_skew_the_key_lifetime_does_not_outlast_is_refused() {
    let fingerprint = "{ fingerprint: { body: true } }";
    let (line, _, key, message) = invalid(&route(
        fingerprint,
        "    fresh: { header: X-Ts, skew: 2m }\n",
    ));
    assert_eq!((line, key.as_str()), (7, "routes[0].fresh.skew"));
    assert!(
        message.contains("`skew` (2m)") && message.contains("(2m, `defaults.fingerprint_ttl`)"),
        "{message}"
    );
    let (_, _, key, message) = invalid(&route(
        "{ header: K }",
        "    ttl: 30s\n    fresh: { field: /ts }\n",
    ));
    assert_eq!(key, "routes[0].fresh.skew");
    assert!(message.contains("(30s, `ttl`)"), "{message}");
    Config::parse(
        &route("{ header: K }", "    ttl: 31s\n    fresh: { field: /ts }\n"),
        "p.yaml",
    )
    .expect("a second of window is left");
}

/// A fingerprint key kept 2m (`fingerprint_ttl`) with the default window (5m, 30s skew):
/// timestamps are accepted under 90s old, which `check` notes with what to write; a key
/// kept long enough leaves `max_age` as written, without a note.
#[test]
fn check_notes_a_max_age_the_key_lifetime_shortens() {
    let short = route(
        "{ fingerprint: { body: true } }",
        "    fresh: { field: /ts }\n",
    );
    let config = Config::parse(&short, "p.yaml").unwrap();
    let Protection::On(p) = &config.routes[0].protection else {
        panic!("protected")
    };
    let window = p.fresh.as_ref().unwrap();
    assert_eq!(window.key_bound, Some(std::time::Duration::from_secs(90)));
    assert!(window.too_old(90_000) && !window.too_old(89_999));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, &short).unwrap();
    let out = common::cli("check", &file, &[]);
    let note = out
        .lines()
        .find(|l| l.starts_with("note: route stamped: `fresh.max_age` 5m"))
        .unwrap_or_else(|| panic!("no note in\n{out}"));
    assert!(
        note.contains("kept (2m) less `skew` (30s)")
            && note.contains("under 90s old")
            && note.contains("longer than 330s"),
        "{note}"
    );

    let long = route("{ header: K }", "    fresh: { field: /ts }\n");
    let config = Config::parse(&long, "p.yaml").unwrap();
    assert!(config.notes().is_empty(), "{:?}", config.notes());
}
