//! rev-twice reproducers: paths where a request may run upstream a second time, or an
//! outcome is lost.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::{post, start_proxy, start_upstream};
use http::StatusCode;
use idemgate::key::Digest;
use idemgate::store::{
    CallerTag, Claim, ClaimArgs, ClaimMode, MemoryLimits, MemoryStore, Store, StoreError,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct HeldReplies {
    addr: SocketAddr,
    hold: tokio::sync::watch::Sender<bool>,
    received: Arc<AtomicUsize>,
}

async fn relay_to(port: u16) -> HeldReplies {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (hold, held) = tokio::sync::watch::channel(false);
    let received = Arc::<AtomicUsize>::default();
    let counted = Arc::clone(&received);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                continue;
            };
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
            });
            let mut held = held.clone();
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match from_server.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    counted.fetch_add(n, Ordering::SeqCst);
                    if held.wait_for(|hold| !*hold).await.is_err()
                        || to_client.write_all(&buf[..n]).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    HeldReplies {
        addr,
        hold,
        received,
    }
}

/// `on_store_error: fail_open`: a duplicate that already found the key in flight (it is
/// parked waiting on the owner) re-checks the key while the store has a hiccup, and is
/// forwarded unprotected: the upstream runs the request a second time while the first is
/// still running. The proxy knew it was a duplicate of a running request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_is_forwarded_on_a_store_hiccup_with_fail_open() {
    let redis = RedisServer::start();
    let relay = relay_to(redis.port).await;
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  redis: {{ url: \"redis://{}\", timeout: 200ms }}\nroutes:\n  - name: orders\n    match: {{ methods: [POST], path: /orders }}\n    key: {{ header: Idempotency-Key, required: true }}\n    on_store_error: fail_open\n    wait_timeout: 30s\n",
        relay.addr
    );
    let proxy = start_proxy(upstream.addr, &config).await;
    let warm = post(proxy.addr, "/orders", &[("idempotency-key", "warm")], "{}").await;
    assert_eq!(warm.status, StatusCode::CREATED);

    let addr = proxy.addr;
    let headers = [("idempotency-key", "pay"), ("x-test-gate", "pay")];
    let owner = tokio::spawn(async move { post(addr, "/orders", &headers, "{}").await });
    upstream.arrived("pay", 1).await;
    let duplicate = tokio::spawn(async move { post(addr, "/orders", &headers, "{}").await });
    proxy.metric_reaches("idemgate_waiting", 1.0).await;
    // A store hiccup while the duplicate waits: its next look (within a second) fails.
    let before = relay.received.load(Ordering::SeqCst);
    relay.hold.send_replace(true);
    let _ = before;
    // The duplicate reaches the upstream: it arrives at the same gate.
    tokio::time::timeout(Duration::from_secs(10), upstream.arrived("pay", 2))
        .await
        .expect("the waiting duplicate was not forwarded (good)");
    relay.hold.send_replace(false);
    upstream.open("pay");
    let owner = owner.await.unwrap();
    let duplicate = duplicate.await.unwrap();
    assert_eq!(owner.status, StatusCode::CREATED);
    assert_eq!(duplicate.status, StatusCode::CREATED);
    assert_eq!(
        upstream.executed_for("pay"),
        1,
        "a duplicate known to be in flight ran upstream a second time"
    );
}

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
        match store.claim_with(args(key(n), ClaimMode::Any)).await.unwrap() {
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
