//! How an owner ends its claim: the one write that settles a key ([`Settlement`]) and what
//! that write did ([`Settled`]). Every backend writes the same five outcomes; the
//! [`Lease`](super::Lease) picks one, or its drop does.

use std::time::{Duration, SystemTime};

use super::response::StoredResponse;

/// How an owner settles its key: the one write that ends a claim.
#[derive(Debug, Clone)]
pub enum Settlement {
    /// The answer, replayed for `ttl` (zero: nothing kept, the key is free).
    Done {
        /// The answer, stamped with the claim's payload fingerprint.
        response: StoredResponse,
        /// How long it is replayed.
        ttl: Duration,
    },
    /// The request executed; its answer was not kept. Repeats get a problem for `ttl`.
    NotStored {
        /// The upstream's status.
        status: http::StatusCode,
        /// How long the record stays.
        ttl: Duration,
    },
    /// The request may have executed; no one knows its outcome. Repeats get a problem
    /// for `ttl`.
    Unknown {
        /// How long the state lasts.
        ttl: Duration,
    },
    /// The request failed in a way a retry may repeat (a 5xx, a transient 4xx, an
    /// upstream that was never reached). The duplicates that were waiting get `response`
    /// for `linger`; any other request takes the key over.
    Failed {
        /// What the waiters get.
        response: StoredResponse,
        /// How long the waiters have to collect it.
        linger: Duration,
        /// For a one-time token: it goes back to issued until then, its expiry as issued
        /// (what is left of it is taken at each write, so a late one keeps it no longer).
        reissue: Option<SystemTime>,
    },
    /// The key is freed (nothing was sent, nothing to share); with `reissue`, a one-time
    /// token's key goes back to issued until then.
    Release {
        /// See above.
        reissue: Option<SystemTime>,
    },
}

/// What is left now of `until`, a one-time token's expiry as issued that a settlement
/// hands the token back until: the span a store writes the token for, taken at each write
/// rather than once when the settlement is made, so one written late (made again in the
/// background after a failed write, repeated after an unanswered renewal) never lets the
/// token be spent past that expiry. `None`: less than a millisecond is left, which no
/// store could write, and no token goes back: a release frees the key, a failure is kept
/// as one with no token.
pub(crate) fn token_left(until: Option<SystemTime>) -> Option<Duration> {
    until?
        .duration_since(SystemTime::now())
        .ok()
        .filter(|left| *left >= Duration::from_millis(1))
}

/// What a store keeps of a failure ([`Settlement::Failed`]) that its waiters have `linger`
/// to collect and that, for a one-time token, hands the token back for `left` (what is
/// left now of its expiry as issued, [`token_left`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureKept {
    /// The failure's record, with its answer, for `ttl`; with `issued`, its token may be
    /// spent again meanwhile.
    Record {
        /// How long the record is kept.
        ttl: Duration,
        /// Whether it holds a token handed back.
        issued: bool,
    },
    /// The token alone, issued again for `ttl`, as a [`Settlement::Release`] keeps it.
    Token {
        /// How long it stays issued.
        ttl: Duration,
    },
}

impl FailureKept {
    /// A record that lets its token be spent never outlives the token's expiry as issued,
    /// and a failure's answer (up to `max_answer`) never outlives its linger: a token with
    /// more than the linger left goes back alone, its waiters told their owner failed
    /// without its answer (as when a failure finds no room), and one with less keeps the
    /// failure only until the token expires.
    pub(crate) fn of(linger: Duration, left: Option<Duration>) -> Self {
        match left {
            None => Self::Record {
                ttl: linger,
                issued: false,
            },
            Some(left) if left > linger => Self::Token { ttl: left },
            Some(left) => Self::Record {
                ttl: left,
                issued: true,
            },
        }
    }
}

impl Settlement {
    /// Label for logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Done { .. } => "done",
            Self::NotStored { .. } => "not_stored",
            Self::Unknown { .. } => "outcome_unknown",
            Self::Failed { .. } => "failed",
            Self::Release { .. } => "released",
        }
    }

    /// This settlement without the answer it carries, for a store that cannot take the
    /// answer: "executed, answer not stored" for a done record (the request ran, so its
    /// repeats must never run it), a release for a failure (its waiters are told their
    /// owner failed, without its answer; a one-time token is still given back). `None`:
    /// nothing to leave out.
    pub(super) fn without_answer(&self) -> Option<Settlement> {
        match self {
            Self::Done { response, ttl } if !ttl.is_zero() => Some(Self::NotStored {
                status: response.status(),
                ttl: *ttl,
            }),
            Self::Failed { reissue, .. } => Some(Self::Release { reissue: *reissue }),
            _ => None,
        }
    }

    /// The length of the answer it carries, as a shared store is sent it (0: none).
    pub(super) fn answer_len(&self) -> usize {
        match self {
            Self::Done { response, .. } | Self::Failed { response, .. } => response.encode().len(),
            _ => 0,
        }
    }

    /// The bytes of the answer it holds (0: none): what it is charged while it is made
    /// again in the background (`super::settling`).
    pub(super) fn answer_size(&self) -> usize {
        match self {
            Self::Done { response, .. } | Self::Failed { response, .. } => response.size(),
            _ => 0,
        }
    }

    /// What writing [`Self::without_answer`] in this settlement's place, as `settled`,
    /// came to: a done record's answer left out is [`Settled::AnswerNotKept`]; a failure's
    /// release is what it was.
    pub(super) fn settled_without_answer(&self, settled: Settled) -> Settled {
        match settled {
            Settled::Written | Settled::WrittenBack if matches!(self, Self::Done { .. }) => {
                Settled::AnswerNotKept
            }
            settled => settled,
        }
    }

    /// Whether this settlement must be written even when the claim's record is gone (the
    /// store lost it): an answer, or what says the request may have run. A failure or a
    /// release leaves nothing a retry needs.
    pub(super) fn writes_back(&self) -> bool {
        matches!(
            self,
            Self::Done { ttl, .. } | Self::NotStored { ttl, .. } | Self::Unknown { ttl }
                if !ttl.is_zero()
        )
    }
}

/// What settling did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Written over this owner's own record.
    Written,
    /// The record was gone (the store lost it, or an operator purged it), and the
    /// settlement was written in its place.
    WrittenBack,
    /// An answer the store could not keep (larger than the memory store's whole budget,
    /// or no room with `when_full: reject`; too large for, or refused by, a shared store:
    /// see `NotKept`): the key records "executed, answer not stored" instead, so its
    /// repeats still never execute.
    AnswerNotKept,
    /// Nothing written: another owner holds the key.
    NotWritten,
}

/// Why an answer was left out of its record ([`Settled::AnswerNotKept`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotKept {
    /// Larger than the store takes (the memory store's budget or room, MySQL's
    /// `max_allowed_packet` or row size, PostgreSQL's program limits, Redis's
    /// `proto-max-bulk-len`): a limit an answer that size meets every time, as one over
    /// `max_answer` does.
    TooLarge,
    /// The database refused its write for what it held (a trigger, a constraint): a rule
    /// of the store's own, which an operator should hear of.
    Refused,
}

impl Settled {
    /// Whether the settlement is in the store now as it was asked for.
    pub fn kept(self) -> bool {
        matches!(self, Self::Written | Self::WrittenBack)
    }
}
