//! rev-twice reproducers: paths where a request may run upstream a second time, or an
//! outcome is lost.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idemgate::key::Digest;
use idemgate::store::{
    CallerTag, Claim, ClaimArgs, ClaimMode, MemoryLimits, MemoryStore, Store, StoreError,
};

fn key(n: u8) -> Digest {
    Digest([n; 32])
}

/// Memory store with `caller_share`: a caller at its share that uses its one-time token
/// gets 429 (CallerFull), but the claim removed the issued token before it checked the
/// share, so once the caller has room again its token is gone: the retry is "token
/// invalid" although nothing ever ran under it.
#[tokio::test]
async fn a_token_used_over_the_callers_share_is_lost() {
    let store = Store::Memory(Arc::new(MemoryStore::new(MemoryLimits {
        max_entries: 10,
        caller_share: 30,
        ..MemoryLimits::default()
    })));
    let caller = CallerTag(7);
    let args = |k: Digest, mode| ClaimArgs {
        mode,
        caller,
        ..ClaimArgs::new(k, Digest::NONE, Duration::from_secs(30))
    };
    let mut leases = Vec::new();
    for n in 1..=3 {
        match store
            .claim_with(args(key(n), ClaimMode::Any))
            .await
            .unwrap()
        {
            Claim::Owner(lease) => leases.push(lease),
            other => panic!("{}", other.as_str()),
        }
    }
    let token = key(99);
    store.issue(token, Duration::from_secs(300)).await.unwrap();
    assert!(matches!(
        store.claim_with(args(token, ClaimMode::IssuedOnly)).await,
        Err(StoreError::CallerFull)
    ));
    for lease in leases {
        assert!(lease.release().await.unwrap());
    }
    let retry = store
        .claim_with(args(token, ClaimMode::IssuedOnly))
        .await
        .unwrap();
    assert!(
        matches!(retry, Claim::Owner(_)),
        "the token is gone after a refused claim: {}",
        retry.as_str()
    );
}
