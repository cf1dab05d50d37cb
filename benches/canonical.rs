//! Cost of fingerprinting a JSON body: canonicalization plus SHA-256, on realistic order bodies of
//! about 1 KiB and 16 KiB, with a serde_json `Value` round trip as a reference point; and
//! the per-request steps before it: path normalisation, the `Host` check, the client address
//! behind trusted proxies, and what scoping a key by the caller adds to its derivation.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use idemgate::canonical::{canonical_json, IgnoreSet};
use sha2::{Digest, Sha256};

/// A small deterministic generator so the bodies are identical on every run and machine.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }
}

/// An order as a shop's mobile app would post it: compact, keys in no particular order, a few
/// volatile fields (timestamp, coordinates) that the default ignore set drops.
fn render_order(items: usize, note: &str) -> String {
    let mut rng = Lcg(0x5eed);
    let colors = ["blue", "red", "graphite", "sand", "forest green"];
    let mut item_list = Vec::with_capacity(items);
    for i in 0..items {
        let cents = 199 + rng.next(20_000);
        item_list.push(format!(
            r#"{{"sku":"SKU-{:05}","qty":{},"price":{}.{:02},"name":"Widget {}","options":{{"color":"{}","gift":{}}}}}"#,
            rng.next(100_000),
            1 + rng.next(5),
            cents / 100,
            cents % 100,
            i + 1,
            colors[rng.next(colors.len() as u64) as usize],
            rng.next(2) == 0,
        ));
    }
    format!(
        concat!(
            r#"{{"order_id":"ord_8f14e45fceea167a","customer":{{"id":48213,"name":"Zoë Lovelace","#,
            r#""email":"zoe@example.com","tier":"gold","marketing_opt_in":false}},"items":[{}],"#,
            r#""currency":"EUR","total":1234.50,"shipping_address":{{"line1":"12 Analytical Engine Way","#,
            r#""city":"London","postcode":"N1 9GU","country":"GB"}},"metadata":{{"source":"ios-app","#,
            r#""version":"5.12.0","campaign":null,"note":"{}"}},"timestamp":"2024-05-01T12:34:56.789Z","#,
            r#""lat":51.5072,"lng":-0.1276}}"#
        ),
        item_list.join(","),
        note
    )
}

/// The order with as many items as fit in `size` bytes, padded to exactly `size` by its note.
fn order_body(size: usize) -> Vec<u8> {
    let mut items = 0;
    while render_order(items + 1, "").len() <= size {
        items += 1;
    }
    let unpadded = render_order(items, "").len();
    let note = "Please leave the parcel with the neighbour. "
        .chars()
        .cycle()
        .take(size - unpadded)
        .collect::<String>();
    let body = render_order(items, &note);
    assert_eq!(body.len(), size);
    body.into_bytes()
}

