//! Keys made by an earlier config. A reload that changes how keys are made
//! ([`Config::rekeyed_by`]) would give the retries of requests answered before it, and the
//! duplicates of requests still running across it, new keys, and so run them again. So the
//! config that ran before is kept as a *previous generation* for as long as a record it
//! wrote can live ([`Generations::after_reload`]), and a protected request that owns its key
//! (K) also claims the key that generation gave it (K'), the ordinary way, before anything
//! goes out ([`claim_older`]): a free K' is held while the request runs, then settled as K
//! is ([`arm_earlier`]); an answer under K' is settled under K and replayed; anything
//! else under K' answers the request as it would answer a duplicate of K', and frees K, so
//! a later retry looks at K' again. A client key's answer under K' whose old payload check
//! compared less than the new one (an `ignore` entry dropped) may be another payload's: it
//! is never shown, the request is refused `422` as a key reused with another payload.
//!
//! K' gets K's outcome, not a release, because requests are still keyed by the config
//! before for a while after the reload: on the replicas of a shared store not yet
//! reloaded, and in this process those routed before the reload and claimed after it (a
//! body still arriving). Such a request finds K' alone; freed, K' would let it run again.
//!
//! A restart knows no previous config: the keys of the one before it are not looked at.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::request::Parts;
use http::Response;

use super::body::ProxyBody;
use super::budget::Charge;
use super::protected::{
    claim_args, request_view, wait_for_owner, Context, Report, RETRY_AFTER_SECS,
};
use super::replay::{open_charged, with_charge, Replaying};
use super::settlement::for_key;
use crate::config::{Config, InFlightMode, Protected, Protection};
use crate::error::{NotKept, ProxyError};
use crate::key::{derive_key, Derived, Digest, FingerprintRule, KeyError, KeySource};
use crate::metrics::Outcome;
use crate::store::seal::KeyRing;
use crate::store::{Armed, Claim, ClaimMode, Lease, Settlement, StoreError, StoredResponse};

/// The most previous generations kept: a reload beyond drops the oldest, with a warning.
pub const MAX_GENERATIONS: usize = 4;

/// One config that ran before a reload re-keyed requests, kept until every record it could
/// have written has expired.
#[derive(Debug, Clone)]
pub struct Generation {
    config: Arc<Config>,
    until: Instant,
}

/// The previous generations still honoured, newest first.
#[derive(Debug, Clone, Default)]
pub struct Generations(Vec<Generation>);

impl Generations {
    /// The generations a reload from `current` keeps: those still live, and `current`
    /// itself in front when the reload re-keys requests. Returns them with when `current`'s
    /// keys stop being honoured (`None` if it is not kept).
    pub fn after_reload(&self, current: &Arc<Config>, rekeys: bool) -> (Self, Option<SystemTime>) {
        let now = Instant::now();
        let mut kept: Vec<Generation> = self.0.iter().filter(|g| g.until > now).cloned().collect();
        let mut honoured = None;
        if rekeys {
            // A window too long for the clock (years) is honoured for a decade.
            let lifetime = key_lifetime(current);
            let decade = Duration::from_secs(10 * 365 * 24 * 3600);
            let until = now.checked_add(lifetime).unwrap_or(now + decade);
            let wall = SystemTime::now();
            kept.insert(
                0,
                Generation {
                    config: Arc::clone(current),
                    until,
                },
            );
            honoured = Some(wall.checked_add(lifetime).unwrap_or(wall + decade));
        }
        if kept.len() > MAX_GENERATIONS {
            kept.truncate(MAX_GENERATIONS);
            tracing::warn!(
                kept = MAX_GENERATIONS,
                "more reloads re-keyed requests than are remembered: the keys of the oldest config are no longer honoured, and its retries run again"
            );
        }
        (Self(kept), honoured)
    }

