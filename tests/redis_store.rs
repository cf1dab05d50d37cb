//! The Redis store across replicas: exactly once between proxy processes, takeover of a
//! killed owner, store faults in both `on_store_error` modes, round trips per request,
//! Redis Cluster, and the fence on an unanswered claim's release. Every test starts its own redis-server(s) on free loopback ports.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_server::{RedisCluster, RedisServer};
use common::{post, send, start_proxy, start_upstream, ProxyHandle, ProxyProcess, Upstream};
use http::{Method, StatusCode};
use idemgate::key::Digest;
use idemgate::store::{
    Claim, ClaimArgs, Lapse, Lease, OwnerToken, RedisSettings, RedisStore, Settled, Store,
    StoredResponse,
};

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
    common::two_proxies_execute_each_key_once(&redis_yaml(&redis.url(), "wait_timeout: 30s")).await;
}

/// Sends a request through `addr` that reaches the upstream's gate `gate` and is never
/// answered there: its replica is killed meanwhile.
fn doomed(addr: std::net::SocketAddr, key: &'static str, gate: &'static str) {
    tokio::spawn(async move {
        let request = http::Request::post(format!("http://{addr}/orders"))
            .header("idempotency-key", key)
            .header("x-test-gate", gate)
            .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap();
        common::client().request(request).await
    });
}

/// 20 retries of `key` at once through `addr`.
async fn burst(addr: std::net::SocketAddr, key: &'static str) -> Vec<common::Answer> {
    let retries: Vec<_> = (0..20)
        .map(|_| {
            tokio::spawn(
                async move { post(addr, "/orders", &[("idempotency-key", key)], "{}").await },
            )
        })
        .collect();
    let mut answers = Vec::new();
    for retry in retries {
        answers.push(retry.await.unwrap());
    }
    answers
}

fn problem(answer: &common::Answer) -> String {
    answer.json()["type"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A replica killed while its upstream call runs: bursts of retries on another replica
/// never execute the request again. While the dead owner's lease runs they hear it is in
/// flight; once it lapsed, that its outcome is unknown (`on_unknown_outcome: hold`, the
/// default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owners_key_is_held_as_unknown_and_never_run_again() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let config = redis_yaml(&redis.url(), "lease: 1s, wait_timeout: 100ms");
    let mut a = ProxyProcess::start(upstream.addr, &config);
    let b = ProxyProcess::start(upstream.addr, &config);
    doomed(a.addr, "crash", "crash");
    upstream.arrived("crash", 1).await;
    a.kill();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: never lapsed"
        );
        let answers = burst(b.addr, "crash").await;
        for answer in &answers {
            assert_eq!(answer.status, StatusCode::CONFLICT, "{:?}", answer.body);
        }
        if answers
            .iter()
            .all(|a| problem(a) == "urn:idemgate:problem:outcome-unknown")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(upstream.executed_for("crash"), 1, "never run again");
    upstream.open("crash");
}

/// With `on_unknown_outcome: release` a killed owner's key is taken over, but not before
/// its lease and `background_timeout` passed (its call could run until then), and by
/// exactly one of the bursts of retries racing for it; the others replay that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owners_key_is_taken_over_once_after_its_grace_when_released() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let config = redis_yaml(
        &redis.url(),
        "lease: 500ms, upstream_timeout: 500ms, background_timeout: 1s, on_unknown_outcome: release, wait_timeout: 100ms",
    );
    let mut a = ProxyProcess::start(upstream.addr, &config);
    let b = ProxyProcess::start(upstream.addr, &config);
    doomed(a.addr, "crash", "crash");
    upstream.arrived("crash", 1).await;
    let arrived = std::time::Instant::now();
    a.kill();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut executed_again = Vec::new();
    let taken_over = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: never taken over"
        );
        let answers = burst(b.addr, "crash").await;
        let now = std::time::Instant::now();
        for answer in answers {
            match answer.status {
                StatusCode::CONFLICT => {
                    assert_eq!(problem(&answer), "urn:idemgate:problem:in-flight")
                }
                StatusCode::CREATED if !answer.replayed() => executed_again.push(answer),
                StatusCode::CREATED => {}
                other => panic!("unexpected {other}"),
            }
        }
        if !executed_again.is_empty() {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(executed_again.len(), 1, "one retry took it over");
    // The claim was taken before its request arrived, so the takeover came at least the
    // grace after the arrival (plus the lease, after the last renewal).
    assert!(
        taken_over - arrived >= Duration::from_secs(1),
        "{:?}",
        taken_over - arrived
    );
    let again = post(b.addr, "/orders", &[("idempotency-key", "crash")], "{}").await;
    assert!(again.replayed());
    assert_eq!(again.body, executed_again[0].body);
    assert_eq!(upstream.executed_for("crash"), 2);
    upstream.open("crash");
}

/// On Redis, an owner slower than several leases keeps its key through the proxy: its
/// renewals keep a duplicate out (409 in reject mode), and the duplicate then replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_slower_than_several_leases_keeps_its_key_on_redis() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &redis_yaml(&redis.url(), "lease: 300ms, in_flight: reject"),
    )
    .await;
    let addr = proxy.addr;
    let owner = tokio::spawn(async move {
        let headers = [("idempotency-key", "slow"), ("x-test-gate", "slow")];
        post(addr, "/orders", &headers, "{}").await
    });
    upstream.arrived("slow", 1).await;
    // Four leases pass while the owner is held: only renewals keep its claim.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let duplicate = post(addr, "/orders", &[("idempotency-key", "slow")], "{}").await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(problem(&duplicate), "urn:idemgate:problem:in-flight");
    upstream.open("slow");
    let owner = owner.await.unwrap();
    assert_eq!(owner.status, StatusCode::CREATED);
    let again = post(addr, "/orders", &[("idempotency-key", "slow")], "{}").await;
    assert!(again.replayed());
    assert_eq!(upstream.executed(), 1);
}

