//! The pool against a real HTTP/1.1 upstream on `127.0.0.1:0` that counts the connections
//! and requests it sees: reuse, idle expiry, connections that must not be reused, and the
//! cap (upgraded connections included). Requests go out as `UpstreamClient::send_untimed`
//! sends them (`ready`, `try_send_request`, a [`PooledBody`] that hands back only an
//! answer that keeps alive).

use std::future::Future;
use std::sync::atomic::Ordering::SeqCst;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;

use super::*;
use crate::proxy::upstream::test_upstream::{
    numbered, within, Dripped, Upstream, HANG, NEVER_IDLE,
};
use crate::proxy::upstream::{request, Held, UpstreamBody};

/// The idle timeout the tests of it use: the configured default, on a paused clock.
fn idle_timeout() -> Duration {
    crate::config::Connections::default().upstream_idle_timeout
}

/// `101 Switching Protocols`, after which the upstream keeps the connection open.
fn switching(_connection: usize, _request: usize) -> Vec<u8> {
    b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: test\r\n\r\n".to_vec()
}

fn pool(upstream: &Upstream, max: usize, metrics: &Arc<Metrics>) -> Arc<Pool> {
    idle_pool(upstream, max, NEVER_IDLE, metrics)
}

fn idle_pool(
    upstream: &Upstream,
    max: usize,
    idle_timeout: Duration,
    metrics: &Arc<Metrics>,
) -> Arc<Pool> {
    let connector = Connector::new("127.0.0.1", upstream.port, None, false);
    Arc::new(Pool::new(connector, max, idle_timeout, Arc::clone(metrics)))
}

/// Sends `GET /` on the checked-out connection as `UpstreamClient::send_untimed` does: the
/// answer's body hands the connection back to `pool` if the answer keeps it alive.
async fn get(pool: &Arc<Pool>, mut checkout: Checkout) -> Response<PooledBody> {
    checkout
        .conn
        .sender()
        .ready()
        .await
        .expect("a connection ready");
    let request = Request::get("/").body(ProxyBody::empty()).unwrap();
    let response = checkout
        .conn
        .sender()
        .try_send_request(request)
        .await
        .map_err(|e| e.into_error())
        .expect("an answer");
    let (head, incoming) = response.into_parts();
    let keep = request::keeps_alive(head.version, &head.headers);
    let returning = keep.then(|| Arc::clone(pool));
    let body = PooledBody::new(incoming, checkout.conn, returning, HANG);
    Response::from_parts(head, body)
}

/// Sends `GET /` and reads the whole answer body.
async fn get_all(pool: &Arc<Pool>, checkout: Checkout) -> String {
    let body = get(pool, checkout).await.into_body();
    let bytes = body.collect().await.expect("the answer body").to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Keeps a paused clock still while the runtime waits for sockets. Paused, tokio moves the
/// clock on to the next timer (the connect timeout, the pool's sweeper) whenever it has
/// nothing to run, unless a blocking task is running: this one runs until the hold is
/// dropped, or for at most [`HANG`], after which the clock moves again and [`within`]'s
/// timeouts turn a hang into a failure.
struct ClockHold {
    /// Dropped, it ends the blocking task.
    _release: std::sync::mpsc::Sender<()>,
}

fn hold_clock() -> ClockHold {
    let (release, released) = std::sync::mpsc::channel::<()>();
    tokio::task::spawn_blocking(move || released.recv_timeout(HANG));
    ClockHold { _release: release }
}

fn idle_count(pool: &Pool) -> usize {
    crate::sync::lock(&pool.idle).len()
}

/// Polls `future` once in this task, so that what it waits for wakes this task.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *future).poll(cx))).await
}

#[tokio::test]
async fn a_connection_whose_answer_was_read_to_its_end_is_reused() {
    let upstream = Upstream::start(numbered).await;
    let pool = pool(&upstream, 4, &Arc::new(Metrics::new()));

    let first = pool.checkout().await.unwrap();
    assert!(!first.reused);
    assert_eq!(get_all(&pool, first).await, "0");

    let second = pool.checkout().await.unwrap();
    assert!(second.reused);
    assert_eq!(get_all(&pool, second).await, "0");

    assert_eq!(upstream.connections(), 1);
    assert_eq!(upstream.requests(), 2);
}

