//! What the Redis store writes: record and channel names, and each record's binary value.
//!
//! A record is a single Redis string under `{prefix}{<hex digest>}` (the braces are a
//! cluster hash tag, so a key's record and its channel live on one slot). Its value is
//! binary, never base64 or JSON, and its first byte says what it is:
//!
//! - `I` in flight: owner token (16) · payload fingerprint (32) · created ms (8) · lapse
//!   span ms (8) · lapse kind (`H` hold, `R` release), then a mark: `w` once a duplicate
//!   waits on it, or `s` once observe mode counted a duplicate of it (either way its
//!   settlement goes through the settle script, which wakes the waiters and keeps the count
//!   as long as the outcome; one mark is enough). Its `PX` is the lease plus the lapse
//!   span, renewed by the live owner; so a claim whose remaining TTL is at most the span
//!   has lapsed. The token's low 48 bits are the created ms, so the owner can rebuild its
//!   unmarked record byte for byte.
//! - `D` done: payload fingerprint (32) · [`StoredResponse::encode`], `PX` the route's ttl.
//! - `N` executed, answer not stored: fingerprint (32) · status (2) · at ms (8).
//! - `U` outcome unknown: owner token (16) · fingerprint (32) · at ms (8).
//! - `F` failed: owner token (16) · fingerprint (32) · issued flag (1) ·
//!   [`StoredResponse::encode`] of what the owner's waiters get. With the flag (a token
//!   handed back) its `PX` is what is left of the token's expiry at the write, under the
//!   linger; a token with more left is written as `T` instead ([`FailureKept`]), so no
//!   answer outlives its linger.
//! - `T` a one-time token issued and not yet used: a tag (16) naming this issue (the token of
//!   the owner that gave it back, or random), so the admin API tells one issue from the
//!   next (earlier builds wrote the kind alone).
//!
//! Redis therefore holds SHA-256 digests and the upstream's response, never a raw client
//! key, `Authorization` value or request body.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::BufMut as _;
use redis::{RedisWrite, ToRedisArgs};

use crate::key::Digest;
use crate::store::{
    token_left, unix_ms, FailureKept, Lapse, OwnerToken, Revision, Settlement, StoreError,
    StoredResponse,
};

/// The bits of an owner token that hold its claim's created ms.
pub(super) const CREATED_MASK: u128 = (1 << 48) - 1;
/// An unmarked in-flight record's length; a waiter's mark may follow.
pub(super) const CLAIM_LEN: usize = 66;
/// Where the payload fingerprint sits in `I`, `U` and `F` records (after kind and token).
const FP_AT: usize = 17;

/// A record as a claim found it.
pub(super) enum Record {
    /// Claimed by someone (or by this claim, retried).
    InFlight {
        token: OwnerToken,
        fingerprint: Digest,
        created: SystemTime,
        /// How long a lapsed claim stays (see [`Lapse::span`]), and what it means.
        lapse: Lapse,
    },
    Done(StoredResponse),
    NotStored {
        fingerprint: Digest,
        status: http::StatusCode,
        at: SystemTime,
    },
    Unknown {
        fingerprint: Digest,
        at: SystemTime,
    },
    Failed {
        token: OwnerToken,
        fingerprint: Digest,
        response: StoredResponse,
    },
    Issued,
}

fn malformed() -> StoreError {
    StoreError::Unreadable("malformed record in Redis".into())
}

fn token_at(data: &[u8], at: usize) -> Result<OwnerToken, StoreError> {
    let bytes = data.get(at..at + 16).ok_or_else(malformed)?;
    Ok(OwnerToken(u128::from_be_bytes(
        bytes.try_into().map_err(|_| malformed())?,
    )))
}

fn digest_at(data: &[u8], at: usize) -> Result<Digest, StoreError> {
    let bytes = data.get(at..at + 32).ok_or_else(malformed)?;
    Ok(Digest(bytes.try_into().map_err(|_| malformed())?))
}

fn ms_at(data: &[u8], at: usize) -> Result<u64, StoreError> {
    let bytes = data.get(at..at + 8).ok_or_else(malformed)?;
    Ok(u64::from_be_bytes(
        bytes.try_into().map_err(|_| malformed())?,
    ))
}

fn time_at(data: &[u8], at: usize) -> Result<SystemTime, StoreError> {
    Ok(UNIX_EPOCH + Duration::from_millis(ms_at(data, at)?))
}

