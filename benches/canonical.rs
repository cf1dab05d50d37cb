//! Cost of fingerprinting a JSON body: canonicalization plus SHA-256, on realistic order bodies of
//! about 1 KiB and 16 KiB, with a serde_json `Value` round trip as a reference point.

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

criterion_group!(benches, bench_canonical);
criterion_main!(benches);
