//! The buffer budget's metrics (`connections.max_buffered`): bytes held, the limit, and
//! what was refused for want of room, overall and for a connection's share.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::proxy::budget::Refusal;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WhatLabel {
    what: String,
}

/// The buffer budget (`connections.max_buffered`): bytes held, its limit, and what it
/// refused. The budget counts in [`BufferMetrics::held`] itself.
#[derive(Debug, Default)]
pub struct BufferMetrics {
    /// Bytes of request heads held, of request bodies and upstream answers buffered, and
    /// of replays' copies of stored answers, now.
    pub held: Gauge,
    /// `connections.max_buffered`.
    pub limit: Gauge,
    /// Heads, bodies and replays refused (`503 overloaded`) and answers streamed unstored,
    /// for want of room.
    refused: Family<WhatLabel, Counter>,
    /// Of those, the ones whose connection held its share
    /// (`connections.max_buffered_per_connection`).
    share_refused: Family<WhatLabel, Counter>,
}

impl BufferMetrics {
    /// The refusal counter of `what`.
    pub fn refused(&self, what: Refusal) -> Counter {
        self.refused.get_or_create_owned(&WhatLabel {
            what: what.as_str().to_owned(),
        })
    }

    /// The counter of `what` refused because its connection held its share.
    pub fn share_refused(&self, what: Refusal) -> Counter {
        self.share_refused.get_or_create_owned(&WhatLabel {
            what: what.as_str().to_owned(),
        })
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "buffered_bytes",
            "Bytes of protected requests' heads held, of their bodies and owners' answers buffered, and of replays' copies of stored answers, now",
            self.held.clone(),
        );
        registry.register(
            "buffered_limit_bytes",
            "The most that may be buffered at once (connections.max_buffered)",
            self.limit.clone(),
        );
        registry.register(
            "buffer_refusals",
            "Buffers refused for want of room under connections.max_buffered: protected requests' heads, bodies and replays (503 overloaded) and answers (streamed, not stored)",
            self.refused.clone(),
        );
        registry.register(
            "buffer_share_refusals",
            "Of the buffer refusals, those whose client connection held its share (connections.max_buffered_per_connection)",
            self.share_refused.clone(),
        );
        // Every series exists from the start, at 0.
        for what in [
            Refusal::RequestHead,
            Refusal::RequestBody,
            Refusal::Answer,
            Refusal::Replay,
        ] {
            let _ = self.refused(what);
            let _ = self.share_refused(what);
        }
    }
}
