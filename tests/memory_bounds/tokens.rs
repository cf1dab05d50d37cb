//! One-time tokens, which anyone may ask for, hold only their own share of the memory
//! store: issuing them never evicts an answer nor fills the store for orders, and one
//! client address asking as made-up callers cannot exhaust them for others.

use super::{alone, common};

/// A memory store of 4 records, with one-time tokens and a fingerprinted order route.
fn token_flood_config(when_full: &str) -> String {
    format!(
        r#"
store:
  memory: {{ max_entries: 4, when_full: {when_full} }}
tokens: {{ ttl: 5m }}
routes:
  - name: orders
    match: {{ methods: [POST], path: /orders }}
    key: {{ fingerprint: {{ body: true }} }}
"#
    )
}

/// Asks for a token as each of `callers` made-up callers (each a caller of its own, under
/// any per-caller rate): the statuses.
async fn token_flood(proxy: &common::ProxyHandle, callers: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for i in 0..callers {
        let who = format!("Bearer anyone-{i}");
        let headers = [("authorization", who.as_str())];
        let answer = common::post(proxy.addr, "/.idemgate/token", &headers, "").await;
        statuses.push(answer.status.as_u16());
    }
    statuses
}

/// Tokens anyone may ask for never cost a stored answer: issuing one never evicts a
/// record, unspent tokens hold at most their share of the store (`token_share`), and
/// issuances beyond it are refused (`503`, counted) while alice's order still replays.
#[test]
fn issuing_tokens_never_evicts_an_answer() {
    alone(async {
        let upstream = common::start_upstream().await;
        let proxy = common::start_proxy(upstream.addr, &token_flood_config("evict")).await;
        let alice = [("authorization", "Bearer alice"), ("idempotency-key", "r")];
        let first = common::post(proxy.addr, "/orders", &alice, r#"{"sku":"A1"}"#).await;
        assert_eq!(first.status, 201);
        let statuses = token_flood(&proxy, 8).await;
        eprintln!("token answers: {statuses:?}");
        let again = common::post(proxy.addr, "/orders", &alice, r#"{"sku":"A1"}"#).await;
        assert_eq!(upstream.executed_for("r"), 1, "alice's order ran again");
        assert_eq!(again.status, 201);
        assert_eq!(again.headers["idempotent-replayed"], "true");
        assert!(statuses.contains(&503), "the flood was never refused");
        let refused = statuses.iter().filter(|s| **s == 503).count();
        assert_eq!(
            proxy.metric("idemgate_store_tokens_refused_total"),
            refused as f64
        );
        assert_eq!(
            proxy.metric(r#"idemgate_store_evictions_total{route="orders"}"#),
            0.0
        );
    })
}

/// With `when_full: reject`, a token flood cannot fill the store either: a new caller's
/// order is still taken, not refused `503`.
#[test]
fn a_token_flood_leaves_room_for_orders_with_when_full_reject() {
    alone(async {
        let upstream = common::start_upstream().await;
        let proxy = common::start_proxy(upstream.addr, &token_flood_config("reject")).await;
        let alice = [("authorization", "Bearer alice"), ("idempotency-key", "a")];
        let first = common::post(proxy.addr, "/orders", &alice, r#"{"sku":"A1"}"#).await;
        assert_eq!(first.status, 201);
        token_flood(&proxy, 8).await;
        let bob = [("authorization", "Bearer bob"), ("idempotency-key", "b")];
        let order = common::post(proxy.addr, "/orders", &bob, r#"{"sku":"B1"}"#).await;
        assert_eq!(order.status, 201, "{:?}", order.body);
        assert_eq!(upstream.executed_for("b"), 1);
    })
}

/// A token request as raw HTTP/1.1 from a socket bound to `source` (another loopback
/// address is another client address), as `caller`: the answer's head and body.
async fn token_from(proxy: &common::ProxyHandle, source: &str, caller: &str) -> String {
    let request = format!(
        "POST /.idemgate/token HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: {caller}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    common::raw_exchange_from(source, proxy.addr, request.as_bytes()).await
}

/// One client address asking as any number of made-up callers (a new `Authorization`
/// each, so each under its own per-caller rate) gets at most `tokens.rate_per_address`
/// tokens a window (100 by default), `429 rate-limited` with `Retry-After` past it: the
/// tokens' share of the store (room for 200 here) stays open to callers elsewhere, who
/// still get theirs rather than `503`.
#[test]
fn made_up_callers_from_one_address_cannot_exhaust_tokens_for_others() {
    alone(async {
        let upstream = common::start_upstream().await;
        let config = "store:\n  memory: { max_entries: 2000 }\ntokens: { ttl: 5m }\n";
        let proxy = common::start_proxy(upstream.addr, config).await;
        let statuses = token_flood(&proxy, 200).await;
        let issued = statuses.iter().filter(|s| **s == 201).count();
        let limited = statuses.iter().filter(|s| **s == 429).count();
        assert_eq!((issued, limited), (100, 100), "{statuses:?}");
        let more = token_from(&proxy, "127.0.0.1", "Bearer one-more").await;
        assert!(more.starts_with("HTTP/1.1 429"), "{more}");
        assert!(more.contains("retry-after: 60"), "{more}");
        assert!(more.contains("urn:idemgate:problem:rate-limited"), "{more}");
        let elsewhere = token_from(&proxy, "127.0.0.2", "Bearer someone-else").await;
        assert!(elsewhere.starts_with("HTTP/1.1 201"), "{elsewhere}");
        assert_eq!(proxy.metric("idemgate_store_tokens_refused_total"), 0.0);
    })
}
