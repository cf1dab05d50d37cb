//! A settlement whose future is dropped before the store answered (a detached owner's
//! `background_timeout` passing while it writes its answer, or any caller dropping
//! `Lease::settle`) is not lost: it is made again in the background, as a failed one is;
//! and a failed one is made again often enough to land before its claim's record ends.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use idemgate::key::Digest;
use idemgate::store::{Claim, ClaimArgs, Lapse, RedisSettings, RedisStore, Store, StoredResponse};

use crate::common::redis_server::RedisServer;
use crate::common::relay::{relay_to, Relay};

/// A Redis store reached through the relay at `addr`, each command bounded by `timeout`.
fn store_through(addr: std::net::SocketAddr, timeout: Duration) -> Store {
    let settings = RedisSettings {
        url: Some(format!("redis://{addr}")),
        cluster: Vec::new(),
        prefix: "t:".into(),
        timeout,
        ca: None,
    };
    Store::Redis(Arc::new(RedisStore::connect(&settings).expect("store")))
}

/// A claim of `key` that lapses into a release after `grace`, owned through a relay to a
/// fresh Redis, then Redis cut off and the owner's answer failed: the outage the tests
/// below start from. Returns the server and the relay (the outage lasts while they do),
/// the store and the claim's arguments.
async fn an_answer_redis_failed(
    key: Digest,
    grace: Duration,
) -> (RedisServer, Relay, Store, ClaimArgs) {
    let redis = RedisServer::start();
    let relay = relay_to(redis.port).await;
    let store = store_through(relay.addr, Duration::from_millis(300));
    let args = ClaimArgs {
        lapse: Lapse::Release { grace },
        ..ClaimArgs::new(key, Digest([1; 32]), Duration::from_millis(300))
    };
    let Claim::Owner(lease) = store.claim_with(args).await.expect("claim") else {
        panic!("a fresh key is owned");
    };
    relay.cut.store(true, Ordering::SeqCst);
    let answer = StoredResponse::new(StatusCode::CREATED, &Default::default(), b"made");
    assert!(
        lease
            .complete(answer, Duration::from_secs(3600))
            .await
            .is_err(),
        "Redis is cut off"
    );
    (redis, relay, store, args)
}

/// The owner's completion is sent, held on its way to Redis, and its future dropped there;
/// the held command never runs (Redis drops its connection). The answer is stored all the
/// same once Redis can be reached, and its repeat replays it instead of finding the claim
/// lapsed into an unknown outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_dropped_before_redis_answered_is_made_again() {
    let redis = RedisServer::start();
    let relay = relay_to(redis.port).await;
    // A hang guard: the completion is dropped long before.
    let store = store_through(relay.addr, Duration::from_secs(30));
    let key = Digest([0x5c; 32]);
    let args = ClaimArgs::new(key, Digest([1; 32]), Duration::from_secs(1));
    let Claim::Owner(lease) = store.claim_with(args).await.expect("claim") else {
        panic!("a fresh key is owned");
    };
    relay.hold_requests.send_replace(true);
    let answer = StoredResponse::new(StatusCode::CREATED, &Default::default(), b"made");
    let completion = tokio::spawn(lease.complete(answer, Duration::from_secs(3600)));
    while relay.requests_held() == 0 {
        tokio::task::yield_now().await;
    }
    completion.abort();
    assert!(completion.await.unwrap_err().is_cancelled());
    // Redis drops the connection the completion waits on: it never runs.
    redis.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    relay.hold_requests.send_replace(false);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store
        .inspect(key)
        .await
        .ok()
        .flatten()
        .map(|info| info.state)
        != Some("done")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: the dropped completion was never made again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    match store.claim_with(args).await.expect("claim") {
        Claim::Done(stored) => assert_eq!(&stored.body()[..], b"made"),
        other => panic!("the completed key answered {}", other.as_str()),
    }
}

/// Redis is cut off as the owner's answer comes back and stays away past the claim's
/// lease, on a route that releases lapsed claims: the claim's record lasts only its grace
/// more, and a takeover runs the request again once it is gone. Redis back within that
/// grace records the answer before then, so the repeat replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_redis_missed_past_the_lease_is_recorded_before_its_claim_can_be_taken_over() {
    let key = Digest([0x5d; 32]);
    let grace = Duration::from_secs(12);
    let (redis, relay, store, args) = an_answer_redis_failed(key, grace).await;
    // An outage well past the lease, ending a few seconds before the record expires (as
    // Redis itself counts, read past the relay): the answer is recorded before then.
    let record = format!("t:{{{}}}", hex::encode(key.0));
    let pttl = || redis.cli(&["PTTL", &record]).trim().parse::<i64>().unwrap();
    while pttl() > 3000 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.cut.store(false, Ordering::SeqCst);
    let deadline = std::time::Instant::now() + grace * 2;
    loop {
        let kind = redis.cli(&["GETRANGE", &record, "0", "0"]);
        match kind.trim() {
            "D" => break,
            // Expired: the answer never made it, and a takeover would run it again.
            "" => break,
            _ => {}
        }
        assert!(std::time::Instant::now() < deadline, "hang guard");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    match store.claim_with(args).await.expect("claim") {
        Claim::Done(stored) => assert_eq!(&stored.body()[..], b"made"),
        other => panic!("the answered key's repeat got {}", other.as_str()),
    }
}

