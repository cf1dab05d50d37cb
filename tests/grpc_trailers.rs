//! A protected answer keeps its trailers: a gRPC unary call says how it ended in its
//! `grpc-status`/`grpc-message` trailers, so the owner, the duplicates that waited on it and
//! later repeats all get them after the body, from an HTTP/1.1 or an HTTP/2 upstream, in
//! clear or sealed (`store.encrypt`), over HTTP/2 and HTTP/1.1 clients (`TE: trailers`).

#[path = "common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use tokio::io::AsyncWriteExt;
use tokio::sync::{watch, Notify};

use common::{raw_exchange, start_proxy};

/// What the upstream answers: a gRPC body, then its status in trailers, with a field only a
/// header section may carry (`set-cookie`), which never goes on.
const RAW_GRPC_ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\n\
    transfer-encoding: chunked\r\ntrailer: grpc-status, grpc-message\r\n\r\n\
    5\r\nhello\r\n0\r\ngrpc-status: 0\r\ngrpc-message: all good\r\nset-cookie: t=1\r\n\r\n";

/// A gRPC-shaped upstream on 127.0.0.1:0 that counts the calls it runs and holds each one
/// until the test opens its gate.
struct GrpcUpstream {
    addr: SocketAddr,
    executed: Arc<AtomicUsize>,
    arrived: Arc<Notify>,
    gate: watch::Sender<bool>,
}

impl GrpcUpstream {
    /// Speaks HTTP/2 (prior knowledge) with `http2`, else HTTP/1.1 written by hand (a hyper
    /// server sends trailers only to a request with `TE: trailers`, which no HTTP/1.1
    /// proxy has to send).
    async fn start(http2: bool) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let executed = Arc::new(AtomicUsize::new(0));
        let arrived = Arc::new(Notify::new());
        let (gate, opened) = watch::channel(false);
        let (count, notify) = (Arc::clone(&executed), Arc::clone(&arrived));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (count, notify, opened) =
                    (Arc::clone(&count), Arc::clone(&notify), opened.clone());
                tokio::spawn(async move {
                    if http2 {
                        serve_h2(stream, count, notify, opened).await;
                    } else {
                        serve_h1(stream, count, notify, opened).await;
                    }
                });
            }
        });
        Self {
            addr,
            executed,
            arrived,
            gate,
        }
    }

    /// Waits until a call has arrived (hang guard: 30 s).
    async fn first_arrived(&self) {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let arrived = self.arrived.notified();
                if self.executed.load(Ordering::SeqCst) > 0 {
                    return;
                }
                arrived.await;
            }
        })
        .await
        .expect("hang guard: the call never reached the upstream");
    }

    fn open(&self) {
        self.gate.send_replace(true);
    }
}

/// Counts a call as run and holds it until the gate opens.
async fn run(count: &AtomicUsize, arrived: &Notify, mut opened: watch::Receiver<bool>) {
    count.fetch_add(1, Ordering::SeqCst);
    arrived.notify_waiters();
    let _ = opened.wait_for(|open| *open).await;
}

async fn serve_h1(
    mut stream: tokio::net::TcpStream,
    count: Arc<AtomicUsize>,
    arrived: Arc<Notify>,
    opened: watch::Receiver<bool>,
) {
    let mut buf = Vec::new();
    while common::read_one_request(&mut stream, &mut buf).await {
        run(&count, &arrived, opened.clone()).await;
        if stream.write_all(RAW_GRPC_ANSWER).await.is_err() {
            return;
        }
    }
}

