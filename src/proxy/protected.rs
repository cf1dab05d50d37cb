//! Protected requests, as a fixed sequence of phases: refuse what the head decides
//! ([`super::head`]), buffer the body, derive the key, claim it, then forward (owner), wait
//! and share the outcome (duplicate), or answer from the store at once; finally the owner
//! settles the key.
//!
//! Sent means possibly executed. Only a request that provably never reached the upstream
//! frees its key plainly. Once it went out, the owner's call is [`Detachable`]: a client
//! that disconnects, or whose `upstream_timeout` passes (it gets a 504), does not cancel
//! it; the owner waits on in the background up to `background_timeout` and stores the
//! answer for the retries. A shutdown's drain about to end answers that client the same
//! 504, and its owner waits on for as long as the process lives. An exchange that ends
//! with no answer leaves the key as an unknown outcome (`on_unknown_outcome: hold`), never
//! free for a blind re-run.

use std::future::Future as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};

use super::answer;
use super::body::{read_limited, ProxyBody, RequestBody};
use super::budget::{head_size, Budget, HeadCharge};
use super::conn_share::Owning;
use super::detach::Detachable;
use super::head::{self, Announced};
use super::previous::{self, Earlier, Older};
use super::replay::Replaying;
pub use super::replay::IDEMPOTENT_REPLAYED;
use super::settlement;
pub use super::stopping::Owners;
use super::stopping::Stopping;
use super::unclaimed::{fails_open, forward_after_failed_claim, forward_unprotected};
use super::upstream::{timed_out, Hop, UpstreamClient};
use crate::config::{InFlightMode, OnStoreError, OnUnknownOutcome, Protected};
use crate::error::{NotKept, ProxyError};
use crate::key::client_key::read_client_key;
use crate::key::derive::{buckets::address_digest, scope_digest};
use crate::key::{derive_key, Derived, DerivedKey, Digest, KeyError, KeySource, RequestView};
use crate::metrics::{Metrics, Outcome, RouteMetrics};
use crate::route::Overrides;
use crate::store::{
    AddressTag, CallerTag, Claim, ClaimArgs, ClaimFailure, ClaimMode, Lease, Store, StoreError,
    StoredResponse, Waiter,
};

/// `Retry-After` for a duplicate of a running request: most owners finish within a second,
/// and a sooner retry finds the replay; the lease only bounds owners that vanished.
pub(super) const RETRY_AFTER_SECS: u64 = 1;

/// What the protected path needs from the proxy.
pub struct Context<'a> {
    /// The store keys are claimed in.
    pub store: &'a Store,
    /// The pooled upstream client.
    pub client: &'a UpstreamClient,
    /// The connection the request came on.
    pub conn: &'a super::ConnInfo,
    /// Its peer is in `trusted_proxies` of the config serving this request.
    pub trusted_peer: bool,
    /// Process-wide metrics (the in-flight gauge).
    pub metrics: &'a Arc<Metrics>,
    /// This route's metric handles.
    pub route_metrics: &'a Arc<RouteMetrics>,
    /// The keys this process owns.
    pub owners: &'a Arc<Owners>,
    /// When a shutdown must have answered the duplicates waiting here and the clients of
    /// owners still waiting upstream, and freed the keys of owners whose request has not
    /// gone out.
    pub stopping: &'a Arc<Stopping>,
    /// How long the client may pause while sending the body.
    pub body_read_timeout: Duration,
    /// What bodies and answers are buffered in (`connections.max_buffered`).
    pub budget: &'a Arc<Budget>,
    /// What the request's head holds of it until the answer; an owner takes it along.
    pub head: &'a HeadCharge<'a>,
    /// The rules of the previous generations that would have protected this request, newest
    /// first (`super::previous`): empty unless a reload re-keyed requests.
    pub older: &'a [Arc<Protected>],
    /// The method-override headers the request sends, found when it was routed.
    pub overrides: Overrides,
}

impl Context<'_> {
    /// How its buffered request goes on: never as a protocol switch.
    pub(super) fn hop(&self) -> Hop {
        Hop {
            upgrade: false,
            trusted_peer: self.trusted_peer,
        }
    }
}

