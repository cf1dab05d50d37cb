//! A claim on the Redis store: its first look (`SET … NX PX … GET` where the server has
//! it, else the claim script), what a record found means for the claim ([`decide`]), and
//! for a duplicate that waits, the subscription taken before it looks again and marks the
//! record, so no settlement in between goes unseen. A claim left without an answer is
//! released in the background (`store::unanswered`).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use redis::Value;
use tokio::sync::watch;

use super::records::{claim_value, Record, CLAIM_LEN, CREATED_MASK};
use super::subscriptions::Subscription;
use super::{refused_as_syntax, unexpected, RedisStore, FALLBACK_RECHECK};
use crate::key::Digest;
use crate::store::unanswered::{ClaimFailure, Unanswered};
use crate::store::{
    mismatched, unix_ms, Claim, ClaimArgs, ClaimMode, Lapse, NotStored, OwnerToken, RawClaim,
    Store, StoreError, Unknown, Waiter,
};

/// What a look at a key found.
enum Look {
    /// This claim took the key.
    Claimed,
    /// Nothing, and the claim may not take it (issued-only, or a waiter).
    Free,
    /// A record, with its remaining TTL when the look could read it (the script can,
    /// `SET … GET` cannot).
    Found { data: Vec<u8>, pttl: Option<i64> },
}

/// What a look means for the claim.
enum Decided {
    Claim(RawClaim),
    /// Another owner's claim, alive or lapsed but possibly still running: `owner` runs it,
    /// and a waiter looks again after `recheck` at the latest; `lapsed`: the claim lapsed
    /// and is taken over once its record expires.
    InFlight {
        owner: OwnerToken,
        recheck: Duration,
        lapsed: bool,
    },
}

/// Whether a record `SET … GET` returned needs the claim script: to be taken over
/// atomically (an issued token, a failure left for waiters), or for its remaining TTL (a
/// claim or an unknown outcome, whose meaning depends on it).
fn needs_script(data: &[u8]) -> bool {
    !matches!(data.first(), Some(b'D' | b'N'))
}

/// Whether a look by the claim script marks another owner's unmarked in-flight record as
/// waited on (so its settlement publishes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// Leave the record as it is: the claim will not wait, or has not subscribed yet.
    Leave,
    /// Mark it: a waiter that has subscribed to the record's channel.
    WaitedOn,
}

impl RedisStore {
    /// A fresh owner token: 80 random bits over the claim's time in ms (48 bits last until
    /// the year 10889). The in-flight record's created ms is read back from it, so the
    /// record follows from the token and fingerprint alone and a completion can name it in
    /// `IFEQ` without the store remembering anything per claim. Fencing needs only that a
    /// successor's token differs: 80 random bits, and a different millisecond besides.
    fn stamped_token() -> OwnerToken {
        let ms = u128::from(unix_ms(SystemTime::now())) & CREATED_MASK;
        OwnerToken(rand::random::<u128>() << 48 | ms)
    }

    /// A claim's first look: `SET NX GET` where it can be (it writes the claim if the key
    /// is free and returns what is there otherwise), else the claim script. A waiter
    /// coming back (`after`) always takes the script: it must not take a free key.
    async fn first_look(
        &self,
        args: &ClaimArgs,
        value: &[u8],
        px: u64,
    ) -> Result<Look, StoreError> {
        if args.mode == ClaimMode::IssuedOnly
            || args.after.is_some()
            || self.no_set_nx_get.load(Relaxed)
        {
            return self.look(args, value, px, Mark::Leave).await;
        }
        let record = self.record(&args.key);
        // Sized up front, so adding the arguments does not reallocate.
        let mut cmd = redis::Cmd::with_capacity(7, 32 + record.len() + CLAIM_LEN);
        cmd.arg("SET")
            .arg(record)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(px)
            .arg("GET");
        match self.query_raw(&cmd).await? {
            Ok(Value::Nil) => Ok(Look::Claimed),
            Ok(Value::BulkString(data)) => Ok(Look::Found { data, pttl: None }),
            Ok(other) => Err(unexpected(&other)),
            // Before 7.0, NX and GET together are a syntax error.
            Err(e) if refused_as_syntax(&e) => {
                tracing::info!(error = %e, "redis refuses SET NX GET; claiming by script");
                self.no_set_nx_get.store(true, Relaxed);
                self.look(args, value, px, Mark::Leave).await
            }
            Err(e) => Err(StoreError::Unavailable(e.to_string())),
        }
    }

