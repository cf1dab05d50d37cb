//! Prometheus metrics, registered once and shared by `Arc`: requests by route and outcome,
//! upstream latency and wait-time histograms, owners in flight, store entries and bytes,
//! the bytes buffered under `connections.max_buffered` and its refusals.
//! Per-route handles are cached, so counting a request allocates nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::store::{RouteTag, StoreStats};

mod buffers;
mod connections;
pub use buffers::BufferMetrics;
pub use connections::{ConnectionMetrics, Handoff};

/// How a request ended, from the proxy's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// This request owned its key, ran upstream, and the answer was stored.
    Executed,
    /// This request owned its key and ran upstream; its answer was too large to keep, so
    /// the key records "executed, answer not stored".
    ExecutedNotStored,
    /// A stored answer was replayed at once.
    Replayed,
    /// The request waited for an in-flight duplicate, then got its replay.
    Waited,
    /// The request waited for a duplicate that failed, and got that failure.
    FailureShared,
    /// 409: a duplicate was in flight (reject mode, or the wait timed out).
    Conflict,
    /// 422: the key was used with another payload.
    Mismatch,
    /// 409: a repeat of a key whose outcome is unknown.
    Held,
    /// 409: a repeat of a key whose answer was not stored.
    NotStored,
    /// 400, 413, or 503 `overloaded` or `connection-busy`: bad key, body or request, no
    /// room to buffer the body, or the connection's owners at `max_streams`; nothing was
    /// claimed.
    Rejected,
    /// The owner's answer is not replayed (a 5xx, a transient 4xx, an upstream never
    /// reached): the key was released, so a later retry executes.
    Released,
    /// The owner's request went out and no answer came in time (504) or at all (502): the
    /// key stays claimed while the proxy waits on, and is held as an unknown outcome if
    /// nothing comes.
    Unknown,
    /// 503: the store failed and the route fails closed.
    StoreError,
    /// The store failed and the route fails open: forwarded unprotected.
    FailOpen,
    /// No key material and none required: forwarded unprotected.
    Unkeyed,
    /// The key would hold the address of a client a trusted proxy could not name
    /// (`X-Forwarded-For: unknown`), which no other client's key may share: forwarded
    /// unprotected, on enforcing and observed routes alike.
    CallerUnknown,
    /// An unprotected route or a safe method: streamed through.
    Passthrough,
    /// Observe mode, forwarded: enforcement would have replayed the stored answer.
    WouldReplay,
    /// Observe mode, forwarded: enforcement would have answered 409 while its first
    /// request ran (`in_flight: reject`).
    WouldConflict,
    /// Observe mode, forwarded: enforcement would have held it until its first request,
    /// still running, ended, then answered from that outcome (`in_flight: wait`).
    WouldWait,
    /// Observe mode, forwarded: enforcement would have answered 422 (another payload).
    WouldMismatch,
    /// Observe mode, forwarded: enforcement would have answered 409 (its first request's
    /// outcome is unknown, or its answer was not stored).
    WouldHold,
    /// Observe mode, forwarded: enforcement would have refused it (400, 413: no usable key;
    /// 503 or 429: a full store, or the caller's share of it).
    WouldReject,
}

impl Outcome {
    const ALL: [Outcome; 23] = [
        Self::Executed,
        Self::ExecutedNotStored,
        Self::Replayed,
        Self::Waited,
        Self::FailureShared,
        Self::Conflict,
        Self::Mismatch,
        Self::Held,
        Self::NotStored,
        Self::Rejected,
        Self::Released,
        Self::Unknown,
        Self::StoreError,
        Self::FailOpen,
        Self::Unkeyed,
        Self::CallerUnknown,
        Self::Passthrough,
        Self::WouldReplay,
        Self::WouldConflict,
        Self::WouldWait,
        Self::WouldMismatch,
        Self::WouldHold,
        Self::WouldReject,
    ];

