//! Protocols beyond plain HTTP/1.1: upgrades spliced through, HTTP/2 clients served and
//! protected.

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{self, start_proxy, start_upstream};
use crate::{read_head, ROUTES};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_upgrades_are_spliced_through() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    // On a new connection, and on one that has already carried a request.
    for after_a_request in [false, true] {
        let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        if after_a_request {
            read_200(
                &mut stream,
                b"GET /echo-headers HTTP/1.1\r\nhost: x\r\n\r\n",
            )
            .await;
        }
        stream
            .write_all(
                b"GET /chat HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: echo\r\n\r\n",
            )
            .await
            .unwrap();
        let head = read_head(&mut stream).await.expect("an answer head");
        assert!(head.starts_with("http/1.1 101"), "{head}");
        assert!(head.contains("upgrade: echo"), "{head}");
        for message in [&b"ping"[..], b"second frame", &[0u8, 159, 146, 150]] {
            stream.write_all(message).await.unwrap();
            let mut back = vec![0u8; message.len()];
            stream.read_exact(&mut back).await.unwrap();
            assert_eq!(back, message);
        }
    }
}

/// The hand-written HTTP/1.1 client hands protocol upgrades to hyper's, and counts each;
/// plain requests stay with it and are not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_on_the_hand_written_client_go_through_hyper_and_are_counted() {
    let upstream = start_upstream().await;
    let routes = format!("connections: {{ upstream_http1: idemgate }}\n{ROUTES}");
    let proxy = start_proxy(upstream.addr, &routes).await;
    let handoffs = "idemgate_upstream_http1_handoffs_total{reason=\"upgrade\"}";
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    read_200(
        &mut stream,
        b"GET /echo-headers HTTP/1.1\r\nhost: x\r\n\r\n",
    )
    .await;
    let metrics = common::metrics_text(proxy.admin).await;
    assert!(!metrics.contains(handoffs), "{metrics}");
    for _ in 0..2 {
        upgrade_and_echo(proxy.addr).await;
    }
    let metrics = common::metrics_text(proxy.admin).await;
    assert!(metrics.contains(&format!("{handoffs} 2\n")), "{metrics}");
}

/// Sends `request` on `stream` and reads its whole answer, which must be a `200` framed by
/// its length: the connection is then ready for the next request.
async fn read_200(stream: &mut tokio::net::TcpStream, request: &[u8]) {
    stream.write_all(request).await.unwrap();
    let head = read_head(stream).await.expect("an answer head");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let mut body = vec![0u8; common::content_length_of(&head)];
    stream.read_exact(&mut body).await.unwrap();
}

/// Upgrades a new connection to the test upstream's `echo` protocol through the proxy at
/// `addr` and checks that bytes come back through it.
async fn upgrade_and_echo(addr: std::net::SocketAddr) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /chat HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: echo\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut stream).await.expect("an answer head");
    assert!(head.starts_with("http/1.1 101"), "{head}");
    stream.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
}

/// A proxy on the hand-written client with room for one upstream connection, kept idle for
/// an hour; the 2 s deadline only bounds how long a failing run takes.
async fn one_hand_written_connection(upstream: std::net::SocketAddr) -> common::ProxyHandle {
    let routes = format!(
        "connections: {{ upstream_http1: idemgate, max_upstream: 1, upstream_idle_timeout: 1h }}\n\
         defaults: {{ upstream_timeout: 2s }}\n{ROUTES}"
    );
    start_proxy(upstream, &routes).await
}

/// A handed-over upgrade the upstream refuses (an answer other than `101`, kept alive)
/// leaves no connection idle in hyper's pool, where it would hold a slot under
/// `max_upstream` that the hand-written client's requests cannot take: the next request
/// goes out. Before, with `max_upstream: 1` it waited for that slot until its deadline and
/// was a 502 `upstream-unreachable` (and with a larger cap, as many refused upgrades as
/// the cap starved every other request until `upstream_idle_timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upgrade_on_the_hand_written_client_leaves_no_slot_idle_in_hyper_s_pool() {
    let upstream = start_upstream().await;
    let proxy = one_hand_written_connection(upstream.addr).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    // The upstream switches only to `echo`: this one gets a plain 200, kept alive.
    read_200(
        &mut stream,
        b"GET /echo-headers HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
    )
    .await;
    let handoffs = "idemgate_upstream_http1_handoffs_total{reason=\"upgrade\"}";
    let metrics = common::metrics_text(proxy.admin).await;
    assert!(metrics.contains(&format!("{handoffs} 1\n")), "{metrics}");
    let next = common::post(proxy.addr, "/orders", &[("idempotency-key", "after")], "{}").await;
    assert_eq!(next.status, StatusCode::CREATED, "{next:?}");
    assert_eq!(upstream.executed(), 1);
}

