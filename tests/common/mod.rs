//! Test helpers: a real upstream on 127.0.0.1:0 that counts what it executes, an in-process
//! idemgate on 127.0.0.1:0, and a small HTTP client. No mocks: everything crosses sockets.
#![allow(dead_code)]

pub mod mariadb_server;
pub mod postgres_server;
pub mod redis_server;
pub mod unprivileged;

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
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use sha2::{Digest as _, Sha256};

use idemgate::config::Config;
use idemgate::proxy::Proxy;
use idemgate::store::Store;

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

/// Starts the test upstream. Behaviour per path:
/// - non-GET `/orders…`: counts, sleeps `x-test-delay-ms`, answers `x-test-status` (201 by
///   default) with JSON `{"n", "body", "auth"}` and two `Set-Cookie` headers;
/// - `/echo-headers`: answers the received headers and trailers as JSON;
/// - `/upload`: hashes the streamed body without buffering it, answers `"<len> <sha256>"`;
/// - GET `/download?bytes=N`: streams N deterministic bytes;
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
fn serve<H, F, E>(listener: tokio::net::TcpListener, handle: H)
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

type TestBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn full(data: impl Into<Bytes>) -> TestBody {
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
    if path == "/echo-headers" {
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
        let answer =
            serde_json::json!({ "headers": seen, "trailers": trailers, "body_len": body.len() });
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
        if let Some(ms) = header_u64(&headers, "x-test-delay-ms") {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if headers.contains_key("x-test-reset") {
            // hyper closes a connection whose service failed, without an answer.
            return Err(Reset);
        }
        let status = header_u64(&headers, "x-test-status").unwrap_or(201) as u16;
        if let Some(n) = header_u64(&headers, "x-test-bytes") {
            // A large answer, streamed in 64 KiB chunks without being held whole.
            let n = n as usize;
            let stream = futures_util::stream::iter((0..n.div_ceil(CHUNK)).map(move |i| {
                let len = CHUNK.min(n - i * CHUNK);
                Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'x'; len])))
            }));
            return Ok(Response::builder()
                .status(status)
                .header("content-type", "application/octet-stream")
                .body(StreamBody::new(stream).boxed())
                .unwrap());
        }
        let answer = serde_json::json!({
            "n": n,
            "body": String::from_utf8_lossy(&body),
            "auth": headers.get("authorization").map(|v| v.to_str().unwrap_or("")),
        });
        return Ok(Response::builder()
            .status(status)
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

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
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

/// The `Content-Length` in an answer head read as text (the field name in any case).
pub fn content_length_of(head: &str) -> usize {
    head.lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .map(|(_, value)| value.trim().parse().expect("a numeric Content-Length"))
        .unwrap_or_else(|| panic!("no Content-Length in {head:?}"))
}

/// An in-process idemgate.
pub struct ProxyHandle {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub store: Store,
    pub proxy: Proxy,
}

impl ProxyHandle {
    /// The value of one metric series (`name{labels}` as `/metrics` writes it; 0 when
    /// absent).
    pub fn metric(&self, series: &str) -> f64 {
        let text = self.proxy.metrics().render(self.store.stats());
        metric_in(&text, series)
    }

    /// Waits until the series reaches `n` (hang guard: 30 s): the proxy's own signal that
    /// something happened, such as duplicates parked waiting (`idemgate_waiting`).
    pub async fn metric_reaches(&self, series: &str, n: f64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.metric(series) < n {
            assert!(
                std::time::Instant::now() < deadline,
                "hang guard: {series} never reached {n}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The value of `series` in a `/metrics` text (0 when absent).
pub fn metric_in(text: &str, series: &str) -> f64 {
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0.0, |v| v.trim().parse().unwrap())
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

/// Starts idemgate in front of `upstream`; `rest` is the YAML after `listen`/`upstream`.
pub async fn start_proxy(upstream: SocketAddr, rest: &str) -> ProxyHandle {
    start_proxy_with_admin(upstream, rest, None).await
}

/// Same, with an admin listener (optionally behind a bearer token) on 127.0.0.1:0.
pub async fn start_proxy_with_admin(
    upstream: SocketAddr,
    rest: &str,
    admin_token: Option<&str>,
) -> ProxyHandle {
    let text = format!("listen: 127.0.0.1:0\nupstream: http://{upstream}\n{rest}");
    start_proxy_from(&text, admin_token).await
}

/// Starts idemgate from a whole config text (its `listen` is ignored: 127.0.0.1:0).
pub async fn start_proxy_from(text: &str, admin_token: Option<&str>) -> ProxyHandle {
    start_proxy_tuned(text, admin_token, |proxy| proxy).await
}

/// [`start_proxy_from`], with `tune` applied to the `Proxy` before it serves (settings
/// that are not in the config file, such as the body read timeout).
pub async fn start_proxy_tuned(
    text: &str,
    admin_token: Option<&str>,
    tune: impl FnOnce(Proxy) -> Proxy,
) -> ProxyHandle {
    let config = Arc::new(Config::parse(text, "test.yaml").expect("test config"));
    let store = idemgate::server::open_store(&config).expect("store");
    let proxy = tune(Proxy::new(
        Arc::clone(&config),
        store.clone(),
        Arc::new(idemgate::metrics::Metrics::new()),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = admin_listener.local_addr().unwrap();
    tokio::spawn(idemgate::server::serve_admin(
        admin_listener,
        proxy.clone(),
        admin_token.map(str::to_owned),
        std::future::pending(),
    ));
    tokio::spawn(idemgate::server::serve_proxy(
        listener,
        proxy.clone(),
        std::future::pending(),
        Duration::from_secs(1),
    ));
    ProxyHandle {
        addr,
        admin,
        store,
        proxy,
    }
}

/// A real `idemgate run` process (so it can be signalled or SIGKILLed like a replica).
pub struct ProxyProcess {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub config: std::path::PathBuf,
    log: std::path::PathBuf,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl ProxyProcess {
    /// Starts the binary with `rest` appended to generated listen/upstream/admin lines, and
    /// waits until it accepts connections.
    pub fn start(upstream: SocketAddr, rest: &str) -> Self {
        Self::start_logging(upstream, rest, "warn")
    }

    /// Same, with `IDEMGATE_LOG=level`; the log goes to a file, see [`ProxyProcess::log`].
    pub fn start_logging(upstream: SocketAddr, rest: &str, level: &str) -> Self {
        Self::start_with_args(upstream, rest, level, &[])
    }

    /// Same, with extra arguments after `run --config FILE`.
    pub fn start_with_args(upstream: SocketAddr, rest: &str, level: &str, args: &[&str]) -> Self {
        let port = redis_server::free_port();
        let admin_port = redis_server::free_port();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("proxy.yaml");
        let log = dir.path().join("idemgate.log");
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:{port}\nupstream: http://{upstream}\nadmin: 127.0.0.1:{admin_port}\n{rest}"
            ),
        )
        .unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .args(["run", "--config"])
            .arg(&config)
            .args(args)
            .env("IDEMGATE_LOG", level)
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        redis_server::wait_until(
            || std::net::TcpStream::connect(addr).is_ok(),
            "the proxy process to listen",
        );
        Self {
            addr,
            admin: format!("127.0.0.1:{admin_port}").parse().unwrap(),
            config,
            log,
            child,
            _dir: dir,
        }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends a signal (`HUP`, `TERM`, …) with kill(1).
    pub fn signal(&self, name: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit by itself (hang guard: 60 s).
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "hang guard: still running"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no cleanup, no release, like a crashed replica.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

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

/// The store key the proxy derives for a request from 127.0.0.1 (hex), as
/// `idemgate explain` shows it: what the admin API takes.
pub fn stored_key(
    proxy: &ProxyHandle,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> String {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            http::HeaderValue::from_str(value).unwrap(),
        );
    }
    // The host is part of the key: the one [`post`] and [`send`] name, unless given.
    if !map.contains_key(http::header::HOST) {
        map.insert(
            http::header::HOST,
            http::HeaderValue::from_str(&proxy.addr.to_string()).unwrap(),
        );
    }
    let request = idemgate::explain::Request {
        method: Method::POST,
        uri: path.parse().unwrap(),
        headers: map,
        body: body.to_vec(),
        client_ip: Some(std::net::Ipv4Addr::LOCALHOST.into()),
    };
    let text = idemgate::explain::explain(&proxy.proxy.config(), &request).expect("a key");
    text.lines()
        .find_map(|l| l.strip_prefix("key digest:"))
        .map(|d| d.trim().to_owned())
        .unwrap_or_else(|| panic!("no key digest in {text}"))
}

/// One request a [`Recorder`] received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    /// The request target as it arrived: path and query.
    pub target: String,
    pub headers: HeaderMap,
}

/// A real upstream that records every request it gets (method, target, headers) and
/// answers each with `201`, `x-test-status` if given, a JSON body `{"n", "path",
/// "session"}` and `Set-Cookie: session=<the caller's sessionid cookie>-renewed`: an
/// answer that belongs to one caller, as a login or cart answer does.
pub struct Recorder {
    pub addr: SocketAddr,
    seen: Arc<std::sync::Mutex<Vec<Seen>>>,
}

impl Recorder {
    /// Everything received so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests it executed.
    pub fn executed(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// Starts a [`Recorder`] on 127.0.0.1:0.
pub async fn start_recorder() -> Recorder {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<std::sync::Mutex<Vec<Seen>>> = Arc::default();
    let log = Arc::clone(&seen);
    serve(listener, move |req: Request<Incoming>| {
        let log = Arc::clone(&log);
        async move {
            let (parts, body) = req.into_parts();
            let _ = body.collect().await;
            let target = parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            let session = parts
                .headers
                .get_all("cookie")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(';'))
                .find_map(|c| c.trim().strip_prefix("sessionid="))
                .unwrap_or("none")
                .to_owned();
            let status = header_u64(&parts.headers, "x-test-status").unwrap_or(201);
            let n = {
                let mut seen = log.lock().unwrap();
                seen.push(Seen {
                    method: parts.method.clone(),
                    target: target.clone(),
                    headers: parts.headers.clone(),
                });
                seen.len()
            };
            let path = target.split('?').next().unwrap_or("").to_owned();
            let answer = serde_json::json!({ "n": n, "path": path, "session": session });
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status as u16)
                    .header("content-type", "application/json")
                    .header("set-cookie", format!("session={session}-renewed"))
                    .body(full(answer.to_string()))
                    .unwrap(),
            )
        }
    });
    Recorder { addr, seen }
}

/// Sends raw request bytes from a socket bound to `source` (another loopback address acts
/// as another caller) and returns the whole answer (the request should ask
/// `connection: close`). The 30 s bound is a hang guard only.
pub async fn raw_exchange_from(source: &str, addr: SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("hang guard: the proxy neither answered nor closed the connection")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
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

/// Runs `idemgate explain --config CONFIG ARGS…` and returns what it printed; fails the
/// test if it does not succeed.
pub fn explain_cli(config: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["explain", "--config"])
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The admin listener's `/metrics` text (an admin without a token).
pub async fn metrics_text(admin: SocketAddr) -> String {
    let answer = send(admin, Method::GET, "/metrics", &[], "").await;
    assert_eq!(answer.status, StatusCode::OK);
    String::from_utf8_lossy(&answer.body).into_owned()
}

/// The value of one sample line of `/metrics` (`name` with its labels, if any), 0 if absent.
pub async fn metric(admin: SocketAddr, name: &str) -> f64 {
    metric_in(&metrics_text(admin).await, name)
}

/// 200 concurrent requests over 10 keys, alternating between two proxy processes started
/// with `config` (a shared store): each key executes once and every answer for it is the
/// same on both replicas.
pub async fn two_proxies_execute_each_key_once(config: &str) {
    let upstream = start_upstream().await;
    let a = ProxyProcess::start(upstream.addr, config);
    let b = ProxyProcess::start(upstream.addr, config);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let target = if i % 2 == 0 { a.addr } else { b.addr };
        tasks.push(tokio::spawn(async move {
            let key = format!("key-{}", i % 10);
            let answer = post(
                target,
                "/orders",
                &[("idempotency-key", &key), ("x-test-delay-ms", "50")],
                "{\"sku\":\"A1\"}",
            )
            .await;
            (key, answer)
        }));
    }
    let mut bodies: std::collections::HashMap<String, Bytes> = Default::default();
    for t in tasks {
        let (key, answer) = t.await.unwrap();
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        let first = bodies.entry(key).or_insert_with(|| answer.body.clone());
        assert_eq!(*first, answer.body, "identical answers on both replicas");
    }
    assert_eq!(upstream.executed(), 10);
    assert_eq!(upstream.most_executions_of_one_key(), 1);
}