/// Redis killed under ten running owners and restarted empty (no persistence): each owner
/// finds its claim gone and writes its answer back, so the retries replay; no key runs
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_mid_claim_still_executes_each_key_once() {
    let mut redis = RedisServer::start();
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &redis_yaml(&redis.url(), "")).await;
    let keys: Vec<String> = (0..10).map(|n| format!("r{n}")).collect();
    let owners: Vec<_> = keys
        .iter()
        .map(|key| {
            let (addr, key) = (proxy.addr, key.clone());
            tokio::spawn(async move {
                let headers = [("idempotency-key", key.as_str()), ("x-test-gate", "mid")];
                post(addr, "/orders", &headers, "{}").await
            })
        })
        .collect();
    upstream.arrived("mid", 10).await;
    redis.restart();
    upstream.open("mid");
    let mut firsts = Vec::new();
    for owner in owners {
        let answer = owner.await.unwrap();
        assert_eq!(answer.status, StatusCode::CREATED);
        firsts.push(answer);
    }
    for (key, first) in keys.iter().zip(&firsts) {
        let retry = post(proxy.addr, "/orders", &[("idempotency-key", key)], "{}").await;
        assert!(retry.replayed(), "{key} ran again");
        assert_eq!(retry.body, first.body);
    }
    assert_eq!(upstream.executed(), 10);
    assert_eq!(upstream.most_executions_of_one_key(), 1);
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
    // Every record is named `t:{<64 hex digits>}`: the digest, never the client's key.
    assert!(!keys.trim().is_empty(), "records were written");
    for name in keys.lines() {
        let digest = name
            .strip_prefix("t:{")
            .and_then(|rest| rest.strip_suffix('}'))
            .unwrap_or_else(|| panic!("record name {name:?}"));
        assert!(
            digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "record name {name:?}"
        );
    }
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

// === An unanswered claim's release ===

/// A Redis store on `redis`, as the proxy makes one.
fn store_on(redis: &RedisServer) -> Store {
    let settings = RedisSettings {
        url: Some(redis.url()),
        cluster: Vec::new(),
        prefix: "t:".into(),
        timeout: Duration::from_millis(500),
        ca: None,
    };
    Store::Redis(Arc::new(
        RedisStore::connect(&settings).expect("redis store"),
    ))
}

/// Claims `args` and gives the claim up unsettled, as a claim whose answer never came
/// leaves it (no lease renews or settles it); returns its owner token.
async fn claim_unanswered(store: &Store, args: ClaimArgs) -> OwnerToken {
    let Claim::Owner(lease) = store.claim_with(args).await.expect("claim") else {
        panic!("a fresh key is owned");
    };
    let token = lease.token();
    lease.abandon();
    token
}

/// Claims `args` until the claim is owned (a lapsed claim's record must expire first).
async fn claim_until_owner(store: &Store, args: ClaimArgs) -> Lease {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Claim::Owner(lease) = store.claim_with(args).await.expect("claim") {
            return lease;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: never owned"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The release of a claim whose answer never came is fenced by that claim's token: its
/// own claim it frees, but run after the claim lapsed and another owner took the key over,
/// it leaves that owner's record as it is, with or without a token to hand back; the new
/// owner completes and its answer replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_claims_release_never_touches_a_later_owners_record() {
    let redis = RedisServer::start();
    let store = store_on(&redis);
    let fp = Digest([1; 32]);
    let lease = Duration::from_millis(200);
    let args = |key: Digest| ClaimArgs {
        lapse: Lapse::Release { grace: lease },
        ..ClaimArgs::new(key, fp, lease)
    };

    let own = Digest([2; 32]);
    let token = claim_unanswered(&store, args(own)).await;
    let released = store.release_unanswered(&args(own), token).await;
    assert_eq!(released, Some(Settled::Written), "its own claim");
    let again = claim_until_owner(&store, args(own)).await;
    assert!(again.release().await.unwrap());

    let taken = Digest([3; 32]);
    let token = claim_unanswered(&store, args(taken)).await;
    let successor = claim_until_owner(&store, args(taken)).await;
    for reissue in [None, Some(Duration::from_secs(3600))] {
        let late = ClaimArgs {
            reissue,
            ..args(taken)
        };
        let released = store.release_unanswered(&late, token).await;
        assert_eq!(released, Some(Settled::NotWritten), "reissue {reissue:?}");
        let info = store
            .inspect(taken)
            .await
            .unwrap()
            .expect("the successor's record");
        assert_eq!(info.state, "in_flight");
    }
    let answer = StoredResponse::new(StatusCode::CREATED, &Default::default(), b"successor");
    assert!(successor
        .complete(answer, Duration::from_secs(3600))
        .await
        .unwrap());
    match store.claim_with(args(taken)).await.unwrap() {
        Claim::Done(stored) => assert_eq!(&stored.body()[..], b"successor"),
        other => panic!("the successor's key answered {}", other.as_str()),
    }
}
