//! The connection to the application: a keep-alive [`pool`] of hyper's HTTP/1.1 client
//! connections, or of HTTP/2 ones (`connections.upstream_protocol: http2`, [`pool::h2`]),
//! or of the hand-written HTTP/1.1 client's (`connections.upstream_http1: idemgate`,
//! [`http1`], opt-in),
//! TLS for `https://` upstreams, requests rewritten to origin form
//! ([`request`]), and failures classified by whether the request may have reached the
//! upstream: only one that provably never went out is [`ProxyError::UpstreamUnreachable`]
//! (its key may be released); anything after that is [`ProxyError::UpstreamFailed`] or
//! [`ProxyError::UpstreamTimeout`].

mod bodiless;
mod connector;
pub(crate) mod http1;
mod pool;
mod request;
#[cfg(test)]
mod test_upstream;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::Scheme;
use http::{HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;

use super::body::{BodyError, ProxyBody, ReadGap};
use super::headers::Forwarding;
pub use super::headers::Hop;
use crate::config::{Connections, Upstream, UpstreamHttp1, UpstreamProtocol};
use crate::error::ProxyError;
use crate::metrics::{Handoff, Metrics};

/// The connections of one protocol.
#[derive(Debug, Clone)]
enum Pools {
    Http1(Arc<pool::Pool>),
    Http2(Arc<pool::h2::Pool>),
    /// The hand-written client's, and hyper's for the requests it hands over.
    Own(Arc<OwnPools>),
}

/// The pools of `connections.upstream_http1: idemgate`, under one cap.
#[derive(Debug)]
struct OwnPools {
    own: Arc<pool::Pool<http1::Own>>,
    /// For protocol upgrades, which hyper's client carries.
    hyper: Arc<pool::Pool>,
    metrics: Arc<Metrics>,
}

impl OwnPools {
    /// hyper's pool, for an upgrade. The two pools share the cap, and neither can take the
    /// other's idle connections: at the cap with none of hyper's idle, the hand-written
    /// client's oldest idle connection is closed, or the upgrade would wait for it to reach
    /// `upstream_idle_timeout`. (If every connection is busy it waits as any request does.)
    fn for_upgrade(&self) -> &Arc<pool::Pool> {
        if self.hyper.would_wait() {
            self.own.close_oldest_idle();
        }
        &self.hyper
    }
}

/// A pooled client for one upstream origin.
#[derive(Debug, Clone)]
pub struct UpstreamClient {
    pool: Pools,
    /// `http` or `https`: HTTP/2's `:scheme`.
    scheme: Scheme,
    /// `host[:port]`, the `Host` of requests that arrive without one (HTTP/1.0).
    host: Option<HeaderValue>,
    /// `connections.upstream_read_timeout`, which its answers' bodies carry ([`ReadGap`]).
    read_gap: Duration,
}

impl UpstreamClient {
    /// A client with a keep-alive pool of at most `connections.max_upstream` connections
    /// to `upstream`, each closed after `connections.upstream_idle_timeout` idle.
    pub fn new(upstream: &Upstream, connections: &Connections, metrics: &Arc<Metrics>) -> Self {
        let authority = &upstream.authority;
        let https = upstream.scheme == Scheme::HTTPS;
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = https.then(|| {
            upstream.tls.clone().unwrap_or_else(|| {
                // Config loading always sets roots for https; never trust nothing by accident.
                Arc::new(
                    rustls::ClientConfig::builder()
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth(),
                )
            })
        });
        let h2 = connections.upstream_protocol == UpstreamProtocol::Http2;
        let connector = connector::Connector::new(authority.host(), port, tls, h2);
        let (max, idle) = (connections.max_upstream, connections.upstream_idle_timeout);
        let metrics = Arc::clone(metrics);
        let pool = if h2 {
            Pools::Http2(Arc::new(pool::h2::Pool::new(connector, max, idle, metrics)))
        } else if connections.upstream_http1 == UpstreamHttp1::Idemgate {
            // One cap for both pools: `max_upstream` counts every connection.
            let slots = pool::slots(max);
            let hyper_connector = connector.clone();
            Pools::Own(Arc::new(OwnPools {
                own: Arc::new(pool::Pool::with(
                    http1::Own,
                    connector,
                    Arc::clone(&slots),
                    idle,
                    Arc::clone(&metrics),
                )),
                hyper: Arc::new(pool::Pool::with(
                    pool::Hyper::default(),
                    hyper_connector,
                    slots,
                    idle,
                    Arc::clone(&metrics),
                )),
                metrics,
            }))
        } else {
            Pools::Http1(Arc::new(pool::Pool::new(connector, max, idle, metrics)))
        };
        Self {
            pool,
            scheme: upstream.scheme.clone(),
            host: HeaderValue::from_str(authority.as_str()).ok(),
            read_gap: connections.upstream_read_timeout,
        }
    }

    /// Sends a client's request on to the upstream and waits until `deadline` for the
    /// answer head. The request goes out in origin form with its fields cleaned and
    /// `X-Forwarded-*` added ([`request::prepare`]); `hop` says whether it forwards a
    /// protocol switch and whether its peer is a trusted proxy.
    /// The answer's body hands the connection back to the pool once read to its end and
    /// once the request went out whole (the upstream may answer before it read it).
    ///
    /// A deadline that passes before the request was handed to a connection (still
    /// waiting for one, or connecting) is [`ProxyError::UpstreamUnreachable`]: nothing was
    /// sent. After that it is [`ProxyError::UpstreamTimeout`].
    pub async fn send(
        &self,
        request: Request<ProxyBody>,
        conn: &super::ConnInfo,
        hop: Hop,
        deadline: Instant,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        let sending = AtomicBool::new(false);
        conn.upstream_timer
            .timeout_at(deadline, self.send_untimed(request, conn, hop, &sending))
            .await
            .unwrap_or_else(|| Err(timed_out(&sending)))
    }

    /// [`UpstreamClient::send`] without a deadline; sets `sending` once the request was
    /// handed to a connection (from then on it may have gone out).
    pub async fn send_untimed(
        &self,
        request: Request<ProxyBody>,
        conn: &super::ConnInfo,
        hop: Hop,
        sending: &AtomicBool,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        let upgrade = hop.upgrade;
        let forwarding = Forwarding {
            client_ip: &conn.forwarded_for,
            proto: conn.proto(),
            hop,
        };
        let (mut parts, body) = request.into_parts();
        let method = parts.method.clone();
        // HTTP/2 clients name the host in `:authority`; an HTTP/1.0 client may name none,
        // and then the upstream's own is sent.
        let authority = parts.uri.authority().cloned();
        // Whether the proxy asked for trailers as its client did: to an HTTP/2 upstream,
        // `TE: trailers` goes without its `Connection` (RFC 9113 §8.2.2).
        let te_trailers = request::prepare(&mut parts, &body, &forwarding, || {
            authority
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
                .or_else(|| self.host.clone())
        });
        // `handed_over`: an upgrade the hand-written client gave to hyper's pool.
        let (pool, handed_over) = match &self.pool {
            Pools::Http1(pool) => (pool, false),
            Pools::Own(pools) if upgrade => {
                pools
                    .metrics
                    .connections()
                    .upstream_http1_handoff(Handoff::Upgrade);
                (pools.for_upgrade(), true)
            }
            Pools::Own(pools) => {
                // Boxed, as HTTP/2's below.
                let sent = Box::pin(http1::send(&pools.own, parts, body, sending, self.read_gap));
                return sent.await.map(|response| {
                    response.map(|body| UpstreamBody {
                        body: Held::Own(body),
                        read_gap: self.read_gap,
                    })
                });
            }
            Pools::Http2(pool) => {
                if upgrade {
                    return Err(ProxyError::NotImplemented(
                        "protocol upgrades (WebSocket) to an HTTP/2 upstream",
                    ));
                }
                request::to_http2(&mut parts, &self.scheme, te_trailers)
                    .map_err(ProxyError::BadRequest)?;
                let resend = Resend::of(&parts, &body);
                // hyper's HTTP/2 client resets the stream on a body error and reports the
                // reset, not the error: the watcher keeps it, to answer as HTTP/1.1 does.
                let client_failed = Arc::new(std::sync::Mutex::new(None));
                let body = if body.is_end_stream() {
                    body
                } else {
                    ProxyBody::boxed(Watched {
                        inner: body,
                        failed: Arc::clone(&client_failed),
                    })
                };
                let request = Request::from_parts(parts, body);
                // Boxed: held inline, the HTTP/2 exchange's state would grow the future
                // of every HTTP/1.1 request too, and with it what each poll copies.
                let result = Box::pin(self.send_h2(pool, request, resend, method, sending)).await;
                return match (result, crate::sync::lock(&client_failed).take()) {
                    (Err(ProxyError::UpstreamFailed(_)), Some(client)) => Err(client),
                    (result, _) => result,
                };
            }
        };
        let authenticates = request::authenticates_connection(&parts.headers);
        let mut request = Request::from_parts(parts, body);
        loop {
            let mut checkout = pool.checkout().await?;
            if checkout.conn.sender().ready().await.is_err() {
                // Closed before it took the request: nothing was sent on it.
                if checkout.reused {
                    continue;
                }
                return Err(ProxyError::UpstreamUnreachable(
                    "the upstream closed a new connection".into(),
                ));
            }
            sending.store(true, Ordering::Relaxed);
            let sent = checkout.conn.sender().try_send_request(request).await;
            let response = match sent {
                Ok(response) => response,
                Err(mut e) => match e.take_message() {
                    // hyper gave the request back untouched: not a byte of it went out, so
                    // it may go out on another connection (this one the upstream closed
                    // while it sat idle).
                    Some(unsent) if checkout.reused => {
                        sending.store(false, Ordering::Relaxed);
                        request = unsent;
                        continue;
                    }
                    Some(_) => {
                        tracing::warn!(error = %e.error(), "upstream request not sent");
                        return Err(ProxyError::UpstreamUnreachable(e.error().to_string()));
                    }
                    None => return Err(failed(e.into_error())),
                },
            };
            let (mut head, incoming) = response.into_parts();
            if let Err(why) =
                request::check_answer(&method, head.status, &mut head.headers, upgrade)
            {
                tracing::warn!(error = why, "upstream answer refused");
                return Err(ProxyError::UpstreamFailed(why.into()));
            }
            // A handed-over upgrade the upstream refused keeps no connection: idle in
            // hyper's pool, it would hold a slot under the cap that shares it with the
            // hand-written client's, whose requests cannot take it.
            // Nor does one whose request authenticated it (NTLM): the next request on it,
            // another caller's, would run as this one's user.
            let keep =
                request::keeps_alive(head.version, &head.headers) && !handed_over && !authenticates;
            let returning = keep.then(|| Arc::clone(pool));
            let body = pool::PooledBody::new(incoming, checkout.conn, returning, self.read_gap);
            return Ok(Response::from_parts(
                head,
                UpstreamBody {
                    body: Held::Http1(body),
                    read_gap: self.read_gap,
                },
            ));
        }
    }

    /// Sends `request` on a stream of an HTTP/2 connection. Only a request hyper gave back
    /// unsent, or one the upstream provably did not process ([`h2_refused`]), is
    /// [`ProxyError::UpstreamUnreachable`]. A refused one that `resend` can build again
    /// whole goes out once more, on another connection (Envoy's `refused-stream` retry):
    /// the upstream said it did not run it, typically a graceful GOAWAY during a deploy.
    async fn send_h2(
        &self,
        pool: &Arc<pool::h2::Pool>,
        mut request: Request<ProxyBody>,
        mut resend: Option<Resend>,
        method: http::Method,
        sending: &AtomicBool,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        loop {
            let stream = pool.checkout().await?;
            sending.store(true, Ordering::Relaxed);
            let sent = stream.sender().try_send_request(request).await;
            let response = match sent {
                Ok(response) => response,
                Err(mut e) => match e.take_message() {
                    // The connection's task ended before it took the request (hyper gives
                    // it back only then): not a byte of it went out.
                    Some(unsent) => {
                        pool.forget(&stream);
                        if stream.reused {
                            sending.store(false, Ordering::Relaxed);
                            request = unsent;
                            continue;
                        }
                        tracing::warn!(error = %e.error(), "upstream request not sent");
                        return Err(ProxyError::UpstreamUnreachable(e.error().to_string()));
                    }
                    None => {
                        let e = e.into_error();
                        let Some(refused) = h2_refused(&e) else {
                            return Err(failed(e));
                        };
                        // Not on the connection that refused it: one refusing streams
                        // (shutting down, over its own limit) would likely do it again.
                        pool.forget(&stream);
                        if let Some(again) = resend.take() {
                            tracing::info!(error = %refused, "upstream refused the stream; sending it again");
                            sending.store(false, Ordering::Relaxed);
                            request = again.request();
                            continue;
                        }
                        tracing::warn!(error = %refused, "upstream did not process the request");
                        return Err(ProxyError::UpstreamUnreachable(format!(
                            "the upstream refused the stream: {refused}"
                        )));
                    }
                },
            };
            let (mut head, incoming) = response.into_parts();
            if let Err(why) = request::check_answer(&method, head.status, &mut head.headers, false)
            {
                tracing::warn!(error = why, "upstream answer refused");
                return Err(ProxyError::UpstreamFailed(why.into()));
            }
            // DATA on an answer that ends at its head (a 204, say) is no part of it, but its
            // stream is read to its end: [`bodiless`] says why, and why the body waits.
            let body = if !request::bodiless(&method, head.status) {
                Held::Http2(incoming, Some(stream))
            } else if incoming.is_end_stream() {
                Held::Empty
            } else {
                Held::Drain(bodiless::Drain::new(incoming, stream, self.read_gap))
            };
            return Ok(Response::from_parts(
                head,
                UpstreamBody {
                    body,
                    read_gap: self.read_gap,
                },
            ));
        }
    }
}

/// Of a failed HTTP/2 exchange after hyper took the request, the server's refusal, if it
/// was one. RFC 9113 §8.7: a stream the server reset with `REFUSED_STREAM`, or one above
/// the last stream id of its GOAWAY (h2 fails exactly those, and requests made after it,
/// with the GOAWAY's error), was not processed. Anything else may have reached it.
fn h2_refused(e: &hyper::Error) -> Option<&h2::Error> {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<h2::Error>() {
            let refused = h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM);
            return (h2.is_remote() && (refused || h2.is_go_away())).then_some(h2);
        }
        source = cause.source();
    }
    None
}