/// Both pools of the hand-written client share `max_upstream`: an upgrade arriving when
/// the cap is filled by the hand-written client's idle connections closes the oldest of
/// them and goes out. Before, it waited for one to reach `upstream_idle_timeout` (here an
/// hour), so past its deadline it was a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_at_the_cap_closes_an_idle_connection_of_the_hand_written_client() {
    let upstream = start_upstream().await;
    let proxy = one_hand_written_connection(upstream.addr).await;
    let first = common::post(
        proxy.addr,
        "/orders",
        &[("idempotency-key", "before")],
        "{}",
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    upgrade_and_echo(proxy.addr).await;
    assert_eq!(upstream.executed(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_are_served_and_protected() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let call = |method: Method, path: &str, key: Option<&str>| {
        let mut b = Request::builder().method(method).uri(format!(
            "http://api.example:9/{}",
            path.trim_start_matches('/')
        ));
        if let Some(k) = key {
            b = b.header("idempotency-key", k);
        }
        let request = b.body(Full::new(Bytes::from_static(b"{}"))).unwrap();
        // Send to the proxy's socket while keeping the client's authority in the URI.
        let addr = proxy.addr;
        let client = client.clone();
        async move {
            let mut request = request;
            let original = request.uri().clone();
            *request.uri_mut() = format!("http://{addr}{}", original.path()).parse().unwrap();
            request
                .headers_mut()
                .insert("host", "api.example:9".parse().unwrap());
            let response = client.request(request).await.unwrap();
            assert_eq!(response.version(), http::Version::HTTP_2);
            let status = response.status();
            let replayed = response.headers().contains_key("idempotent-replayed");
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, replayed, body)
        }
    };
    let (status, replayed, _) = call(Method::POST, "/orders", Some("h2-key")).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    let (status, replayed, _) = call(Method::POST, "/orders", Some("h2-key")).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    assert_eq!(upstream.executed(), 1);
    let (status, _, body) = call(Method::GET, "/echo-headers", None).await;
    assert_eq!(status, StatusCode::OK);
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    // The request's `:authority` is the proxy's address (the client connects by it) and its
    // `Host` field says api.example:9: the upstream gets the authority, once (RFC 9113
    // §8.3.1: an intermediary that makes a `Host` for HTTP/1.1 takes `:authority`).
    assert_eq!(
        seen["headers"]["host"],
        serde_json::json!([proxy.addr.to_string()])
    );
    // No `Host` field, only `:authority`: admitted (the rule is HTTP/1.1's), and the
    // upstream gets the authority as its `Host`.
    let bare = Request::get(format!("http://{}/echo-headers", proxy.addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert!(!bare.headers().contains_key("host"));
    let response = client.request(bare).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen["headers"]["host"][0], proxy.addr.to_string());
}

/// `Upgrade: h2c` is not forwarded: an upstream that takes the switch (Jetty's `http2c`
/// module, for one) would hand the client an HTTP/2 connection of its own
/// past the proxy, on which every request (a POST to a protected route among them) runs
/// unseen ("h2c smuggling"). The upstream gets a plain request without the upgrade fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_upgrade_is_not_forwarded() {
    refuses_to_forward_an_upgrade_to("h2c").await;
}

/// The draft names of h2c are HTTP/2 too, and servers still take them: Apache's mod_http2
/// upgrades on `h2c-14` and `h2c-16`, Jetty accepts `h2c-14` to `h2c-17` when configured
/// with them, Undertow and h2o were built on `h2c-14`. Forwarded, such an upgrade is the
/// same smuggled HTTP/2 connection past the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_to_a_draft_of_h2c_is_not_forwarded() {
    for offer in ["h2c-14", "h2c-16", "H2C-17"] {
        refuses_to_forward_an_upgrade_to(offer).await;
    }
}

async fn refuses_to_forward_an_upgrade_to(offer: &'static str) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    // An upstream that switches to HTTP/2 when asked to, as Jetty does, and counts the
    // POSTs it runs on the switched connection.
    let posts = Arc::new(AtomicUsize::new(0));
    let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (counted, seen) = (Arc::clone(&posts), Arc::clone(&heads));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (posts, heads) = (Arc::clone(&counted), Arc::clone(&seen));
            tokio::spawn(async move {
                while let Some(head) = read_head(&mut stream).await {
                    heads.lock().unwrap().push(head.clone());
                    let asked = format!("upgrade: {}", offer.to_ascii_lowercase());
                    if !head.contains(&asked) {
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        stream.write_all(ok).await.unwrap();
                        continue;
                    }
                    let switch = format!(
                        "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: {offer}\r\n\r\n"
                    );
                    stream.write_all(switch.as_bytes()).await.unwrap();
                    let service = hyper::service::service_fn(move |request: Request<_>| {
                        if request.method() == Method::POST {
                            posts.fetch_add(1, Ordering::SeqCst);
                        }
                        async {
                            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                                Bytes::from_static(b"ran"),
                            )))
                        }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, service)
                        .await;
                    return;
                }
            });
        }
    });
    let proxy = start_proxy(upstream, ROUTES).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let upgrade = format!(
        "GET / HTTP/1.1\r\nhost: x\r\nconnection: Upgrade, HTTP2-Settings\r\nupgrade: {offer}\r\n\
         http2-settings: AAMAAABkAARAAP__\r\n\r\n"
    );
    stream.write_all(upgrade.as_bytes()).await.unwrap();
    let head = read_head(&mut stream).await.expect("an answer head");
    if head.starts_with("http/1.1 101") {
        // What a client does with the switch: POSTs to /orders, which needs a key, without one.
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        for _ in 0..2 {
            let post = Request::post("http://x/orders")
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            let answer = sender.send_request(post).await.unwrap();
            let _ = answer.into_body().collect().await;
        }
    }
    assert_eq!(
        posts.load(Ordering::SeqCst),
        0,
        "{offer}: POSTs to a protected route ran past the proxy on a switched connection"
    );
    assert!(head.starts_with("http/1.1 200"), "{offer}: {head}");
    let heads = heads.lock().unwrap();
    assert_eq!(heads.len(), 1);
    assert!(!heads[0].contains("upgrade"), "{}", heads[0]);
    assert!(!heads[0].contains("http2-settings"), "{}", heads[0]);
}
