//! The upload through TLS on a real loopback connection whose peer resets it (`SO_LINGER`
//! 0): what the socket took, not what the TLS layer's write call returned, tells whether a
//! failed write sent nothing. One write call through TLS hands records to the socket in
//! several syscalls; a [`Stepped`] socket holds the call after its first syscall until the
//! peer's reset has arrived, so that the reset falls every time where it otherwise falls
//! by chance, between two syscalls of one call.

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::super::encode::{encode_head, BodyFraming};
use super::{SendError, Upload};
use crate::proxy::body::ProxyBody;
use crate::proxy::upstream::connector::Counted;

/// The longest a test waits for something that should happen at once.
const HANG: Duration = Duration::from_secs(10);
/// The most the first syscall of a stepped write hands the socket: part of one TLS record,
/// so that the call has more to write.
const FIRST: usize = 1000;

/// When the peer resets the connection.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reset {
    /// Before the request's first syscall, which then fails.
    BeforeTheRequest,
    /// Once the first syscall of the request's first write call put part of it on the
    /// socket, and the peer read some of that: the next syscall of the same call fails.
    AfterPartOfIt,
}

/// The peer's side of a connection: told when to reset, it answers with how many bytes
/// it read first.
struct Peer {
    reset: mpsc::Sender<Reset>,
    read: mpsc::Receiver<usize>,
}

/// A client socket that, once given its [`Reset`] and [`Peer`], has the peer reset the
/// connection at that point of the next write call, and waits for the reset to arrive.
struct Stepped {
    tcp: TcpStream,
    plan: Arc<Mutex<Option<(Reset, Peer)>>>,
}

impl Stepped {
    /// The peer resets; returns once the reset has arrived here (the socket's error),
    /// with how many bytes the peer read first.
    fn reset(&self, when: Reset, peer: Peer) -> usize {
        peer.reset.send(when).expect("the peer is there");
        let read = peer.read.recv().expect("the peer reset");
        let start = Instant::now();
        while self.tcp.take_error().unwrap().is_none() {
            assert!(start.elapsed() < HANG, "the peer's reset never arrived");
            std::thread::yield_now();
        }
        read
    }
}

impl AsyncRead for Stepped {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stepped {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let plan = this.plan.lock().unwrap().take();
        match plan {
            None => Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs),
            Some((Reset::BeforeTheRequest, peer)) => {
                this.reset(Reset::BeforeTheRequest, peer);
                Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs)
            }
            Some((Reset::AfterPartOfIt, peer)) => {
                let first = bufs
                    .iter()
                    .find(|buf| !buf.is_empty())
                    .map_or(&[][..], |buf| &buf[..buf.len().min(FIRST)]);
                let written = Pin::new(&mut this.tcp).poll_write(cx, first);
                let Poll::Ready(Ok(n @ 1..)) = written else {
                    panic!("a fresh socket takes the first bytes at once: {written:?}");
                };
                let read = this.reset(Reset::AfterPartOfIt, peer);
                assert!(read > 0, "the peer read part of the request");
                Poll::Ready(Ok(n))
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// A TLS connection to a peer on `127.0.0.1:0` that runs in a thread of its own (the
/// client's write call blocks its thread while the peer resets), through a [`Stepped`]
/// socket; the handshake is done. Set the plan to have the peer reset.
async fn connect() -> (
    TlsStream<Counted<Stepped>>,
    Arc<Mutex<Option<(Reset, Peer)>>>,
    Peer,
) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = certified.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let client = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (reset, when) = mpsc::channel();
    let (reading, read) = mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.unwrap();
            // Nothing else runs on this thread.
            let Ok(when) = when.recv() else { return };
            let mut read = 0;
            if when == Reset::AfterPartOfIt {
                let mut buf = [0; FIRST];
                read = tls.get_mut().0.read(&mut buf).await.unwrap();
            }
            tls.get_ref().0.set_zero_linger().unwrap();
            drop(tls);
            let _ = reading.send(read);
        });
    });

    let tcp = TcpStream::connect(addr).await.unwrap();
    let plan = Arc::new(Mutex::new(None));
    let stepped = Stepped {
        tcp,
        plan: Arc::clone(&plan),
    };
    let name = ServerName::try_from("localhost").unwrap();
    let tls = tokio::time::timeout(HANG, connector.connect(name, Counted::new(stepped)))
        .await
        .expect("the handshake within HANG")
        .unwrap();
    (tls, plan, Peer { reset, read })
}

/// A `POST` with a body of `len` bytes, whole in memory.
fn post(len: usize) -> Upload {
    let parts = http::Request::post("/orders")
        .header("host", "x")
        .header("content-length", len)
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let body = ProxyBody::full(Bytes::from(vec![b'x'; len]));
    let framing = BodyFraming::of(&parts.headers, &body);
    Upload::new(encode_head(&parts, framing, 0), framing, body, None)
}

/// Sends `upload` on `tls` as the exchange does (it began on the connection first).
async fn send(upload: &mut Upload, tls: &mut TlsStream<Counted<Stepped>>) -> Result<(), SendError> {
    upload.begin(tls);
    tokio::time::timeout(HANG, poll_fn(|cx| upload.poll_send(tls, cx)))
        .await
        .expect("the upload ends within HANG")
}

/// The TLS layer's write call put a record's first bytes on the socket, the peer read
/// them and reset, and the call's next syscall failed: the call returned only the error.
/// The upstream may have the request, so it is not sent again. Before, the upload knew
/// only what write calls returned, and took this for a request of which nothing went
/// out: [`SendError::Unsent`], sent again on another connection.
#[tokio::test]
async fn a_tls_write_that_fails_after_part_of_the_request_went_out_is_not_unsent() {
    let (mut tls, plan, peer) = connect().await;
    *plan.lock().unwrap() = Some((Reset::AfterPartOfIt, peer));
    let mut upload = post(64 * 1024);
    match send(&mut upload, &mut tls).await {
        Err(SendError::Io(_)) => {}
        other => panic!("expected a failure after the request went out: {other:?}"),
    }
    assert!(upload.wrote());
    assert!(!upload.repeatable());
}

/// What the socket took before the request, the TLS handshake and an earlier request on
/// the connection, is not the request's: a write refused from its first syscall is
/// [`SendError::Unsent`], and the request may go out on another connection.
#[tokio::test]
async fn a_tls_write_refused_from_its_first_byte_is_unsent_after_the_handshake_and_earlier_requests(
) {
    let (mut tls, plan, peer) = connect().await;
    send(&mut post(10), &mut tls)
        .await
        .expect("the earlier request went out");
    *plan.lock().unwrap() = Some((Reset::BeforeTheRequest, peer));
    let mut upload = post(64 * 1024);
    match send(&mut upload, &mut tls).await {
        Err(SendError::Unsent(_)) => {}
        other => panic!("expected a request of which nothing went out: {other:?}"),
    }
    assert!(upload.repeatable());
}
