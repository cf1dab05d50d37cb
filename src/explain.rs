//! `idemgate explain`: what the running proxy would do with one request — matched route,
//! key source, scope parts, the canonical input (and what was left out of it) and the
//! digest, which is the very key the proxy stores.

use std::fmt::Write as _;
use std::net::IpAddr;

use http::{HeaderMap, Method, Uri};

use crate::config::{Config, Protection};
use crate::key::{derive_key, KeyError, KeySource, RequestView, Trace};

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
    /// Peer address, for `client_ip` scopes.
    pub client_ip: Option<IpAddr>,
}

/// Renders the explanation as text; `Err` when the proxy would answer 400.
pub fn explain(config: &Config, request: &Request) -> Result<String, KeyError> {
    let host = request
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok());
    let path = request.uri.path();
    let (route, protection) = config.protection_for(host, &request.method, path);
    let mut out = String::new();
    let route_shown = if route.is_empty() { "(none)" } else { route };
    let _ = writeln!(out, "route:             {route_shown}");
    let rule = match protection {
        Protection::Off => {
            let _ = writeln!(out, "protection:        off (streamed through unprotected)");
            return Ok(out);
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
    let _ = writeln!(out, "protection:        on");
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
        headers: &request.headers,
        client_ip: request.client_ip,
        client_cert: None,
        body: &request.body,
    };
    let mut trace = Trace::default();
    let derived = derive_key(&rule.key, &view, Some(&mut trace))?;
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
    match derived {
        Some(d) => {
            let _ = writeln!(out, "key digest:        {}", d.key);
            if d.fingerprint != crate::key::Digest::NONE {
                let _ = writeln!(out, "payload digest:    {}", d.fingerprint);
            }
        }
        None => {
            let _ = writeln!(
                out,
                "key digest:        (no key: passed through unprotected)"
            );
        }
    }
    Ok(out)
}
