//! The store contract as one conformance suite, run against every backend.
//!
//! Each check in [`checks`] is an `async fn(&Store)` that states one behaviour of the
//! contract in `src/store.rs` (atomic claims, replay, fingerprint mismatch, fencing, lease
//! renewal and release on drop, waiters, TTL, inspect and remove). The
//! [`store_conformance!`] macro turns every check into a `#[tokio::test]` (multi-threaded
//! runtime, so renewers and claimers really run in parallel) against a store built by a
//! factory, once per backend module. Test names are the check names, prefixed by the
//! backend: `memory::a_released_key_is_claimed_afresh`.
//!
//! # Plugging in a new backend
//!
//! 1. Add the variant to `Store` (for example `Store::Redis(Arc<RedisStore>)`).
//! 2. Add a module here with an async factory that returns a fresh, empty store and a
//!    guard that lives as long as the test (the `redis` module returns the redis-server
//!    process it started on a free port), and invoke the macro:
//!
//!    ```ignore
//!    mod redis {
//!        use super::*;
//!        async fn store() -> (Store, RedisServer) { … }
//!        store_conformance!(store);
//!    }
//!    ```
//!
//!    Every check in the macro's list runs; a backend cannot skip one by forgetting it.
//! 3. What the checks assume of a backend: keys come from [`fresh_key`], unique within a
//!    run and salted per run, so a shared server needs no flushing between tests; the
//!    real clock is used (no paused time), with leases of a few hundred milliseconds
//!    where one must lapse.
//! 4. Limits are backend specific and not part of the contract: the memory store's bounds
//!    are tested in [`memory_bounds`]. A bounded backend writes its own section, reusing the
//!    helpers here.
//!
//! # Timing
//!
//! No check asserts how long anything took. Where a lease or TTL must run out, the check
//! waits for the condition (claim until `Owner`) under a generous hang guard
//! ([`HANG_GUARD`]); a broken store fails by tripping the guard, never by being slow.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use http::header::{CONTENT_TYPE, SET_COOKIE};
use http::{HeaderMap, HeaderValue, StatusCode};
use idemgate::key::Digest;
use idemgate::store::{
    Claim, ClaimArgs, ClaimMode, Lapse, Lease, MemoryLimits, MemoryStore, Ownership, Settled,
    Settlement, Store, StoreError, StoredResponse,
};
use sha2::{Digest as _, Sha256};

// === Backends ===

/// Instantiates every conformance check as a test against the store `$factory().await`
/// returns, with a guard (e.g. the backend's server process) kept alive for the test. The
/// list below is the contract: a new check goes here and runs everywhere.
macro_rules! store_conformance {
    ($factory:path) => {
        store_conformance!(@tests $factory;
            a_free_key_has_exactly_one_owner_among_concurrent_claimers,
            an_owner_finishing_at_once_leaves_claimers_in_flight_or_done,
            a_completed_key_replays_status_headers_and_binary_body,
            another_fingerprint_mismatches_in_flight_and_done,
            the_none_fingerprint_never_mismatches,
            a_released_key_is_claimed_afresh,
            an_owner_whose_lease_lapsed_is_fenced_off,
            a_live_lease_keeps_its_claim_across_several_lease_periods,
            leases_of_different_lengths_each_keep_their_claim,
            dropping_an_unsent_lease_frees_the_key,
            dropping_a_sent_lease_holds_its_key_as_unknown,
            a_waiter_resolves_when_the_owner_completes,
            a_waiter_resolves_when_the_owner_releases,
            a_waiter_of_a_vanished_owner_finds_its_key_held_as_unknown,
            a_waiter_of_a_vanished_owner_takes_over_after_the_grace_when_released,
            a_waiter_gives_up_at_its_deadline_while_the_owner_renews,
            a_key_held_as_unknown_is_never_owned_until_purged,
            a_lapsed_claim_held_as_unknown_is_never_taken_over,
            a_lapsed_claim_released_is_taken_over_only_after_its_grace,
            waiters_share_a_failure_and_later_claims_execute,
            a_waiter_never_owns_a_key_freed_meanwhile,
            an_answer_not_stored_is_answered_and_never_owned,
            an_owner_whose_record_vanished_writes_its_outcome_back,
            a_late_answer_settles_its_own_unknown_outcome,
            duplicates_seen_in_observe_mode_are_counted_on_their_key,
            a_done_key_is_free_again_after_its_ttl,
            a_zero_ttl_completes_without_storing,
            inspect_reports_in_flight_and_done_records,
            remove_frees_a_key_in_any_state,
            an_issued_key_is_owned_once_by_concurrent_issued_claims,
            an_issued_claim_of_a_key_never_issued_is_unknown,
            a_reissued_release_makes_the_key_claimable_again,
            hits_count_within_a_window_per_key,
        );
    };
    (@tests $factory:path; $($check:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let (store, _guard) = $factory().await;
                let store: Store = store;
                crate::checks::$check(&store).await;
            }
        )+
    };
}

/// The Redis-only checks of how waiters are woken ([`a_waited_record_completes_with_a_publish`]
/// and the next), against `$factory().await`'s store and server.
macro_rules! redis_wake_ups {
    ($factory:path) => {
        redis_wake_ups!(@tests $factory;
            a_waited_record_completes_with_a_publish,
            a_duplicate_that_will_not_wait_leaves_the_record_unmarked,
        );
    };
    (@tests $factory:path; $($check:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let (store, server) = $factory().await;
                crate::$check(&store, &server).await;
            }
        )+
    };
}

mod memory {
    use super::*;

    /// The memory store with its default bounds (sharded, far above what a check uses).
    async fn store() -> (Store, ()) {
        (
            Store::Memory(Arc::new(MemoryStore::new(MemoryLimits::default()))),
            (),
        )
    }

    store_conformance!(store);
}

/// The same contract on Redis 6.2, where `SET … NX … GET` is a syntax error: every claim
/// takes the claim script instead (the fallback `RedisStore` switches to on that error).
/// Debian ships only Redis 7.0; scripts/test builds 6.2 and names it in
/// `IDEMGATE_TEST_REDIS6`.
mod redis_6_2 {
    use super::*;

    async fn store() -> (Store, super::redis_server::RedisServer) {
        super::redis::on(super::redis_server::RedisServer::start_redis_6_2())
    }

    store_conformance!(store);

    // The first look, before the subscription, is the claim script here too; it does not
    // mark: only the look after the subscription does.
    redis_wake_ups!(store);

