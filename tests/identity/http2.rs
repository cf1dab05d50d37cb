//! Callers over HTTP/2, whose clients may split one `Cookie` into a field per cookie (RFC
//! 9113 §8.2.3): the caller is the jar, however it was split.

use super::common::{self, raw_exchange_from, raw_post, start_proxy, start_upstream};
use super::replayed;

/// One browser's cookies with no listed session name, sent as separate `cookie` fields
/// over HTTP/2 (RFC 9113 §8.2.3 lets a client split them) and as one `Cookie` field over
/// HTTP/1.1 on its retry: one jar, one caller, one execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookies_split_over_http2_are_the_caller_of_one_cookie_field() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let body = r#"{"sku":"C1"}"#;
    let first = h2_post(proxy.addr, "/orders", &["cart=77", "theme=dark"], body).await;
    assert!(first.headers.get("idempotent-replayed").is_none());

    let raw = raw_post("/orders", &["cookie: cart=77;theme=dark"], body);
    let again = raw_exchange_from("127.0.0.1", proxy.addr, &raw).await;
    assert!(replayed(&again), "the HTTP/1.1 retry ran again: {again}");
    assert_eq!(upstream.executed(), 1);

    let raw = raw_post("/orders", &["cookie: cart=78; theme=dark"], body);
    let other = raw_exchange_from("127.0.0.1", proxy.addr, &raw).await;
    assert!(!replayed(&other), "another jar got the first one's answer");
    assert_eq!(upstream.executed(), 2);
}

/// Sends one JSON POST over a new HTTP/2 connection, each of `cookies` in a `cookie` field
/// of its own, as browsers split them (RFC 9113 §8.2.3).
pub(super) async fn h2_post(
    proxy: std::net::SocketAddr,
    path: &str,
    cookies: &[&str],
    body: &'static str,
) -> common::Answer {
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let tcp = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut request = http::Request::post(format!("http://{proxy}{path}"))
        .header("content-type", "application/json");
    for cookie in cookies {
        request = request.header("cookie", *cookie);
    }
    let request = request.body(Full::new(bytes::Bytes::from(body))).unwrap();
    let (parts, body) = h2.send_request(request).await.unwrap().into_parts();
    common::Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}
