//! A renewal that reaches the database only after its owner settled (its connection's
//! packets delayed past the store timeout, while the settlement went out on another
//! connection) finds the record gone and writes the claim back: the owner is done, and the
//! key would be held in flight, then as an unknown outcome, for a request that never went
//! out. The owner, whose renewal went unanswered, makes its settlement again.

use std::time::{Duration, Instant};

use idemgate::key::Digest;
use idemgate::store::{Claim, ClaimArgs, PostgresStore, SqlSettings, Store};

use crate::common::postgres_server::PostgresServer;
use crate::common::relay::relay_to;
use crate::until;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_renewal_that_lands_after_its_owner_released_the_key_leaves_it_free() {
    let db = PostgresServer::start();
    let relay = relay_to(db.port).await;
    let settings = SqlSettings {
        timeout: Duration::from_millis(300),
        // No reaper statement mixes with the held renewal's answer.
        reap_every: Duration::from_secs(3600),
        ..SqlSettings::new(format!(
            "postgres://idemgate@127.0.0.1:{}/postgres",
            relay.addr.port()
        ))
    };
    let store = Store::Postgres(PostgresStore::connect(&settings).expect("store"));
    assert!(store.ready().await, "the database answers");
    let key = Digest([0x52; 32]);
    // Renewed every second.
    let args = ClaimArgs::new(key, Digest([1; 32]), Duration::from_secs(3));
    let Claim::Owner(lease) = store.claim_with(args).await.expect("claim") else {
        panic!("a fresh key is owned");
    };
    // The next renewal's execution (the next statement sent) is held on its connection.
    relay.hold_next_sender(b'B');
    until(|| relay.requests_held() > 0, "a renewal to be held").await;
    // Its answer does not come within the store timeout; the owner, whose request never
    // went out, then releases the key (on another connection).
    assert!(lease.release().await.expect("released"));
    assert!(store.inspect(key).await.expect("inspect").is_none());
    // The held renewal reaches the database now; its answer comes back through the relay,
    // on its own connection, once it has committed (an answer on any other connection
    // would not say it ran: the key could still be written back after the check below).
    relay.release_held_sender();
    until(|| relay.held_replies() > 0, "the held renewal to run").await;
    // Written back, the claim would hold the key in flight, then as an unknown outcome for
    // a day. The owner makes its release again until its lease has passed (3 s after the
    // release, long after the held renewal landed): the key is free again.
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Some(info) = store.inspect(key).await.expect("inspect") {
        assert!(
            Instant::now() < deadline,
            "a renewal that landed after the release wrote the claim back for good: {}",
            info.state
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    match store.claim_with(args).await.expect("claim") {
        Claim::Owner(lease) => assert!(lease.release().await.expect("released")),
        other => panic!("the released key is not free: {}", other.as_str()),
    }
}
