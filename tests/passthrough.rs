//! A correct reverse proxy first: unprotected traffic streams through byte-exact, headers are
//! cleaned per RFC 9110 §7.6.1, chunked bodies, `Expect: 100-continue`, upgrades and HTTP/2
//! clients work.

mod common;

use bytes::Bytes;
use common::{pattern_bytes, send, start_proxy, start_upstream};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ROUTES: &str = r#"
routes:
  - name: create-order
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
  - name: uploads
    match: { path: /upload }
    idempotency: off
  - name: echo
    match: { path: /echo-headers }
    idempotency: off
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_downloads_arrive_byte_exact() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let n = 8 * 1024 * 1024 + 13;
    let a = send(
        proxy.addr,
        Method::GET,
        &format!("/download?bytes={n}"),
        &[],
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body.len(), n);
    assert!(a.body == pattern_bytes(n), "every byte as sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50_mib_chunked_upload_streams_through_byte_exact() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let data = Bytes::from(pattern_bytes(50 * 1024 * 1024));
    let expected = format!("{} {}", data.len(), hex::encode(Sha256::digest(&data)));
    let chunks: Vec<Bytes> = (0..data.len())
        .step_by(1 << 20)
        .map(|at| data.slice(at..(at + (1 << 20)).min(data.len())))
        .collect();
    let (status, answer) = upload(proxy.addr, chunks).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(String::from_utf8_lossy(&answer), expected);
}

/// POSTs `chunks` to `/upload` as one chunked body, streamed from the client (hyper's
/// HTTP/1.1 client, which reads an answer that comes before the body is all sent), and
/// returns the answer's status and body.
async fn upload(proxy: std::net::SocketAddr, chunks: Vec<Bytes>) -> (StatusCode, Bytes) {
    let frames = chunks
        .into_iter()
        .map(|chunk| Ok::<_, std::convert::Infallible>(Frame::data(chunk)));
    let body = StreamBody::new(futures_util::stream::iter(frames));
    let stream = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = Request::post("/upload")
        .header("host", "uploads.example")
        .body(body)
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_are_stripped_and_forwarded_headers_added() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let a = send(
        proxy.addr,
        Method::GET,
        "/echo-headers",
        &[
            ("host", "shop.example:8443"),
            ("connection", "x-drop-me, keep-alive"),
            ("x-drop-me", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("proxy-authorization", "Basic abc"),
            ("x-forwarded-for", "203.0.113.9"),
            ("x-kept", "yes"),
        ],
        "",
    )
    .await;
    let seen = &a.json()["headers"];
    for gone in [
        "x-drop-me",
        "keep-alive",
        "te",
        "proxy-authorization",
        "transfer-encoding",
    ] {
        assert!(
            seen.get(gone).is_none(),
            "{gone} must not reach the upstream: {seen}"
        );
    }
    assert_eq!(seen["host"][0], "shop.example:8443", "Host is kept");
    assert_eq!(seen["x-kept"][0], "yes");
    assert_eq!(seen["x-forwarded-for"][0], "203.0.113.9, 127.0.0.1");
    assert_eq!(seen["x-forwarded-proto"][0], "http");
    assert_eq!(seen["x-forwarded-host"][0], "shop.example:8443");
}

async fn raw_exchange(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    let interim = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(
        interim.starts_with("HTTP/1.1 100 Continue"),
        "expected 100 first, got {interim}"
    );
    stream.write_all(body).await.unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.unwrap();
    String::from_utf8_lossy(&rest).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_works_on_both_paths() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let body = b"{\"expect\":true}";
    let head = |path: &str, extra: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n",
            body.len()
        )
    };
    let streamed = raw_exchange(proxy.addr, &head("/upload", ""), body).await;
    assert!(streamed.contains("200 OK"), "{streamed}");
    assert!(streamed.contains(&format!("{} ", body.len())), "{streamed}");
    let protected = raw_exchange(
        proxy.addr,
        &head("/orders", "idempotency-key: cont\r\n"),
        body,
    )
    .await;
    assert!(protected.contains("201 Created"), "{protected}");
    assert_eq!(upstream.executed(), 1);
}