    /// The rules each live generation would have protected this request with, newest
    /// first, when this request is enforced (an observed one is forwarded anyway). An old
    /// rule in observe mode counts: it claimed and settled its keys as enforcement does,
    /// so what it recorded ran, and a switch to `on` replays it. No one-time tokens (a
    /// token is spent once, whatever the route; both sides must be other rules), and only
    /// where requests are told apart at least as finely as now: the same
    /// `scope` and identity settings, and key material that tells apart all the new rule
    /// does ([`tells_apart_as_finely`]). Where they are not, a key the old config gave two
    /// callers, or two requests the new config tells apart, would hand one the other's
    /// answer, which no retry is worth: those requests run again. A client key whose old
    /// payload check compared less is still claimed (the client named it one request), but
    /// an answer found there is refused, not shown ([`payload_checked_as_finely`]).
    ///
    /// `protection` is what a config protects this request with, found as the proxy finds
    /// it ([`admission::route`](super::admission::route), each reading of its path), or
    /// `None` where that config refuses the request: nothing ran under it.
    pub fn rules_for(
        &self,
        now: &Protected,
        protection: impl Fn(&Config) -> Option<&Protection>,
    ) -> Vec<Arc<Protected>> {
        if self.0.is_empty() || now.policy.observe || is_token(now) {
            return Vec::new();
        }
        let at = Instant::now();
        self.0
            .iter()
            .filter(|g| g.until > at)
            .filter_map(|g| match protection(&g.config) {
                Some(Protection::On(old)) if keys_worth_claiming(old, now) => Some(Arc::clone(old)),
                _ => None,
            })
            .collect()
    }
}

/// Whether the key `old` gave a request is one to claim besides the key `now` gives it
/// (see [`Generations::rules_for`]).
fn keys_worth_claiming(old: &Protected, now: &Protected) -> bool {
    !is_token(old)
        && old.key.scope == now.key.scope
        && old.identity == now.identity
        && tells_apart_as_finely(&old.key.source, &now.key.source)
        // The same name and material make the same key: nothing to claim, and no second
        // derivation on every request of an unchanged route.
        && (old.route != now.route || old.key.source != now.key.source)
}

fn is_token(rule: &Protected) -> bool {
    matches!(rule.key.source, KeySource::Token(_))
}

/// Whether two requests that share a key under `old` always share one under `now` too:
/// the old key then names one request as the new config sees it, and its answer is that
/// request's. Method, host and scope hash alike in both; the path is in a `fields` or
/// fingerprint key, and a client key's payload check compares it (a route split in two
/// makes the other path's reuse of a client key a 422, as before the reload). A record
/// under a coarser old key (a field added to the key, fingerprints replaced by client
/// keys) may be another request's: since its record cannot say whose (a `fields` or
/// `fingerprint` key stores no payload to compare), it is not looked at, and the retries
/// of requests answered before the reload run again. Only what is plain from the rules
/// counts: the same client key header, a `fields` key whose fields all stay in the new
/// one, a fingerprint that covered all the new one does and skipped nothing it keeps.
fn tells_apart_as_finely(old: &KeySource, now: &KeySource) -> bool {
    match (old, now) {
        (KeySource::Header(was), KeySource::Header(is)) => was == is,
        (KeySource::Fields(was), KeySource::Fields(is)) => is.iter().all(|p| was.contains(p)),
        (KeySource::Fingerprint(was), KeySource::Fingerprint(is)) => covers_as_much(was, is),
        _ => false,
    }
}

/// Whether two requests whose canonical forms are equal under `old` are equal under `now`
/// too: `old` covers the query and the body wherever `now` does, and skips nothing `now`
/// keeps.
fn covers_as_much(old: &FingerprintRule, now: &FingerprintRule) -> bool {
    (old.query || !now.query) && (old.body || !now.body) && ignores_no_more(old, now)
}

/// Whether the payload fingerprint a client key's record under `old` holds says which
/// payload ran as finely as `now`'s check would: a record the old check found this
/// request's may hold another payload's answer where it compared less (an `ignore` entry
/// the new check drops, the body or query it skipped). Keys without a payload check
/// (`fields`, fingerprints) store none, and need none.
fn payload_checked_as_finely(old: &Protected, now: &Protected) -> bool {
    !matches!(old.key.source, KeySource::Header(_))
        || covers_as_much(&old.key.payload, &now.key.payload)
}

/// Whether everything the old fingerprint skipped the new one skips too: two requests
/// whose old canonical forms were equal differ only in what the new one skips as well, so
/// they are equal under it. Names are matched at any depth in both; a pointer counts only
/// as the same pointer (an array element it skips leaves the others at their positions in
/// both forms).
fn ignores_no_more(old: &FingerprintRule, now: &FingerprintRule) -> bool {
    old.ignore
        .names()
        .all(|name| now.ignore.ignores_name(name.as_bytes()))
        && old
            .ignore
            .pointers()
            .iter()
            .all(|p| now.ignore.pointers().contains(p))
}

