//! [`Budget`]: the one bound on the bytes the proxy buffers at once, all requests together
//! (`connections.max_buffered`). `max_body` and `max_answer` bound one request; without a
//! total, `max_client × max_streams × (max_body + max_answer)` is what clients and
//! upstreams could make the proxy hold (a terabyte with the defaults), as Envoy's overload
//! manager and nginx's fixed buffer pools bound theirs.
//!
//! A protected request's body and an owner's upstream answer take their bytes from it as
//! they are buffered, chunk by chunk ([`Charge`]), and give them back when the buffer is
//! dropped: the charge rides inside the [`Bytes`] the buffer becomes ([`Charge::attach`]),
//! so it lasts exactly as long as some part of the buffer is held, however far it is
//! handed on (to the upstream connection, to a streamed answer's first part).
//!
//! A protected request's head holds its [`head_size`] of it from the moment its own
//! refusals (a missing key, a body over `max_body`) are past until its answer is handed to
//! hyper or the request is dropped ([`HeadCharge`]; an observed one's too where there is
//! room, since observe mode refuses nothing): it waits as long as its body comes
//! (a gap limit, no deadline) and its owner runs, so without it an HTTP/2 client's
//! `max_streams` heads of up to 16 KiB each, on each of `max_client` connections, would be
//! held for nothing (gigabytes). An unprotected request's head is handed to the upstream
//! connection as soon as one is free, within the route's timeouts, and is not charged:
//! so a budget full of bodies never refuses a `GET` or a health check.
//!
//! A head or a body that finds no room is refused before anything is claimed or sent
//! (`503 overloaded`); an answer that finds none, its request already run, streams on to
//! its client and is recorded as executed, not stored, as one over `max_answer` is.
//!
//! A replay holds its body until its client has read it: a copy made for it (decoded from
//! Redis or SQL, or opened from its seal), or the memory store's record, which the store
//! may evict or expire meanwhile. Either takes its size from the budget until its body is
//! sent or dropped, and a replay without room is refused with `503 overloaded` too, never
//! run again (`super::replay`). The owner's own answer goes to its client from a copy of
//! the record it stored, whatever the store: the charge its buffer took goes on to it,
//! kept rather than taken again (`super::settlement`).
//!
//! One client connection's buffers hold at most `connections.max_buffered_per_connection`
//! of it at once ([`ConnBuffers`]), as its owners are held to `max_streams`
//! (`super::conn_share`). A protected body has no total deadline, only a gap limit, so
//! without a share one HTTP/2 client trickling a byte per gap on each of its streams would
//! hold `max_streams × max_body` for as long as it likes, and a few such connections the
//! whole budget: everyone else would get `503 overloaded`. With it, a connection past its
//! share is refused alone, and the others keep the rest. Each buffer counts against the
//! connection whose request made it until it drops, whether the client is still there or
//! not.
//!
//! Answers held by settlements the store failed, while they are made again in the
//! background, take their bytes as one more connection's ([`RetriedAnswers`]).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::BufferMetrics;
use crate::store::{AnswerRoom, Held};

/// The process-wide byte budget. The bytes held are counted in the
/// `idemgate_buffered_bytes` gauge itself: what `/metrics` shows is the count the budget
/// decides by.
#[derive(Debug)]
pub struct Budget {
    /// Bytes held now.
    held: Gauge,
    /// The most that may be held (`connections.max_buffered`).
    limit: AtomicI64,
    /// The most one connection's buffers may hold
    /// (`connections.max_buffered_per_connection`).
    per_connection: AtomicI64,
    /// Shown as `idemgate_buffered_limit_bytes`.
    limit_gauge: Gauge,
    /// Request heads refused for want of room.
    refused_heads: Counter,
    /// Request bodies refused for want of room.
    refused_bodies: Counter,
    /// Answers streamed on unstored for want of room.
    refused_answers: Counter,
    /// Of those heads, the ones refused because their connection held its share.
    share_refused_heads: Counter,
    /// Of those bodies, the same.
    share_refused_bodies: Counter,
    /// Of those answers, the same.
    share_refused_answers: Counter,
    /// Replays' copies of stored answers refused for want of room.
    refused_replays: Counter,
    /// Of those replays, the same.
    share_refused_replays: Counter,
}

/// What one client connection's buffers hold of a [`Budget`] now; see the
/// [module docs](self). Shared by the connection and every buffer its requests made.
#[derive(Debug, Default)]
pub struct ConnBuffers(AtomicI64);