/// What the access log and metrics learn about a protected request as it runs.
#[derive(Debug, Default, Clone, Copy)]
pub struct Report {
    /// How it ended; `None` until decided (errors decide it from the error).
    pub outcome: Option<Outcome>,
    /// The derived key, once there is one.
    pub key: Option<Digest>,
    /// It was answered with a body announced and not read: an HTTP/1 connection closes
    /// after the answer.
    pub body_unread: bool,
}

/// What key derivation sees of a buffered request on `rule`.
pub(super) fn request_view<'a>(
    cx: &Context<'a>,
    rule: &'a Protected,
    parts: &'a Parts,
    body: &'a [u8],
) -> RequestView<'a> {
    RequestView {
        route: &rule.route,
        method: &parts.method,
        path: parts.uri.path(),
        query: parts.uri.query(),
        headers: &parts.headers,
        overrides: cx.overrides,
        peer: Some(cx.conn.peer.ip()),
        identity: &rule.identity,
        client_cert: cx.conn.client_cert(),
        body,
    }
}

/// Runs the phases for one request on a protected route.
pub async fn handle(
    cx: Context<'_>,
    rule: &Arc<Protected>,
    request: Request<RequestBody>,
    report: &mut Report,
) -> Result<Response<ProxyBody>, ProxyError> {
    let policy = &rule.policy;
    let size = head_size(&request);
    let (parts, body) = request.into_parts();
    // Phase 1: refuse what the head decides before the body is polled, so `Expect:
    // 100-continue` gets that answer instead of `100 Continue` (see `head`). Then the head
    // takes its room in the budget, held while its body comes and its owner runs: one
    // without room gets what a body without room gets, before anything is claimed.
    let buffers = cx.conn.share.buffers();
    let announced = Announced::of(&parts.headers, body.is_empty());
    let refused = head::refusal(rule, &parts.headers, announced, cx.budget, buffers)
        .and_then(|()| head::take_room(cx.head, size, cx.budget, rule, &parts.headers));
    if let Err(refused) = refused {
        report.body_unread = announced != Announced::Nothing;
        return Err(refused);
    }
    // Phase 2: buffer (bounded), then refuse stale or future timestamps before any store
    // work: a header's again, though the head passed, since its body may have come slowly
    // for as long as the original's key took to expire, and the claim comes next.
    let body = read_limited(
        &parts.headers,
        body,
        policy.max_body,
        cx.body_read_timeout,
        cx.budget,
        buffers,
    )
    .await?;
    if let Some(fresh) = &rule.fresh {
        super::fresh::check(fresh, &parts.headers, &body, std::time::SystemTime::now())?;
    }
    // Phase 3: derive the key.
    let view = request_view(&cx, rule, &parts, &body);
    let DerivedKey { key, fingerprint } = match derive_key(&rule.key, &view, None)? {
        Derived::Key(derived) => derived,
        Derived::Unkeyed => {
            report.outcome = Some(Outcome::Unkeyed);
            return forward_unprotected(&cx, parts, body, policy).await;
        }
        Derived::CallerUnnamed => {
            caller_unnamed(report);
            return forward_unprotected(&cx, parts, body, policy).await;
        }
    };
    report.key = Some(key);
    let span = tracing::Span::current();
    if !span.is_disabled() {
        span.record("key", tracing::field::display(key.short()));
    }

    // Phase 4 takes room among the connection's owners first: an owner runs on when its
    // client leaves, so without it a client resetting its streams has upstream calls run
    // without bound (see `conn_share`). Taken before the claim, a refusal claims nothing.
    let Some(owning) = cx.conn.share.try_own() else {
        return Err(busy(cx.conn));
    };

    // Phase 4: claim; a duplicate in wait mode claims again each time it is woken, naming
    // the owner it waited on, until wait_timeout after it first found the key in flight.
    // Token routes only start from an issued token; a failed attempt hands it back.
    let mut args = claim_args(&cx, rule, &view, key, fingerprint);
    let mut waiting_since: Option<Instant> = None;
    loop {
        let (claim, unanswered) = ClaimFailure::split(cx.store.claim_or_unanswered(args).await);
        let claim = match claim {
            Ok(claim) => claim,
            // Not an outage: this caller holds its share, and waits until it has room.
            Err(StoreError::CallerFull) => return Err(ProxyError::CallerOverShare),
            Err(StoreError::AddressFull) => return Err(ProxyError::AddressOverShare),
            // Not an outage either: a store refusing new keys (`when_full: reject`, full
            // of claims in flight, or a Redis that may evict) answers 503 whatever
            // `on_store_error` says, since forwarding would run the request unprotected
            // exactly when it is asked not to.
            Err(e @ (StoreError::Full | StoreError::Evicting(_))) => {
                cx.route_metrics.waited(waiting_since);
                return Err(e.into());
            }
            // Nor is a record that cannot be read: the store answered that the key is
            // taken, by a request that may have run, so it is never forwarded.
            Err(e @ StoreError::Unreadable(_)) => {
                tracing::warn!(error = %e, "store holds an unreadable record for this key");
                cx.route_metrics.waited(waiting_since);
                return Err(e.into());
            }
            Err(e) => {
                tracing::warn!(error = %e, "store failed during claim");
                cx.route_metrics.waited(waiting_since);
                // The claim it may have left is kept if the request went out, else released.
                if fails_open(policy, waiting_since.is_some(), &e) {
                    report.outcome = Some(Outcome::FailOpen);
                    return forward_after_failed_claim(&cx, parts, body, policy, unanswered).await;
                }
                // One that found its key in flight may duplicate a running request:
                // forwarded, it could run twice. With `fail_open` it gets a waiter's 409
                // and Retry-After, not a 503: the store did answer for this key.
                return match policy.on_store_error {
                    OnStoreError::FailClosed => Err(e.into()),
                    OnStoreError::FailOpen => Err(ProxyError::InFlight {
                        retry_after: RETRY_AFTER_SECS,
                    }),
                };
            }
        };
        if !matches!(claim, Claim::InFlight(_)) {
            cx.route_metrics.waited(waiting_since);
        }
        match claim {
            Claim::Owner(lease) => {
                // Nothing goes out before the keys earlier configs gave it are decided too.
                let (lease, also, body) = if cx.older.is_empty() {
                    (lease, Vec::new(), body)
                } else {
                    match previous::claim_older(&cx, rule, lease, &parts, body, report).await {
                        Older::Run { lease, also, body } => (lease, also, body),
                        Older::Answered(answer) => return answer,
                    }
                };
                let (response, outcome) =
                    execute(&cx, rule, lease, also, owning, parts, body).await?;
                report.outcome = Some(outcome);
                return Ok(response);
            }
            // The replay's record holds its room in the budget until its body is sent
            // (`super::replay`); one without room is refused, not run. The request's body,
            // read for its key, is let go first: its room is the replay's.
            Claim::Done(stored) => {
                drop(body);
                let replayed = replay_charged(&cx, rule, key, stored, Replaying::Answer)?;
                report.outcome = Some(if waiting_since.is_some() {
                    Outcome::Waited
                } else {
                    Outcome::Replayed
                });
                return Ok(replayed);
            }
            Claim::Failed(Some(stored)) => {
                drop(body);
                let replayed = replay_charged(&cx, rule, key, stored, Replaying::Failure)?;
                report.outcome = Some(Outcome::FailureShared);
                return Ok(replayed);
            }
            Claim::Failed(None) => return Err(ProxyError::OwnerFailed),
            Claim::NotStored(record) => {
                return Err(ProxyError::AnswerNotStored {
                    status: record.status,
                    why: NotKept::of(policy, record.status),
                })
            }
            Claim::OutcomeUnknown(unknown) => {
                return Err(ProxyError::OutcomeUnknown {
                    until: unknown.until,
                })
            }
            Claim::Mismatch => return Err(ProxyError::Mismatch),
            Claim::NotIssued => return Err(KeyError::TokenInvalid.into()),
            Claim::InFlight(waiter) => {
                let in_flight = ProxyError::InFlight {
                    retry_after: RETRY_AFTER_SECS,
                };
                if policy.in_flight == InFlightMode::Reject {
                    return Err(in_flight);
                }
                let since = *waiting_since.get_or_insert_with(Instant::now);
                if !wait_for_owner(&cx, rule, waiter, &mut args, since).await {
                    cx.route_metrics.waited(waiting_since);
                    return Err(in_flight);
                }
            }
        }
    }
}