fn bench_canonical(c: &mut Criterion) {
    let ignore = IgnoreSet::defaults();
    let small = order_body(1024);
    let large = order_body(16 * 1024);

    let mut group = c.benchmark_group("canonicalize_hash");
    for (name, body) in [("1KiB", &small), ("16KiB", &large)] {
        group.throughput(Throughput::Bytes(body.len() as u64));
        let mut out = Vec::with_capacity(body.len());
        group.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                canonical_json(black_box(body), &ignore, &mut out, None).expect("valid body");
                Sha256::digest(&out)
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("canonicalize_only");
    group.throughput(Throughput::Bytes(small.len() as u64));
    let mut out = Vec::with_capacity(small.len());
    group.bench_function("1KiB", |b| {
        b.iter(|| {
            out.clear();
            canonical_json(black_box(&small), &ignore, &mut out, None).expect("valid body");
            out.len()
        })
    });
    group.finish();

    let mut group = c.benchmark_group("serde_json_value_roundtrip");
    group.throughput(Throughput::Bytes(small.len() as u64));
    let mut out = Vec::with_capacity(small.len());
    group.bench_function("1KiB", |b| {
        b.iter(|| {
            out.clear();
            let value: serde_json::Value =
                serde_json::from_slice(black_box(&small)).expect("valid body");
            serde_json::to_writer(&mut out, &value).expect("serializable");
            out.len()
        })
    });
    group.finish();
}

/// The steps every protected request takes before its body is looked at.
fn bench_identity(c: &mut Criterion) {
    use http::{HeaderMap, HeaderValue, Method, Request};
    use idemgate::key::identity::{Identity, TrustedProxies};
    use idemgate::key::{derive_key, FingerprintRule, KeyRule, KeySource, RequestView, ScopePart};
    use idemgate::route::normalize::normalize_path;
    use idemgate::route::Overrides;

    let mut group = c.benchmark_group("normalize_path");
    for (name, path) in [
        ("normal", "/api/v1/orders/42/items"),
        ("dot_segments", "/api//v1/./orders/x/../42/items"),
        ("escapes", "/api/v1/%6Frders/caf%c3%a9"),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| normalize_path(black_box(path)).map(|p| p.len()))
        });
    }
    group.finish();

    let request = Request::post("/api/v1/orders")
        .header("host", "shop.example.com:8443")
        .body(())
        .expect("a request");
    c.bench_function("admit_host", |b| {
        b.iter(|| idemgate::proxy::admission::admit(black_box(&request)).map(|h| h.map(str::len)))
    });

    let mut group = c.benchmark_group("client_address");
    let trusted: TrustedProxies = ["10.0.0.0/8", "192.168.0.0/16"]
        .iter()
        .map(|c| c.parse().expect("a block"))
        .collect();
    let mut xff = HeaderMap::new();
    xff.insert(
        "x-forwarded-for",
        HeaderValue::from_static("198.51.100.7, 203.0.113.9, 10.1.2.3"),
    );
    let untrusted_peer = "203.0.113.1".parse().expect("an address");
    let trusted_peer = "10.0.0.2".parse().expect("an address");
    group.bench_function("no_trusted_proxies", |b| {
        b.iter(|| TrustedProxies::default().client_address(black_box(untrusted_peer), &xff))
    });
    group.bench_function("untrusted_peer", |b| {
        b.iter(|| trusted.client_address(black_box(untrusted_peer), &xff))
    });
    group.bench_function("trusted_peer_xff", |b| {
        b.iter(|| trusted.client_address(black_box(trusted_peer), &xff))
    });
    group.finish();

    // A small body, so the difference between the rows is the scope.
    let identity = Identity::default();
    let rule = |scope: Vec<ScopePart>| KeyRule {
        source: KeySource::Fingerprint(Box::new(FingerprintRule::standard())),
        required: true,
        scope,
        payload: Box::new(FingerprintRule::standard()),
    };
    let unscoped = rule(Vec::new());
    let caller = rule(vec![ScopePart::Caller]);
    let mut by_auth = HeaderMap::new();
    by_auth.insert(
        "authorization",
        HeaderValue::from_static("Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig"),
    );
    let mut by_session = HeaderMap::new();
    by_session.insert(
        "cookie",
        HeaderValue::from_static(
            "_ga=GA1.2.3; theme=dark; sessionid=8f14e45fceea167a5a36dedd4bea2543",
        ),
    );
    let mut by_cookies = HeaderMap::new();
    by_cookies.insert(
        "cookie",
        HeaderValue::from_static("_ga=GA1.2.3; theme=dark; app=8f14e45f"),
    );
    let anonymous = HeaderMap::new();
    let body = br#"{"sku":"A1","qty":1}"#;
    let view = |headers| RequestView {
        route: "orders",
        method: &Method::POST,
        path: "/api/v1/orders",
        query: None,
        headers,
        overrides: Overrides::find(headers),
        peer: Some(untrusted_peer),
        identity: &identity,
        client_cert: None,
        body,
    };
    let mut group = c.benchmark_group("derive_key");
    group.bench_function("no_scope", |b| {
        b.iter(|| {
            derive_key(&unscoped, black_box(&view(&anonymous)), None).map(|k| k.key().is_some())
        })
    });
    for (name, headers) in [
        ("caller_authorization", &by_auth),
        ("caller_session_cookie", &by_session),
        ("caller_cookie_header", &by_cookies),
        ("caller_address", &anonymous),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                derive_key(&caller, black_box(&view(headers)), None).map(|k| k.key().is_some())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_canonical, bench_identity);
criterion_main!(benches);