impl ConnBuffers {
    /// The bytes held now.
    pub fn held(&self) -> u64 {
        self.0.load(Ordering::Acquire).max(0) as u64
    }
}

/// The limit a buffer found no room under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Short {
    /// `connections.max_buffered`: all requests together hold as much as they may.
    Total,
    /// `connections.max_buffered_per_connection`: the buffer's connection holds its share.
    Connection,
}

impl Short {
    /// The setting, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Total => "connections.max_buffered",
            Self::Connection => "connections.max_buffered_per_connection",
        }
    }
}

/// What asked for room and did not get it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A protected request's head: refused with `503 overloaded`.
    RequestHead,
    /// A protected request's body: refused with `503 overloaded`.
    RequestBody,
    /// An owner's upstream answer: streamed on, not stored.
    Answer,
    /// A replay of a stored answer (the record it holds, whatever the store): refused
    /// with `503 overloaded`.
    Replay,
}

impl Refusal {
    /// Label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RequestHead => "request_head",
            Self::RequestBody => "request_body",
            Self::Answer => "answer",
            Self::Replay => "replay",
        }
    }
}

impl Budget {
    /// A budget of `limit` bytes, of which one connection may hold `per_connection`,
    /// counted in `metrics`.
    pub fn new(limit: usize, per_connection: usize, metrics: &BufferMetrics) -> Arc<Self> {
        let budget = Self {
            held: metrics.held.clone(),
            limit: AtomicI64::new(0),
            per_connection: AtomicI64::new(0),
            limit_gauge: metrics.limit.clone(),
            refused_heads: metrics.refused(Refusal::RequestHead),
            refused_bodies: metrics.refused(Refusal::RequestBody),
            refused_answers: metrics.refused(Refusal::Answer),
            share_refused_heads: metrics.share_refused(Refusal::RequestHead),
            share_refused_bodies: metrics.share_refused(Refusal::RequestBody),
            share_refused_answers: metrics.share_refused(Refusal::Answer),
            refused_replays: metrics.refused(Refusal::Replay),
            share_refused_replays: metrics.share_refused(Refusal::Replay),
        };
        budget.set_limit(limit, per_connection);
        Arc::new(budget)
    }

    /// Sets the limits (a reload): buffers already held keep their bytes, and new ones get
    /// room once the totals are under the new limits.
    pub fn set_limit(&self, limit: usize, per_connection: usize) {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let per_connection = i64::try_from(per_connection).unwrap_or(i64::MAX);
        self.limit.store(limit, Ordering::Relaxed);
        self.per_connection.store(per_connection, Ordering::Relaxed);
        self.limit_gauge.set(limit);
    }

    /// The bytes held now.
    pub fn held(&self) -> u64 {
        self.held.get().max(0) as u64
    }

    /// A charge of nothing yet, against this budget and the share of the connection
    /// `conn` counts.
    pub fn charge(self: &Arc<Self>, conn: &Arc<ConnBuffers>) -> Charge {
        Charge {
            account: Some((Arc::clone(self), Arc::clone(conn))),
            bytes: 0,
        }
    }

    /// Counts a refusal of `what` under the limit `short`.
    pub fn refused(&self, what: Refusal, short: Short) {
        let (all, share) = match what {
            Refusal::RequestHead => (&self.refused_heads, &self.share_refused_heads),
            Refusal::RequestBody => (&self.refused_bodies, &self.share_refused_bodies),
            Refusal::Answer => (&self.refused_answers, &self.share_refused_answers),
            Refusal::Replay => (&self.refused_replays, &self.share_refused_replays),
        };
        all.inc();
        if short == Short::Connection {
            share.inc();
        }
    }

    /// The limit a buffer of `conn` would find no room under now, even for one byte: its
    /// connection's share first, as [`Self::take`] looks. A look, not a reservation: a
    /// request whose head finds it full is refused before its body is read.
    pub fn full(&self, conn: &ConnBuffers) -> Option<Short> {
        if conn.0.load(Ordering::Acquire) >= self.per_connection.load(Ordering::Relaxed) {
            return Some(Short::Connection);
        }
        (self.held.get() >= self.limit.load(Ordering::Relaxed)).then_some(Short::Total)
    }

