//! What all of the memory store's shards hold together ([`Totals`]): records and bytes in
//! all, which the bounds are checked against, and by caller, which `caller_share` is
//! checked against. Kept in atomics and striped locks, so a shard updates them without
//! taking another shard's lock.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;

use crate::store::CallerTag;
use crate::sync::lock;

/// Records and record bytes over all shards, and by caller where the store limits each
/// caller's share.
#[derive(Debug, Default)]
pub(super) struct Totals {
    pub entries: AtomicUsize,
    pub bytes: AtomicUsize,
    /// Unspent one-time tokens (expired ones not yet swept included), held to their
    /// budget ([`MemoryLimits::token_share`](super::MemoryLimits::token_share)).
    pub issued: AtomicUsize,
    pub callers: Callers,
}

/// Records and bytes held by each caller, striped by caller so that callers seldom share a
/// lock. Empty (and never locked) when no share is set: records then carry
/// [`CallerTag::NONE`].
#[derive(Debug)]
pub(super) struct Callers {
    stripes: Box<[Mutex<Held>]>,
}

/// Records and bytes held, by caller tag.
type Held = HashMap<u32, (usize, usize)>;

impl Default for Callers {
    fn default() -> Self {
        Self {
            stripes: (0..CALLER_STRIPES).map(|_| Mutex::default()).collect(),
        }
    }
}

const CALLER_STRIPES: usize = 16;

impl Callers {
    fn stripe(&self, caller: CallerTag) -> std::sync::MutexGuard<'_, Held> {
        lock(&self.stripes[caller.0 as usize % CALLER_STRIPES])
    }

    pub(super) fn add(&self, caller: CallerTag, bytes: usize) {
        if caller != CallerTag::NONE {
            let mut stripe = self.stripe(caller);
            let held = stripe.entry(caller.0).or_default();
            held.0 += 1;
            held.1 += bytes;
        }
    }

    pub(super) fn sub(&self, caller: CallerTag, bytes: usize) {
        if caller == CallerTag::NONE {
            return;
        }
        let mut stripe = self.stripe(caller);
        if let Some(held) = stripe.get_mut(&caller.0) {
            held.0 = held.0.saturating_sub(1);
            held.1 = held.1.saturating_sub(bytes);
            if held.0 == 0 {
                stripe.remove(&caller.0);
            }
        }
    }

    /// Records and bytes `caller` holds now.
    pub fn held(&self, caller: CallerTag) -> (usize, usize) {
        if caller == CallerTag::NONE {
            return (0, 0);
        }
        self.stripe(caller)
            .get(&caller.0)
            .copied()
            .unwrap_or_default()
    }
}
