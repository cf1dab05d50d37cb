//! What all of the memory store's shards hold together ([`Totals`]): records and bytes in
//! all, which the bounds are checked against, and by caller and by client address, which
//! `caller_share` and `address_share` are checked against. Kept in atomics and striped
//! locks, so a shard updates them without taking another shard's lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::tags::{Layout, Tags};
use super::MemoryLimits;
use crate::sync::lock;

/// Records and record bytes over all shards, and by caller and by address where the store
/// limits their shares.
#[derive(Debug, Default)]
pub(super) struct Totals {
    pub entries: AtomicUsize,
    pub bytes: AtomicUsize,
    /// Unspent one-time tokens (expired ones not yet swept included), held to their
    /// budget ([`MemoryLimits::token_share`](super::MemoryLimits::token_share)).
    pub issued: AtomicUsize,
    /// How records' [`Tags`] are packed.
    pub layout: Layout,
    pub callers: Holders,
    pub addresses: Holders,
}

impl Totals {
    pub fn new(limits: &MemoryLimits) -> Self {
        Self {
            layout: Layout::of(limits),
            ..Self::default()
        }
    }

    /// Counts a record of `cost` bytes: in all, and against its caller and its address.
    /// Every record written goes through here, and every record removed through
    /// [`Totals::remove`] with the same tags and cost.
    pub fn add(&self, tags: Tags, cost: usize) {
        self.callers.add(self.layout.caller(tags).0, cost);
        self.addresses.add(self.layout.address(tags).0, cost);
        self.entries.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(cost, Ordering::Relaxed);
    }

    /// Takes back what [`Totals::add`] counted for a record.
    pub fn remove(&self, tags: Tags, cost: usize) {
        self.callers.sub(self.layout.caller(tags).0, cost);
        self.addresses.sub(self.layout.address(tags).0, cost);
        self.bytes.fetch_sub(cost, Ordering::Relaxed);
        self.entries.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Records and bytes held by each holder (a caller or an address, by tag), striped by tag
/// so that holders seldom share a lock. Empty (and never locked) when its share is not
/// set: records then carry tag 0, which is not counted.
#[derive(Debug)]
pub(super) struct Holders {
    stripes: Box<[Mutex<Held>]>,
}

/// Records and bytes held, by tag.
type Held = HashMap<u32, (usize, usize)>;

impl Default for Holders {
    fn default() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| Mutex::default()).collect(),
        }
    }
}

const STRIPES: usize = 16;

impl Holders {
    fn stripe(&self, tag: u32) -> std::sync::MutexGuard<'_, Held> {
        lock(&self.stripes[tag as usize % STRIPES])
    }

    fn add(&self, tag: u32, bytes: usize) {
        if tag != 0 {
            let mut stripe = self.stripe(tag);
            let held = stripe.entry(tag).or_default();
            held.0 += 1;
            held.1 += bytes;
        }
    }

    fn sub(&self, tag: u32, bytes: usize) {
        if tag == 0 {
            return;
        }
        let mut stripe = self.stripe(tag);
        if let Some(held) = stripe.get_mut(&tag) {
            held.0 = held.0.saturating_sub(1);
            held.1 = held.1.saturating_sub(bytes);
            if held.0 == 0 {
                stripe.remove(&tag);
            }
        }
    }

    /// Records and bytes the holder tagged `tag` holds now.
    pub fn held(&self, tag: u32) -> (usize, usize) {
        if tag == 0 {
            return (0, 0);
        }
        self.stripe(tag).get(&tag).copied().unwrap_or_default()
    }

    /// Records and bytes held by all holders together (for tests: a count a path forgot
    /// to take back, or to make, shows as a difference from the store's totals).
    #[cfg(test)]
    pub fn total(&self) -> (usize, usize) {
        self.stripes
            .iter()
            .fold((0, 0), |(records, bytes), stripe| {
                lock(stripe)
                    .values()
                    .fold((records, bytes), |(r, b), held| (r + held.0, b + held.1))
            })
    }

    /// Whether no holder holds anything (for tests).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.stripes.iter().all(|stripe| lock(stripe).is_empty())
    }
}
