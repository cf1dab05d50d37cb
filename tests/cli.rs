//! The command line as the SPEC writes it: `run`, `check` and `explain` take their config path from
//! `IDEMGATE_CONFIG` when `--config` is not given, and `explain --body -` reads the body
//! from standard input. Each runs the real binary, in an empty directory so the default
//! `proxy.yaml` cannot be what it reads.

mod common;

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use common::redis_server::{free_port, wait_until};
use common::{post, start_upstream};
use http::StatusCode;

const ROUTE: &str = "routes:\n  - name: env-orders\n    match: { methods: [POST], path: /orders }\n    key: { header: Idempotency-Key, required: true }\n";

/// Writes a config of `rest` behind `listen` and `upstream` to `path`.
fn write_config(path: &Path, rest: &str) {
    std::fs::write(
        path,
        format!("listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\n{rest}"),
    )
    .unwrap();
}

/// What a command that must succeed printed; a failure shows both its outputs.
fn succeeded(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn idemgate(cwd: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idemgate"));
    command.current_dir(cwd).env_remove("IDEMGATE_CONFIG");
    command
}

/// `idemgate check` without `--config` validates the file `IDEMGATE_CONFIG` names: a valid
/// one prints its route table and exits 0, a broken one exits 1 naming it.
#[test]
fn check_reads_the_config_path_from_idemgate_config() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let good = dir.path().join("from-env.yaml");
    write_config(&good, ROUTE);
    let out = idemgate(cwd.path())
        .arg("check")
        .env("IDEMGATE_CONFIG", &good)
        .output()
        .unwrap();
    let stdout = succeeded(&out);
    assert!(stdout.contains("env-orders"), "the route table: {stdout}");
    assert!(stdout.contains("from-env.yaml: ok"), "{stdout}");

    let bad = dir.path().join("broken-env.yaml");
    std::fs::write(
        &bad,
        "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\ndefaults:\n  lease: soon\n",
    )
    .unwrap();
    let out = idemgate(cwd.path())
        .arg("check")
        .env("IDEMGATE_CONFIG", &bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("broken-env.yaml:4:10: defaults.lease"),
        "{stderr}"
    );
}

