//! The Redis store's completion channels: which waiters listen on which channel, the
//! `SUBSCRIBE` and `UNSUBSCRIBE` that keep Redis in step with them, and the wake-ups that
//! arrive as RESP3 pushes on the shared connection.
//!
//! A waiter may look at (and mark) a record only once Redis has confirmed its channel's
//! subscription, or a completion published in between would reach no one; so every waiter,
//! not only the first on a channel, waits for that confirmation. `SUBSCRIBE` and
//! `UNSUBSCRIBE` are sent one at a time: the last waiter's `UNSUBSCRIBE`, sent from a task
//! after it left, could otherwise land after a new first waiter's `SUBSCRIBE` and leave it
//! deaf until its fallback re-check.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, watch, OnceCell};

use super::conn::Conn;
use crate::sync::lock;

/// Waiters by notification channel, and the order of what is sent about them.
#[derive(Default)]
pub(super) struct Channels {
    waiting: Mutex<HashMap<Vec<u8>, Channel>>,
    sending: tokio::sync::Mutex<()>,
}

/// One channel's waiters.
struct Channel {
    wake: watch::Sender<()>,
    waiters: usize,
    /// Set once Redis confirmed the `SUBSCRIBE`; unset again only with the whole entry.
    subscribed: Arc<OnceCell<()>>,
}

impl Channels {
    /// Joins `channel`'s waiters: the receiver its wake-ups arrive on and the share that
    /// keeps it subscribed once [`Subscription::subscribed`] has resolved.
    pub(super) fn join(
        self: &Arc<Self>,
        channel: String,
        conn: Conn,
    ) -> (watch::Receiver<()>, Subscription) {
        let mut waiting = lock(&self.waiting);
        let entry = waiting
            .entry(channel.as_bytes().to_vec())
            .or_insert_with(|| Channel {
                wake: watch::channel(()).0,
                waiters: 0,
                subscribed: Arc::default(),
            });
        entry.waiters += 1;
        let subscription = Subscription {
            channel,
            subscribed: Arc::clone(&entry.subscribed),
            channels: Arc::clone(self),
            conn,
        };
        (entry.wake.subscribe(), subscription)
    }
}

/// A waiter's share of a channel subscription; the last one out unsubscribes.
pub struct Subscription {
    channel: String,
    subscribed: Arc<OnceCell<()>>,
    channels: Arc<Channels>,
    conn: Conn,
}

impl Subscription {
    /// Resolves once Redis has confirmed the channel's subscription, sending the
    /// `SUBSCRIBE` if no waiter has yet (or the last attempt failed).
    pub(super) async fn subscribed(&self) -> redis::RedisResult<()> {
        self.subscribed
            .get_or_try_init(|| async {
                let _order = self.channels.sending.lock().await;
                self.conn.handle().await?.subscribe(&self.channel).await
            })
            .await
            .map(|_| ())
    }
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("channel", &self.channel)
            .finish()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let last = {
            let mut waiting = lock(&self.channels.waiting);
            match waiting.get_mut(self.channel.as_bytes()) {
                Some(entry) if entry.waiters > 1 => {
                    entry.waiters -= 1;
                    false
                }
                Some(_) => {
                    waiting.remove(self.channel.as_bytes());
                    true
                }
                None => false,
            }
        };
        if !last {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (channel, channels) = (self.channel.clone(), Arc::clone(&self.channels));
        let conn = self.conn.clone();
        rt.spawn(async move {
            let _order = channels.sending.lock().await;
            // A waiter that joined since has subscribed, or will after this: either way
            // the subscription is its now.
            if lock(&channels.waiting).contains_key(channel.as_bytes()) {
                return;
            }
            if let Ok(mut handle) = conn.handle().await {
                let _ = handle.unsubscribe(&channel).await;
            }
        });
    }
}

/// Wakes the waiters of each channel a completion is published on. A lost connection wakes
/// everyone, since messages may have been missed while it was down.
pub(super) async fn dispatch(
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    channels: Weak<Channels>,
) {
    while let Some(push) = pushes.recv().await {
        let Some(channels) = channels.upgrade() else {
            return;
        };
        let waiting = lock(&channels.waiting);
        match push.kind {
            PushKind::Message => {
                if let Some(Value::BulkString(name)) = push.data.first() {
                    if let Some(channel) = waiting.get(name) {
                        channel.wake.send_replace(());
                    }
                }
            }
            PushKind::Disconnection => {
                for channel in waiting.values() {
                    channel.wake.send_replace(());
                }
            }
            _ => {}
        }
    }
}