impl Record {
    /// Reads a record's value.
    pub(super) fn parse(data: &[u8]) -> Result<Self, StoreError> {
        Ok(match data.first() {
            Some(b'I') if data.len() >= CLAIM_LEN => {
                let span = Duration::from_millis(ms_at(data, 57)?);
                Record::InFlight {
                    token: token_at(data, 1)?,
                    fingerprint: digest_at(data, FP_AT)?,
                    created: time_at(data, 49)?,
                    lapse: match data[65] {
                        b'R' => Lapse::Release { grace: span },
                        _ => Lapse::Hold { ttl: span },
                    },
                }
            }
            Some(b'D') => {
                let fingerprint = digest_at(data, 1)?;
                Record::Done(
                    StoredResponse::decode(fingerprint, &data[33..]).ok_or_else(malformed)?,
                )
            }
            Some(b'N') => Record::NotStored {
                fingerprint: digest_at(data, 1)?,
                status: data
                    .get(33..35)
                    .and_then(|s| http::StatusCode::from_u16(u16::from_be_bytes([s[0], s[1]])).ok())
                    .ok_or_else(malformed)?,
                at: time_at(data, 35)?,
            },
            Some(b'U') => Record::Unknown {
                fingerprint: digest_at(data, FP_AT)?,
                at: time_at(data, 49)?,
            },
            Some(b'F') => {
                let fingerprint = digest_at(data, FP_AT)?;
                Record::Failed {
                    token: token_at(data, 1)?,
                    fingerprint,
                    response: StoredResponse::decode(
                        fingerprint,
                        data.get(50..).ok_or_else(malformed)?,
                    )
                    .ok_or_else(malformed)?,
                }
            }
            Some(b'T') => Record::Issued,
            _ => return Err(malformed()),
        })
    }
}

/// Where the ms a record was made sit in a record of kind `kind` (a claim's time, or the
/// time an outcome was stored): what every kind but an issued token carries near its start.
fn made_at_offset(kind: u8) -> Option<usize> {
    Some(match kind {
        b'I' | b'U' => 49,
        // Kind, fingerprint, then the encoded answer: version, status, stored ms.
        b'D' => 1 + 32 + 3,
        b'N' => 1 + 32 + 2,
        // Kind, token, fingerprint, issued flag, then the encoded answer.
        b'F' => 1 + 16 + 32 + 1 + 3,
        _ => return None,
    })
}

/// When the record whose first bytes are `head` was made.
pub(super) fn made_at(head: &[u8]) -> Option<SystemTime> {
    time_at(head, made_at_offset(*head.first()?)?).ok()
}

/// Which record `data` is, shown as `state`: the ms it was made and the owner token where
/// its kind keeps one (an issued token's tag standing for it), read as the purge script
/// reads them ([`purge_tag`]).
pub(super) fn revision(data: &[u8], state: &str) -> Revision {
    let kind = data.first().copied().unwrap_or(0);
    let at = made_at_offset(kind).and_then(|at| ms_at(data, at).ok());
    let token = match kind {
        b'I' | b'U' | b'F' | b'T' => token_at(data, 1).ok(),
        _ => None,
    };
    Revision::new(state, at.unwrap_or(0), token)
}

/// What the purge script builds from a record to compare with a revision: the state's
/// letter, the ms (8, zero for an issued token) and the token (16, or nothing).
pub(super) fn purge_tag(revision: &Revision) -> Vec<u8> {
    let mut tag = Vec::with_capacity(1 + 8 + 16);
    tag.push(revision.state());
    tag.extend_from_slice(&revision.at().to_be_bytes());
    if let Some(token) = revision.token() {
        tag.extend_from_slice(&token.0.to_be_bytes());
    }
    tag
}

/// The issued token's record, tagged `tag` (see the layouts).
pub(super) fn issued_value(tag: OwnerToken) -> Vec<u8> {
    let mut value = Vec::with_capacity(1 + 16);
    value.push(b'T');
    value.extend_from_slice(&tag.0.to_be_bytes());
    value
}

/// The in-flight record a claim by `token` writes.
pub(super) fn claim_value(token: OwnerToken, fingerprint: Digest, lapse: Lapse) -> [u8; CLAIM_LEN] {
    let mut value = [0; CLAIM_LEN];
    value[0] = b'I';
    value[1..17].copy_from_slice(&token.0.to_be_bytes());
    value[17..49].copy_from_slice(&fingerprint.0);
    value[49..57].copy_from_slice(&((token.0 & CREATED_MASK) as u64).to_be_bytes());
    value[57..65].copy_from_slice(&(lapse.span().as_millis() as u64).to_be_bytes());
    value[65] = match lapse {
        Lapse::Hold { .. } => b'H',
        Lapse::Release { .. } => b'R',
    };
    value
}

