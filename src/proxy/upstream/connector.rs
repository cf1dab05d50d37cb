//! Opening a connection to the upstream: TCP, then TLS for `https://` upstreams (ALPN
//! `http/1.1`, or `h2` alone for HTTP/2, which the upstream must then select), bounded by [`CONNECT_TIMEOUT`]. Every failure here happens before a byte
//! of any request was written, so it is [`ProxyError::UpstreamUnreachable`].
//!
//! Under TLS the socket is [`Counted`]: one write call through TLS makes several syscalls
//! and fails with the first that fails, after records may have gone out, so only the
//! socket can tell whether a failed write sent nothing ([`SocketSent`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::error::ProxyError;

/// How long establishing a TCP connection (and its TLS handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The byte stream to the upstream: TCP, or TLS over it.
pub enum Io {
    /// `http://` upstreams.
    Plain(TcpStream),
    /// `https://` upstreams.
    Tls(Box<TlsStream<Counted>>),
}

/// A connection's byte stream that can tell what its writes put on the socket.
pub trait SocketSent {
    /// Bytes the socket took so far, the TLS handshake's included; `None` over plain TCP,
    /// where a write call that failed sent nothing, so that its result says it all.
    fn socket_sent(&self) -> Option<u64>;
}

/// A socket that counts the bytes its write calls handed to the kernel, for TLS: a write
/// call through TLS that fails may have put records on the socket first
/// (`tokio_rustls`'s `poll_write` goes on writing records until a syscall fails, and then
/// reports that failure alone).
#[derive(Debug)]
pub struct Counted<T = TcpStream> {
    io: T,
    sent: u64,
}

impl<T> Counted<T> {
    /// `io`, nothing counted yet.
    pub fn new(io: T) -> Self {
        Self { io, sent: 0 }
    }

    /// Bytes the socket took so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    fn count(&mut self, written: io::Result<usize>) -> Poll<io::Result<usize>> {
        if let Ok(n) = written {
            self.sent += n as u64;
        }
        Poll::Ready(written)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = ready!(Pin::new(&mut this.io).poll_write(cx, buf));
        this.count(written)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs));
        this.count(written)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<T> SocketSent for TlsStream<Counted<T>> {
    fn socket_sent(&self) -> Option<u64> {
        Some(self.get_ref().0.sent())
    }
}

impl SocketSent for Io {
    fn socket_sent(&self) -> Option<u64> {
        match self {
            Io::Plain(_) => None,
            Io::Tls(io) => io.socket_sent(),
        }
    }
}

/// How to reach the upstream.
#[derive(Clone)]
pub struct Connector {
    /// `host:port` as `TcpStream::connect` resolves it (IPv6 hosts keep their brackets).
    address: String,
    /// For `https://`: the connector and the name the certificate must carry (or why the
    /// host is no such name: then every connect fails).
    tls: Option<(TlsConnector, Result<ServerName<'static>, String>)>,
    /// Whether TLS offers `h2` alone and requires the upstream to select it.
    h2: bool,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("address", &self.address)
            .field("tls", &self.tls.as_ref().map(|(_, name)| name))
            .finish()
    }
}

impl Connector {
    /// A connector for `host:port`; `tls` is `Some` for `https://` upstreams; `h2`: the
    /// connections speak HTTP/2.
    pub fn new(host: &str, port: u16, tls: Option<Arc<rustls::ClientConfig>>, h2: bool) -> Self {
        let tls = tls.map(|config| {
            let mut config = (*config).clone();
            let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
            config.alpn_protocols = vec![alpn.to_vec()];
            let name = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let name = ServerName::try_from(name).map_err(|e| e.to_string());
            (TlsConnector::from(Arc::new(config)), name)
        });
        Self {
            address: format!("{host}:{port}"),
            tls,
            h2,
        }
    }

    /// `host:port`, for messages.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Opens a connection, within [`CONNECT_TIMEOUT`].
    pub async fn connect(&self) -> Result<Io, ProxyError> {
        let unreachable = |what: &str, e: &dyn std::fmt::Display| {
            ProxyError::UpstreamUnreachable(format!("{what} {}: {e}", self.address))
        };
        let dial = async {
            let tcp = TcpStream::connect(&self.address)
                .await
                .map_err(|e| unreachable("connect", &e))?;
            tcp.set_nodelay(true)
                .map_err(|e| unreachable("connect", &e))?;
            match &self.tls {
                None => Ok(Io::Plain(tcp)),
                Some((connector, name)) => {
                    let name = name
                        .clone()
                        .map_err(|e| unreachable("TLS server name of", &e))?;
                    let tls = connector
                        .connect(name, Counted::new(tcp))
                        .await
                        .map_err(|e| unreachable("TLS handshake with", &e))?;
                    // A server that ignores ALPN would get HTTP/2 frames it cannot read.
                    if self.h2 && tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                        return Err(unreachable(
                            "ALPN with",
                            &"the upstream did not select h2 (connections.upstream_protocol: http2)",
                        ));
                    }
                    Ok(Io::Tls(Box::new(tls)))
                }
            }
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, dial).await {
            Ok(result) => result,
            Err(_) => Err(unreachable("connect", &"timed out")),
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(io) => io.is_write_vectored(),
            Io::Tls(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_flush(cx),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Io::Tls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }
}
