//! The `idemgate` command: `run`, `check`, `explain`.

use std::io::Read as _;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use idemgate::config::units::{format_duration, format_size};
use idemgate::config::{Config, Protection, StoreConfig};
use tracing_subscriber::EnvFilter;

// glibc's per-thread arenas fragment under a store of millions of small records; mimalloc
// keeps RSS per stored key near the bytes actually held (benches/load/allocators.sh).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "idemgate",
    version,
    about = "Makes non-idempotent HTTP endpoints idempotent"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the proxy.
    Run {
        #[arg(long, env = "IDEMGATE_CONFIG", default_value = "proxy.yaml")]
        config: PathBuf,
        /// Log format.
        #[arg(long, value_parser = ["human", "json"], default_value = "human")]
        log_format: String,
    },
    /// Validate a config and print the route table; exit 1 on error.
    Check {
        #[arg(long, env = "IDEMGATE_CONFIG", default_value = "proxy.yaml")]
        config: PathBuf,
    },
    /// Show how a request would be keyed.
    Explain {
        #[arg(long, env = "IDEMGATE_CONFIG", default_value = "proxy.yaml")]
        config: PathBuf,
        #[arg(long)]
        method: String,
        /// Path with optional query string.
        #[arg(long)]
        path: String,
        /// A header, `Name: value`; repeatable.
        #[arg(short = 'H', long = "header")]
        headers: Vec<String>,
        /// Body file, or `-` for standard input.
        #[arg(long)]
        body: Option<String>,
        /// The TCP peer's address, for keys scoped by the client address (behind
        /// `trusted_proxies`, give the proxy's and an `X-Forwarded-For` header).
        #[arg(long)]
        client_ip: Option<std::net::IpAddr>,
        /// The client certificate (PEM) a mutual-TLS caller presents: part of its key.
        #[arg(long)]
        client_cert: Option<PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    match dispatch(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Turns off tokio's LIFO slot, which runs a task woken by another right after it. A request
/// hands its upstream exchange to hyper's client connection task (and, with the Redis
/// store, its commands to redis-rs's connection task). With the slot, that task ran right
/// after the request that woke it, so each request's bytes went out on their own, each
/// finding the upstream (or Redis) idle and waking it, at a cost to the waker's CPU. Without
/// it, the woken tasks run after the requests that are ready: their writes bunch up and one
/// wake-up of a peer serves several (measured with `benches/load/ab.sh`; see
/// benches/load/HISTORY.md).
fn batch_wakeups(runtime: &mut tokio::runtime::Builder) {
    #[cfg(tokio_unstable)]
    runtime.disable_lifo_slot();
    #[cfg(not(tokio_unstable))]
    let _ = runtime;
}

fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run { config, log_format } => {
            init_logs(&log_format);
            let loaded = Config::load(&config)?;
            let mut runtime = tokio::runtime::Builder::new_multi_thread();
            runtime.enable_all();
            batch_wakeups(&mut runtime);
            let runtime = runtime.build().context("starting the runtime")?;
            runtime.block_on(run(loaded, config))?;
            // Exits without dropping the runtime: its drop would drop every task still
            // running, owners past the drain included, and their leases' drops would log
            // (and try to write) the settlement of an owner that gave up, for calls that are
            // in fact still running upstream. Their claims are left exactly as they are.
            std::process::exit(0)
        }
        Command::Check { config } => {
            let loaded = Config::load(&config)?;
            print!("{}", route_table(&loaded));
            for note in loaded.notes() {
                println!("note: {note}");
            }
            println!("{}: ok", config.display());
            Ok(())
        }
        Command::Explain {
            config,
            method,
            path,
            headers,
            body,
            client_ip,
            client_cert,
        } => {
            let loaded = Config::load(&config)?;
            let mut request = explain_request(&method, &path, &headers, body.as_deref())?;
            request.client_ip = client_ip;
            request.client_cert = client_cert
                .map(|path| certificate_digest(&path))
                .transpose()?;
            let (text, key) = idemgate::explain::explain_key(&loaded, &request).map_err(|e| {
                anyhow::anyhow!("the proxy would answer {}: {e}", e.status().as_u16())
            })?;
            print!("{text}");
            // With an admin listener configured, the running proxy says what it holds for
            // the key (and, on an observed route, how often it was seen).
            if let (Some(admin), Some(key)) = (&loaded.admin, key) {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("starting the runtime")?;
                print!(
                    "{}",
                    runtime.block_on(idemgate::explain::look_up(admin, &key))
                );
            }
            Ok(())
        }
    }
}

