//! A client key's payload check across a rekeying reload: the key the config before it
//! gave a request is looked at only where its record's payload tells requests apart as
//! finely as the new route's check, so a key reused with another payload is never answered
//! with the first payload's answer.

use http::StatusCode;

use crate::common::{post, reload, start_proxy_with_admin, start_upstream};

/// Client keys for every POST, their payload check skipping `amount`.
const AMOUNT_IGNORED: &str = r#"
defaults:
  key: { header: Idempotency-Key, fingerprint: { body: true, query: true, ignore: [amount] } }
"#;

/// A route for `/orders` with the default payload check, which compares `amount`.
const ORDERS: &str = r#"
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key }
"#;

/// Before the reload `k1` ran with `amount: 100`; the old check skipped `amount`, so its
/// record cannot tell that payload from `amount: 900`. After the reload, whose route
/// compares `amount`, `k1` with `amount: 900` is a reuse of the key with another payload:
/// a `422`, never the 100 answer, and never run. The record cannot say either which payload
/// a retry with `amount: 100` matches: it is refused alike, not run a second time. A key
/// first sent after the reload is checked by the new rule alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_whose_payload_check_compares_more_never_replays_another_payload() {
    let upstream = start_upstream().await;
    let proxy = start_proxy_with_admin(upstream.addr, AMOUNT_IGNORED, None).await;
    let key = [("idempotency-key", "k1")];
    let first = post(proxy.addr, "/orders", &key, r#"{"amount":100}"#).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let reloaded = reload(&proxy, upstream.addr, &format!("{AMOUNT_IGNORED}{ORDERS}"));
    assert!(reloaded.honoured_until.is_some(), "{reloaded:?}");
    for amount in [900, 100, 900] {
        let body = format!(r#"{{"amount":{amount}}}"#);
        let reused = post(proxy.addr, "/orders", &key, &body).await;
        assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY, "{amount}");
        assert!(!reused.replayed(), "{amount}");
    }
    assert_eq!(upstream.executed_for("k1"), 1, "k1 ran again");
    let found = "idemgate_rekeyed_total{route=\"orders\",found=\"mismatch\"}";
    assert_eq!(proxy.metric(found), 3.0);
    let k2 = [("idempotency-key", "k2")];
    let answered = post(proxy.addr, "/orders", &k2, r#"{"amount":100}"#).await;
    assert_eq!(answered.status, StatusCode::CREATED);
    assert!(post(proxy.addr, "/orders", &k2, r#"{"amount":100}"#)
        .await
        .replayed());
    let other = post(proxy.addr, "/orders", &k2, r#"{"amount":900}"#).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.executed_for("k2"), 1);
}
