//! The connection to the application: a keep-alive pool over HTTP/1.1 (TLS for `https://`
//! upstreams), with the upstream URI rewritten in and failures turned into 502/504.

use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::body::ProxyBody;
use crate::config::Upstream;
use crate::error::ProxyError;

/// A pooled client for one upstream origin.
#[derive(Debug, Clone)]
pub struct UpstreamClient {
    client: Client<HttpsConnector<HttpConnector>, ProxyBody>,
    scheme: Scheme,
    authority: Authority,
}

impl UpstreamClient {
    /// A client with a keep-alive pool to `upstream`.
    pub fn new(upstream: &Upstream) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        connector.enforce_http(false);
        // A plain-http upstream never uses the TLS config; an empty root store keeps it
        // from trusting anything by accident.
        let tls = upstream.tls.as_deref().cloned().unwrap_or_else(|| {
            rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        });
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256)
            // The Host header is the client's, set by headers::prepare_request.
            .set_host(false)
            .build(connector);
        Self {
            client,
            scheme: upstream.scheme.clone(),
            authority: upstream.authority.clone(),
        }
    }

    /// The URI of `path_and_query` at the upstream. Reuses the parsed path (a cheap
    /// reference-counted clone) instead of formatting and re-parsing it.
    pub fn uri_for(&self, path_and_query: Option<&PathAndQuery>) -> Result<Uri, ProxyError> {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(
            path_and_query
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
        );
        Uri::from_parts(parts).map_err(|e| ProxyError::BadRequest(e.to_string()))
    }

    /// Turns a client request head into the upstream's: URI pointed at the upstream,
    /// headers cleaned and `X-Forwarded-*` added, HTTP/1.1 on the upstream side.
    pub fn prepare(
        &self,
        parts: &mut http::request::Parts,
        conn: &super::Connection,
        upgrade: bool,
    ) -> Result<(), ProxyError> {
        let uri = self.uri_for(parts.uri.path_and_query())?;
        super::headers::prepare_request(
            &mut parts.headers,
            parts.uri.authority(),
            conn.peer.ip(),
            conn.proto(),
            upgrade,
        );
        parts.uri = uri;
        parts.version = http::Version::HTTP_11;
        Ok(())
    }

    /// Sends a request and waits at most `timeout` for the response head.
    pub async fn send(
        &self,
        request: Request<ProxyBody>,
        timeout: Duration,
    ) -> Result<Response<Incoming>, ProxyError> {
        match tokio::time::timeout(timeout, self.client.request(request)).await {
            Err(_) => Err(ProxyError::UpstreamTimeout),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, source = ?std::error::Error::source(&e), "upstream request failed");
                Err(ProxyError::UpstreamUnreachable(e.to_string()))
            }
            Ok(Ok(response)) => Ok(response),
        }
    }
}
