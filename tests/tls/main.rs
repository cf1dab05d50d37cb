//! TLS with rustls: termination with ALPN h2 and http/1.1, mutual TLS with `client_cert`
//! scopes, and `https://` upstreams verified against a given CA, whose connections are
//! reused only with nothing unread in TLS either. Certificates come from a
//! test CA generated here with rcgen.

#[path = "../common/mod.rs"]
mod common;
mod listener;
mod upstream;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use bytes::Bytes;
use common::{start_proxy, start_upstream, Answer};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

struct Pki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Self { dir, ca }
    }

    /// Writes `<name>.pem` and `<name>.key` for a certificate with these names.
    fn issue(&self, name: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
        self.issue_with(name, sans, |_| {})
    }

    /// [`Pki::issue`], with `tune` applied to the certificate's parameters first.
    fn issue_with(
        &self,
        name: &str,
        sans: &[&str],
        tune: impl FnOnce(&mut CertificateParams),
    ) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        tune(&mut params);
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (cert_path, key_path) = (
            self.path(&format!("{name}.pem")),
            self.path(&format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn client(&self, alpn: &[u8], identity: Option<(&Path, &Path)>) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(self.path("ca.pem")).unwrap())
            .unwrap();
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut config = match identity {
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_file(cert).unwrap()],
                    PrivateKeyDer::from_pem_file(key).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        // An empty `alpn`: a client that offers no ALPN at all.
        config.alpn_protocols = if alpn.is_empty() {
            Vec::new()
        } else {
            vec![alpn.to_vec()]
        };
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

const ROUTES: &str = "routes:\n  - name: o\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key, required: true }\n";

/// One POST over a fresh TLS connection speaking `alpn`; `Err` when TLS or HTTP failed.
async fn post_tls(
    addr: std::net::SocketAddr,
    connector: &tokio_rustls::TlsConnector,
    alpn: &[u8],
    key: &str,
) -> Result<Answer, String> {
    let tls = connect_tls(addr, connector).await?;
    post_on(tls, alpn, key).await
}

/// A TLS connection to the proxy, as `localhost`.
async fn connect_tls(
    addr: std::net::SocketAddr,
    connector: &tokio_rustls::TlsConnector,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())
}

/// One POST over the connection `tls`, which agreed on `alpn` (an empty one: none, and
/// HTTP/1.1 is spoken).
async fn post_on(
    tls: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    alpn: &[u8],
    key: &str,
) -> Result<Answer, String> {
    let agreed = (!alpn.is_empty()).then_some(alpn);
    assert_eq!(tls.get_ref().1.alpn_protocol(), agreed, "ALPN agreed");
    let request = Request::post("https://localhost/orders")
        .header("host", "localhost")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let io = TokioIo::new(tls);
    let response = if alpn == b"h2" {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender.send_request(request).await
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender.send_request(request).await
    }
    .map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.map_err(|e| e.to_string())?.to_bytes(),
    })
}

fn tls_yaml(cert: &Path, key: &Path, client_ca: Option<&Path>) -> String {
    let ca = client_ca.map_or(String::new(), |p| {
        format!(", client_ca: \"{}\"", p.display())
    });
    format!(
        "tls: {{ cert: \"{}\", key: \"{}\"{ca} }}\n{ROUTES}",
        cert.display(),
        key.display()
    )
}