    /// Label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::ExecutedNotStored => "executed_not_stored",
            Self::Replayed => "replayed",
            Self::Waited => "waited",
            Self::FailureShared => "failure_shared",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::Held => "held",
            Self::NotStored => "not_stored",
            Self::Rejected => "rejected",
            Self::Released => "released",
            Self::Unknown => "unknown",
            Self::StoreError => "store_error",
            Self::FailOpen => "fail_open",
            Self::Unkeyed => "unkeyed",
            Self::CallerUnknown => "caller_unknown",
            Self::Passthrough => "passthrough",
            Self::WouldReplay => "would_replay",
            Self::WouldConflict => "would_conflict",
            Self::WouldWait => "would_wait",
            Self::WouldMismatch => "would_mismatch",
            Self::WouldHold => "would_hold",
            Self::WouldReject => "would_reject",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|o| *o == self).unwrap_or(0)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RekeyedLabels {
    route: String,
    found: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: String,
}

/// The handles of one route, cached so the hot path only increments.
#[derive(Debug)]
pub struct RouteMetrics {
    tag: RouteTag,
    outcomes: Vec<Counter>,
    upstream: Histogram,
    wait: Histogram,
    unknown: Counter,
}

impl RouteMetrics {
    /// The route's tag in the store (its records' evictions are counted by it).
    pub fn tag(&self) -> RouteTag {
        self.tag
    }

    /// Counts one key that became an unknown outcome (held).
    pub fn unknown_outcome(&self) {
        self.unknown.inc();
    }

    /// Counts one request.
    pub fn count(&self, outcome: Outcome) {
        self.outcomes[outcome.index()].inc();
    }

    /// Records how long the upstream took to answer.
    pub fn upstream_latency(&self, took: Duration) {
        self.upstream.observe(took.as_secs_f64());
    }

    /// Records how long a duplicate waited for its owner since it first found the key in
    /// flight (`None`: it never waited, nothing to record).
    pub fn waited(&self, since: Option<Instant>) {
        if let Some(since) = since {
            self.wait.observe(since.elapsed().as_secs_f64());
        }
    }
}

