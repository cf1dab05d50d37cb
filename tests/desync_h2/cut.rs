//! A body cut after its head went upstream: an upstream of this module's own that says
//! when the head and the first bytes of a body have arrived, so the client resets its
//! stream only once the streamed route has sent them on, and then gives every byte it got
//! until the proxy closed the connection.

use std::net::SocketAddr;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::run::HANG;

/// The upstream's two signals: `arrived` once the bytes so far end with `until`; `closed`
/// with every byte of the connection once the proxy closed it.
pub(crate) struct CutUpstream {
    pub(crate) addr: SocketAddr,
    pub(crate) arrived: oneshot::Receiver<()>,
    pub(crate) closed: oneshot::Receiver<Vec<u8>>,
}

/// Starts an upstream on 127.0.0.1:0 that takes one connection and never answers.
pub(crate) async fn start_cut_upstream(until: &'static [u8]) -> CutUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (arrived_tx, arrived) = oneshot::channel();
    let (closed_tx, closed) = oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut arrived_tx = Some(arrived_tx);
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if buf.ends_with(until) {
                if let Some(tx) = arrived_tx.take() {
                    let _ = tx.send(());
                }
            }
        }
        let _ = closed_tx.send(buf);
    });
    CutUpstream {
        addr,
        arrived,
        closed,
    }
}

/// Waits for `rx`, failing with `what` after [`HANG`].
pub(crate) async fn signal<T>(rx: oneshot::Receiver<T>, what: &str) -> T {
    tokio::time::timeout(HANG, rx)
        .await
        .unwrap_or_else(|_| panic!("hang guard: waited {HANG:?} for: {what}"))
        .unwrap()
}
