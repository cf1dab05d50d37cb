//! Settling a claim on the Redis store. A completion nobody waits on is one swap of the
//! owner's own unmarked in-flight record for the done record (`SET … IFEQ`, or the swap
//! script on a server without it), which publishes nothing; anything else (a record a
//! waiter or observe mode's count marked, one the store lost, any other outcome) goes
//! through the settle script, fenced by the owner token, which wakes the waiters and
//! carries observe mode's count over to the outcome.
//!
//! An answer longer than Redis takes in one value (`proto-max-bulk-len`, 512 MB by
//! default) is refused with a protocol error, every time, and the connection closed: its
//! key records "executed, answer not stored" instead, as an answer over `max_answer` does
//! (kept, the claim would lapse with the answer lost, and a retry run it again or hear
//! "outcome unknown"). The length refused is remembered for a few minutes once the write
//! without it landed, so a later answer as long does not cost every request on the shared
//! connection its connection again.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::Value;

use super::records::{claim_value, settled_value, DoneRecord, CLAIM_LEN};
use super::{refused_as_syntax, unexpected, RedisStore};
use crate::key::Digest;
use crate::store::{Ownership, Settled, Settlement, StoreError, StoredResponse};

/// Why a settlement was not written.
enum Unwritten {
    /// Redis refuses the value, as it will every time (see [`refuses_value`]).
    Refused(String),
    /// No answer, or an error a repeat may not meet.
    Failed(StoreError),
}

impl From<StoreError> for Unwritten {
    fn from(e: StoreError) -> Self {
        Self::Failed(e)
    }
}

/// Whether Redis refused a command for what it carries: a value over its
/// `proto-max-bulk-len` is this protocol error (and its connection closed), and only it.
/// Other protocol errors say nothing of the answer: "unauthenticated bulk length" is any
/// value over 16 KiB on a connection not yet authenticated, which a repeat gets past.
fn refuses_value(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR") && e.detail() == Some("Protocol error: invalid bulk length")
}

/// How long a refused length is remembered: a `proto-max-bulk-len` raised since, or a
/// failover to a server with a higher one, is found out by sending such an answer again
/// after this, at the cost of the shared connection once if it is still refused.
const REFUSED_LEN_KEPT: Duration = Duration::from_secs(300);

/// The shortest answer Redis refused as too long, and when; one as long is not sent
/// again for [`REFUSED_LEN_KEPT`].
#[derive(Default)]
pub(super) struct RefusedLen(Mutex<Option<(u64, Instant)>>);

impl RefusedLen {
    /// Whether an answer of `len` bytes is as long as one refused lately, at `now`.
    fn refuses(&self, len: u64, now: Instant) -> bool {
        let mut refused = lock(&self.0);
        match *refused {
            Some((_, at)) if now.saturating_duration_since(at) >= REFUSED_LEN_KEPT => {
                *refused = None;
                false
            }
            Some((shortest, _)) => len >= shortest,
            None => false,
        }
    }

    /// Redis refused an answer of `len` bytes at `now` (and took the write without it).
    /// Only a refusal sets the time: a memo that keeps answers from being sent is not
    /// renewed by them, so it ends.
    fn note(&self, len: u64, now: Instant) {
        let mut refused = lock(&self.0);
        *refused = match *refused {
            Some((shortest, at))
                if shortest <= len && now.saturating_duration_since(at) < REFUSED_LEN_KEPT =>
            {
                Some((shortest, at))
            }
            _ => Some((len, now)),
        };
    }
}

