//! The scheme a peer in `trusted_proxies` sent (`X-Forwarded-Proto`) reaches the upstream,
//! on every path that forwards: a TLS-terminating load balancer in front says `https`, and
//! an app behind a proxy that said `http` would redirect to itself forever. Its
//! `X-Forwarded-Host` and `Forwarded` do not: routes and keys read `Host`, and an app that
//! read another host than they did could run two tenants' requests under one key. Any
//! other peer's fields are replaced or removed, as a client must not name its own scheme
//! or host; and which a peer is, is decided per request, so a reload that stops trusting
//! it applies on its open connections.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::common::{connect_from, reload, start_proxy, start_upstream};

/// Every path that forwards to the upstream echoing the headers it got: an owner, an
/// observed request and one too large to buffer (streamed on), and pass-through.
const ROUTES: &str = r#"
routes:
  - name: owned
    match: { methods: [POST], path: /echo-headers }
    key: { header: Idempotency-Key, required: true }
  - name: observed
    match: { methods: [PUT], path: /echo-headers }
    key: { header: Idempotency-Key, required: true }
    idempotency: observe
    max_body: 16B
  - name: open
    match: { path: /echo-headers }
    idempotency: off
"#;

const TRUSTING_LOOPBACK: &str = "trusted_proxies: [127.0.0.1/32]\n";

/// What a TLS-terminating load balancer tells the app it forwards to.
const BALANCER: [(&str, &str); 3] = [
    ("x-forwarded-proto", "https"),
    ("x-forwarded-host", "shop.example"),
    ("forwarded", "for=203.0.113.7;proto=https;host=shop.example"),
];

/// What other proxies tell the app of the client's scheme, port and address: Rack 2.2
/// reads `X-Forwarded-Ssl` and `X-Forwarded-Scheme` before `X-Forwarded-Proto`, gunicorn
/// `X-Forwarded-Protocol`, Microsoft's servers `Front-End-Https`; apps take `X-Real-IP`,
/// `True-Client-IP`, `CF-Connecting-IP`, `Fastly-Client-IP`, `Client-IP` (Rails),
/// `X-Client-IP`, `X-Cluster-Client-IP`, `X-Forwarded` or `Forwarded-For` (Node's
/// `request-ip`), `X-AppEngine-User-IP` (Google App Engine's) or `Fly-Client-IP` (Fly.io's)
/// for the client.
const CLIENT_CLAIMS: [(&str, &str); 16] = [
    ("x-forwarded-ssl", "on"),
    ("x-forwarded-scheme", "https"),
    ("x-forwarded-port", "443"),
    ("x-forwarded-protocol", "https"),
    ("front-end-https", "on"),
    ("x-real-ip", "203.0.113.7"),
    ("true-client-ip", "203.0.113.7"),
    ("cf-connecting-ip", "203.0.113.7"),
    ("fastly-client-ip", "203.0.113.7"),
    ("client-ip", "203.0.113.7"),
    ("x-client-ip", "203.0.113.7"),
    ("x-cluster-client-ip", "203.0.113.7"),
    ("x-forwarded", "for=203.0.113.7"),
    ("forwarded-for", "203.0.113.7"),
    ("x-appengine-user-ip", "203.0.113.7"),
    ("fly-client-ip", "203.0.113.7"),
];

/// The `Host` the proxy is reached by (the balancer's name for its backend).
const HOST: &str = "backend.internal:8080";

