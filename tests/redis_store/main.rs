//! The Redis store across replicas: exactly once between proxy processes, takeover of a
//! killed owner, store faults in both `on_store_error` modes, round trips per request,
//! Redis Cluster, and the fence on an unanswered claim's release. Every test starts its own redis-server(s) on free loopback ports.
//!
//! The config and the helpers several modules use are here; the tests are in one module
//! per topic: `replicas.rs` (exactly once between proxy processes, a killed or slow owner,
//! Redis restarted empty), `faults.rs` (Redis down, in both modes), `late_waiters.rs` (a duplicate that
//! looks again only after its owner's failure expired), `round_trips.rs`,
//! `cluster.rs`, `eviction.rs` (a Redis that may evict records), `refused_answers.rs` (an answer over `proto-max-bulk-len`), `reconnects.rs` (a failover behind one address, waiters gone while Redis was down), `tokens.rs` (the bounds on issuing one-time tokens), `unanswered_release.rs` and `settlement_cut_short.rs` (a completion
//! dropped before Redis answered, or one Redis missed past the lease).

#[path = "../common/mod.rs"]
mod common;

mod cluster;
mod eviction;
mod faults;
mod late_waiters;
mod reconnects;
mod refused_answers;
mod replicas;
mod round_trips;
mod settlement_cut_short;
mod tokens;
mod unanswered_release;

use common::redis_server::RedisServer;

fn redis_yaml(url: &str, extra_defaults: &str) -> String {
    format!(
        "store:\n  redis: {{ url: \"{url}\", prefix: \"t:\", timeout: 500ms }}\ndefaults: {{ {extra_defaults} }}\nroutes:\n  - name: create-order\n    match: {{ methods: [POST], path: /orders }}\n    key: {{ header: Idempotency-Key, required: true }}\n"
    )
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