    /// The checks above pass only if claims work; this pins down that they went through
    /// the script, i.e. that the run tested the fallback rather than a server that took
    /// `SET … NX … GET` after all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claims_fall_back_to_the_claim_script() {
        let (store, server) = store().await;
        // Abandoned rather than released, so the only scripts run are the claims'.
        for _ in 0..3 {
            let lease =
                claim_until_owner(&store, fresh_key(), fresh_key(), Duration::from_secs(30)).await;
            lease.abandon();
        }
        let stats = server.cli(&["INFO", "commandstats"]);
        let calls = |name| command_calls(&stats, name);
        // The first claim's `SET … NX … GET` is refused (a syntax error before 7.0); after
        // that, one script per claim (EVALSHA, once refused as NOSCRIPT until loaded). On
        // Redis 7 every claim would be a `SET` and no script would run.
        let (scripts, refused) = calls("evalsha");
        assert_eq!(scripts - refused, 3, "{stats}");
        assert_eq!(calls("set").1, 1, "{stats}");
    }
}

/// The same contract on Valkey 9.1, which has `SET … IFEQ`: completions compare and swap
/// the record natively instead of running the completion script (Redis 8.4 has the same
/// option; Debian ships neither). scripts/test unpacks a valkey-server and names it in
/// `IDEMGATE_TEST_VALKEY`.
mod valkey_9 {
    use super::*;

    async fn store() -> (Store, super::redis_server::RedisServer) {
        super::redis::on(super::redis_server::RedisServer::start_valkey())
    }

    store_conformance!(store);

    /// The checks above pass with the script too; this pins down that first-seen requests
    /// ran no script at all here (claims `SET … NX … GET`, completions `SET … IFEQ`, and no
    /// `PUBLISH`, since nobody waited), and that what was swapped in replays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn completions_swap_the_record_without_a_script() {
        let (store, server) = store().await;
        let completed = complete_stamped(&store, 3).await;
        let stats = server.cli(&["INFO", "commandstats"]);
        let calls = |name| command_calls(&stats, name);
        assert_eq!(calls("set"), (6, 0), "{stats}");
        assert_eq!(calls("publish"), (0, 0), "{stats}");
        assert_eq!(calls("evalsha"), (0, 0), "{stats}");
        assert_eq!(calls("eval"), (0, 0), "{stats}");
        replays_each(&store, completed).await;
    }

    redis_wake_ups!(store);
}

#[path = "common/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

mod redis {
    use super::*;
    use idemgate::store::{RedisSettings, RedisStore};

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
    pub(super) fn connect(server: &super::redis_server::RedisServer) -> Store {
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
}

#[path = "common/unprivileged.rs"]
mod unprivileged;

#[path = "common/postgres_server.rs"]
#[allow(dead_code)]
mod postgres_server;

#[path = "common/mariadb_server.rs"]
#[allow(dead_code)]
mod mariadb_server;

/// The same contract on PostgreSQL 15 (a server shared by the checks running at once,
/// each on keys of its own): claims, settlements and renewals are PL/pgSQL functions,
/// waiters are woken by `LISTEN`/`NOTIFY`.
mod postgres {
    use super::*;
    use idemgate::store::{PostgresStore, SqlSettings};

    async fn store() -> (Store, Arc<super::postgres_server::PostgresServer>) {
        let server = super::postgres_server::shared();
        let store = PostgresStore::connect(&SqlSettings::new(server.url())).expect("store");
        (Store::Postgres(store), server)
    }

    store_conformance!(store);
}

/// The same contract on MariaDB 10.11 (MySQL's protocol and procedures): waiters in
/// another process are woken by a bounded re-check, in this one by the settlement.
mod mariadb {
    use super::*;
    use idemgate::store::{MysqlStore, SqlSettings};

    async fn store() -> (Store, Arc<super::mariadb_server::MariadbServer>) {
        let server = super::mariadb_server::shared();
        let store = MysqlStore::connect(&SqlSettings::new(server.url())).expect("store");
        (Store::Mysql(store), server)
    }