/// Clients that agree on `h2` or `http/1.1` are served in it, and one that offers no ALPN
/// at all in HTTP/1.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_clients_complete_requests_over_h2_and_http1() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("server", &["localhost"]);
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &tls_yaml(&cert, &key, None)).await;
    // No ALPN offered: HTTP/1.1.
    for alpn in [&b"h2"[..], b"http/1.1", b""] {
        let connector = pki.client(alpn, None);
        let first = post_tls(proxy.addr, &connector, alpn, "tls-key")
            .await
            .unwrap();
        assert_eq!(first.status, StatusCode::CREATED);
        let again = post_tls(proxy.addr, &connector, alpn, "tls-key")
            .await
            .unwrap();
        assert!(again.replayed());
    }
    assert_eq!(upstream.executed(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_refuses_clients_without_a_certificate_and_scopes_by_certificate() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("server", &["localhost"]);
    let (alice_cert, alice_key) = pki.issue("alice", &["alice"]);
    let (bob_cert, bob_key) = pki.issue("bob", &["bob"]);
    let upstream = start_upstream().await;
    let routes = ROUTES.replace("required: true }", "required: true, scope: [client_cert] }");
    let yaml = tls_yaml(&cert, &key, Some(&pki.path("ca.pem"))).replace(ROUTES, &routes);
    let proxy = start_proxy(upstream.addr, &yaml).await;

    let anonymous = pki.client(b"http/1.1", None);
    assert!(
        post_tls(proxy.addr, &anonymous, b"http/1.1", "k")
            .await
            .is_err(),
        "no certificate, no service"
    );
    assert_eq!(upstream.executed(), 0);

    let alice = pki.client(b"h2", Some((&alice_cert, &alice_key)));
    let bob = pki.client(b"h2", Some((&bob_cert, &bob_key)));
    assert!(!post_tls(proxy.addr, &alice, b"h2", "same")
        .await
        .unwrap()
        .replayed());
    assert!(
        !post_tls(proxy.addr, &bob, b"h2", "same")
            .await
            .unwrap()
            .replayed(),
        "another certificate, another caller"
    );
    assert!(post_tls(proxy.addr, &alice, b"h2", "same")
        .await
        .unwrap()
        .replayed());
    assert_eq!(upstream.executed(), 2);
}

/// With `client_ca`, a certificate of that CA is taken only while it is valid and, when
/// it names its uses, only if client authentication is one: an expired one, one not yet
/// valid and one for server authentication only are refused, and nothing of theirs runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_refuses_expired_and_not_for_client_auth_certificates() {
    use rcgen::{date_time_ymd, ExtendedKeyUsagePurpose};
    let pki = Pki::new();
    let (cert, key) = pki.issue("server", &["localhost"]);
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &tls_yaml(&cert, &key, Some(&pki.path("ca.pem"))),
    )
    .await;
    let refused = [
        pki.issue_with("expired", &["expired"], |p| {
            p.not_after = date_time_ymd(2020, 1, 1);
        }),
        pki.issue_with("early", &["early"], |p| {
            p.not_before = date_time_ymd(4000, 1, 1);
        }),
        pki.issue_with("server-only", &["server-only"], |p| {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        }),
    ];
    for (cert, key) in &refused {
        let client = pki.client(b"http/1.1", Some((cert, key)));
        let answer = post_tls(proxy.addr, &client, b"http/1.1", "k").await;
        assert!(answer.is_err(), "{} was taken: {answer:?}", cert.display());
    }
    assert_eq!(upstream.executed(), 0);
    let (good_cert, good_key) = pki.issue_with("client", &["client"], |p| {
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    });
    let client = pki.client(b"http/1.1", Some((&good_cert, &good_key)));
    let answer = post_tls(proxy.addr, &client, b"http/1.1", "k").await;
    assert_eq!(answer.map(|a| a.status), Ok(StatusCode::CREATED));
}

/// With mutual TLS on, the default scope (`caller`) counts the verified certificate as a
/// credential: two services with their own certificates, sending no `Authorization`, from
/// one address (one node, one NAT), never share a key; one service's retry over the
/// other protocol is still the same caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_callers_at_one_address_never_share_a_key_by_default() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("server", &["localhost"]);
    let (alice_cert, alice_key) = pki.issue("alice", &["alice"]);
    let (bob_cert, bob_key) = pki.issue("bob", &["bob"]);
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &tls_yaml(&cert, &key, Some(&pki.path("ca.pem"))),
    )
    .await;
    let alice = pki.client(b"h2", Some((&alice_cert, &alice_key)));
    let bob = pki.client(b"h2", Some((&bob_cert, &bob_key)));
    let first = post_tls(proxy.addr, &alice, b"h2", "same").await.unwrap();
    assert!(!first.replayed());
    let other = post_tls(proxy.addr, &bob, b"h2", "same").await.unwrap();
    assert!(
        !other.replayed(),
        "bob's certificate got alice's stored answer"
    );
    assert_eq!(upstream.executed(), 2);
    let alice_http1 = pki.client(b"http/1.1", Some((&alice_cert, &alice_key)));
    let again = post_tls(proxy.addr, &alice_http1, b"http/1.1", "same")
        .await
        .unwrap();
    assert!(again.replayed(), "alice's retry ran again");
    assert_eq!(upstream.executed(), 2);

    // `explain --client-cert` derives the key the proxy stored for alice's request.
    let config = pki.path("proxy.yaml");
    let yaml = format!(
        "listen: 127.0.0.1:1\nupstream: http://{}\n{}",
        upstream.addr,
        tls_yaml(&cert, &key, Some(&pki.path("ca.pem")))
    );
    std::fs::write(&config, yaml).unwrap();
    let explain = |certificate: &Path| {
        let text = common::explain_cli(
            &config,
            &[
                "--method",
                "POST",
                "--path",
                "/orders",
                "-H",
                "host: localhost",
                "-H",
                "idempotency-key: same",
                "--client-ip",
                "127.0.0.1",
                "--client-cert",
                certificate.to_str().unwrap(),
            ],
        );
        let hex = common::digest_line(&text);
        idemgate::key::Digest::from_hex(&hex).expect("a hex digest")
    };
    let stored = proxy.store.inspect(explain(&alice_cert)).await.unwrap();
    assert_eq!(stored.expect("alice's key stored").state, "done");
    assert_ne!(explain(&alice_cert), explain(&bob_cert));
}

