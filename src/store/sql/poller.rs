//! MySQL's wake-ups: MySQL has no notifications, so one task per store re-checks every
//! key a duplicate in this process waits on, at most every `every` ([`poll`]),
//! with one statement per [`CHUNK`] keys, and wakes the waiters of each key whose row is no
//! longer its owner's claim. It sleeps while nobody waits. A waiter joins before its
//! claim's answer is acted on and the first re-check compares against the owner that
//! claim saw, so a settlement in between is never missed, only seen up to a poll later.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::waiters::Interests;
use crate::key::Digest;
use crate::store::{OwnerToken, StoreError};

/// Keys re-checked by one statement.
pub(super) const CHUNK: usize = 256;

/// A store whose waited-on keys can be re-checked.
pub(super) trait Recheck: Send + Sync + 'static {
    /// Of `keys`, those whose row is a live claim, with its owner.
    fn claimed(
        &self,
        keys: &[Digest],
    ) -> impl Future<Output = Result<Vec<(Digest, OwnerToken)>, StoreError>> + Send;
}

/// Re-checks the waited-on keys of `interests` on `store` every `every` while any are.
pub(super) async fn poll<S: Recheck>(
    store: std::sync::Weak<S>,
    interests: Arc<Interests>,
    every: Duration,
) {
    loop {
        if interests.watched().is_empty() {
            interests.joined().await;
        }
        tokio::time::sleep(every).await;
        let watched = interests.watched();
        let Some(store) = store.upgrade() else {
            return;
        };
        for chunk in watched.chunks(CHUNK) {
            let keys: Vec<Digest> = chunk.iter().map(|(key, _)| *key).collect();
            match store.claimed(&keys).await {
                Ok(claimed) => {
                    for (key, owner) in chunk {
                        if !claimed.contains(&(*key, *owner)) {
                            interests.wake(key);
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "could not re-check waited-on keys");
                    // The waiters look themselves (and fail alike) rather than wait blind.
                    interests.wake_all();
                }
            }
        }
    }
}
