//! `idemgate explain`: what the running proxy would do with one request — the normalised
//! path it is routed by, matched route, key source, the host and the identity that scope the
//! key (which parts, never their values), the canonical input (and what was left out of it), how long the key
//! lives, and the digest, which is the very key the proxy stores.

use std::fmt::Write as _;
use std::net::IpAddr;

use http::{HeaderMap, Method, Uri};

use crate::config::units::format_duration;
use crate::config::{Admin, Config, Protection};
use crate::error::ProxyError;
use crate::key::{derive_key, Derived, Digest, KeySource, RequestView, Trace};
use crate::route::Overrides;

/// One request to explain.
#[derive(Debug, Clone)]
pub struct Request {
    /// Method.
    pub method: Method,
    /// Path with optional query, e.g. `/api/orders?x=1`.
    pub uri: Uri,
    /// Headers (including `Host` if routes match on host).
    pub headers: HeaderMap,
    /// Body bytes.
    pub body: Vec<u8>,
    /// The TCP peer's address (`--client-ip`), for the client address a key is scoped
    /// by; `trusted_proxies` and `X-Forwarded-For` among `headers` apply as in the proxy.
    pub client_ip: Option<IpAddr>,
    /// The SHA-256 of the client certificate the request's TLS connection verified
    /// (`--client-cert`), part of the default caller and of `scope: [client_cert]`.
    pub client_cert: Option<Digest>,
}

/// Renders the explanation as text; `Err` when the proxy would refuse the request (a 400, or
/// the 501 of `CONNECT`).
pub fn explain(config: &Config, request: &Request) -> Result<String, ProxyError> {
    explain_key(config, request).map(|(text, _)| text)
}

/// [`explain`], and the key the proxy would claim, if any (to look it up in the running
/// proxy with [`look_up`]).
pub fn explain_key(
    config: &Config,
    request: &Request,
) -> Result<(String, Option<Digest>), ProxyError> {
    // As the proxy does, by the proxy's own steps: the path put in its normal form, the
    // request refused where the proxy refuses it before routing (two `Host`s, one that is
    // not a host, `POST *`, …), then routed by the target's authority, which becomes its
    // `Host`. A request given no `Host` is taken for one that need not have it (HTTP/2),
    // so the route and key can still be shown.
    let mut head = http::Request::new(());
    *head.method_mut() = request.method.clone();
    *head.uri_mut() = request.uri.clone();
    *head.headers_mut() = request.headers.clone();
    let has_host =
        request.uri.authority().is_some() || request.headers.contains_key(http::header::HOST);
    *head.version_mut() = if has_host {
        http::Version::HTTP_11
    } else {
        http::Version::HTTP_2
    };
    let readings = crate::proxy::admission::normalize_target(&mut head)?;
    crate::proxy::admission::admit(&head)?;
    crate::proxy::admission::host_from_target(&mut head);
    let raw_path = request.uri.path();
    let headers = head.headers();
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok());
    let path = head.uri().path();
    // As the proxy does: the token endpoint, at its normalised path, answers before any
    // route is looked at.
    if let Some(issuer) = &config.tokens {
        if request.method == http::Method::POST && path == issuer.path {
            let text = format!(
                "route:             (token endpoint)\nprotection:        issues a one-time token bound to the caller, valid {} (no key, never forwarded)\n",
                crate::config::units::format_duration(issuer.ttl)
            );
            return Ok((text, None));
        }
    }
    let overrides = Overrides::find(headers);
    // Routed decoded, and refused, as the proxy does, where another reading moves it: an
    // escaped `:` as sent, a character only some decoders read.
    let (route, protection) = crate::proxy::admission::route(
        config,
        host,
        &request.method,
        headers,
        overrides,
        path,
        &readings,
    )?;
    let mut out = String::new();
    if path != raw_path {
        let _ = writeln!(
            out,
            "path:              {path} (normalised from {raw_path})"
        );
    }
    if let Some(decoded) = &readings.decoded {
        let by_decoded = config
            .route_for(host, &request.method, headers, overrides, decoded)
            .0;
        let _ = match by_decoded == route {
            true => writeln!(
                out,
                "routed as:         {decoded} (escapes of sub-delimiters, ':' and '@' decoded, as most upstreams route)"
            ),
            // `admission::route` ran it under the fallback: the decoded route enforces
            // nothing, and Express runs it as sent, unrouted.
            false => writeln!(
                out,
                "routed as:         {path} as sent (read decoded, {decoded} is route {by_decoded}, which enforces nothing; as sent, as Express routes it, it is no route's)"
            ),
        };
    }
    let route_shown = if route.is_empty() { "(none)" } else { route };
    let _ = writeln!(out, "route:             {route_shown}");
    let rule = match protection {
        Protection::Off(_) => {
            let _ = writeln!(out, "protection:        off (streamed through unprotected)");
            return Ok((out, None));
        }
        Protection::On(rule) => rule,
    };
    let source = match &rule.key.source {
        KeySource::Header(name) => format!("header {name}"),
        KeySource::Fields(pointers) => format!(
            "fields {}",
            pointers
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        KeySource::Token(t) => format!("one-time token in {}", t.header),
        KeySource::Fingerprint(fp) => {
            format!("fingerprint (query: {}, body: {})", fp.query, fp.body)
        }
    };
    let mode = if rule.policy.observe {
        "observe (forwarded unchanged; what enforcing would do is counted)"
    } else {
        "on"
    };
    let _ = writeln!(out, "protection:        {mode}");
    let _ = writeln!(
        out,
        "key source:        {source} (required: {})",
        rule.key.required
    );
    let view = RequestView {
        route: &rule.route,
        method: &request.method,
        path,
        query: request.uri.query(),
        headers,
        overrides,
        peer: request.client_ip,
        identity: &rule.identity,
        client_cert: request.client_cert.as_ref().map(|d| &d.0[..]),
        body: &request.body,
    };
    let mut trace = Trace::default();
    let derived = match derive_key(&rule.key, &view, Some(&mut trace)) {
        Ok(derived) => derived,
        // As the proxy does: observe forwards what enforcement would refuse, and counts it.
        Err(e) if rule.policy.observe => {
            let _ = writeln!(
                out,
                "key digest:        (none: {e}; enforcing would answer 400, observe forwards it unchanged, counted as would_reject)"
            );
            return Ok((out, None));
        }
        Err(e) => return Err(ProxyError::from(e)),
    };
    let host_shown = match host {
        Some(h) => crate::route::host_name(h).to_ascii_lowercase(),
        None => "(none; the proxy's key has the client's Host: give -H 'Host: …')".to_owned(),
    };
    let _ = writeln!(out, "host:              {host_shown}");
    let _ = writeln!(out, "scope:             {}", trace.scope.join(", "));
    let _ = writeln!(out, "key material:      {}", trace.material);
    if !trace.fingerprint_input.is_empty() {
        let _ = writeln!(out, "payload input:     {}", trace.fingerprint_input);
    }
    let ignored = if trace.ignored.is_empty() {
        "(nothing)".to_owned()
    } else {
        trace.ignored.join(", ")
    };
    let _ = writeln!(out, "ignored:           {ignored}");
    let window = match rule.key.source {
        KeySource::Fingerprint(_) => " (a fingerprint: a short window against double submits)",
        _ => "",
    };
    let _ = writeln!(
        out,
        "ttl:               {}{window}",
        format_duration(rule.policy.ttl)
    );
    match derived {
        Derived::Key(d) => {
            let _ = writeln!(out, "key digest:        {}", d.key);
            if d.fingerprint != crate::key::Digest::NONE {
                let _ = writeln!(out, "payload digest:    {}", d.fingerprint);
            }
            if trace.address_unknown {
                let _ = writeln!(
                    out,
                    "note:              the key holds the client address and this digest assumes no client address, which the proxy always has: pass --client-ip for the key it stores"
                );
            }
        }
        Derived::Unkeyed => {
            let _ = writeln!(
                out,
                "key digest:        (no key: passed through unprotected)"
            );
        }
        Derived::CallerUnnamed => {
            let _ = writeln!(
                out,
                "key digest:        (no key: the caller is unnamed, a trusted proxy's X-Forwarded-For names no client address for the key to hold; passed through unprotected, counted as caller_unknown)"
            );
        }
    }
    Ok((out, derived.key().map(|d| d.key)))
}

