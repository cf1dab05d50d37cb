//! The TLS listener itself: handshakes that never finish or are no TLS at all, 0-RTT early
//! data, and the forwarded fields and routing of requests whose authority is not the name
//! the connection was opened for.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

/// A client that connects and says nothing, one that stops half-way through its hello and
/// one that speaks cleartext HTTP to the TLS port are each closed (the handshake is
/// bounded by the head timeout), and none of them takes the listener down: a client after
/// them is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_stalled_or_garbled_handshakes_are_closed_and_the_listener_serves_on() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("server", &["localhost"]);
    let upstream = start_upstream().await;
    let text = format!(
        "listen: 127.0.0.1:0\nupstream: http://{}\n{}",
        upstream.addr,
        tls_yaml(&cert, &key, None)
    );
    let proxy = common::start_proxy_tuned(&text, None, |proxy| {
        proxy.with_idle_timeout(Duration::from_millis(300))
    })
    .await;
    let mut silent = TcpStream::connect(proxy.addr).await.unwrap();
    // A handshake record that announces 512 bytes and brings 4 of them.
    let mut stalled = TcpStream::connect(proxy.addr).await.unwrap();
    stalled
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc])
        .await
        .unwrap();
    let mut cleartext = TcpStream::connect(proxy.addr).await.unwrap();
    cleartext
        .write_all(b"POST /orders HTTP/1.1\r\nhost: localhost\r\nidempotency-key: c\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    for (what, stream) in [
        ("silent", &mut silent),
        ("stalled", &mut stalled),
        ("cleartext", &mut cleartext),
    ] {
        assert!(
            common::closed_by_the_proxy(stream).await,
            "a {what} handshake is still open after 10 s (head timeout 300 ms)"
        );
    }
    let connector = pki.client(b"http/1.1", None);
    let served = post_tls(proxy.addr, &connector, b"http/1.1", "after").await;
    assert_eq!(served.map(|a| a.status), Ok(StatusCode::CREATED));
    assert_eq!(upstream.executed(), 1, "the cleartext request ran");
}

/// 0-RTT early data is never accepted: bytes a client sends before the handshake ends can
/// be replayed by anyone who recorded them, and the request they carry would run again.
/// A client that resumes its session and offers early data is told no, and sends its
/// request the ordinary way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_data_is_never_accepted() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("server", &["localhost"]);
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &tls_yaml(&cert, &key, None)).await;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(pki.path("ca.pem")).unwrap())
        .unwrap();
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.enable_early_data = true;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    // The first connection takes the session tickets home with its answer.
    let first = post_tls(proxy.addr, &connector, b"http/1.1", "e1").await;
    assert_eq!(first.map(|a| a.status), Ok(StatusCode::CREATED));

    let request = b"POST /orders HTTP/1.1\r\nhost: localhost\r\nidempotency-key: e2\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let mut early = None;
    let mut tls = connector
        .connect_with(ServerName::try_from("localhost").unwrap(), tcp, |conn| {
            if let Some(mut writer) = conn.early_data() {
                early = Some(std::io::Write::write(&mut writer, request).unwrap());
            }
        })
        .await
        .unwrap();
    let conn = tls.get_ref().1;
    assert_eq!(conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed));
    assert!(
        !conn.is_early_data_accepted(),
        "the proxy accepted {early:?} bytes of 0-RTT data"
    );
    tls.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert_eq!(upstream.executed(), 2);
}

/// Over TLS the upstream is told `X-Forwarded-Proto: https` and the host the request was
/// routed by, whatever the client wrote in those fields or in `Forwarded`; and an HTTP/2
/// connection opened for one name (SNI `localhost`) that carries a request for another
/// (`:authority`, as browsers coalesce connections) has that request routed and forwarded
/// by its authority, never by the name the connection was opened for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_forwarded_fields_say_https_and_the_authority_routed_by() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("server", &["localhost", "b.example"]);
    let upstream = start_upstream().await;
    let routes = "routes:\n  - name: b\n    match: { methods: [POST], path: /echo-headers, host: b.example }\n    key: { header: Idempotency-Key, required: true }\n";
    let yaml = tls_yaml(&cert, &key, None).replace(ROUTES, routes);
    let proxy = start_proxy(upstream.addr, &yaml).await;
    let tls = connect_tls(proxy.addr, &pki.client(b"h2", None))
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut send = |authority: &str, key: Option<&str>| {
        let mut request = Request::post(format!("https://{authority}/echo-headers"))
            .header("x-forwarded-proto", "http")
            .header("x-forwarded-host", "evil.example")
            .header("forwarded", "proto=http;host=evil.example");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let request = request.body(Full::new(Bytes::from_static(b"{}"))).unwrap();
        let sent = sender.send_request(request);
        async move {
            let response = sent.await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, body)
        }
    };
    let (status, _) = send("b.example", None).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "route b (key required) is chosen by :authority"
    );
    let (status, _) = send("localhost", None).await;
    assert_eq!(status, StatusCode::OK, "the SNI name routes nothing");
    let (status, body) = send("b.example", Some("k1")).await;
    assert_eq!(status, StatusCode::OK);
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let seen = &seen["headers"];
    assert_eq!(
        seen["x-forwarded-proto"],
        serde_json::json!(["https"]),
        "{seen}"
    );
    assert_eq!(
        seen["x-forwarded-host"],
        serde_json::json!(["b.example"]),
        "{seen}"
    );
    assert_eq!(seen["host"], serde_json::json!(["b.example"]), "{seen}");
    assert!(seen.get("forwarded").is_none(), "{seen}");
}
