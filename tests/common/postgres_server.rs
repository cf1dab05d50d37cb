//! Real PostgreSQL servers for tests: `initdb` into a temporary directory, `pg_ctl` on a
//! free loopback port (as `nobody` when the tests run as root), stopped on drop. Nothing
//! relies on a server left running (this machine's own on 5432 included).
//!
//! The binaries come from `IDEMGATE_TEST_PG_BIN` (scripts/test points it at Debian's
//! `/usr/lib/postgresql/<version>/bin`), else from `PATH`.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex, Weak};

use super::redis_server::{free_port, wait_until};
use super::unprivileged;

/// One PostgreSQL server (a cluster of its own).
pub struct PostgresServer {
    pub port: u16,
    dir: tempfile::TempDir,
    settings: Vec<String>,
    running: bool,
}

/// A PostgreSQL program: from `IDEMGATE_TEST_PG_BIN`, else `PATH`.
fn program(name: &str) -> PathBuf {
    match std::env::var_os("IDEMGATE_TEST_PG_BIN") {
        Some(dir) => PathBuf::from(dir).join(name),
        None => PathBuf::from(name),
    }
}

fn run(mut command: Command, what: &str) -> Output {
    let out = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what} (scripts/test installs PostgreSQL): {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

impl PostgresServer {
    /// A fresh server with the defaults of a test server: no fsync (a killed server
    /// keeps what it committed; only a machine crash would lose it),
    /// `pg_stat_statements` loaded.
    pub fn start() -> Self {
        Self::start_with(&[("fsync", "off")])
    }

    /// A fresh server with these `postgres -c` settings added to the defaults (except
    /// `fsync`, which is on unless named).
    pub fn start_with(settings: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        unprivileged::own(dir.path());
        let mut initdb = unprivileged::command(program("initdb"));
        initdb.arg("-D").arg(dir.path().join("data")).args([
            "-U",
            "idemgate",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        run(initdb, "initdb");
        let mut all = vec![
            "listen_addresses=127.0.0.1".to_owned(),
            format!("unix_socket_directories={}", dir.path().display()),
            "max_connections=300".to_owned(),
            "shared_preload_libraries=pg_stat_statements".to_owned(),
            "pg_stat_statements.track=top".to_owned(),
        ];
        all.extend(settings.iter().map(|(k, v)| format!("{k}={v}")));
        let mut server = Self {
            port: free_port(),
            dir,
            settings: all,
            running: false,
        };
        server.start_again();
        server
    }

    /// `postgres://idemgate@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://idemgate@127.0.0.1:{}/postgres", self.port)
    }

    fn pg_ctl(&self, args: &[&str]) -> Command {
        let mut command = unprivileged::command(program("pg_ctl"));
        command
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(args);
        command
    }

    /// `pg_ctl` with what starts this server: its options and its log file (without
    /// `-l`, the server would write to pg_ctl's output, which the test reads to its end).
    fn starting(&self, action: &str) -> Command {
        let mut options = format!("-p {}", self.port);
        for setting in &self.settings {
            options.push_str(&format!(" -c {setting}"));
        }
        let log = self.dir.path().join("postgres.log");
        let mut command = self.pg_ctl(&["-w", "-t", "60", "-m", "fast", "-o", &options, "-l"]);
        command.arg(&log).arg(action);
        command
    }

    /// Starts the (stopped) server again on its port, with its data.
    pub fn start_again(&mut self) {
        run(self.starting("start"), "pg_ctl start");
        self.running = true;
        wait_until(|| self.answers(), "PostgreSQL to answer");
    }

    /// Stops the server the way `pg_ctl stop -m fast` does: open transactions are rolled
    /// back, clients disconnected, everything committed kept.
    pub fn stop(&mut self) {
        run(self.pg_ctl(&["-w", "-m", "fast", "stop"]), "pg_ctl stop");
        self.running = false;
    }

    /// `pg_ctl restart -m fast`: stopped and started again, its data kept.
    pub fn restart(&mut self) {
        run(self.starting("restart"), "pg_ctl restart");
        wait_until(|| self.answers(), "PostgreSQL to answer");
    }

    fn answers(&self) -> bool {
        Command::new(program("pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Runs `sql` with psql and returns its unaligned, tuples-only output.
    pub fn psql(&self, sql: &str) -> String {
        let mut psql = Command::new(program("psql"));
        psql.args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args([
                "-U",
                "idemgate",
                "-d",
                "postgres",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
            ])
            .args(["-c", sql]);
        String::from_utf8_lossy(&run(psql, "psql").stdout).into_owned()
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if self.running {
            let _ = self.pg_ctl(&["-w", "-m", "immediate", "stop"]).output();
        }
    }
}

/// A server shared by the tests of this binary that run at the same time (each uses keys
/// of its own), stopped when the last of them ends: a cluster per test would cost an
/// `initdb` each.
pub fn shared() -> Arc<PostgresServer> {
    static SHARED: Mutex<Weak<PostgresServer>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(server) = shared.upgrade() {
        return server;
    }
    let server = Arc::new(PostgresServer::start());
    *shared = Arc::downgrade(&server);
    server
}