/// The longest a record `config` wrote can live: a claim made just before the reload may
/// run on for `background_timeout` (and lapse a `lease` after its last renewal), then its
/// record lives for the route's window (`ttl`, which is `fingerprint_ttl` where idemgate
/// derives the key) or, held as an unknown outcome, at least the background bound.
fn key_lifetime(config: &Config) -> Duration {
    let rules = config
        .routes
        .iter()
        .map(|r| &r.protection)
        .chain([&config.fallback]);
    rules
        .filter_map(|p| match p {
            Protection::On(rule) => {
                let p = &rule.policy;
                Some(p.lease + p.background_timeout + p.ttl.max(p.background_timeout))
            }
            Protection::Off(_) => None,
        })
        .max()
        .unwrap_or_default()
}

/// What the claims of the earlier keys decided.
pub(super) enum Older {
    /// Every earlier key was free: run the request, its `body` handed back, under `lease`;
    /// `also` holds the earlier keys, settled as `lease` is.
    Run {
        lease: Lease,
        also: Vec<Earlier>,
        body: Bytes,
    },
    /// An earlier key answered the request (K settled or freed).
    Answered(Result<Response<ProxyBody>, ProxyError>),
}

/// With K owned (`lease`), claims the key each previous generation's rule (`cx.older`)
/// gives this request, when it differs from `key`, and decides as [`Older`] says. The
/// request's `body`, read for its keys, is let go before a replay found under one is
/// charged, as before a replay of K (`super::protected`): its room is the replay's, and a
/// record over the connection's share is replayed only alone on it (`super::replay`).
pub(super) async fn claim_older(
    cx: &Context<'_>,
    rule: &Protected,
    lease: Lease,
    parts: &Parts,
    body: Bytes,
    report: &mut Report,
) -> Older {
    let mut also: Vec<Earlier> = Vec::new();
    let mut seen = vec![lease.key()];
    for old in cx.older {
        let view = request_view(cx, old, parts, &body);
        // A request the old rule would not have keyed (or refused) left no record there.
        let Ok(Derived::Key(derived)) = derive_key(&old.key, &view, None) else {
            continue;
        };
        if seen.contains(&derived.key) {
            continue;
        }
        seen.push(derived.key);
        let mut args = claim_args(cx, old, &view, derived.key, derived.fingerprint);
        // Its key was made by the old rule, its wait is this route's.
        args.mode = ClaimMode::Any;
        args.reissue = None;
        args.waits = rule.policy.in_flight == InFlightMode::Wait;
        args.route = cx.route_metrics.tag();
        let answer = match claim_one(cx, rule, old, args).await {
            Found::Free(mut earlier) => {
                cx.metrics.rekeyed(&rule.route, "free");
                // Dropped unsettled with K, it must say what K's drop says: a request that
                // may have gone out is never freed for a blind re-run.
                earlier.sent_with(&lease);
                also.push(Earlier {
                    lease: earlier,
                    sealing: old.sealing.clone(),
                });
                continue;
            }
            Found::Refused(e) => Answer::Other(Err(e), None),
            Found::Stored(stored, what, waited) => {
                // Let go before the replay is charged: its room is the replay's.
                drop(body);
                opened(cx, old, derived.key, stored, what, waited)
            }
        };
        cx.metrics.rekeyed(&rule.route, answer.label());
        return Older::Answered(match answer {
            Answer::Done(stored, charge, waited) => {
                report.outcome = Some(if waited {
                    Outcome::Waited
                } else {
                    Outcome::Replayed
                });
                answer_from(rule, lease, also, stored, charge).await
            }
            Answer::Other(answer, outcome) => {
                release_all(also).await;
                release(lease).await;
                report.outcome = outcome;
                answer
            }
        });
    }
    Older::Run { lease, also, body }
}

/// What one earlier key held.
enum Found {
    /// Free: claimed, to be released once the request settled K.
    Free(Lease),
    /// A record to replay, not yet opened nor charged: the answer the key ran to (found at
    /// once or after waiting: the flag), or the failure its owner shares with its waiters.
    Stored(StoredResponse, Replaying, bool),
    /// What a duplicate of that key is refused with.
    Refused(ProxyError),
}