/// Waits, as a duplicate, for the owner `waiter` watches, until `wait_timeout` after
/// `since` (when the duplicate first found the key in flight); `args` then name that owner
/// for the next claim. False when the wait timed out, or when a shutdown's drain would end
/// first: that answers it as a wait that timed out, rather than cutting it off without an
/// answer.
pub(super) async fn wait_for_owner(
    cx: &Context<'_>,
    rule: &Protected,
    waiter: Waiter,
    args: &mut ClaimArgs,
    since: Instant,
) -> bool {
    args.after = waiter.owner();
    args.takes_over = waiter.owner_lapsed();
    let _waiting = cx.metrics.duplicate_waiting();
    tokio::select! {
        woken = waiter.wait(since + rule.policy.wait_timeout) => woken,
        () = cx.stopping.answer_now() => false,
    }
}

/// Notes a request whose key would hold the address of a client a trusted proxy could not
/// name: it runs as it did before idemgate, since a key shared with every other such client
/// could hand it theirs.
pub(super) fn caller_unnamed(report: &mut Report) {
    report.outcome = Some(Outcome::CallerUnknown);
    tracing::debug!(
        "a trusted proxy's X-Forwarded-For names no client, and the key would hold its address: forwarded unprotected"
    );
}

/// The refusal of a request on a connection whose owners fill its share.
fn busy(conn: &super::ConnInfo) -> ProxyError {
    ProxyError::ConnectionBusy {
        limit: conn.share.limit(),
        retry_after: RETRY_AFTER_SECS,
    }
}