/// A client that resumes its TLS session presents no certificate in that handshake: the
/// proxy still knows it by the certificate its session was verified with, so its retry on
/// a resumed connection replays rather than running again as a new caller, and another
/// certificate is still another caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_a_resumed_session_is_the_same_caller() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("server", &["localhost"]);
    let (alice_cert, alice_key) = pki.issue("alice", &["alice"]);
    let (bob_cert, bob_key) = pki.issue("bob", &["bob"]);
    let upstream = start_upstream().await;
    let routes = ROUTES.replace("required: true }", "required: true, scope: [client_cert] }");
    let yaml = tls_yaml(&cert, &key, Some(&pki.path("ca.pem"))).replace(ROUTES, &routes);
    let proxy = start_proxy(upstream.addr, &yaml).await;
    let alice = pki.client(b"h2", Some((&alice_cert, &alice_key)));
    let first = connect_tls(proxy.addr, &alice).await.unwrap();
    assert_eq!(
        first.get_ref().1.handshake_kind(),
        Some(rustls::HandshakeKind::Full)
    );
    assert!(!post_on(first, b"h2", "r").await.unwrap().replayed());
    let resumed = connect_tls(proxy.addr, &alice).await.unwrap();
    assert_eq!(
        resumed.get_ref().1.handshake_kind(),
        Some(rustls::HandshakeKind::Resumed),
        "the second connection resumes the session"
    );
    assert!(
        post_on(resumed, b"h2", "r").await.unwrap().replayed(),
        "a resumed session is another caller"
    );
    let bob = pki.client(b"h2", Some((&bob_cert, &bob_key)));
    assert!(!post_tls(proxy.addr, &bob, b"h2", "r")
        .await
        .unwrap()
        .replayed());
    assert_eq!(upstream.executed(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_are_verified_against_the_given_ca() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("upstream", &["localhost"]);
    let upstream = start_upstream().await;
    // A TLS-terminating idemgate stands in for an https application.
    let https_app = start_proxy(upstream.addr, &tls_yaml(&cert, &key, None)).await;
    let origin = format!("https://localhost:{}", https_app.addr.port());
    let ca = pki.path("ca.pem");
    let trusting = format!(
        "listen: 127.0.0.1:0\nupstream: {origin}\nupstream_ca: \"{}\"\n{ROUTES}",
        ca.display()
    );
    let front = common::start_proxy_from(&trusting, None).await;
    let ok = common::post(front.addr, "/orders", &[("idempotency-key", "up")], "{}").await;
    assert_eq!(
        ok.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&ok.body)
    );
    assert_eq!(upstream.executed(), 1);

    // Without the CA (system roots only), the test certificate is not trusted: 502.
    let untrusting = format!("listen: 127.0.0.1:0\nupstream: {origin}\n{ROUTES}");
    let front = common::start_proxy_from(&untrusting, None).await;
    let refused = common::post(front.addr, "/orders", &[("idempotency-key", "up2")], "{}").await;
    assert_eq!(refused.status, StatusCode::BAD_GATEWAY);
    assert_eq!(upstream.executed(), 1);
}

