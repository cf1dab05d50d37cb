//! The request entry point: normalise the path, match the route, take the passthrough or
//! protected path, count
//! and log the outcome, and turn any [`crate::error::ProxyError`] into its problem+json answer
//! here, once.
//! hyper never sees an error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http::{header, HeaderValue, Method, Request, Response, Version};
use tracing::Instrument;

use super::admission;
use super::body::ProxyBody;
use super::budget::Budget;
use super::observe;
use super::passthrough;
use super::previous::Generations;
use super::protected::{self, Owners, Report};
use super::stopping::Stopping;
use super::upstream::UpstreamClient;
use crate::config::{Config, Protection};
use crate::error::ProxyError;
use crate::metrics::{Metrics, Outcome, RouteMetrics};
use crate::route::Overrides;
use crate::store::Store;

/// The part of the proxy a reload replaces: routes, policies and the upstream pool.
#[derive(Debug)]
struct Live {
    config: Arc<Config>,
    client: UpstreamClient,
    /// The configs before reloads that re-keyed requests, whose keys are still honoured.
    previous: Generations,
}

/// Everything a request needs, shared by all connections.
#[derive(Debug, Clone)]
pub struct Proxy {
    live: Arc<ArcSwap<Live>>,
    store: Store,
    metrics: Arc<Metrics>,
    owners: Arc<Owners>,
    stopping: Arc<Stopping>,
    /// What all requests together may buffer (`connections.max_buffered`).
    budget: Arc<Budget>,
    body_read_timeout: Duration,
    idle_timeout: Duration,
}

/// What a reload changed in how keys are made.
#[derive(Debug, Clone, Default)]
pub struct Reloaded {
    /// Why requests get new keys, one entry a route or setting ([`Config::rekeyed_by`]).
    pub rekeyed: Vec<String>,
    /// Until when the keys of the config before it are honoured, when it re-keyed.
    pub honoured_until: Option<std::time::SystemTime>,
}

/// How long a client may send nothing while a protected request's body is incomplete
/// (nginx's `client_body_timeout` default).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a kept-alive HTTP/1.1 connection may sit between requests before it is closed
/// (the time hyper gives a request head; nginx's `keepalive_timeout` is 75 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

impl Proxy {
    /// A proxy serving `config` with `store`.
    pub fn new(config: Arc<Config>, store: Store, metrics: Arc<Metrics>) -> Self {
        let client = UpstreamClient::new(&config.upstream, &config.connections, &metrics);
        let owners = Arc::new(Owners::default());
        let c = &config.connections;
        let budget = Budget::new(
            c.max_buffered,
            c.max_buffered_per_connection,
            metrics.buffers(),
        );
        store.keep_retried_answers_in(Arc::new(super::budget::RetriedAnswers::new(&budget)));
        Self {
            live: Arc::new(ArcSwap::from_pointee(Live {
                config,
                client,
                previous: Generations::default(),
            })),
            store,
            metrics,
            owners,
            stopping: Arc::default(),
            budget,
            body_read_timeout: BODY_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
        }
    }

    /// With another body read timeout than [`BODY_READ_TIMEOUT`] (for embedding and tests).
    pub fn with_body_read_timeout(mut self, gap: Duration) -> Self {
        self.body_read_timeout = gap;
        self
    }

    /// With another idle timeout than [`IDLE_TIMEOUT`] (for embedding and tests).
    pub fn with_idle_timeout(mut self, idle: Duration) -> Self {
        self.idle_timeout = idle;
        self
    }

