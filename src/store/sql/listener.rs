//! PostgreSQL's wake-ups: one connection per store `LISTEN`s on the table's channel, where
//! a settlement of a record a duplicate waits on `NOTIFY`s the key (hex). A waiter joins
//! its key's interest and waits for the listener to be listening before it looks at (and
//! marks) the record, so a settlement after that look is always heard.
//!
//! A lost connection wakes every waiter (notifications may have been missed) and is
//! reconnected; until it listens again, waiters wait for it (within the store timeout).
//!
//! The connection comes from a pool of its own ([`pool`]), not the store's: a
//! `PgListener` keeps the pooled connection it takes, and taken from the store's pool it
//! would leave `max_connections - 1` for statements (none with `max_connections: 1`).

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};

use super::waiters::Interests;
use crate::key::Digest;

/// Pause before connecting again after a failure.
const RECONNECT_AFTER: Duration = Duration::from_millis(200);

/// The `LISTEN` connection's pool: one connection to `options`, connected when the
/// listener asks for it (within `timeout`), with neither a lifetime nor an idle limit,
/// as the pool `PgListener::connect` makes for itself: the listener holds it while it
/// listens, and takes another only once it is lost.
pub(super) fn pool(options: PgConnectOptions, timeout: Duration) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(timeout)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_lazy_with(options)
}

/// Listens on `channel` and wakes the waiters of each notified key, reconnecting for as
/// long as the task runs (the store aborts it when dropped).
/// `pool` is the listener's own ([`pool`]).
pub(super) async fn listen(pool: PgPool, channel: String, interests: Arc<Interests>) {
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(e) => {
                tracing::debug!(error = %e, "cannot connect the LISTEN connection yet");
                tokio::time::sleep(RECONNECT_AFTER).await;
                continue;
            }
        };
        if let Err(e) = listener.listen(&channel).await {
            tracing::debug!(error = %e, "LISTEN failed");
            tokio::time::sleep(RECONNECT_AFTER).await;
            continue;
        }
        interests.set_listening(true);
        // Anything settled while no one listened went unheard.
        interests.wake_all();
        // `Ok(None)` or an error: the connection is lost.
        while let Ok(Some(notification)) = listener.try_recv().await {
            let mut key = Digest::NONE;
            if hex::decode_to_slice(notification.payload(), &mut key.0).is_ok() {
                interests.wake(&key);
            }
        }
        interests.set_listening(false);
        interests.wake_all();
        tracing::warn!("the LISTEN connection to PostgreSQL was lost; reconnecting");
    }
}
