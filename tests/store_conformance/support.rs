//! Fixtures and helpers shared by every check: keys salted per run, fingerprints, a
//! stored response with repeated headers and a binary body, claims expecting one outcome,
//! claims repeated until a key is free or settled, and the hang guard.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use http::header::{CONTENT_TYPE, SET_COOKIE};
use http::{HeaderMap, HeaderValue, StatusCode};
use idemgate::key::Digest;
use idemgate::store::{Claim, ClaimArgs, Lapse, Lease, Ownership, Store, StoredResponse};
use sha2::{Digest as _, Sha256};

/// How long any awaited condition may take before the check fails as hung.
pub(crate) const HANG_GUARD: Duration = Duration::from_secs(10);
/// A lease no check outlives: ownership never lapses by accident.
pub(crate) const LONG_LEASE: Duration = Duration::from_secs(30);
/// A lease meant to run out within a check.
pub(crate) const SHORT_LEASE: Duration = Duration::from_millis(300);
/// A TTL no check outlives.
pub(crate) const LONG_TTL: Duration = Duration::from_secs(3600);
/// Pause between re-claims while waiting for a condition.
pub(crate) const POLL: Duration = Duration::from_millis(20);

/// A store key: SHA-256 of `n` and a per-run salt, so runs against a shared server do not
/// collide with leftovers of earlier runs.
pub(crate) fn key(n: u64) -> Digest {
    static SALT: OnceLock<u64> = OnceLock::new();
    let salt = *SALT.get_or_init(rand::random::<u64>);
    let mut h = Sha256::new();
    h.update(b"idemgate conformance key");
    h.update(salt.to_le_bytes());
    h.update(n.to_le_bytes());
    Digest(h.finalize().into())
}

/// A key no other check in this run uses.
pub(crate) fn fresh_key() -> Digest {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    key(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A payload fingerprint (never [`Digest::NONE`]).
pub(crate) fn fingerprint(n: u64) -> Digest {
    let mut h = Sha256::new();
    h.update(b"idemgate conformance fingerprint");
    h.update(n.to_le_bytes());
    Digest(h.finalize().into())
}

/// A body with every byte value, NULs and invalid UTF-8 included.
pub(crate) fn binary_body() -> Vec<u8> {
    (0..=255u8).chain([0, 0, 0xff, 0xc3, 0x28]).collect()
}

/// A 201 with two `Set-Cookie` values (order matters) and a content type.
pub(crate) fn response(body: &[u8]) -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.append(SET_COOKIE, HeaderValue::from_static("session=abc; Path=/"));
    headers.append(SET_COOKIE, HeaderValue::from_static("theme=dark"));
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    StoredResponse::new(StatusCode::CREATED, &headers, body)
}

/// Compares what a replay would send. Not `==`: `stored_at` may lose precision in a
/// backend's encoding.
pub(crate) fn assert_same_response(got: &StoredResponse, want: &StoredResponse) {
    assert_eq!(got.status(), want.status());
    assert_eq!(got.headers(), want.headers());
    let cookies: Vec<_> = got.headers().get_all(SET_COOKIE).iter().cloned().collect();
    assert_eq!(cookies, ["session=abc; Path=/", "theme=dark"]);
    assert_eq!(got.body(), want.body());
    assert_eq!(got.trailers(), want.trailers());
}

pub(crate) async fn claim(store: &Store, key: Digest, fp: Digest, lease: Duration) -> Claim {
    store.claim(key, fp, lease).await.expect("claim failed")
}

pub(crate) fn expect_owner(claim: Claim) -> Lease {
    match claim {
        Claim::Owner(lease) => lease,
        other => panic!("expected owner, got {}", other.as_str()),
    }
}

pub(crate) fn expect_in_flight(claim: Claim) -> idemgate::store::Waiter {
    match claim {
        Claim::InFlight(waiter) => waiter,
        other => panic!("expected in_flight, got {}", other.as_str()),
    }
}

pub(crate) fn expect_done(claim: Claim) -> StoredResponse {
    match claim {
        Claim::Done(response) => response,
        other => panic!("expected done, got {}", other.as_str()),
    }
}

pub(crate) fn expect_mismatch(claim: Claim) {
    if !matches!(claim, Claim::Mismatch) {
        panic!("expected mismatch, got {}", claim.as_str());
    }
}

/// Claims a fresh key and completes it with `body`, for tests that need done records.
pub(crate) async fn complete_fresh(store: &Store, body: &[u8], ttl: Duration) -> Digest {
    let k = fresh_key();
    let lease = expect_owner(claim(store, k, fingerprint(1), LONG_LEASE).await);
    assert!(lease.complete(response(body), ttl).await.expect("complete"));
    k
}

/// Runs `f`, failing the check if it has not finished within [`HANG_GUARD`].
pub(crate) async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, f)
        .await
        .unwrap_or_else(|_| panic!("hang guard: {what} within {HANG_GUARD:?}"))
}

