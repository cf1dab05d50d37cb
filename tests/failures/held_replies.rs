//! A proxy on Redis through a TCP relay that can hold, drop or cut Redis's replies, and
//! the helpers the store-failure tests share: records in Redis by kind, a warm-up request,
//! an owner held at the upstream's gate.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::redis_server::RedisServer;
use crate::common::{self, post, start_proxy, start_upstream, ProxyHandle};

/// A TCP relay to a Redis server whose replies can be held back: what the proxy sends
/// reaches Redis at once, what Redis answers waits while `hold` is set.
pub(crate) struct HeldReplies {
    pub(crate) addr: SocketAddr,
    pub(crate) hold: Arc<tokio::sync::watch::Sender<bool>>,
    /// Set: the next reply read from Redis goes through, and every one after it is held.
    pub(crate) hold_after_next: Arc<AtomicBool>,
    /// Set: the next reply read from Redis is dropped with its connection (the command
    /// ran, the proxy never hears so).
    pub(crate) drop_next: Arc<AtomicBool>,
    /// Set: Redis is cut off; a command sent through the relay is dropped with its
    /// connection (it never runs).
    pub(crate) cut: Arc<AtomicBool>,
    /// Bytes of replies the relay has read from Redis (held back or not): once a command
    /// sent through it has a reply here, Redis has run it.
    pub(crate) received: Arc<AtomicUsize>,
}

impl HeldReplies {
    pub(crate) fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

pub(crate) async fn relay_to(port: u16) -> HeldReplies {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (hold, held) = tokio::sync::watch::channel(false);
    let hold = Arc::new(hold);
    let hold_after_next = Arc::<AtomicBool>::default();
    let drop_next = Arc::<AtomicBool>::default();
    let received = Arc::<AtomicUsize>::default();
    let counted = Arc::clone(&received);
    let (holding, then_hold) = (Arc::clone(&hold), Arc::clone(&hold_after_next));
    let dropping = Arc::clone(&drop_next);
    let cut = Arc::<AtomicBool>::default();
    let cutting = Arc::clone(&cut);
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            // Redis is gone once a test ends; the proxy may still try to reconnect.
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                continue;
            };
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            let cutting = Arc::clone(&cutting);
            // Returning drops both halves: Redis sees the connection end, and so does the
            // proxy once Redis has closed it.
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match from_client.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    if cutting.load(Ordering::SeqCst)
                        || to_server.write_all(&buf[..n]).await.is_err()
                    {
                        return;
                    }
                }
            });
            let mut held = held.clone();
            let counted = Arc::clone(&counted);
            let (holding, then_hold) = (Arc::clone(&holding), Arc::clone(&then_hold));
            let dropping = Arc::clone(&dropping);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match from_server.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    counted.fetch_add(n, Ordering::SeqCst);
                    // Returning drops the reply and closes the proxy's side.
                    if dropping.swap(false, Ordering::SeqCst) {
                        return;
                    }
                    if held.wait_for(|hold| !*hold).await.is_err() {
                        return;
                    }
                    // Held before this reply is passed on: whatever the proxy sends in
                    // answer to it gets its reply held.
                    if then_hold.swap(false, Ordering::SeqCst) {
                        holding.send_replace(true);
                    }
                    if to_client.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    HeldReplies {
        addr,
        hold,
        hold_after_next,
        drop_next,
        cut,
        received,
    }
}

/// Waits until `condition` holds (a hang guard of 30 s, never a timing assertion).
pub(crate) async fn until(mut condition: impl FnMut() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The first byte of each idemgate record in Redis (its kind: `I` in flight, `D` done, `T`
/// an issued token…), the rate-limit counters left out.
pub(crate) fn record_kinds(redis: &RedisServer) -> Vec<String> {
    let keys = redis.cli(&["KEYS", "*"]);
    let mut kinds: Vec<String> = keys
        .lines()
        .filter(|key| !key.is_empty() && !key.contains("rate:"))
        .map(|key| redis.cli(&["GETRANGE", key, "0", "0"]).trim().to_owned())
        .collect();
    kinds.sort();
    kinds
}

/// A proxy on Redis through a relay whose replies can be held, with `routes`.
pub(crate) async fn behind_held_replies(
    routes: &str,
) -> (RedisServer, HeldReplies, common::Upstream, ProxyHandle) {
    let redis = RedisServer::start();
    let relay = relay_to(redis.port).await;
    let upstream = start_upstream().await;
    // The store timeout is a hang guard here: the claim must outlast the held reply.
    let config = format!(
        "store:\n  redis: {{ url: \"redis://{}\", timeout: 30s }}\n{routes}",
        relay.addr
    );
    let proxy = start_proxy(upstream.addr, &config).await;
    (redis, relay, upstream, proxy)
}

/// A proxy on Redis through a relay whose replies can be held, with a store `timeout` of
/// 200 ms (`routes` after the store section), its connection to Redis opened by one
/// request with `warm`'s headers.
pub(crate) async fn timing_out_behind_held_replies(
    routes: &str,
) -> (RedisServer, HeldReplies, common::Upstream, ProxyHandle) {
    let redis = RedisServer::start();
    let relay = relay_to(redis.port).await;
    let upstream = start_upstream().await;
    let config = format!(
        "store:\n  redis: {{ url: \"redis://{}\", timeout: 200ms }}\n{routes}",
        relay.addr
    );
    let proxy = start_proxy(upstream.addr, &config).await;
    (redis, relay, upstream, proxy)
}

/// An owner held at the upstream's gate `pay` ([`owner_at_gate`]), and any duplicate of it.
pub(crate) const PAY: [(&str, &str); 2] = [("idempotency-key", "pay"), ("x-test-gate", "pay")];

/// The proxy's first request, so its connection to Redis is open (and, on Redis, how it
/// swaps is known) before replies are held or dropped.
pub(crate) async fn warm_up(proxy: &ProxyHandle) {
    let warm = post(proxy.addr, "/orders", &[("idempotency-key", "warm")], "{}").await;
    assert_eq!(warm.status, StatusCode::CREATED);
}

/// An owner of key `pay`, once the upstream holds it at its gate.
pub(crate) async fn owner_at_gate(
    proxy: &ProxyHandle,
    upstream: &common::Upstream,
) -> tokio::task::JoinHandle<common::Answer> {
    let addr = proxy.addr;
    let owner = tokio::spawn(async move { post(addr, "/orders", &PAY, "{}").await });
    upstream.arrived("pay", 1).await;
    owner
}