    /// A look by the claim script. With [`Mark::WaitedOn`], by a waiter that has
    /// subscribed, an unmarked in-flight record of another owner it finds is marked as
    /// waited on.
    async fn look(
        &self,
        args: &ClaimArgs,
        value: &[u8],
        px: u64,
        mark: Mark,
    ) -> Result<Look, StoreError> {
        let flag = |on: bool| if on { "1" } else { "0" };
        let after = args.after.map(|t| t.0.to_be_bytes());
        let mut invocation = self.scripts.claim.prepare_invoke();
        invocation
            .key(self.record(&args.key))
            .key(self.seen_counter(&args.key))
            .arg(value)
            .arg(px)
            .arg(flag(args.mode == ClaimMode::IssuedOnly))
            .arg(flag(mark == Mark::WaitedOn))
            .arg(after.as_ref().map_or(&[][..], |a| &a[..]))
            .arg(flag(
                args.takes_over && matches!(args.lapse, Lapse::Release { .. }),
            ));
        match self.run(invocation).await? {
            Value::Int(0) => Ok(Look::Claimed),
            Value::Int(1) => Ok(Look::Free),
            Value::Array(items) => {
                let mut items = items.into_iter();
                match (items.next(), items.next()) {
                    (Some(Value::BulkString(data)), Some(Value::Int(pttl))) => Ok(Look::Found {
                        data,
                        pttl: Some(pttl),
                    }),
                    (first, _) => Err(unexpected(&first.unwrap_or(Value::Nil))),
                }
            }
            other => Err(unexpected(&other)),
        }
    }

    /// See [`Store::claim_or_unanswered`](crate::store::Store::claim_or_unanswered). A claim
    /// left without an answer is released in the background when this future is dropped,
    /// and handed back with a store error (`store::unanswered`).
    pub(crate) async fn claim(
        self: &Arc<Self>,
        args: &ClaimArgs,
    ) -> Result<RawClaim, ClaimFailure> {
        // Nothing is written yet: a refusal leaves nothing to release.
        self.refuse_if_evicting().await?;
        let token = Self::stamped_token();
        let unanswered = Unanswered::arm(args, token, || Store::Redis(Arc::clone(self)));
        unanswered.ended(self.claim_as(args, token).await)
    }

    /// A claim by `token`.
    async fn claim_as(&self, args: &ClaimArgs, token: OwnerToken) -> Result<RawClaim, StoreError> {
        let value = claim_value(token, args.fingerprint, args.lapse);
        let px = (args.lease + args.lapse.span()).as_millis().max(1) as u64;
        let look = match self.first_look(args, &value, px).await? {
            // A waiter subscribes before it looks again; the others look again now. The
            // first look found the key taken, by a request that may be running or have
            // run: a failure of the second must not read as "the store could not say"
            // (which `fail_open` forwards) either.
            Look::Found { data, pttl: None }
                if needs_script(&data) && !(args.waits && data.first() == Some(&b'I')) =>
            {
                self.look(args, &value, px, Mark::Leave)
                    .await
                    .map_err(StoreError::after_in_flight)?
            }
            look => look,
        };
        let (owner, lapsed) = match decide(args, token, look)? {
            Decided::Claim(claim) => return Ok(claim),
            Decided::InFlight { .. } if !args.waits => {
                return Ok(RawClaim::Other(Claim::InFlight(Waiter::unwatched())))
            }
            Decided::InFlight { owner, lapsed, .. } => (owner, lapsed),
        };
        // Looked at again as the owner's waiter: if the owner failed since the first look,
        // this duplicate gets its failure, never a turn of its own on the failure record
        // (nor on a key it freed, unless its claim had lapsed).
        let args = &ClaimArgs {
            after: Some(owner),
            takes_over: lapsed,
            ..*args
        };
        // The key was seen in flight: a failure from here on must not read as "the store
        // could not say" (which `fail_open` forwards).
        self.wait_on(args, token, &value, px)
            .await
            .map_err(StoreError::after_in_flight)
    }

    /// A waiter's claim, once its first look found another owner's claim in flight.
    async fn wait_on(
        &self,
        args: &ClaimArgs,
        token: OwnerToken,
        value: &[u8],
        px: u64,
    ) -> Result<RawClaim, StoreError> {
        // Subscribe first, then look again and mark the record: a settlement between the
        // two is then either seen by that look or, the swap refusing a marked record,
        // published by the settle script to the channel.
        let (signal, subscription) = self.subscribe(&args.key).await?;
        match decide(
            args,
            token,
            self.look(args, value, px, Mark::WaitedOn).await?,
        )? {
            Decided::Claim(claim) => Ok(claim),
            Decided::InFlight {
                owner,
                recheck,
                lapsed,
            } => Ok(RawClaim::Other(Claim::InFlight(Waiter::with_subscription(
                signal,
                Instant::now() + recheck,
                owner,
                lapsed,
                subscription,
            )))),
        }
    }

