//! [`ConnShare`]: what one client connection may hold of the proxy, whether its client stays
//! or not: its slot under `connections.max_client`, at most `connections.max_streams`
//! owners running at once, and what its buffers hold of the buffer budget (at most
//! `connections.max_buffered_per_connection`, counted in [`ConnBuffers`]; see
//! [`super::budget`]).
//!
//! An owner whose request went out runs on when its client leaves (SPEC 5): hyper drops
//! the request's future when its HTTP/2 stream is reset or its connection closes, and the
//! owner detaches ([`super::detach`]). Without a share, each reset frees an HTTP/2 stream
//! for the next request while the upstream call it started runs on, so one connection
//! sending whole requests and resetting them at once (a rapid reset of requests already
//! read, CVE-2023-44487's shape) has upstream calls run without bound; the usual answer,
//! cancelling what a reset stream started, is the one the proxy must not give (the request
//! may have run). So an owner counts against the connection that started it until it
//! ends: a protected request takes room before its claim (a duplicate keeps it while it
//! waits, an owner until it ends), one that finds none is refused (`503
//! connection-busy`) with nothing claimed, and a connection that closes keeps its
//! `max_client` slot until its last owner ends. A client that resets or leaves thus has no more owners running than one that
//! waits for its answers: `max_client` × `max_streams` in all.
//!
//! Per connection rather than per process: a cap shared by all would let one client's
//! abandoned requests refuse everyone else's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::OwnedSemaphorePermit;

use super::budget::ConnBuffers;

/// One client connection's share; see the [module docs](self). Shared by the connection
/// and every owner it started: the slot goes back when the last of them drops it.
#[derive(Debug)]
pub struct ConnShare {
    /// Owners running now, attached to their client or detached.
    running: AtomicUsize,
    /// The most that may run at once (`connections.max_streams`).
    limit: usize,
    /// What its requests' buffers hold of the budget. Its own `Arc`: a buffer that outlives
    /// the connection and its owners (handed to a streamed answer) keeps the count, not
    /// the slot.
    buffers: Arc<ConnBuffers>,
    /// Up while the connection is closed and owners it started still run: it is counted
    /// in `idemgate_client_connections_outlived` until the share drops (before the slot
    /// goes back: fields drop in order).
    outlived: Mutex<Option<Raised>>,
    /// The connection's slot under `connections.max_client`; `None`: no cap.
    _slot: Option<OwnedSemaphorePermit>,
}

/// A gauge raised by one until dropped.
#[derive(Debug)]
struct Raised(Gauge);

impl Drop for Raised {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One owner counted in its connection's [`ConnShare`] until dropped.
#[derive(Debug)]
pub struct Owning(Arc<ConnShare>);

impl Drop for Owning {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ConnShare {
    /// The share of a connection that holds `slot` and may have `limit` owners running.
    pub fn new(limit: usize, slot: Option<OwnedSemaphorePermit>) -> Arc<Self> {
        Arc::new(Self {
            running: AtomicUsize::new(0),
            limit,
            buffers: Arc::default(),
            outlived: Mutex::new(None),
            _slot: slot,
        })
    }

    /// A share with no slot and no limit (connections no cap applies to).
    pub fn unbounded() -> Arc<Self> {
        Self::new(usize::MAX, None)
    }

    /// Room for one more owner, or `None` if the connection has `limit` running.
    pub fn try_own(self: &Arc<Self>) -> Option<Owning> {
        self.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()?;
        Some(Owning(Arc::clone(self)))
    }

    /// Owners running now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// The most owners that may run at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// What the connection's buffers hold of the budget.
    pub fn buffers(&self) -> &Arc<ConnBuffers> {
        &self.buffers
    }

    /// The connection has closed: if owners it started still run, `outlived` counts it
    /// until the last of them ends (when the share, and with it the slot, drops). An owner
    /// ending meanwhile only shortens that.
    pub fn closed(&self, outlived: &Gauge) {
        if self.running() > 0 {
            outlived.inc();
            let raised = Raised(outlived.clone());
            *self.outlived.lock().unwrap_or_else(|e| e.into_inner()) = Some(raised);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_past_the_limit_find_no_room_until_one_ends() {
        let share = ConnShare::new(2, None);
        let first = share.try_own().unwrap();
        let _second = share.try_own().unwrap();
        assert!(share.try_own().is_none());
        drop(first);
        assert!(share.try_own().is_some());
    }

    /// The slot goes back, and the gauge down, only when the last owner of a closed
    /// connection ends.
    #[test]
    fn a_closed_connection_keeps_its_slot_until_its_last_owner_ends() {
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let outlived = Gauge::default();
        let share = ConnShare::new(4, Some(Arc::clone(&slots).try_acquire_owned().unwrap()));
        let owner = share.try_own().unwrap();
        share.closed(&outlived);
        drop(share);
        assert_eq!(outlived.get(), 1);
        assert_eq!(slots.available_permits(), 0);
        drop(owner);
        assert_eq!(outlived.get(), 0);
        assert_eq!(slots.available_permits(), 1);
        // Closed with no owner running: nothing outlives it.
        let share = ConnShare::new(4, Some(Arc::clone(&slots).try_acquire_owned().unwrap()));
        share.closed(&outlived);
        assert_eq!(outlived.get(), 0);
        drop(share);
        assert_eq!(slots.available_permits(), 1);
    }
}
