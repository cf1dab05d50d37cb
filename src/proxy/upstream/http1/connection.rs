//! One upstream connection of the hand-written client and its exchange, in the forwarding
//! request's own task: the request is written ([`Upload`]) while the answer head is
//! awaited ([`Connection::exchange`]), and the answer's body is decoded by whoever polls
//! it ([`super::body::AnswerBody`]). What was read and not yet consumed stays in the
//! connection's buffer, so a connection with a byte past its last answer is never reused.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::{Method, StatusCode};
use http_body::Frame;
use tokio::io::{AsyncRead, ReadBuf};

use super::decoder::{Decoder, Step};
use super::head::{invalid, parse_head, Head};
use super::upload::{SendError, Upload};
use crate::proxy::upstream::pool::Leased;

/// Bytes asked of the socket per read (and the least spare room before one, a quarter).
const READ_CHUNK: usize = 16 * 1024;

/// One upstream connection and what has been read from it but not yet consumed.
pub(crate) struct Connection {
    io: Leased,
    read: BytesMut,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("unread", &self.read.len())
            .finish()
    }
}

impl Connection {
    /// A connection over `io`, nothing read yet.
    pub(crate) fn new(io: Leased) -> Self {
        Self {
            io,
            read: BytesMut::new(),
        }
    }

    /// Whether an idle connection can carry a request: nothing of its last answer's
    /// exchange is left unread, and the upstream has neither closed it nor sent anything
    /// unasked since. One read, through TLS: what TLS already holds counts (bytes it
    /// decrypted past the answer, a `close_notify`), though the socket has nothing more to
    /// report (a short read cleared its readiness); a session ticket is consumed. A quiet
    /// socket costs no syscall: the runtime answers from the readiness it has.
    pub(crate) fn is_idle_and_open(&mut self) -> bool {
        if !self.read.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        let mut probe = [0u8; 64];
        let mut buf = ReadBuf::new(&mut probe);
        matches!(
            Pin::new(&mut self.io).poll_read(&mut cx, &mut buf),
            Poll::Pending
        )
    }

    /// The socket, for the upload.
    pub(crate) fn io(&mut self) -> &mut Leased {
        &mut self.io
    }

    /// Reads what the socket has; `0` at its end.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.read.capacity() - self.read.len() < READ_CHUNK / 4 {
            self.read.reserve(READ_CHUNK);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read)
    }

    /// Sends `upload` and reads the final answer head to `method`, both at once: an
    /// upstream may answer before the request is whole (RFC 9112 §9.5), and then the rest
    /// of the upload goes on with the answer's body. A write that fails once some of the
    /// request went out ends the upload, and the head is still awaited: an upstream that
    /// answers and stops reading (a `413`) is answered so.
    ///
    /// [`SendError::Unsent`]: not a byte went out, and nothing came back.
    pub(crate) async fn exchange(
        &mut self,
        upload: &mut Upload,
        method: &Method,
    ) -> Result<Head, SendError> {
        let mut write_failed: Option<io::Error> = None;
        upload.begin(&self.io);
        poll_fn(|cx| {
            if write_failed.is_none() && !upload.is_done() {
                match upload.poll_send(&mut self.io, cx) {
                    Poll::Ready(Ok(())) | Poll::Pending => {}
                    Poll::Ready(Err(SendError::Io(e))) => write_failed = Some(e),
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                }
            }
            let read = ready!(self.poll_final_head(method, cx));
            let nothing_out = !upload.wrote();
            Poll::Ready(match (read, nothing_out) {
                // Bytes before the request: no answer to it, and the connection is out of
                // step with the upstream.
                (Ok(Some(_)), true) => Err(SendError::Unsent(invalid(
                    "the upstream sent an answer before the request",
                ))),
                (Ok(Some(head)), false) => Ok(head),
                (Ok(None), true) => Err(SendError::Unsent(closed(
                    "the upstream closed the connection before the request went out",
                ))),
                (Err(e), true) => Err(SendError::Unsent(e)),
                (Ok(None), false) => Err(SendError::Io(write_failed.take().unwrap_or_else(|| {
                    closed("the upstream closed the connection before answering")
                }))),
                (Err(e), false) => Err(SendError::Io(e)),
            })
        })
        .await
        .map(|mut head| {
            if write_failed.is_some() {
                // The upload is cut short: the connection cannot carry another request.
                head.keep_alive = false;
                upload.abandon();
            }
            head
        })
    }

    /// The next final answer head to `method`, reading as needed and skipping interim
    /// (1xx) answers other than `101`, as hyper's client does; `None` if the upstream
    /// closed first.
    fn poll_final_head(
        &mut self,
        method: &Method,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<Option<Head>>> {
        loop {
            if let Some(head) = parse_head(&mut self.read, method)? {
                if head.parts.status.is_informational()
                    && head.parts.status != StatusCode::SWITCHING_PROTOCOLS
                {
                    continue;
                }
                return Poll::Ready(Ok(Some(head)));
            }
            if ready!(self.poll_fill(cx))? == 0 {
                return Poll::Ready(Ok(None));
            }
        }
    }

    /// The next frame of a body framed by `decoder`; `None` at its end.
    pub(crate) fn poll_body(
        &mut self,
        decoder: &mut Decoder,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        loop {
            match decoder.step(&mut self.read) {
                Step::Frame(frame) => return Poll::Ready(Some(Ok(frame))),
                Step::Done => return Poll::Ready(None),
                Step::Failed(e) => return Poll::Ready(Some(Err(e))),
                Step::NeedMore => {}
            }
            let n = match ready!(self.poll_fill(cx)) {
                Ok(n) => n,
                Err(e) => return Poll::Ready(Some(Err(e))),
            };
            if n == 0 {
                return Poll::Ready(decoder.at_eof().err().map(Err));
            }
        }
    }
}

fn closed(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, what)
}
