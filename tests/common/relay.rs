//! A TCP relay between a proxy and its store (Redis, PostgreSQL, MariaDB) that a test
//! steers: hold what either side sends (on every connection, or on one only), drop a
//! reply with its connection, cut the link.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A PostgreSQL row's columns, each `None` when NULL.
pub type Row = Vec<Option<Vec<u8>>>;

/// A TCP relay to a store (Redis, a database) whose traffic a test controls: what the
/// proxy sends reaches the store at once unless `hold_requests` is set, what the store
/// answers waits while `hold` is set; a reply can be dropped with its connection, and the
/// link cut.
pub struct Relay {
    pub addr: SocketAddr,
    pub hold: Arc<tokio::sync::watch::Sender<bool>>,
    /// Set: the next reply read from Redis goes through, and every one after it is held.
    pub hold_after_next: Arc<AtomicBool>,
    /// Set: the next reply read from Redis is dropped with its connection (the command
    /// ran, the proxy never hears so).
    pub drop_next: Arc<AtomicBool>,
    /// Set: Redis is cut off; a command sent through the relay is dropped with its
    /// connection (it never runs).
    pub cut: Arc<AtomicBool>,
    /// Bytes of replies the relay has read from Redis (held back or not): once a command
    /// sent through it has a reply here, Redis has run it.
    pub received: Arc<AtomicUsize>,
    /// Set: what the proxy sends waits (it has not reached the store) until it is unset.
    pub hold_requests: Arc<tokio::sync::watch::Sender<bool>>,
    /// Set: the next reply from the store goes through, and what the proxy sends after it
    /// is held (`hold_requests`).
    pub hold_requests_after_next_reply: Arc<AtomicBool>,
    /// Set: the next PostgreSQL reply that answers a row (a `DataRow`, so a statement
    /// ran, not a `Parse`'s preparation) goes through, and what the proxy sends after it is
    /// held (`hold_requests`).
    pub hold_requests_after_next_row: Arc<AtomicBool>,
    /// The row whose reply set `hold_requests` for `hold_requests_after_next_row`: its
    /// columns, each `None` when NULL (binary format, as the proxy asks for them).
    pub row_before_hold: Arc<std::sync::Mutex<Option<Row>>>,
    /// Bytes the proxy sent that arrived while requests were held.
    pub requests_held: Arc<AtomicUsize>,
    /// The port a connection accepted from now on is relayed to (the ones open stay where
    /// they are): a name or virtual IP that moved to another server, as after a failover.
    pub target: Arc<AtomicU16>,
    /// Set: the next connection the proxy sends on is the held one
    /// ([`Relay::hold_next_sender`]), if what it sends starts with the byte after 1.
    hold_next_sender: Arc<AtomicU16>,
    /// The connection (numbered in the order accepted) whose requests wait; `u64::MAX`:
    /// none.
    held_connection: Arc<tokio::sync::watch::Sender<u64>>,
    /// Bytes the store sent on the connection [`Relay::hold_next_sender`] last held, from
    /// the hold on: its held statement's answer, once released.
    held_replies: Arc<AtomicUsize>,
}

impl Relay {
    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }

    pub fn requests_held(&self) -> usize {
        self.requests_held.load(Ordering::SeqCst)
    }

    /// Bytes the store answered on the connection [`Relay::hold_next_sender`] held: above
    /// zero once the held statement, released, has run.
    pub fn held_replies(&self) -> usize {
        self.held_replies.load(Ordering::SeqCst)
    }

    /// Holds what the proxy sends next that starts with `first` (PostgreSQL's `B`: a
    /// prepared statement's execution), and everything after it on that connection
    /// (counted in `requests_held`), until [`Relay::release_held_sender`]; the other
    /// connections pass. So one statement can reach the store after later ones sent on
    /// other connections, as a connection whose packets are delayed delivers it.
    pub fn hold_next_sender(&self, first: u8) {
        self.hold_next_sender
            .store(1 + u16::from(first), Ordering::SeqCst);
    }

    /// Lets what [`Relay::hold_next_sender`] held go on.
    pub fn release_held_sender(&self) {
        self.held_connection.send_replace(u64::MAX);
    }
}