/// The DER of the certificate the server presents to a new connection.
async fn presented(addr: std::net::SocketAddr, connector: &tokio_rustls::TlsConnector) -> Vec<u8> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_renews_the_certificate_for_new_connections() {
    let pki = Pki::new();
    let (old_cert, old_key) = pki.issue("old", &["localhost"]);
    let (new_cert, new_key) = pki.issue("new", &["localhost"]);
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &tls_yaml(&old_cert, &old_key, None)).await;
    let connector = pki.client(b"http/1.1", None);
    let der = |p: &Path| CertificateDer::from_pem_file(p).unwrap().to_vec();
    assert_eq!(presented(proxy.addr, &connector).await, der(&old_cert));
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{}\n{}",
        upstream.addr,
        tls_yaml(&new_cert, &new_key, None)
    );
    proxy.proxy.reload(Arc::new(
        idemgate::config::Config::parse(&text, "r.yaml").unwrap(),
    ));
    assert_eq!(presented(proxy.addr, &connector).await, der(&new_cert));
}

/// A reload that replaces `tls.client_ca` applies to every new connection, one that would
/// resume a session verified under the old CA included: from then on a certificate of the
/// old CA is refused and one of the new CA taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_replaces_client_ca_refuses_the_old_cas_certificates_resumed_or_not() {
    let (pki, other) = (Pki::new(), Pki::new());
    let (cert, key) = pki.issue("server", &["localhost"]);
    let (alice_cert, alice_key) = pki.issue("alice", &["alice"]);
    let (carol_cert, carol_key) = other.issue("carol", &["carol"]);
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        upstream.addr,
        &tls_yaml(&cert, &key, Some(&pki.path("ca.pem"))),
    )
    .await;
    let alice = pki.client(b"h2", Some((&alice_cert, &alice_key)));
    let carol = pki.client(b"h2", Some((&carol_cert, &carol_key)));
    assert!(post_tls(proxy.addr, &alice, b"h2", "a1").await.is_ok());
    assert!(
        post_tls(proxy.addr, &carol, b"h2", "c1").await.is_err(),
        "a certificate of a CA not configured was taken"
    );
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{}\n{}",
        upstream.addr,
        tls_yaml(&cert, &key, Some(&other.path("ca.pem")))
    );
    proxy.proxy.reload(Arc::new(
        idemgate::config::Config::parse(&text, "r.yaml").unwrap(),
    ));
    // alice's connector holds a session from before the reload, and offers it.
    assert!(
        post_tls(proxy.addr, &alice, b"h2", "a2").await.is_err(),
        "the old CA's certificate (or its session) was taken after the reload"
    );
    assert!(post_tls(proxy.addr, &carol, b"h2", "c2").await.is_ok());
    assert_eq!(upstream.executed(), 2);
}

/// Whether the port speaks TLS is set at start, as its address is: a reload that adds
/// `tls` or drops it keeps the port as it was until a restart (and names `tls` among the
/// restart-only settings), rather than turning away every client of the port at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_adds_or_drops_tls_keeps_the_port_as_it_was_until_a_restart() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("server", &["localhost"]);
    let upstream = start_upstream().await;
    // `rest` holds the routes (`tls_yaml` writes them after `tls:`).
    let config = |rest: &str| {
        let text = format!(
            "listen: 127.0.0.1:0\nupstream: http://{}\n{rest}",
            upstream.addr
        );
        Arc::new(idemgate::config::Config::parse(&text, "r.yaml").unwrap())
    };
    let cleartext = start_proxy(upstream.addr, ROUTES).await;
    cleartext.proxy.reload(config(&tls_yaml(&cert, &key, None)));
    let plain = common::post(
        cleartext.addr,
        "/orders",
        &[("idempotency-key", "c1")],
        "{}",
    )
    .await;
    assert_eq!(
        plain.status,
        StatusCode::CREATED,
        "still cleartext: {plain:?}"
    );

    let connector = pki.client(b"http/1.1", None);
    let tls = start_proxy(upstream.addr, &tls_yaml(&cert, &key, None)).await;
    tls.proxy.reload(config(ROUTES));
    let answer = post_tls(tls.addr, &connector, b"http/1.1", "t1").await;
    assert_eq!(
        answer.map(|a| a.status),
        Ok(StatusCode::CREATED),
        "still TLS"
    );
    assert_eq!(upstream.executed(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_certificates_are_config_errors() {
    let text = "listen: 127.0.0.1:0\nupstream: http://127.0.0.1:1\ntls: { cert: /nonexistent/cert.pem, key: /nonexistent/key.pem }\n";
    let err = idemgate::config::Config::parse(text, "proxy.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("proxy.yaml:3:1: tls:"), "{err}");
    assert!(err.contains("/nonexistent/cert.pem"), "{err}");
}
