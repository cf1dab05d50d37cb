//! Reaching Redis the way production does: an ACL user with a password and a db index in
//! the URL, and `rediss://` (TLS via rustls) against a private CA. Each test starts its own
//! redis-server on a free loopback port.

mod common;

use std::process::{Child, Command, Stdio};

use common::redis_server::{free_port, wait_until, RedisServer};
use common::{post, start_proxy, start_upstream, ProxyHandle};
use http::StatusCode;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

const ROUTE: &str = "routes:\n  - name: o\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key, required: true }\n";

/// A first request with `key` executes (201), its repeat is replayed: the store works.
async fn stores_and_replays(proxy: &ProxyHandle, key: &str) {
    let first = post(proxy.addr, "/orders", &[("idempotency-key", key)], "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = post(proxy.addr, "/orders", &[("idempotency-key", key)], "{}").await;
    assert!(again.replayed());
}

/// The store is unreachable (not ready) and a protected request fails closed with 503.
async fn fails_closed(proxy: &ProxyHandle, key: &str) {
    assert!(!proxy.store.ready().await);
    let answer = post(proxy.addr, "/orders", &[("idempotency-key", key)], "{}").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_password_and_db_index_come_from_the_url() {
    let redis = RedisServer::start();
    redis.cli(&[
        "ACL", "SETUSER", "app", "on", ">s3cret", "~*", "&*", "+@all",
    ]);
    redis.cli(&["ACL", "SETUSER", "default", "off"]);
    let as_app = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args([
                "-p",
                &redis.port.to_string(),
                "--user",
                "app",
                "--pass",
                "s3cret",
                "--no-auth-warning",
            ])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let upstream = start_upstream().await;
    let url = format!("redis://app:s3cret@127.0.0.1:{}/3", redis.port);
    let proxy = start_proxy(
        upstream.addr,
        &format!("store:\n  redis: {{ url: \"{url}\" }}\n{ROUTE}"),
    )
    .await;
    stores_and_replays(&proxy, "acl").await;
    assert_eq!(as_app(&["-n", "3", "DBSIZE"]), "1", "the record is in db 3");
    assert_eq!(as_app(&["-n", "0", "DBSIZE"]), "0");

    let wrong = format!("redis://app:nope@127.0.0.1:{}/3", redis.port);
    let refused = start_proxy(
        upstream.addr,
        &format!("store:\n  redis: {{ url: \"{wrong}\", timeout: 300ms }}\n{ROUTE}"),
    )
    .await;
    fails_closed(&refused, "acl2").await;
    assert_eq!(upstream.executed(), 1);
}

struct TlsRedis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
    ca: std::path::PathBuf,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_tls_redis() -> TlsRedis {
    let dir = tempfile::tempdir().unwrap();
    // Distinct subject names: OpenSSL (redis-server's TLS) takes a leaf whose issuer equals
    // its subject for self-signed, and rcgen's default name is the same for both.
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "idemgate test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = leaf.signed_by(&key, &ca).unwrap();
    let path = |f: &str| dir.path().join(f);
    std::fs::write(path("ca.pem"), ca.pem()).unwrap();
    std::fs::write(path("redis.pem"), cert.pem()).unwrap();
    std::fs::write(path("redis.key"), key.serialize_pem()).unwrap();
    let port = free_port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--tls-auth-clients",
            "no",
        ])
        .arg("--tls-cert-file")
        .arg(path("redis.pem"))
        .arg("--tls-key-file")
        .arg(path("redis.key"))
        .arg("--tls-ca-cert-file")
        .arg(path("ca.pem"))
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server with TLS");
    let server = TlsRedis {
        child,
        port,
        ca: path("ca.pem"),
        _dir: dir,
    };
    wait_until(
        || {
            let out = Command::new("redis-cli")
                .args([
                    "--tls",
                    "--sni",
                    "localhost",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                ])
                .arg("--cacert")
                .arg(&server.ca)
                .arg("PING")
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim() == "PONG"
        },
        "redis-server to answer over TLS",
    );
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_is_verified_against_the_configured_ca() {
    let redis = start_tls_redis();
    let upstream = start_upstream().await;
    let url = format!("rediss://localhost:{}", redis.port);
    let trusting = format!(
        "store:\n  redis: {{ url: \"{url}\", ca: \"{}\" }}\n{ROUTE}",
        redis.ca.display()
    );
    let proxy = start_proxy(upstream.addr, &trusting).await;
    assert!(proxy.store.ready().await);
    stores_and_replays(&proxy, "tls").await;
    assert_eq!(upstream.executed(), 1);

    // System roots do not know the private CA: the store is unreachable, fail closed.
    let untrusting = format!("store:\n  redis: {{ url: \"{url}\", timeout: 500ms }}\n{ROUTE}");
    let refused = start_proxy(upstream.addr, &untrusting).await;
    fails_closed(&refused, "tls2").await;
    assert_eq!(upstream.executed(), 1);
}
