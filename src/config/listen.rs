//! The listeners' own settings: TLS termination on the proxy's listener (`tls:`), read
//! when the config is loaded so a reload picks up renewed certificates, and what the
//! [`Admin`] listener is (its `token_file` is read with the other secrets).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use super::error::CompileError;
use super::raw::RawTls;
use crate::key::Digest;

/// The admin listener.
#[derive(Debug, Clone)]
pub struct Admin {
    /// Address; keep it on loopback or a private interface.
    pub listen: SocketAddr,
    /// Bearer token required for everything but `/healthz` and `/readyz` (`token`, or
    /// the contents of `token_file`); stored bodies are shown only with one.
    pub token: Option<String>,
}

/// The SHA-256 of the `tls.client_ca` file, if one is set (already read whole by
/// [`compile_tls`]): the certificates it verifies are part of the caller, so a reload that
/// changes it is told apart from one that renews the server's own certificate.
pub(super) fn client_ca_digest(
    raw: Option<&RawTls>,
    base: &Path,
) -> Result<Option<Digest>, CompileError> {
    let Some(ca) = raw.and_then(|t| t.client_ca.as_deref()) else {
        return Ok(None);
    };
    let path = base.join(ca);
    let bytes = std::fs::read(&path)
        .map_err(|e| CompileError::new("tls", format!("reading {}: {e}", path.display())))?;
    Ok(Some(Digest(Sha256::digest(bytes).into())))
}

/// `tls:` as a server config; certificate paths are relative to `base`.
pub(super) fn compile_tls(
    raw: Option<&RawTls>,
    base: &Path,
) -> Result<Option<Arc<rustls::ServerConfig>>, CompileError> {
    let Some(t) = raw else {
        return Ok(None);
    };
    let path = |p: &str| base.join(p);
    crate::tls::server_config(
        &path(&t.cert),
        &path(&t.key),
        t.client_ca.as_deref().map(path).as_deref(),
    )
    .map(Some)
    .map_err(|e| CompileError::new("tls", e.to_string()))
}
