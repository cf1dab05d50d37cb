//! Routes with `idempotency: off`: their 504 after their own or the default upstream
//! timeout, and policy keys on them refused by name.

use http::{Method, StatusCode};

use crate::common::{self, send, start_proxy};
use crate::{raw_answering, ROUTES};

/// `upstream_timeout` bounds an unprotected request's wait for the answer's head: the
/// `defaults` one, or the route's own. Here the route's 200 ms is what a client waits,
/// under a `defaults` of 60 s (the 10 s bound is a hang guard only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprotected_route_gets_its_504_after_its_own_upstream_timeout() {
    let upstream = raw_answering(None).await;
    let routes = "defaults: { upstream_timeout: 60s }\n\
        routes:\n  - name: slow\n    match: { path: /slow }\n    idempotency: off\n    upstream_timeout: 200ms\n";
    let proxy = start_proxy(upstream, routes).await;
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        send(proxy.addr, Method::POST, "/slow", &[], "{}"),
    )
    .await
    .expect("hang guard: the route's own upstream_timeout was not applied");
    assert_problem(&answer, StatusCode::GATEWAY_TIMEOUT, "upstream-timeout");
}

/// On an unprotected route with no timeout of its own, `defaults.upstream_timeout` holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprotected_route_gets_its_504_after_the_default_upstream_timeout() {
    let upstream = raw_answering(None).await;
    let routes = format!("defaults: {{ upstream_timeout: 200ms }}\n{ROUTES}");
    let proxy = start_proxy(upstream, &routes).await;
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        send(proxy.addr, Method::POST, "/upload", &[], "{}"),
    )
    .await
    .expect("hang guard: no 504");
    assert_problem(&answer, StatusCode::GATEWAY_TIMEOUT, "upstream-timeout");
}

fn assert_problem(answer: &common::Answer, status: StatusCode, kind: &str) {
    assert_eq!(answer.status, status, "{:?}", answer.body);
    assert_eq!(answer.headers["content-type"], "application/problem+json");
    assert_eq!(
        answer.json()["type"],
        format!("urn:idemgate:problem:{kind}")
    );
}

/// A policy key on an unprotected route would do nothing there: it is a config error
/// naming the key, never silently ignored. Only `upstream_timeout` applies.
#[test]
fn policy_keys_on_an_unprotected_route_are_refused_by_name() {
    let config = |extra: &str| {
        format!(
            "listen: 127.0.0.1:0\nupstream: http://127.0.0.1:1\nroutes:\n  - name: a\n    match: {{ path: /a }}\n    key: {{ header: K }}\n  - name: plain\n    match: {{ path: /p }}\n{extra}"
        )
    };
    let parse = |extra: &str| idemgate::config::Config::parse(&config(extra), "p.yaml");
    for (extra, field, off) in [
        (
            "    idempotency: off\n    ttl: 1h\n",
            "ttl",
            "idempotency: off",
        ),
        (
            "    idempotency: off\n    max_body: 1KiB\n",
            "max_body",
            "idempotency: off",
        ),
        (
            "    idempotency: off\n    key: { header: K }\n",
            "key",
            "idempotency: off",
        ),
        (
            "    key: off\n    max_answer: 1KiB\n",
            "max_answer",
            "key: off",
        ),
        (
            "    idempotency: off\n    fresh: { header: X-Ts }\n",
            "fresh",
            "idempotency: off",
        ),
    ] {
        let message = parse(extra).expect_err(extra).to_string();
        assert!(
            message.contains(&format!("routes[1].{field}: `{field}` has no effect on"))
                && message.contains(off),
            "{message}"
        );
    }
    parse("    idempotency: off\n    upstream_timeout: 2s\n").expect("upstream_timeout applies");
    let zero = parse("    idempotency: off\n    upstream_timeout: 0s\n").unwrap_err();
    assert!(zero.to_string().contains("above zero"), "{zero}");
}
