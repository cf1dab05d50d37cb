//! Hand-written HTTP/2 server sides, for what h2's own server cannot be made to send: one
//! that refuses every stream with a GOAWAY whose last stream id (0) is below it (RFC 9113
//! §8.7 says such a stream was not processed), and one that cuts an answer short with a
//! `RST_STREAM` before its `END_STREAM` (h2's server drops the data it has queued when
//! asked to reset), and one that sends a `204` head and ends its stream only later, as a
//! server whose handler flushes its head before it returns.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Serves `stream` until the client's first HEADERS frame, calls `on_head`, then sends
/// GOAWAY (last stream id 0, NO_ERROR) and closes.
pub async fn go_away_below_every_stream(mut stream: TcpStream, on_head: impl FnOnce()) {
    exchange_prefaces(&mut stream).await;
    while let Some((kind, ..)) = read_frame(&mut stream).await {
        if kind == 0x1 {
            on_head();
            let goaway = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            stream.write_all(&goaway).await.unwrap();
            let _ = stream.shutdown().await;
            let _ = stream.read_to_end(&mut Vec::new()).await;
            return;
        }
    }
}

/// Serves one request on `stream`: reads the client's first stream (1) whole, awaits
/// `ran` (the request ran), then answers `200` with `content_length` (if any) in its head
/// and `body` as its only DATA frame, and resets the stream with the error code `reason`
/// before any `END_STREAM`: the answer is cut short. Holds the connection open until the
/// client closes it, so the reset alone ends the stream.
pub async fn answer_cut_by_a_reset(
    mut stream: TcpStream,
    content_length: Option<usize>,
    body: &[u8],
    reason: u32,
    ran: impl std::future::Future<Output = ()>,
) {
    serve_until(&mut stream, |kind, flags| {
        // HEADERS or DATA with END_STREAM: the request is whole.
        (kind == 0x1 || kind == 0x0) && flags & 0x1 == 1
    })
    .await;
    ran.await;
    let mut out = frame(0x1, 0x4, &status_head(200, content_length));
    out.extend(frame(0x0, 0x0, body));
    out.extend(frame(0x3, 0x0, &reason.to_be_bytes()));
    stream.write_all(&out).await.unwrap();
    let _ = stream.read_to_end(&mut Vec::new()).await;
}

/// Answers the client's first stream (1) as soon as its HEADERS arrive, without reading
/// its body: `201` with `body` and `END_STREAM`, then `RST_STREAM` with `NO_ERROR`, as
/// RFC 9113 §8.1 lets a server ask the client to stop sending a body it does not need.
pub async fn answer_early_then_reset(mut stream: TcpStream, body: &[u8]) {
    serve_until(&mut stream, |kind, _| kind == 0x1).await;
    let mut out = frame(0x1, 0x4, &status_head(201, Some(body.len())));
    out.extend(frame(0x0, 0x1, body));
    out.extend(frame(0x3, 0x0, &0u32.to_be_bytes()));
    stream.write_all(&out).await.unwrap();
    let _ = stream.read_to_end(&mut Vec::new()).await;
}

/// Answers the client's first stream (1), once its request is whole, with a `204` head
/// without `END_STREAM`, as Go's HTTP/2 server does for a handler that flushes its head and
/// goes on (committing its work, say); calls `head_sent`, then reads the client's frames
/// until `returned` resolves (the handler returned) and only then ends the stream with an
/// empty DATA frame. `on_end` gets the error code of the `RST_STREAM` the client sent on
/// stream 1 before that end, if any: Go cancels the handler's context on it. Holds the
/// connection open until the client closes it.
pub async fn no_content_ended_later(
    mut stream: TcpStream,
    head_sent: impl FnOnce(),
    returned: impl std::future::Future<Output = ()>,
    on_end: impl FnOnce(Option<u32>),
) {
    serve_until(&mut stream, |kind, flags| {
        (kind == 0x1 || kind == 0x0) && flags & 0x1 == 1
    })
    .await;
    stream
        .write_all(&frame(0x1, 0x4, &status_head(204, None)))
        .await
        .unwrap();
    head_sent();
    let mut reset = None;
    let mut returned = std::pin::pin!(returned);
    loop {
        // A frame read part-way when `returned` wins is lost: only frames before the end
        // count, and after it nothing more is parsed.
        tokio::select! {
            biased;
            () = &mut returned => break,
            read = read_frame(&mut stream) => match read {
                Some((0x3, _, 1, payload)) if reset.is_none() => {
                    reset = Some(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                }
                Some(_) => {}
                None => break,
            },
        }
    }
    let _ = stream.write_all(&frame(0x0, 0x1, &[])).await;
    on_end(reset);
    let _ = stream.read_to_end(&mut Vec::new()).await;
}

/// One frame from `stream`: its type, flags, stream id and payload; `None` at its end.
async fn read_frame(stream: &mut TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0; 9];
    stream.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0; len];
    stream.read_exact(&mut payload).await.ok()?;
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Some((head[3], head[4], id, payload))
}

/// Sends a server's preface (an empty SETTINGS frame) and reads the client's.
async fn exchange_prefaces(stream: &mut TcpStream) {
    stream
        .write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let mut preface = [0; 24];
    stream.read_exact(&mut preface).await.unwrap();
}

/// Sends a server preface and reads the client's frames, acknowledging its SETTINGS,
/// until one of stream 1's for which `stop(type, flags)` holds.
async fn serve_until(stream: &mut TcpStream, stop: impl Fn(u8, u8) -> bool) {
    exchange_prefaces(stream).await;
    loop {
        let (kind, flags, id, _) = read_frame(stream).await.expect("the client's frames");
        if kind == 0x4 && flags & 0x1 == 0 {
            stream
                .write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0])
                .await
                .unwrap();
        }
        if id == 1 && stop(kind, flags) {
            return;
        }
    }
}

/// An HPACK header block: `:status` (literal, indexed name 8), then `content-length`
/// (literal, indexed name 28) if given.
fn status_head(status: u16, content_length: Option<usize>) -> Vec<u8> {
    let mut block = vec![0x08, 3];
    block.extend_from_slice(status.to_string().as_bytes());
    if let Some(n) = content_length {
        let value = n.to_string();
        block.extend_from_slice(&[0x0f, 0x0d, value.len() as u8]);
        block.extend_from_slice(value.as_bytes());
    }
    block
}

/// A frame of stream 1.
fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut frame = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 1];
    frame.extend_from_slice(payload);
    frame
}
