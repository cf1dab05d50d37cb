//! Reading the Redis store without claiming: the admin API's view of one key ([`KeyInfo`],
//! a lapsed claim shown as what its next claim will find, and the revision a conditional
//! purge compares) and observe mode's count of a key's duplicates, kept in a counter that
//! lives as long as the record.

use std::time::{Duration, SystemTime};

use redis::Value;

use super::records::{self, Record};
use super::{unexpected, RedisStore};
use crate::key::Digest;
use crate::store::{unix_ms, KeyInfo, Lapse, Seen, StoreError};

impl RedisStore {
    /// See [`Store::saw_duplicate`](crate::store::Store::saw_duplicate).
    pub async fn saw_duplicate(&self, key: Digest) -> Result<Option<SystemTime>, StoreError> {
        let mut invocation = self.scripts.seen.prepare_invoke();
        invocation
            .key(self.record(&key))
            .key(self.seen_counter(&key))
            .arg(unix_ms(SystemTime::now()));
        Ok(match self.run(invocation).await? {
            Value::BulkString(head) => records::made_at(&head),
            _ => None,
        })
    }

    /// See [`Store::inspect`](crate::store::Store::inspect).
    pub async fn inspect(&self, key: Digest) -> Result<Option<KeyInfo>, StoreError> {
        let mut invocation = self.scripts.inspect.prepare_invoke();
        invocation
            .key(self.record(&key))
            .key(self.seen_counter(&key));
        let (data, pttl, seen) = match self.run(invocation).await? {
            Value::Int(0) => return Ok(None),
            Value::Array(items) => {
                let mut items = items.into_iter();
                match (items.next(), items.next(), items.next()) {
                    (Some(Value::BulkString(data)), Some(Value::Int(pttl)), seen) => {
                        (data, pttl, seen_of(seen))
                    }
                    (first, _, _) => return Err(unexpected(&first.unwrap_or(Value::Nil))),
                }
            }
            other => return Err(unexpected(&other)),
        };
        let now = SystemTime::now();
        let ms = |ms: i64| Duration::from_millis(ms.max(0) as u64);
        let info = |state, created, expires, response, status| KeyInfo {
            state,
            created,
            expires,
            response,
            status,
            waiters: None,
            seen,
            revision: records::revision(&data, state),
        };
        Ok(Some(match Record::parse(&data)? {
            Record::Issued => info("issued", now, now + ms(pttl), None, None),
            Record::InFlight { created, lapse, .. } => {
                let span = lapse.span().as_millis() as i64;
                match lapse {
                    _ if pttl > span => {
                        info("in_flight", created, now + ms(pttl - span), None, None)
                    }
                    Lapse::Hold { .. } => {
                        info("outcome_unknown", created, now + ms(pttl), None, None)
                    }
                    Lapse::Release { .. } => info("in_flight", created, now + ms(pttl), None, None),
                }
            }
            Record::Done(response) => {
                let status = Some(response.status());
                info(
                    "done",
                    response.stored_at(),
                    now + ms(pttl),
                    Some(response),
                    status,
                )
            }
            Record::NotStored { status, at, .. } => {
                info("not_stored", at, now + ms(pttl), None, Some(status))
            }
            Record::Unknown { at, .. } => info("outcome_unknown", at, now + ms(pttl), None, None),
            Record::Failed { response, .. } => {
                let status = Some(response.status());
                info(
                    "failed",
                    response.stored_at(),
                    now + ms(pttl),
                    Some(response),
                    status,
                )
            }
        }))
    }
}

/// The observe-mode counter `HMGET n last` returned, if the key was seen more than once.
fn seen_of(value: Option<Value>) -> Option<Seen> {
    let Some(Value::Array(fields)) = value else {
        return None;
    };
    let number = |v: Option<&Value>| -> Option<u64> {
        match v? {
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        }
    };
    Some(Seen {
        times: number(fields.first())?,
        last: std::time::UNIX_EPOCH + Duration::from_millis(number(fields.get(1))?),
    })
}
