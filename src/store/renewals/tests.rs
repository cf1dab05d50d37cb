//! The renewing task's schedule, driven by hand: `take_due` at chosen instants and
//! `answered` as a store's answer would, with no task running and no clock waited on.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::time::Instant;

use super::{Answer, HeldClaim, Renew, Renewals, Renewed};
use crate::key::Digest;
use crate::store::{Lapse, OwnerToken, StoreError};

/// Never called: nothing here runs the task.
struct Unused;

impl Renew for Unused {
    async fn renew(&self, _: &HeldClaim) -> Result<Renewed, StoreError> {
        unreachable!("no renewing task runs in these tests")
    }
}

fn claim(n: u8, lease: Duration) -> HeldClaim {
    HeldClaim {
        key: Digest([n; 32]),
        token: OwnerToken(u128::from(n)),
        fingerprint: Digest::NONE,
        lease,
        lapse: Lapse::Hold {
            ttl: Duration::from_secs(60),
        },
    }
}

/// Whether the task has been told to wake (a permit is stored), consuming it.
fn woken(renewals: &Renewals) -> bool {
    renewals.sooner.notified().now_or_never().is_some()
}

/// Held outside a runtime, so no task is spawned and these tests play its part.
fn held(renewals: &Arc<Renewals>, claim: HeldClaim) -> super::Renewal {
    let renewal = renewals.hold(&Arc::new(Unused), claim, Instant::now());
    assert!(woken(renewals), "a first claim wakes the task");
    renewal
}

#[test]
fn a_renewal_still_out_sets_no_wake_up_in_the_past() {
    let renewals = Arc::new(Renewals::default());
    let lease = Duration::from_millis(300);
    let _renewal = held(&renewals, claim(1, lease));
    let sent_at = Instant::now() + lease;
    let (due, _) = renewals.take_due(sent_at);
    assert_eq!(due.len(), 1, "the claim is due a lease after it was held");
    // Its renewal is still out a whole lease later (the store stalls): nothing is sent,
    // and the task must not be told to wake at an instant already past, which would make
    // it scan again at once, in a loop, until the renewal answers.
    let later = sent_at + lease;
    let (due, next) = renewals.take_due(later);
    assert!(due.is_empty(), "one renewal per claim at a time");
    assert!(
        next.is_none_or(|at| at > later),
        "the task would wake at once: {:?} before now",
        next.map(|at| later - at)
    );
}

#[test]
fn a_claim_due_while_its_renewal_was_out_is_renewed_once_it_answers() {
    let renewals = Arc::new(Renewals::default());
    let lease = Duration::from_millis(300);
    let renewal = held(&renewals, claim(1, lease));
    let sent_at = Instant::now() + lease;
    assert_eq!(renewals.take_due(sent_at).0.len(), 1);
    let later = sent_at + lease;
    assert!(renewals.take_due(later).0.is_empty());
    // The late answer wakes the task, which sends the overdue renewal at once.
    assert!(renewals.answered(renewal.id, Answer::Unanswered));
    assert!(woken(&renewals), "the overdue claim wakes the task");
    let (due, next) = renewals.take_due(later);
    assert_eq!(
        due.len(),
        1,
        "renewed again as soon as its renewal answered"
    );
    assert_eq!(next, None, "out again: its answer sets its wake-up");
}

#[test]
fn a_renewal_out_leaves_the_other_claims_schedule_alone() {
    let renewals = Arc::new(Renewals::default());
    let (short, long) = (Duration::from_millis(300), Duration::from_secs(30));
    let _slow = held(&renewals, claim(1, short));
    let _other = renewals.hold(&Arc::new(Unused), claim(2, long), Instant::now());
    let start = Instant::now();
    let sent_at = start + short;
    assert_eq!(renewals.take_due(sent_at).0.len(), 1);
    let later = sent_at + short;
    let (due, next) = renewals.take_due(later);
    assert!(due.is_empty());
    let next = next.expect("the other claim is still held");
    assert!(
        next > later,
        "woken for the other claim only, when it is due"
    );
    assert!(
        next <= start + long,
        "the other claim is due within its period"
    );
}

#[test]
fn renewals_answered_before_they_are_due_wake_the_task_once() {
    let renewals = Arc::new(Renewals::default());
    let lease = Duration::from_millis(300);
    let (a, b) = (
        held(&renewals, claim(1, lease)),
        held(&renewals, claim(2, lease)),
    );
    let sent_at = Instant::now() + lease;
    assert_eq!(
        renewals.take_due(sent_at).0.len(),
        2,
        "both sent in one scan"
    );
    // The first answer wakes the task to plan the claim's next renewal; the second, due
    // at the same time, finds that planned already.
    assert!(renewals.answered(a.id, Answer::Renewable));
    assert!(woken(&renewals));
    let (due, next) = renewals.take_due(sent_at);
    assert!(due.is_empty());
    assert!(next.is_some_and(|at| at > sent_at));
    assert!(renewals.answered(b.id, Answer::Renewable));
    assert!(
        !woken(&renewals),
        "no scan for a claim due no sooner than planned"
    );
}
