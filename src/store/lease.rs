//! [`Lease`]: ownership of a claimed key as a value. While it lives the claim does not
//! lapse, so a slow upstream never lets a duplicate execute: on Redis the store's renewing
//! task renews it (`store::renewals`), on the memory store the lease holds the claim's
//! [`Liveness`]. Dropping it unfinished releases the key (pingora's `WritePermit` idea), so
//! a cancelled or panicking owner frees the key for a retry instead of blocking it until
//! the lease runs out.

use std::time::Duration;

use super::memory::Liveness;
use super::renewals::Renewal;
use super::{OwnerToken, Store, StoreError, StoredResponse};
use crate::key::Digest;

/// Ownership of one key. Finish it with [`Lease::complete`] or [`Lease::release`].
#[derive(Debug)]
pub struct Lease {
    store: Store,
    key: Digest,
    token: OwnerToken,
    /// Redis: keeps the claim on the store's renewal list.
    renewal: Option<Renewal>,
    /// Memory store: keeps the claim alive instead of a renewer.
    liveness: Option<Liveness>,
    finished: bool,
}

impl Lease {
    pub(crate) fn start(
        store: Store,
        key: Digest,
        token: OwnerToken,
        lease: Duration,
        liveness: Option<Liveness>,
    ) -> Self {
        let renewal = match (&store, &liveness) {
            (Store::Redis(redis), None) => Some(redis.renewals().hold(redis, key, token, lease)),
            _ => None,
        };
        Self {
            store,
            key,
            token,
            renewal,
            liveness,
            finished: false,
        }
    }

    /// The owned key.
    pub fn key(&self) -> Digest {
        self.key
    }

    /// The fencing token of this ownership.
    pub fn token(&self) -> OwnerToken {
        self.token
    }

    /// Stores the response for `ttl`. `Ok(false)`: the lease had been taken over, nothing
    /// was written.
    pub async fn complete(
        mut self,
        response: StoredResponse,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.stop_renewing();
        self.finished = true;
        self.store
            .complete(self.key, self.token, response, ttl)
            .await
    }

    /// Frees the key so the next request with it executes.
    pub async fn release(self) -> Result<bool, StoreError> {
        self.release_as(None).await
    }

    /// Frees the key; with `reissue`, a one-time token's key goes back to issued instead.
    pub async fn release_as(mut self, reissue: Option<Duration>) -> Result<bool, StoreError> {
        self.stop_renewing();
        self.finished = true;
        self.store.release_as(self.key, self.token, reissue).await
    }

    /// Gives the claim up without releasing it, as an owner that crashed would: nothing
    /// renews it any more, and a retry takes over once the lease has passed. For tests of
    /// takeover and fencing; a real owner completes or releases.
    #[doc(hidden)]
    pub fn abandon(mut self) {
        self.stop_renewing();
        self.liveness = None;
        self.finished = true;
    }

    fn stop_renewing(&mut self) {
        self.renewal = None;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop_renewing();
        if self.finished {
            return;
        }
        tracing::warn!(key = %self.key.short(), "claim dropped unfinished; releasing it");
        let (store, key, token) = (self.store.clone(), self.key, self.token);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = store.release(key, token).await;
            });
        }
    }
}