/// How a request on `rule` with `key` claims it: token routes only start from an issued
/// token, and hand it back, until its expiry as issued, when an attempt fails.
pub(super) fn claim_args(
    cx: &Context<'_>,
    rule: &Protected,
    view: &RequestView<'_>,
    key: Digest,
    fingerprint: Digest,
) -> ClaimArgs {
    let policy = &rule.policy;
    let (mode, reissue) = match &rule.key.source {
        KeySource::Token(t) => {
            // Read from the token the key was derived from, unquoted as it was.
            let until = read_client_key(view.headers, &t.header)
                .ok()
                .map(|token| super::tokens::expires_at(&token, t.reissue_ttl, SystemTime::now()));
            (ClaimMode::IssuedOnly, until)
        }
        _ => (ClaimMode::Any, None),
    };
    ClaimArgs {
        key,
        fingerprint,
        lease: policy.lease,
        lapse: policy.lapse(),
        mode,
        reissue,
        waits: policy.in_flight == InFlightMode::Wait,
        after: None,
        takes_over: false,
        route: cx.route_metrics.tag(),
        // Counted only where the store limits each caller's share: a second digest.
        caller: if cx.store.counts_callers() {
            CallerTag::of(&scope_digest(&rule.key.scope, view))
        } else {
            CallerTag::NONE
        },
        // Likewise where the store limits each client address's share: callers name
        // themselves, so only the address bounds a flood of made-up ones.
        address: if cx.store.counts_addresses() {
            address_digest(view).map_or(AddressTag::NONE, |a| AddressTag::of(&a))
        } else {
            AddressTag::NONE
        },
    }
}

