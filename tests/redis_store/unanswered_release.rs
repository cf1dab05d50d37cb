//! The release of a claim whose answer never came (the store timed out) never touches a
//! later owner's record.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use idemgate::key::Digest;
use idemgate::store::{
    Claim, ClaimArgs, Lapse, Lease, OwnerToken, RedisSettings, RedisStore, Settled, Store,
    StoredResponse,
};

use crate::common::redis_server::RedisServer;

/// A Redis store on `redis`, as the proxy makes one.
fn store_on(redis: &RedisServer) -> Store {
    let settings = RedisSettings {
        url: Some(redis.url()),
        cluster: Vec::new(),
        prefix: "t:".into(),
        timeout: Duration::from_millis(500),
        ca: None,
    };
    Store::Redis(Arc::new(
        RedisStore::connect(&settings).expect("redis store"),
    ))
}

/// Claims `args` and gives the claim up unsettled, as a claim whose answer never came
/// leaves it (no lease renews or settles it); returns its owner token.
async fn claim_unanswered(store: &Store, args: ClaimArgs) -> OwnerToken {
    let Claim::Owner(lease) = store.claim_with(args).await.expect("claim") else {
        panic!("a fresh key is owned");
    };
    let token = lease.token();
    lease.abandon();
    token
}

/// Claims `args` until the claim is owned (a lapsed claim's record must expire first).
async fn claim_until_owner(store: &Store, args: ClaimArgs) -> Lease {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Claim::Owner(lease) = store.claim_with(args).await.expect("claim") {
            return lease;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: never owned"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The release of a claim whose answer never came is fenced by that claim's token: its
/// own claim it frees, but run after the claim lapsed and another owner took the key over,
/// it leaves that owner's record as it is, with or without a token to hand back; the new
/// owner completes and its answer replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_claims_release_never_touches_a_later_owners_record() {
    let redis = RedisServer::start();
    let store = store_on(&redis);
    let fp = Digest([1; 32]);
    let lease = Duration::from_millis(200);
    let args = |key: Digest| ClaimArgs {
        lapse: Lapse::Release { grace: lease },
        ..ClaimArgs::new(key, fp, lease)
    };

    let own = Digest([2; 32]);
    let token = claim_unanswered(&store, args(own)).await;
    let released = store.release_unanswered(&args(own), token).await;
    assert_eq!(released, Some(Settled::Written), "its own claim");
    let again = claim_until_owner(&store, args(own)).await;
    assert!(again.release().await.unwrap());

    let taken = Digest([3; 32]);
    let token = claim_unanswered(&store, args(taken)).await;
    let successor = claim_until_owner(&store, args(taken)).await;
    for reissue in [
        None,
        Some(std::time::SystemTime::now() + Duration::from_secs(3600)),
    ] {
        let late = ClaimArgs {
            reissue,
            ..args(taken)
        };
        let released = store.release_unanswered(&late, token).await;
        assert_eq!(released, Some(Settled::NotWritten), "reissue {reissue:?}");
        let info = store
            .inspect(taken)
            .await
            .unwrap()
            .expect("the successor's record");
        assert_eq!(info.state, "in_flight");
    }
    let answer = StoredResponse::new(StatusCode::CREATED, &Default::default(), b"successor");
    assert!(successor
        .complete(answer, Duration::from_secs(3600))
        .await
        .unwrap());
    match store.claim_with(args(taken)).await.unwrap() {
        Claim::Done(stored) => assert_eq!(&stored.body()[..], b"successor"),
        other => panic!("the successor's key answered {}", other.as_str()),
    }
}