/// What it takes to send an HTTP/2 request again whole: its head and a body known in full
/// (buffered, or none). A streamed body may be partly read by then and is never resent.
struct Resend {
    method: http::Method,
    uri: http::Uri,
    version: http::Version,
    headers: http::HeaderMap,
    body: Option<Bytes>,
}

impl Resend {
    /// The copy of a request ready for HTTP/2 (`parts`, `body`), if its body is known in
    /// full.
    fn of(parts: &http::request::Parts, body: &ProxyBody) -> Option<Self> {
        let body = match body {
            ProxyBody::Full { data } => data.clone(),
            // Nothing to read (no body at all, or `Content-Length: 0`).
            other if other.is_end_stream() => None,
            _ => return None,
        };
        Some(Self {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            headers: parts.headers.clone(),
            body,
        })
    }

    fn request(self) -> Request<ProxyBody> {
        let mut request = Request::new(self.body.map_or_else(ProxyBody::empty, ProxyBody::full));
        *request.method_mut() = self.method;
        *request.uri_mut() = self.uri;
        *request.version_mut() = self.version;
        *request.headers_mut() = self.headers;
        request
    }
}

/// The error of a deadline that passed: see [`UpstreamClient::send`].
pub fn timed_out(sending: &AtomicBool) -> ProxyError {
    if sending.load(Ordering::Relaxed) {
        ProxyError::UpstreamTimeout
    } else {
        ProxyError::UpstreamUnreachable("timed out before a connection took the request".into())
    }
}