async fn serve_h2(
    stream: tokio::net::TcpStream,
    count: Arc<AtomicUsize>,
    arrived: Arc<Notify>,
    opened: watch::Receiver<bool>,
) {
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        let (count, arrived, opened) = (Arc::clone(&count), Arc::clone(&arrived), opened.clone());
        async move {
            let _ = request.into_body().collect().await;
            run(&count, &arrived, opened).await;
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            trailers.insert("grpc-message", "all good".parse().unwrap());
            trailers.insert("set-cookie", "t=1".parse().unwrap());
            let frames = [
                Frame::data(Bytes::from_static(b"hello")),
                Frame::trailers(trailers),
            ];
            let body = StreamBody::new(futures_util::stream::iter(
                frames.map(Ok::<_, std::convert::Infallible>),
            ));
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(body)
                    .unwrap(),
            )
        }
    });
    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
}

/// How the proxy speaks to the upstream: HTTP/2, or HTTP/1.1 with hyper's client or the
/// hand-written one (each test names its own, whatever the suite's run asks for).
#[derive(Clone, Copy)]
enum Upstream {
    Http2,
    Http1(&'static str),
}

fn config(upstream: Upstream, store: &str) -> String {
    let connections = match upstream {
        Upstream::Http2 => "upstream_protocol: http2".to_owned(),
        Upstream::Http1(client) => format!("upstream_protocol: http1, upstream_http1: {client}"),
    };
    format!("connections: {{ {connections} }}\n{store}")
}

/// The answer to one gRPC unary call over HTTP/2: status, replayed or not, body, trailers.
async fn call(proxy: SocketAddr) -> (StatusCode, bool, Bytes, http::HeaderMap) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{proxy}/pay.Payments/Charge"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", "Bearer alice")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\x02{}")))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    let status = response.status();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    (status, replayed, collected.to_bytes(), trailers)
}

