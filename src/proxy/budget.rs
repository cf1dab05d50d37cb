//! [`Budget`]: the one bound on the bytes the proxy buffers at once, all requests together
//! (`connections.max_buffered`). `max_body` and `max_answer` bound one request; without a
//! total, `max_client × max_streams × (max_body + max_answer)` is what clients and
//! upstreams could make the proxy hold (a terabyte with the defaults), as Envoy's overload
//! manager and nginx's fixed buffer pools bound theirs.
//!
//! A protected request's body and an owner's upstream answer take their bytes from it as
//! they are buffered, chunk by chunk ([`Charge`]), and give them back when the buffer is
//! dropped: the charge rides inside the [`Bytes`] the buffer becomes ([`Charge::attach`]),
//! so it lasts exactly as long as some part of the buffer is held, however far it is
//! handed on (to the upstream connection, to a streamed answer's first part).
//!
//! A body that finds no room is refused before anything is claimed or sent (`503
//! overloaded`); an answer that finds none, its request already run, streams on to its
//! client and is recorded as executed, not stored, as one over `max_answer` is.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::BufferMetrics;

/// The process-wide byte budget. The bytes held are counted in the
/// `idemgate_buffered_bytes` gauge itself: what `/metrics` shows is the count the budget
/// decides by.
#[derive(Debug)]
pub struct Budget {
    /// Bytes held now.
    held: Gauge,
    /// The most that may be held (`connections.max_buffered`).
    limit: AtomicI64,
    /// Shown as `idemgate_buffered_limit_bytes`.
    limit_gauge: Gauge,
    /// Request bodies refused for want of room.
    refused_bodies: Counter,
    /// Answers streamed on unstored for want of room.
    refused_answers: Counter,
}

/// What asked for room and did not get it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A protected request's body: refused with `503 overloaded`.
    RequestBody,
    /// An owner's upstream answer: streamed on, not stored.
    Answer,
}

impl Refusal {
    /// Label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RequestBody => "request_body",
            Self::Answer => "answer",
        }
    }
}

impl Budget {
    /// A budget of `limit` bytes, counted in `metrics`.
    pub fn new(limit: usize, metrics: &BufferMetrics) -> Arc<Self> {
        let budget = Self {
            held: metrics.held.clone(),
            limit: AtomicI64::new(0),
            limit_gauge: metrics.limit.clone(),
            refused_bodies: metrics.refused(Refusal::RequestBody),
            refused_answers: metrics.refused(Refusal::Answer),
        };
        budget.set_limit(limit);
        Arc::new(budget)
    }

    /// Sets the limit (a reload): buffers already held keep their bytes, and new ones get
    /// room once the total is under the new limit.
    pub fn set_limit(&self, limit: usize) {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.limit.store(limit, Ordering::Relaxed);
        self.limit_gauge.set(limit);
    }

    /// The bytes held now.
    pub fn held(&self) -> u64 {
        self.held.get().max(0) as u64
    }

    /// A charge of nothing yet, against this budget.
    pub fn charge(self: &Arc<Self>) -> Charge {
        Charge {
            budget: Some(Arc::clone(self)),
            bytes: 0,
        }
    }

    /// Counts a refusal.
    pub fn refused(&self, what: Refusal) {
        match what {
            Refusal::RequestBody => self.refused_bodies.inc(),
            Refusal::Answer => self.refused_answers.inc(),
        };
    }

    /// Takes `n` bytes if the total stays within the limit.
    fn take(&self, n: u64) -> bool {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let limit = self.limit.load(Ordering::Relaxed);
        self.held
            .inner()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|total| *total <= limit)
            })
            .is_ok()
    }

    /// Gives `n` bytes back.
    fn give_back(&self, n: u64) {
        self.held.dec_by(n as i64);
    }
}

/// Bytes taken from a [`Budget`] for one buffer, given back when it drops.
#[derive(Debug, Default)]
pub struct Charge {
    /// `None`: unbounded (a buffer no budget covers).
    budget: Option<Arc<Budget>>,
    bytes: u64,
}

impl Charge {
    /// A charge against no budget: every size fits.
    pub fn unbounded() -> Self {
        Self::default()
    }

    /// Makes the charge `total` bytes: takes the difference if it grows (false, the charge
    /// unchanged, if the budget has no room for it), gives it back if it shrinks.
    pub fn resize(&mut self, total: usize) -> bool {
        let total = total as u64;
        let Some(budget) = &self.budget else {
            self.bytes = total;
            return true;
        };
        if total > self.bytes {
            if !budget.take(total - self.bytes) {
                return false;
            }
        } else {
            budget.give_back(self.bytes - total);
        }
        self.bytes = total;
        true
    }

    /// `data`, which this charge pays for, made to hold the charge until its last part
    /// drops. A charge of nothing costs nothing to attach.
    pub fn attach<T>(self, data: T) -> Bytes
    where
        T: AsRef<[u8]> + Send + 'static,
        Bytes: From<T>,
    {
        if self.bytes == 0 || self.budget.is_none() {
            return Bytes::from(data);
        }
        Bytes::from_owner(Charged {
            data,
            _charge: self,
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.give_back(self.bytes);
        }
    }
}

/// A buffer with the charge that pays for it.
struct Charged<T> {
    data: T,
    _charge: Charge,
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Charged<T> {
    fn as_ref(&self) -> &[u8] {
        self.data.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn a_charge_past_the_limit_is_refused_and_the_budget_unchanged() {
        let metrics = Metrics::new();
        let budget = Budget::new(100, metrics.buffers());
        let mut a = budget.charge();
        assert!(a.resize(60));
        let mut b = budget.charge();
        assert!(!b.resize(50));
        assert_eq!(budget.held(), 60);
        assert!(b.resize(40));
        assert_eq!(budget.held(), 100);
        drop(a);
        assert_eq!(budget.held(), 40);
        assert!(b.resize(10));
        assert_eq!(budget.held(), 10);
    }

    /// The charge lasts as long as any part of the buffer it was attached to.
    #[test]
    fn an_attached_charge_is_given_back_when_the_last_part_drops() {
        let metrics = Metrics::new();
        let budget = Budget::new(1000, metrics.buffers());
        let mut charge = budget.charge();
        assert!(charge.resize(10));
        let mut whole = charge.attach(vec![7u8; 10]);
        let part = whole.split_to(4);
        drop(whole);
        assert_eq!(budget.held(), 10);
        assert_eq!(&part[..], &[7u8; 4]);
        drop(part);
        assert_eq!(budget.held(), 0);
    }
}