/// Redis stays away for the whole life of the claim's record: the answer can never be
/// recorded. While it is made again it shows among the background writes
/// (`idemgate_store_background_writes`), and once given up the store counts it lost
/// (`idemgate_store_settlements_lost_total`, what an operator alerts on) rather than only
/// logging it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_redis_never_took_is_counted_lost() {
    let key = Digest([0x5e; 32]);
    let (_redis, _relay, store, _) = an_answer_redis_failed(key, Duration::from_secs(3)).await;
    let text = idemgate::metrics::Metrics::new().render(store.stats());
    let writing: i64 = text
        .lines()
        .find_map(|line| line.strip_prefix("idemgate_store_background_writes "))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no background writes gauge:\n{text}"));
    assert!(writing >= 1, "the answer made again is not shown:\n{text}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.stats().settlements_lost == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: the settlement was given up without being counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.stats().settlements_lost, 1);
}

/// How many writes Redis has refused for want of replicas (`errorstats`).
fn writes_refused(redis: &RedisServer) -> u64 {
    redis
        .cli(&["INFO", "errorstats"])
        .lines()
        .find_map(|line| line.strip_prefix("errorstat_NOREPLICAS:count="))
        .map_or(0, |count| count.trim().parse().unwrap())
}

/// Redis refuses the owner's writes from just after its claim (as to a replica cut off
/// from it: its renewals fail) and the answer comes back after four leases of that, its
/// write refused too. The claim's record ends a lease and its grace after the last renewal
/// that landed, the claim itself here, not after the answer: the owner's retries must
/// close in on that end, so Redis back shortly before it records the answer before a
/// duplicate can take the key over. Each retry is seen as one more refused write; Redis
/// comes back right after one that falls in the record's last second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_written_long_after_the_last_renewal_lands_before_the_record_ends() {
    let redis = RedisServer::start();
    let store = store_through_direct(&redis);
    let key = Digest([0x5f; 32]);
    let lease = Duration::from_secs(1);
    let args = ClaimArgs {
        lapse: Lapse::Release {
            grace: Duration::from_secs(7),
        },
        ..ClaimArgs::new(key, Digest([1; 32]), lease)
    };
    let Claim::Owner(lease_held) = store.claim_with(args).await.expect("claim") else {
        panic!("a fresh key is owned");
    };
    redis.cli(&["CONFIG", "SET", "min-replicas-to-write", "1"]);
    // The upstream call runs on through four leases of the outage: time is the subject.
    tokio::time::sleep(lease * 4).await;
    let answer = StoredResponse::new(StatusCode::CREATED, &Default::default(), b"made");
    assert!(
        lease_held
            .complete(answer, Duration::from_secs(3600))
            .await
            .is_err(),
        "Redis refuses writes"
    );
    let record = format!("t:{{{}}}", hex::encode(key.0));
    let pttl = || redis.cli(&["PTTL", &record]).trim().parse::<i64>().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while pttl() > 1000 {
        assert!(std::time::Instant::now() < deadline, "hang guard");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The next retry that fails (if one comes before the record ends), then Redis back.
    let refused = writes_refused(&redis);
    while writes_refused(&redis) == refused && pttl() > 0 {
        assert!(std::time::Instant::now() < deadline, "hang guard");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    redis.cli(&["CONFIG", "SET", "min-replicas-to-write", "0"]);
    loop {
        match redis.cli(&["GETRANGE", &record, "0", "0"]).trim() {
            // Recorded, or expired with the answer never written.
            "D" | "" => break,
            _ => {}
        }
        assert!(std::time::Instant::now() < deadline, "hang guard");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match store.claim_with(args).await.expect("claim") {
        Claim::Done(stored) => assert_eq!(&stored.body()[..], b"made"),
        other => panic!(
            "the answered key's duplicate got {} (a takeover runs it again)",
            other.as_str()
        ),
    }
}

/// A Redis store on `redis` itself, each command bounded by 300 ms.
fn store_through_direct(redis: &RedisServer) -> Store {
    let port = redis.port;
    store_through(([127, 0, 0, 1], port).into(), Duration::from_millis(300))
}
