//! The real upstream: counts what it executes (overall and per key), holds requests at
//! named gates, and answers as each test header asks (status, delay, size, reset).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use sha2::{Digest as _, Sha256};

/// A real HTTP upstream. Every non-GET request to `/orders…` "executes" (is counted).
pub struct Upstream {
    pub addr: SocketAddr,
    executed: Arc<AtomicUsize>,
    per_key: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    gates: Arc<Gates>,
}

/// Named gates: a request carrying `x-test-gate: NAME` is counted as arrived at NAME (and
/// executed), then held until the test opens NAME. Tests wait for arrivals instead of
/// sleeping, so no race is won by a sleep.
#[derive(Default)]
pub struct Gates {
    state: std::sync::Mutex<std::collections::HashMap<String, (usize, bool)>>,
    changed: tokio::sync::Notify,
}

impl Gates {
    async fn pass(&self, name: &str) {
        loop {
            let changed = self.changed.notified();
            {
                let mut state = self.state.lock().unwrap();
                let entry = state.entry(name.to_owned()).or_default();
                if entry.1 {
                    return;
                }
            }
            changed.await;
        }
    }

    fn arrive(&self, name: &str) {
        self.state
            .lock()
            .unwrap()
            .entry(name.to_owned())
            .or_default()
            .0 += 1;
        self.changed.notify_waiters();
    }
}

impl Upstream {
    /// Waits until `n` requests have arrived at gate `name` (hang guard: 30 s).
    pub async fn arrived(&self, name: &str, n: usize) {
        let gates = &self.gates;
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let changed = gates.changed.notified();
                let count = gates.state.lock().unwrap().get(name).map_or(0, |e| e.0);
                if count >= n {
                    return;
                }
                changed.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("hang guard: {n} requests never arrived at gate {name}"));
    }

    /// Lets every request held at gate `name` go on, and every later one through.
    pub fn open(&self, name: &str) {
        self.gates
            .state
            .lock()
            .unwrap()
            .entry(name.to_owned())
            .or_default()
            .1 = true;
        self.gates.changed.notify_waiters();
    }

    /// How many requests it executed.
    pub fn executed(&self) -> usize {
        self.executed.load(Ordering::SeqCst)
    }

    /// How many requests carrying this `Idempotency-Key` it executed.
    pub fn executed_for(&self, key: &str) -> usize {
        self.per_key.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    /// The largest execution count of any single key.
    pub fn most_executions_of_one_key(&self) -> usize {
        self.per_key
            .lock()
            .unwrap()
            .values()
            .copied()
            .max()
            .unwrap_or(0)
    }
}

/// An address that refuses every connection for as long as the returned socket lives:
/// bound and never listening. A port bound and closed again could be handed meanwhile to
/// another test's server, which would answer (or stall) where a refusal was meant.
pub fn refusing_addr() -> (SocketAddr, tokio::net::TcpSocket) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    (socket.local_addr().unwrap(), socket)
}

/// Starts the test upstream. Behaviour per path:
/// - non-GET `/orders…`: counts, answers `x-test-status` (201 by
///   default) with JSON `{"n", "body", "auth"}` and two `Set-Cookie` headers (and the
///   value of `x-test-replayed` as its own `Idempotent-Replayed`, as an app may send);
/// - `/echo-headers`: answers the received headers and trailers as JSON, with the HTTP
///   version and the request target (absolute over HTTP/2: `:scheme` and `:authority`);
/// - `/upload`: hashes the streamed body without buffering it, answers `"<len> <sha256>"`;
/// - GET `/download?bytes=N`: streams N deterministic bytes;
/// - `/trailers`: streams `hello`, then the trailers `x-checksum: 1`, `grpc-status: 0` and
///   `set-cookie: t=1`, declared in `Trailer` (not with `?undeclared`, as gRPC servers
///   answer over HTTP/2); over HTTP/1.1 hyper sends them only to `TE: trailers`;
/// - `Upgrade: echo` anywhere: switches protocols and echoes bytes.
pub async fn start_upstream() -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let executed = Arc::new(AtomicUsize::new(0));
    let per_key: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>> = Arc::default();
    let counter = Arc::clone(&executed);
    let keys = Arc::clone(&per_key);
    let gates: Arc<Gates> = Arc::default();
    let held = Arc::clone(&gates);
    serve(listener, move |req| {
        upstream_handle(
            req,
            Arc::clone(&counter),
            Arc::clone(&keys),
            Arc::clone(&held),
        )
    });
    Upstream {
        addr,
        executed,
        per_key,
        gates,
    }
}

/// Serves every connection `listener` accepts (HTTP/1.1 or HTTP/2, upgrades included),
/// each request answered by `handle`, for as long as the test's runtime runs.
pub(super) fn serve<H, F, E>(listener: tokio::net::TcpListener, handle: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Result<Response<TestBody>, E>> + Send + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let service = service_fn(handle.clone());
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

pub(super) type TestBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

pub(super) fn full(data: impl Into<Bytes>) -> TestBody {
    Full::new(data.into()).boxed()
}

/// Why the test upstream broke a connection instead of answering (`x-test-reset`).
#[derive(Debug)]
struct Reset;

impl std::fmt::Display for Reset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("x-test-reset: connection closed without an answer")
    }
}

impl std::error::Error for Reset {}