/// One keep-alive HTTP/1.1 connection to `proxy` from `source`.
async fn open(source: &str, proxy: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = connect_from(source, proxy).await;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

/// A request down each path, on `sender`, with `fields`; per path, the headers the upstream
/// received. `round` makes the keys new.
async fn each_path(
    sender: &mut SendRequest<Full<Bytes>>,
    fields: &[(&str, &str)],
    round: &str,
) -> Vec<(&'static str, serde_json::Value)> {
    let large = "x".repeat(64);
    let paths = [
        ("pass-through", Method::GET, "", ""),
        ("owner", Method::POST, "owned", "{}"),
        ("observed", Method::PUT, "observed", "{}"),
        ("observed, too large", Method::PUT, "large", large.as_str()),
    ];
    let mut seen = Vec::new();
    for (path, method, key, body) in paths {
        let mut request = Request::builder()
            .method(method)
            .uri("/echo-headers")
            .header("host", HOST);
        if !key.is_empty() {
            request = request.header("idempotency-key", format!("{round}-{key}"));
        }
        for (name, value) in fields {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        sender.ready().await.expect("the connection stays open");
        let answer = sender.send_request(request).await.unwrap();
        assert!(answer.status().is_success(), "{path}: {}", answer.status());
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        let echoed: serde_json::Value = serde_json::from_slice(&body).unwrap();
        seen.push((path, echoed["headers"].clone()));
    }
    seen
}

/// Asserts, on every path, that the upstream got the scheme `proto`, the host the proxy
/// routed by, and no `Forwarded`.
fn forwarded_as(seen: &[(&str, serde_json::Value)], proto: &str) {
    for (path, headers) in seen {
        assert_eq!(
            headers["x-forwarded-proto"],
            serde_json::json!([proto]),
            "{path}: {headers}"
        );
        assert_eq!(
            headers["x-forwarded-host"],
            serde_json::json!([HOST]),
            "{path}: {headers}"
        );
        assert!(headers.get("forwarded").is_none(), "{path}: {headers}");
    }
}

/// Behind a TLS-terminating balancer idemgate listens in cleartext: the balancer's `https`
/// is what the app must see, on unprotected and protected routes alike, also where the
/// balancer appended it after a client's own; its host and `Forwarded` are replaced by
/// what the proxy routed by. A trusted peer that sent no scheme gets the proxy's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxys_scheme_reaches_the_upstream_and_its_host_is_the_routed_one() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &format!("{TRUSTING_LOOPBACK}{ROUTES}")).await;
    let mut balancer = open("127.0.0.1", proxy.addr).await;
    forwarded_as(&each_path(&mut balancer, &BALANCER, "lb").await, "https");
    let appended = [
        ("x-forwarded-proto", "http"),
        ("x-forwarded-proto", "https"),
    ];
    forwarded_as(
        &each_path(&mut balancer, &appended, "appended").await,
        "https",
    );
    forwarded_as(&each_path(&mut balancer, &[], "bare").await, "http");
    // What it says of the client's scheme, port and address goes on as it sent it.
    for (path, headers) in each_path(&mut balancer, &CLIENT_CLAIMS, "claims").await {
        for (name, value) in CLIENT_CLAIMS {
            assert_eq!(
                headers[name],
                serde_json::json!([value]),
                "{path}: {headers}"
            );
        }
    }
    // X-Forwarded-For is appended to from every peer: the balancer's own address last.
    let seen = each_path(&mut balancer, &[("x-forwarded-for", "203.0.113.7")], "xff").await;
    for (path, headers) in seen {
        assert_eq!(
            headers["x-forwarded-for"],
            serde_json::json!(["203.0.113.7, 127.0.0.1"]),
            "{path}: {headers}"
        );
    }
}

/// A peer outside `trusted_proxies` (127.0.0.2 here, with 127.0.0.1 trusted) names no
/// scheme, host, port or address of its own: the proxy's replace them, and its
/// `Forwarded` and every other field of `CLIENT_CLAIMS` are removed, on every path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_peers_forwarded_fields_are_replaced_or_removed() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &format!("{TRUSTING_LOOPBACK}{ROUTES}")).await;
    let mut client = open("127.0.0.2", proxy.addr).await;
    let mut fields = BALANCER.to_vec();
    fields.extend(CLIENT_CLAIMS);
    let seen = each_path(&mut client, &fields, "client").await;
    forwarded_as(&seen, "http");
    for (path, headers) in &seen {
        for (name, _) in CLIENT_CLAIMS {
            assert!(headers.get(name).is_none(), "{path}: {name}: {headers}");
        }
    }
}

/// A reload that drops the peer from `trusted_proxies` applies to its next request on the
/// connection it already has open: keep-alive connections from a balancer live for hours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_stops_trusting_a_peer_applies_on_its_open_connection() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, &format!("{TRUSTING_LOOPBACK}{ROUTES}")).await;
    let mut peer = open("127.0.0.1", proxy.addr).await;
    forwarded_as(&each_path(&mut peer, &BALANCER, "before").await, "https");
    reload(&proxy, upstream.addr, ROUTES);
    forwarded_as(&each_path(&mut peer, &BALANCER, "after").await, "http");
}
