//! The client side: requests through hyper's client ([`send`], [`post`]) and as raw bytes
//! (from another loopback address too), the [`Answer`] they return, and the requests that
//! carry secrets no store may hold in clear; [`closed_by_the_proxy`] waits out a connection.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// What a test request got back.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&self.body)))
    }

    /// The `type` of a problem+json answer (`urn:idemgate:problem:…`); empty if it has none.
    pub fn problem(&self) -> String {
        self.json()["type"].as_str().unwrap_or_default().to_owned()
    }
}

/// A pooled HTTP/1.1 client.
pub fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends one request through a fresh pooled client.
pub async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    send_with(&client(), addr, method, path, headers, body).await
}

/// Sends one request through `client`.
pub async fn send_with(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let mut builder = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder.body(Full::new(body.into())).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(60), client.request(request))
        .await
        .expect("hang guard: no answer in 60s")
        .expect("request failed");
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// POST JSON to `path` with extra headers.
pub async fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    send(addr, Method::POST, path, &all, body.to_owned()).await
}

/// Sends `request` as raw bytes on a new connection and returns all the proxy writes back
/// until it closes the connection: for what a client library would not send (HTTP/1.0,
/// chunks by hand, a body that stops half-way). The 30 s bound is a hang guard only.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("hang guard: the proxy neither answered nor closed the connection")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// Sends raw request bytes from a socket bound to `source` (another loopback address acts
/// as another caller) and returns the whole answer (the request should ask
/// `connection: close`). The 30 s bound is a hang guard only.
pub async fn raw_exchange_from(source: &str, addr: SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = connect_from(source, addr).await;
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("hang guard: the proxy neither answered nor closed the connection")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// A connection to `addr` from a socket bound to `source` (another loopback address is
/// another peer).
pub async fn connect_from(source: &str, addr: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(addr).await.unwrap()
}

/// A JSON POST of `body` to `path` as raw HTTP/1.1 with `extra` header lines
/// (`"name: value"`), closing the connection after the answer. Its `Host` is the one
/// [`post`] and [`send`] name without their port, so their requests share keys with it.
pub fn raw_post(path: &str, extra: &[&str], body: &str) -> Vec<u8> {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for line in extra {
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head.push_str(body);
    head.into_bytes()
}

/// The `Content-Length` in an answer head read as text (the field name in any case).
pub fn content_length_of(head: &str) -> usize {
    head.lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .map(|(_, value)| value.trim().parse().expect("a numeric Content-Length"))
        .unwrap_or_else(|| panic!("no Content-Length in {head:?}"))
}

/// Routes for the tests that no store holds a client's secrets in clear: a client-keyed
/// route `/buy` and an observed one `/watched`; other POSTs are fingerprinted by default.
pub const SECRET_ROUTES: &str = "routes:\n  - name: keyed\n    match: { path: /buy }\n    key: { header: Idempotency-Key }\n  - name: watched\n    match: { path: /watched }\n    key: { header: Idempotency-Key }\n    idempotency: observe\n";

/// What [`send_secrets`] sends that no store may hold in clear: a client key, the token of
/// an `Authorization` and a card number in a body.
pub const SECRETS: [&str; 3] = ["ck-9f8e7d6c5b4a", "tok-5e5e5e5e5e", "4111111111111111"];

/// Sends [`SECRETS`] twice each to `/buy`, `/watched` and `/other` (outside the upstream's
/// `/orders`, which echoes them into its answer, so a stored answer would hold them
/// rightly), and returns the answers.
pub async fn send_secrets(addr: SocketAddr) -> Vec<Answer> {
    let [key, token, card] = SECRETS;
    let auth = format!("Bearer {token}");
    let body = format!(r#"{{"card":"{card}"}}"#);
    let mut answers = Vec::new();
    for path in ["/buy", "/watched", "/other"] {
        for _ in 0..2 {
            let headers = [("idempotency-key", key), ("authorization", auth.as_str())];
            answers.push(post(addr, path, &headers, &body).await);
        }
    }
    answers
}

/// Waits for the proxy to close `stream`, reading and dropping what it sends first (such
/// as HTTP/2 SETTINGS, or a TLS alert); false if it is still open after the 10 s hang
/// guard.
pub async fn closed_by_the_proxy(stream: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut buf = vec![0u8; 4096];
    let closed = async {
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .is_ok()
}