/// A child process killed when the test ends, however it ends.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `idemgate run` without `--config` serves the file `IDEMGATE_CONFIG` names: its listen
/// address, and its route, which requires a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_reads_the_config_path_from_idemgate_config() {
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("from-env.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{port}\nupstream: http://{}\n{ROUTE}",
            upstream.addr
        ),
    )
    .unwrap();
    let log = dir.path().join("idemgate.log");
    let mut proxy = Running(
        idemgate(cwd.path())
            .arg("run")
            .env("IDEMGATE_CONFIG", &config)
            .env("IDEMGATE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until(
        || {
            if let Some(status) = proxy.0.try_wait().unwrap() {
                panic!(
                    "idemgate run exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::net::TcpStream::connect(addr).is_ok()
        },
        "the proxy to listen where IDEMGATE_CONFIG says",
    );
    let keyless = post(addr, "/orders", &[], "{}").await;
    assert_eq!(keyless.status, StatusCode::BAD_REQUEST, "the file's route");
    assert_eq!(keyless.json()["type"], "urn:idemgate:problem:key-invalid");
    let keyed = post(addr, "/orders", &[("idempotency-key", "k")], "{}").await;
    assert_eq!(keyed.status, StatusCode::CREATED);
    assert_eq!(upstream.executed(), 1);
}

/// `idemgate explain --config CONFIG ARGS…`, run in `dir`.
fn explain_with(dir: &Path, config: &Path, args: &[&str]) -> std::process::Output {
    idemgate(dir)
        .args(["explain", "--config"])
        .arg(config)
        .args(args)
        .output()
        .unwrap()
}

/// The `key digest:` line `idemgate explain` prints for a POST to /orders from 127.0.0.1
/// (keyed by its body's fingerprint), the body given as `--body ARG`, with `stdin` written
/// to its standard input.
fn explain_digest(config: &Path, body_arg: &str, stdin: &[u8]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idemgate"))
        .args(["explain", "--config"])
        .arg(config)
        .args(["--method", "POST", "--path", "/orders"])
        .args(["--client-ip", "127.0.0.1", "--body", body_arg])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = succeeded(&out);
    text.lines()
        .find_map(|l| l.strip_prefix("key digest:"))
        .unwrap_or_else(|| panic!("no key digest in {text}"))
        .trim()
        .to_owned()
}

/// `--body -` reads the body from standard input: the same bytes give the digest a body
/// file gives, other bytes another one.
#[test]
fn explain_reads_the_body_from_stdin_with_a_dash() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.yaml");
    std::fs::write(
        &config,
        "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\n",
    )
    .unwrap();
    let body = br#"{"sku":"A1","qty":1}"#;
    let file = dir.path().join("body.json");
    std::fs::write(&file, body).unwrap();
    let from_file = explain_digest(&config, file.to_str().unwrap(), b"");
    let from_stdin = explain_digest(&config, "-", body);
    assert_eq!(from_stdin, from_file, "the same bytes, the same key");
    let other = explain_digest(&config, "-", br#"{"sku":"B2","qty":1}"#);
    assert_ne!(other, from_stdin, "another body, another key");
}

/// `idemgate explain` without `--config` reads the file `IDEMGATE_CONFIG` names (its
/// argument takes the variable, as `run`'s and `check`'s do): the route it shows is that
/// file's, not the one in the `proxy.yaml` of the directory it runs in.
#[test]
fn explain_reads_the_config_path_from_idemgate_config() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let config = dir.path().join("from-env.yaml");
    write_config(&config, ROUTE);
    // The default path holds another route on the same path: reading it would show it.
    write_config(
        &cwd.path().join("proxy.yaml"),
        &ROUTE.replace("env-orders", "default-path-orders"),
    );
    let out = idemgate(cwd.path())
        .args(["explain", "--method", "POST", "--path", "/orders"])
        .args(["-H", "Idempotency-Key: k-env", "--client-ip", "127.0.0.1"])
        .env("IDEMGATE_CONFIG", &config)
        .output()
        .unwrap();
    let stdout = succeeded(&out);
    let route = stdout
        .lines()
        .find_map(|l| l.strip_prefix("route:"))
        .unwrap_or_else(|| panic!("no route line in {stdout}"));
    assert_eq!(route.trim(), "env-orders", "{stdout}");
    assert!(stdout.contains("key digest:"), "{stdout}");
}

/// The proxy always knows the client's address, so a digest `explain` computes without
/// `--client-ip` on a key the address is part of (an anonymous caller's, or `client_ip` in
/// the scope) is one no request can have: `explain` says so beside the digest. With the
/// address, or a caller named by its credential, there is nothing to say.
#[test]
fn explain_without_client_ip_says_an_address_scoped_digest_needs_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.yaml");
    write_config(
        &config,
        "routes:\n  - name: by-caller\n    match: { path: /orders }\n    key: { header: K }\n  - name: by-address\n    match: { path: /votes }\n    key: { header: K, scope: [header: X-Tenant, client_ip] }\n",
    );
    let explain = |path: &str, extra: &[&str]| {
        let args = [
            &["--method", "POST", "--path", path, "-H", "K: k1"][..],
            extra,
        ]
        .concat();
        succeeded(&explain_with(dir.path(), &config, &args))
    };
    let note = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("note:"))
            .map(str::to_owned)
    };
    for path in ["/orders", "/votes"] {
        let text = explain(path, &[]);
        let line = note(&text).unwrap_or_else(|| panic!("no note for {path}:\n{text}"));
        assert!(
            line.contains("no client address") && line.contains("--client-ip"),
            "{line}"
        );
        let text = explain(path, &["--client-ip", "192.0.2.7"]);
        assert_eq!(note(&text), None, "{text}");
    }
    let text = explain("/orders", &["-H", "Authorization: Bearer alice"]);
    assert_eq!(note(&text), None, "a caller by its credential: {text}");
}

/// `explain` refuses what the proxy refuses before routing, with the same reason: two
/// `Host` fields, a `Host` that is not one host, a POST to `*`, a lower-case method. Shown a route and a digest
/// instead, an operator would read a key the running proxy never derives.
#[test]
fn explain_refuses_what_the_proxy_refuses_before_routing() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.yaml");
    write_config(&config, ROUTE);
    let explain = |method: &str, args: &[&str]| {
        let args = [&["--method", method, "-H", "Idempotency-Key: k1"][..], args].concat();
        explain_with(dir.path(), &config, &args)
    };
    let one_host = ["--path", "/orders", "-H", "Host: a.example"];
    for (method, args) in [
        (
            "POST",
            &[
                "--path",
                "/orders",
                "-H",
                "Host: a.example",
                "-H",
                "Host: b.example",
            ][..],
        ),
        (
            "POST",
            &["--path", "/orders", "-H", "Host: a.example, b.example"],
        ),
        ("POST", &["--path", "/orders", "-H", "Host: user@a.example"]),
        ("POST", &["--path", "*", "-H", "Host: a.example"]),
        // A method with a lower-case letter is a 400 to the proxy (Django and Flask would
        // run `post` as a POST no route saw), so it is to `explain`, not upper-cased for it.
        ("post", &one_host),
    ] {
        let out = explain(method, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{method} {args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            stderr.contains("would answer 400"),
            "{method} {args:?}: {stderr}"
        );
    }
    // The same request with one host is explained.
    let out = explain("POST", &one_host);
    assert!(succeeded(&out).contains("route:             env-orders"));
}