/// A failed exchange after the request may have gone out: the client's body failed
/// (unreadable, or stalled), or else the upstream side did.
fn failed(e: hyper::Error) -> ProxyError {
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        if let Some(body) = cause.downcast_ref::<BodyError>() {
            return body_failed(body);
        }
        source = cause.source();
    }
    tracing::warn!(error = %e, "upstream request failed");
    ProxyError::UpstreamFailed(e.to_string())
}

/// A client's body on its way to an HTTP/2 upstream that keeps what its failure means.
struct Watched {
    inner: ProxyBody,
    failed: Arc<std::sync::Mutex<Option<ProxyError>>>,
}

impl Body for Watched {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Err(e))) = &polled {
            *crate::sync::lock(&this.failed) = Some(body_failed(e));
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

fn body_failed(e: &BodyError) -> ProxyError {
    match e {
        BodyError::ClientStalled(gap) => ProxyError::BodyTimeout(gap.as_secs()),
        BodyError::Client(_) => ProxyError::BodyRead(e.to_string()),
        _ => ProxyError::UpstreamFailed(e.to_string()),
    }
}

/// An upstream answer's body; at its end the connection goes back to the pool.
#[derive(Debug)]
pub struct UpstreamBody {
    body: Held,
    read_gap: Duration,
}

/// An answer's body with what it holds of its connection.
#[derive(Debug)]
enum Held {
    /// The HTTP/1.1 connection, handed back at the end.
    Http1(pool::PooledBody),
    /// The HTTP/2 stream, let go at the end (or on an error).
    Http2(hyper::body::Incoming, Option<pool::h2::Stream>),
    /// The hand-written client's connection, handed back at the end.
    Own(http1::body::AnswerBody),
    /// None: an HTTP/2 answer that ends at its head, its stream ended with it.
    Empty,
    /// None, but the stream of an HTTP/2 answer that ends at its head is read to its end.
    Drain(bodiless::Drain),
}

impl ReadGap for UpstreamBody {
    fn read_gap(&self) -> Option<Duration> {
        Some(self.read_gap)
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = match &mut self.get_mut().body {
            Held::Own(body) => return Pin::new(body).poll_frame(cx),
            Held::Empty => return Poll::Ready(None),
            Held::Drain(rest) => return rest.poll_end(cx),
            Held::Http1(body) => Pin::new(body).poll_frame(cx),
            Held::Http2(body, stream) => {
                let polled = Pin::new(&mut *body).poll_frame(cx);
                if matches!(polled, Poll::Ready(None | Some(Err(_)))) || body.is_end_stream() {
                    *stream = None;
                }
                // hyper ends the body of a stream reset with `NO_ERROR` as if it were
                // whole; only h2 knows whether `END_STREAM` came first (a reset after a
                // complete answer, which §8.1 allows, keeps it). Without it the answer
                // is cut short, and read whole it would be stored and replayed so.
                if matches!(polled, Poll::Ready(None)) && !body.is_end_stream() {
                    return Poll::Ready(Some(Err(BodyError::UpstreamCutShort)));
                }
                polled
            }
        };
        polled.map(|frame| frame.map(|r| r.map_err(BodyError::Upstream)))
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            Held::Http1(body) => body.is_end_stream(),
            Held::Http2(body, _) => body.is_end_stream(),
            Held::Own(body) => body.is_end_stream(),
            Held::Empty => true,
            Held::Drain(rest) => rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            Held::Http1(body) => body.size_hint(),
            Held::Http2(body, _) => body.size_hint(),
            Held::Own(body) => body.size_hint(),
            Held::Empty => SizeHint::with_exact(0),
            Held::Drain(rest) => rest.size_hint(),
        }
    }
}

/// The upstream connection after `101 Switching Protocols`.
pub type Upgraded = hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>;

impl UpstreamBody {
    /// The upstream side of a `101` answer, once its connection hands it over. The body of
    /// `response` (whose head said `101`) is held until then: dropping it ends the
    /// connection.
    pub async fn upgraded(mut response: Response<UpstreamBody>) -> Option<Upgraded> {
        let upgrade = hyper::upgrade::on(&mut response);
        let body = response.into_body();
        let upgraded = upgrade.await;
        drop(body);
        upgraded.ok().map(hyper_util::rt::TokioIo::new)
    }
}