/// A relay to the store on `port`, passing everything until a test says otherwise.
pub async fn relay_to(port: u16) -> Relay {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (hold, held) = tokio::sync::watch::channel(false);
    let hold = Arc::new(hold);
    let hold_after_next = Arc::<AtomicBool>::default();
    let drop_next = Arc::<AtomicBool>::default();
    let received = Arc::<AtomicUsize>::default();
    let counted = Arc::clone(&received);
    let (holding, then_hold) = (Arc::clone(&hold), Arc::clone(&hold_after_next));
    let dropping = Arc::clone(&drop_next);
    let cut = Arc::<AtomicBool>::default();
    let cutting = Arc::clone(&cut);
    let hold_requests = Arc::new(tokio::sync::watch::channel(false).0);
    let hold_requests_after_next_reply = Arc::<AtomicBool>::default();
    let hold_requests_after_next_row = Arc::<AtomicBool>::default();
    let requests_held = Arc::<AtomicUsize>::default();
    let (requests, then_hold_requests) = (
        Arc::clone(&hold_requests),
        Arc::clone(&hold_requests_after_next_reply),
    );
    let after_row = Arc::clone(&hold_requests_after_next_row);
    let row_before_hold = Arc::<std::sync::Mutex<_>>::default();
    let noting_row = Arc::clone(&row_before_hold);
    let counted_held = Arc::clone(&requests_held);
    let hold_next_sender = Arc::<AtomicU16>::default();
    let held_connection = Arc::new(tokio::sync::watch::channel(u64::MAX).0);
    let (next_sender, holding_one) = (Arc::clone(&hold_next_sender), Arc::clone(&held_connection));
    let held_replies = Arc::<AtomicUsize>::default();
    let answered_held = Arc::clone(&held_replies);
    // The connection last held (`u64::MAX`: none yet), whose answers count in `held_replies`.
    let last_held = Arc::new(AtomicU64::new(u64::MAX));
    let accepted = AtomicU64::new(0);
    let target = Arc::new(AtomicU16::new(port));
    let targeted = Arc::clone(&target);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let number = accepted.fetch_add(1, Ordering::SeqCst);
            let (next_sender, holding_one) = (Arc::clone(&next_sender), Arc::clone(&holding_one));
            let (marking, last_marked) = (Arc::clone(&last_held), Arc::clone(&last_held));
            let held_answered = Arc::clone(&answered_held);
            let mut held_one = holding_one.subscribe();
            // Redis is gone once a test ends; the proxy may still try to reconnect.
            let port = targeted.load(Ordering::SeqCst);
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                continue;
            };
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            let cutting = Arc::clone(&cutting);
            let mut requests_held = requests.subscribe();
            let counted_held = Arc::clone(&counted_held);
            // Returning drops both halves: Redis sees the connection end, and so does the
            // proxy once Redis has closed it.
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match from_client.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    let first = 1 + u16::from(buf[0]);
                    if next_sender
                        .compare_exchange(first, 0, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        marking.store(number, Ordering::SeqCst);
                        holding_one.send_replace(number);
                    }
                    if *requests_held.borrow() || *held_one.borrow() == number {
                        counted_held.fetch_add(n, Ordering::SeqCst);
                    }
                    if requests_held.wait_for(|hold| !*hold).await.is_err()
                        || held_one.wait_for(|held| *held != number).await.is_err()
                    {
                        return;
                    }
                    if cutting.load(Ordering::SeqCst)
                        || to_server.write_all(&buf[..n]).await.is_err()
                    {
                        return;
                    }
                }
            });
            let mut held = held.clone();
            let counted = Arc::clone(&counted);
            let (holding, then_hold) = (Arc::clone(&holding), Arc::clone(&then_hold));
            let dropping = Arc::clone(&dropping);
            let (requests, then_hold_requests) =
                (Arc::clone(&requests), Arc::clone(&then_hold_requests));
            let (after_row, noting_row) = (Arc::clone(&after_row), Arc::clone(&noting_row));
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut replies = PgReplies::default();
                loop {
                    let n = match from_server.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    counted.fetch_add(n, Ordering::SeqCst);
                    if last_marked.load(Ordering::SeqCst) == number {
                        held_answered.fetch_add(n, Ordering::SeqCst);
                    }
                    let mut rows = replies.rows_in(&buf[..n]);
                    // Returning drops the reply and closes the proxy's side.
                    if dropping.swap(false, Ordering::SeqCst) {
                        return;
                    }
                    if held.wait_for(|hold| !*hold).await.is_err() {
                        return;
                    }
                    // Held before this reply is passed on: whatever the proxy sends in
                    // answer to it gets its reply held.
                    if then_hold.swap(false, Ordering::SeqCst) {
                        holding.send_replace(true);
                    }
                    if to_client.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    let after_this_row =
                        !rows.is_empty() && after_row.swap(false, Ordering::SeqCst);
                    if after_this_row {
                        *noting_row.lock().unwrap() = rows.pop();
                    }
                    if then_hold_requests.swap(false, Ordering::SeqCst) || after_this_row {
                        requests.send_replace(true);
                    }
                }
            });
        }
    });
    Relay {
        addr,
        hold,
        hold_after_next,
        drop_next,
        cut,
        received,
        hold_requests,
        hold_requests_after_next_reply,
        hold_requests_after_next_row,
        row_before_hold,
        requests_held,
        target,
        hold_next_sender,
        held_replies,
        held_connection,
    }
}