/// A request's trailers go on without the fields only a header section may carry: a second
/// `Host` or a length in the trailers, or a forged client address, would be taken as the
/// request's own by an upstream that merges trailers into its headers. (Trailers go on
/// when the request declares them in `Trailer`, as RFC 9110 §6.6.2 asks of a sender; the
/// forbidden names are declared here too, and dropped all the same.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_trailers_lose_framing_routing_and_forwarding_fields() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let raw = common::raw_exchange(
        proxy.addr,
        b"POST /echo-headers HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\
          trailer: content-length, host, connection, x-forwarded-for, authorization, x-checksum\r\n\r\n\
          3\r\nabc\r\n0\r\ncontent-length: 0\r\nhost: evil.example\r\nconnection: close\r\n\
          x-forwarded-for: 10.9.9.9\r\nauthorization: Bearer forged\r\nx-checksum: 7\r\n\r\n",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    let json: serde_json::Value = serde_json::from_str(&raw[raw.find("\r\n\r\n").unwrap() + 4..])
        .unwrap_or_else(|e| panic!("{e}: {raw}"));
    assert_eq!(json["body_len"], 3);
    assert_eq!(
        json["trailers"],
        serde_json::json!({ "x-checksum": ["7"] }),
        "{raw}"
    );
    assert_eq!(json["headers"]["host"], serde_json::json!(["x"]));
    assert_eq!(
        json["headers"]["trailer"],
        serde_json::json!(["x-checksum"]),
        "{raw}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_request_bodies_reach_protected_routes_whole() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    let raw = common::raw_exchange(
        proxy.addr,
        b"POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: ch\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 201"), "{raw}");
    assert!(
        raw.contains(r#"\"a\":1"#),
        "the upstream got the whole body: {raw}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_upgrades_are_spliced_through() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    // On a new connection, and on one that has already carried a request.
    for after_a_request in [false, true] {
        let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        if after_a_request {
            stream
                .write_all(b"GET /echo-headers HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .unwrap();
            let head = read_head(&mut stream).await.expect("an answer head");
            assert!(head.starts_with("http/1.1 200"), "{head}");
            let mut body = vec![0u8; common::content_length_of(&head)];
            stream.read_exact(&mut body).await.unwrap();
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

/// An upstream that answers `413` as soon as it has a request's head, reading none of its
/// body, as an app refusing an upload does. Then it either holds the connection without
/// reading (`finish: false`) or, as Go's and hyper's servers do, closes its sending side
/// and discards what still arrives (`finish: true`).
async fn start_early_answerer(finish: bool) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                if read_head(&mut stream).await.is_none() {
                    return;
                }
                let answer = "HTTP/1.1 413 Content Too Large\r\ncontent-length: 9\r\nconnection: close\r\n\r\ntoo large";
                stream.write_all(answer.as_bytes()).await.unwrap();
                if finish {
                    let _ = stream.shutdown().await;
                    let mut sink = vec![0u8; 1 << 16];
                    while stream.read(&mut sink).await.unwrap_or(0) > 0 {}
                } else {
                    // Held open and unread until the test ends.
                    tokio::time::sleep(std::time::Duration::from_secs(300)).await;
                    drop(stream);
                }
            });
        }
    });
    addr
}

/// A 64 MiB upload: far more than the sockets between client, proxy and upstream buffer.
fn chunks_of_64_mib() -> Vec<Bytes> {
    vec![Bytes::from(pattern_bytes(1 << 20)); 64]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_answering_before_the_upload_ends_is_relayed_at_once() {
    for finish in [false, true] {
        let upstream = start_early_answerer(finish).await;
        let proxy = start_proxy(upstream, ROUTES).await;
        // Hang guard, far below the 60 s upstream timeout a proxy that keeps writing into
        // an upstream that stopped reading would wait out.
        let (status, body) = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            upload(proxy.addr, chunks_of_64_mib()),
        )
        .await
        .unwrap_or_else(|_| panic!("no answer relayed (finish: {finish})"));
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "finish: {finish}");
        assert_eq!(&body[..], b"too large", "finish: {finish}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interim_answer_during_an_upload_does_not_cut_it_short() {
    // An upstream that sends `100 Continue` as soon as it has the head (unasked), then
    // reads the whole body and says how much it got: only a final answer ends an upload.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let head = read_head(&mut stream).await.expect("a request head");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|n| n.trim().parse().ok())
            .expect("a content-length upload");
        stream
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .unwrap();
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await.unwrap();
        let said = format!("{} {}", body.len(), hex::encode(Sha256::digest(&body)));
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{said}",
            said.len()
        );
        stream.write_all(answer.as_bytes()).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
    });
    let proxy = start_proxy(upstream, ROUTES).await;
    let data = Bytes::from(pattern_bytes(16 << 20));
    let expected = format!("{} {}", data.len(), hex::encode(Sha256::digest(&data)));
    let a = send(proxy.addr, Method::POST, "/upload", &[], data).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(String::from_utf8_lossy(&a.body), expected);
}