/// The owner's call and two duplicates that arrive while it runs, then a later repeat: all
/// get `grpc-status` and `grpc-message` after the body, the repeats marked replayed, and
/// the upstream ran once.
async fn grpc_call_keeps_its_trailers(protocol: Upstream, store: &str) {
    let upstream = GrpcUpstream::start(matches!(protocol, Upstream::Http2)).await;
    let proxy = start_proxy(upstream.addr, &config(protocol, store)).await;
    let owner = tokio::spawn(call(proxy.addr));
    upstream.first_arrived().await;
    let duplicates: Vec<_> = (0..2).map(|_| tokio::spawn(call(proxy.addr))).collect();
    proxy.metric_reaches("idemgate_waiting", 2.0).await;
    upstream.open();
    let mut answers = vec![(false, owner.await.unwrap())];
    for duplicate in duplicates {
        answers.push((true, duplicate.await.unwrap()));
    }
    answers.push((true, call(proxy.addr).await));
    for (n, (replay, (status, replayed, body, trailers))) in answers.into_iter().enumerate() {
        assert_eq!(status, StatusCode::OK, "call {n}");
        assert_eq!(replayed, replay, "call {n}");
        assert_eq!(body, "hello", "call {n}");
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"0"[..]),
            "call {n} lost its trailers: {trailers:?}"
        );
        assert_eq!(trailers["grpc-message"], "all good", "call {n}");
        assert!(
            !trailers.contains_key("set-cookie"),
            "call {n}: {trailers:?}"
        );
    }
    assert_eq!(upstream.executed.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_from_an_http1_upstream_keeps_its_trailers_for_owner_and_duplicates() {
    grpc_call_keeps_its_trailers(Upstream::Http1("hyper"), "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_through_the_hand_written_http1_client_keeps_its_trailers() {
    grpc_call_keeps_its_trailers(Upstream::Http1("idemgate"), "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_from_an_http2_upstream_keeps_its_trailers_for_owner_and_duplicates() {
    grpc_call_keeps_its_trailers(Upstream::Http2, "").await;
}

/// Sealed, the trailers are inside the ciphertext and come back when it opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_grpc_answer_keeps_its_trailers_for_owner_and_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("store.key");
    std::fs::write(&key, format!("{}\n", hex::encode([7u8; 32]))).unwrap();
    let store = format!("store: {{ encrypt: {{ key_file: {} }} }}", key.display());
    grpc_call_keeps_its_trailers(Upstream::Http2, &store).await;
}

/// An HTTP/1.1 client that asked for trailers (`TE: trailers`) gets them, chunked, as the
/// owner and replayed; one that did not gets the same body without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_client_asking_for_trailers_gets_them_owner_and_replayed() {
    let upstream = GrpcUpstream::start(true).await;
    upstream.open();
    let proxy = start_proxy(upstream.addr, &config(Upstream::Http2, "")).await;
    let request = |te: &str| {
        format!(
            "POST /pay.Payments/Charge HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/grpc\r\n\
             authorization: Bearer bob\r\n{te}content-length: 2\r\nconnection: close\r\n\r\n{{}}"
        )
    };
    for replayed in [false, true] {
        let answer = raw_exchange(proxy.addr, request("te: trailers\r\n").as_bytes()).await;
        let lower = answer.to_ascii_lowercase();
        assert!(lower.starts_with("http/1.1 200"), "{answer}");
        assert_eq!(
            lower.contains("idempotent-replayed: true"),
            replayed,
            "{answer}"
        );
        assert!(lower.contains("transfer-encoding: chunked"), "{answer}");
        assert!(
            lower.ends_with("5\r\nhello\r\n0\r\ngrpc-status: 0\r\ngrpc-message: all good\r\n\r\n"),
            "replayed: {replayed}: {answer}"
        );
    }
    let answer = raw_exchange(proxy.addr, request("").as_bytes()).await;
    let lower = answer.to_ascii_lowercase();
    assert!(lower.contains("idempotent-replayed: true"), "{answer}");
    assert!(lower.ends_with("hello\r\n0\r\n\r\n"), "{answer}");
    assert_eq!(upstream.executed.load(Ordering::SeqCst), 1);
}

/// An upstream's `Idempotent-Replayed` sent as a trailer is dropped from a protected answer,
/// as the header is: the owner's answer, read whole (and so stored) or streamed on past
/// `max_answer`, never carries it, and a replay has the proxy's header alone, its other
/// trailers kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_s_replayed_trailer_never_reaches_a_protected_answer() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let executed = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&executed);
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ntransfer-encoding: chunked\r\n\
         trailer: idempotent-replayed, grpc-status\r\n\r\n800\r\n{}\r\n0\r\n\
         idempotent-replayed: true\r\ngrpc-status: 0\r\n\r\n",
        "x".repeat(2048)
    );
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (count, answer) = (Arc::clone(&count), answer.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while common::read_one_request(&mut stream, &mut buf).await {
                    count.fetch_add(1, Ordering::SeqCst);
                    if stream.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let routes = "connections: { upstream_protocol: http1 }\nroutes:\n\
        \x20 - name: whole\n    match: { path: /whole }\n    key: { header: Idempotency-Key }\n\
        \x20 - name: streamed\n    match: { path: /streamed }\n    key: { header: Idempotency-Key }\n\
        \x20   max_answer: 1KiB\n";
    let proxy = start_proxy(addr, routes).await;
    let request = |path: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nidempotency-key: k1\r\nte: trailers\r\n\
             content-length: 2\r\nconnection: close\r\n\r\n{{}}"
        )
    };
    for (path, replayed) in [("/whole", false), ("/whole", true), ("/streamed", false)] {
        let answer = raw_exchange(proxy.addr, request(path).as_bytes()).await;
        let lower = answer.to_ascii_lowercase();
        assert!(lower.starts_with("http/1.1 200"), "{path}: {answer}");
        let said = lower.matches("idempotent-replayed: ").count();
        assert_eq!(
            said,
            usize::from(replayed),
            "{path}, replayed {replayed}: {answer}"
        );
        assert!(
            lower.ends_with("0\r\ngrpc-status: 0\r\n\r\n"),
            "{path}: {answer}"
        );
    }
    assert_eq!(executed.load(Ordering::SeqCst), 2);
}
