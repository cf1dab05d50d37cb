//! idemgate under test: in process ([`ProxyHandle`], with its store and metrics) or as a
//! process of the real binary ([`ProxyProcess`]), the key it derives, `idemgate explain`,
//! `/metrics`, and two processes sharing a store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};

use idemgate::config::Config;
use idemgate::proxy::Proxy;
use idemgate::store::Store;

use super::client::{post, send};
use super::redis_server;
use super::upstream::start_upstream;

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
    let text = with_upstream_protocol(text);
    let config = Arc::new(Config::parse(&text, "test.yaml").expect("test config"));
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

/// Swaps in the config `rest` (the YAML after `listen`/`upstream`, as [`start_proxy`]
/// takes it) as `Proxy::reload` does on SIGHUP: connections already open stay open.
pub fn reload(proxy: &ProxyHandle, upstream: SocketAddr, rest: &str) -> idemgate::proxy::Reloaded {
    let text = with_upstream_protocol(&format!(
        "listen: 127.0.0.1:0\nupstream: http://{upstream}\n{rest}"
    ));
    let config = Config::parse(&text, "test.yaml").expect("test config");
    proxy.proxy.reload(Arc::new(config))
}

/// `text` speaking to its upstream in the protocol `IDEMGATE_TEST_UPSTREAM_PROTOCOL` names
/// (`scripts/test` runs the exactly-once and failure suites again with `http2`), unless
/// the test sets its own `connections:`; and over HTTP/1.1 with the client
/// `IDEMGATE_TEST_UPSTREAM_HTTP1` names (`idemgate`: the hand-written one), also added to
/// a test's own one-line `connections: { ... }` that names no upstream protocol or client
/// (the keep-alive and stall tests set only their timeouts there); never with `http2`,
/// which that client does not speak.
pub fn with_upstream_protocol(text: &str) -> String {
    let protocol = std::env::var("IDEMGATE_TEST_UPSTREAM_PROTOCOL").ok();
    let client = std::env::var("IDEMGATE_TEST_UPSTREAM_HTTP1")
        .ok()
        .filter(|_| protocol.as_deref().is_none_or(|p| p == "http1"));
    let own = text.starts_with("connections:") || text.contains("\nconnections:");
    if own {
        let Some(client) = client else {
            return text.to_owned();
        };
        let flow = if text.starts_with("connections: {") {
            Some(0)
        } else {
            text.find("\nconnections: {").map(|i| i + 1)
        };
        let Some(at) = flow else {
            return text.to_owned();
        };
        let line = &text[at..text[at..].find('\n').map_or(text.len(), |n| at + n)];
        if line.contains("upstream_protocol") || line.contains("upstream_http1") {
            return text.to_owned();
        }
        let open = at + "connections: {".len();
        return format!(
            "{} upstream_http1: {client},{}",
            &text[..open],
            &text[open..]
        );
    }
    let mut settings = Vec::new();
    if let Some(protocol) = &protocol {
        settings.push(format!("upstream_protocol: {protocol}"));
    }
    if let Some(client) = client {
        settings.push(format!("upstream_http1: {client}"));
    }
    if settings.is_empty() {
        return text.to_owned();
    }
    format!("{text}\nconnections: {{ {} }}\n", settings.join(", "))
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

    /// Same, with extra arguments after `run --config FILE`. It listens on ports the OS
    /// gives it (`127.0.0.1:0`) and says which in its log (`idemgate::listening`, logged
    /// whatever `level` is): a port picked here and bound by the process later could be
    /// handed to another test's server meanwhile, and this test would talk to that one.
    pub fn start_with_args(upstream: SocketAddr, rest: &str, level: &str, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("proxy.yaml");
        let log = dir.path().join("idemgate.log");
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:0\nupstream: http://{upstream}\nadmin: 127.0.0.1:0\n{}",
                with_upstream_protocol(rest)
            ),
        )
        .unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
            .args(["run", "--config"])
            .arg(&config)
            .args(args)
            .env("IDEMGATE_LOG", format!("{level},idemgate::listening=info"))
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut bound = None;
        redis_server::wait_until(
            || {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                bound = listening(&text, "idemgate serving").zip(listening(&text, "admin serving"));
                bound.is_some() || child.try_wait().unwrap().is_some()
            },
            "the proxy process to listen",
        );
        let Some((addr, admin)) = bound else {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("the proxy process exited at start:\n{text}");
        };
        Self {
            addr,
            admin,
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
        self.wait_exit_within(Duration::from_secs(60))
            .expect("hang guard: still running")
    }

    /// Waits at most `bound` for the process to exit by itself: its status, `None` if it
    /// still runs.
    pub fn wait_exit_within(&mut self, bound: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + bound;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
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
    // So is a body's media type: the JSON they send, unless given.
    if !map.contains_key(http::header::CONTENT_TYPE) {
        map.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
    }
    let request = idemgate::explain::Request {
        method: Method::POST,
        uri: path.parse().unwrap(),
        headers: map,
        body: body.to_vec(),
        client_ip: Some(std::net::Ipv4Addr::LOCALHOST.into()),
        client_cert: None,
    };
    let text = idemgate::explain::explain(&proxy.proxy.config(), &request).expect("a key");
    digest_line(&text)
}

/// The `key digest:` `idemgate explain` printed (hex).
pub fn digest_line(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("key digest:"))
        .map(|d| d.trim().to_owned())
        .unwrap_or_else(|| panic!("no key digest in {text}"))
}

/// Runs `idemgate explain --config CONFIG ARGS…` and returns what it printed; fails the
/// test if it does not succeed.
pub fn explain_cli(config: &std::path::Path, args: &[&str]) -> String {
    cli("explain", config, args)
}

/// Runs `idemgate COMMAND --config CONFIG ARGS…` and returns what it printed; fails the
/// test if it does not succeed.
pub fn cli(command: &str, config: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args([command, "--config"])
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
/// with `config` (a shared store, a `wait_timeout` long enough for all to park): each key
/// executes once and every answer for it is the same on both replicas. The owners are held
/// at the upstream's gate until both replicas report the other 190 parked waiting, so every
/// duplicate meets its owner in flight, on its replica or the other (none merely replays a
/// finished answer); a duplicate forwarded would be held at the gate too and counted.
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
                &[("idempotency-key", &key), ("x-test-gate", "replicas")],
                "{\"sku\":\"A1\"}",
            )
            .await;
            (key, answer)
        }));
    }
    upstream.arrived("replicas", 10).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while metric(a.admin, "idemgate_waiting").await + metric(b.admin, "idemgate_waiting").await
        < 190.0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: the duplicates never all parked"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    upstream.open("replicas");
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

/// The address a log line with `message` gives as `listen` (text or JSON log), once the
/// line is written whole (a line read half written could give half a port).
fn listening(log: &str, message: &str) -> Option<SocketAddr> {
    let line = log
        .split_inclusive('\n')
        .find(|line| line.ends_with('\n') && line.contains(message))?;
    let value = ["listen=", "\"listen\":\""]
        .iter()
        .find_map(|field| line.split_once(field).map(|(_, rest)| rest))?;
    let end = value
        .find(|c: char| c == '"' || c.is_whitespace())
        .unwrap_or(value.len());
    value[..end].parse().ok()
}
