//! A client's HTTP/2 connection driven by hand: frames written as the test spells them
//! (see `frames.rs`), frames read by a task of their own and handed over a channel, so a
//! test can wait for the proxy's next frame and for the upstream at once without losing
//! a half-read frame.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::frames::*;

/// Hang guard for one wait on the proxy.
pub(crate) const HANG: Duration = Duration::from_secs(30);

/// HTTP/2 error codes the tests look for (RFC 9113 §7).
pub(crate) const CANCEL: u32 = 0x8;
pub(crate) const ENHANCE_YOUR_CALM: u32 = 0xb;

/// One frame the proxy sent: type, flags, stream, payload.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// A GOAWAY's error code.
    pub fn goaway_code(&self) -> Option<u32> {
        (self.kind == GOAWAY).then(|| u32::from_be_bytes(self.payload[4..8].try_into().unwrap()))
    }
}

/// A client connection: the writing half, and the frames read so far.
pub(crate) struct H2 {
    writer: OwnedWriteHalf,
    frames: mpsc::UnboundedReceiver<Frame>,
}

impl H2 {
    /// Connects, writes the preface and the client's SETTINGS (no dynamic table, so
    /// [`status_of`] reads every answer), and acknowledges the proxy's SETTINGS.
    pub async fn open(addr: SocketAddr) -> H2 {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let mut h2 = H2::over(stream);
        let mut hello = PREFACE.to_vec();
        hello.extend(client_settings());
        hello.extend(frame(SETTINGS, ACK, 0, &[]));
        h2.send(&hello).await;
        h2
    }

    /// A connection on `stream`, nothing written yet; its frames are read from now on.
    pub fn over(stream: TcpStream) -> H2 {
        let (mut reader, writer) = stream.into_split();
        let (tx, frames) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                while buf.len() >= 9 {
                    let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
                    if buf.len() < 9 + len {
                        break;
                    }
                    let head: Vec<u8> = buf.drain(..9).collect();
                    let payload = buf.drain(..len).collect();
                    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
                    let frame = Frame {
                        kind: head[3],
                        flags: head[4],
                        stream: stream & 0x7fff_ffff,
                        payload,
                    };
                    if tx.send(frame).is_err() {
                        return;
                    }
                }
                match reader.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        });
        H2 { writer, frames }
    }

    /// Writes `bytes`; `false` if the proxy no longer takes them (it closed the
    /// connection).
    pub async fn send(&mut self, bytes: &[u8]) -> bool {
        self.writer.write_all(bytes).await.is_ok()
    }

    /// The next frame, `None` once the connection is closed.
    pub async fn next(&mut self) -> Option<Frame> {
        tokio::time::timeout(HANG, self.frames.recv())
            .await
            .expect("hang guard: the proxy neither sent a frame nor closed the connection")
    }

    /// The next frame that says something about `stream` (its answer's HEADERS, or
    /// RST_STREAM) or about the connection (GOAWAY); `None` once the connection is closed.
    /// Answers of other streams, SETTINGS, PING and WINDOW_UPDATE are passed over.
    pub async fn next_on(&mut self, stream: u32) -> Option<Frame> {
        loop {
            let frame = self.next().await?;
            let about_it = frame.stream == stream && matches!(frame.kind, HEADERS | RST_STREAM);
            if about_it || frame.kind == GOAWAY {
                return Some(frame);
            }
        }
    }

    /// Reads to the end of the connection: `true` once the proxy closed it.
    pub async fn closed(&mut self) -> bool {
        while self.next().await.is_some() {}
        true
    }
}

/// A header block of `fields` for a request (see [`header_block`]).
pub(crate) fn fields(fields: &[(&str, &str)]) -> Vec<u8> {
    let owned: Vec<(Vec<u8>, Vec<u8>)> = fields
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
    header_block(&owned)
}

/// A POST of `body` to `path` on `stream`, whole: HEADERS (END_HEADERS) with `extra`
/// fields, then DATA (END_STREAM).
pub(crate) fn post(stream: u32, path: &str, body: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let length = body.len().to_string();
    let mut all = vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "127.0.0.1"),
        ("content-type", "application/json"),
        ("content-length", length.as_str()),
    ];
    all.extend_from_slice(extra);
    let mut out = frame(HEADERS, END_HEADERS, stream, &fields(&all));
    out.extend(frame(DATA, END_STREAM, stream, body.as_bytes()));
    out
}

/// A GET of `path` on `stream`: one HEADERS frame (END_HEADERS, END_STREAM).
pub(crate) fn get(stream: u32, path: &str) -> Vec<u8> {
    let all = [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "127.0.0.1"),
    ];
    frame(HEADERS, END_HEADERS | END_STREAM, stream, &fields(&all))
}

/// RST_STREAM on `stream` with `code`.
pub(crate) fn reset(stream: u32, code: u32) -> Vec<u8> {
    frame(RST_STREAM, 0, stream, &code.to_be_bytes())
}

/// A PING with `payload`.
pub(crate) fn ping(payload: [u8; 8]) -> Vec<u8> {
    frame(PING, 0, 0, &payload)
}
