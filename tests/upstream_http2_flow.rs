//! HTTP/2 upstream flow control: the streams of one upstream connection share its
//! connection-level window, so the proxy must not let a few answers nobody reads (clients
//! that stopped reading) hold all of it and stall every other request on the connection;
//! and what one stream buffers is the proxy's choice, not hyper's default.

#[path = "common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use common::{post, start_proxy};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How many answers nobody reads: their stream windows (256 KiB each) add up to more
/// than hyper's default connection window (5 MiB).
const STALLED: usize = 21;

/// A hand-written HTTP/2 upstream (raw frames, so it knows the proxy's windows exactly):
/// the first [`STALLED`] streams get a 200 and endless DATA, as much as the proxy's
/// stream and connection windows allow; the next one gets 201 and a body of `{}` once its
/// windows have room. `blocked` is told once the stalled streams are open and have been
/// sent all their windows allow (the proxy reads none of it, so no window reopens).
async fn windowed_upstream(blocked: Arc<tokio::sync::Notify>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, Arc::clone(&blocked)));
        }
    });
    addr
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

async fn serve(mut io: TcpStream, blocked: Arc<tokio::sync::Notify>) {
    const END_STREAM: u8 = 0x1;
    const END_HEADERS: u8 = 0x4;
    // Our preface: SETTINGS, none changed.
    io.write_all(&frame(4, 0, 0, &[])).await.unwrap();
    let mut preface = [0; 24];
    if io.read_exact(&mut preface).await.is_err() {
        return;
    }
    let mut conn_window: i64 = 65_535;
    let mut initial: i64 = 65_535;
    let mut windows: HashMap<u32, i64> = HashMap::new();
    let mut stalled: Vec<u32> = Vec::new();
    // The answered stream, while its body waits for room.
    let mut answer: Option<u32> = None;
    let mut told = false;
    loop {
        let mut head = [0; 9];
        if io.read_exact(&mut head).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0; len];
        if io.read_exact(&mut payload).await.is_err() {
            return;
        }
        match kind {
            // SETTINGS (not an ACK): INITIAL_WINDOW_SIZE moves every stream's window.
            4 if flags & 1 == 0 => {
                for setting in payload.chunks_exact(6) {
                    if u16::from_be_bytes([setting[0], setting[1]]) == 0x4 {
                        let value = i64::from(u32::from_be_bytes([
                            setting[2], setting[3], setting[4], setting[5],
                        ]));
                        for window in windows.values_mut() {
                            *window += value - initial;
                        }
                        initial = value;
                    }
                }
                io.write_all(&frame(4, 1, 0, &[])).await.unwrap();
            }
            // WINDOW_UPDATE
            8 => {
                let increment =
                    i64::from(u32::from_be_bytes(payload[..4].try_into().unwrap()) & 0x7fff_ffff);
                match id {
                    0 => conn_window += increment,
                    id => *windows.entry(id).or_insert(initial) += increment,
                }
            }
            // HEADERS: a request.
            1 => {
                windows.entry(id).or_insert(initial);
                if stalled.len() < STALLED {
                    stalled.push(id);
                    // :status 200 (static table index 8).
                    io.write_all(&frame(1, END_HEADERS, id, &[0x88]))
                        .await
                        .unwrap();
                } else {
                    // :status 201, a literal with the name of index 8.
                    let status = [0x08, 0x03, b'2', b'0', b'1'];
                    io.write_all(&frame(1, END_HEADERS, id, &status))
                        .await
                        .unwrap();
                    answer = Some(id);
                }
            }
            _ => {}
        }
        // The answer's body first, once both its windows have room for it.
        if let Some(id) = answer {
            if conn_window >= 2 && windows[&id] >= 2 {
                io.write_all(&frame(0, END_STREAM, id, b"{}"))
                    .await
                    .unwrap();
                conn_window -= 2;
                answer = None;
            }
        }
        for id in &stalled {
            loop {
                let room = conn_window.min(windows[id]).min(16_384);
                if room <= 0 {
                    break;
                }
                let data = vec![b'x'; room as usize];
                io.write_all(&frame(0, 0, *id, &data)).await.unwrap();
                conn_window -= room;
                *windows.get_mut(id).unwrap() -= room;
            }
        }
        if !told && stalled.len() == STALLED {
            told = true;
            blocked.notify_one();
        }
    }
}

