use super::*;
use crate::route::Overrides;
use http::Method;

fn config(rest: &str) -> Arc<Config> {
    let text = format!("listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\n{rest}");
    Arc::new(Config::parse(&text, "proxy.yaml").unwrap())
}

/// The longest a record could live: the longest route's `ttl` (a fingerprint route's
/// `fingerprint_ttl`), after its claim's lease and background bound.
#[test]
fn a_generation_lives_as_long_as_the_longest_record_it_could_write() {
    let c = config(
        "defaults: { ttl: 1h, fingerprint_ttl: 2m, lease: 10s, background_timeout: 5m }\nroutes:\n  - name: a\n    match: { path: /a }\n    key: { header: Idempotency-Key }\n    ttl: 3h\n  - name: b\n    match: { path: /b }\n    idempotency: off\n",
    );
    let secs = |s: u64| Duration::from_secs(s);
    assert_eq!(key_lifetime(&c), secs(10) + secs(300) + secs(3 * 3600));
    let short =
        config("defaults: { ttl: 1m, fingerprint_ttl: 1m, lease: 10s, background_timeout: 5m }\n");
    assert_eq!(key_lifetime(&short), secs(10) + secs(300) + secs(300));
}

/// An old key is looked at only where it tells apart every pair of requests the new
/// one does: the same header; fields the new key keeps all of; a fingerprint covering
/// all the new one covers. Any other pair (another source, a field added) is not.
#[test]
fn an_old_key_counts_only_where_it_tells_requests_apart_as_finely() {
    let source = |key: &str| {
        let c = config(&format!("defaults: {{ key: {key} }}\n"));
        match &c.fallback {
            Protection::On(rule) => rule.key.source.clone(),
            Protection::Off(_) => unreachable!("protected by default"),
        }
    };
    let header = source("{ header: Idempotency-Key }");
    let one = source("{ fields: [/a] }");
    let two = source("{ fields: [/a, /b] }");
    let body = source("{ fingerprint: { body: true, query: false } }");
    let all = source("{ fingerprint: { body: true, query: true } }");
    assert!(tells_apart_as_finely(&header, &header));
    assert!(!tells_apart_as_finely(
        &header,
        &source("{ header: X-Request-Id }")
    ));
    assert!(tells_apart_as_finely(&two, &one));
    assert!(!tells_apart_as_finely(&one, &two));
    assert!(tells_apart_as_finely(&all, &body));
    assert!(!tells_apart_as_finely(&body, &all));
    // Skipping one more field merges only requests that differed in it; skipping one
    // less (or dropping the default list) tells apart requests the old key merged.
    let noted = source("{ fingerprint: { body: true, query: true, ignore: [note] } }");
    let pointed = source("{ fingerprint: { body: true, query: true, ignore: [/items/0] } }");
    let bare = source("{ fingerprint: { body: true, query: true, ignore_defaults: false } }");
    assert!(tells_apart_as_finely(&all, &noted));
    assert!(tells_apart_as_finely(&all, &pointed));
    assert!(tells_apart_as_finely(&bare, &all));
    for (old, now) in [
        (&noted, &all),
        (&pointed, &all),
        (&all, &bare),
        (&noted, &pointed),
    ] {
        assert!(!tells_apart_as_finely(old, now), "{old:?} -> {now:?}");
    }
    for (old, now) in [(&all, &header), (&one, &all), (&header, &one)] {
        assert!(!tells_apart_as_finely(old, now), "{old:?} -> {now:?}");
    }
}

/// After a reload that renames one route, only that route's requests get an old rule:
/// a route whose name and key material stayed makes the same key, so its requests
/// neither claim nor derive a second one for as long as the generation lives.
#[test]
fn only_routes_whose_keys_changed_get_an_old_rule() {
    let routes = |orders: &str| {
        config(&format!(
            "routes:\n  - name: {orders}\n    match: {{ path: /orders }}\n    key: {{ header: Idempotency-Key }}\n  - name: quick\n    match: {{ path: /quick }}\n    key: {{ header: Idempotency-Key }}\n"
        ))
    };
    let (old, new) = (routes("orders"), routes("purchases"));
    let (kept, _) = Generations::default().after_reload(&old, true);
    let rules = |path: &str| {
        let Protection::On(now) = new.protection_for(None, &Method::POST, path).1 else {
            unreachable!("protected")
        };
        kept.rules_for(now, |old| {
            let headers = http::HeaderMap::new();
            Some(
                old.route_for(None, &Method::POST, &headers, Overrides::NONE, path)
                    .1,
            )
        })
    };
    let older = rules("/orders");
    assert_eq!(older.len(), 1);
    assert_eq!(older[0].route, "orders");
    assert!(rules("/quick").is_empty());
}

/// Only a re-keying reload keeps the config before it, newest first, and no more than
/// [`MAX_GENERATIONS`]: the oldest is dropped.
#[test]
fn a_reload_keeps_the_config_before_it_only_when_it_re_keys_and_at_most_four() {
    let none = Generations::default();
    let (kept, honoured) = none.after_reload(&config(""), false);
    assert!(kept.0.is_empty() && honoured.is_none());
    let configs: Vec<_> = (0..6)
        .map(|i| config(&format!("drain_timeout: {}s\n", i + 1)))
        .collect();
    let mut kept = Generations::default();
    for c in &configs {
        let (next, honoured) = kept.after_reload(c, true);
        assert!(honoured.is_some_and(|t| t > SystemTime::now()));
        kept = next;
    }
    let held: Vec<_> = kept
        .0
        .iter()
        .map(|g| g.config.drain_timeout.as_secs())
        .collect();
    assert_eq!(held, [6, 5, 4, 3]);
    let (same, honoured) = kept.after_reload(&configs[0], false);
    assert!(honoured.is_none());
    assert_eq!(same.0.len(), MAX_GENERATIONS);
}

/// A client key's old record is shown only where its payload check compared all the new
/// one compares: an `ignore` entry the new check drops, or the body it skipped, leaves a
/// record that may hold another payload's answer. Keys with no payload check need none.
#[test]
fn an_old_client_keys_record_is_shown_only_where_its_payload_check_compares_as_much() {
    let rule = |key: &str| {
        let c = config(&format!("defaults: {{ key: {key} }}\n"));
        match &c.fallback {
            Protection::On(rule) => Arc::clone(rule),
            Protection::Off(_) => unreachable!("protected by default"),
        }
    };
    let plain = rule("{ header: Idempotency-Key }");
    let amount =
        "{ header: Idempotency-Key, fingerprint: { body: true, query: true, ignore: [amount] } }";
    let skips_amount = rule(amount);
    let no_body = rule("{ header: Idempotency-Key, fingerprint: { body: false } }");
    assert!(payload_checked_as_finely(&plain, &plain));
    assert!(payload_checked_as_finely(&plain, &skips_amount));
    assert!(!payload_checked_as_finely(&skips_amount, &plain));
    assert!(!payload_checked_as_finely(&no_body, &plain));
    let fields = rule("{ fields: [/a] }");
    assert!(payload_checked_as_finely(
        &fields,
        &rule("{ fields: [/a] }")
    ));
}
