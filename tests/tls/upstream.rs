//! `https://` upstreams: HTTP/2 only where the upstream selects ALPN `h2`, bytes already
//! decrypted past an answer never reaching the next request, a connection closed at its
//! handshake dialed once.

use super::*;

/// `connections.upstream_protocol: http2` to an `https://` upstream offers ALPN `h2` alone:
/// a server that selects it (a TLS-terminating idemgate here) is spoken to in HTTP/2; one
/// that speaks only `http/1.1` fails the connection before any request went out, so the
/// request is `upstream-unreachable` and its key released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_is_spoken_to_in_http2_only_if_it_selects_alpn_h2() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("upstream", &["localhost"]);
    let upstream = start_upstream().await;
    let https_app = start_proxy(upstream.addr, &tls_yaml(&cert, &key, None)).await;
    let ca = pki.path("ca.pem");
    let front = |port: u16| {
        format!(
            "listen: 127.0.0.1:0\nupstream: https://localhost:{port}\nupstream_ca: \"{}\"\nconnections: {{ upstream_protocol: http2 }}\n{ROUTES}",
            ca.display()
        )
    };
    let proxy = common::start_proxy_from(&front(https_app.addr.port()), None).await;
    let ok = common::post(proxy.addr, "/orders", &[("idempotency-key", "h2")], "{}").await;
    assert_eq!(ok.status, StatusCode::CREATED, "{ok:?}");
    assert_eq!(upstream.executed(), 1);

    // A TLS server that knows only http/1.1.
    let mut server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_file(&cert).unwrap()],
            PrivateKeyDer::from_pem_file(&key).unwrap(),
        )
        .unwrap();
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = acceptor.accept(tcp).await;
            });
        }
    });
    let proxy = common::start_proxy_from(&front(port), None).await;
    let refused = common::post(proxy.addr, "/orders", &[("idempotency-key", "h1")], "{}").await;
    assert_eq!(refused.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        refused.json()["type"],
        "urn:idemgate:problem:upstream-unreachable"
    );
    assert_eq!(upstream.executed(), 1);
}

/// Reads one request head (and its `Content-Length` body) off `read`; `false` once the
/// connection ended.
async fn read_request<R: tokio::io::AsyncBufRead + Unpin>(read: &mut R) -> bool {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut length = 0;
    loop {
        let mut line = String::new();
        if read.read_line(&mut line).await.unwrap_or(0) == 0 {
            return false;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0; length];
    read.read_exact(&mut body).await.is_ok()
}

/// Over TLS, what the upstream sent past an answer's end may already be decrypted and held
/// by rustls when the answer has been read, with nothing left for the socket to report:
/// here the answer fills one TLS record (16 KiB, as much as the hand-written client's
/// first read takes) and a forged answer follows in the same write, so the socket read
/// that completes the answer's record takes in the forged one whole, and is short, which
/// tokio takes for a drained socket (it clears the readiness). The connection is not
/// reused, and the next request, of another caller, gets its own answer. Before, the
/// hand-written client looked at the socket's readiness alone to tell whether an idle
/// connection had something unread: it pooled this one, and the next request got the
/// forged answer, stored under its key. hyper's connection task reads through TLS while
/// idle, sees the bytes and closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_past_an_https_answer_already_decrypted_never_reach_the_next_request() {
    use tokio::io::{AsyncWriteExt, BufReader};
    let pki = Pki::new();
    let (cert, key) = pki.issue("upstream", &["localhost"]);
    let mut server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_file(&cert).unwrap()],
            PrivateKeyDer::from_pem_file(&key).unwrap(),
        )
        .unwrap();
    // Nothing but answers after the handshake.
    server.send_tls13_tickets = 0;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    // One TLS record of answer, then the forged answer.
    let record = 16 * 1024;
    let length = record - "HTTP/1.1 201 Created\r\ncontent-length: 16337\r\n\r\n".len();
    let mut first =
        format!("HTTP/1.1 201 Created\r\ncontent-length: {length}\r\n\r\n").into_bytes();
    first.resize(record, b'a');
    first.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nforged");
    let first: &'static [u8] = first.leak();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&requests);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, count) = (acceptor.clone(), Arc::clone(&count));
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let (read, mut write) = tokio::io::split(tls);
                let mut read = BufReader::new(read);
                while read_request(&mut read).await {
                    let answer: &[u8] = match count.fetch_add(1, SeqCst) {
                        0 => first,
                        _ => b"HTTP/1.1 201 Created\r\ncontent-length: 3\r\n\r\nown",
                    };
                    // One write: both answers in one run of TLS records.
                    write.write_all(answer).await.unwrap();
                    write.flush().await.unwrap();
                }
            });
        }
    });
    let config = format!(
        "listen: 127.0.0.1:0\nupstream: https://localhost:{port}\nupstream_ca: \"{}\"\n\
         connections: {{ upstream_idle_timeout: 1h }}\n{ROUTES}",
        pki.path("ca.pem").display()
    );
    let proxy = common::start_proxy_from(&config, None).await;
    let answered = common::post(proxy.addr, "/orders", &[("idempotency-key", "a")], "{}").await;
    assert_eq!(answered.status, StatusCode::CREATED);
    assert_eq!(answered.body.len(), length);
    let next = common::post(proxy.addr, "/orders", &[("idempotency-key", "b")], "{}").await;
    assert_eq!(
        (next.status, &next.body[..]),
        (StatusCode::CREATED, &b"own"[..]),
        "{:?}",
        String::from_utf8_lossy(&next.body)
    );
    assert_eq!(requests.load(SeqCst), 2);
}