    /// Takes `n` bytes for a buffer of `conn` if both its share and the total stay within
    /// their limits. The share is taken first: a connection at its share leaves the total,
    /// which every protected request touches, alone.
    fn take(&self, conn: &ConnBuffers, n: u64) -> Result<(), Short> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let share = self.per_connection.load(Ordering::Relaxed);
        if !add_within(&conn.0, n, share) {
            return Err(Short::Connection);
        }
        if !add_within(self.held.inner(), n, self.limit.load(Ordering::Relaxed)) {
            conn.0.fetch_sub(n, Ordering::AcqRel);
            return Err(Short::Total);
        }
        Ok(())
    }

    /// Takes `n` bytes as [`Self::take`] does, except that a connection holding no more
    /// than `own` (what the asking request holds itself) may go past its share, the total
    /// still bounding it. A stored answer is kept when its body fits its owner's share, but
    /// its replay holds the whole record (headers and framing besides): one a little over
    /// the share would otherwise be refused on every retry for as long as it is kept, its
    /// answer lost. One request at a time per connection can go past it so: the next finds
    /// the connection holding more than its own.
    fn take_alone(&self, conn: &ConnBuffers, n: u64, own: u64) -> Result<(), Short> {
        match self.take(conn, n) {
            Err(Short::Connection) if conn.0.load(Ordering::Acquire) <= own as i64 => {
                let n = i64::try_from(n).unwrap_or(i64::MAX);
                if !add_within(self.held.inner(), n, self.limit.load(Ordering::Relaxed)) {
                    return Err(Short::Total);
                }
                conn.0.fetch_add(n, Ordering::AcqRel);
                Ok(())
            }
            taken => taken,
        }
    }

    /// Gives `n` bytes of `conn` back.
    fn give_back(&self, conn: &ConnBuffers, n: u64) {
        conn.0.fetch_sub(n as i64, Ordering::AcqRel);
        self.held.dec_by(n as i64);
    }
}

/// What a protected request's head is charged while the proxy holds the request: the size RFC 9113
/// §6.5.2 gives a field list (each field's name and value, and 32 for its entry), its
/// method and target counted as one more field. An estimate of what the head holds (its
/// decoded bytes and the map of them), cheap enough for every such request: one pass over the
/// fields, no allocation.
pub fn head_size<B>(request: &http::Request<B>) -> usize {
    const FIELD: usize = 32;
    let uri = request.uri();
    let target = uri.path_and_query().map_or(0, |p| p.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len());
    let fields: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + FIELD)
        .sum();
    fields + FIELD + request.method().as_str().len() + target
}

/// Adds `n` to `held` if the sum stays within `limit`.
fn add_within(held: &AtomicI64, n: i64, limit: i64) -> bool {
    held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
        held.checked_add(n).filter(|total| *total <= limit)
    })
    .is_ok()
}

/// Bytes a protected request's head holds of a [`Budget`] and its connection's share while
/// the proxy holds the request ([`HeadCharge::take`]), given back when dropped: when its
/// answer is handed to hyper, or its future is dropped (the client left). An owner that
/// runs on without its client takes them along ([`HeadCharge::hand_over`]), as it takes the
/// head.
///
/// It borrows the budget and the connection's count, as the request's future does: every
/// protected request takes one, and it costs the two additions and, dropped, the two
/// subtractions, no reference counts. The bytes are atomic only so that it can be filled and handed
/// over through the shared reference a `Send` future holds; nothing else touches them.
#[derive(Debug)]
pub struct HeadCharge<'a> {
    budget: &'a Arc<Budget>,
    conn: &'a Arc<ConnBuffers>,
    bytes: AtomicU64,
}

impl Budget {
    /// A charge for a request head of the connection `conn` counts that holds nothing yet:
    /// [`HeadCharge::take`] fills it once the head's own refusals are past.
    pub fn head_charge<'a>(self: &'a Arc<Self>, conn: &'a Arc<ConnBuffers>) -> HeadCharge<'a> {
        HeadCharge {
            budget: self,
            conn,
            bytes: AtomicU64::new(0),
        }
    }
}

impl HeadCharge<'_> {
    /// Takes `n` more bytes, if the connection's share and the total have room; the limit
    /// it found none under otherwise, holding what it held.
    pub fn take(&self, n: usize) -> Result<(), Short> {
        self.budget.take(self.conn, n as u64)?;
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The bytes it holds now.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Its bytes as a [`Charge`] of their own, which holds them until it drops wherever it
    /// goes (an owner's task that runs on after its client left); this one then holds
    /// nothing. Nothing is taken again: the hand-over cannot fail.
    pub fn hand_over(&self) -> Charge {
        Charge {
            account: Some((Arc::clone(self.budget), Arc::clone(self.conn))),
            bytes: self.bytes.swap(0, Ordering::Relaxed),
        }
    }
}

