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
//!
//! The connection resubscribes after a reconnect every channel Redis has not confirmed an
//! `UNSUBSCRIBE` of. So a last waiter's `UNSUBSCRIBE` that failed (Redis down, the
//! connection lost) is not forgotten: its channel is kept as a stray and unsubscribed again,
//! backing off, until Redis confirms, or a channel subscribed for nobody would be carried
//! across every reconnect for as long as the process runs.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, watch, OnceCell};

use super::conn::Conn;
use crate::sync::lock;

/// The first wait before a stray channel's `UNSUBSCRIBE` is sent again; it doubles after
/// each failed attempt, up to [`STRAY_RETRY_AT_MOST`].
const STRAY_RETRY_FIRST: Duration = Duration::from_millis(200);

/// The longest wait between two attempts to unsubscribe the stray channels: a Redis down
/// for long is not asked more often than this.
const STRAY_RETRY_AT_MOST: Duration = Duration::from_secs(5);

/// The most stray channels kept. Past it one more is let go with a warning (the connection
/// may then carry it for good): only channels that had waiters become strays, and waiters
/// need Redis to answer, so an outage cannot make more than were subscribed when it began.
const MAX_STRAYS: usize = 65_536;

/// Waiters by notification channel, and the order of what is sent about them.
#[derive(Default)]
pub(super) struct Channels {
    waiting: Mutex<HashMap<Vec<u8>, Channel>>,
    sending: tokio::sync::Mutex<()>,
    /// Channels nobody waits on whose `UNSUBSCRIBE` failed: the connection may still hold
    /// them, and would resubscribe them on every reconnect.
    strays: Mutex<HashSet<String>>,
    /// Whether a task is unsubscribing the strays (one at a time).
    sweeping: AtomicBool,
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
            let unsubscribed = match conn.handle().await {
                Ok(mut handle) => handle.unsubscribe(&channel).await.is_ok(),
                Err(_) => false,
            };
            // Still under the ordering lock: a waiter that subscribes and leaves again
            // after this, and whose own UNSUBSCRIBE fails, makes the channel a stray that
            // this removal must not wipe.
            if unsubscribed {
                lock(&channels.strays).remove(&channel);
            } else {
                channels.stray(channel, conn);
            }
        });
    }
}

impl Channels {
    /// Keeps `channel`, whose `UNSUBSCRIBE` failed, to unsubscribe it again until Redis
    /// confirms, and starts the task that does so unless it runs.
    fn stray(self: &Arc<Self>, channel: String, conn: Conn) {
        {
            let mut strays = lock(&self.strays);
            if strays.len() >= MAX_STRAYS {
                tracing::warn!(
                    channel,
                    "too many redis channels left to unsubscribe; this one stays subscribed"
                );
                return;
            }
            strays.insert(channel);
        }
        if !self.sweeping.swap(true, Ordering::SeqCst) {
            tokio::spawn(sweep(Arc::downgrade(self), conn));
        }
    }

    /// Sends the strays nobody waits on their `UNSUBSCRIBE` again (one each: on a cluster
    /// each channel's goes to its own node); those Redis confirmed are forgotten. Whether
    /// none is left.
    async fn unsubscribe_strays(&self, conn: &Conn) -> bool {
        let strays: Vec<String> = lock(&self.strays).iter().cloned().collect();
        let Ok(mut handle) = conn.handle().await else {
            return false;
        };
        for channel in strays {
            // The ordering lock for one channel at a time, not the whole pass: a waiter
            // subscribing meanwhile waits behind one UNSUBSCRIBE at most.
            let _order = self.sending.lock().await;
            let theirs = lock(&self.waiting).contains_key(channel.as_bytes());
            // A channel with waiters again is theirs: they subscribed it, or will.
            if !theirs && handle.unsubscribe(&channel).await.is_err() {
                return false;
            }
            lock(&self.strays).remove(&channel);
        }
        lock(&self.strays).is_empty()
    }
}

/// Unsubscribes the stray channels, backing off while Redis does not answer, until none is
/// left or the store is gone.
async fn sweep(channels: Weak<Channels>, conn: Conn) {
    let mut delay = STRAY_RETRY_FIRST;
    loop {
        tokio::time::sleep(delay).await;
        let Some(channels) = channels.upgrade() else {
            return;
        };
        if channels.unsubscribe_strays(&conn).await {
            channels.sweeping.store(false, Ordering::SeqCst);
            // A stray added just before the flag went down started no task: this one
            // goes on for it, unless another took over.
            if lock(&channels.strays).is_empty() || channels.sweeping.swap(true, Ordering::SeqCst) {
                return;
            }
            delay = STRAY_RETRY_FIRST;
            continue;
        }
        delay = (delay * 2).min(STRAY_RETRY_AT_MOST);
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
