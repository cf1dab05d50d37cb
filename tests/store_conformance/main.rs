//! The store contract as one conformance suite, run against every backend.
//!
//! Each check in [`checks`] is an `async fn(&Store)` that states one behaviour of the
//! contract in `src/store.rs` (atomic claims, replay, fingerprint mismatch, fencing, lease
//! renewal and release on drop, waiters, TTL, inspect, the operator's purge). The
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
//!
//! # Layout
//!
//! The backends and the macros are here; `support.rs` holds the fixtures and helpers every
//! check uses, `checks.rs` (with one file per topic under `checks/`) the contract,
//! `redis.rs` the Redis backend and its own tests, `redis_checks.rs` the Redis-only checks
//! of how waiters are woken, and `memory_bounds.rs` the memory store's limits.

use std::sync::Arc;
use std::time::Duration;

use idemgate::store::{MemoryLimits, MemoryStore, Store};

use redis_checks::{command_calls, complete_stamped, replays_each};
use support::*;

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
            a_completed_key_replays_its_trailers_to_waiters_and_later_claims,
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
            a_waiter_claiming_after_its_vanished_owner_takes_over_when_released,
            a_waiter_gives_up_at_its_deadline_while_the_owner_renews,
            a_key_held_as_unknown_is_never_owned_until_purged,
            a_lapsed_claim_held_as_unknown_is_never_taken_over,
            a_lapsed_claim_released_is_taken_over_only_after_its_grace,
            waiters_share_a_failure_and_later_claims_execute,
            a_waiter_never_owns_a_key_freed_meanwhile,
            a_waiter_never_owns_a_key_freed_meanwhile_when_lapses_are_released,
            a_waiter_that_missed_its_owners_failure_never_owns_the_key,
            an_answer_not_stored_is_answered_and_never_owned,
            an_owner_whose_record_vanished_writes_its_outcome_back,
            a_late_answer_settles_its_own_unknown_outcome,
            duplicates_seen_in_observe_mode_are_counted_on_their_key,
            duplicates_seen_while_a_claim_ran_still_count_after_its_claim_would_have_expired,
            a_key_claimed_afresh_starts_its_seen_count_again,
            duplicates_seen_while_a_claim_runs_still_count_across_its_renewals,
            duplicates_seen_before_an_unknown_outcome_still_count_after_its_late_answer,
            a_done_key_is_free_again_after_its_ttl,
            a_zero_ttl_completes_without_storing,
            inspect_reports_in_flight_and_done_records,
            a_forgotten_record_frees_its_key_and_fences_off_its_owner,
            a_purge_removes_every_settled_record_and_frees_the_key,
            a_purge_leaves_a_claim_in_flight_alone,
            a_lapsed_claim_held_as_unknown_is_purged,
            a_claim_made_after_a_purge_looked_is_never_purged,
            purges_racing_claims_never_remove_a_claim,
            a_purge_naming_a_replaced_record_leaves_its_successor,
            a_purge_naming_a_record_whose_state_changed_leaves_it,
            a_purge_naming_the_current_record_removes_it,
            an_issued_key_is_owned_once_by_concurrent_issued_claims,
            an_issued_claim_of_a_key_never_issued_is_unknown,
            a_reissued_release_makes_the_key_claimable_again,
            a_failed_token_attempt_hands_the_token_back,
            a_token_whose_request_may_have_run_is_never_owned_again,
            a_token_is_spent_past_its_ttl_and_past_its_reissue_window,
            a_failure_keeps_its_token_no_longer_than_its_expiry,
            a_token_handed_back_keeps_no_failure_past_the_linger,
            a_settlement_written_late_keeps_its_token_no_longer_than_its_expiry,
            a_waiter_on_a_vanished_token_owner_finds_the_token_spent,
            a_waiter_on_a_lost_token_record_finds_it_spent,
            a_token_is_spent_once_its_answer_has_expired,
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
                crate::redis_checks::$check(&store, &server).await;
            }
        )+
    };
}

mod checks;
mod memory_bounds;
mod redis;
mod redis_checks;
mod support;

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

#[path = "../common/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

#[path = "../common/unprivileged.rs"]
mod unprivileged;

#[path = "../common/postgres_server.rs"]
#[allow(dead_code)]
mod postgres_server;

#[path = "../common/mariadb_server.rs"]
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