/// Logs go to standard error, as lines of text (coloured only on a terminal, and never
/// with `NO_COLOR` set) or, with `--log-format json`, one JSON object per line for log
/// shippers. `IDEMGATE_LOG` filters them (`info` by default).
fn init_logs(format: &str) {
    use std::io::IsTerminal as _;
    let filter = EnvFilter::try_from_env("IDEMGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        builder.with_ansi(colour).init();
    }
}

async fn run(config: Config, path: PathBuf) -> anyhow::Result<()> {
    let config = Arc::new(config);
    for note in config.notes() {
        tracing::warn!("{note}");
    }
    let store = idemgate::server::open_store(&config).context("opening the store")?;
    if !store.ready().await {
        tracing::error!(
            "the store is not reachable; protected requests fail until it is (see /readyz)"
        );
    }
    let metrics = Arc::new(idemgate::metrics::Metrics::new());
    let proxy = idemgate::proxy::Proxy::new(Arc::clone(&config), store.clone(), metrics);
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    // The address bound, not the one configured: with port 0 it is how anyone (tests,
    // scripts) learns which port the OS gave.
    let bound = listener
        .local_addr()
        .context("reading the bound listen address")?;
    tracing::info!(target: "idemgate::listening", listen = %bound, upstream = %config.upstream.authority, routes = config.routes.len(), "idemgate serving");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    if let Some(admin) = &config.admin {
        let admin_listener = tokio::net::TcpListener::bind(admin.listen)
            .await
            .with_context(|| format!("binding admin {}", admin.listen))?;
        let bound = admin_listener
            .local_addr()
            .context("reading the bound admin address")?;
        tracing::info!(target: "idemgate::listening", listen = %bound, "admin serving");
        tokio::spawn(idemgate::server::serve_admin(
            admin_listener,
            proxy.clone(),
            admin.token.clone(),
            stopped(),
        ));
    }
    tokio::spawn(reload_on_sighup(proxy.clone(), path));
    let drain = config.drain_timeout;
    let serving = tokio::spawn(idemgate::server::serve_proxy(
        listener,
        proxy.clone(),
        stopped(),
        drain,
    ));
    shutdown_signal().await;
    let deadline = std::time::Instant::now() + drain;
    tracing::info!(
        ?drain,
        owners = proxy.owners().len(),
        "stopping: no new connections, draining"
    );
    let _ = stop_tx.send(true);
    let _ = serving.await;
    // Owners whose clients left keep running detached; give them the rest of the drain.
    proxy.owners().finished(deadline).await;
    // Then the settlements made in the background once their owners ended (the store failed
    // the first try): an exit that cut one off would lose an answer the upstream gave.
    idemgate::store::background::finished(deadline).await;
    // Those still running keep their claims: their requests went out, so no replica may
    // run them again. On a shared store they lapse after their lease, as a dead owner's.
    // The memory store ends with this process: nothing of theirs is left anywhere.
    let running = proxy.owners().len();
    if running > 0 && matches!(config.store, StoreConfig::Memory(_)) {
        tracing::warn!(
            running,
            "stopped with upstream calls still running; the memory store forgets their keys, so a retry after a restart runs them again"
        );
    } else if running > 0 {
        tracing::warn!(
            running,
            "stopped with upstream calls still running; their keys stay claimed"
        );
    }
    let unwritten = idemgate::store::background::pending();
    if unwritten > 0 {
        tracing::error!(
            unwritten,
            "stopped with settlements still unwritten (store writes made in the background after their owners ended: answers the store failed, releases of unanswered claims); their claims lapse as a dead owner's do"
        );
    }
    tracing::info!("stopped");
    Ok(())
}

