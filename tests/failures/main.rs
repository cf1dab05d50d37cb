//! Exactly once when things fail: an owner whose upstream answers 500 while duplicates
//! wait, an upstream that times out or resets after the request went out, answers too
//! large to store, a full memory store, and a store that fails under a claim (a client
//! gone mid-claim, a reply past the store timeout, a duplicate of a running request on a
//! route that fails open, a completion whose reply was lost). Each test counts the upstream's executions and
//! waits on the upstream's or the proxy's own signals (a request arrived at a gate,
//! duplicates parked waiting), never on a sleep winning a race.
//!
//! The tests are grouped by what fails: `owner_failures.rs` the upstream under an owner,
//! `store_limits.rs` the store's size limits, `claims_left_behind.rs` claims with no owner
//! left to settle them, `forwarded_claims.rs` the claims of requests a fail-open route
//! forwarded when the claim's reply came late, `store_failures.rs` the store failing under
//! a running request; `retried_answers.rs` the bound on what completions made again in the background hold;
//! `held_replies.rs` is the Redis relay the last three hold replies with.

#[path = "../common/mod.rs"]
mod common;

mod claims_left_behind;
mod forwarded_claims;
mod held_replies;
mod owner_failures;
mod retried_answers;
mod store_failures;
mod store_limits;

use common::{post, ProxyHandle};

/// A header-keyed route `orders` on `/orders`, with `extra` policy keys.
fn route(extra: &str) -> String {
    format!(
        "routes:\n  - name: orders\n    match: {{ methods: [POST], path: /orders }}\n    key: {{ header: Idempotency-Key, required: true }}\n    {extra}\n"
    )
}

/// Sends `n` duplicates of `key` in the background and waits until the proxy reports all
/// of them parked waiting for the owner.
async fn park_duplicates(
    proxy: &ProxyHandle,
    key: &'static str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<common::Answer>> {
    let duplicates = (0..n)
        .map(|_| {
            let addr = proxy.addr;
            tokio::spawn(
                async move { post(addr, "/orders", &[("idempotency-key", key)], "{}").await },
            )
        })
        .collect();
    proxy.metric_reaches("idemgate_waiting", n as f64).await;
    duplicates
}
