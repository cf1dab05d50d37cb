//! Real `redis-server` processes for tests: each on a free loopback port, stopped on drop.
//! Nothing relies on a server left running.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One redis-server process.
pub struct RedisServer {
    pub port: u16,
    /// The `redis-server` to run: the one on PATH unless a test names another build.
    binary: PathBuf,
    child: Option<Child>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

/// A port nothing listens on right now (the OS picks it; we close it at once).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A free port for a cluster node: one whose cluster bus port, 10000 above it, exists and
/// is free too. Redis and Valkey refuse to start a cluster node above port 55535, and the
/// OS hands out ports up to 60999 here: about one node in five would never answer.
fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55535 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

impl RedisServer {
    /// Starts a standalone server.
    pub fn start() -> Self {
        Self::start_with(Vec::new())
    }

    /// Starts a standalone server on a given (free) port.
    pub fn start_on(port: u16) -> Self {
        Self::spawned(port, "redis-server".into(), Vec::new())
    }

    /// Starts a server with extra command-line options.
    pub fn start_with(extra: Vec<String>) -> Self {
        Self::start_binary("redis-server".into(), extra)
    }

    /// Starts a standalone server from another `redis-server` build (an older Redis).
    fn start_binary(binary: PathBuf, extra: Vec<String>) -> Self {
        let port = if extra.iter().any(|arg| arg == "--cluster-enabled") {
            free_cluster_port()
        } else {
            free_port()
        };
        Self::spawned(port, binary, extra)
    }

    /// Starts the Valkey 9 server `IDEMGATE_TEST_VALKEY` names (scripts/test unpacks one
    /// into target/valkey-9.1/): it takes `SET … IFEQ`, which Debian's Redis 7.0 does not.
    pub fn start_valkey() -> Self {
        Self::start_valkey_with(Vec::new())
    }

    /// [`RedisServer::start_valkey`] with extra command-line options.
    pub fn start_valkey_with(extra: Vec<String>) -> Self {
        Self::start_from_env("IDEMGATE_TEST_VALKEY", "valkey_version:9.", extra)
    }

    /// Starts the Redis 6.2 server `IDEMGATE_TEST_REDIS6` names (scripts/test builds one
    /// into target/redis-6.2/): it refuses `SET … NX … GET`, which 7.0 takes.
    pub fn start_redis_6_2() -> Self {
        Self::start_from_env("IDEMGATE_TEST_REDIS6", "redis_version:6.", Vec::new())
    }

    /// Starts the server binary the environment variable `var` names, and checks that it
    /// is the one meant (`INFO server` shows `version`): a test of another server's
    /// behaviour must not pass on the default one.
    fn start_from_env(var: &str, version: &str, extra: Vec<String>) -> Self {
        let binary = std::env::var_os(var).unwrap_or_else(|| {
            panic!("{var} names the server with {version}… that scripts/test provides")
        });
        let server = Self::start_binary(binary.into(), extra);
        let info = server.cli(&["INFO", "server"]);
        assert!(
            info.contains(version),
            "{var} must name a server with {version}…: {info}"
        );
        server
    }

    fn spawned(port: u16, binary: PathBuf, extra: Vec<String>) -> Self {
        let mut server = Self {
            port,
            binary,
            child: None,
            dir: tempfile::tempdir().unwrap(),
            extra,
        };
        server.spawn();
        server
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let mut command = Command::new(&self.binary);
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.child = Some(command.spawn().unwrap_or_else(|e| {
            panic!(
                "{} (scripts/test installs or builds it): {e}",
                self.binary.display()
            )
        }));
        wait_until(|| ping(self.port), "redis-server to answer PING");
    }

    /// Kills the server (SIGKILL): clients see connection errors.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Where its files go.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// Runs `redis-cli -p PORT args…` and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs redis-cli against a port.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli on PATH");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ping(port: u16) -> bool {
    redis_cli(port, &["PING"]).trim() == "PONG"
}

/// Polls a condition (a hang guard, never a timing assertion).
pub fn wait_until(mut condition: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Three masters joined with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the nodes and joins them; returns once the cluster reports `ok`.
    pub fn start() -> Self {
        Self::of(RedisServer::start_with)
    }

    /// The same of Valkey 9 nodes ([`RedisServer::start_valkey`]).
    pub fn start_valkey() -> Self {
        Self::of(RedisServer::start_valkey_with)
    }

    fn of(start: impl Fn(Vec<String>) -> RedisServer) -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                start(vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-node-timeout".into(),
                    "2000".into(),
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli on PATH");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for node in &nodes {
            wait_until(
                || node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"),
                "the cluster to report ok",
            );
        }
        Self { nodes }
    }

    /// Seed URLs for the proxy.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}
