//! The request entry point: match the route, take the passthrough or protected path, and
//! turn any [`ProxyError`] into its problem+json answer here, once. hyper never sees an error.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{header, Request, Response};
use hyper::body::Incoming;
use tracing::Instrument;

use super::body::ProxyBody;
use super::passthrough;
use super::protected::{self, Outcome};
use super::upstream::UpstreamClient;
use crate::config::{Config, Protection};
use crate::store::Store;

/// Everything a request needs, shared by all connections.
#[derive(Debug, Clone)]
pub struct Proxy {
    config: Arc<Config>,
    store: Store,
    client: UpstreamClient,
}

impl Proxy {
    /// A proxy serving `config` with `store`.
    pub fn new(config: Arc<Config>, store: Store) -> Self {
        let client = UpstreamClient::new(&config.upstream);
        Self {
            config,
            store,
            client,
        }
    }

    /// The store in use.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Answers one request. Never fails: errors become problem+json answers.
    pub async fn handle(
        &self,
        request: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let (route, protection) = {
            let host = request
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .or_else(|| request.uri().host());
            self.config
                .protection_for(host, request.method(), request.uri().path())
        };
        let span = tracing::debug_span!(
            "request",
            method = %request.method(),
            path = %request.uri().path(),
            route = route,
            key = tracing::field::Empty,
        );
        let result = async {
            match protection {
                Protection::Off => passthrough::forward(
                    &self.client,
                    request,
                    peer,
                    self.config.passthrough_timeout,
                )
                .await
                .map(|r| (r, None)),
                Protection::On(rule) => {
                    let cx = protected::Context {
                        store: &self.store,
                        client: &self.client,
                        peer,
                    };
                    protected::handle(cx, rule, request)
                        .await
                        .map(|(r, outcome)| (r, Some(outcome)))
                }
            }
        }
        .instrument(span.clone())
        .await;
        let _entered = span.enter();
        match result {
            Ok((response, outcome)) => {
                tracing::debug!(
                    status = response.status().as_u16(),
                    outcome = outcome.map_or("passthrough", Outcome::as_str),
                    micros = started.elapsed().as_micros() as u64,
                    "done"
                );
                response
            }
            Err(error) => {
                let status = error.status();
                if status.is_server_error() {
                    tracing::warn!(%status, problem = error.as_str(), %error, "proxy error");
                } else {
                    tracing::debug!(%status, problem = error.as_str(), %error, "refused");
                }
                error.into_response()
            }
        }
    }
}