async fn upstream_handle(
    mut req: Request<Incoming>,
    executed: Arc<AtomicUsize>,
    per_key: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    gates: Arc<Gates>,
) -> Result<Response<TestBody>, Reset> {
    if req.headers().get("upgrade").is_some_and(|v| v == "echo") {
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(io) = upgrade.await {
                let (mut r, mut w) = tokio::io::split(TokioIo::new(io));
                let _ = tokio::io::copy(&mut r, &mut w).await;
            }
        });
        return Ok(Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("upgrade", "echo")
            .header("connection", "upgrade")
            .body(full(Bytes::new()))
            .unwrap());
    }
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if path == "/upload" {
        let mut body = req.into_body();
        let mut hasher = Sha256::new();
        let mut len = 0usize;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                len += data.len();
                hasher.update(&data);
            }
        }
        let answer = format!("{len} {}", hex::encode(hasher.finalize()));
        return Ok(Response::new(full(answer)));
    }
    if path == "/download" {
        let n: usize = req
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("bytes="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let chunks = pattern_bytes(n)
            .chunks(64 * 1024)
            .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::copy_from_slice(c))))
            .collect::<Vec<_>>();
        let stream = futures_util::stream::iter(chunks);
        return Ok(Response::new(StreamBody::new(stream).boxed()));
    }
    if path == "/trailers" {
        let _ = req.body_mut().collect().await;
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", "1".parse().unwrap());
        trailers.insert("grpc-status", "0".parse().unwrap());
        trailers.insert("set-cookie", "t=1".parse().unwrap());
        let frames = [
            Frame::data(Bytes::from_static(b"hello")),
            Frame::trailers(trailers),
        ];
        let body = StreamBody::new(futures_util::stream::iter(frames.map(Ok::<_, Infallible>)));
        let mut answer = Response::builder();
        if req.uri().query() != Some("undeclared") {
            answer = answer.header("trailer", "x-checksum, grpc-status, set-cookie");
        }
        return Ok(answer.body(body.boxed()).unwrap());
    }
    if path == "/echo-headers" {
        let (version, uri) = (req.version(), req.uri().to_string());
        let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in req.headers() {
            seen.entry(name.to_string())
                .or_default()
                .push(value.to_str().unwrap_or("?").to_owned());
        }
        let collected = req.into_body().collect().await.unwrap();
        let mut trailers: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in collected.trailers().into_iter().flatten() {
            trailers
                .entry(name.to_string())
                .or_default()
                .push(value.to_str().unwrap_or("?").to_owned());
        }
        let body = collected.to_bytes();
        let answer = serde_json::json!({
            "headers": seen,
            "trailers": trailers,
            "body_len": body.len(),
            "version": format!("{version:?}"),
            "uri": uri,
        });
        return Ok(Response::new(full(answer.to_string())));
    }
    if path.starts_with("/orders") && method != Method::GET {
        let n = executed.fetch_add(1, Ordering::SeqCst) + 1;
        let headers = req.headers().clone();
        if let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) {
            *per_key.lock().unwrap().entry(key.to_owned()).or_default() += 1;
        }
        let body = req.into_body().collect().await.unwrap().to_bytes();
        if let Some(gate) = headers.get("x-test-gate").and_then(|v| v.to_str().ok()) {
            gates.arrive(gate);
            gates.pass(gate).await;
        }
        if headers.contains_key("x-test-reset") {
            // hyper closes a connection whose service failed, without an answer.
            return Err(Reset);
        }
        let status = header_u64(&headers, "x-test-status").unwrap_or(201) as u16;
        let mut reply = Response::builder().status(status);
        if let Some(replayed) = headers.get("x-test-replayed") {
            reply = reply.header("idempotent-replayed", replayed);
        }
        if let Some(n) = header_u64(&headers, "x-test-pad") {
            // A header of `n` bytes: a record larger than its body.
            reply = reply.header("x-pad", "p".repeat(n as usize));
        }
        if let Some(n) = header_u64(&headers, "x-test-bytes") {
            // A large answer, streamed in 64 KiB chunks without being held whole.
            let n = n as usize;
            let stream = futures_util::stream::iter((0..n.div_ceil(CHUNK)).map(move |i| {
                let len = CHUNK.min(n - i * CHUNK);
                Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'x'; len])))
            }));
            return Ok(reply
                .header("content-type", "application/octet-stream")
                .body(StreamBody::new(stream).boxed())
                .unwrap());
        }
        let answer = serde_json::json!({
            "n": n,
            "body": String::from_utf8_lossy(&body),
            "auth": headers.get("authorization").map(|v| v.to_str().unwrap_or("")),
        });
        return Ok(reply
            .header("content-type", "application/json")
            .header("set-cookie", "a=1; Path=/")
            .header("set-cookie", "b=2; Path=/")
            .body(full(answer.to_string()))
            .unwrap());
    }
    // Read to its end before answering, as an app does: a server that answers without
    // reading the body closes the connection, and a request the proxy sent on it meanwhile
    // would be lost in flight.
    let _ = req.into_body().collect().await;
    let answer = serde_json::json!({ "executed": executed.load(Ordering::SeqCst) });
    Ok(Response::new(full(answer.to_string())))
}

/// Chunk size of the large answers `x-test-bytes` asks for.
const CHUNK: usize = 64 * 1024;

pub(super) fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

/// Deterministic, non-repeating-looking bytes for byte-exact transfer checks.
pub fn pattern_bytes(n: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// For upstreams that write raw bytes: reads one request (its head and a `Content-Length`
/// body, if any) off `stream` into `buf` and drops it from `buf`, leaving what follows
/// (a pipelined request). False when the peer closed first.
pub async fn read_one_request(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> bool {
    use tokio::io::AsyncReadExt;
    async fn more(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> bool {
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }
    let end = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        if !more(stream, buf).await {
            return false;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < end + 4 + len {
        if !more(stream, buf).await {
            return false;
        }
    }
    buf.drain(..end + 4 + len);
    true
}