    /// How long a kept-alive connection may sit between requests.
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }

    /// The keys this process owns right now.
    pub fn owners(&self) -> &Arc<Owners> {
        &self.owners
    }

    /// When a shutdown must have answered the requests held waiting (duplicates, and the
    /// clients of owners still waiting upstream); the proxy's listener starts it with the
    /// drain.
    pub fn stopping(&self) -> &Stopping {
        &self.stopping
    }

    /// The store in use.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// What all requests together may buffer.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The config requests are served with now.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.live.load().config)
    }

    /// Swaps in a new config atomically: requests already running finish with the old one,
    /// new requests see the new one, no connection is dropped. The store is not replaced
    /// (a different `store:` needs a restart), nor whether the port speaks TLS: a config
    /// that adds or drops `tls` keeps the running TLS settings (none, or the last
    /// certificates) until a restart, since switching it would turn away every client of
    /// the port at once. A new `connections.max_buffered` (and
    /// `max_buffered_per_connection`) applies to buffers taken from now on.
    ///
    /// A config that changes how keys are made ([`Config::rekeyed_by`]) keeps the one
    /// before it as a previous generation (`super::previous`), whose keys every protected
    /// request also claims until its records have expired: retries and duplicates of the
    /// requests it keyed are answered from them, never run again.
    pub fn reload(&self, config: Arc<Config>) -> Reloaded {
        let current = self.live.load();
        let config = if config.tls.is_some() == current.config.tls.is_some() {
            config
        } else {
            let mut kept = Config::clone(&config);
            kept.tls = current.config.tls.clone();
            kept.client_ca = current.config.client_ca;
            Arc::new(kept)
        };
        let (old, new) = (&current.config.upstream, &config.upstream);
        let c = &config.connections;
        self.budget
            .set_limit(c.max_buffered, c.max_buffered_per_connection);
        // The budget and the tunnels' timeout are no part of the upstream pool.
        let pool = |c: &Config| crate::config::Connections {
            max_buffered: 0,
            max_buffered_per_connection: 0,
            tunnel_idle_timeout: Duration::ZERO,
            ..c.connections
        };
        // A TLS upstream's roots are read again on reload: new connections for it then.
        let client = if old.scheme == new.scheme
            && old.authority == new.authority
            && old.tls.is_none()
            && new.tls.is_none()
            && pool(&current.config) == pool(&config)
        {
            current.client.clone()
        } else {
            UpstreamClient::new(&config.upstream, &config.connections, &self.metrics)
        };
        let rekeyed = current.config.rekeyed_by(&config);
        let (previous, honoured_until) = current
            .previous
            .after_reload(&current.config, !rekeyed.is_empty());
        self.live.store(Arc::new(Live {
            config,
            client,
            previous,
        }));
        Reloaded {
            rekeyed,
            honoured_until,
        }
    }

    /// Answers one request. Never fails: errors become problem+json answers.
    ///
    /// It runs in a `request` span with its method, and once known its route and its key's
    /// prefix, so every log line it causes carries them (an owner that runs on detached
    /// keeps the span).
    pub async fn handle(
        &self,
        request: Request<super::body::RequestBody>,
        conn: &super::ConnInfo,
    ) -> Response<ProxyBody> {
        let span = tracing::info_span!(
            "request",
            method = %request.method(),
            route = tracing::field::Empty,
            key = tracing::field::Empty,
        );
        self.handle_in_span(request, conn).instrument(span).await
    }

    async fn handle_in_span(
        &self,
        request: Request<super::body::RequestBody>,
        conn: &super::ConnInfo,
    ) -> Response<ProxyBody> {
        // What the access log needs, taken here so its duration covers the whole request;
        // without an access log neither the clock nor the path is read.
        let access = tracing::enabled!(target: "access", tracing::Level::INFO)
            .then(|| (Instant::now(), request.uri().path().to_owned()));
        let version = request.version();
        let live = self.live.load_full();
        let mut request = request;
        // Routed and forwarded in its one normal form: no spelling of a path steps around
        // a route. A path with an escaped `:` or sub-delimiter is routed decoded, and one
        // with a character only some decoders read as they read it too (`readings`), each
        // refused where another reading is another route; the readings end in this block,
        // so no request's future holds them across an await.
        let routed = {
            let readings = match admission::normalize_target(&mut request) {
                Ok(readings) => readings,
                Err(error) => {
                    let method = request.method().clone();
                    let metrics = self.metrics.route("");
                    let report = Report::default();
                    return finish("", &metrics, method, version, report, access, Err(error));
                }
            };
            admission::admit(&request).and_then(|host| {
                let (method, path) = (request.method(), request.uri().path());
                let headers = request.headers();
                let config = &live.config;
                // The method-override headers, looked for once and only where they count:
                // where one may route this request, then for a protected one's keys.
                let routed = config.routes_by_override(method);
                let mut overrides = Overrides::NONE;
                if routed {
                    overrides = Overrides::find(headers);
                }
                let (route, protection) =
                    admission::route(config, host, method, headers, overrides, path, &readings)?;
                let older = match protection {
                    Protection::On(rule) => {
                        if !routed {
                            overrides = Overrides::find(headers);
                        }
                        // Older configs route it as this one does, each reading checked:
                        // the one it runs under may be another's there.
                        live.previous.rules_for(rule, |old| {
                            let found = admission::route(
                                old, host, method, headers, overrides, path, &readings,
                            );
                            found.ok().map(|(_, protection)| protection)
                        })
                    }
                    Protection::Off(_) => Vec::new(),
                };
                Ok((route, protection, older, overrides))
            })
        };
        let (route, protection, older, overrides) = match routed {
            Ok(routed) => routed,
            // Answered, counted (unrouted) and logged like any other error, before any
            // await: an error kept across them would grow every request's future.
            Err(error) => {
                let method = request.method().clone();
                let metrics = self.metrics.route("");
                let report = Report::default();
                return finish("", &metrics, method, version, report, access, Err(error));
            }
        };
        admission::host_from_target(&mut request);
        if let Some(issuer) = &live.config.tokens {
            if request.method() == http::Method::POST && request.uri().path() == issuer.path {
                let mut response =
                    match super::tokens::issue(&self.store, issuer, &request, conn).await {
                        Ok(response) => response,
                        Err(error) => error.into_response(),
                    };
                // The endpoint reads no body: one sent ends the connection, as for any
                // answer given before its request's body was read (`leaves_body_unread`).
                if !request.body().is_empty() && version < Version::HTTP_2 {
                    let close = HeaderValue::from_static("close");
                    response.headers_mut().insert(header::CONNECTION, close);
                }
                tracing::info!(target: "access", status = response.status().as_u16(), "token request");
                return response;
            }
        }
        let shown = if route.is_empty() { "-" } else { route };
        tracing::Span::current().record("route", tracing::field::display(shown));
        let route_metrics = self.metrics.route(route);
        let method = request.method().clone();
        let mut report = Report::default();
        // Per request, by the config serving it: a reload that stops trusting a peer
        // applies on its open connections. Without trusted proxies, no lookup at all.
        let proxies = &live.config.identity.trusted_proxies;
        let trusted_peer = !proxies.is_empty() && proxies.contains(conn.peer.ip());
        let result = match protection {
            Protection::Off(head) => {
                report.outcome = Some(Outcome::Passthrough);
                let started = Instant::now();
                let timeouts = passthrough::Timeouts {
                    head: head.unwrap_or(live.config.passthrough_timeout),
                    client_gap: self.body_read_timeout,
                    upstream_gap: live.config.connections.upstream_read_timeout,
                    tunnel_idle: live.config.connections.tunnel_idle_timeout,
                };
                let result = passthrough::forward(
                    &live.client,
                    request,
                    conn,
                    trusted_peer,
                    timeouts,
                    &self.stopping,
                )
                .await;
                route_metrics.upstream_latency(started.elapsed());
                result
            }
            Protection::On(rule) => {
                // Filled once the head's own refusals are past (`protected::handle`), and
                // held until the answer is handed on (see `super::budget`).
                let head = self.budget.head_charge(conn.share.buffers());
                let cx = protected::Context {
                    store: &self.store,
                    client: &live.client,
                    conn,
                    trusted_peer,
                    metrics: &self.metrics,
                    route_metrics: &route_metrics,
                    owners: &self.owners,
                    stopping: &self.stopping,
                    body_read_timeout: self.body_read_timeout,
                    budget: &self.budget,
                    head: &head,
                    older: &older,
                    overrides,
                };
                if rule.policy.observe {
                    observe::handle(cx, rule, request, &mut report).await
                } else {
                    protected::handle(cx, rule, request, &mut report).await
                }
            }
        };
        finish(
            route,
            &route_metrics,
            method,
            version,
            report,
            access,
            result,
        )
    }
}

