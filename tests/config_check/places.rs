//! Errors found after parsing (a value out of range, a route that cannot be reached) are
//! placed at the key they name, found by its path in the YAML document: never at the
//! first text that looks like it, wherever it is in the file.

use crate::{invalid, top};

/// A route named `order` written after one named `order-v2`: its error points at its own
/// key, not at the first line that starts with `name: order`.
#[test]
fn an_error_on_a_route_points_at_that_route_not_one_whose_name_starts_alike() {
    let text = top(
        "routes:\n  - name: order-v2\n    match: { path: /v2/orders }\n    key: { header: K }\n  - name: order\n    match: { path: /orders }\n    key: { header: K }\n    ttl: 0s\n",
    );
    let (line, column, key, message) = invalid(&text);
    assert_eq!((line, column, key.as_str()), (10, 5, "routes[1].ttl"));
    assert!(message.contains("above zero"), "{message}");
    // A route name used twice is placed at the second one.
    let dup = top(
        "routes:\n  - name: a\n    match: { path: /a }\n  - name: a\n    match: { path: /b }\n",
    );
    let (line, column, key, _) = invalid(&dup);
    assert_eq!((line, column, key.as_str()), (6, 5, "routes[1].name"));
}

/// A `defaults:` setting out of range is placed at its own key, not at `defaults:`.
#[test]
fn a_defaults_error_points_at_the_key_itself() {
    let (line, column, key, _) = invalid(&top(
        "defaults:\n  upstream_timeout: 2m\n  background_timeout: 1m\n",
    ));
    assert_eq!(
        (line, column, key.as_str()),
        (5, 3, "defaults.background_timeout")
    );
    let (line, column, key, _) = invalid(&top("defaults:\n  lease: 30s\n  ttl: 0s\n"));
    assert_eq!((line, column, key.as_str()), (5, 3, "defaults.ttl"));
}

/// A route whose name (or key) is quoted is found all the same.
#[test]
fn a_quoted_route_name_or_key_is_found() {
    for name in ["\"order\"", "'order'"] {
        let text = top(&format!(
            "routes:\n  - name: {name}\n    match: {{ path: /orders }}\n    key: {{ header: K }}\n    ttl: 0s\n"
        ));
        let (line, column, key, _) = invalid(&text);
        assert_eq!(
            (line, column, key.as_str()),
            (7, 5, "routes[0].ttl"),
            "{name}"
        );
    }
    let quoted_key = top(
        "routes:\n  - \"name\": order\n    match: { path: /orders }\n    key: { header: K }\n    \"ttl\": 0s\n",
    );
    let (line, column, key, _) = invalid(&quoted_key);
    assert_eq!((line, column, key.as_str()), (7, 5, "routes[0].ttl"));
}

/// In flow style (`{ a: 1, b: 2 }`, over one line or several) the error points at the
/// line, and column, of the key it names.
#[test]
fn a_flow_style_error_points_at_its_line() {
    let (line, column, key, _) = invalid(&top(
        "defaults: { upstream_timeout: 2m,\n            background_timeout: 1m }\n",
    ));
    assert_eq!(
        (line, column, key.as_str()),
        (4, 13, "defaults.background_timeout")
    );
    let routes = top(
        "routes:\n  - { name: order-v2, match: { path: /v2 }, key: { header: K } }\n  - { name: order, match: { path: /o }, key: { header: K }, ttl: 0s }\n",
    );
    let (line, column, key, _) = invalid(&routes);
    assert_eq!((line, column, key.as_str()), (5, 61, "routes[1].ttl"));
}

/// A key the error names but the file does not write (a default, an inherited value) is
/// placed at its nearest ancestor the file does write.
#[test]
fn an_error_about_an_unwritten_key_points_at_its_nearest_written_ancestor() {
    // `skew` is left at its 30s default, not under a 20s ttl: placed at `fresh`.
    let text = top(
        "routes:\n  - name: a\n    match: { path: /a }\n    key: { header: K }\n    ttl: 20s\n    fresh:\n      header: X-Ts\n",
    );
    let (line, column, key, _) = invalid(&text);
    assert_eq!((line, column, key.as_str()), (8, 5, "routes[0].fresh.skew"));
}

/// Keys of other sections are found by their path too: `timeout` under `store.redis`,
/// not the first `timeout` in the file (here `upstream_timeout`, above it).
#[test]
fn a_store_error_points_at_its_key_under_its_section() {
    let text = top(
        "defaults:\n  upstream_timeout: 1m\nstore:\n  redis:\n    url: redis://127.0.0.1:6379\n    # timeout: 1s\n    timeout: 0s\n",
    );
    let (line, column, key, _) = invalid(&text);
    assert_eq!((line, column, key.as_str()), (9, 5, "store.redis.timeout"));
}
