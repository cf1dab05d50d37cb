//! TLS on rustls: the listener's server config from PEM files (ALPN `h2` and `http/1.1`,
//! client certificates required when a client CA is given) and the client config for
//! `https://` upstreams (system roots, or a given CA file).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Why TLS material could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// rustls refused the material (e.g. the key does not match the certificate).
    #[error("{0}")]
    Rustls(String),
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |reason: String| TlsError::Pem {
        path: path.to_owned(),
        reason,
    };
    let blocks = CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))?;
    every_certificate(blocks).map_err(bad)
}

/// Whether `pem` holds at least one certificate and nothing that fails to parse, as every
/// certificate or CA file read here must: for the config check, which has the file's bytes.
pub fn holds_certificates(pem: &[u8]) -> bool {
    every_certificate(CertificateDer::pem_slice_iter(pem)).is_ok()
}

/// The certificates of PEM `blocks`: at least one, and every block readable.
fn every_certificate(
    blocks: impl Iterator<Item = Result<CertificateDer<'static>, rustls::pki_types::pem::Error>>,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = blocks
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no CERTIFICATE block".into());
    }
    Ok(certs)
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certificates(path)? {
        store.add(cert).map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    Ok(store)
}

/// The listener's config. With `client_ca`, every client must present a certificate
/// that chains to it, unexpired and not restricted to other uses than client
/// authentication (mutual TLS; revocation is not checked); its leaf's SHA-256 is then the
/// caller's certificate, for the default caller and `scope: [client_cert]`.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Pem {
        path: key.to_owned(),
        reason: e.to_string(),
    })?;
    let builder = ServerConfig::builder();
    let builder = match client_ca {
        Some(ca) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder(Arc::new(roots(ca)?))
                .build()
                .map_err(|e| TlsError::Rustls(e.to_string()))?,
        ),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    // No 0-RTT, set here rather than left to rustls' default so that no dependency bump
    // turns it on: early data can be replayed by anyone who recorded it, and the request
    // it carries would run again (tests/tls/listener.rs pins it).
    config.max_early_data_size = 0;
    config.send_half_rtt_data = false;
    // The session cache stays this config's own (the builder's): a resumed session brings
    // the client certificate it began with, not verified again, so a cache shared across
    // reloads would let in certificates a new `client_ca` refuses.
    Ok(Arc::new(config))
}

/// The config for `https://` upstreams: the CA file's roots, or the system's.
pub fn upstream_client_config(ca: Option<&Path>) -> Result<ClientConfig, TlsError> {
    let roots = match ca {
        Some(path) => roots(path)?,
        None => {
            let mut store = RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // One unusable system certificate should not disable the others.
                let _ = store.add(cert);
            }
            store
        }
    };
    // No ALPN here: the connector offers the protocols it is built with (http/1.1).
    Ok(ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth())
}
