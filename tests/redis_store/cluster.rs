//! Redis and Valkey clusters: duplicates execute once.

use http::StatusCode;

use crate::commands;
use crate::common::redis_server::RedisCluster;
use crate::common::{post, start_proxy, start_upstream, ProxyHandle, Upstream};

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
/// executes once, and the records spread over the masters. The owners are held at the
/// upstream's gate until the proxies report the other 108 parked waiting, so each duplicate
/// meets its owner in flight. Returns one proxy and the upstream, still running.
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
                &[("idempotency-key", &key), ("x-test-gate", "cluster")],
                "{}",
            )
            .await
        }));
    }
    upstream.arrived("cluster", 12).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while a.metric("idemgate_waiting") + b.metric("idemgate_waiting") < 108.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: the duplicates never all parked"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    upstream.open("cluster");
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
