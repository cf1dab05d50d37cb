//! The Redis store across replicas: exactly once between proxy processes, takeover of a
//! killed owner, store faults in both `on_store_error` modes, round trips per request, and
//! Redis Cluster. Every test starts its own redis-server(s) on free loopback ports.

mod common;

use std::time::Duration;

use common::redis_server::{RedisCluster, RedisServer};
use common::{post, send, start_proxy, start_upstream, ProxyHandle, ProxyProcess, Upstream};
use http::{Method, StatusCode};

fn redis_yaml(url: &str, extra_defaults: &str) -> String {
    format!(
        "store:\n  redis: {{ url: \"{url}\", prefix: \"t:\", timeout: 500ms }}\ndefaults: {{ {extra_defaults} }}\nroutes:\n  - name: create-order\n    match: {{ methods: [POST], path: /orders }}\n    key: {{ header: Idempotency-Key, required: true }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxy_processes_on_one_redis_execute_each_key_once() {
    two_proxies_execute_each_key_once(&RedisServer::start()).await;
}

/// The same on Valkey 9, where completions are `SET … IFEQ` instead of the completion
/// script: a key the other replica waits on completes by the script, which wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxy_processes_on_one_valkey_execute_each_key_once() {
    two_proxies_execute_each_key_once(&RedisServer::start_valkey()).await;
}