/// The memo's lock, taken over a poisoned one (it holds one number).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl RedisStore {
    /// See [`Store::settle`](crate::store::Store::settle); an answer Redis refuses is left
    /// out (above).
    pub(crate) async fn settle(
        &self,
        owned: &Ownership,
        settlement: Settlement,
    ) -> Result<Settled, StoreError> {
        let len = settlement.answer_len() as u64;
        let (refusal, refused_now) = if self.refused_len.refuses(len, Instant::now()) {
            let remembered = format!("an answer of {len} bytes, as long as one Redis refused");
            (remembered, false)
        } else {
            match self.settle_as_asked(owned, &settlement).await {
                Ok(settled) => return Ok(settled),
                Err(Unwritten::Failed(e)) => return Err(e),
                Err(Unwritten::Refused(refusal)) => (refusal, true),
            }
        };
        let Some(lesser) = settlement.without_answer() else {
            return Err(StoreError::Unavailable(refusal));
        };
        tracing::error!(
            key = %owned.key.short(),
            settled = settlement.as_str(),
            error = %refusal,
            "redis refuses the answer; written without it"
        );
        let lesser = self.settle_as_asked(owned, &lesser).await;
        if refused_now && lesser.is_ok() {
            // Redis took the write without the answer (on a new connection): the length
            // was what it refused, so later answers as long are not sent for a while.
            self.refused_len.note(len.max(1), Instant::now());
        }
        match lesser {
            Ok(settled) => Ok(settlement.settled_without_answer(settled)),
            Err(Unwritten::Failed(e)) => Err(e),
            Err(Unwritten::Refused(refusal)) => Err(StoreError::Unavailable(refusal)),
        }
    }

    /// `settlement` written as it is.
    async fn settle_as_asked(
        &self,
        owned: &Ownership,
        settlement: &Settlement,
    ) -> Result<Settled, Unwritten> {
        let key = &owned.key;
        if let Settlement::Done { response, ttl } = &settlement {
            if !ttl.is_zero() {
                let response = response.clone().with_fingerprint(owned.fingerprint);
                let in_flight = claim_value(owned.token, owned.fingerprint, owned.lapse);
                if self.swap_done(key, &in_flight, &response, *ttl).await? {
                    return Ok(Settled::Written);
                }
                // Not the record this claim wrote: a waiter or observe mode's count marked
                // it (the script keeps the count as long as the answer), the store lost it,
                // or a swap retried after a dropped connection had already been done. The
                // settle script answers for each: the token matches a marked record, a
                // lost one is written back, and a record that already is this answer
                // (the done record holds no token, but the very bytes this swap wrote)
                // counts as written.
            }
        }
        let (value, px) = settled_value(owned.token, owned.fingerprint, settlement);
        let mut invocation = self.scripts.settle.prepare_invoke();
        invocation
            .key(self.record(key))
            .key(self.seen_counter(key))
            .arg(&owned.token.0.to_be_bytes()[..])
            .arg(value.as_deref().unwrap_or_default())
            .arg(px)
            .arg(self.channel(key))
            .arg(if settlement.writes_back() { "1" } else { "0" });
        match self.run_raw(invocation).await? {
            Ok(Value::Int(1)) => Ok(Settled::Written),
            Ok(Value::Int(2)) => {
                tracing::warn!(
                    key = %key.short(),
                    settled = settlement.as_str(),
                    "the store had lost the claim; wrote the outcome back"
                );
                Ok(Settled::WrittenBack)
            }
            Ok(Value::Int(0)) => Ok(Settled::NotWritten),
            Ok(other) => Err(unexpected(&other).into()),
            Err(e) => Err(written_error(e)),
        }
    }

    /// A completion by swap: the done record written where the in-flight record
    /// `in_flight` is, else nothing (`false`). `SET … IFEQ` where the server has it, else
    /// the swap script.
    async fn swap_done(
        &self,
        key: &Digest,
        in_flight: &[u8],
        response: &StoredResponse,
        ttl: Duration,
    ) -> Result<bool, Unwritten> {
        let done = DoneRecord(response);
        let ttl_ms = ttl.as_millis().max(1) as u64;
        if !self.no_set_ifeq.load(Relaxed) {
            if let Some(swapped) = self.set_ifeq(key, done, in_flight, ttl_ms).await? {
                return Ok(swapped);
            }
        }
        let mut invocation = self.scripts.swap.prepare_invoke();
        invocation
            .key(self.record(key))
            .arg(in_flight)
            .arg(done)
            .arg(ttl_ms);
        match self.run_raw(invocation).await? {
            Ok(value) => Ok(matches!(value, Value::Int(1))),
            Err(e) => Err(written_error(e)),
        }
    }

    /// `SET <done> IFEQ <in-flight record> PX <ttl>`. `None`: the server has no `IFEQ`, and
    /// is not asked again.
    async fn set_ifeq(
        &self,
        key: &Digest,
        done: DoneRecord<'_>,
        in_flight: &[u8],
        ttl_ms: u64,
    ) -> Result<Option<bool>, Unwritten> {
        let record = self.record(key);
        let mut set = redis::Cmd::with_capacity(7, 32 + record.len() + done.len() + CLAIM_LEN);
        set.arg("SET")
            .arg(record)
            .arg(done)
            .arg("IFEQ")
            .arg(in_flight)
            .arg("PX")
            .arg(ttl_ms);
        match self.query_raw(&set).await? {
            Ok(Value::Okay) => Ok(Some(true)),
            Ok(Value::Nil) => Ok(Some(false)),
            Ok(other) => Err(unexpected(&other).into()),
            // An unknown option is a syntax error: the script is the way for this server
            // from now on. Anything else (`LOADING`, `READONLY`, `OOM`, …) passes and
            // would fail the script alike.
            Err(e) if refused_as_syntax(&e) => {
                tracing::info!(error = %e, "redis refuses SET IFEQ; swapping by script");
                self.no_set_ifeq.store(true, Relaxed);
                Ok(None)
            }
            Err(e) => Err(written_error(e)),
        }
    }
}

/// An error answer of Redis to a settlement's write.
fn written_error(e: redis::RedisError) -> Unwritten {
    if refuses_value(&e) {
        Unwritten::Refused(e.to_string())
    } else {
        Unwritten::Failed(StoreError::Unavailable(e.to_string()))
    }
}

#[cfg(test)]
mod tests;
