//! Bounds on what settlements a shared store failed hold while they are made again in the
//! background (`lease::settle_again`). Each holds its answer (up to `max_answer`) for as
//! long as the claim's record may last: a lease, then the lapse span (a route's whole `ttl`
//! for `on_unknown_outcome: hold`). A store that takes claims but fails or times out their
//! settlements (a flapping Redis, a SQL table whose writes time out) would otherwise let
//! those answers pile up for hours, charged to nothing.
//!
//! Two bounds. At most [`MAX_SETTLING`] run at once in a process: past it a settlement is
//! given up, as `unanswered` gives up a release past its own cap, with a warning, and
//! counted as a settlement lost. And their answers hold at most what the store's
//! [`AnswerRoom`] has room for: a settlement whose answer finds none is made again without
//! it ([`Settlement::without_answer`]), "executed, answer not stored" for a done record,
//! so its repeats get the answer-not-stored 409 and never run again (a failure's key is
//! released instead, without its page: a waiter may take it over), with a warning, counted in
//! `idemgate_store_retried_answers_dropped_total`. Never given up for want of room: the
//! smaller record still lands, and the key ends executed, never free.
//!
//! The proxy gives its store a room in its buffer budget (`proxy::budget::RetriedAnswers`):
//! answers held by retries count as one more connection's buffers, at most
//! `connections.max_buffered_per_connection`, within `connections.max_buffered`. A store
//! used on its own has [`DEFAULT_ROOM`] bytes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use super::background::Place;
use super::claim::Ownership;
use super::settlement::Settlement;
use super::Store;

/// At most this many settlements are made again at once in a process, as
/// `unanswered::MAX_RELEASING` bounds releases: one a task until it lands or its claim's
/// record is gone.
pub(super) const MAX_SETTLING: usize = 4096;
/// The bytes answers made again may hold on a store no proxy gave a room
/// ([`Store::keep_retried_answers_in`]): the default `max_buffered_per_connection`.
pub const DEFAULT_ROOM: usize = 64 << 20;

/// Settlements being made again now, in this process.
pub(super) static SETTLING: AtomicUsize = AtomicUsize::new(0);

/// What holds bytes for an answer while it is held, and gives them back when dropped.
pub type Held = Box<dyn Send + Sync>;

/// Where the answers of settlements made again in the background take their bytes from.
pub trait AnswerRoom: Send + Sync + std::fmt::Debug {
    /// Takes `bytes` for one answer, held until the returned value drops; `None`: no room.
    fn take(&self, bytes: usize) -> Option<Held>;
}

/// A room of a fixed number of bytes, counted here.
#[derive(Debug)]
pub struct FixedRoom {
    held: Arc<AtomicUsize>,
    limit: usize,
}

impl FixedRoom {
    /// A room of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            held: Arc::default(),
            limit,
        }
    }

    /// The bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

impl AnswerRoom for FixedRoom {
    fn take(&self, bytes: usize) -> Option<Held> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .ok()?;
        Some(Box::new(FixedHeld(Arc::clone(&self.held), bytes)))
    }
}

/// Bytes of a [`FixedRoom`], given back when dropped.
struct FixedHeld(Arc<AtomicUsize>, usize);

impl Drop for FixedHeld {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::AcqRel);
    }
}

/// What a shared store keeps for its settlements made again: their room, and how many
/// answers found none.
#[derive(Debug)]
pub(crate) struct Settling {
    room: RwLock<Arc<dyn AnswerRoom>>,
    dropped: AtomicU64,
}

impl Default for Settling {
    fn default() -> Self {
        Self {
            room: RwLock::new(Arc::new(FixedRoom::new(DEFAULT_ROOM))),
            dropped: AtomicU64::new(0),
        }
    }
}

impl Settling {
    /// Answers made again from now on take their bytes from `room`.
    pub(crate) fn set_room(&self, room: Arc<dyn AnswerRoom>) {
        *self.room.write().unwrap_or_else(|p| p.into_inner()) = room;
    }

    /// Answers made again without their bytes, for want of room, since start.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn room(&self) -> Arc<dyn AnswerRoom> {
        Arc::clone(&self.room.read().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A settlement admitted to be made again: what to write, and what it holds meanwhile.
pub(super) struct Admitted {
    /// The settlement, without its answer if the answer found no room.
    pub settlement: Settlement,
    /// Held until it is done.
    pub holds: Holds,
}

/// A settlement's place among those `SETTLING` counts and its answer's bytes, both
/// given back when dropped.
pub(super) struct Holds {
    _place: Place,
    _bytes: Option<Held>,
}

/// Admits `settlement` of `owned` to be made again in the background, counted in
/// `settling`: `None` past [`MAX_SETTLING`] (given up, warned, counted as lost); else
/// with its answer if `store`'s room has room for it, without it otherwise (warned and
/// counted).
pub(super) fn admit(
    settling: &'static AtomicUsize,
    store: &Store,
    owned: &Ownership,
    settlement: Settlement,
) -> Option<Admitted> {
    let key = owned.key.short();
    let Some(place) = Place::take(settling, MAX_SETTLING) else {
        tracing::warn!(
            %key,
            settled = settlement.as_str(),
            settling = MAX_SETTLING,
            "too many settlements are being made again; given up, the claim lapses"
        );
        store.settlement_lost();
        return None;
    };
    let bytes = settlement.answer_size();
    let counts = store.settling();
    let (settlement, held) = match counts {
        Some(counts) if bytes > 0 => match counts.room().take(bytes) {
            Some(held) => (settlement, Some(held)),
            None => {
                counts.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    %key,
                    settled = settlement.as_str(),
                    bytes,
                    "no room to hold the answer while its settlement is made again: made again without it (executed, answer not stored)"
                );
                // A done record kept for no time frees its key whatever it holds.
                let smaller = settlement
                    .without_answer()
                    .unwrap_or(Settlement::Release { reissue: None });
                (smaller, None)
            }
        },
        _ => (settlement, None),
    };
    Some(Admitted {
        settlement,
        holds: Holds {
            _place: place,
            _bytes: held,
        },
    })
}

#[cfg(test)]
mod tests;