/// An https upstream that completes each TLS handshake and closes the connection in the
/// write that ends it: TLS 1.2's last flight (the server's `Finished`) and `close_notify`
/// go out together, so a client holds the close before it could write a request. Every
/// handshake is a full one (no session resumption, which would end with the client's
/// flight instead). Counts the connections it accepts.
fn closing_at_handshake(pki: &Pki) -> (u16, Arc<AtomicUsize>) {
    let (cert, key) = pki.issue("closing", &["localhost"]);
    let mut config =
        rustls::ServerConfig::builder_with_protocol_versions(&[&rustls::version::TLS12])
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from_pem_file(&cert).unwrap()],
                PrivateKeyDer::from_pem_file(&key).unwrap(),
            )
            .unwrap();
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    let config = Arc::new(config);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(mut tcp) = tcp else { return };
            count.fetch_add(1, SeqCst);
            let mut tls = rustls::ServerConnection::new(Arc::clone(&config)).unwrap();
            let _ = handshake_then_close(&mut tls, &mut tcp);
        }
    });
    (port, accepted)
}

/// Drives the server side of a handshake; its last flight goes out in one write with
/// `close_notify`, and then the connection closes.
fn handshake_then_close(
    tls: &mut rustls::ServerConnection,
    tcp: &mut std::net::TcpStream,
) -> std::io::Result<()> {
    while tls.is_handshaking() {
        while tls.wants_write() {
            tls.write_tls(tcp)?;
        }
        if tls.read_tls(tcp)? == 0 {
            return Ok(());
        }
        tls.process_new_packets().map_err(std::io::Error::other)?;
    }
    tls.send_close_notify();
    while tls.wants_write() {
        tls.write_tls(tcp)?;
    }
    Ok(())
}

/// A new upstream connection that the upstream closed before a request could go out
/// carried nothing: the request is `upstream-unreachable` (its key released), at once,
/// after one connection, as on hyper's. Before, the hand-written client took a new
/// connection it found closed as it takes an idle one the upstream closed, and dialed
/// again and again until the request's deadline: hundreds of connections a second against
/// an upstream that is turning them away. (Before its probe read through TLS, it did not
/// see this close at all and wrote the request into it: a 502 `upstream-failed`, the key
/// held as outcome unknown.) The 2 s deadline only bounds how long a failing run takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_upstream_connection_closed_before_the_request_is_dialed_once_and_unreachable() {
    let pki = Pki::new();
    let (port, accepted) = closing_at_handshake(&pki);
    let config = format!(
        "listen: 127.0.0.1:0\nupstream: https://localhost:{port}\nupstream_ca: \"{}\"\n\
         defaults: {{ upstream_timeout: 2s }}\n{ROUTES}",
        pki.path("ca.pem").display()
    );
    let proxy = common::start_proxy_from(&config, None).await;
    let refused = common::post(proxy.addr, "/orders", &[("idempotency-key", "gone")], "{}").await;
    assert_eq!(refused.status, StatusCode::BAD_GATEWAY, "{refused:?}");
    assert_eq!(
        refused.json()["type"],
        "urn:idemgate:problem:upstream-unreachable",
        "{:?}",
        refused.json()
    );
    assert_eq!(accepted.load(SeqCst), 1, "connections dialed");
}