/// The owner's phase: forward, then settle. Its client waits at most `upstream_timeout`,
/// or until a shutdown's drain is about to end (then gets a 504) while the owner, detached,
/// waits on up to `background_timeout`.
/// `owning` counts it among its connection's owners until it ends, detached or not; `also`
/// holds the keys earlier configs gave the request, settled as its own.
/// Returns the answer and how the request ended.
pub(super) async fn execute(
    cx: &Context<'_>,
    rule: &Arc<Protected>,
    lease: Lease,
    also: Vec<Earlier>,
    owning: Owning,
    parts: Parts,
    body: Bytes,
) -> Result<(Response<ProxyBody>, Outcome), ProxyError> {
    let client = cx.client.clone();
    let owner_rule = Arc::clone(rule);
    let conn = cx.conn.clone();
    let hop = cx.hop();
    let running = cx.metrics.owner_running();
    let owned = cx.owners.hold();
    let route_metrics = Arc::clone(cx.route_metrics);
    let started = Instant::now();
    let policy = &rule.policy;
    // Set once a connection took the request: from then on it may have run.
    let sending = lease.sending();
    // Set when the client's deadline passed with nothing sent: the owner then stops
    // waiting for a connection and settles the key as never sent.
    let give_up = Arc::new(AtomicBool::new(false));
    let stop = Arc::clone(&give_up);
    // Set once the exchange with the upstream has ended (its answer is in hand, or it
    // failed): only the settlement is left, which the store's own timeout bounds.
    let exchanged = Arc::new(AtomicBool::new(false));
    let ended = Arc::clone(&exchanged);
    let stopping = Arc::clone(cx.stopping);
    let budget = Arc::clone(cx.budget);
    // The head goes out with the request, and an owner that runs on after its client
    // left still holds it: its charge goes along.
    let head = cx.head.hand_over();
    let owner = Detachable::new(async move {
        let _head = head;
        let _running = running;
        let _owned = owned;
        let _owning = owning;
        let policy = &owner_rule.policy;
        // Dropped at the background bound with the lease unsettled, it counts and logs the
        // unknown outcome the lease's drop then records.
        let guard = UnknownOnDrop {
            lease: Some(lease),
            metrics: Arc::clone(&route_metrics),
            holds: policy.on_unknown_outcome == OnUnknownOutcome::Hold,
        };
        let request = Request::from_parts(parts, ProxyBody::full(body));
        let sending = guard.lease.as_ref().expect("held").sending();
        let exchange = async {
            match client.send_untimed(request, &conn, hop, &sending).await {
                // An answer the budget has no room for streams on, not stored, as one
                // over `max_answer` does: the request ran, so it never fails for that.
                Ok(response) => {
                    let share = conn.share.buffers();
                    let read = answer::read(response, policy.max_answer, &budget, share).await;
                    // Observed, the answer goes to its client untouched, as all are.
                    read.map(|read| if policy.observe { read } else { read.owned() })
                }
                Err(e) => Err(e),
            }
        };
        let mut exchange = std::pin::pin!(exchange);
        let mut stopped = std::pin::pin!(stopping.answer_now());
        // Checked before the exchange is polled: `sending` changes only while this task
        // polls it, so what the client's side saw still holds here.
        let answer = std::future::poll_fn(|task| {
            if stop.load(Ordering::SeqCst) && !sending.load(Ordering::SeqCst) {
                return Poll::Ready(Err(timed_out(&sending)));
            }
            let polled = exchange.as_mut().poll(task);
            // Still waiting for a connection when a shutdown's drain is about to end:
            // nothing went out, so the key is freed now rather than left to lapse into a
            // held unknown outcome. Looked at only while unsent (after the exchange's
            // poll, which usually sends at once), so most owners never register for it.
            if polled.is_pending()
                && !sending.load(Ordering::SeqCst)
                && stopped.as_mut().poll(task).is_ready()
            {
                return Poll::Ready(Err(ProxyError::UpstreamUnreachable(
                    "the proxy stopped before a connection took the request".into(),
                )));
            }
            polled
        })
        .await;
        ended.store(true, Ordering::SeqCst);
        route_metrics.upstream_latency(started.elapsed());
        let mut guard = guard;
        let lease = guard.lease.take().expect("settled once");
        let sealing = owner_rule.sealing.as_deref();
        settlement::settle(lease, also, policy, sealing, &route_metrics, answer).await
    })
    .bounded(started + policy.background_timeout)
    // Detached (its client left, or reset its stream) while still waiting for a
    // connection, it stops at once, as an attached one does at its client's deadline:
    // nothing went out, so the key is freed (its waiters get the 502 and their retries
    // run). Waiting on for a connection, owners whose clients left would pile up past
    // every bound on clients (`max_client` x `max_streams`), each holding its body, for
    // `upstream_timeout`: a client that sends and leaves at once costs nothing to repeat.
    .signal_at(started, Arc::clone(&give_up))
    // Detached because its client left, the owner's outcome is counted when it ends, as
    // the handler would have counted it: the executions `/metrics` shows are all there.
    .when_detached_ends({
        let route_metrics = Arc::clone(cx.route_metrics);
        move |ended: Option<&Result<(Response<ProxyBody>, Outcome), ProxyError>>| {
            route_metrics.count(match ended {
                Some(Ok((_, outcome))) => *outcome,
                Some(Err(e)) => e.outcome(),
                // Dropped at `background_timeout`, its request out and unanswered.
                None => Outcome::Unknown,
            })
        }
    });
    let mut owner = owner;
    // The client waits until its `upstream_timeout`, or until a shutdown's drain is about
    // to end (then it gets the same answers, rather than a cut connection it cannot read).
    // The drain's signal is polled after the owner, and only while it is pending.
    let waited = {
        let timed = cx
            .conn
            .upstream_timer
            .timeout_at(started + policy.upstream_timeout, &mut owner);
        tokio::select! {
            biased;
            waited = timed => waited,
            () = cx.stopping.answer_now() => None,
        }
    };
    match waited {
        Some(result) => joined(result),
        // No connection took the request in time: nothing went out, so the owner stops
        // and settles the key as never sent (a one-time token goes back to issued) before
        // the client gets its 502, so its retry finds the key free.
        None if !sending.load(Ordering::SeqCst) => {
            give_up.store(true, Ordering::SeqCst);
            joined(owner.await)
        }
        // The upstream answered in time (or failed) and the owner is writing the outcome: the
        // client gets what the upstream said once the store has it or has failed to take
        // it, never a 504 for an upstream that did answer (a slow store is no slow
        // upstream; in observe mode the 504 would even send the client's retry upstream).
        None if exchanged.load(Ordering::SeqCst) => joined(owner.await),
        // The owner runs on, detached (at a shutdown, as long as the process lives: its
        // claim stays held, the request went out); the retries of this client get its
        // answer. This request is counted with its 504 (`unknown`), not again when the
        // owner ends.
        None => {
            owner.disown();
            Err(ProxyError::UpstreamTimeout)
        }
    }
}

