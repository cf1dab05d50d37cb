//! Listeners: the proxy port (HTTP/1.1 and cleartext HTTP/2, chosen per connection) and the
//! optional admin port, each with a graceful drain: on shutdown, stop accepting, let open
//! connections finish their requests, then return.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::config::{Config, StoreConfig};
use crate::proxy::body::ProxyBody;
use crate::proxy::Proxy;
use crate::store::{MemoryStore, RedisStore, Store, StoreError};

/// Builds the store a config names. Redis is connected lazily: a server that is down at
/// start is reported (and `/readyz` fails) but does not stop the proxy.
pub fn open_store(config: &Config) -> Result<Store, StoreError> {
    Ok(match &config.store {
        StoreConfig::Memory(limits) => Store::Memory(Arc::new(MemoryStore::new(*limits))),
        StoreConfig::Redis(settings) => Store::Redis(Arc::new(RedisStore::connect(settings)?)),
    })
}

/// Serves the proxy on `listener` until `shutdown` resolves, then drains for at most
/// `drain` before returning.
pub async fn serve_proxy(
    listener: TcpListener,
    proxy: Proxy,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let service = move |peer: SocketAddr| {
        let proxy = proxy.clone();
        service_fn(move |request: Request<Incoming>| {
            let proxy = proxy.clone();
            async move { Ok::<_, Infallible>(proxy.handle(request, peer).await) }
        })
    };
    accept_loop(listener, service, shutdown, drain).await;
}

/// Serves the admin endpoints on `listener` until `shutdown` resolves.
pub async fn serve_admin(
    listener: TcpListener,
    proxy: Proxy,
    token: Option<String>,
    shutdown: impl Future<Output = ()>,
) {
    let token: Option<Arc<str>> = token.map(Arc::from);
    let service = move |_peer: SocketAddr| {
        let (proxy, token) = (proxy.clone(), token.clone());
        service_fn(move |request: Request<Incoming>| {
            let (proxy, token) = (proxy.clone(), token.clone());
            async move {
                Ok::<_, Infallible>(crate::admin::handle(request, &proxy, token.as_deref()).await)
            }
        })
    };
    accept_loop(listener, service, shutdown, Duration::from_secs(1)).await;
}

async fn accept_loop<F, S>(
    listener: TcpListener,
    make_service: F,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) where
    F: Fn(SocketAddr) -> S,
    S: hyper::service::Service<
            Request<Incoming>,
            Response = Response<ProxyBody>,
            Error = Infallible,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    // Each connection holds a sender; when all are dropped, every connection has closed.
    let (open_tx, mut open_rx) = mpsc::channel::<()>(1);
    let (stop_tx, stop_rx) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Typically EMFILE: back off a little instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = make_service(peer);
        let builder = Arc::clone(&builder);
        let open = open_tx.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _open = open;
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let result = tokio::select! {
                result = conn.as_mut() => result,
                _ = stop.changed() => {
                    // Finish the request in progress, refuse new ones on this connection.
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    drop(open_tx);
    let _ = stop_tx.send(());
    if tokio::time::timeout(drain, open_rx.recv()).await.is_err() {
        tracing::warn!(?drain, "drain timeout: closing connections still open");
    }
}
