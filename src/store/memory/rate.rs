//! The memory store's rate-limit counters: one per caller (scope) per fixed window, at most
//! `max_entries` of them beside the records, expiring without a timer.
//!
//! Expiry is indexed as the records' is (see `shard`): one FIFO per window length, so each
//! queue is sorted by construction, and every hit drops a few counters whose window has
//! ended: O(1) amortized, and a bounded amount of work under the lock on every hit, never
//! a scan. A counter started again after its window ended leaves its old queue entry
//! stale; stale entries have ended too, so hits drop them as they drop counters, and the
//! queues hold at most about twice the counters.
//!
//! When `max_entries` counters are running, a caller without one is not counted: it is
//! answered as over any rate ([`Counters::REFUSED`]), so the token endpoint answers 429
//! with a `Retry-After` of one window, by when every counter running now has ended.

use std::collections::VecDeque;
use std::time::Duration;

use super::record::Ticks;
use crate::key::{Digest, DigestMap};

/// Every caller's counter in its current window.
#[derive(Debug, Default)]
pub(super) struct Counters {
    /// Caller → (window end, hits in the window).
    map: DigestMap<(Ticks, u64)>,
    /// Counters by window end, one queue per window length; entries whose counter ended
    /// or started again are stale.
    queues: Vec<WindowQueue>,
    /// Queue entries looked at by the latest hit (for tests).
    #[cfg(test)]
    pub steps: usize,
}

#[derive(Debug)]
struct WindowQueue {
    window: Duration,
    ends: VecDeque<(Ticks, Digest)>,
}

/// Ended counters dropped per hit: more than a hit can add, so ended ones never pile up.
const SWEEP_PER_HIT: usize = 4;
/// [`SWEEP_PER_HIT`] + [`SWEEP_WHEN_FULL`], the most steps of one hit (for tests).
#[cfg(test)]
pub(super) const TEST_MOST_STEPS: usize = SWEEP_PER_HIT + SWEEP_WHEN_FULL;
/// Ended counters a hit may drop to make room for a new caller in a full store.
const SWEEP_WHEN_FULL: usize = 64;

impl Counters {
    /// The count of a caller that could not be counted: over any rate.
    pub const REFUSED: u64 = u64::MAX;

    /// Counts one hit of `key` at `now` in its window of length `window` (one starts if
    /// none runs) and returns the hits in that window so far; [`Self::REFUSED`] for a new
    /// caller when `most` counters run.
    pub fn hit(&mut self, key: Digest, now: Ticks, window: Duration, most: usize) -> u64 {
        #[cfg(test)]
        {
            self.steps = 0;
        }
        self.sweep(now, SWEEP_PER_HIT);
        match self.map.get_mut(&key) {
            Some((end, hits)) if *end > now => {
                *hits += 1;
                return *hits;
            }
            // Its window ended: it starts again, in the slot it holds.
            Some(_) => {}
            None => {
                if self.map.len() >= most {
                    self.sweep(now, SWEEP_WHEN_FULL);
                }
                if self.map.len() >= most {
                    return Self::REFUSED;
                }
            }
        }
        let end = self.index(key, now, window);
        self.map.insert(key, (end, 1));
        1
    }

    /// Counters held, ended ones not yet dropped included (for tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Enters `key` in the queue of `window` and returns its window's end.
    fn index(&mut self, key: Digest, now: Ticks, window: Duration) -> Ticks {
        let end = now.saturating_add(window.as_nanos().min(u128::from(u64::MAX)) as Ticks);
        let queue = match self.queues.iter().position(|q| q.window == window) {
            Some(i) => &mut self.queues[i],
            None => {
                self.queues.push(WindowQueue {
                    window,
                    ends: VecDeque::new(),
                });
                self.queues.last_mut().expect("just pushed")
            }
        };
        queue.ends.push_back((end, key));
        end
    }

    /// Drops up to `most` queue entries that ended by `now`, with their counters (stale
    /// entries count, so a hit never does more than `most` steps).
    fn sweep(&mut self, now: Ticks, most: usize) {
        for _ in 0..most {
            let Some((index, _)) = self
                .queues
                .iter()
                .enumerate()
                .filter_map(|(i, q)| q.ends.front().map(|(end, _)| (i, *end)))
                .filter(|(_, end)| *end <= now)
                .min_by_key(|(_, end)| *end)
            else {
                break;
            };
            #[cfg(test)]
            {
                self.steps += 1;
            }
            let queue = &mut self.queues[index];
            let (end, key) = queue.ends.pop_front().expect("has a front");
            if queue.ends.is_empty() {
                // A window no issuer uses any more (after a reload) leaves no queue.
                self.queues.swap_remove(index);
            }
            if self.map.get(&key).is_some_and(|(at, _)| *at == end) {
                self.map.remove(&key);
            }
        }
    }

    /// Queue entries, stale ones included (for tests).
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.queues.iter().map(|q| q.ends.len()).sum()
    }
}
