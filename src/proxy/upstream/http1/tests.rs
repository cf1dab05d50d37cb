//! The pool of the hand-written client's connections against a real HTTP/1.1 upstream on
//! `127.0.0.1:0` that counts the connections and requests it sees: reuse, idle expiry, a
//! connection with unread bytes never reused, the cap. Requests go out as
//! `UpstreamClient::send_untimed` sends them ([`Connection::exchange`], an
//! [`AnswerBody`] that hands back only an answer that keeps alive).

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use http::Method;
use http_body_util::BodyExt;
use tokio::sync::Semaphore;

use super::body::AnswerBody;
use super::connection::Connection;
use super::decoder::Decoder;
use super::encode::{encode_head, BodyFraming};
use super::upload::Upload;
use super::Own;
use crate::metrics::Metrics;
use crate::proxy::body::ProxyBody;
use crate::proxy::upstream::connector::Connector;
use crate::proxy::upstream::pool::{Checkout, Pool};
use crate::proxy::upstream::test_upstream::{
    numbered, within, Dripped, Upstream, HANG, NEVER_IDLE,
};

fn pool(upstream: &Upstream, max: usize, idle: Duration) -> Arc<Pool<Own>> {
    let connector = Connector::new("127.0.0.1", upstream.port, None, false);
    let slots = Arc::new(Semaphore::new(max));
    Arc::new(Pool::with(
        Own,
        connector,
        slots,
        idle,
        Arc::new(Metrics::new()),
    ))
}

/// Sends `GET /` on the checked-out connection; the answer's body hands it back to `pool`
/// if the answer keeps it alive.
async fn get(pool: &Arc<Pool<Own>>, checkout: Checkout<Connection>) -> AnswerBody {
    let mut conn = checkout.conn;
    assert!(conn.is_idle_and_open(), "a usable connection");
    let parts = http::Request::get("/")
        .header("host", "x")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let body = ProxyBody::empty();
    let framing = BodyFraming::of(&parts.headers, &body);
    let mut upload = Upload::new(encode_head(&parts, framing, 0), framing, body, None);
    let head = within(conn.exchange(&mut upload, &Method::GET), "an answer")
        .await
        .expect("an answer");
    let pool = head.keep_alive.then(|| Arc::clone(pool));
    AnswerBody::new(conn, Decoder::new(head.framing), Some(upload), pool, HANG)
}

