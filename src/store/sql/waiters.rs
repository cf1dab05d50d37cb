//! Which keys duplicates in this process wait on, and their wake-ups: fed by the
//! database's side of the store (PostgreSQL's notifications, MySQL's re-check of the
//! waited-on keys) and by this process's own settlements.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{watch, Notify};

use crate::key::Digest;
use crate::store::OwnerToken;
use crate::sync::lock;

/// The waited-on keys of one store.
#[derive(Debug)]
pub struct Interests {
    keys: Mutex<HashMap<Digest, Entry>>,
    /// Whether notifications arrive (PostgreSQL: the listener has run its `LISTEN`).
    listening: watch::Sender<bool>,
    /// Wakes a re-check task that sleeps while nobody waits.
    joined: Notify,
}

impl Default for Interests {
    fn default() -> Self {
        Self {
            keys: Mutex::default(),
            listening: watch::channel(false).0,
            joined: Notify::new(),
        }
    }
}

#[derive(Debug)]
struct Entry {
    wake: watch::Sender<()>,
    waiters: usize,
    /// The owner the waiters wait on.
    owner: OwnerToken,
}

/// One waiter's interest in a key; dropping it leaves.
#[derive(Debug)]
pub struct Interest {
    key: Digest,
    interests: Arc<Interests>,
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut keys = lock(&self.interests.keys);
        if let Some(entry) = keys.get_mut(&self.key) {
            entry.waiters -= 1;
            if entry.waiters == 0 {
                keys.remove(&self.key);
            }
        }
    }
}

impl Interests {
    /// Joins the waiters on `key`, whose claim `owner` holds: the receiver its wake-up
    /// arrives on and the interest that keeps it registered. Waiters on an earlier owner of
    /// the key are woken (they look again and find this one).
    pub(super) fn join(
        self: &Arc<Self>,
        key: Digest,
        owner: OwnerToken,
    ) -> (watch::Receiver<()>, Interest) {
        let mut keys = lock(&self.keys);
        let entry = keys.entry(key).or_insert_with(|| Entry {
            wake: watch::channel(()).0,
            waiters: 0,
            owner,
        });
        if entry.owner != owner {
            entry.wake.send_replace(());
            entry.owner = owner;
        }
        entry.waiters += 1;
        let receiver = entry.wake.subscribe();
        drop(keys);
        self.joined.notify_one();
        (
            receiver,
            Interest {
                key,
                interests: Arc::clone(self),
            },
        )
    }

    /// Wakes the waiters on `key`.
    pub(super) fn wake(&self, key: &Digest) {
        if let Some(entry) = lock(&self.keys).get(key) {
            entry.wake.send_replace(());
        }
    }

    /// Wakes every waiter (notifications may have been missed).
    pub(super) fn wake_all(&self) {
        for entry in lock(&self.keys).values() {
            entry.wake.send_replace(());
        }
    }

    /// The waited-on keys and the owners waited on.
    pub(super) fn watched(&self) -> Vec<(Digest, OwnerToken)> {
        lock(&self.keys)
            .iter()
            .map(|(key, entry)| (*key, entry.owner))
            .collect()
    }

    /// Resolves once a waiter joins (for a task that sleeps while nobody waits).
    pub(super) async fn joined(&self) {
        self.joined.notified().await;
    }

    /// Says whether notifications arrive now.
    pub(super) fn set_listening(&self, on: bool) {
        self.listening.send_replace(on);
    }

    /// Resolves once notifications arrive.
    pub(super) async fn listening(&self) {
        let mut listening = self.listening.subscribe();
        // The sender lives as long as `self`.
        let _ = listening.wait_for(|on| *on).await;
    }
}
