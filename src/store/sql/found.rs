//! What a claim routine answered, and what it means for the claim: the same decisions as
//! on the other stores, made from a row instead of an entry or a Redis record. Times come
//! as the database's milliseconds from its own `now()`, so no clock but its own decides.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::ms;
use crate::key::Digest;
use crate::store::{
    mismatched, Claim, ClaimArgs, ClaimMode, KeyInfo, NotStored, OwnerToken, RawClaim, Revision,
    Seen, StoreError, StoredResponse, Unknown,
};

/// A record as a claim or an inspection found it.
#[derive(Debug)]
pub(super) struct Found {
    /// `I` in flight, `D` done, `N` not stored, `U` unknown, `F` failed, `T` issued.
    pub kind: u8,
    pub token: Option<OwnerToken>,
    pub fingerprint: Digest,
    pub status: Option<i16>,
    pub response: Option<Vec<u8>>,
    pub lapse_hold: bool,
    /// In flight: ms until the lease runs out (zero or less: lapsed).
    pub lease_ms: Option<i64>,
    /// Ms until the record is gone.
    pub expires_ms: i64,
    /// When the claim or settlement was written (the database's clock, Unix ms).
    pub created_ms: i64,
}

/// What a claim routine answered.
pub(super) enum Look {
    /// This claim owns the key.
    Claimed,
    /// Nothing there, and this claim may not take it (issued-only, or a waiter).
    Free,
    /// A record this claim does not take.
    Found(Found),
}

/// What a look means for the claim.
pub(super) enum Decided {
    Claim(RawClaim),
    /// Another owner's claim: `owner` runs it; a waiter looks again after `recheck` at the
    /// latest (when its lease runs out, or a lapsed claim's span ends); `lapsed`: the claim
    /// lapsed and is taken over once its row expires.
    InFlight {
        owner: OwnerToken,
        recheck: Duration,
        lapsed: bool,
    },
}

pub(super) fn token_of(bytes: Option<Vec<u8>>) -> Result<Option<OwnerToken>, StoreError> {
    bytes
        .map(|b| {
            <[u8; 16]>::try_from(b.as_slice())
                .map(|b| OwnerToken(u128::from_be_bytes(b)))
                .map_err(|_| malformed())
        })
        .transpose()
}

pub(super) fn digest_of(bytes: Option<Vec<u8>>) -> Result<Digest, StoreError> {
    match bytes {
        None => Ok(Digest::NONE),
        Some(b) => <[u8; 32]>::try_from(b.as_slice())
            .map(Digest)
            .map_err(|_| malformed()),
    }
}

/// How often a key was seen in observe mode, from the `{t}_seen` columns of an inspection.
pub(super) fn seen_of(times: Option<i64>, last_ms: Option<i64>) -> Option<Seen> {
    Some(Seen {
        times: u64::try_from(times?).ok()?,
        last: UNIX_EPOCH + ms(last_ms?),
    })
}

fn malformed() -> StoreError {
    StoreError::Unreadable("malformed row in the dedupe table".into())
}

impl Found {
    fn response(&self) -> Result<StoredResponse, StoreError> {
        let data = self.response.as_deref().ok_or_else(malformed)?;
        StoredResponse::decode(self.fingerprint, data).ok_or_else(malformed)
    }

    fn status(&self) -> Result<http::StatusCode, StoreError> {
        self.status
            .and_then(|s| http::StatusCode::from_u16(s as u16).ok())
            .ok_or_else(malformed)
    }

    fn created(&self) -> SystemTime {
        UNIX_EPOCH + ms(self.created_ms)
    }

    fn until(&self) -> SystemTime {
        SystemTime::now() + ms(self.expires_ms)
    }

    /// Whether an in-flight record's lease ran out without a renewal.
    fn lapsed(&self) -> bool {
        self.lease_ms.unwrap_or(0) <= 0
    }

