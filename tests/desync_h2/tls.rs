//! TLS for the vectors: a test CA made here with rcgen, a `localhost` certificate for the
//! proxy's `tls:` config, and a client that speaks h2 by ALPN.

use std::net::SocketAddr;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};

use crate::run::Io;

/// A TLS client for a proxy serving a certificate of the test CA.
pub(crate) struct TlsClient {
    /// The proxy config's `tls:` line.
    pub(crate) config_line: String,
    connector: tokio_rustls::TlsConnector,
    /// Holds the certificate files.
    _dir: tempfile::TempDir,
}

impl TlsClient {
    /// A CA, a `localhost` certificate and key written to a temporary directory, and a
    /// client trusting the CA that offers ALPN `h2` only.
    pub(crate) fn new() -> TlsClient {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from(ca.der().to_vec())).unwrap();
        let mut config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        TlsClient {
            config_line: format!(
                "tls: {{ cert: \"{}\", key: \"{}\" }}\n",
                cert_path.display(),
                key_path.display()
            ),
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            _dir: dir,
        }
    }

    /// A TLS connection to `addr` that agreed on h2.
    pub(crate) async fn connect(&self, addr: SocketAddr) -> Box<dyn Io> {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let tls = self
            .connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        assert_eq!(
            tls.get_ref().1.alpn_protocol(),
            Some(&b"h2"[..]),
            "ALPN agreed on h2"
        );
        Box::new(tls)
    }
}