/// Reads one HTTP/1.1 head (through its blank line) byte by byte, so nothing after it is
/// consumed, lowercased; `None` if the peer closes or fails first.
async fn read_head(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.ok()?;
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).to_ascii_lowercase())
}

/// An upstream that sends a pass-through answer's head and part of its body, then stalls,
/// is cut off after `connections.upstream_read_timeout` without a byte: the client's
/// connection ends (short of the announced length) instead of hanging, and the proxy
/// serves the next request. (The gap is 300 ms; the 30 s bound is a hang guard only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_through_answer_stalled_mid_body_is_cut_off() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                if read_head(&mut stream).await.is_none() {
                    return;
                }
                let head = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789";
                stream.write_all(head).await.unwrap();
                // Stalls: holds the connection, sends nothing more.
                tokio::time::sleep(std::time::Duration::from_secs(300)).await;
            });
        }
    });
    let routes = format!("connections: {{ upstream_read_timeout: 300ms }}\n{ROUTES}");
    let proxy = start_proxy(upstream, &routes).await;
    let text = common::raw_exchange(proxy.addr, b"GET /upload HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(body, "0123456789", "the part that came, and no more");
}

/// A client that asks for a large pass-through answer and stops reading it is cut off
/// once nothing has reached it for `connections.client_send_timeout` (nginx's
/// `send_timeout`): its connection is closed, and the upstream connection the answer
/// streamed from is freed, so with `max_upstream: 1` the next request is served. (The
/// timeout is 1 s; the 30 s bounds are hang guards only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_answer_is_cut_off_and_frees_the_upstream_connection() {
    let upstream = start_upstream().await;
    let routes = format!("connections: {{ max_upstream: 1, client_send_timeout: 1s }}\n{ROUTES}");
    let proxy = start_proxy(upstream.addr, &routes).await;
    let mut reader = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    reader
        .write_all(b"GET /download?bytes=268435456 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // The answer streams (the only upstream connection is taken); then it is not read.
    let head = read_head(&mut reader).await.expect("the answer's head");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let next = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        send(proxy.addr, Method::GET, "/download?bytes=10", &[], ""),
    )
    .await
    .expect("hang guard: a client that does not read holds the only upstream connection");
    assert_eq!(next.status, StatusCode::OK);
    assert_eq!(next.body, pattern_bytes(10));
    // The reader's connection was closed: what was sent before ends short of the length.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        reader.read_to_end(&mut rest),
    )
    .await
    .expect("hang guard: the connection of a client that does not read stays open");
    assert!(rest.len() < 268_435_456, "cut off short of the answer");
}

/// A client that sends part of a pass-through upload and then nothing is cut off after
/// the body read timeout (nginx's `client_body_timeout`): it gets a 408 problem, and the
/// upstream sees the upload end short instead of waiting on it. (The timeout is 300 ms;
/// the 30 s bounds are hang guards only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_pass_through_upload_is_cut_off_with_408() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let (cut_tx, cut) = tokio::sync::oneshot::channel::<usize>();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        read_head(&mut stream).await.expect("a request head");
        // Reads the body until the proxy ends it; reports how much came.
        let mut got = 0;
        let mut buf = [0u8; 1024];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
            got += n;
        }
        let _ = cut_tx.send(got);
    });
    let text = format!("listen: 127.0.0.1:0\nupstream: http://{upstream}\n{ROUTES}");
    let proxy = common::start_proxy_tuned(&text, None, |p| {
        p.with_body_read_timeout(std::time::Duration::from_millis(300))
    })
    .await;
    let answer = common::raw_exchange(
        proxy.addr,
        b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n0123456789",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("urn:idemgate:problem:body-timeout"),
        "{answer}"
    );
    let got = tokio::time::timeout(std::time::Duration::from_secs(30), cut)
        .await
        .expect("hang guard: the upstream was left waiting for the rest")
        .unwrap();
    assert!(
        got < 100,
        "the upstream never saw a whole body ({got} bytes)"
    );
}

/// A raw upstream that reads each request's head and answers it with `answer` (`None`:
/// never answers, holding the connection).
async fn raw_answering(answer: Option<&'static [u8]>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                while read_head(&mut stream).await.is_some() {
                    match answer {
                        Some(answer) => stream.write_all(answer).await.unwrap(),
                        None => tokio::time::sleep(std::time::Duration::from_secs(300)).await,
                    }
                }
            });
        }
    });
    upstream
}