/// SIGHUP re-reads the config file and swaps it in; a bad file is refused with one log line
/// and the running config stays. A change that only a restart applies, or that gives
/// requests new keys, is warned of, and so is what `check` points out in the new file.
async fn reload_on_sighup(proxy: idemgate::proxy::Proxy, path: PathBuf) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            return;
        };
        while hup.recv().await.is_some() {
            match Config::load(&path) {
                Ok(new) => {
                    let old = proxy.config();
                    let unchanged = restart_only_changes(&old, &new);
                    if !unchanged.is_empty() {
                        tracing::warn!(
                            settings = unchanged.join(", "),
                            "changed settings that take effect on restart, not on reload"
                        );
                    }
                    // What `run` warns of at start, a reload must too: a scope edited to name
                    // no caller shares keys from the moment it is swapped in.
                    for note in new.notes() {
                        tracing::warn!("{note}");
                    }
                    let routes = new.routes.len();
                    let reloaded = proxy.reload(Arc::new(new));
                    // `check` cannot say this: it does not know the config that ran before.
                    if let Some(until) = reloaded.honoured_until {
                        tracing::warn!(
                            "reload re-keys requests: {}: the previous keys are honoured until {} where callers and requests are told apart at least as finely as before (retries and duplicates of earlier requests are answered from them; a restart forgets them)",
                            reloaded.rekeyed.join("; "),
                            httpdate::fmt_http_date(until)
                        );
                    }
                    tracing::info!(routes, "config reloaded");
                }
                Err(e) => tracing::error!("reload refused, keeping the running config: {e}"),
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (proxy, path);
}

/// The settings a reload leaves as they were: they belong to the store, the listeners
/// (among them whether the port speaks TLS, see `Proxy::reload`) and the drain, all set up
/// once at start. (The admin token is not among them: the listener reads the running
/// config's, so a reload rotates it.)
fn restart_only_changes(old: &Config, new: &Config) -> Vec<&'static str> {
    let admin = |c: &Config| c.admin.as_ref().map(|a| a.listen);
    let checks = [
        ("store", old.store != new.store),
        ("listen", old.listen != new.listen),
        ("tls (on or off)", old.tls.is_some() != new.tls.is_some()),
        ("admin", admin(old) != admin(new)),
        ("drain_timeout", old.drain_timeout != new.drain_timeout),
        (
            "connections.max_client",
            old.connections.max_client != new.connections.max_client,
        ),
        (
            "connections.max_streams",
            old.connections.max_streams != new.connections.max_streams,
        ),
        (
            "connections.lingering_*",
            old.connections.linger != new.connections.linger,
        ),
        (
            "connections.client_send_timeout",
            old.connections.client_send_timeout != new.connections.client_send_timeout,
        ),
    ];
    checks
        .into_iter()
        .filter_map(|(name, changed)| changed.then_some(name))
        .collect()
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn route_table(config: &Config) -> String {
    let mut out = String::new();
    let store = match &config.store {
        StoreConfig::Memory(l) => {
            let mut memory = format!(
                "memory (max_entries {}, max_bytes {}",
                l.max_entries,
                format_size(l.max_bytes as u64)
            );
            // The shares only when set: 100% limits nothing.
            let shares = [
                ("caller_share", l.caller_share),
                ("address_share", l.address_share),
            ];
            for (name, share) in shares.into_iter().filter(|(_, share)| *share < 100) {
                memory.push_str(&format!(", {name} {share}%"));
            }
            memory + ")"
        }
        StoreConfig::Redis(r) => match &r.url {
            // Only the host part: the URL may carry a password.
            Some(url) => format!("redis ({}, prefix {:?})", redact(url), r.prefix),
            None => format!(
                "redis cluster ({} seeds, prefix {:?})",
                r.cluster.len(),
                r.prefix
            ),
        },
        StoreConfig::Postgres(s) => format!("postgres ({}, table {})", redact(&s.url), s.table),
        StoreConfig::Mysql(s) => format!("mysql ({}, table {})", redact(&s.url), s.table),
    };
    out.push_str(&format!(
        "listen {}  upstream {}://{}  store {}\n",
        config.listen, config.upstream.scheme, config.upstream.authority, store
    ));
    out.push_str(&format!(
        "{:<22} {:<16} {:<32} {:<12} {:<8} {:<8} {}\n",
        "ROUTE", "METHODS", "PATH", "KEY", "TTL", "MODE", "MAX_BODY"
    ));
    let mut rows: Vec<(String, String, String, &Protection)> = config
        .routes
        .iter()
        .map(|r| {
            let methods = r
                .matcher
                .methods
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join(",");
            let path = match &r.matcher.host {
                Some(h) => format!("{h}{}", r.matcher.path),
                None => r.matcher.path.to_string(),
            };
            (r.name.clone(), methods, path, &r.protection)
        })
        .collect();
    rows.push((
        "(default)".into(),
        "POST,PATCH".into(),
        "(unmatched)".into(),
        &config.fallback,
    ));
    for (name, methods, path, protection) in rows {
        let (key, ttl, in_flight, max_body) = match protection {
            Protection::Off(_) => ("off".to_owned(), "-".into(), "-".into(), "-".into()),
            Protection::On(p) => (
                p.key.source.as_str().to_owned(),
                format_duration(p.policy.ttl),
                if p.policy.observe {
                    "observe".to_owned()
                } else {
                    p.policy.in_flight.as_str().to_owned()
                },
                format_size(p.policy.max_body as u64),
            ),
        };
        out.push_str(&format!(
            "{name:<22} {methods:<16} {path:<32} {key:<12} {ttl:<8} {in_flight:<8} {max_body}\n"
        ));
    }
    if let Some(tokens) = &config.tokens {
        // Served by the proxy itself, before any route: the tokens live `ttl`.
        let (name, ttl) = ("(token endpoint)", format_duration(tokens.ttl));
        out.push_str(&format!(
            "{name:<22} {:<16} {:<32} {:<12} {ttl:<8} {:<8} -\n",
            "POST", tokens.path, "issues", "-"
        ));
    }
    out
}

/// The SHA-256 of the first certificate in a PEM file, as the proxy takes it from a
/// verified client's TLS connection.
fn certificate_digest(path: &std::path::Path) -> anyhow::Result<idemgate::key::Digest> {
    use rustls::pki_types::pem::PemObject;
    use sha2::Digest as _;
    let cert = rustls::pki_types::CertificateDer::from_pem_file(path)
        .with_context(|| format!("--client-cert {}", path.display()))?;
    Ok(idemgate::key::Digest(
        sha2::Sha256::digest(cert.as_ref()).into(),
    ))
}

/// `redis://user:secret@host:6379/0` → `redis://host:6379/0`.
fn redact(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, _)), Some(at)) => format!("{scheme}://{}", &url[at + 1..]),
        _ => url.to_owned(),
    }
}

