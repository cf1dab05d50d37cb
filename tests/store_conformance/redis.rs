//! The Redis backend: the store on a redis-server of its own, and what only Redis does:
//! claims and answers restored after a restart emptied it, completions swapped by script
//! where `SET … IFEQ` is refused.

use std::sync::Arc;
use std::time::Duration;

use idemgate::store::{
    ClaimArgs, Lease, Ownership, RedisSettings, RedisStore, Settled, Settlement, Store,
};

use crate::redis_checks::{command_calls, complete_stamped, replays_each};
use crate::support::*;

/// A Redis store on its own redis-server (free port, stopped when the test ends).
async fn store() -> (Store, super::redis_server::RedisServer) {
    on(super::redis_server::RedisServer::start())
}

/// A Redis store on `server`, returned with it so it lives as long as the test.
pub(super) fn on(
    server: super::redis_server::RedisServer,
) -> (Store, super::redis_server::RedisServer) {
    (connect(&server), server)
}

/// A store on `server` with a connection of its own, as another replica's.
pub(crate) fn connect(server: &super::redis_server::RedisServer) -> Store {
    let store = RedisStore::connect(&RedisSettings {
        url: Some(server.url()),
        cluster: Vec::new(),
        prefix: "conformance:".into(),
        timeout: Duration::from_secs(2),
        ca: None,
    })
    .expect("redis store");
    Store::Redis(Arc::new(store))
}

store_conformance!(store);

/// Redis 7.0 refuses `SET … IFEQ` once; every completion then, the first included,
/// swaps by the swap script (loaded again after the server dropped its scripts), and
/// one whose record the server lost misses the swap and is written back by the settle
/// script. What each stored replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_swap_by_script_where_ifeq_is_refused() {
    let (store, server) = store().await;
    let mut completed = complete_stamped(&store, 2).await;
    server.cli(&["SCRIPT", "FLUSH"]);
    completed.extend(complete_stamped(&store, 1).await);
    let (k, fp) = (fresh_key(), fresh_key());
    let lease = expect_owner(claim(&store, k, fp, LONG_LEASE).await);
    let record = format!("conformance:{{{}}}", hex::encode(k.0));
    assert_eq!(server.cli(&["DEL", &record]).trim(), "1");
    let lost = response(b"lost, then written back").with_fingerprint(fp);
    let done = Settlement::Done {
        response: lost.clone(),
        ttl: LONG_TTL,
    };
    assert_eq!(lease.settle(done).await.unwrap(), Settled::WrittenBack);
    completed.push((k, fp, lost));
    let stats = server.cli(&["INFO", "commandstats"]);
    let calls = |name| command_calls(&stats, name);
    // Commandstats counts the scripts' own calls too. Scripts run: three swaps, then
    // for the lost one a swap that found nothing and the settle script; refused as
    // NOSCRIPT three times (the swap script before its first run and after the flush,
    // the settle script before its first). Each script run is one GET.
    let (scripts, refused) = calls("evalsha");
    assert_eq!((scripts - refused, refused), (5, 3), "{stats}");
    assert_eq!(calls("get"), (5, 0), "{stats}");
    // SETs: four claims, the one refused `IFEQ`, three scripts' swaps, the write-back.
    // No PUBLISH: a swap matches only a record nobody waits on, and a record written
    // back had no one waiting on it.
    assert_eq!(calls("set"), (9, 1), "{stats}");
    assert_eq!(calls("publish"), (0, 0), "{stats}");
    replays_each(&store, completed).await;
}

/// A Redis restarted empty under a running owner (no persistence, or a failover to a
/// replica that never got the claim) does not leave the key free while the owner runs:
/// the owner's next renewal writes the claim back, so another replica finds it in
/// flight, and the owner's answer is stored as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_a_restarted_redis_lost_is_restored_by_its_renewal() {
    let (store, mut server) = store().await;
    let (k, fp) = (fresh_key(), fresh_key());
    let lease = expect_owner(claim(&store, k, fp, Duration::from_millis(900)).await);
    server.restart();
    within("the renewal to restore the claim", async {
        while !matches!(store.inspect(k).await, Ok(Some(info)) if info.state == "in_flight") {
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    let replica = connect(&server);
    expect_in_flight(claim(&replica, k, fp, LONG_LEASE).await);
    let want = response(b"after the restart").with_fingerprint(fp);
    assert!(lease.complete(want.clone(), LONG_TTL).await.unwrap());
    assert_same_response(
        &expect_done(claim(&replica, k, fp, LONG_LEASE).await),
        &want,
    );
}

/// An owner that finishes before any renewal after Redis restarted empty writes its
/// answer back, so a retry replays it instead of executing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_written_back_after_redis_forgot_the_claim() {
    let (store, mut server) = store().await;
    let (k, fp) = (fresh_key(), fresh_key());
    let lease = expect_owner(claim(&store, k, fp, LONG_LEASE).await);
    server.restart();
    let want = response(b"written back").with_fingerprint(fp);
    let done = Settlement::Done {
        response: want.clone(),
        ttl: LONG_TTL,
    };
    let settled = within("the store to come back", async {
        loop {
            match store.settle(&own(&lease), done.clone()).await {
                Ok(settled) => break settled,
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    })
    .await;
    assert_eq!(settled, Settled::WrittenBack);
    lease.abandon();
    assert_same_response(&expect_done(claim(&store, k, fp, LONG_LEASE).await), &want);
}

/// The ownership a lease holds, to settle through the store while the lease lives.
fn own(lease: &Lease) -> Ownership {
    Ownership {
        key: lease.key(),
        token: lease.token(),
        fingerprint: lease.fingerprint(),
        lapse: ClaimArgs::new(lease.key(), lease.fingerprint(), LONG_LEASE).lapse,
    }
}

redis_wake_ups!(store);