/// The clock is paused and held still ([`hold_clock`]), so a connection's idle age is
/// exactly what was advanced. Guarded twice: checkout skips an expired connection, and the
/// sweeper closes it; this pins the outcome.
#[tokio::test]
async fn an_idle_connection_past_its_timeout_is_not_reused() {
    let _still = hold_clock();
    tokio::time::pause();
    let mut upstream = Upstream::start(numbered).await;
    let idle = idle_timeout();
    let pool = idle_pool(&upstream, 4, idle, &Arc::new(Metrics::new()));
    let first = pool.checkout().await.unwrap();
    assert_eq!(get_all(&pool, first).await, "0");

    // Within the timeout: reused, so what ends it below is its age.
    tokio::time::advance(idle - Duration::from_millis(1)).await;
    let second = pool.checkout().await.unwrap();
    assert!(second.reused);
    assert_eq!(get_all(&pool, second).await, "0");

    tokio::time::advance(idle + Duration::from_millis(1)).await;
    let third = pool.checkout().await.unwrap();
    assert!(!third.reused);
    assert_eq!(get_all(&pool, third).await, "1");
    assert_eq!(upstream.connections(), 2);
    // The expired connection was closed, not left open.
    assert_eq!(upstream.next_closed().await, 0);
}

/// The next checkout comes right after the drop, before hyper's task for the connection
/// runs: hyper ends a connection whose answer body was dropped too, but only later.
#[tokio::test]
async fn a_connection_with_an_answer_not_read_to_its_end_is_never_reused() {
    fn large_then_numbered(connection: usize, request: usize) -> Vec<u8> {
        if request > 0 {
            return numbered(connection, request);
        }
        let mut answer = b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n".to_vec();
        answer.extend_from_slice(&[b'x'; 1000]);
        answer
    }
    let mut upstream = Upstream::start(large_then_numbered).await;
    let pool = pool(&upstream, 4, &Arc::new(Metrics::new()));

    let first = pool.checkout().await.unwrap();
    let mut body = get(&pool, first).await.into_body();
    let frame = body.frame().await.unwrap().expect("a first frame");
    assert!(!frame.into_data().unwrap().is_empty());
    drop(body);

    let second = pool.checkout().await.unwrap();
    assert!(!second.reused);
    assert_eq!(get_all(&pool, second).await, "1");
    assert_eq!(upstream.connections(), 2);
    assert_eq!(upstream.next_closed().await, 0);
}

