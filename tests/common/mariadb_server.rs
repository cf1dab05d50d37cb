//! Real MariaDB servers for tests: `mariadb-install-db` into a temporary directory,
//! `mariadbd` on a free loopback port (as `nobody` when the tests run as root), stopped on
//! drop. Nothing relies on a server left running (this machine's own on 3306 included).

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Weak};

use super::redis_server::{free_port, wait_until};
use super::unprivileged;

/// One MariaDB server with a database `idemgate`, root without a password on loopback.
pub struct MariadbServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl MariadbServer {
    /// A fresh server.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        unprivileged::own(dir.path());
        // Each server keeps its temporary tables in its own directory: servers of tests
        // running side by side (or another program's) in a shared /tmp collide on the
        // names of those files.
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        unprivileged::own(&tmp);
        let out = unprivileged::command("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.path().join("data").display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("mariadb-install-db (scripts/test installs it): {e}"));
        assert!(
            out.status.success(),
            "mariadb-install-db failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut server = Self {
            port: free_port(),
            dir,
            child: None,
        };
        server.start_again();
        server.sql("CREATE DATABASE IF NOT EXISTS idemgate");
        server
    }

    /// `mysql://root@127.0.0.1:PORT/idemgate`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/idemgate", self.port)
    }

    /// Starts the (stopped) server again on its port, with its data.
    pub fn start_again(&mut self) {
        let dir = self.dir.path();
        let child = unprivileged::command("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--tmpdir={}", dir.join("tmp").display()))
            .arg(format!("--socket={}", dir.join("mariadb.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
            .arg(format!("--log-error={}", dir.join("mariadb.err").display()))
            .arg(format!("--port={}", self.port))
            .args(["--bind-address=127.0.0.1", "--skip-name-resolve"])
            .args(["--max-connections=300", "--innodb-buffer-pool-size=64M"])
            // Commits reach the OS at once and disk every second: a killed server keeps
            // them; only a machine crash would lose the last second.
            .arg("--innodb-flush-log-at-trx-commit=2")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("mariadbd (scripts/test installs it): {e}"));
        self.child = Some(child);
        wait_until(|| self.try_sql("SELECT 1").is_ok(), "MariaDB to answer");
    }

    /// Shuts the server down cleanly (SIGTERM): open transactions are rolled back, clients
    /// disconnected, everything committed kept.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    /// Stopped and started again, its data kept.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    fn try_sql(&self, sql: &str) -> Result<String, String> {
        let port = self.port.to_string();
        let out = Command::new("mariadb")
            .args(["-h", "127.0.0.1", "-P", &port, "-u", "root"])
            .args(["--batch", "--skip-column-names", "-e", sql])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("mariadb client (scripts/test installs it): {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Runs `sql` with the mariadb client and returns its tab-separated output.
    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql)
            .unwrap_or_else(|e| panic!("mariadb client failed on {sql:?}: {e}"))
    }
}

impl Drop for MariadbServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A server shared by the tests of this binary that run at the same time (each uses keys
/// of its own), stopped when the last of them ends: an install per test costs seconds.
pub fn shared() -> Arc<MariadbServer> {
    static SHARED: Mutex<Weak<MariadbServer>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(server) = shared.upgrade() {
        return server;
    }
    let server = Arc::new(MariadbServer::start());
    *shared = Arc::downgrade(&server);
    server
}
