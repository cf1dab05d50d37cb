//! Prometheus metrics, registered once and shared by `Arc`: requests by route and outcome,
//! upstream latency and wait-time histograms, owners in flight, store entries and bytes.
//! Per-route handles are cached, so counting a request allocates nothing.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::store::StoreStats;

/// How a request ended, from the proxy's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// This request owned its key, ran upstream, and the answer was stored.
    Executed,
    /// A stored answer was replayed at once.
    Replayed,
    /// The request waited for an in-flight duplicate, then got its replay.
    Waited,
    /// 409: a duplicate was in flight (reject mode, or the wait timed out).
    Conflict,
    /// 422: the key was used with another payload.
    Mismatch,
    /// 400 or 413: bad key, body or request; nothing was claimed.
    Rejected,
    /// The owner ran upstream but the answer was not stored (status not replayed, upstream
    /// error or timeout); the key was released so a retry executes.
    Released,
    /// 503: the store failed and the route fails closed.
    StoreError,
    /// The store failed and the route fails open: forwarded unprotected.
    FailOpen,
    /// No key material and none required: forwarded unprotected.
    Unkeyed,
    /// An unprotected route or a safe method: streamed through.
    Passthrough,
}

impl Outcome {
    const ALL: [Outcome; 11] = [
        Self::Executed,
        Self::Replayed,
        Self::Waited,
        Self::Conflict,
        Self::Mismatch,
        Self::Rejected,
        Self::Released,
        Self::StoreError,
        Self::FailOpen,
        Self::Unkeyed,
        Self::Passthrough,
    ];

    /// Label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::Waited => "waited",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::Rejected => "rejected",
            Self::Released => "released",
            Self::StoreError => "store_error",
            Self::FailOpen => "fail_open",
            Self::Unkeyed => "unkeyed",
            Self::Passthrough => "passthrough",
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
struct RouteLabel {
    route: String,
}

/// The handles of one route, cached so the hot path only increments.
#[derive(Debug)]
pub struct RouteMetrics {
    outcomes: Vec<Counter>,
    upstream: Histogram,
    wait: Histogram,
}

impl RouteMetrics {
    /// Counts one request.
    pub fn count(&self, outcome: Outcome) {
        self.outcomes[outcome.index()].inc();
    }

    /// Records how long the upstream took to answer.
    pub fn upstream_latency(&self, took: Duration) {
        self.upstream.observe(took.as_secs_f64());
    }

    /// Records how long a duplicate waited for its owner.
    pub fn waited(&self, took: Duration) {
        self.wait.observe(took.as_secs_f64());
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
    store_entries: Gauge,
    store_bytes: Gauge,
    routes: RwLock<HashMap<String, Arc<RouteMetrics>>>,
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
        let store_entries = Gauge::default();
        let store_bytes = Gauge::default();
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
            "store_entries",
            "Records in the memory store (in flight and done)",
            store_entries.clone(),
        );
        registry.register(
            "store_bytes",
            "Bytes accounted to done records in the memory store",
            store_bytes.clone(),
        );
        Self {
            registry,
            requests,
            upstream,
            wait,
            in_flight,
            store_entries,
            store_bytes,
            routes: RwLock::default(),
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
        let created = Arc::new(RouteMetrics {
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
        });
        self.routes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(route.to_owned())
            .or_insert(created)
            .clone()
    }

    /// Marks an owner as running upstream until the guard drops.
    pub fn owner_running(self: &Arc<Self>) -> InFlightGuard {
        self.in_flight.inc();
        InFlightGuard(Arc::clone(self))
    }

    /// The Prometheus text exposition, with the store gauges read now.
    pub fn render(&self, stats: StoreStats) -> String {
        self.store_entries.set(stats.entries as i64);
        self.store_bytes.set(stats.bytes as i64);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Decrements the in-flight gauge on drop, whichever way the owner ends.
#[derive(Debug)]
pub struct InFlightGuard(Arc<Metrics>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.in_flight.dec();
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
        let text = m.render(StoreStats {
            entries: 7,
            in_flight: 1,
            bytes: 900,
        });
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