    store_conformance!(store);
}

/// Completions publish only for a record a duplicate waits on, so a waiter must subscribe
/// and then mark the record before it waits. With the owner on one store and two waiters
/// on another (two replicas): the mark (one byte after the 66 of the in-flight record)
/// appears once, the channel has its subscriber before the completion, the completion
/// publishes once, wakes both waiters and stores the answer. Without the mark the swap
/// would match and publish nothing, and the waiters would sit until their fallback
/// re-check.
async fn a_waited_record_completes_with_a_publish(
    owner: &Store,
    server: &redis_server::RedisServer,
) {
    let replica = redis::connect(server);
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
async fn a_duplicate_that_will_not_wait_leaves_the_record_unmarked(
    owner: &Store,
    server: &redis_server::RedisServer,
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

// === Fixtures and helpers ===

/// `(calls, failed_calls)` of one command in `INFO commandstats` output, whose lines read
/// `cmdstat_<name>:calls=N,…,failed_calls=F,…`; (0, 0) for a command never called.
fn command_calls(stats: &str, name: &str) -> (u64, u64) {
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
async fn complete_stamped(store: &Store, n: usize) -> Vec<(Digest, Digest, StoredResponse)> {
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
async fn replays_each(store: &Store, completed: Vec<(Digest, Digest, StoredResponse)>) {
    for (k, fp, stored) in completed {
        let replay = expect_done(claim(store, k, fp, LONG_LEASE).await);
        assert_same_response(&replay, &stored);
    }
}

/// How long any awaited condition may take before the check fails as hung.
const HANG_GUARD: Duration = Duration::from_secs(10);
/// A lease no check outlives: ownership never lapses by accident.
const LONG_LEASE: Duration = Duration::from_secs(30);
/// A lease meant to run out within a check.
const SHORT_LEASE: Duration = Duration::from_millis(300);
/// A TTL no check outlives.
const LONG_TTL: Duration = Duration::from_secs(3600);
/// Pause between re-claims while waiting for a condition.
const POLL: Duration = Duration::from_millis(20);

/// A store key: SHA-256 of `n` and a per-run salt, so runs against a shared server do not
/// collide with leftovers of earlier runs.
fn key(n: u64) -> Digest {
    static SALT: OnceLock<u64> = OnceLock::new();
    let salt = *SALT.get_or_init(rand::random::<u64>);
    let mut h = Sha256::new();
    h.update(b"idemgate conformance key");
    h.update(salt.to_le_bytes());
    h.update(n.to_le_bytes());
    Digest(h.finalize().into())
}

/// A key no other check in this run uses.
fn fresh_key() -> Digest {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    key(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A payload fingerprint (never [`Digest::NONE`]).
fn fingerprint(n: u64) -> Digest {
    let mut h = Sha256::new();
    h.update(b"idemgate conformance fingerprint");
    h.update(n.to_le_bytes());
    Digest(h.finalize().into())
}

/// A body with every byte value, NULs and invalid UTF-8 included.
fn binary_body() -> Vec<u8> {
    (0..=255u8).chain([0, 0, 0xff, 0xc3, 0x28]).collect()
}

/// A 201 with two `Set-Cookie` values (order matters) and a content type.
fn response(body: &[u8]) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.append(SET_COOKIE, HeaderValue::from_static("session=abc; Path=/"));
    headers.append(SET_COOKIE, HeaderValue::from_static("theme=dark"));
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    StoredResponse::new(StatusCode::CREATED, &headers, body)
}

/// Compares what a replay would send. Not `==`: `stored_at` may lose precision in a
/// backend's encoding.
fn assert_same_response(got: &StoredResponse, want: &StoredResponse) {
    assert_eq!(got.status(), want.status());
    assert_eq!(got.headers(), want.headers());
    let cookies: Vec<_> = got.headers().get_all(SET_COOKIE).iter().cloned().collect();
    assert_eq!(cookies, ["session=abc; Path=/", "theme=dark"]);
    assert_eq!(got.body(), want.body());
}

async fn claim(store: &Store, key: Digest, fp: Digest, lease: Duration) -> Claim {
    store.claim(key, fp, lease).await.expect("claim failed")
}

fn expect_owner(claim: Claim) -> Lease {
    match claim {
        Claim::Owner(lease) => lease,
        other => panic!("expected owner, got {}", other.as_str()),
    }
}

fn expect_in_flight(claim: Claim) -> idemgate::store::Waiter {
    match claim {
        Claim::InFlight(waiter) => waiter,
        other => panic!("expected in_flight, got {}", other.as_str()),
    }
}

fn expect_done(claim: Claim) -> StoredResponse {
    match claim {
        Claim::Done(response) => response,
        other => panic!("expected done, got {}", other.as_str()),
    }
}

fn expect_mismatch(claim: Claim) {
    if !matches!(claim, Claim::Mismatch) {
        panic!("expected mismatch, got {}", claim.as_str());
    }
}

/// Claims a fresh key and completes it with `body`, for tests that need done records.
async fn complete_fresh(store: &Store, body: &[u8], ttl: Duration) -> Digest {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(lease.complete(response(body), ttl).await.expect("complete"));
    k
}

/// Runs `f`, failing the check if it has not finished within [`HANG_GUARD`].
async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, f)
        .await
        .unwrap_or_else(|_| panic!("hang guard: {what} within {HANG_GUARD:?}"))
}

/// Claims until this request owns `key`: the key must become free (released, expired,
/// or its owner's lease run out).
async fn claim_until_owner(store: &Store, key: Digest, fp: Digest, lease: Duration) -> Lease {
    claim_until_owner_with(store, ClaimArgs::new(key, fp, lease)).await
}

/// [`claim_until_owner`] with these claim arguments.
async fn claim_until_owner_with(store: &Store, args: ClaimArgs) -> Lease {
    within("the key to become free", async {
        loop {
            match store.claim_with(args).await.expect("claim failed") {
                Claim::Owner(lease) => return lease,
                Claim::InFlight(waiter) => {
                    waiter.wait(Instant::now() + POLL).await;
                }
                Claim::Done(_) => tokio::time::sleep(POLL).await,
                other => panic!(
                    "unexpected {} while waiting for {:?}",
                    other.as_str(),
                    args.key
                ),
            }
        }
    })
    .await
}

/// Claims until the claim is answered with anything but "in flight", and returns that.
async fn claim_until_settled(store: &Store, args: ClaimArgs) -> Claim {
    within("the key to settle", async {
        loop {
            match store.claim_with(args).await.expect("claim failed") {
                Claim::InFlight(waiter) => {
                    waiter.wait(Instant::now() + POLL).await;
                }
                other => return other,
            }
        }
    })
    .await
}

/// Claims `args.key` as an owner that then vanishes without a trace but its ownership,
/// like a process that crashed or froze after claiming: it never renews and never settles.
///
/// [`Lease::abandon`] does exactly that (`std::mem::forget` would not: it skips the
/// settlement in `Drop`, but a forgotten lease still renews, or on the memory store still
/// holds its claim's liveness, so it would be a live owner, not a vanished one). The
/// ownership stays valid for checking that the stale owner, should it wake up, is fenced
/// off.
async fn claim_abandoned_with(store: &Store, args: ClaimArgs) -> Ownership {
    let owner = expect_owner(store.claim_with(args).await.expect("claim"));
    let owned = Ownership {
        key: args.key,
        token: owner.token(),
        fingerprint: args.fingerprint,
        lapse: args.lapse,
    };
    owner.abandon();
    owned
}

/// A claim whose lapse is taken over `grace` after the lease ran out.
fn releasing(key: Digest, fp: Digest, lease: Duration, grace: Duration) -> ClaimArgs {
    ClaimArgs {
        lapse: Lapse::Release { grace },
        ..ClaimArgs::new(key, fp, lease)
    }
}

/// A claim whose lapse is held as unknown for an hour.
fn holding(key: Digest, fp: Digest, lease: Duration) -> ClaimArgs {
    ClaimArgs {
        lapse: Lapse::Hold { ttl: LONG_TTL },
        ..ClaimArgs::new(key, fp, lease)
    }
}

/// A 502 as a failed owner's waiters get it.
fn failure_response() -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    StoredResponse::new(StatusCode::BAD_GATEWAY, &headers, b"the owner failed")
}

// === The contract ===

/// One-time tokens: issue, then consume atomically (see `Store::issue`, `ClaimMode`).
mod token_checks {
    use super::*;

    async fn claim_issued(store: &Store, key: Digest) -> Claim {
        store
            .claim_with(ClaimArgs {
                mode: ClaimMode::IssuedOnly,
                ..ClaimArgs::new(key, Digest::NONE, LONG_LEASE)
            })
            .await
            .expect("claim")
    }

    pub async fn an_issued_key_is_owned_once_by_concurrent_issued_claims(store: &Store) {
        let key = fresh_key();
        store.issue(key, LONG_TTL).await.unwrap();
        let mut tasks = Vec::new();
        for _ in 0..100 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move { claim_issued(&store, key).await }));
        }
        let mut owners = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Claim::Owner(lease) => owners.push(lease),
                Claim::InFlight(_) | Claim::Done(_) => {}
                other => panic!("an issued key answered {}", other.as_str()),
            }
        }
        assert_eq!(owners.len(), 1, "issue and consume are one atomic step");
        let lease = owners.pop().unwrap();
        assert!(lease.complete(response(b"paid"), LONG_TTL).await.unwrap());
        expect_done(claim_issued(store, key).await);
    }

    pub async fn an_issued_claim_of_a_key_never_issued_is_unknown(store: &Store) {
        assert_eq!(
            claim_issued(store, fresh_key()).await.as_str(),
            "not_issued"
        );
        // An ordinary claim of the same kind of key is unaffected.
        let lease = expect_owner(claim(store, fresh_key(), Digest::NONE, LONG_LEASE).await);
        assert!(lease.release().await.unwrap());
    }

    pub async fn a_reissued_release_makes_the_key_claimable_again(store: &Store) {
        let key = fresh_key();
        store.issue(key, LONG_TTL).await.unwrap();
        let lease = expect_owner(claim_issued(store, key).await);
        let reissue = Settlement::Release {
            reissue: Some(LONG_TTL),
        };
        assert_eq!(lease.settle(reissue).await.unwrap(), Settled::Written);
        let again = expect_owner(claim_issued(store, key).await);
        assert!(again.release().await.unwrap());
        assert_eq!(
            claim_issued(store, key).await.as_str(),
            "not_issued",
            "spent after a plain release"
        );
    }

    pub async fn hits_count_within_a_window_per_key(store: &Store) {
        let (a, b) = (fresh_key(), fresh_key());
        for n in 1..=3 {
            assert_eq!(store.hit(a, LONG_TTL).await.unwrap(), n);
        }
        assert_eq!(store.hit(b, LONG_TTL).await.unwrap(), 1);
    }
}