/// An upstream's answer trailers reach an HTTP/2 client (hyper forwards them there) without
/// the fields only a head may carry: a client merging them into the head would take a
/// length or a cookie from them as the answer's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_trailers_lose_header_only_fields() {
    let upstream = raw_answering(Some(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum, content-length, set-cookie\r\n\r\n\
          5\r\nhello\r\n0\r\nx-checksum: 1\r\ncontent-length: 5\r\nset-cookie: a=b\r\n\r\n",
    ))
    .await;
    let proxy = start_proxy(upstream, ROUTES).await;
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let request = Request::get(format!("http://{}/upload", proxy.addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers");
    assert_eq!(collected.to_bytes(), "hello");
    let names: Vec<_> = trailers.keys().map(|n| n.as_str()).collect();
    assert_eq!(names, ["x-checksum"], "{trailers:?}");
    assert_eq!(trailers["x-checksum"], "1");
}

/// `upstream_timeout` bounds an unprotected request's wait for the answer's head: the
/// `defaults` one, or the route's own. Here the route's 200 ms is what a client waits,
/// under a `defaults` of 60 s (the 10 s bound is a hang guard only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprotected_route_gets_its_504_after_its_own_upstream_timeout() {
    let upstream = raw_answering(None).await;
    let routes = "defaults: { upstream_timeout: 60s }\n\
        routes:\n  - name: slow\n    match: { path: /slow }\n    idempotency: off\n    upstream_timeout: 200ms\n";
    let proxy = start_proxy(upstream, routes).await;
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        send(proxy.addr, Method::POST, "/slow", &[], "{}"),
    )
    .await
    .expect("hang guard: the route's own upstream_timeout was not applied");
    assert_problem(&answer, StatusCode::GATEWAY_TIMEOUT, "upstream-timeout");
}

/// On an unprotected route with no timeout of its own, `defaults.upstream_timeout` holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprotected_route_gets_its_504_after_the_default_upstream_timeout() {
    let upstream = raw_answering(None).await;
    let routes = format!("defaults: {{ upstream_timeout: 200ms }}\n{ROUTES}");
    let proxy = start_proxy(upstream, &routes).await;
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        send(proxy.addr, Method::POST, "/upload", &[], "{}"),
    )
    .await
    .expect("hang guard: no 504");
    assert_problem(&answer, StatusCode::GATEWAY_TIMEOUT, "upstream-timeout");
}

fn assert_problem(answer: &common::Answer, status: StatusCode, kind: &str) {
    assert_eq!(answer.status, status, "{:?}", answer.body);
    assert_eq!(answer.headers["content-type"], "application/problem+json");
    assert_eq!(
        answer.json()["type"],
        format!("urn:idemgate:problem:{kind}")
    );
}

/// A policy key on an unprotected route would do nothing there: it is a config error
/// naming the key, never silently ignored. Only `upstream_timeout` applies.
#[test]
fn policy_keys_on_an_unprotected_route_are_refused_by_name() {
    let config = |extra: &str| {
        format!(
            "listen: 127.0.0.1:0\nupstream: http://127.0.0.1:1\nroutes:\n  - name: a\n    match: {{ path: /a }}\n    key: {{ header: K }}\n  - name: plain\n    match: {{ path: /p }}\n{extra}"
        )
    };
    let parse = |extra: &str| idemgate::config::Config::parse(&config(extra), "p.yaml");
    for (extra, field, off) in [
        (
            "    idempotency: off\n    ttl: 1h\n",
            "ttl",
            "idempotency: off",
        ),
        (
            "    idempotency: off\n    max_body: 1KiB\n",
            "max_body",
            "idempotency: off",
        ),
        (
            "    idempotency: off\n    key: { header: K }\n",
            "key",
            "idempotency: off",
        ),
        (
            "    key: off\n    max_answer: 1KiB\n",
            "max_answer",
            "key: off",
        ),
        (
            "    idempotency: off\n    fresh: { header: X-Ts }\n",
            "fresh",
            "idempotency: off",
        ),
    ] {
        let message = parse(extra).expect_err(extra).to_string();
        assert!(
            message.contains(&format!("routes[1].{field}: `{field}` has no effect on"))
                && message.contains(off),
            "{message}"
        );
    }
    parse("    idempotency: off\n    upstream_timeout: 2s\n").expect("upstream_timeout applies");
    let zero = parse("    idempotency: off\n    upstream_timeout: 0s\n").unwrap_err();
    assert!(zero.to_string().contains("above zero"), "{zero}");
}
