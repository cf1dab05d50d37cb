//! Until when a failed settlement is made again; what an armed lease dropped unsettled
//! makes.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::StatusCode;

use super::{RetryEnds, SETTLE_RETRY_FIRST, SETTLE_RETRY_MAX};
use crate::key::Digest;
use crate::store::{
    Claim, ClaimArgs, ClaimMode, Lapse, MemoryLimits, MemoryStore, Settlement, Store,
    StoredResponse,
};

const LEASE: Duration = Duration::from_secs(30);
const SPAN: Duration = Duration::from_secs(60);
const SEC: Duration = Duration::from_secs(1);

/// The last renewal whose answer came back was sent 25 s before the settlement failed;
/// later ones timed out in the client, and may have landed all the same.
#[test]
fn a_settlement_is_tried_a_lease_after_it_first_failed_though_renewals_went_unanswered() {
    let renewed = Instant::now();
    let failed = renewed + 25 * SEC;
    let ends = RetryEnds::new(failed, renewed, LEASE, SPAN);
    assert_eq!(
        ends.lapses,
        renewed + LEASE,
        "paced by the last renewal that landed"
    );
    assert_eq!(ends.ends, renewed + LEASE + SPAN);
    assert_eq!(
        ends.gives_up,
        failed + LEASE + SPAN,
        "a renewal sent up to the failure may have kept the record"
    );
}

/// The store may have been out of reach long before the answer came (no renewal landed
/// for most of a lease): the record ends a lease after the last that did, not after the
/// failure, and is given up no sooner.
#[test]
fn a_settlement_is_given_up_no_sooner_than_a_lease_after_the_last_renewal_that_landed() {
    let failed = Instant::now();
    let ends = RetryEnds::new(failed, failed, LEASE, SPAN);
    assert_eq!(ends.gives_up, failed + LEASE + SPAN);
    assert_eq!(ends.ends, ends.gives_up);
}

#[test]
fn pauses_are_short_while_the_lease_runs_and_end_before_the_record_does() {
    let renewed = Instant::now();
    let failed = renewed + 25 * SEC;
    let ends = RetryEnds::new(failed, renewed, LEASE, SPAN);
    let long = 100 * SEC;
    assert_eq!(ends.next_pause(long, renewed + 26 * SEC), SETTLE_RETRY_MAX);
    // Lapsed: past SETTLE_RETRY_MAX, a quarter of the 59 s left.
    assert_eq!(ends.next_pause(long, renewed + 31 * SEC), 59 * SEC / 4);
    // 8 s left to the record's end: at most 2 s.
    assert_eq!(ends.next_pause(long, ends.ends - 8 * SEC), 2 * SEC);
    // Past it (toward giving up, 25 s later) the pause grows again, not stuck at the
    // first one.
    assert_eq!(ends.next_pause(long, ends.ends + SEC), 6 * SEC);
    assert_eq!(ends.next_pause(long, ends.gives_up - SEC), SEC / 4);
    assert_eq!(ends.next_pause(long, ends.gives_up), SETTLE_RETRY_FIRST);
}

/// An owner with its answer in hand arms its lease, then is dropped (at its background
/// bound) before it wrote it, its request gone out: the answer is made in the background,
/// where an unarmed lease would hold the key as an unknown outcome.
#[tokio::test]
async fn an_armed_lease_dropped_before_it_settled_makes_its_answer() {
    let store = Store::Memory(Arc::new(MemoryStore::new(MemoryLimits::default())));
    let fingerprint = Digest([1; 32]);
    let hour = Duration::from_secs(3600);
    let args = ClaimArgs {
        lapse: Lapse::Hold { ttl: hour },
        ..ClaimArgs::new(Digest([0x7a; 32]), fingerprint, LEASE)
    };
    let Ok(Claim::Owner(mut lease)) = store.claim_with(args).await else {
        panic!("a fresh key is owned");
    };
    lease.mark_sent();
    let response = StoredResponse::new(StatusCode::CREATED, &Default::default(), b"made")
        .with_fingerprint(fingerprint);
    let armed = lease.armed(Settlement::Done {
        response,
        ttl: hour,
    });
    // Its settle future dropped before its first poll, as an owner's is while it waits on
    // other writes.
    drop(armed.settle());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.claim_with(args).await.expect("claim") {
            Claim::Done(stored) => break assert_eq!(&stored.body()[..], b"made"),
            Claim::InFlight(_) => {}
            other => panic!("the armed answer was not made: {}", other.as_str()),
        }
        assert!(Instant::now() < deadline, "hang guard");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A token handed back by a settlement made in the background (its owner dropped before
/// it wrote it, as one whose first write failed is made again) goes back to issued no
/// longer than its expiry as issued: what is left of that expiry is taken when the
/// record is written, [`SETTLE_RETRY_FIRST`] after the settlement was made here.
#[tokio::test]
async fn a_token_handed_back_late_keeps_the_expiry_it_was_issued_with() {
    let store = Store::Memory(Arc::new(MemoryStore::new(MemoryLimits::default())));
    let key = Digest([0x7b; 32]);
    store.issue(key, Duration::from_secs(3600)).await.unwrap();
    // Short, so rounding a handed-back token's span down (under 17 ms here) cannot hide
    // the retry's delay.
    let expiry = SystemTime::now() + Duration::from_millis(500);
    let args = ClaimArgs {
        mode: ClaimMode::IssuedOnly,
        reissue: Some(expiry),
        ..ClaimArgs::new(key, Digest::NONE, LEASE)
    };
    let Ok(Claim::Owner(lease)) = store.claim_with(args).await else {
        panic!("an issued token is owned");
    };
    let reissue = lease.reissue();
    drop(lease.armed(Settlement::Release { reissue }));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.inspect(key).await.unwrap() {
            Some(info) if info.state == "in_flight" => {}
            Some(info) => {
                assert_eq!(info.state, "issued");
                // The memory store's clock against the wall's: a millisecond or two.
                let over = info.expires.duration_since(expiry).unwrap_or_default();
                assert!(
                    over < Duration::from_millis(10),
                    "issued {over:?} past its expiry"
                );
                break;
            }
            // Written after the expiry had passed: no token to give back.
            None => break,
        }
        assert!(Instant::now() < deadline, "hang guard");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
