//! What a store reports about itself: one key for the admin API ([`KeyInfo`], with how
//! often observe mode saw it, [`Seen`]) and the gauges `/metrics` shows ([`StoreStats`]).
//! Read-only views; nothing here changes a record.

use std::time::SystemTime;

use super::claim::RouteTag;
use super::response::StoredResponse;
use super::revision::Revision;

/// What the admin API shows about one key.
#[derive(Debug, Clone)]
pub struct KeyInfo {
    /// `issued`, `in_flight`, `done`, `failed`, `not_stored` or `outcome_unknown`.
    pub state: &'static str,
    /// When the record was created.
    pub created: SystemTime,
    /// When it expires (its lease runs out, for a claim in flight).
    pub expires: SystemTime,
    /// The stored response, when done or failed.
    pub response: Option<StoredResponse>,
    /// The upstream's status, when the answer was not stored.
    pub status: Option<http::StatusCode>,
    /// Duplicates waiting on a claim in flight, where the store knows (the memory store).
    pub waiters: Option<usize>,
    /// How often the key was seen on a route in `idempotency: observe`, if it was.
    pub seen: Option<Seen>,
    /// Which record this is, in this state (the `ETag` a conditional purge names).
    pub revision: Revision,
}

/// How often a key was seen in observe mode: its first request and the duplicates that
/// came after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Requests with the key, the first included.
    pub times: u64,
    /// When the latest duplicate came.
    pub last: SystemTime,
}

/// Gauges for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Records held, in flight and done.
    pub entries: usize,
    /// Records in flight.
    pub in_flight: usize,
    /// Bytes accounted to done records.
    pub bytes: usize,
    /// Live records evicted to make room, by route (unspent one-time tokens under the
    /// default tag, shown as route ""), since start.
    pub evictions: Vec<(RouteTag, u64)>,
    /// One-time token issuances refused since start: by the memory store for want of room
    /// (its `token_share`), and by any store past `tokens.budget`.
    pub tokens_refused: u64,
    /// Expired rows the SQL store's reaper deleted since start.
    pub reaped: u64,
    /// Settlements (answers, failures) the store never took before their claim's record
    /// ended, and releases given up (of claims that got no answer, or made again after a
    /// renewal that got none), since start: each may leave its key to run again or held
    /// as an "outcome unknown".
    pub settlements_lost: u64,
    /// Answers of settlements made again in the background that found no room
    /// (`settling`) and were made again without it, as "executed, answer not stored", since
    /// start.
    pub retried_answers_dropped: u64,
}