/// Claims until this request owns `key`: the key must become free (released, expired,
/// or its owner's lease run out). A claim that found the owner in flight and saw it end
/// without an answer is that owner's duplicate and gets its failure (`failed`, on a store
/// that looks twice within one claim); the next claim is a new request.
pub(crate) async fn claim_until_owner(
    store: &Store,
    key: Digest,
    fp: Digest,
    lease: Duration,
) -> Lease {
    claim_until_owner_with(store, ClaimArgs::new(key, fp, lease)).await
}

/// [`claim_until_owner`] with these claim arguments.
pub(crate) async fn claim_until_owner_with(store: &Store, args: ClaimArgs) -> Lease {
    within("the key to become free", async {
        loop {
            match store.claim_with(args).await.expect("claim failed") {
                Claim::Owner(lease) => return lease,
                Claim::InFlight(waiter) => {
                    waiter.wait(Instant::now() + POLL).await;
                }
                Claim::Done(_) | Claim::Failed(None) => tokio::time::sleep(POLL).await,
                other => panic!(
                    "unexpected {} while waiting for {:?}",
                    other.as_str(),
                    args.key
                ),
            }
        }
    })
    .await
}

/// Claims until the claim is answered with anything but "in flight", and returns that.
pub(crate) async fn claim_until_settled(store: &Store, args: ClaimArgs) -> Claim {
    within("the key to settle", async {
        loop {
            match store.claim_with(args).await.expect("claim failed") {
                Claim::InFlight(waiter) => {
                    waiter.wait(Instant::now() + POLL).await;
                }
                other => return other,
            }
        }
    })
    .await
}

/// Claims `args.key` as an owner that then vanishes without a trace but its ownership,
/// like a process that crashed or froze after claiming: it never renews and never settles.
///
/// [`Lease::abandon`] does exactly that (`std::mem::forget` would not: it skips the
/// settlement in `Drop`, but a forgotten lease still renews, or on the memory store still
/// holds its claim's liveness, so it would be a live owner, not a vanished one). The
/// ownership stays valid for checking that the stale owner, should it wake up, is fenced
/// off.
pub(crate) async fn claim_abandoned_with(store: &Store, args: ClaimArgs) -> Ownership {
    let owner = expect_owner(store.claim_with(args).await.expect("claim"));
    let owned = Ownership {
        key: args.key,
        token: owner.token(),
        fingerprint: args.fingerprint,
        lapse: args.lapse,
    };
    owner.abandon();
    owned
}

/// A claim whose lapse is taken over `grace` after the lease ran out.
pub(crate) fn releasing(key: Digest, fp: Digest, lease: Duration, grace: Duration) -> ClaimArgs {
    ClaimArgs {
        lapse: Lapse::Release { grace },
        ..ClaimArgs::new(key, fp, lease)
    }
}

/// A claim whose lapse is held as unknown for an hour.
pub(crate) fn holding(key: Digest, fp: Digest, lease: Duration) -> ClaimArgs {
    ClaimArgs {
        lapse: Lapse::Hold { ttl: LONG_TTL },
        ..ClaimArgs::new(key, fp, lease)
    }
}

/// A 502 as a failed owner's waiters get it.
pub(crate) fn failure_response() -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    StoredResponse::new(StatusCode::BAD_GATEWAY, &headers, b"the owner failed")
}
