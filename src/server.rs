//! Listeners: the proxy port (HTTP/1.1 and cleartext HTTP/2, chosen per connection) and the
//! optional admin port (`/healthz`, `/readyz`).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

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

/// Serves the proxy on `listener` until `shutdown` resolves.
pub async fn serve_proxy(listener: TcpListener, proxy: Proxy, shutdown: impl Future<Output = ()>) {
    let service = move |peer: SocketAddr| {
        let proxy = proxy.clone();
        service_fn(move |request: Request<Incoming>| {
            let proxy = proxy.clone();
            async move { Ok::<_, Infallible>(proxy.handle(request, peer).await) }
        })
    };
    accept_loop(listener, service, shutdown).await;
}

/// Serves the admin endpoints on `listener` until `shutdown` resolves.
pub async fn serve_admin(listener: TcpListener, store: Store, shutdown: impl Future<Output = ()>) {
    let service = move |_peer: SocketAddr| {
        let store = store.clone();
        service_fn(move |request: Request<Incoming>| {
            let store = store.clone();
            async move { Ok::<_, Infallible>(admin(request, &store).await) }
        })
    };
    accept_loop(listener, service, shutdown).await;
}

async fn admin(request: Request<Incoming>, store: &Store) -> Response<ProxyBody> {
    let (status, text) = match request.uri().path() {
        "/healthz" => (StatusCode::OK, "ok\n"),
        "/readyz" if store.ready().await => (StatusCode::OK, "ready\n"),
        "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, "store unreachable\n"),
        _ => (StatusCode::NOT_FOUND, "not found\n"),
    };
    let mut response = Response::new(ProxyBody::full(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response
}

async fn accept_loop<F, S>(
    listener: TcpListener,
    make_service: F,
    shutdown: impl Future<Output = ()>,
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
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Typically EMFILE: back off a little instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = make_service(peer);
        let builder = Arc::clone(&builder);
        tokio::spawn(async move {
            if let Err(e) = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
        });
    }
}
