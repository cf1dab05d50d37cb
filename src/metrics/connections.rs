//! Connection metrics on both sides: open connections, waits under the caps, lingering
//! closes, and the hand-written HTTP/1.1 client's hand-offs to hyper's.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Connections on both sides: how many are open, and how often the caps made one wait
/// (`connections.max_client`, `connections.max_upstream`); lingering closes.
#[derive(Debug, Default)]
pub struct ConnectionMetrics {
    /// Client connections open now (lingering ones included).
    pub client_open: Gauge,
    /// New client connections that waited for a slot under `max_client`.
    pub client_waited: Counter,
    /// Closed client connections whose owners still run, each keeping its slot under
    /// `max_client` until they end (`crate::proxy::conn_share`).
    pub client_outlived: Gauge,
    /// Client connections in a lingering close now.
    pub lingering: Gauge,
    /// Lingering closes ended by their time, gap or byte bound rather than by the client.
    pub lingering_cut: Counter,
    /// Upstream connections open now.
    pub upstream_open: Gauge,
    /// Requests that waited for an upstream connection under `max_upstream`.
    pub upstream_waited: Counter,
    /// Requests the hand-written HTTP/1.1 client (`connections.upstream_http1: idemgate`)
    /// handed to hyper's, by reason.
    upstream_http1_handoffs: Family<ReasonLabel, Counter>,
}

/// Why the hand-written HTTP/1.1 upstream client handed a request to hyper's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// A protocol switch (WebSocket): hyper's client carries upgrades.
    Upgrade,
}

impl Handoff {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Upgrade => "upgrade",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

impl ConnectionMetrics {
    /// Counts one request handed to hyper's HTTP/1.1 client for `reason`.
    pub fn upstream_http1_handoff(&self, reason: Handoff) {
        self.upstream_http1_handoffs
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "client_connections",
            "Client connections open",
            self.client_open.clone(),
        );
        registry.register(
            "client_connections_waited",
            "New client connections that waited for a slot under connections.max_client",
            self.client_waited.clone(),
        );
        registry.register(
            "client_connections_outlived",
            "Closed client connections whose owners still run upstream, each keeping its slot under connections.max_client until they end",
            self.client_outlived.clone(),
        );
        registry.register(
            "lingering_connections",
            "Client connections in a lingering close (reading and dropping what the client still sends after the answer)",
            self.lingering.clone(),
        );
        registry.register(
            "lingering_cut",
            "Lingering closes ended by lingering_time, lingering_timeout or lingering_bytes",
            self.lingering_cut.clone(),
        );
        registry.register(
            "upstream_connections",
            "Upstream connections open",
            self.upstream_open.clone(),
        );
        registry.register(
            "upstream_connections_waited",
            "Requests that waited for an upstream connection under connections.max_upstream",
            self.upstream_waited.clone(),
        );
        registry.register(
            "upstream_http1_handoffs",
            "Requests the hand-written HTTP/1.1 upstream client (connections.upstream_http1: idemgate) handed to hyper's, by reason",
            self.upstream_http1_handoffs.clone(),
        );
    }
}