/// What the running proxy's admin API (`GET /keys/{digest}`) says of `key`, as lines for
/// `idemgate explain`: its state and, for a key seen on an observed route, how many times
/// it was seen and when last. An admin that does not answer is said so, not an error.
pub async fn look_up(admin: &Admin, key: &Digest) -> String {
    match get_key(admin, key).await {
        Ok(None) => "in the store:      nothing (not seen, or expired)\n".into(),
        Ok(Some(doc)) => describe_record(&doc),
        Err(e) => format!(
            "in the store:      (the admin API at {} did not answer: {e})\n",
            admin.listen
        ),
    }
}

/// Lines for a record as the admin API shows it.
fn describe_record(doc: &serde_json::Value) -> String {
    let at = |secs: &serde_json::Value| {
        secs.as_u64()
            .map(|s| {
                httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s))
            })
            .unwrap_or_else(|| "?".into())
    };
    let mut out = String::new();
    let state = doc["state"].as_str().unwrap_or("?");
    let _ = writeln!(
        out,
        "in the store:      {state} since {}, until {}",
        at(&doc["created"]),
        at(&doc["expires"])
    );
    if let Some(status) = doc["status"].as_u64() {
        let _ = writeln!(out, "stored status:     {status}");
    }
    let seen = &doc["seen"];
    if let Some(times) = seen["times"].as_u64() {
        let _ = writeln!(
            out,
            "seen:              {times} times, last at {}",
            at(&seen["last"])
        );
    }
    out
}

/// One admin request over HTTP/1.1 (hyper's client), bounded to a few seconds.
async fn get_key(admin: &Admin, key: &Digest) -> Result<Option<serde_json::Value>, String> {
    use http_body_util::BodyExt;
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(admin.listen)
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let mut request = http::Request::get(format!("/keys/{key}"))
            .header(http::header::HOST, admin.listen.to_string());
        if let Some(token) = &admin.token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        match status {
            http::StatusCode::NOT_FOUND => Ok(None),
            http::StatusCode::OK => serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| e.to_string()),
            other => Err(format!("{other}")),
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), exchange)
        .await
        .unwrap_or_else(|_| Err("no answer within 5 s".into()))
}
