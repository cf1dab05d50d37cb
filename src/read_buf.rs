//! Reading from a socket into a growable buffer, the one way both HTTP/1.1 sides do it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::AsyncRead;

/// Reads what `io` has into `read`, first growing it by `chunk` when less than a quarter
/// of that is left. Through `poll_read`, so tokio clears the socket's readiness after a
/// short read and the next read waits for the poller instead of failing once first.
pub fn poll_read_more<T: AsyncRead>(
    io: Pin<&mut T>,
    cx: &mut Context<'_>,
    read: &mut BytesMut,
    chunk: usize,
) -> Poll<io::Result<usize>> {
    if read.capacity() - read.len() < chunk / 4 {
        read.reserve(chunk);
    }
    tokio_util::io::poll_read_buf(io, cx, read)
}
