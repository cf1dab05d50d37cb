//! A duplicate's wait for the owner of an in-flight key ([`Waiter`]). The waiter resolves
//! when the owner settles (its notification) or when the owner's lease as seen at claim
//! time runs out, and the caller then claims again; so a waiter never trusts a wake-up
//! alone, and a missed one costs a re-check, never a wrong answer.
//!
//! How the wake-up arrives is the backend's business: a channel closed by the memory
//! store, a Redis subscription, a SQL store's interest in the key. A waiter holds what
//! keeps that coming for as long as it waits.

use std::time::Instant;

use tokio::sync::watch;

use super::claim::OwnerToken;
use super::redis::subscriptions::Subscription as RedisSubscription;
use super::sql::Interest as SqlInterest;

/// A duplicate's handle on an in-flight key: resolves when the owner finishes (a
/// notification), or when the owner's lease as seen at claim time runs out (it may have
/// vanished), whichever comes first; the caller then claims again, naming
/// [`Waiter::owner`] as [`ClaimArgs::after`](super::ClaimArgs::after) (and
/// [`Waiter::owner_lapsed`] as [`ClaimArgs::takes_over`](super::ClaimArgs::takes_over)). A live owner's
/// claim moves its lease on (renewed on Redis; on the memory store the claim that looks
/// extends it), so that is one look per lease period (Redis: per second at most), never a
/// busy loop.
#[derive(Debug)]
pub struct Waiter {
    signal: watch::Receiver<()>,
    lease_until: Instant,
    owner: Option<OwnerToken>,
    /// The owner's claim was found lapsed (its route releases lapsed claims).
    owner_lapsed: bool,
    // Keeps the owner's wake-ups coming while someone waits on them.
    _subscription: Option<Subscription>,
}

/// What keeps a waiter's wake-ups coming.
#[derive(Debug)]
enum Subscription {
    /// A Redis channel subscribed.
    Redis { _channel: RedisSubscription },
    /// Interest in a key of a SQL store (notified on PostgreSQL, re-checked on MySQL).
    Sql { _key: SqlInterest },
}

impl Waiter {
    /// A waiter on `owner`'s claim, found lapsed when `owner_lapsed`.
    pub(crate) fn new(
        signal: watch::Receiver<()>,
        lease_until: Instant,
        owner: OwnerToken,
        owner_lapsed: bool,
    ) -> Self {
        Self {
            signal,
            lease_until,
            owner: Some(owner),
            owner_lapsed,
            _subscription: None,
        }
    }

    /// A waiter for a caller that will not wait: waiting on it returns at once, as if
    /// woken, so a caller that did would only look again.
    pub(crate) fn unwatched() -> Self {
        Self {
            signal: watch::channel(()).1,
            lease_until: Instant::now(),
            owner: None,
            owner_lapsed: false,
            _subscription: None,
        }
    }

    /// A waiter woken through a Redis subscription; `recheck_at` bounds how long it trusts
    /// the channel before looking at the record again.
    pub(crate) fn with_subscription(
        signal: watch::Receiver<()>,
        recheck_at: Instant,
        owner: OwnerToken,
        owner_lapsed: bool,
        subscription: RedisSubscription,
    ) -> Self {
        Self {
            signal,
            lease_until: recheck_at,
            owner: Some(owner),
            owner_lapsed,
            _subscription: Some(Subscription::Redis {
                _channel: subscription,
            }),
        }
    }

    /// A waiter woken through its interest in a key of a SQL store; `recheck_at` bounds
    /// how long it trusts the wake-ups before looking at the record again.
    pub(crate) fn watching(
        signal: watch::Receiver<()>,
        recheck_at: Instant,
        owner: OwnerToken,
        owner_lapsed: bool,
        interest: SqlInterest,
    ) -> Self {
        Self {
            signal,
            lease_until: recheck_at,
            owner: Some(owner),
            owner_lapsed,
            _subscription: Some(Subscription::Sql { _key: interest }),
        }
    }

    /// The owner this duplicate waits on.
    pub fn owner(&self) -> Option<OwnerToken> {
        self.owner
    }

    /// Whether the owner's claim was found lapsed, on a route that lets a lapsed claim be
    /// taken over once its grace has passed: the next claim then names it as
    /// [`ClaimArgs::takes_over`](super::ClaimArgs::takes_over), and may take a key it finds
    /// free. A waiter on a live owner never does: a key it finds free was settled.
    pub fn owner_lapsed(&self) -> bool {
        self.owner_lapsed
    }

    /// Waits until the owner settles, the lease runs out, or `deadline`. Returns `false`
    /// only when the deadline came first; the caller then claims again.
    pub async fn wait(mut self, deadline: Instant) -> bool {
        let until = self.lease_until.min(deadline);
        // The sender is dropped when the in-flight record is replaced or removed; that is
        // the notification.
        let changed = self.signal.changed();
        tokio::select! {
            _ = changed => true,
            _ = tokio::time::sleep_until(until.into()) => Instant::now() < deadline,
        }
    }
}
