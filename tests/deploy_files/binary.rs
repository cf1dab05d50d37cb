//! The real binary with each shipped config: it starts on free ports with the config's
//! secrets made local and answers its health probe, with Redis or the database down.

use std::fs;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idemgate::config::StoreConfig;
use serde_yaml_ng::Value;

use crate::support::*;

/// N distinct ports that were free a moment ago: bound on 127.0.0.1:0, read, released.
fn free_ports<const N: usize>() -> [u16; N] {
    // All held at once so the N ports are distinct.
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"))
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().expect("local addr").port())
}

/// The shipped config, made runnable here: listen and admin on loopback ports of this test,
/// Redis or PostgreSQL pointed at a port where nothing listens. Everything else is left as
/// shipped.
fn local_copy(text: &str, dir: &Path, proxy: u16, admin: u16, dead_redis: u16) -> String {
    let text = with_local_secrets(text, dir);
    let mut doc: Value = serde_yaml_ng::from_str(&text).expect("a YAML mapping");
    doc["listen"] = Value::String(format!("127.0.0.1:{proxy}"));
    let admin_addr = Value::String(format!("127.0.0.1:{admin}"));
    // `{ listen, token }` keeps its token; the address form is replaced.
    match doc.get_mut("admin") {
        Some(Value::Mapping(m)) => {
            m.insert(Value::String("listen".into()), admin_addr);
        }
        _ => doc["admin"] = admin_addr,
    }
    if let Some(redis) = doc.get_mut("store").and_then(|s| s.get_mut("redis")) {
        let dead = Value::String(format!("redis://127.0.0.1:{dead_redis}/0"));
        if let Some(url) = redis.get_mut("url") {
            *url = dead.clone();
        }
        if let Some(Value::Sequence(seeds)) = redis.get_mut("cluster") {
            seeds.iter_mut().for_each(|s| *s = dead.clone());
        }
    }
    if let Some(postgres) = doc.get_mut("store").and_then(|s| s.get_mut("postgres")) {
        postgres["url"] = Value::String(format!("postgres://idemgate@127.0.0.1:{dead_redis}/x"));
    }
    serde_yaml_ng::to_string(&doc).expect("serializable")
}

/// A started `idemgate run`; killed when dropped, whatever the test's outcome.
struct Running {
    child: Child,
    log: PathBuf,
    // Dropped after `drop` below has killed the child: its config and log live here.
    _dir: tempfile::TempDir,
}

impl Running {
    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 GET over a raw socket; the whole response as text, or None if the admin
/// port does not accept connections (yet).
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    http_get_with(addr, path, "")
}

/// [`http_get`] with extra header lines (each ending in CRLF).
fn http_get_with(addr: SocketAddr, path: &str, extra: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(HANG_GUARD)).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    Some(String::from_utf8_lossy(&response).into_owned())
}

/// Starts the binary with a local copy of a shipped config and waits until the proxy port
/// accepts connections and `/healthz` answers 200. Returns it with its admin address.
fn start_with(name: &str, text: &str) -> (Running, SocketAddr) {
    let [proxy_port, admin_port, dead_redis] = free_ports::<3>();
    let dir = tempfile::tempdir().expect("a temp dir");
    let config = dir.path().join("proxy.yaml");
    fs::write(
        &config,
        local_copy(text, dir.path(), proxy_port, admin_port, dead_redis),
    )
    .expect("write config");
    let log = dir.path().join("idemgate.log");
    let out = fs::File::create(&log).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .env("IDEMGATE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log handle"))
        .stderr(out)
        .spawn()
        .expect("spawn idemgate");
    let mut running = Running {
        child,
        log,
        _dir: dir,
    };
    let proxy = SocketAddr::from(([127, 0, 0, 1], proxy_port));
    let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
    let started = Instant::now();
    loop {
        if let Some(status) = running.child.try_wait().expect("try_wait") {
            panic!(
                "{name}: idemgate exited ({status}) instead of serving:\n{}",
                running.log()
            );
        }
        let healthy = TcpStream::connect(proxy).is_ok()
            && http_get(admin, "/healthz").is_some_and(|r| r.starts_with("HTTP/1.1 200"));
        if healthy {
            return (running, admin);
        }
        assert!(
            started.elapsed() < HANG_GUARD,
            "{name}: not serving after {HANG_GUARD:?}:\n{}",
            running.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts the shipped config and checks what its store means for readiness: a Redis or a
/// database that is down (as here) must not stop the proxy but must fail `/readyz`, so the
/// orchestrator keeps traffic away until it answers; the memory store is ready at once.
fn serves_with(name: &str, text: &str) {
    let config = parse_config(name, text);
    let (running, admin) = start_with(name, text);
    let ready = http_get(admin, "/readyz").expect("/readyz answers");
    let expected = match config.store {
        StoreConfig::Redis(_) | StoreConfig::Postgres(_) | StoreConfig::Mysql(_) => "HTTP/1.1 503",
        StoreConfig::Memory(_) => "HTTP/1.1 200",
    };
    assert!(
        ready.starts_with(expected),
        "{name}: /readyz answered {ready:?}, expected {expected}:\n{}",
        running.log()
    );
    let anonymous = http_get(admin, "/metrics").expect("/metrics answers");
    assert!(anonymous.starts_with("HTTP/1.1 401"), "{name}: {anonymous}");
    let bearer = format!("Authorization: Bearer {TEST_ADMIN_TOKEN}\r\n");
    let metrics = http_get_with(admin, "/metrics", &bearer).expect("/metrics answers");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{name}: {metrics}");
}

#[test]
fn the_binary_serves_with_the_compose_config_while_redis_is_down() {
    serves_with("deploy/compose/proxy.yaml", &read("compose/proxy.yaml"));
}

#[test]
fn the_binary_serves_with_the_postgres_compose_config_while_the_database_is_down() {
    serves_with(
        "deploy/compose/proxy.postgres.yaml",
        &read("compose/proxy.postgres.yaml"),
    );
}

#[test]
fn the_binary_serves_with_the_kubernetes_config_while_redis_is_down() {
    serves_with("configmap.yaml (data.proxy.yaml)", &configmap_proxy_yaml());
}

#[test]
fn the_binary_serves_with_the_systemd_config() {
    serves_with("deploy/systemd/proxy.yaml", &read("systemd/proxy.yaml"));
}