async fn get_all(pool: &Arc<Pool<Own>>, checkout: Checkout<Connection>) -> String {
    let body = get(pool, checkout).await;
    let bytes = within(body.collect(), "the answer body")
        .await
        .expect("the answer body")
        .to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn idle_count(pool: &Pool<Own>) -> usize {
    pool.idle_count()
}

#[tokio::test]
async fn a_connection_whose_answer_was_read_to_its_end_is_reused() {
    let upstream = Upstream::start(numbered).await;
    let pool = pool(&upstream, 4, NEVER_IDLE);
    let first = pool.checkout().await.unwrap();
    assert!(!first.reused);
    assert_eq!(get_all(&pool, first).await, "0");
    let second = pool.checkout().await.unwrap();
    assert!(second.reused);
    assert_eq!(get_all(&pool, second).await, "0");
    assert_eq!(upstream.connections(), 1);
}

/// The clock is paused and held still by a blocking task, so a connection's idle age is
/// exactly what was advanced.
#[tokio::test]
async fn an_idle_connection_past_its_timeout_is_not_reused() {
    let (release, released) = std::sync::mpsc::channel::<()>();
    tokio::task::spawn_blocking(move || released.recv_timeout(HANG));
    tokio::time::pause();
    let mut upstream = Upstream::start(numbered).await;
    let idle = Duration::from_secs(1);
    let pool = pool(&upstream, 4, idle);
    let first = pool.checkout().await.unwrap();
    assert_eq!(get_all(&pool, first).await, "0");
    tokio::time::advance(idle - Duration::from_millis(1)).await;
    let second = pool.checkout().await.unwrap();
    assert!(second.reused);
    assert_eq!(get_all(&pool, second).await, "0");
    tokio::time::advance(idle + Duration::from_millis(1)).await;
    let third = pool.checkout().await.unwrap();
    assert!(!third.reused);
    assert_eq!(get_all(&pool, third).await, "1");
    assert_eq!(
        upstream.next_closed().await,
        0,
        "the expired one was closed"
    );
    drop(release);
}

#[tokio::test]
async fn a_connection_with_bytes_past_its_answer_is_never_reused() {
    fn answer_and_more(connection: usize, request: usize) -> Vec<u8> {
        let mut bytes = numbered(connection, request);
        bytes.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nforged");
        bytes
    }
    let mut upstream = Upstream::start(answer_and_more).await;
    let pool = pool(&upstream, 4, NEVER_IDLE);
    let first = pool.checkout().await.unwrap();
    // The extra bytes may arrive with the answer or after it: either way they are unread.
    assert_eq!(get_all(&pool, first).await, "0");
    let second = pool.checkout().await.unwrap();
    assert!(
        !second.reused,
        "the connection with unread bytes was handed out"
    );
    assert_eq!(get_all(&pool, second).await, "1");
    assert_eq!(upstream.next_closed().await, 0);
}

#[tokio::test]
async fn a_connection_whose_answer_was_not_read_to_its_end_is_never_reused() {
    fn large(connection: usize, _request: usize) -> Vec<u8> {
        let mut bytes = b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n".to_vec();
        bytes.extend(std::iter::repeat_n(b'0' + connection as u8, 1_000_000));
        bytes
    }
    let upstream = Upstream::start(large).await;
    let pool = pool(&upstream, 4, NEVER_IDLE);
    let first = pool.checkout().await.unwrap();
    let mut body = get(&pool, first).await;
    let frame = within(body.frame(), "a frame").await.unwrap().unwrap();
    assert!(frame.is_data());
    drop(body);
    let second = pool.checkout().await.unwrap();
    assert!(!second.reused);
    assert_eq!(idle_count(&pool), 0);
}

#[tokio::test]
async fn a_checkout_over_the_cap_waits_for_a_connection_to_come_back() {
    let upstream = Upstream::start(numbered).await;
    let pool = pool(&upstream, 1, NEVER_IDLE);
    let first = pool.checkout().await.unwrap();
    let body = get(&pool, first).await;
    let mut waiting = Box::pin(pool.checkout());
    let polled = std::future::poll_fn(|cx| Poll::Ready(waiting.as_mut().poll(cx))).await;
    assert!(polled.is_pending(), "a second connection over the cap");
    within(body.collect(), "the answer").await.unwrap();
    let second = within(waiting, "the connection to come back")
        .await
        .unwrap();
    assert!(second.reused);
    assert_eq!(upstream.connections(), 1);
}

/// Sends `POST /` with a body of 8 bytes of which the returned sender hands over what the
/// test wants, and reads the whole answer, which [`Upstream`] sends at the request's head
/// (as Node answers an upload `401`): the answer ends while the upload is still going out.
async fn answered_early(
    pool: &Arc<Pool<Own>>,
    checkout: Checkout<Connection>,
) -> (String, tokio::sync::mpsc::UnboundedSender<bytes::Bytes>) {
    let mut conn = checkout.conn;
    let (upload, body) = Dripped::body(8);
    upload.send(bytes::Bytes::from_static(b"xxxx")).unwrap();
    let parts = http::Request::post("/")
        .header("host", "x")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let framing = BodyFraming::of(&parts.headers, &body);
    let mut sent = Upload::new(encode_head(&parts, framing, 0), framing, body, None);
    let head = within(conn.exchange(&mut sent, &Method::POST), "an answer")
        .await
        .expect("an answer");
    assert!(head.keep_alive);
    let pool = Some(Arc::clone(pool));
    let body = AnswerBody::new(conn, Decoder::new(head.framing), Some(sent), pool, HANG);
    let bytes = within(body.collect(), "the answer body").await.unwrap();
    let answer = String::from_utf8(bytes.to_bytes().to_vec()).unwrap();
    (answer, upload)
}

/// Handed out while the rest of another request's body goes out, a connection makes the
/// request that took it wait behind that upload, however slow its client: the next
/// checkout dials a connection of its own instead (the cap allows it). Once the upload has
/// gone out, the connection comes back and is reused.
#[tokio::test]
async fn a_connection_whose_request_is_still_being_written_is_never_handed_out() {
    let upstream = Upstream::start(numbered).await;
    let pool = pool(&upstream, 4, NEVER_IDLE);
    let first = pool.checkout().await.unwrap();
    let (answer, upload) = answered_early(&pool, first).await;
    assert_eq!(answer, "0");
    assert_eq!(idle_count(&pool), 0, "idle while its upload goes out");

    let second = pool.checkout().await.unwrap();
    assert!(!second.reused, "handed out while its upload goes out");
    assert_eq!(get_all(&pool, second).await, "1");

    upload.send(bytes::Bytes::from_static(b"xxxx")).unwrap();
    drop(upload);
    within(
        async {
            while idle_count(&pool) != 2 {
                tokio::task::yield_now().await;
            }
        },
        "the connection to come back",
    )
    .await;
    // The most recently returned: the one whose upload went out.
    let third = pool.checkout().await.unwrap();
    assert!(third.reused);
    assert_eq!(get_all(&pool, third).await, "0");
    assert_eq!(upstream.connections(), 2);
}