/// The owner's result as its client's: a panic in its call fails the exchange.
fn joined<T, P>(owner: Result<Result<T, ProxyError>, P>) -> Result<T, ProxyError> {
    owner.unwrap_or_else(|_panicked| {
        Err(ProxyError::UpstreamFailed(
            "the owner's upstream call panicked".into(),
        ))
    })
}

/// Counts and logs an unknown outcome if the owner is dropped with its request out and
/// unsettled (its background bound passed, or it panicked): the lease's own drop then
/// records it in the store.
struct UnknownOnDrop {
    lease: Option<Lease>,
    metrics: Arc<RouteMetrics>,
    holds: bool,
}

impl Drop for UnknownOnDrop {
    fn drop(&mut self) {
        // An unsent lease frees the key as it drops: no outcome is unknown.
        if self.holds && self.lease.as_ref().is_some_and(Lease::is_sent) {
            self.metrics.unknown_outcome();
            tracing::warn!(
                "no answer from the upstream within background_timeout: outcome unknown, key held"
            );
        }
    }
}

/// The replay of `stored`, found for `key` on `rule`, charged to the request's connection
/// ([`super::replay::charged`]).
pub(super) fn replay_charged(
    cx: &Context<'_>,
    rule: &Protected,
    key: Digest,
    stored: StoredResponse,
    what: Replaying,
) -> Result<Response<ProxyBody>, ProxyError> {
    let sealing = rule.sealing.as_deref();
    let charged = (cx.budget, cx.conn.share.buffers(), cx.head.bytes());
    super::replay::charged(stored, sealing, key, charged, what)
}
