//! Kept-alive upstream connections: reused by sequential requests, never used once the
//! upstream closed them while idle, and closed by the proxy before the upstream's
//! keep-alive timeout so requests take new ones.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

use crate::common::{post, start_proxy};
use crate::{raw_upstream, read_request, KEEP_IDLE, OK, ROUTES};

#[tokio::test]
async fn sequential_requests_share_one_kept_alive_upstream_connection() {
    let (upstream, seen, _) = raw_upstream(false, Arc::default()).await;
    let proxy = start_proxy(upstream, &format!("{KEEP_IDLE}{ROUTES}")).await;
    for i in 0..10 {
        let key = format!("reuse-{i}");
        let protected = post(
            proxy.addr,
            &format!("/orders/{i}?x=1"),
            &[("idempotency-key", &key)],
            "{}",
        )
        .await;
        assert_eq!(protected.status, 201);
        let plain = post(proxy.addr, &format!("/plain/{i}"), &[], "{}").await;
        assert_eq!(plain.status, 201);
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.requests.len(), 20);
    assert_eq!(
        seen.connections, 1,
        "every request reused the first connection"
    );
    // Origin form, as an HTTP/1.1 origin server expects; never the absolute form.
    assert_eq!(seen.requests[0].0, "POST /orders/0?x=1 HTTP/1.1");
    assert_eq!(seen.requests[1].0, "POST /plain/0 HTTP/1.1");
}

#[tokio::test]
async fn a_connection_the_upstream_closed_while_idle_is_not_used() {
    let close = Arc::new(Notify::new());
    let (upstream, seen, mut closed) = raw_upstream(true, Arc::clone(&close)).await;
    let proxy = start_proxy(upstream, ROUTES).await;
    for i in 0..6 {
        let answer = if i % 2 == 0 {
            let key = format!("closed-{i}");
            post(
                proxy.addr,
                &format!("/orders/{i}"),
                &[("idempotency-key", &key)],
                "{}",
            )
            .await
        } else {
            post(proxy.addr, &format!("/plain/{i}"), &[], "{}").await
        };
        assert_eq!(answer.status, 201, "request {i}: {:?}", answer.body);
        // The upstream closes the connection only now, after the proxy took it back into
        // its pool; the next request goes out once it is closed, so the pool holds a dead
        // connection when it comes.
        close.notify_one();
        closed.recv().await.unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.requests.len(),
        6,
        "each request reached the upstream once"
    );
    assert_eq!(seen.connections, 6);
}

/// How an idle stretch of a connection to [`keep_alive_upstream`] ended, with the number of
/// the connection (from 0, in the order accepted).
#[derive(Debug, PartialEq)]
enum IdleEnd {
    /// The proxy closed it.
    ClosedByProxy(usize),
    /// The upstream's keep-alive timeout ran out first and the upstream closed it.
    TimedOut(usize),
}

/// A raw HTTP/1.1 upstream with a keep-alive timeout, as app servers have: it answers
/// `201 {"ok":true}` without a `Connection` field and closes a connection that sends no
/// request for `keep_alive`. Reports how each connection ended, and records the number of
/// the connection each request came on, with its request line.
async fn keep_alive_upstream(
    keep_alive: Duration,
) -> (
    SocketAddr,
    Arc<Mutex<Vec<(usize, String)>>>,
    mpsc::UnboundedReceiver<IdleEnd>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
    let (ends_tx, ends) = mpsc::unbounded_channel();
    let record = Arc::clone(&requests);
    tokio::spawn(async move {
        let mut accepted = 0;
        while let Ok((stream, _)) = listener.accept().await {
            let connection = accepted;
            accepted += 1;
            let record = Arc::clone(&record);
            let ends_tx = ends_tx.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                loop {
                    match tokio::time::timeout(keep_alive, read_request(&mut read)).await {
                        Ok(Some((line, _))) => {
                            record.lock().unwrap().push((connection, line));
                            write.write_all(OK).await.unwrap();
                        }
                        Ok(None) => {
                            let _ = ends_tx.send(IdleEnd::ClosedByProxy(connection));
                            return;
                        }
                        Err(_) => {
                            let _ = write.shutdown().await;
                            let _ = ends_tx.send(IdleEnd::TimedOut(connection));
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, requests, ends)
}

/// The next connection end [`keep_alive_upstream`] reports.
async fn next_end(ends: &mut mpsc::UnboundedReceiver<IdleEnd>) -> IdleEnd {
    tokio::time::timeout(Duration::from_secs(10), ends.recv())
        .await
        .expect("hang guard: no connection ended")
        .unwrap()
}

/// An upstream that closes idle connections itself races the proxy's next request on one:
/// a request written as the close comes fails after it went out, which the proxy cannot
/// tell from one the upstream read, so a protected key is held as outcome-unknown (its
/// retries answered 409) and an unprotected request is a 502. With
/// `connections.upstream_idle_timeout` below the upstream's keep-alive timeout, the proxy
/// closes the idle connection first and the next request goes out on a new one.
///
/// The upstream's keep-alive is gunicorn's 2 s, the proxy's idle timeout 100 ms. Each next
/// request is sent once the upstream saw the proxy close the idle connection (an idle time
/// past the proxy's timeout and within the upstream's), so no sleep decides anything: the
/// 2 s only bound how long a failing run takes.
#[tokio::test]
async fn idle_connections_close_before_the_upstreams_keep_alive_so_requests_take_new_ones() {
    let (upstream, requests, mut ends) = keep_alive_upstream(Duration::from_secs(2)).await;
    let routes = format!("connections: {{ upstream_idle_timeout: 100ms }}\n{ROUTES}");
    let proxy = start_proxy(upstream, &routes).await;

    let first = post(
        proxy.addr,
        "/orders/1",
        &[("idempotency-key", "idle-1")],
        "{}",
    )
    .await;
    assert_eq!(first.status, 201, "{:?}", first.body);
    assert_eq!(next_end(&mut ends).await, IdleEnd::ClosedByProxy(0));

    let second = post(
        proxy.addr,
        "/orders/2",
        &[("idempotency-key", "idle-2")],
        "{}",
    )
    .await;
    assert_eq!(second.status, 201, "{:?}", second.body);
    assert_eq!(next_end(&mut ends).await, IdleEnd::ClosedByProxy(1));

    let plain = post(proxy.addr, "/plain/3", &[], "{}").await;
    assert_eq!(plain.status, 201, "{:?}", plain.body);

    // Each request executed once, each on a connection of its own.
    assert_eq!(
        *requests.lock().unwrap(),
        [
            (0, "POST /orders/1 HTTP/1.1".to_owned()),
            (1, "POST /orders/2 HTTP/1.1".to_owned()),
            (2, "POST /plain/3 HTTP/1.1".to_owned()),
        ]
    );
    // The keys were completed with their answers, not held as outcome-unknown.
    let again = post(
        proxy.addr,
        "/orders/1",
        &[("idempotency-key", "idle-1")],
        "{}",
    )
    .await;
    assert_eq!(again.status, 201, "{:?}", again.body);
    assert!(again.replayed());
    assert_eq!(requests.lock().unwrap().len(), 3);
}
