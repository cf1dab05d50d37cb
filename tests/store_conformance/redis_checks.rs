//! The Redis-only checks of how waiters are woken (run by [`redis_wake_ups!`] on every
//! Redis-like backend), and the helpers that read a server's command statistics.

use std::time::Instant;

use idemgate::key::Digest;
use idemgate::store::{ClaimArgs, Store, StoredResponse};

use crate::support::*;
/// Completions publish only for a record a duplicate waits on, so a waiter must subscribe
/// and then mark the record before it waits. With the owner on one store and two waiters
/// on another (two replicas): the mark (one byte after the 66 of the in-flight record)
/// appears once, the channel has its subscriber before the completion, the completion
/// publishes once, wakes both waiters and stores the answer. Without the mark the swap
/// would match and publish nothing, and the waiters would sit until their fallback
/// re-check.
pub(crate) async fn a_waited_record_completes_with_a_publish(
    owner: &Store,
    server: &crate::redis_server::RedisServer,
) {
    let replica = crate::redis::connect(server);
    let (k, fp) = (fresh_key(), fresh_key());
    let hex = hex::encode(k.0);
    let (record, channel) = (
        format!("conformance:{{{hex}}}"),
        format!("conformance:done:{{{hex}}}"),
    );
    let lease = expect_owner(claim(owner, k, fp, LONG_LEASE).await);
    assert_eq!(server.cli(&["STRLEN", &record]).trim(), "66");
    let waiter = expect_in_flight(claim(&replica, k, fp, LONG_LEASE).await);
    assert_eq!(server.cli(&["STRLEN", &record]).trim(), "67", "not marked");
    // A second duplicate finds the mark and leaves it as it is.
    let second = expect_in_flight(claim(&replica, k, fp, LONG_LEASE).await);
    assert_eq!(server.cli(&["STRLEN", &record]).trim(), "67");
    let subscribers = server.cli(&["PUBSUB", "NUMSUB", &channel]);
    assert_eq!(
        subscribers.lines().nth(1).map(str::trim),
        Some("1"),
        "{subscribers}"
    );
    let waiting = [waiter, second].map(|w| tokio::spawn(w.wait(Instant::now() + HANG_GUARD)));
    server.cli(&["CONFIG", "RESETSTAT"]);
    let stored = response(b"waited for").with_fingerprint(fp);
    assert!(lease.complete(stored.clone(), LONG_TTL).await.unwrap());
    let stats = server.cli(&["INFO", "commandstats"]);
    assert_eq!(command_calls(&stats, "publish"), (1, 0), "{stats}");
    for w in waiting {
        assert!(w.await.unwrap(), "a waiter hit its deadline");
    }
    replays_each(&replica, vec![(k, fp, stored)]).await;
}

/// A duplicate that will not wait (`in_flight: reject`) neither subscribes nor marks, so
/// the owner's completion stays one swap and publishes nothing.
pub(crate) async fn a_duplicate_that_will_not_wait_leaves_the_record_unmarked(
    owner: &Store,
    server: &crate::redis_server::RedisServer,
) {
    let (k, fp) = (fresh_key(), fresh_key());
    let hex = hex::encode(k.0);
    let lease = expect_owner(claim(owner, k, fp, LONG_LEASE).await);
    let rejected = owner
        .claim_with(ClaimArgs {
            waits: false,
            ..ClaimArgs::new(k, fp, LONG_LEASE)
        })
        .await
        .expect("claim");
    expect_in_flight(rejected);
    let record = format!("conformance:{{{hex}}}");
    assert_eq!(server.cli(&["STRLEN", &record]).trim(), "66", "marked");
    let channel = format!("conformance:done:{{{hex}}}");
    let subscribers = server.cli(&["PUBSUB", "NUMSUB", &channel]);
    assert_eq!(
        subscribers.lines().nth(1).map(str::trim),
        Some("0"),
        "{subscribers}"
    );
    server.cli(&["CONFIG", "RESETSTAT"]);
    assert!(lease
        .complete(response(b"x").with_fingerprint(fp), LONG_TTL)
        .await
        .unwrap());
    let stats = server.cli(&["INFO", "commandstats"]);
    assert_eq!(command_calls(&stats, "publish"), (0, 0), "{stats}");
}

/// `(calls, failed_calls)` of one command in `INFO commandstats` output, whose lines read
/// `cmdstat_<name>:calls=N,…,failed_calls=F,…`; (0, 0) for a command never called.
pub(crate) fn command_calls(stats: &str, name: &str) -> (u64, u64) {
    let line = stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:")))
        .unwrap_or_default();
    let field = |key: &str| {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(key))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("calls="), field("failed_calls="))
}

/// Claims and completes `n` fresh keys as the proxy does (the response stamped with the
/// claim's fingerprint); returns each key, its fingerprint and what was stored.
pub(crate) async fn complete_stamped(
    store: &Store,
    n: usize,
) -> Vec<(Digest, Digest, StoredResponse)> {
    let mut completed = Vec::new();
    for i in 0..n {
        let (k, fp) = (fresh_key(), fresh_key());
        let lease = expect_owner(claim(store, k, fp, LONG_LEASE).await);
        let stored = response(format!("answer {i}").as_bytes()).with_fingerprint(fp);
        assert!(lease.complete(stored.clone(), LONG_TTL).await.unwrap());
        completed.push((k, fp, stored));
    }
    completed
}

/// Each completed key replays what was stored for it.
pub(crate) async fn replays_each(store: &Store, completed: Vec<(Digest, Digest, StoredResponse)>) {
    for (k, fp, stored) in completed {
        let replay = expect_done(claim(store, k, fp, LONG_LEASE).await);
        assert_same_response(&replay, &stored);
    }
}
