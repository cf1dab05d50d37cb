//! The HTTP/1.1 upstream the pool's tests and the hand-written client's tests run against:
//! real, on `127.0.0.1:0`, counting the connections and requests it sees and reporting
//! each connection the client's side closed; and a request body the test hands over bit
//! by bit ([`Dripped`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::proxy::body::{BodyError, ProxyBody};

/// The longest a test waits for something that should happen at once; reaching it fails
/// the test instead of hanging it.
pub(crate) const HANG: Duration = Duration::from_secs(10);

/// The idle timeout of pools in tests that do not test it, on a running clock: longer
/// than any of them, so a busy machine never expires a connection a test means to reuse.
pub(crate) const NEVER_IDLE: Duration = Duration::from_secs(3600);

/// What the upstream answers: the raw bytes for a request, given the number of its
/// connection and its own number (both from 0, in the order the upstream saw them).
pub(crate) type Answer = fn(usize, usize) -> Vec<u8>;

/// `200` whose body is the number of the connection it came on.
pub(crate) fn numbered(connection: usize, _request: usize) -> Vec<u8> {
    let body = connection.to_string();
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// What the upstream saw.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) connections: AtomicUsize,
    pub(crate) requests: AtomicUsize,
    pub(crate) open: AtomicUsize,
    pub(crate) most_open: AtomicUsize,
}

/// An HTTP/1.1 upstream that answers every request with its [`Answer`] and never closes a
/// connection itself, so any connection that ends was closed by the pool's side.
pub(crate) struct Upstream {
    pub(crate) port: u16,
    pub(crate) seen: Arc<Seen>,
    /// The number of each connection the pool's side closed, in order.
    closed: mpsc::UnboundedReceiver<usize>,
}

impl Upstream {
    pub(crate) async fn start(answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Seen::default());
        let (closing, closed) = mpsc::unbounded_channel();
        let counts = Arc::clone(&seen);
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let connection = counts.connections.fetch_add(1, SeqCst);
                let open = counts.open.fetch_add(1, SeqCst) + 1;
                counts.most_open.fetch_max(open, SeqCst);
                let (counts, closing) = (Arc::clone(&counts), closing.clone());
                tokio::spawn(async move {
                    serve(stream, connection, answer, &counts).await;
                    counts.open.fetch_sub(1, SeqCst);
                    let _ = closing.send(connection);
                });
            }
        });
        Self { port, seen, closed }
    }

    pub(crate) fn connections(&self) -> usize {
        self.seen.connections.load(SeqCst)
    }

    pub(crate) fn requests(&self) -> usize {
        self.seen.requests.load(SeqCst)
    }

    /// The next connection the pool's side closed.
    pub(crate) async fn next_closed(&mut self) -> usize {
        within(self.closed.recv(), "a connection to close")
            .await
            .unwrap()
    }
}

/// Answers each request head (the pool's requests have no body) until the other side
/// closes the connection.
async fn serve(mut stream: TcpStream, connection: usize, answer: Answer, seen: &Seen) {
    let mut received = Vec::new();
    let mut buf = [0; 4096];
    loop {
        while let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            received.drain(..end + 4);
            let request = seen.requests.fetch_add(1, SeqCst);
            // A write the pool's side cut short shows up as the read below ending.
            let _ = stream.write_all(&answer(connection, request)).await;
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => received.extend_from_slice(&buf[..n]),
        }
    }
}

/// `future`, or a failed test after [`HANG`].
pub(crate) async fn within<T>(future: impl Future<Output = T>, what: &str) -> T {
    tokio::time::timeout(HANG, future)
        .await
        .unwrap_or_else(|_| panic!("waited {HANG:?} for {what}"))
}

/// A request body of a declared length whose bytes go out as the test hands them over:
/// an upload still going out after its answer came ([`Upstream`] answers at the head).
pub(crate) struct Dripped {
    chunks: mpsc::UnboundedReceiver<Bytes>,
    len: u64,
}

impl Dripped {
    /// A body of `len` bytes, and where the test sends them.
    pub(crate) fn body(len: u64) -> (mpsc::UnboundedSender<Bytes>, ProxyBody) {
        let (send, chunks) = mpsc::unbounded_channel();
        (send, ProxyBody::boxed(Self { chunks, len }))
    }
}

impl Body for Dripped {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.get_mut()
            .chunks
            .poll_recv(cx)
            .map(|chunk| chunk.map(|chunk| Ok(Frame::data(chunk))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}