/// What an earlier key answers the request with.
enum Answer {
    /// Its answer (opened), with what its replay holds of the budget, found at once or
    /// after waiting.
    Done(StoredResponse, Charge, bool),
    /// What a duplicate of that key gets, with its outcome when not told by the error.
    Other(Result<Response<ProxyBody>, ProxyError>, Option<Outcome>),
}

impl Answer {
    fn label(&self) -> &'static str {
        match self {
            Self::Done(..) => "done",
            Self::Other(Ok(_), _) | Self::Other(Err(ProxyError::OwnerFailed), _) => "failed",
            Self::Other(Err(ProxyError::Mismatch), _) => "mismatch",
            Self::Other(Err(ProxyError::InFlight { .. }), _) => "in_flight",
            Self::Other(Err(ProxyError::OutcomeUnknown { .. }), _) => "outcome_unknown",
            Self::Other(Err(ProxyError::AnswerNotStored { .. }), _) => "not_stored",
            Self::Other(Err(_), _) => "error",
        }
    }
}

/// `stored`, found under the earlier key `key` that `old` made, opened with its ring and
/// charged as any replay is (`super::replay`): what the key answers the request with.
fn opened(
    cx: &Context<'_>,
    old: &Protected,
    key: Digest,
    stored: StoredResponse,
    what: Replaying,
    waited: bool,
) -> Answer {
    let charged = (cx.budget, cx.conn.share.buffers(), cx.head.bytes());
    match open_charged(stored, old.sealing.as_deref(), key, charged, what) {
        Ok((stored, charge)) if what == Replaying::Answer => Answer::Done(stored, charge, waited),
        Ok((stored, charge)) => Answer::Other(
            Ok(with_charge(&stored, charge)),
            Some(Outcome::FailureShared),
        ),
        Err(e) => Answer::Other(Err(e), None),
    }
}

/// Claims one earlier key as a duplicate claims its own: waiting while it is in flight
/// (per this route's `in_flight`), then taking its outcome.
async fn claim_one(
    cx: &Context<'_>,
    rule: &Protected,
    old: &Protected,
    mut args: crate::store::ClaimArgs,
) -> Found {
    let policy = &rule.policy;
    let in_flight = || ProxyError::InFlight {
        retry_after: RETRY_AFTER_SECS,
    };
    let mut since: Option<Instant> = None;
    loop {
        let claim = match cx.store.claim_with(args).await {
            Ok(claim) => claim,
            Err(e) => {
                cx.route_metrics.waited(since);
                // A share refused (a flood from one address meets it on every request) is
                // the caller's answer, not a store failure worth a warning each time.
                let error = match e {
                    StoreError::CallerFull => ProxyError::CallerOverShare,
                    StoreError::AddressFull => ProxyError::AddressOverShare,
                    e => {
                        tracing::warn!(error = %e, "store failed claiming the key of a previous config");
                        // K is this request's, but the store did not say whether K' ran:
                        // it is not forwarded, whatever `on_store_error` says.
                        match e {
                            StoreError::FoundInFlight(_) => in_flight(),
                            _ if since.is_some() => in_flight(),
                            e => e.into(),
                        }
                    }
                };
                return Found::Refused(error);
            }
        };
        if !matches!(claim, Claim::InFlight(_)) {
            cx.route_metrics.waited(since);
        }
        // An answer (or a failure shared) the old payload check could not tell from another
        // payload's is not shown: two requests the new check tells apart may share it. The
        // request is refused as a reuse of its client key with another payload would be,
        // rather than run again under a key that may have run (see `claim_older`).
        if matches!(claim, Claim::Done(_) | Claim::Failed(Some(_)))
            && !payload_checked_as_finely(old, rule)
        {
            return Found::Refused(ProxyError::Mismatch);
        }
        return match claim {
            Claim::Owner(lease) => Found::Free(lease),
            Claim::Done(stored) => Found::Stored(stored, Replaying::Answer, since.is_some()),
            Claim::Failed(Some(stored)) => Found::Stored(stored, Replaying::Failure, false),
            // The owner waited on freed K' without a failure to share (a 5xx too large to
            // keep, a failure record gone before the wait ended): a request keyed before
            // the reload, since one keyed after it settles K' before its own key (see
            // `settlement::Owner::write`), unless it was dropped at its background bound
            // as it wrote them, its K' then written late: the request this one retries.
            // Told it failed, as a duplicate of K is: it may have run.
            Claim::Failed(None) => Found::Refused(ProxyError::OwnerFailed),
            Claim::NotStored(record) => Found::Refused(ProxyError::AnswerNotStored {
                status: record.status,
                why: NotKept::of(policy, record.status),
            }),
            Claim::OutcomeUnknown(unknown) => Found::Refused(ProxyError::OutcomeUnknown {
                until: unknown.until,
            }),
            Claim::Mismatch => Found::Refused(ProxyError::Mismatch),
            Claim::NotIssued => Found::Refused(KeyError::TokenInvalid.into()),
            Claim::InFlight(waiter) => {
                if policy.in_flight == InFlightMode::Reject {
                    return Found::Refused(in_flight());
                }
                let start = *since.get_or_insert_with(Instant::now);
                if !wait_for_owner(cx, rule, waiter, &mut args, start).await {
                    cx.route_metrics.waited(since);
                    return Found::Refused(in_flight());
                }
                continue;
            }
        };
    }
}