impl Drop for HeadCharge<'_> {
    fn drop(&mut self) {
        let bytes = *self.bytes.get_mut();
        if bytes > 0 {
            self.budget.give_back(self.conn, bytes);
        }
    }
}

/// Bytes taken from a [`Budget`] for one buffer, given back when it drops.
#[derive(Debug, Default)]
pub struct Charge {
    /// The budget and the connection's share it is taken from; `None`: unbounded (a
    /// buffer no budget covers).
    account: Option<(Arc<Budget>, Arc<ConnBuffers>)>,
    bytes: u64,
}

impl Charge {
    /// A charge against no budget: every size fits.
    pub fn unbounded() -> Self {
        Self::default()
    }

    /// Makes the charge `total` bytes: takes the difference if it grows (the limit it
    /// found no room under, the charge unchanged, if the budget or the connection's share
    /// has none), gives it back if it shrinks.
    pub fn resize(&mut self, total: usize) -> Result<(), Short> {
        let total = total as u64;
        let Some((budget, conn)) = &self.account else {
            self.bytes = total;
            return Ok(());
        };
        if total > self.bytes {
            budget.take(conn, total - self.bytes)?;
        } else {
            budget.give_back(conn, self.bytes - total);
        }
        self.bytes = total;
        Ok(())
    }

    /// Makes the charge `total` bytes as [`Charge::resize`] does, past the connection's
    /// share if the connection holds no more than `own` besides (see `Budget::take_alone`).
    pub fn resize_alone(&mut self, total: usize, own: u64) -> Result<(), Short> {
        let total = total as u64;
        let Some((budget, conn)) = &self.account else {
            self.bytes = total;
            return Ok(());
        };
        if total > self.bytes {
            budget.take_alone(conn, total - self.bytes, own + self.bytes)?;
        } else {
            budget.give_back(conn, self.bytes - total);
        }
        self.bytes = total;
        Ok(())
    }

    /// Gives back what the charge holds past `total`, if anything: never takes more, so
    /// it cannot fail (a charge kept for a smaller copy of what it paid for).
    pub fn shrink_to(&mut self, total: usize) {
        if (total as u64) < self.bytes {
            let _ = self.resize(total);
        }
    }

    /// Makes the charge `more` bytes larger, as [`Charge::resize`] does.
    pub fn grow(&mut self, more: usize) -> Result<(), Short> {
        self.resize(self.bytes as usize + more)
    }

    /// `data`, which this charge pays for, made to hold the charge until its last part
    /// drops. A charge of nothing costs nothing to attach.
    pub fn attach<T>(self, data: T) -> Bytes
    where
        T: AsRef<[u8]> + Send + 'static,
        Bytes: From<T>,
    {
        if self.bytes == 0 || self.account.is_none() {
            return Bytes::from(data);
        }
        Bytes::from_owner(Charged {
            data,
            _charge: self,
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some((budget, conn)) = &self.account {
            budget.give_back(conn, self.bytes);
        }
    }
}

/// The budget's room for the answers of settlements the store failed, held while they
/// are made again in the background (`crate::store::settling`): they count as one more
/// connection's buffers, so together they hold at most
/// `connections.max_buffered_per_connection`, within `connections.max_buffered`, and a
/// budget full of clients' buffers leaves them none. An answer without room is made again
/// without it, as "executed, answer not stored".
#[derive(Debug)]
pub struct RetriedAnswers {
    budget: Arc<Budget>,
    buffers: Arc<ConnBuffers>,
}

impl RetriedAnswers {
    /// A room in `budget`.
    pub fn new(budget: &Arc<Budget>) -> Self {
        Self {
            budget: Arc::clone(budget),
            buffers: Arc::default(),
        }
    }
}

impl AnswerRoom for RetriedAnswers {
    fn take(&self, bytes: usize) -> Option<Held> {
        let mut charge = self.budget.charge(&self.buffers);
        charge.resize(bytes).ok()?;
        Some(Box::new(charge))
    }
}

/// A buffer with the charge that pays for it.
struct Charged<T> {
    data: T,
    _charge: Charge,
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for Charged<T> {
    fn as_ref(&self) -> &[u8] {
        self.data.as_ref()
    }
}

#[cfg(test)]
mod tests;