fn explain_request(
    method: &str,
    path: &str,
    headers: &[String],
    body: Option<&str>,
) -> anyhow::Result<idemgate::explain::Request> {
    // As sent: a lower-case method is one the proxy refuses, and `explain` says so.
    let method = Method::from_bytes(method.as_bytes()).context("--method")?;
    let uri = path.parse().with_context(|| format!("--path {path:?}"))?;
    let mut map = HeaderMap::new();
    for h in headers {
        let Some((name, value)) = h.split_once(':') else {
            bail!("-H {h:?}: expected `Name: value`");
        };
        map.append(
            HeaderName::from_bytes(name.trim().as_bytes()).with_context(|| format!("-H {h:?}"))?,
            HeaderValue::from_str(value.trim()).with_context(|| format!("-H {h:?}"))?,
        );
    }
    let body = match body {
        None => Vec::new(),
        Some("-") => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("reading the body from stdin")?;
            buf
        }
        Some(file) => std::fs::read(file).with_context(|| format!("reading {file}"))?,
    };
    Ok(idemgate::explain::Request {
        method,
        uri,
        headers: map,
        body,
        client_ip: None,
        client_cert: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        let text = format!("listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\n{extra}");
        Config::parse(&text, "proxy.yaml").unwrap()
    }

    #[test]
    fn every_setting_read_once_at_start_is_named_by_a_reload() {
        let base = config("");
        let cases = [
            ("store: { memory: { max_entries: 10 } }\n", "store"),
            ("drain_timeout: 7s\n", "drain_timeout"),
            ("admin: 127.0.0.1:9901\n", "admin"),
            (
                "connections: { max_client: 10 }\n",
                "connections.max_client",
            ),
            (
                "connections: { max_streams: 10 }\n",
                "connections.max_streams",
            ),
            (
                "connections: { lingering_time: 1s }\n",
                "connections.lingering_*",
            ),
            (
                "connections: { client_send_timeout: 1s }\n",
                "connections.client_send_timeout",
            ),
        ];
        for (extra, name) in cases {
            assert_eq!(
                restart_only_changes(&base, &config(extra)),
                [name],
                "{extra}"
            );
        }
        assert!(restart_only_changes(&base, &config("defaults: { ttl: 1h }\n")).is_empty());
    }

    /// Adding or dropping `tls` is named (the port keeps speaking as it did); renewed
    /// certificates are not, a reload swaps them in.
    #[test]
    fn a_reload_that_adds_or_drops_tls_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let tls = |name: &str| {
            let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
            let (cert, key) = (
                dir.path().join(format!("{name}.pem")),
                dir.path().join(format!("{name}.key")),
            );
            std::fs::write(&cert, certified.cert.pem()).unwrap();
            std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
            config(&format!("tls: {{ cert: {:?}, key: {:?} }}\n", cert, key))
        };
        let (cleartext, first, renewed) = (config(""), tls("first"), tls("renewed"));
        assert_eq!(
            restart_only_changes(&cleartext, &first),
            ["tls (on or off)"]
        );
        assert_eq!(
            restart_only_changes(&first, &cleartext),
            ["tls (on or off)"]
        );
        assert!(restart_only_changes(&first, &renewed).is_empty());
    }
}