/// The value a settlement writes (`None`: the record is deleted) and its TTL in ms.
pub(super) fn settled_value(
    token: OwnerToken,
    fingerprint: Digest,
    settlement: &Settlement,
) -> (Option<Vec<u8>>, u64) {
    let ms = |ttl: Duration| ttl.as_millis().max(1) as u64;
    let head = |kind: u8, extra: usize| {
        let mut value = Vec::with_capacity(1 + 16 + 32 + extra);
        value.push(kind);
        value.extend_from_slice(&token.0.to_be_bytes());
        value.extend_from_slice(&fingerprint.0);
        value
    };
    let now = unix_ms(SystemTime::now()).to_be_bytes();
    match settlement {
        Settlement::Done { ttl, .. }
        | Settlement::NotStored { ttl, .. }
        | Settlement::Unknown { ttl }
            if ttl.is_zero() =>
        {
            (None, 0)
        }
        Settlement::Done { response, ttl } => {
            let done = DoneRecord(response);
            let mut value = Vec::with_capacity(done.len());
            value.push(b'D');
            value.extend_from_slice(&fingerprint.0);
            value.extend_from_slice(response.encode());
            (Some(value), ms(*ttl))
        }
        Settlement::NotStored { status, ttl } => {
            let mut value = Vec::with_capacity(1 + 32 + 2 + 8);
            value.push(b'N');
            value.extend_from_slice(&fingerprint.0);
            value.extend_from_slice(&status.as_u16().to_be_bytes());
            value.extend_from_slice(&now);
            (Some(value), ms(*ttl))
        }
        Settlement::Unknown { ttl } => {
            let mut value = head(b'U', 8);
            value.extend_from_slice(&now);
            (Some(value), ms(*ttl))
        }
        Settlement::Failed {
            response,
            linger,
            reissue,
        } => match FailureKept::of(*linger, token_left(*reissue)) {
            FailureKept::Token { ttl } => (Some(issued_value(token)), ms(ttl)),
            FailureKept::Record { ttl, issued } => {
                let encoded = response.encode();
                let mut value = head(b'F', 1 + encoded.len());
                value.push(if issued { b'1' } else { b'0' });
                value.extend_from_slice(encoded);
                (Some(value), ms(ttl))
            }
        },
        Settlement::Release { reissue } => match token_left(*reissue) {
            Some(ttl) => (Some(issued_value(token)), ms(ttl)),
            None => (None, 0),
        },
    }
}

/// The done record of a response, whose fingerprint is the claim's, written straight into
/// the command that carries it rather than assembled in a buffer of its own first.
#[derive(Clone, Copy)]
pub(super) struct DoneRecord<'a>(pub &'a StoredResponse);

impl DoneRecord<'_> {
    pub(super) fn len(&self) -> usize {
        1 + std::mem::size_of::<Digest>() + self.0.encode().len()
    }
}

impl ToRedisArgs for DoneRecord<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.bufmut_for_next_arg(self.len());
        for part in [&b"D"[..], &self.0.fingerprint().0, self.0.encode()] {
            arg.put_slice(part);
        }
    }
}

/// A record or channel name, `{prefix}{infix}{<hex digest>}` (the braces make a cluster
/// keep a key's record and channel in one slot), written straight into the command that
/// carries it: a `String` per name would be an allocation and a copy per use.
#[derive(Clone, Copy)]
pub(super) struct Name<'a> {
    prefix: &'a str,
    infix: &'static str,
    key: &'a Digest,
}

impl<'a> Name<'a> {
    pub(super) fn new(prefix: &'a str, infix: &'static str, key: &'a Digest) -> Self {
        Self { prefix, infix, key }
    }

    pub(super) fn len(&self) -> usize {
        self.prefix.len() + self.infix.len() + 2 + 2 * self.key.0.len()
    }

    /// The name's pieces, in order, given the buffer for its hex digits.
    fn parts<'b>(&'b self, hex: &'b mut [u8; 64]) -> [&'b [u8]; 5] {
        // 32 bytes always fit 64 hex digits.
        let _ = hex::encode_to_slice(self.key.0, hex);
        [
            self.prefix.as_bytes(),
            self.infix.as_bytes(),
            b"{",
            &hex[..],
            b"}",
        ]
    }
}

impl ToRedisArgs for Name<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut hex = [0; 64];
        let mut arg = out.bufmut_for_next_arg(self.len());
        for part in self.parts(&mut hex) {
            arg.put_slice(part);
        }
    }
}

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut hex = [0; 64];
        for part in self.parts(&mut hex) {
            // Every piece is ASCII (the prefix is a `str`, the rest hex and braces).
            f.write_str(std::str::from_utf8(part).map_err(|_| std::fmt::Error)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
