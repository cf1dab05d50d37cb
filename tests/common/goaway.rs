//! A hand-written HTTP/2 server side that refuses every stream with a GOAWAY whose last
//! stream id (0) is below it: h2's own server cannot name a last id below a stream it has
//! received, and RFC 9113 §8.7 says such a stream was not processed.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Serves `stream` until the client's first HEADERS frame, calls `on_head`, then sends
/// GOAWAY (last stream id 0, NO_ERROR) and closes.
pub async fn go_away_below_every_stream(mut stream: TcpStream, on_head: impl FnOnce()) {
    // An empty SETTINGS frame, as a server's preface.
    stream
        .write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let mut preface = [0; 24];
    stream.read_exact(&mut preface).await.unwrap();
    loop {
        let mut head = [0; 9];
        if stream.read_exact(&mut head).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0; len];
        stream.read_exact(&mut payload).await.unwrap();
        if head[3] == 0x1 {
            on_head();
            let goaway = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            stream.write_all(&goaway).await.unwrap();
            let _ = stream.shutdown().await;
            let _ = stream.read_to_end(&mut Vec::new()).await;
            return;
        }
    }
}
