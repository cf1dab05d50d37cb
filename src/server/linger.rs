//! Lingering close: how a client connection ends, so that an answer sent before the
//! request was read whole reaches the client.
//!
//! A server that closes a socket with unread bytes in it makes the kernel send a reset,
//! and a reset discards what the client has not read yet: a client that writes its whole
//! 2 MiB upload before it reads (Python's http.client, Java's HttpURLConnection, many SDKs)
//! loses the 413 that was sent after the first kilobytes, and sees a broken pipe instead.
//! hyper closes the connection whenever a handler answered without reading the body.
//!
//! So hyper never holds the socket itself: it gets a [`Returning`] stream that, when hyper
//! drops it, hands the socket back to the connection's task. The task then closes its
//! sending side (the client reads the answer, then the end) and reads and drops whatever
//! the client still sends, until the client closes too or a bound is reached
//! ([`crate::config::Linger`], nginx's `lingering_close`, `lingering_time` and
//! `lingering_timeout`). A client that already closed costs one read.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::config::Linger;
use crate::metrics::ConnectionMetrics;

/// A client socket that goes back to its connection's task when dropped; see the
/// [module docs](self).
#[derive(Debug)]
pub struct Returning {
    stream: Option<TcpStream>,
    back: Option<oneshot::Sender<TcpStream>>,
}

impl Returning {
    /// `stream`, and where it comes back once its user drops it.
    pub fn new(stream: TcpStream) -> (Self, oneshot::Receiver<TcpStream>) {
        let (back, returned) = oneshot::channel();
        let returning = Self {
            stream: Some(stream),
            back: Some(back),
        };
        (returning, returned)
    }

    fn stream(self: Pin<&mut Self>) -> Pin<&mut TcpStream> {
        Pin::new(
            self.get_mut()
                .stream
                .as_mut()
                .expect("the stream is only taken when dropped"),
        )
    }

    /// The socket itself, to look at (its certificate, its address).
    pub fn get_ref(&self) -> &TcpStream {
        self.stream
            .as_ref()
            .expect("the stream is only taken when dropped")
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let (Some(stream), Some(back)) = (self.stream.take(), self.back.take()) {
            // The task that waits for it may be gone (it was aborted): then it just closes.
            let _ = back.send(stream);
        }
    }
}

impl AsyncRead for Returning {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.stream().poll_read(cx, buf)
    }
}

impl AsyncWrite for Returning {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.stream().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.stream().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.get_ref().is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_shutdown(cx)
    }
}

/// How a lingering close ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The client closed its side (or the connection failed): nothing is left unread.
    Client,
    /// A bound was reached with the client still sending: the socket is closed anyway.
    Cut,
}

/// Closes `stream` lingering within `bounds`; see the [module docs](self).
pub async fn close(mut stream: TcpStream, bounds: Linger, metrics: &ConnectionMetrics) -> Ended {
    // FIN after everything written; hyper has done this already on an orderly close.
    let _ = stream.shutdown().await;
    // The usual case: the client has closed already, or is about to read the end.
    let mut probe = [0u8; 1];
    match stream.try_read(&mut probe) {
        Ok(0) => return Ended::Client,
        Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Ended::Client,
        Ok(_) | Err(_) => {}
    }
    metrics.lingering.inc();
    let ended = drain(&mut stream, bounds).await;
    metrics.lingering.dec();
    if ended == Ended::Cut {
        metrics.lingering_cut.inc();
    }
    ended
}

/// Reads and drops until the client closes or a bound is reached.
async fn drain(stream: &mut TcpStream, bounds: Linger) -> Ended {
    let deadline = tokio::time::Instant::now() + bounds.time;
    let mut buf = vec![0u8; 16 * 1024];
    let mut read: u64 = 0;
    loop {
        let wait = (tokio::time::Instant::now() + bounds.timeout).min(deadline);
        match tokio::time::timeout_at(wait, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Ended::Client,
            Ok(Ok(n)) => {
                read += n as u64;
                if read > bounds.bytes {
                    return Ended::Cut;
                }
            }
            Err(_) => return Ended::Cut,
        }
    }
}