/// Every metric the proxy exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    upstream: Family<RouteLabel, Histogram>,
    wait: Family<RouteLabel, Histogram>,
    in_flight: Gauge,
    waiting: Gauge,
    store_entries: Gauge,
    store_bytes: Gauge,
    background_writes: Gauge,
    unknown: Family<RouteLabel, Counter>,
    evictions: Family<RouteLabel, Counter>,
    tokens_refused: Counter,
    reaped: Counter,
    settlements_lost: Counter,
    retried_answers_dropped: Counter,
    /// Held while the counters above follow the store's totals ([`Metrics::render`]).
    following: Mutex<()>,
    rekeyed: Family<RekeyedLabels, Counter>,
    routes: RwLock<HashMap<String, Arc<RouteMetrics>>>,
    /// Route names by [`RouteTag`]: tag 0 is "" (no route: issued tokens).
    tags: RwLock<Vec<String>>,
    connections: ConnectionMetrics,
    buffers: BufferMetrics,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms … ~65 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("idemgate");
        let requests = Family::<RequestLabels, Counter>::default();
        let upstream: Family<RouteLabel, Histogram> =
            Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        let wait: Family<RouteLabel, Histogram> =
            Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        let in_flight = Gauge::default();
        let waiting = Gauge::default();
        let store_entries = Gauge::default();
        let store_bytes = Gauge::default();
        let background_writes = Gauge::default();
        registry.register(
            "requests",
            "Requests by route and outcome",
            requests.clone(),
        );
        registry.register(
            "upstream_seconds",
            "Time until the upstream's answer, by route",
            upstream.clone(),
        );
        registry.register(
            "wait_seconds",
            "Time duplicates waited for an in-flight owner, by route",
            wait.clone(),
        );
        registry.register(
            "in_flight",
            "Owners currently running upstream",
            in_flight.clone(),
        );
        registry.register(
            "waiting",
            "Duplicates currently waiting for an in-flight owner",
            waiting.clone(),
        );
        registry.register(
            "store_entries",
            "Records in the memory store (in flight and done)",
            store_entries.clone(),
        );
        registry.register(
            "store_bytes",
            "Bytes accounted to records in the memory store",
            store_bytes.clone(),
        );
        registry.register(
            "store_background_writes",
            "Store writes running in the background after their owners ended (answers the store failed, made again; releases of unanswered claims): above zero while a Redis or SQL store is unreachable",
            background_writes.clone(),
        );
        let unknown = Family::<RouteLabel, Counter>::default();
        registry.register(
            "unknown_outcomes",
            "Keys held as outcome unknown (their request may have run, no answer came), by route",
            unknown.clone(),
        );
        let evictions = Family::<RouteLabel, Counter>::default();
        registry.register(
            "store_evictions",
            "Live records the memory store evicted to make room (their repeats execute again), by route",
            evictions.clone(),
        );
        let tokens_refused = Counter::default();
        registry.register(
            "store_tokens_refused",
            "One-time tokens refused: issuances answered 503 (past tokens.budget, or the memory store's unspent tokens held their share, token_share, or it was full), and tokens the memory store did not hand back after a failed attempt for want of room in that share",
            tokens_refused.clone(),
        );
        let connections = ConnectionMetrics::default();
        connections.register(&mut registry);
        let buffers = BufferMetrics::default();
        buffers.register(&mut registry);
        let reaped = Counter::default();
        registry.register(
            "store_reaped",
            "Expired rows the SQL store's reaper deleted",
            reaped.clone(),
        );
        let settlements_lost = Counter::default();
        registry.register(
            "store_settlements_lost",
            "Answers and failures the store never took before their claim's record ended, and releases and repeated settlements given up (Redis, SQL): each may leave its key to run again or held as an outcome unknown; and answers a SQL database refused (a trigger, a constraint) on a background retry, recorded as executed, answer not stored (not those left out as too large for the store)",
            settlements_lost.clone(),
        );
        let retried_answers_dropped = Counter::default();
        registry.register(
            "store_retried_answers_dropped",
            "Answers of settlements the store failed that found no room to be held while they were made again in the background (connections.max_buffered_per_connection of the buffer budget): made again as executed, answer not stored (Redis, SQL)",
            retried_answers_dropped.clone(),
        );
        let rekeyed = Family::<RekeyedLabels, Counter>::default();
        registry.register(
            "rekeyed",
            "Requests that also claimed the key a config before a re-keying reload gave them, by route and what that key held (free, done, failed, mismatch, in_flight, outcome_unknown, not_stored, error)",
            rekeyed.clone(),
        );
        Self {
            registry,
            rekeyed,
            connections,
            buffers,
            requests,
            upstream,
            wait,
            in_flight,
            waiting,
            store_entries,
            store_bytes,
            background_writes,
            unknown,
            evictions,
            tokens_refused,
            reaped,
            settlements_lost,
            retried_answers_dropped,
            following: Mutex::new(()),
            routes: RwLock::default(),
            tags: RwLock::new(vec![String::new()]),
        }
    }

    /// The cached handles of `route` (created on first use).
    pub fn route(&self, route: &str) -> Arc<RouteMetrics> {
        if let Some(found) = self
            .routes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(route)
        {
            return Arc::clone(found);
        }
        let label = RouteLabel {
            route: route.to_owned(),
        };
        let tag = {
            let mut tags = self.tags.write().unwrap_or_else(|p| p.into_inner());
            match tags.iter().position(|t| t == route) {
                Some(i) => RouteTag(i as u16),
                // More routes than tags (65535) after many reloads: the rest share the last.
                None if tags.len() > usize::from(u16::MAX) => RouteTag(u16::MAX),
                None => {
                    tags.push(route.to_owned());
                    RouteTag((tags.len() - 1) as u16)
                }
            }
        };
        let created = Arc::new(RouteMetrics {
            tag,
            outcomes: Outcome::ALL
                .iter()
                .map(|o| {
                    self.requests.get_or_create_owned(&RequestLabels {
                        route: route.to_owned(),
                        outcome: o.as_str().to_owned(),
                    })
                })
                .collect(),
            upstream: self.upstream.get_or_create_owned(&label),
            wait: self.wait.get_or_create_owned(&label),
            unknown: self.unknown.get_or_create_owned(&label),
        });
        // Its evictions series exists from the start, at 0, as its other series do.
        let _ = self.evictions.get_or_create(&label);
        self.routes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(route.to_owned())
            .or_insert(created)
            .clone()
    }

    /// Counts one request on `route` that claimed the key a previous config gave it, which
    /// held `found` (`crate::proxy::previous`).
    pub fn rekeyed(&self, route: &str, found: &str) {
        self.rekeyed
            .get_or_create(&RekeyedLabels {
                route: route.to_owned(),
                found: found.to_owned(),
            })
            .inc();
    }

    /// The connection gauges and counters.
    pub fn connections(&self) -> &ConnectionMetrics {
        &self.connections
    }

    /// The buffer budget's gauges and counters (`crate::proxy::budget`).
    pub fn buffers(&self) -> &BufferMetrics {
        &self.buffers
    }

    /// Marks an owner as running upstream until the guard drops.
    pub fn owner_running(self: &Arc<Self>) -> InFlightGuard {
        self.in_flight.inc();
        InFlightGuard(self.in_flight.clone())
    }

    /// Marks a duplicate as waiting for its owner until the guard drops.
    pub fn duplicate_waiting(&self) -> InFlightGuard {
        self.waiting.inc();
        InFlightGuard(self.waiting.clone())
    }

    /// The Prometheus text exposition, with the store gauges read now.
    pub fn render(&self, stats: StoreStats) -> String {
        self.store_entries.set(stats.entries as i64);
        self.store_bytes.set(stats.bytes as i64);
        self.background_writes
            .set(crate::store::background::pending() as i64);
        {
            // The store counts totals and each counter follows them by what it lacks: two
            // scrapes at once, each adding that, would add it twice.
            let _one_at_a_time = self.following.lock().unwrap_or_else(|p| p.into_inner());
            let follow = |counter: &Counter, total: u64| {
                counter.inc_by(total.saturating_sub(counter.get()));
            };
            let tags = self.tags.read().unwrap_or_else(|p| p.into_inner());
            for (tag, total) in &stats.evictions {
                let route = tags.get(usize::from(tag.0)).cloned().unwrap_or_default();
                follow(
                    &self.evictions.get_or_create_owned(&RouteLabel { route }),
                    *total,
                );
            }
            follow(&self.tokens_refused, stats.tokens_refused);
            follow(&self.reaped, stats.reaped);
            follow(&self.settlements_lost, stats.settlements_lost);
            follow(&self.retried_answers_dropped, stats.retried_answers_dropped);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Decrements the in-flight gauge on drop, whichever way the owner ends.
#[derive(Debug)]
pub struct InFlightGuard(Gauge);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_rendered_with_route_and_outcome_labels() {
        let m = Arc::new(Metrics::new());
        m.route("orders").count(Outcome::Replayed);
        m.route("orders").count(Outcome::Replayed);
        m.route("orders").upstream_latency(Duration::from_millis(3));
        let guard = m.owner_running();
        let orders = m.route("orders").tag();
        let text = m.render(StoreStats {
            entries: 7,
            in_flight: 1,
            bytes: 900,
            evictions: vec![(orders, 3)],
            tokens_refused: 2,
            reaped: 0,
            settlements_lost: 4,
            retried_answers_dropped: 5,
        });
        assert!(
            text.contains("idemgate_store_retried_answers_dropped_total 5"),
            "{text}"
        );
        assert!(
            text.contains("idemgate_store_settlements_lost_total 4"),
            "{text}"
        );
        assert!(
            text.contains(r#"idemgate_store_evictions_total{route="orders"} 3"#),
            "{text}"
        );
        assert!(
            text.contains("idemgate_store_tokens_refused_total 2"),
            "{text}"
        );
        assert!(
            text.contains(r#"idemgate_requests_total{route="orders",outcome="replayed"} 2"#),
            "{text}"
        );
        assert!(text.contains("idemgate_in_flight 1"), "{text}");
        assert!(text.contains("idemgate_store_entries 7"), "{text}");
        assert!(
            text.contains(r#"idemgate_upstream_seconds_count{route="orders"} 1"#),
            "{text}"
        );
        drop(guard);
        assert!(m
            .render(StoreStats::default())
            .contains("idemgate_in_flight 0"));
    }
}