/// One function per behaviour of the store contract; see [`store_conformance!`].
mod checks {
    pub use super::token_checks::*;
    use super::*;

    const CLAIMERS: usize = 200;

    /// Of 200 simultaneous claims of a free key exactly one owns it; the owner holds its
    /// lease until every claim has answered, so all others must see it in flight.
    pub async fn a_free_key_has_exactly_one_owner_among_concurrent_claimers(store: &Store) {
        let k = fresh_key();
        let start = Arc::new(tokio::sync::Barrier::new(CLAIMERS));
        let tasks: Vec<_> = (0..CLAIMERS)
            .map(|_| {
                let (store, start) = (store.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    claim(&store, k, fingerprint(1), LONG_LEASE).await
                })
            })
            .collect();
        let (mut owners, mut in_flight) = (Vec::new(), 0);
        for task in tasks {
            match within("a claim", task).await.expect("claimer panicked") {
                Claim::Owner(lease) => owners.push(lease),
                Claim::InFlight(_) => in_flight += 1,
                other => panic!("unexpected {}", other.as_str()),
            }
        }
        assert_eq!(owners.len(), 1, "owners of one key");
        assert_eq!(in_flight, CLAIMERS - 1);
        for lease in owners {
            assert!(lease.release().await.unwrap());
        }
    }

    /// Same race, but the owner completes as soon as it wins: nobody may become a second
    /// owner of the completed key; the rest see it in flight or done.
    pub async fn an_owner_finishing_at_once_leaves_claimers_in_flight_or_done(store: &Store) {
        let k = fresh_key();
        let start = Arc::new(tokio::sync::Barrier::new(CLAIMERS));
        let tasks: Vec<_> = (0..CLAIMERS)
            .map(|_| {
                let (store, start) = (store.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    match claim(&store, k, fingerprint(1), LONG_LEASE).await {
                        Claim::Owner(lease) => {
                            assert!(lease.complete(response(b"once"), LONG_TTL).await.unwrap());
                            "owner"
                        }
                        Claim::Done(stored) => {
                            assert_same_response(&stored, &response(b"once"));
                            "done"
                        }
                        other => other.as_str(),
                    }
                })
            })
            .collect();
        let mut owners = 0;
        for task in tasks {
            match within("a claim", task).await.expect("claimer panicked") {
                "owner" => owners += 1,
                "done" | "in_flight" => {}
                other => panic!("unexpected {other}"),
            }
        }
        assert_eq!(owners, 1, "owners of one key");
        expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await);
    }

    /// Complete stores status, repeated headers in order and a binary body; every later
    /// claim replays exactly that.
    pub async fn a_completed_key_replays_status_headers_and_binary_body(store: &Store) {
        let k = fresh_key();
        let want = response(&binary_body());
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(lease.complete(want.clone(), LONG_TTL).await.unwrap());
        for _ in 0..2 {
            let got = expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await);
            assert_same_response(&got, &want);
        }
    }

    /// A claim with another payload's fingerprint is a mismatch, while the first request
    /// runs and after it is done; the original fingerprint still gets its answers.
    pub async fn another_fingerprint_mismatches_in_flight_and_done(store: &Store) {
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        expect_mismatch(claim(store, k, fingerprint(2), LONG_LEASE).await);
        expect_in_flight(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(lease.complete(response(b"a"), LONG_TTL).await.unwrap());
        expect_mismatch(claim(store, k, fingerprint(2), LONG_LEASE).await);
        expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await);
    }

    /// `Digest::NONE` means "nothing to compare" on either side: no mismatch.
    pub async fn the_none_fingerprint_never_mismatches(store: &Store) {
        // Stored with a fingerprint, offered without one.
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        expect_in_flight(claim(store, k, Digest::NONE, LONG_LEASE).await);
        assert!(lease.complete(response(b"a"), LONG_TTL).await.unwrap());
        expect_done(claim(store, k, Digest::NONE, LONG_LEASE).await);

        // Stored without a fingerprint, offered with any.
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, Digest::NONE, LONG_LEASE).await);
        expect_in_flight(claim(store, k, fingerprint(2), LONG_LEASE).await);
        assert!(lease.complete(response(b"b"), LONG_TTL).await.unwrap());
        expect_done(claim(store, k, fingerprint(2), LONG_LEASE).await);
        expect_done(claim(store, k, fingerprint(3), LONG_LEASE).await);
    }

    /// Release frees the key at once: the next claim executes again.
    pub async fn a_released_key_is_claimed_afresh(store: &Store) {
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(lease.release().await.unwrap());
        let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(again.release().await.unwrap());
    }

    /// Owner A vanishes (no renewals); its claim lapses, and, released after a short
    /// grace, B takes over. A, waking up, can settle nothing: each settlement answers
    /// `NotWritten` and B's record is untouched; B completes normally.
    pub async fn an_owner_whose_lease_lapsed_is_fenced_off(store: &Store) {
        let k = fresh_key();
        let args = releasing(k, fingerprint(1), SHORT_LEASE, SHORT_LEASE);
        let a = claim_abandoned_with(store, args).await;
        let b = claim_until_owner_with(store, args).await;
        assert_ne!(a.token, b.token());

        // Stamped with the claim's fingerprint as the proxy does, so a store comparing the
        // whole in-flight record (`SET … IFEQ`) gets as far as comparing the token.
        let stale = response(b"from the stale owner").with_fingerprint(fingerprint(1));
        for settlement in [
            Settlement::Done {
                response: stale,
                ttl: LONG_TTL,
            },
            Settlement::Unknown { ttl: LONG_TTL },
            Settlement::Failed {
                response: failure_response(),
                linger: LONG_TTL,
                reissue: None,
            },
            Settlement::Release { reissue: None },
        ] {
            let what = settlement.as_str();
            let settled = store.settle(&a, settlement).await.unwrap();
            assert_eq!(settled, Settled::NotWritten, "stale {what}");
        }

        // B still owns the key: in flight, nothing stored.
        expect_in_flight(claim(store, k, fingerprint(1), LONG_LEASE).await);
        let info = store.inspect(k).await.unwrap().expect("B's record");
        assert_eq!(info.state, "in_flight");
        assert!(info.response.is_none());

        let want = response(b"from the new owner");
        assert!(b.complete(want.clone(), LONG_TTL).await.unwrap());
        let got = expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert_same_response(&got, &want);
    }

    /// A held lease keeps its claim (renewed in the background on Redis, held alive by the
    /// lease on the memory store): after about three lease periods the key is still in
    /// flight for everyone else, and the owner can still complete.
    ///
    /// The lease is long enough (renewal every 300ms) that only a renewer that stopped
    /// working, not a busy machine, lets it lapse.
    pub async fn a_live_lease_keeps_its_claim_across_several_lease_periods(store: &Store) {
        const LEASE: Duration = Duration::from_millis(900);
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LEASE).await);
        for _ in 0..9 {
            tokio::time::sleep(LEASE / 3).await;
            expect_in_flight(claim(store, k, fingerprint(1), LEASE).await);
        }
        assert!(lease.complete(response(b"slow"), LONG_TTL).await.unwrap());
        expect_done(claim(store, k, fingerprint(1), LEASE).await);
    }

    /// Leases of different lengths held together each keep their claim: a short lease
    /// taken while a long one is held is renewed at its own pace. (On Redis one task
    /// renews every claim of a store and sleeps until the next is due; a claim due before
    /// that must wake it.)
    pub async fn leases_of_different_lengths_each_keep_their_claim(store: &Store) {
        const SHORT: Duration = Duration::from_millis(900);
        let (long_key, short_key) = (fresh_key(), fresh_key());
        let long = expect_owner(claim(store, long_key, fingerprint(1), LONG_LEASE).await);
        // Time for the renewer to plan its next wake-up by the long lease alone.
        tokio::time::sleep(SHORT / 3).await;
        let short = expect_owner(claim(store, short_key, fingerprint(1), SHORT).await);
        for _ in 0..6 {
            tokio::time::sleep(SHORT / 3).await;
            expect_in_flight(claim(store, short_key, fingerprint(1), SHORT).await);
        }
        assert!(short.complete(response(b"short"), LONG_TTL).await.unwrap());
        assert!(long.complete(response(b"long"), LONG_TTL).await.unwrap());
        expect_done(claim(store, short_key, fingerprint(1), SHORT).await);
        expect_done(claim(store, long_key, fingerprint(1), SHORT).await);
    }

    /// A lease dropped unsettled before its request went out (a cancelled owner) frees
    /// the key long before its lease would have run out.
    pub async fn dropping_an_unsent_lease_frees_the_key(store: &Store) {
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        drop(lease);
        let again = claim_until_owner(store, k, fingerprint(1), LONG_LEASE).await;
        assert!(again.release().await.unwrap());
    }

    /// A lease dropped unsettled after its request went out (an owner that panicked, or
    /// gave up waiting) may have executed it: the key is held as unknown, never freed.
    pub async fn dropping_a_sent_lease_holds_its_key_as_unknown(store: &Store) {
        let k = fresh_key();
        let args = holding(k, fingerprint(1), LONG_LEASE);
        let mut lease = expect_owner(store.claim_with(args).await.unwrap());
        lease.mark_sent();
        drop(lease);
        match claim_until_settled(store, args).await {
            Claim::OutcomeUnknown(_) => {}
            other => panic!("expected outcome_unknown, got {}", other.as_str()),
        }
        assert_eq!(
            store.inspect(k).await.unwrap().expect("a record").state,
            "outcome_unknown"
        );
    }

    /// A duplicate waiting on an in-flight key is woken by completion and then finds the
    /// answer. (The lease outlives the deadline, so only the wake-up can return `true`.)
    pub async fn a_waiter_resolves_when_the_owner_completes(store: &Store) {
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        let waiter = expect_in_flight(claim(store, k, fingerprint(1), LONG_LEASE).await);
        let waiting = tokio::spawn(waiter.wait(Instant::now() + HANG_GUARD));
        assert!(lease.complete(response(b"a"), LONG_TTL).await.unwrap());
        assert!(waiting.await.unwrap(), "the waiter hit its deadline");
        expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await);
    }

    /// A waiter is woken by release too, and the key is then free.
    pub async fn a_waiter_resolves_when_the_owner_releases(store: &Store) {
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        let waiter = expect_in_flight(claim(store, k, fingerprint(1), LONG_LEASE).await);
        let waiting = tokio::spawn(waiter.wait(Instant::now() + HANG_GUARD));
        assert!(lease.release().await.unwrap());
        assert!(waiting.await.unwrap(), "the waiter hit its deadline");
        let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(again.release().await.unwrap());
    }

    /// A waiter does not wait past the lease of an owner that vanished: it resolves before
    /// its (much later) deadline, and, the claim being held, finds the key's outcome
    /// unknown rather than taking a turn of its own.
    pub async fn a_waiter_of_a_vanished_owner_finds_its_key_held_as_unknown(store: &Store) {
        let k = fresh_key();
        let args = holding(k, fingerprint(1), SHORT_LEASE);
        claim_abandoned_with(store, args).await;
        let waiter = expect_in_flight(store.claim_with(args).await.unwrap());
        let owner = waiter.owner();
        assert!(
            waiter.wait(Instant::now() + HANG_GUARD).await,
            "the waiter hit its deadline"
        );
        let again = ClaimArgs {
            after: owner,
            ..args
        };
        match claim_until_settled(store, again).await {
            Claim::OutcomeUnknown(_) => {}
            other => panic!("expected outcome_unknown, got {}", other.as_str()),
        }
    }

    /// Released on lapse, the vanished owner's claim is taken over once its grace has
    /// passed too.
    pub async fn a_waiter_of_a_vanished_owner_takes_over_after_the_grace_when_released(
        store: &Store,
    ) {
        let k = fresh_key();
        let args = releasing(k, fingerprint(1), SHORT_LEASE, SHORT_LEASE);
        claim_abandoned_with(store, args).await;
        let waiter = expect_in_flight(store.claim_with(args).await.unwrap());
        assert!(
            waiter.wait(Instant::now() + HANG_GUARD).await,
            "the waiter hit its deadline"
        );
        let b = claim_until_owner_with(store, args).await;
        assert!(b.release().await.unwrap());
    }

    /// With the owner alive and renewing (one renewal falls before the deadline), a
    /// waiter whose deadline comes first returns `false`; the key is still in flight.
    pub async fn a_waiter_gives_up_at_its_deadline_while_the_owner_renews(store: &Store) {
        const LEASE: Duration = Duration::from_millis(600);
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LEASE).await);
        let waiter = expect_in_flight(claim(store, k, fingerprint(1), LEASE).await);
        let resolved = within(
            "the waiter's deadline",
            waiter.wait(Instant::now() + Duration::from_millis(300)),
        )
        .await;
        assert!(!resolved, "the waiter resolved while the owner was running");
        expect_in_flight(claim(store, k, fingerprint(1), LEASE).await);
        assert!(lease.release().await.unwrap());
    }

    /// An unknown outcome answers every claim as such (with its end in the future) and
    /// is never owned; another payload is still a mismatch; the admin purge frees it.
    pub async fn a_key_held_as_unknown_is_never_owned_until_purged(store: &Store) {
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        let settled = lease
            .settle(Settlement::Unknown { ttl: LONG_TTL })
            .await
            .unwrap();
        assert_eq!(settled, Settled::Written);
        for _ in 0..3 {
            match claim(store, k, fingerprint(1), LONG_LEASE).await {
                Claim::OutcomeUnknown(unknown) => {
                    assert!(unknown.until > std::time::SystemTime::now())
                }
                other => panic!("expected outcome_unknown, got {}", other.as_str()),
            }
        }
        expect_mismatch(claim(store, k, fingerprint(2), LONG_LEASE).await);
        let info = store.inspect(k).await.unwrap().expect("a record");
        assert_eq!(info.state, "outcome_unknown");
        assert!(store.remove(k).await.unwrap());
        let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(again.release().await.unwrap());
    }

    /// A claim whose owner vanished, held on lapse, becomes an unknown outcome: many
    /// claims after the lapse, none owns it.
    pub async fn a_lapsed_claim_held_as_unknown_is_never_taken_over(store: &Store) {
        let k = fresh_key();
        let args = holding(k, fingerprint(1), SHORT_LEASE);
        claim_abandoned_with(store, args).await;
        match claim_until_settled(store, args).await {
            Claim::OutcomeUnknown(_) => {}
            other => panic!("expected outcome_unknown, got {}", other.as_str()),
        }
        for _ in 0..20 {
            let claim = store.claim_with(args).await.unwrap();
            assert!(
                matches!(claim, Claim::OutcomeUnknown(_)),
                "got {}",
                claim.as_str()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Released on lapse, a vanished owner's claim is taken over, but never before its
    /// lease and its grace have both passed since it was taken (the dead owner's call may
    /// run until then). Slowness can only delay the takeover, never make this fail.
    pub async fn a_lapsed_claim_released_is_taken_over_only_after_its_grace(store: &Store) {
        let k = fresh_key();
        let grace = Duration::from_millis(600);
        let args = releasing(k, fingerprint(1), SHORT_LEASE, grace);
        let taken = Instant::now();
        claim_abandoned_with(store, args).await;
        let b = claim_until_owner_with(store, args).await;
        assert!(
            taken.elapsed() >= SHORT_LEASE + grace,
            "taken over after {:?}",
            taken.elapsed()
        );
        assert!(b.release().await.unwrap());
    }

    /// The waiters of an owner that failed get its failure instead of a turn of their own;
    /// a request that comes afterwards (no owner waited on) executes.
    pub async fn waiters_share_a_failure_and_later_claims_execute(store: &Store) {
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    let waiter =
                        expect_in_flight(claim(&store, k, fingerprint(1), LONG_LEASE).await);
                    let owner = waiter.owner();
                    (owner, waiter)
                })
            })
            .collect();
        let mut woken = Vec::new();
        for w in waiters {
            let (owner, waiter) = w.await.unwrap();
            assert_eq!(owner, Some(lease.token()));
            woken.push(tokio::spawn(async move {
                (owner, waiter.wait(Instant::now() + HANG_GUARD).await)
            }));
        }
        let failed = Settlement::Failed {
            response: failure_response(),
            linger: LONG_TTL,
            reissue: None,
        };
        assert_eq!(lease.settle(failed).await.unwrap(), Settled::Written);
        for w in woken {
            let (owner, resolved) = w.await.unwrap();
            assert!(resolved, "a waiter hit its deadline");
            let after = ClaimArgs {
                after: owner,
                ..ClaimArgs::new(k, fingerprint(1), LONG_LEASE)
            };
            match store.claim_with(after).await.unwrap() {
                Claim::Failed(Some(got)) => {
                    assert_eq!(got.status(), StatusCode::BAD_GATEWAY);
                    assert_eq!(&got.body()[..], b"the owner failed");
                }
                other => panic!("expected the owner's failure, got {}", other.as_str()),
            }
        }
        let inspected = store.inspect(k).await.unwrap().expect("a record");
        assert_eq!(inspected.state, "failed");
        let later = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(later.release().await.unwrap());
    }

    /// A waiter whose owner settled without leaving it anything (a plain release) is told
    /// so; it never takes the freed key itself.
    pub async fn a_waiter_never_owns_a_key_freed_meanwhile(store: &Store) {
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        let waiter = expect_in_flight(claim(store, k, fingerprint(1), LONG_LEASE).await);
        let after = ClaimArgs {
            after: waiter.owner(),
            ..ClaimArgs::new(k, fingerprint(1), LONG_LEASE)
        };
        assert!(lease.release().await.unwrap());
        match store.claim_with(after).await.unwrap() {
            Claim::Failed(None) => {}
            other => panic!("expected failed without an answer, got {}", other.as_str()),
        }
        let later = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(later.release().await.unwrap());
    }

    /// "Executed, answer not stored" answers every claim with the status, never owned.
    pub async fn an_answer_not_stored_is_answered_and_never_owned(store: &Store) {
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        let not_stored = Settlement::NotStored {
            status: StatusCode::OK,
            ttl: LONG_TTL,
        };
        assert_eq!(lease.settle(not_stored).await.unwrap(), Settled::Written);
        for _ in 0..2 {
            match claim(store, k, fingerprint(1), LONG_LEASE).await {
                Claim::NotStored(record) => assert_eq!(record.status, StatusCode::OK),
                other => panic!("expected not_stored, got {}", other.as_str()),
            }
        }
        expect_mismatch(claim(store, k, fingerprint(2), LONG_LEASE).await);
        let info = store.inspect(k).await.unwrap().expect("a record");
        assert_eq!(
            (info.state, info.status),
            ("not_stored", Some(StatusCode::OK))
        );
    }

    /// A store that lost an owner's record (purged here; a restarted Redis alike) is not a
    /// licence to re-run: the owner's answer, or its unknown outcome, is written back; a
    /// release has nothing to write.
    pub async fn an_owner_whose_record_vanished_writes_its_outcome_back(store: &Store) {
        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(store.remove(k).await.unwrap());
        let want = response(b"written back");
        let done = Settlement::Done {
            response: want.clone(),
            ttl: LONG_TTL,
        };
        assert_eq!(lease.settle(done).await.unwrap(), Settled::WrittenBack);
        assert_same_response(
            &expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await),
            &want,
        );

        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(store.remove(k).await.unwrap());
        let unknown = Settlement::Unknown { ttl: LONG_TTL };
        assert_eq!(lease.settle(unknown).await.unwrap(), Settled::WrittenBack);
        let held = claim(store, k, fingerprint(1), LONG_LEASE).await;
        assert!(
            matches!(held, Claim::OutcomeUnknown(_)),
            "got {}",
            held.as_str()
        );

        let k = fresh_key();
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(store.remove(k).await.unwrap());
        assert!(lease.release().await.unwrap());
        assert!(store.inspect(k).await.unwrap().is_none());
    }

    /// The owner of a key it settled as unknown (its answer was late) may still settle it
    /// with the answer, which every claim then replays.
    pub async fn a_late_answer_settles_its_own_unknown_outcome(store: &Store) {
        let k = fresh_key();
        let owned = claim_abandoned_with(store, holding(k, fingerprint(1), LONG_LEASE)).await;
        let unknown = Settlement::Unknown { ttl: LONG_TTL };
        assert_eq!(
            store.settle(&owned, unknown).await.unwrap(),
            Settled::Written
        );
        let want = response(b"late");
        let done = Settlement::Done {
            response: want.clone(),
            ttl: LONG_TTL,
        };
        assert_eq!(store.settle(&owned, done).await.unwrap(), Settled::Written);
        assert_same_response(
            &expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await),
            &want,
        );
    }

    /// Observe mode counts the duplicates a key sees while it has a record (the first
    /// request counts as one), and learns when that record was made; a key with no
    /// record counts nothing, and a purge forgets the count.
    pub async fn duplicates_seen_in_observe_mode_are_counted_on_their_key(store: &Store) {
        let k = fresh_key();
        assert_eq!(
            store.saw_duplicate(k).await.unwrap(),
            None,
            "no record, no count"
        );
        let before = std::time::SystemTime::now() - Duration::from_secs(1);
        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        let made = store
            .saw_duplicate(k)
            .await
            .unwrap()
            .expect("the claim's time");
        assert!(made >= before, "{made:?}");
        assert!(lease.complete(response(b"a"), LONG_TTL).await.unwrap());
        assert!(store.saw_duplicate(k).await.unwrap().is_some());
        let seen = store.inspect(k).await.unwrap().expect("a record").seen;
        assert_eq!(seen.map(|s| s.times), Some(3), "{seen:?}");
        assert!(store.remove(k).await.unwrap());
        assert!(store.inspect(k).await.unwrap().is_none());
        let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert_eq!(store.inspect(k).await.unwrap().expect("a claim").seen, None);
        assert!(again.release().await.unwrap());
    }

    /// A done record expires with its TTL: the key eventually executes again.
    pub async fn a_done_key_is_free_again_after_its_ttl(store: &Store) {
        let k = complete_fresh(store, b"short-lived", Duration::from_millis(200)).await;
        let again = claim_until_owner(store, k, fingerprint(1), LONG_LEASE).await;
        assert!(again.release().await.unwrap());
    }

    /// A zero TTL completes (the owner did own the key) but stores nothing.
    pub async fn a_zero_ttl_completes_without_storing(store: &Store) {
        let k = complete_fresh(store, b"not kept", Duration::ZERO).await;
        assert!(store.inspect(k).await.unwrap().is_none());
        let again = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(again.release().await.unwrap());
    }

    /// Inspect shows nothing for an unknown key, an in-flight record without a response,
    /// and a done record with it; it claims nothing.
    pub async fn inspect_reports_in_flight_and_done_records(store: &Store) {
        let k = fresh_key();
        assert!(store.inspect(k).await.unwrap().is_none());

        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        let info = store.inspect(k).await.unwrap().expect("in-flight record");
        assert_eq!(info.state, "in_flight");
        assert!(info.response.is_none());

        let want = response(&binary_body());
        assert!(lease.complete(want.clone(), LONG_TTL).await.unwrap());
        let info = store.inspect(k).await.unwrap().expect("done record");
        assert_eq!(info.state, "done");
        assert_same_response(&info.response.expect("stored response"), &want);
        // Inspecting did not consume or change anything.
        let got = expect_done(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert_same_response(&got, &want);
    }

    /// Remove deletes a done or an in-flight record; the removed owner is fenced off.
    pub async fn remove_frees_a_key_in_any_state(store: &Store) {
        let k = fresh_key();
        assert!(!store.remove(k).await.unwrap(), "removed an unknown key");

        let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(lease.complete(response(b"a"), LONG_TTL).await.unwrap());
        assert!(store.remove(k).await.unwrap());
        assert!(store.inspect(k).await.unwrap().is_none());

        let removed = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(store.remove(k).await.unwrap());
        let current = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(!removed
            .complete(response(b"stale"), LONG_TTL)
            .await
            .unwrap());
        expect_in_flight(claim(store, k, fingerprint(1), LONG_LEASE).await);
        assert!(current.release().await.unwrap());
    }
}