/// Settles K with the answer found under K' and replays it (its body holding `charge`),
/// and the newer earlier keys found free before it (`also`) alike. K keeps it for this
/// route's full `ttl` from now, not what K' had left (a record does not say): a retry is
/// answered a little longer than the first answer alone would have been, never run again.
async fn answer_from(
    rule: &Protected,
    lease: Lease,
    also: Vec<Earlier>,
    stored: StoredResponse,
    charge: Charge,
) -> Result<Response<ProxyBody>, ProxyError> {
    let response = with_charge(&stored, charge);
    let (key, fingerprint) = (lease.key(), lease.fingerprint());
    let plain = Settlement::Done {
        response: stored,
        ttl: rule.policy.ttl,
    };
    // Stamped with K's payload before it is sealed for K: the seal binds both.
    let own = for_key(plain.clone(), fingerprint, rule.sealing.as_deref(), key);
    // All armed before the first wait: a client that leaves drops this future, and a
    // lease dropped unarmed would free its key, the request never having gone out.
    let own = lease.armed(own);
    let earlier = arm_earlier(also, &plain);
    if let Err(e) = own.settle().await {
        tracing::warn!(error = %e, "could not store the previous key's answer under the new key; retrying in the background");
    }
    settle_armed(earlier).await;
    Ok(response)
}

/// A key an earlier config gave the request, held beside K while it runs.
pub(super) struct Earlier {
    lease: Lease,
    /// The ring that config sealed answers under: the requests it still keys open them.
    sealing: Option<Arc<KeyRing>>,
}

/// Arms each earlier key with K's settlement (`plain`: the record stamped with K's payload
/// fingerprint, not sealed), each for its own fingerprint and sealed for it under its
/// config's ring: a request that config still keys finds K's outcome there (see the
/// module docs). Armed, it is made even if its owner is dropped before
/// [`settle_armed`] writes it (see `store::Armed`). Sealed copies are made up front, one
/// per key (at most [`MAX_GENERATIONS`]); unsealed ones share the answer's bytes.
pub(super) fn arm_earlier(also: Vec<Earlier>, plain: &Settlement) -> Vec<Armed> {
    also.into_iter()
        .map(|Earlier { lease, sealing }| {
            let (key, fingerprint) = (lease.key(), lease.fingerprint());
            lease.armed(for_key(plain.clone(), fingerprint, sealing.as_deref(), key))
        })
        .collect()
}

/// Settles the earlier keys [`arm_earlier`] armed, one after the other.
pub(super) async fn settle_armed(earlier: Vec<Armed>) {
    for lease in earlier {
        if let Err(e) = lease.settle().await {
            tracing::warn!(error = %e, "could not settle a previous config's key; retrying in the background");
        }
    }
}

/// Frees a key this request claimed and did not run under.
async fn release(lease: Lease) {
    if let Err(e) = lease.release().await {
        tracing::warn!(error = %e, "could not free a claimed key; retrying in the background");
    }
}

/// Frees the earlier keys held beside K: nothing ran under them.
async fn release_all(also: Vec<Earlier>) {
    for earlier in also {
        release(earlier.lease).await;
    }
}

#[cfg(test)]
mod tests;