/// A request's answer: an error turned into its problem+json (closing an HTTP/1
/// connection when the request's body may be unread), the outcome counted, the access line
/// written (`access`: when it started and its path, if that log is on).
fn finish(
    route: &str,
    route_metrics: &RouteMetrics,
    method: Method,
    version: Version,
    mut report: Report,
    access: Option<(Instant, String)>,
    result: Result<Response<ProxyBody>, ProxyError>,
) -> Response<ProxyBody> {
    let (response, problem) = match result {
        Ok(response) => (response, None),
        Err(error) => {
            let kind = error.as_str();
            if report.outcome.is_none() {
                report.outcome = Some(error.outcome());
            }
            if error.is_fault() {
                tracing::warn!(route, problem = kind, %error, "proxy error");
            }
            let closes =
                (error.leaves_body_unread() || report.body_unread) && version < Version::HTTP_2;
            let mut response = error.into_response();
            if closes {
                let close = HeaderValue::from_static("close");
                response.headers_mut().insert(header::CONNECTION, close);
            }
            (response, Some(kind))
        }
    };
    let outcome = report.outcome.unwrap_or(Outcome::Passthrough);
    route_metrics.count(outcome);
    if let Some((started, path)) = access {
        let key = report.key.map(|k| k.short());
        tracing::info!(
            target: "access",
            %method,
            path,
            route = %if route.is_empty() { "-" } else { route },
            outcome = %outcome.as_str(),
            key = %key.as_deref().unwrap_or("-"),
            status = response.status().as_u16(),
            problem = %problem.unwrap_or("-"),
            micros = started.elapsed().as_micros() as u64,
            "request"
        );
    }
    response
}
