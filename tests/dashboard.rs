//! The Grafana dashboard (deploy/grafana/idemgate.json) queries only what `/metrics` has:
//! every metric name its queries use is exported, and every request outcome they select
//! exists, so the dashboard and the proxy cannot drift apart.

mod common;

use std::collections::BTreeSet;

use common::{post, start_proxy_with_admin, start_upstream};

fn dashboard() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/idemgate.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("the dashboard"))
        .expect("the dashboard is JSON")
}

/// Every PromQL expression of the dashboard's panels.
fn expressions(dashboard: &serde_json::Value) -> Vec<String> {
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|panel| panel["targets"].as_array().cloned().unwrap_or_default())
        .map(|target| target["expr"].as_str().expect("an expr").to_owned())
        .collect()
}

/// The `idemgate_…` names an expression uses.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("idemgate_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

/// The outcome values an expression selects (`outcome="a"` or `outcome=~"a|b|c_.*"`).
fn outcome_patterns(expr: &str) -> Vec<String> {
    let mut patterns = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("outcome") {
        rest = &rest[at + "outcome".len()..];
        let value = rest.trim_start_matches(['=', '~']);
        if let Some(quoted) = value.strip_prefix('"') {
            let end = quoted.find('"').expect("a closing quote");
            patterns.extend(quoted[..end].split('|').map(str::to_owned));
        }
    }
    patterns
}

/// Whether `/metrics` text exports `name`: a sample of it, or its family's `# TYPE` line
/// (a counter family is written without `_total`, a histogram's series add suffixes).
fn exported(text: &str, name: &str) -> bool {
    let family = ["_total", "_bucket", "_count", "_sum"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name);
    text.lines().any(|line| {
        line.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(['{', ' ']))
            || line
                .strip_prefix("# TYPE ")
                .is_some_and(|rest| rest.split(' ').next() == Some(family))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_and_outcome_the_dashboard_queries_is_exported() {
    let upstream = start_upstream().await;
    let routes = "routes:\n  - name: orders\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key }\n  - name: watched\n    match: { methods: [POST], path: /orders/watched }\n    key: { header: Idempotency-Key }\n    idempotency: observe\n";
    let proxy = start_proxy_with_admin(upstream.addr, routes, None).await;
    // One request per route makes its labelled series exist.
    post(proxy.addr, "/orders", &[("idempotency-key", "a")], "{}").await;
    post(
        proxy.addr,
        "/orders/watched",
        &[("idempotency-key", "b")],
        "{}",
    )
    .await;
    let text = common::metrics_text(proxy.admin).await;

    let exprs = expressions(&dashboard());
    assert!(exprs.len() >= 10, "{exprs:?}");
    let names: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    for name in &names {
        assert!(
            exported(&text, name),
            "the dashboard queries {name}, which /metrics lacks:\n{text}"
        );
    }
    let outcomes: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.split("outcome=\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect();
    for pattern in exprs.iter().flat_map(|e| outcome_patterns(e)) {
        let matches = match pattern.strip_suffix(".*") {
            Some(prefix) => outcomes.iter().any(|o| o.starts_with(prefix)),
            None => outcomes.contains(&pattern),
        };
        assert!(
            matches,
            "the dashboard selects outcome {pattern:?}; /metrics has {outcomes:?}"
        );
    }
}

/// The checks above can fail: a name or an outcome /metrics lacks is caught.
#[test]
fn a_query_of_a_missing_metric_or_outcome_is_caught() {
    let text = "# TYPE idemgate_requests counter\nidemgate_requests_total{route=\"r\",outcome=\"replayed\"} 1\n";
    assert!(exported(text, "idemgate_requests_total"));
    assert!(!exported(text, "idemgate_requests_dropped_total"));
    assert_eq!(
        outcome_patterns(r#"rate(idemgate_requests_total{outcome=~"replayed|would_.*"}[5m])"#),
        ["replayed", "would_.*"]
    );
}