    /// What the admin API shows about this record. Its revision is the claim's token (every
    /// claim has its own; an issued token's row has none) and the row's `created_at` in ms,
    /// as the purge routine reads them.
    pub(super) fn info(self) -> Result<KeyInfo, StoreError> {
        let now = SystemTime::now();
        let info = |state,
                    expires_ms: i64,
                    response: Option<StoredResponse>,
                    status: Option<http::StatusCode>| KeyInfo {
            state,
            created: self.created(),
            expires: now + ms(expires_ms),
            status: status.or(response.as_ref().map(StoredResponse::status)),
            response,
            waiters: None,
            seen: None,
            revision: Revision::new(state, self.created_ms as u64, self.token),
        };
        Ok(match self.kind {
            b'I' if !self.lapsed() => info("in_flight", self.lease_ms.unwrap_or(0), None, None),
            b'I' if self.lapse_hold => info("outcome_unknown", self.expires_ms, None, None),
            b'I' => info("in_flight", self.expires_ms, None, None),
            b'T' => info("issued", self.expires_ms, None, None),
            b'D' => {
                let response = self.response()?;
                KeyInfo {
                    created: response.stored_at(),
                    ..info("done", self.expires_ms, Some(response), None)
                }
            }
            b'N' => info("not_stored", self.expires_ms, None, Some(self.status()?)),
            b'U' => info("outcome_unknown", self.expires_ms, None, None),
            b'F' => info("failed", self.expires_ms, Some(self.response()?), None),
            _ => return Err(malformed()),
        })
    }
}

/// What `look` means for a claim by `token`.
pub(super) fn decide(
    args: &ClaimArgs,
    token: OwnerToken,
    look: Look,
) -> Result<Decided, StoreError> {
    let answer = |claim| Ok(Decided::Claim(RawClaim::Other(claim)));
    let owner = || {
        Ok(Decided::Claim(RawClaim::Owner {
            token,
            liveness: None,
        }))
    };
    let found = match look {
        Look::Claimed => return owner(),
        // A waiter never takes a turn of its own from a key settled meanwhile. A one-time
        // token's key found free is spent, for its waiters too (its owner vanished, or an
        // operator purged it): as on the memory store, the client asks for a new token.
        Look::Free if args.after.is_some() && args.mode == ClaimMode::Any => {
            return answer(Claim::Failed(None))
        }
        Look::Free => return answer(Claim::NotIssued),
        Look::Found(found) => found,
    };
    let unless_mismatched = |claim| {
        if mismatched(&found.fingerprint, &args.fingerprint) {
            answer(Claim::Mismatch)
        } else {
            answer(claim)
        }
    };
    match found.kind {
        // A retried claim whose first answer was lost: the key is ours.
        b'I' if found.token == Some(token) => owner(),
        b'I' if mismatched(&found.fingerprint, &args.fingerprint) => answer(Claim::Mismatch),
        b'I' => {
            let owner = found.token.ok_or_else(malformed)?;
            match (found.lapsed(), found.lapse_hold) {
                (false, _) => Ok(Decided::InFlight {
                    owner,
                    recheck: ms(found.lease_ms.unwrap_or(1)).max(Duration::from_millis(1)),
                    lapsed: false,
                }),
                (true, true) => answer(Claim::OutcomeUnknown(Unknown {
                    until: found.until(),
                })),
                // Lapsed, but the dead owner's call may still run until the row expires.
                (true, false) => Ok(Decided::InFlight {
                    owner,
                    recheck: ms(found.expires_ms).max(Duration::from_millis(1)),
                    lapsed: true,
                }),
            }
        }
        b'D' => {
            let response = found.response()?;
            unless_mismatched(Claim::Done(response))
        }
        b'N' => unless_mismatched(Claim::NotStored(NotStored {
            status: found.status()?,
            at: found.created(),
        })),
        b'U' => unless_mismatched(Claim::OutcomeUnknown(Unknown {
            until: found.until(),
        })),
        b'F' if args.after.is_some() && args.after == found.token => {
            let response = found.response()?;
            unless_mismatched(Claim::Failed(Some(response)))
        }
        b'F' | b'T' if args.after.is_some() => answer(Claim::Failed(None)),
        // The routine takes a failure record or an issued token unless only an issued
        // token may be owned and this is no longer one.
        b'F' | b'T' => answer(Claim::NotIssued),
        _ => Err(malformed()),
    }
}
