//! `store.memory.address_share`: callers name themselves (every made-up `Authorization` is
//! a new caller, so `caller_share` bounds none of them together), but one client address
//! holds at most its share of the memory store, so a flood from it can neither evict
//! another address's answers (`when_full: evict`) nor fill the store for everyone
//! (`when_full: reject`).

use super::{alone, common};

/// A memory store of 10 records, one client address holding at most 3 of them.
fn config(when_full: &str) -> String {
    format!(
        r#"
store:
  memory: {{ max_entries: 10, address_share: 30%, when_full: {when_full} }}
routes:
  - name: orders
    match: {{ methods: [POST], path: /orders }}
    key: {{ header: Idempotency-Key, required: true }}
"#
    )
}

/// A protected POST from `source` (a loopback address bound as the client's) as `caller`
/// with the idempotency key `key` (the answer a 401, as for a made-up credential): the
/// whole answer, head and body.
async fn order_from(proxy: &common::ProxyHandle, source: &str, caller: &str, key: &str) -> String {
    let auth = format!("authorization: Bearer {caller}");
    let idem = format!("idempotency-key: {key}");
    let request = common::raw_post("/orders", &[&auth, &idem, "x-test-status: 401"], "{}");
    common::raw_exchange_from(source, proxy.addr, &request).await
}

/// One address sends made-up credentials, each with a fresh key, 12 times: past its 3
/// records it is refused, `429 address-over-share` with `Retry-After` (counted as a
/// rejected request). Another address's answer, stored before, is still replayed (not
/// evicted, not run again), and that address still stores new answers; the flooding
/// address's own answers replay too.
fn one_address_cannot_take_more_than_its_share(when_full: &str) {
    alone(async {
        let upstream = common::start_upstream().await;
        let proxy = common::start_proxy(upstream.addr, &config(when_full)).await;
        let first = order_from(&proxy, "127.0.0.2", "alice", "alice-1").await;
        assert!(first.starts_with("HTTP/1.1 401"), "{first}");

        let mut flood = Vec::new();
        for n in 1..=12 {
            let (caller, key) = (format!("made-up-{n}"), format!("junk-{n}"));
            flood.push(order_from(&proxy, "127.0.0.3", &caller, &key).await);
        }

        let again = order_from(&proxy, "127.0.0.2", "alice", "alice-1").await;
        assert_eq!(
            upstream.executed_for("alice-1"),
            1,
            "alice's request ran again"
        );
        assert!(again.contains("idempotent-replayed: true"), "{again}");
        for n in 2..=3 {
            let key = format!("alice-{n}");
            let more = order_from(&proxy, "127.0.0.2", "alice", &key).await;
            assert!(more.starts_with("HTTP/1.1 401"), "{more}");
            assert!(!more.contains("idempotent-replayed"), "{more}");
        }

        let stored = flood.iter().take_while(|a| a.starts_with("HTTP/1.1 401"));
        assert_eq!(stored.count(), 3, "{flood:#?}");
        for refused in &flood[3..] {
            assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
            assert!(refused.contains("retry-after: 60"), "{refused}");
            let problem = "urn:idemgate:problem:address-over-share";
            assert!(refused.contains(problem), "{refused}");
        }
        assert_eq!(
            upstream.executed_for("junk-4"),
            0,
            "refused, never forwarded"
        );
        assert_eq!(upstream.executed(), 3 + 3);
        assert_eq!(
            proxy.metric(r#"idemgate_requests_total{route="orders",outcome="rejected"}"#),
            9.0
        );
        let own = order_from(&proxy, "127.0.0.3", "made-up-1", "junk-1").await;
        assert!(own.contains("idempotent-replayed: true"), "{own}");
        assert_eq!(
            proxy.metric(r#"idemgate_store_evictions_total{route="orders"}"#),
            0.0
        );
    })
}

#[test]
fn made_up_callers_from_one_address_cannot_evict_another_addresss_answer() {
    one_address_cannot_take_more_than_its_share("evict");
}

#[test]
fn made_up_callers_from_one_address_cannot_fill_the_store_for_others() {
    one_address_cannot_take_more_than_its_share("reject");
}
