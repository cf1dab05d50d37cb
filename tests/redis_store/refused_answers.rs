//! An answer larger than Redis takes in one value (`proto-max-bulk-len`): Redis answers
//! a protocol error and closes the connection, every time it is sent. The request ran, so
//! its key records "executed, answer not stored", and a repeat never runs it again.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use idemgate::key::Digest;
use idemgate::store::{Claim, ClaimArgs, Lapse, RedisSettings, RedisStore, Store, StoredResponse};

use crate::common::redis_server::RedisServer;
use crate::common::relay::relay_to;
use crate::common::{post, start_proxy, start_upstream, stored_key};
use crate::redis_yaml;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_proto_max_bulk_len_is_recorded_as_not_stored_and_never_rerun() {
    // 1 MB is the least Redis accepts.
    let redis = RedisServer::start_with(vec!["--proto-max-bulk-len".into(), "1mb".into()]);
    let upstream = start_upstream().await;
    // A claim left unrecorded would be taken over after a second: lease, then grace.
    let defaults = "max_answer: 8MiB, lease: 300ms, upstream_timeout: 700ms, \
                    background_timeout: 700ms, on_unknown_outcome: release";
    let proxy = start_proxy(upstream.addr, &redis_yaml(&redis.url(), defaults)).await;
    let big = (2usize << 20).to_string();
    let headers = [("idempotency-key", "big"), ("x-test-bytes", big.as_str())];
    let first = post(proxy.addr, "/orders", &headers, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(
        first.body.len(),
        2 << 20,
        "the client gets the whole answer"
    );
    // Settled one way or the other: recorded, or its claim gone past lease and grace, to
    // be taken over.
    let record = format!("t:{{{}}}", stored_key(&proxy, "/orders", &headers, b"{}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while redis.cli(&["GETRANGE", &record, "0", "0"]).trim() == "I" {
        assert!(std::time::Instant::now() < deadline, "hang guard");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let repeat = post(proxy.addr, "/orders", &headers, "{}").await;
    assert_eq!(
        upstream.executed_for("big"),
        1,
        "ran again: the repeat answered {}",
        repeat.status
    );
    assert_eq!(repeat.status, StatusCode::CONFLICT);
    assert_eq!(repeat.problem(), "urn:idemgate:problem:answer-not-stored");
}

/// The owner's write of such an answer fails (Redis out of reach) and is made again in the
/// background, once Redis is back: Redis refuses it there, for its length, and the key
/// records "executed, answer not stored" as it would have at once. That is the answer's
/// size meeting the server's limit, not a settlement lost: it is not counted in
/// `idemgate_store_settlements_lost_total`, which an operator alerts on. On one thread, so
/// the retry logs to the subscriber the test set: its "settled" line, logged after the
/// count, is the signal that the count is final.
#[tokio::test]
async fn an_answer_over_proto_max_bulk_len_refused_on_a_retry_is_not_counted_lost() {
    let logged = Logged::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logged.clone())
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let redis = RedisServer::start_with(vec!["--proto-max-bulk-len".into(), "1mb".into()]);
    let relay = relay_to(redis.port).await;
    let settings = RedisSettings {
        url: Some(format!("redis://{}", relay.addr)),
        cluster: Vec::new(),
        prefix: "t:".into(),
        timeout: Duration::from_millis(300),
        ca: None,
    };
    let store = Store::Redis(Arc::new(RedisStore::connect(&settings).expect("store")));
    let key = Digest([0x6a; 32]);
    let args = ClaimArgs {
        lapse: Lapse::Release {
            grace: Duration::from_secs(10),
        },
        ..ClaimArgs::new(key, Digest([1; 32]), Duration::from_secs(1))
    };
    let Claim::Owner(lease) = store.claim_with(args).await.expect("claim") else {
        panic!("a fresh key is owned");
    };
    relay.cut.store(true, Ordering::SeqCst);
    let answer = StoredResponse::new(StatusCode::CREATED, &Default::default(), &[b'x'; 2 << 20]);
    assert!(
        lease
            .complete(answer, Duration::from_secs(3600))
            .await
            .is_err(),
        "Redis is cut off"
    );
    relay.cut.store(false, Ordering::SeqCst);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !logged.text().contains("settled the claim on a retry") {
        assert!(std::time::Instant::now() < deadline, "hang guard");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let record = format!("t:{{{}}}", hex::encode(key.0));
    assert_eq!(redis.cli(&["GETRANGE", &record, "0", "0"]).trim(), "N");
    let text = logged.text();
    assert!(text.contains("answer too large for the store"), "{text}");
    assert_eq!(store.stats().settlements_lost, 0);
}

/// What the test's subscriber logged, shared with the test.
#[derive(Clone, Default)]
struct Logged(Arc<std::sync::Mutex<Vec<u8>>>);

impl Logged {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logged {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logged {
    type Writer = Self;

    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}
