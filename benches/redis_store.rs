//! Redis store vs memory store through the same `Store` API: first-seen (claim + complete)
//! and replay (claim of a done key), plus the Redis commands each costs, counted from
//! `INFO commandstats`. Starts its own redis-server on a free loopback port.
//!
//! `cargo bench --bench redis_store`

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderValue, StatusCode};
use idemgate::key::Digest;
use idemgate::store::{
    Claim, MemoryLimits, MemoryStore, RedisSettings, RedisStore, Store, StoredResponse,
};
use sha2::{Digest as _, Sha256};

struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> Server {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server on PATH (scripts/test installs it)");
    // Owned by the guard from here on, so the process is killed and reaped on every path.
    let server = Server(child, port);
    for _ in 0..500 {
        if cli(port, &["PING"]).trim() == "PONG" {
            return server;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("redis-server did not start");
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Commands Redis ran since the last `CONFIG RESETSTAT` per request, as `name x.xx`
/// (inner commands of scripts included: a script call and what it did).
fn commands_per_request(port: u16, requests: u64) -> String {
    cli(port, &["INFO", "commandstats"])
        .lines()
        .filter_map(|l| {
            let (name, stats) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            if name.starts_with("info") || name.starts_with("config") {
                return None;
            }
            let calls: u64 = stats
                .split(',')
                .next()?
                .strip_prefix("calls=")?
                .parse()
                .ok()?;
            Some(format!("{name} {:.2}", calls as f64 / requests as f64))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn fresh_key() -> Digest {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    Digest(Sha256::digest(n.to_le_bytes()).into())
}

fn response() -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert(
        "x-request-id",
        HeaderValue::from_static("8e03978e-40d5-43e8"),
    );
    headers.append("set-cookie", HeaderValue::from_static("a=1; Path=/"));
    StoredResponse::new(StatusCode::CREATED, &headers, &[b'x'; 1024])
}

async fn first_seen(store: &Store, stored: &StoredResponse) -> Digest {
    let key = fresh_key();
    match store
        .claim(key, Digest::NONE, Duration::from_secs(30))
        .await
        .unwrap()
    {
        Claim::Owner(lease) => {
            assert!(lease
                .complete(stored.clone(), Duration::from_secs(600))
                .await
                .unwrap());
        }
        other => panic!("fresh key not owned: {}", other.as_str()),
    }
    key
}

async fn replay(store: &Store, key: Digest) {
    match store
        .claim(key, Digest::NONE, Duration::from_secs(30))
        .await
        .unwrap()
    {
        Claim::Done(r) => assert_eq!(r.status(), StatusCode::CREATED),
        other => panic!("done key not replayed: {}", other.as_str()),
    }
}

fn stores(c: &mut Criterion) {
    let server = start_redis();
    // Two workers, as in the proxy: the Redis connection's driver runs beside the caller.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let redis = Store::Redis(Arc::new(
        RedisStore::connect(&RedisSettings {
            url: Some(format!("redis://127.0.0.1:{}", server.1)),
            cluster: Vec::new(),
            prefix: "bench:".into(),
            timeout: Duration::from_secs(2),
            ca: None,
        })
        .unwrap(),
    ));
    let memory = Store::Memory(Arc::new(MemoryStore::new(MemoryLimits {
        max_entries: 10_000_000,
        max_bytes: 16 << 30,
        ..MemoryLimits::default()
    })));
    let stored = response();

    let mut group = c.benchmark_group("store");
    for (name, store) in [("memory", &memory), ("redis", &redis)] {
        group.bench_function(format!("{name}/first_seen"), |b| {
            b.iter(|| rt.block_on(first_seen(store, &stored)))
        });
        let done = rt.block_on(first_seen(store, &stored));
        group.bench_function(format!("{name}/replay"), |b| {
            b.iter(|| rt.block_on(replay(store, done)))
        });
    }
    group.finish();

    // Round trips per request, counted by Redis itself.
    let n = 1000u64;
    let keys: Vec<Digest> = rt.block_on(async {
        let mut keys = Vec::new();
        keys.push(first_seen(&redis, &stored).await); // warm the script cache
        cli(server.1, &["CONFIG", "RESETSTAT"]);
        for _ in 0..n {
            keys.push(first_seen(&redis, &stored).await);
        }
        keys
    });
    let first = commands_per_request(server.1, n);
    cli(server.1, &["CONFIG", "RESETSTAT"]);
    rt.block_on(async {
        for key in &keys[1..] {
            replay(&redis, *key).await;
        }
    });
    let replays = commands_per_request(server.1, n);
    // A round trip is one script call or one top-level command; the claim's SET NX GET is
    // the only top-level SET.
    eprintln!("redis commands per request: first-seen: {first}; replay: {replays}");
}

criterion_group!(benches, stores);
criterion_main!(benches);