/// [`STALLED`] clients (HTTP/2 to the proxy) stop reading their downloads; a protected
/// request on the same upstream connection must still get its answer. With hyper's default
/// connection window (5 MiB, less than their stream windows together) the unread downloads
/// held all of it, the upstream could send no byte of any other answer, and the request
/// ended in a 504 with its key held (its owner waiting until a stalled client was cut off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_nobody_reads_do_not_stall_the_other_streams_of_their_connection() {
    let blocked = Arc::new(tokio::sync::Notify::new());
    let upstream = windowed_upstream(Arc::clone(&blocked)).await;
    let proxy = start_proxy(
        upstream,
        r#"
connections: { upstream_protocol: http2, upstream_idle_timeout: 1h }
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
    upstream_timeout: 3s
  - name: plain
    match: { path: "/plain/*" }
    idempotency: off
"#,
    )
    .await;
    // The stalled clients: one HTTP/2 connection whose streams' windows are 0 and never
    // opened, so the proxy reads nothing of their answers (and releases no window).
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let mut downloads = Vec::new();
    for i in 0..STALLED {
        let request = http::Request::get(format!("http://x/plain/dl{i}"))
            .body(())
            .unwrap();
        let (answer, _) = client.send_request(request, true).unwrap();
        downloads.push(answer);
        client = client.ready().await.unwrap();
    }
    let mut held = Vec::new();
    for answer in downloads {
        let answer = answer.await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        held.push(answer.into_body());
    }
    tokio::time::timeout(std::time::Duration::from_secs(30), blocked.notified())
        .await
        .expect("hang guard: the upstream never filled the windows");
    let order = post(proxy.addr, "/orders", &[("idempotency-key", "k")], "{}").await;
    assert_eq!(order.status, StatusCode::CREATED, "{order:?}");
    drop(held);
}

/// The windows the proxy's HTTP/2 client announces: 256 KiB per stream
/// (`SETTINGS_INITIAL_WINDOW_SIZE`), so an answer nobody reads holds at most that in the
/// proxy, and the connection's at HTTP/2's largest (its first WINDOW_UPDATE). Before, each
/// stream took hyper's 2 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_announces_its_own_windows_to_an_http2_upstream() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let proxy = start_proxy(
        upstream,
        "connections: { upstream_protocol: http2 }\nroutes: []\n",
    )
    .await;
    // Only to make the proxy dial: its answer does not matter.
    let asking = tokio::spawn(common::send(
        proxy.addr,
        http::Method::GET,
        "/",
        &[],
        String::new(),
    ));
    let (mut io, _) = listener.accept().await.unwrap();
    io.write_all(&frame(4, 0, 0, &[])).await.unwrap();
    let mut preface = [0; 24];
    io.read_exact(&mut preface).await.unwrap();
    let (mut stream_window, mut connection_window) = (None, None);
    while stream_window.is_none() || connection_window.is_none() {
        let mut head = [0; 9];
        io.read_exact(&mut head).await.unwrap();
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0; len];
        io.read_exact(&mut payload).await.unwrap();
        match head[3] {
            4 if head[4] & 1 == 0 => {
                stream_window = Some(
                    payload
                        .chunks_exact(6)
                        .find(|setting| setting[..2] == [0, 4])
                        .map(|setting| u32::from_be_bytes(setting[2..].try_into().unwrap())),
                );
            }
            8 if id == 0 => {
                let increment = u32::from_be_bytes(payload[..4].try_into().unwrap());
                // Every connection starts at 65,535 (RFC 9113 §6.9.2).
                connection_window = Some(65_535 + (increment & 0x7fff_ffff));
            }
            _ => {}
        }
    }
    assert_eq!(
        stream_window.unwrap(),
        Some(256 << 10),
        "SETTINGS_INITIAL_WINDOW_SIZE"
    );
    assert_eq!(
        connection_window,
        Some((1 << 31) - 1),
        "the connection's window"
    );
    asking.abort();
}
