//! `upstream:` and `upstream_ca:` compiled into the [`Upstream`] origin requests are
//! forwarded to: an `http://` or `https://` origin without a path, and for `https` the
//! roots its certificate is checked against.

use std::path::Path;
use std::sync::Arc;

use http::uri::{Authority, Scheme};

use super::error::CompileError;

/// The upstream origin.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// Host and port.
    pub authority: Authority,
    /// For `https`: roots from `upstream_ca`, or the system's.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// The origin at `url`, with TLS roots from `ca` (relative to `base`) or the system's for
/// an `https://` one.
pub(super) fn compile_upstream(
    url: &str,
    ca: Option<&str>,
    base: &Path,
) -> Result<Upstream, CompileError> {
    let mut upstream = parse_upstream(url).map_err(|m| CompileError::new("upstream", m))?;
    if upstream.scheme == Scheme::HTTPS {
        let ca = ca.map(|p| base.join(p));
        let client = crate::tls::upstream_client_config(ca.as_deref())
            .map_err(|e| CompileError::new("upstream_ca", e.to_string()))?;
        upstream.tls = Some(Arc::new(client));
    } else if ca.is_some() {
        return Err(CompileError::new(
            "upstream_ca",
            "only an https:// upstream uses a CA",
        ));
    }
    Ok(upstream)
}

fn parse_upstream(text: &str) -> Result<Upstream, String> {
    // A malformed URL is named in the error, unless it may hold a password: errors are
    // printed and, on a reload, logged.
    let uri: http::Uri = text.parse().map_err(|e| match text.contains('@') {
        false => format!("{text:?} is not a URL: {e}"),
        true => format!("the upstream is not a URL: {e}"),
    })?;
    let scheme = uri
        .scheme()
        .cloned()
        .ok_or("the upstream needs a scheme: http://")?;
    if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
        return Err(format!("upstream scheme {scheme}: use http:// or https://"));
    }
    let authority = uri
        .authority()
        .cloned()
        .ok_or("the upstream needs a host")?;
    // Credentials in the URL are never sent as an `Authorization`: the clients' own goes
    // on. Accepted, they would be logged at every start and sent as the `Host` of a request
    // that names none (HTTP/1.0), which an application echoing its host hands back to the
    // client.
    if authority.as_str().contains('@') {
        return Err(
            "the upstream URL carries credentials (user:password@), which idemgate \
             never sends and would show in its logs: remove them; each client's own \
             Authorization is forwarded"
                .into(),
        );
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err("the upstream is an origin (scheme, host, port), without a path".into());
    }
    Ok(Upstream {
        scheme,
        authority,
        tls: None,
    })
}