/// Routes match first to last: a route an earlier one covers entirely (every method, host
/// and path it matches) is never reached, and its rule never applies, while the file
/// reads as if it did (`/uploads/*` off, then `/uploads/{id}/commit` with a required key,
/// runs every commit unprotected). `check` refuses such a file, naming both routes; one
/// the earlier route only partly covers is fine.
#[test]
fn check_refuses_a_route_an_earlier_one_hides() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.yaml");
    let check = |routes: &str| {
        write_config(&config, &format!("routes:\n{routes}"));
        idemgate(dir.path())
            .args(["check", "--config"])
            .arg(&config)
            .output()
            .unwrap()
    };
    let commit = "  - name: commit\n    match: { methods: [POST], path: \"/uploads/{id}/commit\", host: pay.example }\n    key: { header: K, required: true }\n";
    for earlier in [
        "  - name: uploads\n    match: { path: \"/uploads/*\" }\n    idempotency: off\n",
        "  - name: uploads\n    match: { methods: [POST], path: \"/Uploads/{x}/COMMIT/\", host: \"*.example\" }\n    idempotency: off\n",
        "  - name: uploads\n    match: { methods: [POST], path: \"/{*rest}\" }\n    key: { header: K }\n",
    ] {
        let out = check(&format!("{earlier}{commit}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{earlier}: {stderr}");
        assert!(
            stderr.contains("routes[1]") && stderr.contains("uploads") && stderr.contains("commit"),
            "{stderr}"
        );
    }
    for earlier in [
        // Another method, host or path: the later route still has requests of its own.
        "  - name: uploads\n    match: { methods: [PUT], path: \"/uploads/*\" }\n    idempotency: off\n",
        "  - name: uploads\n    match: { path: \"/uploads/*\", host: other.example }\n    idempotency: off\n",
        "  - name: uploads\n    match: { path: \"/uploads/{id}\" }\n    idempotency: off\n",
        "  - name: uploads\n    match: { path: \"/uploads/{id}/commit/x/*\" }\n    idempotency: off\n",
    ] {
        let out = check(&format!("{earlier}{commit}"));
        succeeded(&out);
    }
}

/// `explain` refuses, as the proxy does, a path that a slash only some decoders read
/// (`%252F`, `%C0%AF`) moves onto another route: shown the fallback's key, an operator
/// would read a key the proxy never derives. Where both readings are one route, it is
/// explained.
#[test]
fn explain_refuses_a_path_a_hidden_slash_moves_onto_another_route() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.yaml");
    write_config(&config, ROUTE);
    let explain = |path: &str| explain_keyed_post(dir.path(), &config, path);
    for path in ["/%252Forders", "/%C0%AForders", "/%252F%252Forders/"] {
        let out = explain(path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{path}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            stderr.contains("would answer 400") && stderr.contains("another route's"),
            "{path}: {stderr}"
        );
    }
    let out = explain("/orders%252Fx");
    assert!(succeeded(&out).contains("route:             default"));
}

/// `explain` routes a path with an escaped `:` as the proxy does: `/v1/orders%3Acancel`
/// is the `:cancel` route (its decoded reading, what most upstreams run), and where the
/// escaped reading Express routes by is another route's, a 400 with the proxy's reason.
#[test]
fn explain_routes_an_escaped_colon_as_the_proxy_does() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.yaml");
    let cancel = "  - name: cancel\n    match: { methods: [POST], path: \"/v1/orders:cancel\" }\n    key: { header: Idempotency-Key, required: true }\n";
    let explain = |path: &str| explain_keyed_post(dir.path(), &config, path);
    write_config(&config, &format!("routes:\n{cancel}"));
    let text = succeeded(&explain("/v1/orders%3Acancel"));
    assert!(text.contains("route:             cancel"), "{text}");
    let express = "  - name: anything\n    match: { methods: [POST], path: \"/v1/{action}\" }\n    key: { header: Idempotency-Key }\n";
    write_config(&config, &format!("routes:\n{cancel}{express}"));
    let out = explain("/v1/orders%3Acancel");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains("would answer 400") && stderr.contains("%3A"),
        "{stderr}"
    );
    assert!(succeeded(&explain("/v1/orders:cancel")).contains("route:             cancel"));
    // A `:search` route that enforces nothing, and the escape is no route's as sent: run
    // under the fallback, as the proxy runs it, not refused.
    let search = "  - name: search\n    match: { methods: [POST], path: \"/v1/orders:search\" }\n    idempotency: off\n";
    write_config(&config, &format!("routes:\n{search}"));
    let text = succeeded(&explain("/v1/orders%3Asearch"));
    assert!(text.contains("route:             default"), "{text}");
    assert!(
        text.contains("route search, which enforces nothing"),
        "{text}"
    );
    let text = succeeded(&explain("/v1/orders:search"));
    assert!(text.contains("route:             search"), "{text}");
}

/// `explain` of a `POST` to `path` with an `Idempotency-Key`.
fn explain_keyed_post(dir: &Path, config: &Path, path: &str) -> std::process::Output {
    let args = [
        "--method",
        "POST",
        "--path",
        path,
        "-H",
        "Idempotency-Key: k1",
    ];
    explain_with(dir, config, &args)
}