/// Guarded three times over: the answer is not handed back (`keeps_alive`), hyper ends the
/// connection itself once the body is read, and the pool neither keeps nor takes a closed
/// connection. This pins the outcome, which breaks only if all of them let it through.
#[tokio::test]
async fn a_connection_whose_answer_says_close_is_not_reused() {
    fn closing(connection: usize, _request: usize) -> Vec<u8> {
        let body = connection.to_string();
        format!(
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }
    let mut upstream = Upstream::start(closing).await;
    let pool = pool(&upstream, 4, &Arc::new(Metrics::new()));

    let first = pool.checkout().await.unwrap();
    assert_eq!(get_all(&pool, first).await, "0");
    let second = pool.checkout().await.unwrap();
    assert!(!second.reused);
    assert_eq!(get_all(&pool, second).await, "1");
    assert_eq!(upstream.connections(), 2);
    assert_eq!(upstream.next_closed().await, 0);
}

#[tokio::test]
async fn a_checkout_over_the_cap_waits_for_a_connection_to_come_back() {
    let upstream = Upstream::start(numbered).await;
    let metrics = Arc::new(Metrics::new());
    let pool = pool(&upstream, 2, &metrics);

    let first = pool.checkout().await.unwrap();
    let _second = pool.checkout().await.unwrap();
    let third = pool.checkout();
    tokio::pin!(third);
    assert!(poll_once(&mut third).await.is_pending());
    // Waiting for a slot, not dialing a third connection.
    assert_eq!(metrics.connections().upstream_waited.get(), 1);
    tokio::task::yield_now().await;
    assert!(poll_once(&mut third).await.is_pending());

    // The first connection comes back at the end of its answer's body.
    assert_eq!(get_all(&pool, first).await, "0");
    let third = within(third, "the third checkout").await.unwrap();
    assert!(third.reused);
    assert_eq!(get_all(&pool, third).await, "0");

    assert_eq!(upstream.connections(), 2);
    assert_eq!(upstream.seen.most_open.load(SeqCst), 2);
}

/// Checkout takes the most recently used connection, so the older one is never taken
/// while the newer serves: only the pool's sweeper can close it.
#[tokio::test]
async fn an_idle_connection_is_closed_at_its_timeout_while_a_newer_one_serves() {
    let _still = hold_clock();
    tokio::time::pause();
    let mut upstream = Upstream::start(numbered).await;
    let idle = idle_timeout();
    let pool = idle_pool(&upstream, 4, idle, &Arc::new(Metrics::new()));
    let older = pool.checkout().await.unwrap();
    let newer = pool.checkout().await.unwrap();
    assert_eq!(get_all(&pool, older).await, "0");
    assert_eq!(get_all(&pool, newer).await, "1");

    // The newer one serves every tenth of the timeout, the older one stays idle.
    let step = idle / 10;
    for _ in 0..9 {
        tokio::time::advance(step).await;
        let checkout = pool.checkout().await.unwrap();
        assert!(checkout.reused);
        assert_eq!(get_all(&pool, checkout).await, "1");
        assert_eq!(
            idle_count(&pool),
            2,
            "the older one closed before its timeout"
        );
    }

    // Past the older one's timeout (tokio's timers fire on the millisecond after their
    // deadline); no checkout comes by.
    tokio::time::advance(idle - step * 9 + Duration::from_millis(1)).await;
    assert_eq!(upstream.next_closed().await, 0);
    let checkout = pool.checkout().await.unwrap();
    assert!(checkout.reused);
    assert_eq!(get_all(&pool, checkout).await, "1");
    assert_eq!(upstream.connections(), 2);
}

#[tokio::test]
async fn a_pool_without_traffic_closes_its_idle_connections_at_their_timeout() {
    let _still = hold_clock();
    tokio::time::pause();
    let mut upstream = Upstream::start(numbered).await;
    let metrics = Arc::new(Metrics::new());
    let idle = idle_timeout();
    let pool = idle_pool(&upstream, 4, idle, &metrics);
    let first = pool.checkout().await.unwrap();
    let second = pool.checkout().await.unwrap();
    assert_eq!(get_all(&pool, first).await, "0");
    assert_eq!(get_all(&pool, second).await, "1");

    tokio::time::advance(idle - Duration::from_millis(1)).await;
    tokio::task::yield_now().await;
    assert_eq!(idle_count(&pool), 2, "closed before their timeout");

    // Past it (tokio's timers fire on the millisecond after their deadline).
    tokio::time::advance(Duration::from_millis(2)).await;
    let mut closed = [upstream.next_closed().await, upstream.next_closed().await];
    closed.sort_unstable();
    assert_eq!(closed, [0, 1]);
    assert_eq!(idle_count(&pool), 0);
    assert_eq!(metrics.connections().upstream_open.get(), 0);
}

/// A reload replaces the pool: its sweeper must not keep the old one, and with it the old
/// one's idle connections, alive.
#[tokio::test]
async fn a_dropped_pool_closes_its_idle_connections_though_its_sweeper_runs() {
    let mut upstream = Upstream::start(numbered).await;
    let pool = pool(&upstream, 4, &Arc::new(Metrics::new()));
    let checkout = pool.checkout().await.unwrap();
    assert_eq!(get_all(&pool, checkout).await, "0");
    tokio::task::yield_now().await;

    let weak = Arc::downgrade(&pool);
    drop(pool);
    assert!(weak.upgrade().is_none(), "something still holds the pool");
    assert_eq!(upstream.next_closed().await, 0);
}

/// After `101 Switching Protocols` hyper's connection task ends and the socket lives on in
/// the upgraded stream (spliced to the client): it still counts as open, under the cap.
#[tokio::test]
async fn an_upgraded_connection_holds_its_slot_until_its_stream_is_dropped() {
    let mut upstream = Upstream::start(switching).await;
    let metrics = Arc::new(Metrics::new());
    let pool = pool(&upstream, 1, &metrics);

    let checkout = pool.checkout().await.unwrap();
    let (head, body) = get(&pool, checkout).await.into_parts();
    assert_eq!(head.status, StatusCode::SWITCHING_PROTOCOLS);
    let body = UpstreamBody {
        body: Held::Http1(body),
        read_gap: Duration::from_secs(60),
    };
    let response = Response::from_parts(head, body);
    let upgraded = within(UpstreamBody::upgraded(response), "the upgrade")
        .await
        .expect("the upgraded stream");
    assert_eq!(metrics.connections().upstream_open.get(), 1);

    let second = pool.checkout();
    tokio::pin!(second);
    assert!(poll_once(&mut second).await.is_pending());
    assert_eq!(metrics.connections().upstream_waited.get(), 1);
    tokio::task::yield_now().await;
    assert!(poll_once(&mut second).await.is_pending());

    drop(upgraded);
    let second = within(second, "the second checkout").await.unwrap();
    assert!(!second.reused);
    assert_eq!(upstream.next_closed().await, 0);
    assert_eq!(metrics.connections().upstream_open.get(), 1);
}

/// Sends `POST /` with a body of 8 bytes of which the returned sender hands over what the
/// test wants, and reads the whole answer, which [`Upstream`] sends at the request's head
/// (as Node answers an upload `401`): the answer ends while hyper's task is still sending
/// the body. The body hands the connection back to `pool` once the request went out whole
/// within `finish_within`.
async fn answered_early(
    pool: &Arc<Pool>,
    mut checkout: Checkout,
    finish_within: Duration,
) -> (String, tokio::sync::mpsc::UnboundedSender<Bytes>) {
    let (upload, body) = Dripped::body(8);
    upload.send(Bytes::from_static(b"xxxx")).unwrap();
    let sender = checkout.conn.sender();
    sender.ready().await.expect("a connection ready");
    let request = Request::post("/").body(body).unwrap();
    let response = within(sender.try_send_request(request), "an answer")
        .await
        .map_err(|e| e.into_error())
        .expect("an answer");
    let (head, incoming) = response.into_parts();
    assert!(request::keeps_alive(head.version, &head.headers));
    let returning = Some(Arc::clone(pool));
    let body = PooledBody::new(incoming, checkout.conn, returning, finish_within);
    let bytes = within(body.collect(), "the answer body").await.unwrap();
    let answer = String::from_utf8(bytes.to_bytes().to_vec()).unwrap();
    (answer, upload)
}

/// Waits until `pool` holds `n` idle connections.
async fn idle_reaches(pool: &Pool, n: usize) {
    within(
        async {
            while idle_count(pool) != n {
                tokio::task::yield_now().await;
            }
        },
        "connections to come back",
    )
    .await;
}

/// Handed out while its task still sends another request's body, a connection makes the
/// request that took it wait behind that upload, however slow its client: the next
/// checkout dials a connection of its own instead (the cap allows it). Once the upload has
/// gone out, the connection comes back and is reused.
#[tokio::test]
async fn a_connection_whose_request_is_still_being_written_is_never_handed_out() {
    let upstream = Upstream::start(numbered).await;
    let pool = pool(&upstream, 4, &Arc::new(Metrics::new()));
    let first = pool.checkout().await.unwrap();
    let (answer, upload) = answered_early(&pool, first, HANG).await;
    assert_eq!(answer, "0");
    assert_eq!(idle_count(&pool), 0, "idle while its upload goes out");

    let second = pool.checkout().await.unwrap();
    assert!(!second.reused, "handed out while its upload goes out");
    assert_eq!(get_all(&pool, second).await, "1");

    upload.send(Bytes::from_static(b"xxxx")).unwrap();
    drop(upload);
    idle_reaches(&pool, 2).await;
    // The most recently returned: the one whose upload went out.
    let third = pool.checkout().await.unwrap();
    assert!(third.reused);
    assert_eq!(get_all(&pool, third).await, "0");
    assert_eq!(upstream.connections(), 2);
}

/// An upload that never ends keeps its connection out of the pool, and open, only for
/// `finish_within` (`connections.upstream_read_timeout`): then it is closed, its slot
/// freed.
#[tokio::test]
async fn a_connection_whose_request_never_goes_out_whole_is_closed() {
    let mut upstream = Upstream::start(numbered).await;
    let metrics = Arc::new(Metrics::new());
    let pool = pool(&upstream, 1, &metrics);
    let first = pool.checkout().await.unwrap();
    let (answer, _upload) = answered_early(&pool, first, Duration::from_millis(50)).await;
    assert_eq!(answer, "0");
    assert_eq!(upstream.next_closed().await, 0);
    assert_eq!(idle_count(&pool), 0);
    // Its slot is free: a checkout under a cap of one dials anew.
    let second = within(pool.checkout(), "a free slot").await.unwrap();
    assert!(!second.reused);
    assert_eq!(get_all(&pool, second).await, "1");
}