// === Memory store bounds (backend specific) ===

/// `max_entries` and `max_bytes` of the memory store. Bounds below 1024 entries use one
/// shard, so these are exact; [`sharded_bounds_hold_for_the_configured_totals`] covers the
/// sharded case.
mod memory_bounds {
    use super::*;

    fn store(max_entries: usize, max_bytes: usize) -> Store {
        Store::Memory(Arc::new(MemoryStore::new(MemoryLimits {
            max_entries,
            max_bytes,
            ..MemoryLimits::default()
        })))
    }

    /// Filling a store that holds in-flight claims with done records evicts done records
    /// only: the count stays within `max_entries` and every held key is still in flight.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn eviction_takes_done_records_and_never_in_flight_ones() {
        const MAX: usize = 64;
        let store = store(MAX, 1 << 40);
        let mut held = Vec::new();
        for _ in 0..8 {
            let k = fresh_key();
            held.push((
                k,
                expect_owner(claim(&store, k, fingerprint(1), LONG_LEASE).await),
            ));
        }
        let mut last = None;
        for _ in 0..MAX * 4 {
            last = Some(complete_fresh(&store, b"done", LONG_TTL).await);
            assert!(store.stats().entries <= MAX, "{:?}", store.stats());
        }
        assert_eq!(store.stats().in_flight, held.len());
        for (k, _) in &held {
            expect_in_flight(claim(&store, *k, fingerprint(1), LONG_LEASE).await);
        }
        expect_done(claim(&store, last.unwrap(), fingerprint(1), LONG_LEASE).await);
        for (_, lease) in held {
            assert!(lease.release().await.unwrap());
        }
        assert_eq!(store.stats().in_flight, 0);
    }

    /// When every slot holds an in-flight claim nothing may be evicted: a new key is
    /// refused with `Full`, held keys still answer in flight, and a release makes room.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_full_of_in_flight_claims_refuses_new_keys() {
        const MAX: usize = 16;
        let store = store(MAX, 1 << 40);
        let mut held = Vec::new();
        for _ in 0..MAX {
            let k = fresh_key();
            held.push((
                k,
                expect_owner(claim(&store, k, fingerprint(1), LONG_LEASE).await),
            ));
        }
        let refused = store.claim(fresh_key(), fingerprint(1), LONG_LEASE).await;
        assert!(
            matches!(refused, Err(StoreError::Full)),
            "expected Full, got {:?}",
            refused.map(|c| c.as_str())
        );
        expect_in_flight(claim(&store, held[0].0, fingerprint(1), LONG_LEASE).await);

        let (_, lease) = held.pop().unwrap();
        assert!(lease.release().await.unwrap());
        let newcomer = expect_owner(claim(&store, fresh_key(), fingerprint(1), LONG_LEASE).await);
        assert!(newcomer.release().await.unwrap());
    }

    /// The byte budget is a total, not a per-shard share: with 64 shards, an answer larger
    /// than a sixty-fourth of `max_bytes` (but within it) is still stored and replayed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_large_answer_may_use_most_of_the_byte_budget() {
        let store = store(100_000, 1 << 20);
        let body = vec![9u8; 600 * 1024];
        for _ in 0..20 {
            complete_fresh(&store, &[1; 100], LONG_TTL).await;
        }
        let big = complete_fresh(&store, &body, LONG_TTL).await;
        let replay = expect_done(claim(&store, big, fingerprint(1), LONG_LEASE).await);
        assert_eq!(replay.body().len(), body.len());
        assert!(store.stats().bytes <= 1 << 20, "{:?}", store.stats());
    }

    /// Done records are evicted to keep their accounted bytes within `max_bytes`, and the
    /// newest answer is kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn max_bytes_bounds_the_bytes_held() {
        let cost = response(&[7; 100]).cost();
        let max_bytes = 10 * cost + cost / 2;
        let store = store(1000, max_bytes);
        let mut last = None;
        for _ in 0..50 {
            last = Some(complete_fresh(&store, &[7; 100], LONG_TTL).await);
            assert!(store.stats().bytes <= max_bytes, "{:?}", store.stats());
        }
        assert_eq!(store.stats().entries, 10);
        expect_done(claim(&store, last.unwrap(), fingerprint(1), LONG_LEASE).await);
    }

    /// An answer larger than the whole byte budget cannot be stored, and nothing says it
    /// was: the key records "executed, answer not stored" instead (a small record within
    /// the budget), so a repeat is answered and never executes again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_larger_than_the_byte_budget_is_recorded_as_not_stored() {
        let store = store(1000, 1024);
        let k = fresh_key();
        let lease = expect_owner(claim(&store, k, fingerprint(1), LONG_LEASE).await);
        let done = Settlement::Done {
            response: response(&[1; 4096]),
            ttl: LONG_TTL,
        };
        assert_eq!(lease.settle(done).await.unwrap(), Settled::AnswerNotKept);
        match claim(&store, k, fingerprint(1), LONG_LEASE).await {
            Claim::NotStored(record) => assert_eq!(record.status, StatusCode::CREATED),
            other => panic!("expected not_stored, got {}", other.as_str()),
        }
        assert!(store.stats().bytes <= 1024, "{:?}", store.stats());
        assert_eq!(store.stats().entries, 1);
    }

    /// With several shards, the totals still hold: shares of `max_entries` and `max_bytes`
    /// that do not divide evenly must not add up to more than the configured bound.
    /// (4097 entries make 4 shards; 40 answers' worth minus 3 bytes, over 4 shards, must
    /// hold 9 answers per shard, not 10.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sharded_bounds_hold_for_the_configured_totals() {
        const MAX: usize = 4097;
        let by_entries = store(MAX, 1 << 40);
        for _ in 0..MAX * 3 {
            complete_fresh(&by_entries, b"x", LONG_TTL).await;
        }
        assert!(
            by_entries.stats().entries <= MAX,
            "{:?}",
            by_entries.stats()
        );

        let cost = response(b"x").cost();
        let max_bytes = 40 * cost - 3;
        let by_bytes = store(4096, max_bytes);
        for _ in 0..400 {
            complete_fresh(&by_bytes, b"x", LONG_TTL).await;
        }
        assert!(
            by_bytes.stats().bytes <= max_bytes,
            "{:?}",
            by_bytes.stats()
        );
    }
}