    /// Joins the waiters on `key`'s channel, once Redis has confirmed its subscription.
    async fn subscribe(
        &self,
        key: &Digest,
    ) -> Result<(watch::Receiver<()>, Subscription), StoreError> {
        let channel = self.channel(key).to_string();
        let (signal, subscription) = self.channels.join(channel, self.conn.clone());
        // On an error the share is dropped, and with it the count.
        self.bounded(subscription.subscribed()).await?;
        Ok((signal, subscription))
    }
}

/// What `look` means for a claim by `token`.
fn decide(args: &ClaimArgs, token: OwnerToken, look: Look) -> Result<Decided, StoreError> {
    let answer = |claim| Ok(Decided::Claim(RawClaim::Other(claim)));
    let unless_mismatched = |stored: &Digest, claim| {
        if mismatched(stored, &args.fingerprint) {
            answer(Claim::Mismatch)
        } else {
            answer(claim)
        }
    };
    let (data, pttl) = match look {
        Look::Claimed => {
            return Ok(Decided::Claim(RawClaim::Owner {
                token,
                liveness: None,
            }))
        }
        // A waiter never takes a turn of its own from a key settled meanwhile. A one-time
        // token's key found free is spent, for its waiters too (its owner vanished, or an
        // operator purged it): as on the memory store, the client asks for a new token.
        Look::Free if args.after.is_some() && args.mode == ClaimMode::Any => {
            return answer(Claim::Failed(None))
        }
        Look::Free => return answer(Claim::NotIssued),
        Look::Found { data, pttl } => (data, pttl),
    };
    let until = |pttl: Option<i64>| {
        SystemTime::now() + Duration::from_millis(pttl.unwrap_or(0).max(0) as u64)
    };
    match Record::parse(&data)? {
        // A retried claim whose first reply was lost: the key is ours.
        Record::InFlight { token: t, .. } if t == token => Ok(Decided::Claim(RawClaim::Owner {
            token,
            liveness: None,
        })),
        Record::InFlight { fingerprint, .. } if mismatched(&fingerprint, &args.fingerprint) => {
            answer(Claim::Mismatch)
        }
        Record::InFlight {
            token: owner,
            lapse,
            ..
        } => {
            let span = lapse.span().as_millis() as i64;
            match (pttl, lapse) {
                // Alive (or not known yet): look again when the lease would run out.
                (None, _) => Ok(Decided::InFlight {
                    owner,
                    recheck: FALLBACK_RECHECK,
                    lapsed: false,
                }),
                (Some(p), _) if p > span || p < 0 => Ok(Decided::InFlight {
                    owner,
                    recheck: Duration::from_millis((p - span).max(1) as u64).min(FALLBACK_RECHECK),
                    lapsed: false,
                }),
                (Some(_), Lapse::Hold { .. }) => {
                    answer(Claim::OutcomeUnknown(Unknown { until: until(pttl) }))
                }
                // Lapsed, but the dead owner's call may still run until the record expires.
                (Some(p), Lapse::Release { .. }) => Ok(Decided::InFlight {
                    owner,
                    recheck: Duration::from_millis(p.max(1) as u64).min(FALLBACK_RECHECK),
                    lapsed: true,
                }),
            }
        }
        Record::Done(response) => unless_mismatched(&response.fingerprint(), Claim::Done(response)),
        Record::NotStored {
            fingerprint,
            status,
            at,
        } => unless_mismatched(&fingerprint, Claim::NotStored(NotStored { status, at })),
        Record::Unknown { fingerprint, .. } => unless_mismatched(
            &fingerprint,
            Claim::OutcomeUnknown(Unknown { until: until(pttl) }),
        ),
        Record::Failed {
            token: owner,
            fingerprint,
            response,
            ..
        } if args.after == Some(owner) => {
            unless_mismatched(&fingerprint, Claim::Failed(Some(response)))
        }
        Record::Failed { .. } | Record::Issued if args.after.is_some() => {
            answer(Claim::Failed(None))
        }
        // The script takes a failure record or an issued token unless only an issued
        // token may be owned and this is no longer one.
        Record::Failed { .. } | Record::Issued => answer(Claim::NotIssued),
    }
}