/// 200 requests over 10 keys, alternating between two proxy processes on `redis`: each
/// key executes once and every answer for it is the same.
async fn two_proxies_execute_each_key_once(redis: &RedisServer) {
    let upstream = start_upstream().await;
    let config = redis_yaml(&redis.url(), "wait_timeout: 30s");
    let a = ProxyProcess::start(upstream.addr, &config);
    let b = ProxyProcess::start(upstream.addr, &config);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let target = if i % 2 == 0 { a.addr } else { b.addr };
        tasks.push(tokio::spawn(async move {
            let key = format!("key-{}", i % 10);
            let answer = post(
                target,
                "/orders",
                &[("idempotency-key", &key), ("x-test-delay-ms", "50")],
                "{\"sku\":\"A1\"}",
            )
            .await;
            (key, answer)
        }));
    }
    let mut bodies: std::collections::HashMap<String, bytes::Bytes> = Default::default();
    for t in tasks {
        let (key, answer) = t.await.unwrap();
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        let first = bodies.entry(key).or_insert_with(|| answer.body.clone());
        assert_eq!(*first, answer.body, "identical responses on both replicas");
    }
    assert_eq!(upstream.executed(), 10);
    assert_eq!(upstream.most_executions_of_one_key(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owner_is_taken_over_after_its_lease() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let config = redis_yaml(&redis.url(), "lease: 1s, wait_timeout: 30s");
    let mut a = ProxyProcess::start(upstream.addr, &config);
    let b = ProxyProcess::start(upstream.addr, &config);
    let a_addr = a.addr;
    let doomed = tokio::spawn(async move {
        // Never answered: the replica dies while its upstream call runs.
        let client = common::client();
        let request = http::Request::post(format!("http://{a_addr}/orders"))
            .header("idempotency-key", "crash")
            .header("x-test-delay-ms", "3000")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap();
        client.request(request).await
    });
    while upstream.executed() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.kill();
    assert!(
        doomed.await.unwrap().is_err(),
        "the client of the killed replica got nothing"
    );
    // The record still says "in flight"; once A's lease lapses, B's retry takes over.
    let retry = post(b.addr, "/orders", &[("idempotency-key", "crash")], "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed(), "B executed it itself");
    assert_eq!(upstream.executed_for("crash"), 2);
    let again = post(b.addr, "/orders", &[("idempotency-key", "crash")], "{}").await;
    assert!(again.replayed());
    assert_eq!(again.body, retry.body, "B's answer is the stored one");
    assert_eq!(upstream.executed_for("crash"), 2);
}

/// Fires keyed requests in waves; some keys repeat across waves so a lost record would
/// show up as a second execution.
async fn wave(addr: std::net::SocketAddr, wave: usize) -> Vec<StatusCode> {
    let mut tasks = Vec::new();
    for i in 0..20 {
        tasks.push(tokio::spawn(async move {
            let key = format!("w{}-{}", wave % 3, i);
            post(addr, "/orders", &[("idempotency-key", &key)], "{}")
                .await
                .status
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses
}

fn durable_redis() -> RedisServer {
    // Redis that keeps what it acknowledged across a kill, as a production one would.
    RedisServer::start_with(
        ["--appendonly", "yes", "--appendfsync", "always"]
            .map(String::from)
            .to_vec(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_answers_503_while_redis_is_down_and_recovers() {
    let mut redis = durable_redis();
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &redis_yaml(&redis.url(), "on_store_error: fail_closed"),
    )
    .await;
    assert!(wave(proxy.addr, 0)
        .await
        .iter()
        .all(|s| *s == StatusCode::CREATED));
    assert!(wave(proxy.addr, 1)
        .await
        .iter()
        .all(|s| *s == StatusCode::CREATED));
    let before = upstream.executed();
    redis.kill();
    let down = wave(proxy.addr, 2).await;
    assert!(
        down.iter().all(|s| *s == StatusCode::SERVICE_UNAVAILABLE),
        "{down:?}"
    );
    let problem = post(proxy.addr, "/orders", &[("idempotency-key", "x")], "{}").await;
    assert_eq!(
        problem.json()["type"],
        "urn:idemgate:problem:store-unavailable"
    );
    assert_eq!(
        upstream.executed(),
        before,
        "nothing was forwarded unprotected"
    );
    assert!(!proxy.store.ready().await);
    // Unprotected traffic does not depend on the store.
    assert_eq!(
        send(proxy.addr, Method::GET, "/health", &[], "")
            .await
            .status,
        StatusCode::OK
    );
    redis.restart();
    wait_until_async(|| proxy.store.ready()).await;
    // Same keys again (wave 0 ≡ wave 3): replayed from the restarted, durable Redis.
    let after = wave(proxy.addr, 3).await;
    assert!(after.iter().all(|s| *s == StatusCode::CREATED), "{after:?}");
    assert!(wave(proxy.addr, 2)
        .await
        .iter()
        .all(|s| *s == StatusCode::CREATED));
    assert_eq!(
        upstream.most_executions_of_one_key(),
        1,
        "no key ever executed twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_forwards_while_redis_is_down_and_recovers() {
    let mut redis = durable_redis();
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &redis_yaml(&redis.url(), "on_store_error: fail_open"),
    )
    .await;
    assert!(wave(proxy.addr, 0)
        .await
        .iter()
        .all(|s| *s == StatusCode::CREATED));
    redis.kill();
    let before = upstream.executed();
    let down = wave(proxy.addr, 1).await;
    assert!(down.iter().all(|s| *s == StatusCode::CREATED), "{down:?}");
    assert_eq!(upstream.executed(), before + 20, "forwarded unprotected");
    redis.restart();
    wait_until_async(|| proxy.store.ready()).await;
    let replay = post(proxy.addr, "/orders", &[("idempotency-key", "w0-1")], "{}").await;
    assert!(replay.replayed(), "protection is back without a restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_at_start_does_not_stop_the_proxy() {
    let dead_port = common::redis_server::free_port();
    let upstream = start_upstream().await;
    let proxy = ProxyProcess::start(
        upstream.addr,
        &redis_yaml(&format!("redis://127.0.0.1:{dead_port}"), ""),
    );
    let ready = send(proxy.admin, Method::GET, "/readyz", &[], "").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        send(proxy.admin, Method::GET, "/healthz", &[], "")
            .await
            .status,
        StatusCode::OK
    );
    let refused = post(proxy.addr, "/orders", &[("idempotency-key", "k")], "{}").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    // Redis comes up on that port: service recovers without a restart.
    let _redis = RedisServer::start_on(dead_port);
    let admin = proxy.admin;
    wait_until_async(|| async move {
        send(admin, Method::GET, "/readyz", &[], "").await.status == StatusCode::OK
    })
    .await;
    let ok = post(proxy.addr, "/orders", &[("idempotency-key", "k")], "{}").await;
    assert_eq!(ok.status, StatusCode::CREATED);
    assert_eq!(upstream.executed(), 1);
}

/// The commands Redis ran since the last `CONFIG RESETSTAT`, by name, as `name=calls`
/// (the test's own `INFO` and `CONFIG` left out). Commands a script runs count too, so
/// the mix says both what was sent and what the scripts did.
fn commands(redis: &RedisServer) -> Vec<String> {
    let mut mix: Vec<String> = redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            if ["info", "config"].contains(&name.split('|').next()?) {
                return None;
            }
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some(format!("{name}={calls}"))
        })
        .collect();
    mix.sort();
    mix
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_seen_costs_two_round_trips_and_a_replay_one() {
    // The claim is one `SET NX GET`; the completion the swap script (its GET and SET; no
    // PUBLISH, as nobody waits): Redis 7.0 refuses `SET … IFEQ` (in the warm-up).
    let redis = RedisServer::start();
    round_trips_and_what_redis_holds(&redis, &["evalsha=1", "get=1", "set=2"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_seen_on_valkey_runs_no_script() {
    // The claim is one `SET NX GET`; the completion `SET … IFEQ`: two commands, no Lua.
    let valkey = RedisServer::start_valkey();
    round_trips_and_what_redis_holds(&valkey, &["set=2"]).await;
}

/// A first-seen request runs `first_seen` on `redis` (as `commands` lists them), a replay
/// one `SET NX GET`, and Redis holds no raw key or caller secret.
async fn round_trips_and_what_redis_holds(redis: &RedisServer, first_seen: &[&str]) {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &redis_yaml(&redis.url(), "")).await;
    // Warm up: connection handshake, script loading and learning which `SET` options the
    // server takes are one-time costs.
    post(proxy.addr, "/orders", &[("idempotency-key", "warm")], "{}").await;
    redis.cli(&["CONFIG", "RESETSTAT"]);
    post(proxy.addr, "/orders", &[("idempotency-key", "rt")], "{}").await;
    assert_eq!(commands(redis), first_seen, "claim + complete");
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let replay = post(proxy.addr, "/orders", &[("idempotency-key", "rt")], "{}").await;
    assert!(replay.replayed());
    assert_eq!(commands(redis), ["set=1"], "the claim's SET NX GET only");
    // What Redis holds: digests and the response, never the raw key or caller secrets.
    let keys = redis.cli(&["--scan", "--pattern", "t:*"]);
    assert!(
        !keys.contains("rt") || keys.lines().all(|k| k.len() > 60),
        "{keys}"
    );
    let auth = post(
        proxy.addr,
        "/orders",
        &[
            ("idempotency-key", "secret-key-123"),
            ("authorization", "Bearer sk_live_abc"),
        ],
        "{}",
    )
    .await;
    assert_eq!(auth.status, StatusCode::CREATED);
    let dump = redis.cli(&["--scan", "--pattern", "*"]);
    assert!(
        !dump.contains("secret-key-123") && !dump.contains("sk_live"),
        "{dump}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_execute_once_on_a_redis_cluster() {
    duplicates_execute_once_on(&RedisCluster::start()).await;
}

/// The same on Valkey 9 nodes, where completions go through the cluster connection as
/// `SET … IFEQ` (Redis 7.0 refuses it and swaps by script); then a key nobody waits on
/// costs the cluster two `SET`s, no script and no `PUBLISH`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_execute_once_on_a_valkey_cluster() {
    let cluster = RedisCluster::start_valkey();
    let (proxy, _upstream) = duplicates_execute_once_on(&cluster).await;
    for node in &cluster.nodes {
        node.cli(&["CONFIG", "RESETSTAT"]);
    }
    let answer = post(proxy.addr, "/orders", &[("idempotency-key", "alone")], "{}").await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let mut mix: Vec<String> = cluster.nodes.iter().flat_map(commands).collect();
    mix.sort();
    assert_eq!(mix, ["set=2"], "claim + complete");
}

/// 120 requests over 12 keys, alternating between two proxies on `cluster`: each key
/// executes once, and the records spread over the masters. Returns one proxy and the
/// upstream, still running.
async fn duplicates_execute_once_on(cluster: &RedisCluster) -> (ProxyHandle, Upstream) {
    let upstream = start_upstream().await;
    let seeds = cluster
        .urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let config = format!(
        "store:\n  redis: {{ cluster: [{seeds}], prefix: \"c:\" }}\ndefaults: {{ wait_timeout: 30s }}\nroutes:\n  - name: create-order\n    match: {{ methods: [POST], path: /orders }}\n    key: {{ header: Idempotency-Key, required: true }}\n"
    );
    let a = start_proxy(upstream.addr, &config).await;
    let b = start_proxy(upstream.addr, &config).await;
    let mut tasks = Vec::new();
    for i in 0..120 {
        let target = if i % 2 == 0 { a.addr } else { b.addr };
        tasks.push(tokio::spawn(async move {
            let key = format!("ck-{}", i % 12);
            post(
                target,
                "/orders",
                &[("idempotency-key", &key), ("x-test-delay-ms", "50")],
                "{}",
            )
            .await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().status, StatusCode::CREATED);
    }
    assert_eq!(upstream.executed(), 12);
    assert_eq!(upstream.most_executions_of_one_key(), 1);
    // The records really are spread over the masters.
    let holding = cluster
        .nodes
        .iter()
        .filter(|n| n.cli(&["DBSIZE"]).trim() != "0")
        .count();
    assert!(holding >= 2, "keys on {holding} node(s)");
    (a, upstream)
}

async fn wait_until_async<F, Fut>(mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !condition().await {
        assert!(std::time::Instant::now() < deadline, "hang guard");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
