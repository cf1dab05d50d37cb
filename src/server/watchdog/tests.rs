//! The watchdog on tokio's paused clock: each test feeds a [`Watch`] as a connection would
//! (an open request, an answer's body, a socket whose writes wait) and checks when, and
//! why, the [`Watchdog`] fires. The clock moves only when the runtime has nothing else to
//! do, straight to the next timer, so the instants are exact and no test waits.

use std::future::poll_fn;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

const HEAD: Duration = Duration::from_secs(30);
const SEND: Duration = Duration::from_secs(60);

/// Fires, and says when (since `from`) and why. One that never fires would re-arm its
/// timer forever on the paused clock: this gives up after a few of the longer timeout.
async fn fires(dog: Watchdog, from: Instant) -> (Duration, Expired) {
    let why = tokio::time::timeout(SEND * 4, dog)
        .await
        .expect("the watchdog fires");
    (from.elapsed(), why)
}

/// Whether `dog` fires within `within` (the clock moves on by that much if it does not).
async fn quiet_for(dog: &mut Watchdog, within: Duration) -> bool {
    tokio::time::timeout(within, dog).await.is_err()
}

/// An answer body of `frames` one-byte frames that are there at once.
struct Frames(usize);

impl Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.0 == 0 {
            return Poll::Ready(None);
        }
        self.0 -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
    }

    fn is_end_stream(&self) -> bool {
        self.0 == 0
    }
}

fn answer(watch: &Arc<Watch>, frames: usize) -> Tracked<Frames> {
    Tracked {
        inner: Frames(frames),
        open: Open::new(watch),
        handed: false,
    }
}

async fn next_frame(body: &mut Tracked<Frames>) {
    poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx))
        .await
        .expect("a frame")
        .expect("no error");
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_sends_nothing_is_idle_at_the_head_timeout() {
    let start = Instant::now();
    let watch = Watch::new(HEAD, SEND);
    assert_eq!(
        fires(Watchdog::new(watch), start).await,
        (HEAD, Expired::Idle)
    );
}

#[tokio::test(start_paused = true)]
async fn an_open_request_holds_off_the_head_timeout_until_its_answer_ends() {
    let watch = Watch::new(HEAD, SEND);
    let mut dog = Watchdog::new(Arc::clone(&watch));
    let open = Open::new(&watch);
    assert!(
        quiet_for(&mut dog, HEAD * 4).await,
        "fired with a request open"
    );

    let ended = Instant::now();
    drop(open);
    assert_eq!(fires(dog, ended).await, (HEAD, Expired::Idle));
}

#[tokio::test(start_paused = true)]
async fn a_kept_alive_connection_is_idle_a_head_timeout_after_its_last_answer() {
    let watch = Watch::new(HEAD, SEND);
    let mut dog = Watchdog::new(Arc::clone(&watch));
    tokio::time::advance(HEAD / 2).await;
    let mut body = answer(&watch, 1);
    next_frame(&mut body).await;
    drop(body);
    let ended = Instant::now();
    // Not at the head timeout from accept, which has passed by the time the next one would.
    assert!(quiet_for(&mut dog, HEAD - HEAD / 4).await);
    assert_eq!(fires(dog, ended).await, (HEAD, Expired::Idle));
}

#[tokio::test(start_paused = true)]
async fn an_answer_the_client_does_not_take_is_cut_off_at_the_send_timeout() {
    let watch = Watch::new(HEAD, SEND);
    let dog = Watchdog::new(Arc::clone(&watch));
    let mut body = answer(&watch, 2);
    next_frame(&mut body).await;
    // hyper took a frame and never comes back for the next: the client is not reading.
    let handed = Instant::now();
    assert_eq!(fires(dog, handed).await, (SEND, Expired::Send));
}

/// hyper's HTTP/2 side holds an answer's last frame, and its body, until the client's
/// flow-control window has room: a client that never opens it takes nothing of an answer
/// of one frame either.
#[tokio::test(start_paused = true)]
async fn an_answer_s_last_frame_the_client_does_not_take_is_cut_off_at_the_send_timeout() {
    let watch = Watch::new(HEAD, SEND);
    let dog = Watchdog::new(Arc::clone(&watch));
    let mut body = answer(&watch, 1);
    next_frame(&mut body).await;
    let handed = Instant::now();
    assert_eq!(fires(dog, handed).await, (SEND, Expired::Send));
}

#[tokio::test(start_paused = true)]
async fn an_answer_the_client_keeps_taking_is_never_cut_off() {
    let watch = Watch::new(HEAD, SEND);
    let mut dog = Watchdog::new(Arc::clone(&watch));
    // Another request (an HTTP/2 stream) stays open: the head timeout does not apply.
    let _other = Open::new(&watch);
    let mut body = answer(&watch, 100);
    for _ in 0..10 {
        next_frame(&mut body).await;
        assert!(quiet_for(&mut dog, SEND - Duration::from_secs(1)).await);
    }
    drop(body);
    assert!(
        quiet_for(&mut dog, SEND * 2).await,
        "an answer that ended left a send deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn a_write_that_waits_is_cut_off_at_the_send_timeout() {
    let watch = Watch::new(HEAD, SEND);
    let dog = Watchdog::new(Arc::clone(&watch));
    let (near, _far) = tokio::io::duplex(4);
    let mut socket = Metered::new(near, Arc::clone(&watch));
    socket.write_all(b"1234").await.unwrap();
    let waits = Instant::now();
    let write = poll_fn(|cx| Poll::Ready(Pin::new(&mut socket).poll_write(cx, b"5")));
    assert!(write.await.is_pending(), "the duplex is full");
    // With no request open the head timeout would come first: a waiting write is the
    // send timeout's to bound.
    assert_eq!(fires(dog, waits).await, (SEND, Expired::Send));
}

#[tokio::test(start_paused = true)]
async fn a_write_that_progresses_after_the_head_timeout_makes_the_connection_idle_at_once() {
    let watch = Watch::new(HEAD, SEND);
    let mut dog = Watchdog::new(Arc::clone(&watch));
    let (near, mut far) = tokio::io::duplex(4);
    let mut socket = Metered::new(near, Arc::clone(&watch));
    socket.write_all(b"1234").await.unwrap();
    let write = poll_fn(|cx| Poll::Ready(Pin::new(&mut socket).poll_write(cx, b"5")));
    assert!(write.await.is_pending(), "the duplex is full");
    assert!(quiet_for(&mut dog, HEAD + HEAD / 2).await);

    let mut read = [0; 4];
    far.read_exact(&mut read).await.unwrap();
    socket.write_all(b"5").await.unwrap();
    let progressed = Instant::now();
    assert_eq!(
        fires(dog, progressed).await,
        (Duration::ZERO, Expired::Idle)
    );
}
