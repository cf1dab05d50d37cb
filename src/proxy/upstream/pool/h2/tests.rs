//! The HTTP/2 pool against real upstreams on `127.0.0.1:0`: streams share one connection,
//! the server's stream limit opens another, the cap holds, idle connections close, an
//! ended one is dropped, and a server that answers the preface with no SETTINGS is refused.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use http::Request;
use tokio::net::TcpListener;

use super::*;

/// The longest a test waits for something that should happen at once.
const HANG: Duration = Duration::from_secs(10);

/// An HTTP/2 server (h2 itself) allowing `streams` concurrent streams, answering each
/// request 200 only once `release` is notified; counts connections.
struct Upstream {
    port: u16,
    connections: Arc<AtomicUsize>,
    release: Arc<tokio::sync::Semaphore>,
}

impl Upstream {
    async fn start(streams: u32) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let (count, gate) = (Arc::clone(&connections), Arc::clone(&release));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, SeqCst);
                let gate = Arc::clone(&gate);
                tokio::spawn(async move {
                    let mut conn = h2::server::Builder::new()
                        .max_concurrent_streams(streams)
                        .handshake::<_, bytes::Bytes>(stream)
                        .await
                        .unwrap();
                    while let Some(Ok((_req, mut respond))) = conn.accept().await {
                        let gate = Arc::clone(&gate);
                        tokio::spawn(async move {
                            gate.acquire().await.unwrap().forget();
                            let answer = http::Response::new(());
                            let _ = respond.send_response(answer, true);
                        });
                    }
                });
            }
        });
        Self {
            port,
            connections,
            release,
        }
    }
}

fn pool(port: u16, max: usize, idle: Duration) -> Arc<Pool> {
    let connector = Connector::new("127.0.0.1", port, None, true);
    Arc::new(Pool::new(connector, max, idle, Arc::new(Metrics::new())))
}

fn request() -> Request<ProxyBody> {
    Request::builder()
        .uri("http://127.0.0.1/")
        .body(ProxyBody::empty())
        .unwrap()
}

async fn within<F: std::future::Future>(f: F, what: &str) -> F::Output {
    tokio::time::timeout(HANG, f)
        .await
        .unwrap_or_else(|_| panic!("hang guard: {what}"))
}

#[tokio::test]
async fn streams_share_one_connection_until_the_server_limit_then_a_second_opens() {
    let upstream = Upstream::start(2).await;
    let pool = pool(upstream.port, 8, Duration::from_secs(3600));
    let mut held = Vec::new();
    for _ in 0..2 {
        let stream = within(pool.checkout(), "a checkout").await.unwrap();
        let answer = tokio::spawn(stream.sender().send_request(request()));
        held.push((stream, answer));
    }
    assert_eq!(upstream.connections.load(SeqCst), 1);
    // The server's SETTINGS (2 streams) arrived before the first was handed out.
    let third = within(pool.checkout(), "a checkout").await.unwrap();
    assert!(!third.reused, "a new connection for the third stream");
    assert_eq!(upstream.connections.load(SeqCst), 2);
    upstream.release.add_permits(2);
    for (stream, answer) in held {
        let answer = within(answer, "an answer").await.unwrap().unwrap();
        assert_eq!(answer.status(), 200);
        drop(stream);
    }
    drop(third);
    // Room again on the first: reused, nothing new dialed.
    let again = within(pool.checkout(), "a checkout").await.unwrap();
    assert!(again.reused);
    assert_eq!(upstream.connections.load(SeqCst), 2);
}

/// At the cap, a stream past the server's limit waits in the pool (nothing handed to
/// hyper, which would send it whenever room frees, given up or not) until one ends.
#[tokio::test]
async fn at_the_cap_a_stream_waits_for_one_to_end() {
    let upstream = Upstream::start(1).await;
    let pool = pool(upstream.port, 1, Duration::from_secs(3600));
    let first = within(pool.checkout(), "a checkout").await.unwrap();
    let mut second = Box::pin(pool.checkout());
    let polled = std::future::poll_fn(|cx| Poll::Ready(second.as_mut().poll(cx))).await;
    assert!(polled.is_pending(), "no room: it waits");
    assert_eq!(pool.metrics.connections().upstream_waited.get(), 1);
    let conn = Arc::clone(&first.conn);
    drop(first);
    let second = within(second, "the waiting checkout").await.unwrap();
    assert!(second.reused, "the one connection, once its stream ended");
    assert_eq!(upstream.connections.load(SeqCst), 1);
    assert!(Arc::ptr_eq(&conn, &second.conn));
}

#[tokio::test(start_paused = true)]
async fn a_connection_without_streams_closes_after_the_idle_timeout() {
    let upstream = Upstream::start(100).await;
    let idle = Duration::from_secs(1);
    let pool = pool(upstream.port, 8, idle);
    let stream = within(pool.checkout(), "a checkout").await.unwrap();
    let sender = stream.sender();
    drop(stream);
    tokio::time::sleep(idle * 2).await;
    // The sweep dropped it from the pool, and with it the connection's task.
    within(
        async {
            while !sender.is_closed() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
        "the idle connection to close",
    )
    .await;
    assert!(crate::sync::lock(&pool.conns).is_empty());
    let next = within(pool.checkout(), "a checkout").await.unwrap();
    assert!(!next.reused);
    assert_eq!(upstream.connections.load(SeqCst), 2);
}

/// A connection the server ended (GOAWAY, then the socket closed) is dropped from the
/// pool, and the next stream goes on a new one.
#[tokio::test]
async fn a_connection_whose_task_ended_is_not_handed_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let first = count.fetch_add(1, SeqCst) == 0;
            tokio::spawn(async move {
                let mut conn = h2::server::handshake(stream).await.unwrap();
                if first {
                    conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                }
                while let Some(Ok(_)) = conn.accept().await {}
            });
        }
    });
    let pool = pool(port, 8, Duration::from_secs(3600));
    // The server's SETTINGS come before its GOAWAY: the dial succeeds.
    let stream = within(pool.checkout(), "a checkout").await.unwrap();
    let sender = stream.sender();
    drop(stream);
    within(
        async {
            while !sender.is_closed() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
        "the ended connection's task to end",
    )
    .await;
    let next = within(pool.checkout(), "a checkout").await.unwrap();
    assert!(!next.reused, "a new connection");
    assert_eq!(connections.load(SeqCst), 2);
    assert_eq!(
        crate::sync::lock(&pool.conns).len(),
        1,
        "the ended one dropped"
    );
}

#[tokio::test]
async fn a_server_that_sends_no_settings_fails_the_dial() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = [0; 1024];
            let _ = stream.read(&mut buf).await;
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let pool = pool(port, 8, Duration::from_secs(3600));
    let failed = within(pool.checkout(), "a checkout").await;
    assert!(
        matches!(failed, Err(ProxyError::UpstreamUnreachable(_))),
        "{failed:?}"
    );
    // Its slot comes back: the cap is not leaked by failed dials.
    within(
        async {
            while pool.slots.available_permits() < 8 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
        "the failed connection's slot",
    )
    .await;
}
