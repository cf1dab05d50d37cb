//! An answer's body, decoded from its connection as the client side reads it
//! ([`AnswerBody`]). At its end the connection goes back to the pool if the answer let
//! it, nothing past the answer arrived, and the whole request went out; dropped earlier,
//! it closes the connection (the rest of the body is still on the wire).

use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::connection::Connection;
use super::decoder::Decoder;
use super::upload::Upload;
use super::Own;
use crate::proxy::body::BodyError;
use crate::proxy::upstream::pool::Pool;

/// An upstream answer's body on the hand-written client.
pub(crate) struct AnswerBody {
    conn: Option<Connection>,
    decoder: Decoder,
    /// The rest of a request the upstream answered before it was whole. Boxed: rare, and
    /// the body is moved with every answer.
    upload: Option<Box<Upload>>,
    /// Where the connection goes at the end; `None`: it is not reused.
    returning: Option<Arc<Pool<Own>>>,
    /// How long the rest of the upload may take once the answer has ended
    /// (`connections.upstream_read_timeout`).
    finish_within: Duration,
    /// A failure of the body, reported at the next poll: see [`Body::poll_frame`].
    failed: Option<std::io::Error>,
    /// A data frame was handed on.
    yielded: bool,
}

impl std::fmt::Debug for AnswerBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerBody")
            .field("decoder", &self.decoder)
            .field("uploading", &self.upload.is_some())
            .field("pooled", &self.returning.is_some())
            .finish()
    }
}

impl AnswerBody {
    /// The body of an answer read from `conn`, framed by `decoder`, with what is left of
    /// its request (`upload`), handing `conn` back to `pool` at its end (`None`: never).
    pub(crate) fn new(
        conn: Connection,
        decoder: Decoder,
        upload: Option<Upload>,
        pool: Option<Arc<Pool<Own>>>,
        finish_within: Duration,
    ) -> Self {
        let mut body = Self {
            conn: Some(conn),
            decoder,
            upload: upload.filter(|upload| !upload.is_done()).map(Box::new),
            returning: pool,
            finish_within,
            failed: None,
            yielded: false,
        };
        // hyper never polls a body that says it is over (an empty one): hand back now.
        if body.decoder.is_done() {
            body.finish();
        }
        body
    }

    /// The answer has ended: the connection goes back, or first finishes its upload.
    fn finish(&mut self) {
        let (Some(conn), Some(pool)) = (self.conn.take(), self.returning.take()) else {
            return;
        };
        match self.upload.take() {
            // Bytes past the answer's end: the upstream and the framing disagree, and the
            // next request would read them as its answer (`Pool::put` checks).
            None => pool.put(conn),
            Some(upload) => drop(tokio::spawn(finish_upload(
                conn,
                upload,
                Arc::downgrade(&pool),
                self.finish_within,
            ))),
        }
    }
}

/// Sends the rest of a request whose answer came and ended first, as hyper's connection
/// task does, and puts the connection back in `pool` if it all went out within `within`.
/// Only then: idle meanwhile, it would be handed to the next request, which would wait
/// behind this upload (another client's, however slow) though the cap let it open a
/// connection of its own.
async fn finish_upload(
    mut conn: Connection,
    mut upload: Box<Upload>,
    pool: Weak<Pool<Own>>,
    within: Duration,
) {
    let sent = std::future::poll_fn(|cx| upload.poll_send(conn.io(), cx));
    match tokio::time::timeout(within, sent).await {
        Ok(Ok(())) => {
            if let Some(pool) = pool.upgrade() {
                pool.put(conn);
            }
        }
        Ok(Err(e)) => tracing::debug!(error = %e, "the rest of an answered upload failed"),
        Err(_) => tracing::debug!("the rest of an answered upload timed out"),
    }
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if let Some(e) = this.failed.take() {
            return Poll::Ready(Some(Err(BodyError::UpstreamWire(e))));
        }
        let Some(conn) = this.conn.as_mut() else {
            return Poll::Ready(None);
        };
        if let Some(upload) = this.upload.as_mut() {
            // The upload goes on beside the answer: an upstream may read it only as it
            // answers (an echo).
            match upload.poll_send(conn.io(), cx) {
                Poll::Ready(Ok(())) => this.upload = None,
                Poll::Pending => {}
                // The answer goes on; the connection, out of step, is not reused.
                Poll::Ready(Err(e)) => {
                    tracing::debug!(error = %e, "the rest of an answered upload failed");
                    this.upload = None;
                    this.returning = None;
                }
            }
        }
        let polled = conn.poll_body(&mut this.decoder, cx);
        match &polled {
            Poll::Ready(None) => this.finish(),
            // A sized body may say it is over with its last frame, and trailers end a
            // chunked one: hyper's server polls neither again.
            Poll::Ready(Some(Ok(_))) if this.decoder.is_done() => this.finish(),
            Poll::Ready(Some(Ok(_))) => this.yielded = true,
            Poll::Pending => {}
            // A failed body leaves the connection in an unknown state: never reuse it.
            Poll::Ready(Some(Err(_))) => {
                this.returning = None;
                this.conn = None;
                this.upload = None;
            }
        }
        match polled {
            // After data, reported at the next poll, after a wake: hyper's server drops
            // what it has not yet written of an answer when its body fails, so the data
            // that came before the failure (a body cut short by a close) first goes out
            // with the head, as it does when hyper's client sends the failure on later.
            // A body that fails before any data fails at once: no head goes out either,
            // as with hyper's client, which has the failure ready by then.
            Poll::Ready(Some(Err(e))) if this.yielded => {
                this.failed = Some(e);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            polled => {
                polled.map(|frame| frame.map(|result| result.map_err(BodyError::UpstreamWire)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