/// What a PostgreSQL server sends on one connection, read as messages (a type byte and a
/// length) however the reads cut them; the one-byte answer to an `SSLRequest` that opens a
/// connection has no length and is skipped. Meaningless for Redis and MariaDB, whose
/// traffic stops being read once it names a message longer than PostgreSQL's replies here.
#[derive(Default)]
struct PgReplies {
    started: bool,
    not_postgres: bool,
    pending: Vec<u8>,
}

impl PgReplies {
    /// The rows (`DataRow` messages, their columns) `chunk` completes.
    fn rows_in(&mut self, chunk: &[u8]) -> Vec<Row> {
        if self.not_postgres {
            return Vec::new();
        }
        let mut chunk = chunk;
        if !self.started {
            self.started = true;
            if chunk.first() == Some(&b'N') {
                chunk = &chunk[1..];
            }
        }
        self.pending.extend_from_slice(chunk);
        let mut rows = Vec::new();
        let mut at = 0;
        while let Some(head) = self.pending.get(at..at + 5) {
            let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
            if !(4..1 << 20).contains(&len) {
                self.not_postgres = true;
                self.pending = Vec::new();
                return rows;
            }
            if self.pending.len() < at + 1 + len {
                break;
            }
            if head[0] == b'D' {
                rows.push(columns(&self.pending[at + 5..at + 1 + len]));
            }
            at += 1 + len;
        }
        self.pending.drain(..at);
        rows
    }
}

/// The columns of a `DataRow`'s body: a count, then each one's length (-1: NULL) and bytes.
fn columns(body: &[u8]) -> Row {
    let count = body
        .get(..2)
        .map_or(0, |c| u16::from_be_bytes([c[0], c[1]]));
    let mut at = 2;
    let mut columns = Vec::new();
    for _ in 0..count {
        let Some(l) = body.get(at..at + 4) else { break };
        let len = i32::from_be_bytes([l[0], l[1], l[2], l[3]]);
        at += 4;
        if len < 0 {
            columns.push(None);
            continue;
        }
        let end = (at + len as usize).min(body.len());
        columns.push(Some(body[at..end].to_vec()));
        at = end;
    }
    columns
}
