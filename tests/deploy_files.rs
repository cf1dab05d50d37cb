//! The files under `deploy/` work as shipped: every YAML file parses, every idemgate config
//! in them is accepted by the real config loader, the real binary starts and answers its
//! health probe with each of them (with Redis down, as on a fresh cluster), and the
//! Kubernetes, systemd, compose and Docker files keep the settings that a graceful drain, a
//! non-root run and "all traffic through idemgate" depend on.
//!
//! Nothing here needs Docker, a cluster or the network. What only those could check (an
//! image actually building, a pod actually starting) is listed in `deploy/README.md`.

use std::fs;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idemgate::config::units::parse_duration;
use idemgate::config::{Config, StoreConfig};
use serde::Deserialize as _;
use serde_yaml_ng::Value;

/// Upper bound for anything that waits; only a hang guard, never what decides a result.
const HANG_GUARD: Duration = Duration::from_secs(30);

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn read(relative: &str) -> String {
    fs::read_to_string(deploy_dir().join(relative))
        .unwrap_or_else(|e| panic!("deploy/{relative}: {e}"))
}

/// Every document of a YAML stream (Kubernetes files hold several, separated by `---`).
fn documents(text: &str, name: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .enumerate()
        .map(|(i, doc)| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{name}, document {i}: {e}"))
        })
        .collect()
}

/// The value at a dotted path (`spec.template.spec`), or a panic naming the missing step.
fn at<'a>(value: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(value, |v, step| {
        v.get(step)
            .unwrap_or_else(|| panic!("`{path}`: no `{step}` in {v:?}"))
    })
}

fn text_at<'a>(value: &'a Value, path: &str) -> &'a str {
    at(value, path)
        .as_str()
        .unwrap_or_else(|| panic!("`{path}` is not a string"))
}

fn items<'a>(value: &'a Value, path: &str) -> &'a [Value] {
    at(value, path)
        .as_sequence()
        .unwrap_or_else(|| panic!("`{path}` is not a list"))
}

/// The one document of `kind` in a Kubernetes file.
fn kube_object(file: &str, kind: &str) -> Value {
    let mut found: Vec<Value> = documents(&read(file), file)
        .into_iter()
        .filter(|d| d.get("kind").and_then(Value::as_str) == Some(kind))
        .collect();
    assert_eq!(found.len(), 1, "deploy/{file}: expected one {kind}");
    found.remove(0)
}

/// The container named `name` of a pod spec.
fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    items(pod, "containers")
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
        .unwrap_or_else(|| panic!("no container {name:?} in the pod"))
}

/// A probe's or Service's port: a number, or the name of one of the container's ports.
fn port_number(port: &Value, container: &Value) -> u16 {
    if let Some(n) = port.as_u64() {
        return u16::try_from(n).expect("a port number");
    }
    let name = port.as_str().expect("a port number or name");
    let declared = items(container, "ports")
        .iter()
        .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
        .unwrap_or_else(|| panic!("no container port named {name:?}"));
    u16::try_from(at(declared, "containerPort").as_u64().expect("a number")).expect("a port")
}

/// The idemgate config embedded in the ConfigMap, as idemgate will read it in the pod.
fn configmap_proxy_yaml() -> String {
    let map = kube_object("kubernetes/configmap.yaml", "ConfigMap");
    // Not `text_at(.., "data.proxy.yaml")`: the key itself contains a dot.
    at(&map, "data")
        .get("proxy.yaml")
        .and_then(Value::as_str)
        .expect("data[\"proxy.yaml\"] in the ConfigMap")
        .to_owned()
}

/// Every idemgate config that `deploy/` ships, with a name for messages.
fn shipped_configs() -> Vec<(&'static str, String)> {
    vec![
        ("deploy/compose/proxy.yaml", read("compose/proxy.yaml")),
        (
            "deploy/compose/proxy.postgres.yaml",
            read("compose/proxy.postgres.yaml"),
        ),
        (
            "deploy/kubernetes/configmap.yaml (data.proxy.yaml)",
            configmap_proxy_yaml(),
        ),
        ("deploy/systemd/proxy.yaml", read("systemd/proxy.yaml")),
    ]
}

/// Loads a shipped config, its secret files (admin token, store key) stood in for by files
/// of this test: the shipped paths exist only where the orchestrator mounts them.
fn parse_config(name: &str, text: &str) -> Config {
    let dir = tempfile::tempdir().expect("a temp dir");
    let text = with_local_secrets(text, dir.path());
    Config::parse(&text, name).unwrap_or_else(|e| panic!("{e}"))
}

/// The token the stand-in admin token files hold.
const TEST_ADMIN_TOKEN: &str = "deploy-test-token";

/// `text` with `admin.token_file` and `store.encrypt.key_file` pointed at files written in
/// `dir` (a token, a key), everything else as shipped.
fn with_local_secrets(text: &str, dir: &Path) -> String {
    let mut doc: Value = serde_yaml_ng::from_str(text).expect("a YAML mapping");
    if let Some(file) = doc.get_mut("admin").and_then(|a| a.get_mut("token_file")) {
        let path = dir.join("admin-token");
        fs::write(&path, format!("{TEST_ADMIN_TOKEN}\n")).expect("write token");
        *file = Value::String(path.display().to_string());
    }
    let key_file = doc
        .get_mut("store")
        .and_then(|s| s.get_mut("encrypt"))
        .and_then(|e| e.get_mut("key_file"));
    if let Some(file) = key_file {
        let path = dir.join("store-key");
        fs::write(&path, "07".repeat(32)).expect("write key");
        *file = Value::String(path.display().to_string());
    }
    serde_yaml_ng::to_string(&doc).expect("serializable")
}

/// Where a shipped config reads its admin token: a file, never a token written into a
/// file of the repository.
fn admin_token_file(name: &str, text: &str) -> String {
    let doc: Value = serde_yaml_ng::from_str(text).expect("a YAML mapping");
    let admin = doc
        .get("admin")
        .unwrap_or_else(|| panic!("{name}: no admin"));
    assert!(
        admin.get("token").is_none(),
        "{name}: a literal admin token in the repository is no secret"
    );
    admin
        .get("token_file")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{name}: admin has no token_file"))
        .to_owned()
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yml" | "yaml")
        ) {
            out.push(path);
        }
    }
}

#[test]
fn every_yaml_file_under_deploy_parses() {
    let mut files = Vec::new();
    yaml_files(&deploy_dir(), &mut files);
    files.sort();
    // The walk must see the files the other tests rely on, or a move would skip them silently.
    for expected in [
        "compose/proxy.yaml",
        "compose/proxy.postgres.yaml",
        "docker-compose.yml",
        "docker-compose.postgres.yml",
        "kubernetes/configmap.yaml",
        "kubernetes/deployment.yaml",
        "kubernetes/service.yaml",
        "systemd/proxy.yaml",
    ] {
        assert!(
            files.contains(&deploy_dir().join(expected)),
            "deploy/{expected} is missing"
        );
    }
    for file in &files {
        let name = file.display().to_string();
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{name}: {e}"));
        let docs = documents(&text, &name);
        assert!(
            docs.iter().any(|d| !d.is_null()),
            "{name}: no YAML document in it"
        );
    }
}

#[test]
fn every_shipped_config_is_accepted_by_the_config_loader() {
    for (name, text) in shipped_configs() {
        let config = parse_config(name, &text);
        // The orchestrators (compose healthcheck, kubelet probes) need the admin listener.
        let admin = config
            .admin
            .unwrap_or_else(|| panic!("{name}: no admin listener to probe"));
        assert_eq!(
            admin.token.as_deref(),
            Some(TEST_ADMIN_TOKEN),
            "{name}: the admin listener has no token"
        );
    }
}

/// The admin port shows stored answers and deletes keys: no shipped deployment serves it
/// without a token, and each hands the token file over the way its orchestrator keeps
/// secrets (compose secrets, a Kubernetes Secret volume, a systemd credential).
#[test]
fn no_deployment_serves_admin_without_a_token_from_a_secret() {
    // Compose: a secret of the idemgate service, from a file kept out of git.
    for (file, proxy) in COMPOSE_DEMOS {
        let token_file = admin_token_file(proxy, &read(proxy));
        let name = token_file
            .strip_prefix("/run/secrets/")
            .expect("compose secrets are mounted under /run/secrets");
        let compose = compose_file(file);
        let secrets: Vec<&str> = items(&compose, "services.idemgate.secrets")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            secrets.contains(&name),
            "{file}: the idemgate service lacks secret {name}"
        );
        let source = text_at(at(&compose, "secrets"), &format!("{name}.file"));
        let ignored = read("compose/secrets/.gitignore");
        assert!(
            source.starts_with("./compose/secrets/") && ignored.lines().any(|l| l == "*"),
            "{file}: {source}: secret files live in a directory git ignores"
        );
    }

    // Kubernetes: the token file's directory is a Secret volume of the sidecar.
    let kube_file = admin_token_file("configmap.yaml", &configmap_proxy_yaml());
    let dir = Path::new(&kube_file)
        .parent()
        .expect("a directory")
        .to_str()
        .unwrap();
    let pod = pod_spec();
    let mount = items(container(&pod, "idemgate"), "volumeMounts")
        .iter()
        .find(|m| m.get("mountPath").and_then(Value::as_str) == Some(dir))
        .unwrap_or_else(|| panic!("nothing is mounted at {dir}"));
    let volume = items(&pod, "volumes")
        .iter()
        .find(|v| v.get("name") == mount.get("name"))
        .expect("the mount's volume");
    assert!(
        volume.get("secret").is_some(),
        "{dir} is not a Secret volume"
    );

    // systemd: a credential of the unit.
    let unit_file = admin_token_file("systemd/proxy.yaml", &read("systemd/proxy.yaml"));
    let credential = unit_file
        .strip_prefix("/run/credentials/idemgate.service/")
        .expect("a systemd credential path");
    let unit = unit_settings(&read("systemd/idemgate.service"));
    assert!(
        unit.iter().any(|(k, v)| k == "LoadCredential"
            && v.split_once(':').is_some_and(|(id, _)| id == credential)),
        "the unit loads no credential {credential}"
    );
}

// ---- the real binary with each shipped config ------------------------------------------

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

// ---- Kubernetes ------------------------------------------------------------------------

fn kube_config() -> Config {
    parse_config("configmap.yaml (data.proxy.yaml)", &configmap_proxy_yaml())
}

fn pod_spec() -> Value {
    at(
        &kube_object("kubernetes/deployment.yaml", "Deployment"),
        "spec.template.spec",
    )
    .clone()
}

fn pre_stop_sleep(container: &Value) -> u64 {
    container
        .get("lifecycle")
        .and_then(|l| l.get("preStop"))
        .and_then(|p| p.get("sleep"))
        .and_then(|s| s.get("seconds"))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

#[test]
fn the_kubernetes_sidecar_is_probed_on_the_admin_port() {
    let config = kube_config();
    let admin = config.admin.expect("admin listener").listen.port();
    let pod = pod_spec();
    let idemgate = container(&pod, "idemgate");
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = at(idemgate, &format!("{probe}.httpGet"));
        assert_eq!(text_at(get, "path"), path, "{probe}");
        assert_eq!(port_number(at(get, "port"), idemgate), admin, "{probe}");
    }
}

#[test]
fn the_kubernetes_pod_outlasts_idemgates_drain() {
    // SIGTERM reaches idemgate after its preStop sleep; the drain then runs for up to
    // drain_timeout. The kubelet's SIGKILL must come later, or in-flight answers are lost.
    let drain = kube_config().drain_timeout.as_secs();
    let pod = pod_spec();
    let grace = at(&pod, "terminationGracePeriodSeconds")
        .as_u64()
        .expect("a number");
    let idemgate = container(&pod, "idemgate");
    let needed = pre_stop_sleep(idemgate) + drain;
    assert!(grace > 30, "grace {grace}s is not above the default drain");
    assert!(
        grace > needed,
        "terminationGracePeriodSeconds {grace} <= preStop + drain_timeout ({needed}s)"
    );
    // The app must still answer while idemgate drains requests it forwarded to it.
    let app = container(&pod, "app");
    assert!(
        pre_stop_sleep(app) >= needed && pre_stop_sleep(app) < grace,
        "the app stops before idemgate has drained, or is killed during its preStop"
    );
}

#[test]
fn the_kubernetes_pod_runs_unprivileged() {
    let pod = pod_spec();
    let pod_level = pod
        .get("securityContext")
        .and_then(|s| s.get("runAsNonRoot"))
        .and_then(Value::as_bool);
    for c in items(&pod, "containers") {
        let name = text_at(c, "name");
        let security = at(c, "securityContext");
        let non_root = security
            .get("runAsNonRoot")
            .and_then(Value::as_bool)
            .or(pod_level);
        assert_eq!(non_root, Some(true), "{name}: runAsNonRoot");
        assert_eq!(
            at(security, "readOnlyRootFilesystem").as_bool(),
            Some(true),
            "{name}: readOnlyRootFilesystem"
        );
        assert_eq!(
            at(security, "allowPrivilegeEscalation").as_bool(),
            Some(false),
            "{name}: allowPrivilegeEscalation"
        );
        let dropped = items(security, "capabilities.drop");
        assert!(
            dropped.iter().any(|d| d.as_str() == Some("ALL")),
            "{name}: capabilities.drop lacks ALL"
        );
        assert!(
            c.get("resources").and_then(|r| r.get("limits")).is_some(),
            "{name}: no resource limits"
        );
    }
}

#[test]
fn the_kubernetes_service_sends_traffic_through_the_sidecar() {
    let listen = kube_config().listen.port();
    let service = kube_object("kubernetes/service.yaml", "Service");
    let deployment = kube_object("kubernetes/deployment.yaml", "Deployment");
    let pod = at(&deployment, "spec.template.spec");
    let idemgate = container(pod, "idemgate");
    for port in items(&service, "spec.ports") {
        let target = port_number(at(port, "targetPort"), idemgate);
        assert_eq!(target, 8080, "the Service targets {target}, not idemgate");
        assert_eq!(target, listen, "idemgate listens on {listen}");
    }
    // A selector that matched no pod would leave the Service empty.
    let labels = at(&deployment, "spec.template.metadata.labels");
    let selector = at(&service, "spec.selector")
        .as_mapping()
        .expect("a selector");
    for (key, value) in selector {
        assert_eq!(labels.get(key), Some(value), "selector {key:?}");
    }
}

#[test]
fn the_kubernetes_pod_mounts_the_configmap_where_idemgate_reads_it() {
    let map = kube_object("kubernetes/configmap.yaml", "ConfigMap");
    let pod = pod_spec();
    let idemgate = container(&pod, "idemgate");
    let args: Vec<&str> = items(idemgate, "args")
        .iter()
        .map(|a| a.as_str().expect("a string argument"))
        .collect();
    assert_eq!(args.first(), Some(&"run"), "args {args:?}");
    let path = args
        .iter()
        .skip_while(|a| **a != "--config")
        .nth(1)
        .map(Path::new)
        .expect("--config PATH in args");
    let mount = items(idemgate, "volumeMounts")
        .iter()
        .find(|m| Some(Path::new(text_at(m, "mountPath"))) == path.parent())
        .unwrap_or_else(|| panic!("nothing mounted at the directory of {}", path.display()));
    let volume = items(&pod, "volumes")
        .iter()
        .find(|v| at(v, "name") == at(mount, "name"))
        .expect("the mounted volume");
    assert_eq!(
        text_at(volume, "configMap.name"),
        text_at(&map, "metadata.name")
    );
    let file = path.file_name().and_then(|f| f.to_str()).expect("a file");
    assert!(
        at(&map, "data").get(file).is_some(),
        "the ConfigMap has no key {file}"
    );
}

#[test]
fn several_kubernetes_replicas_share_a_redis_store() {
    // With the memory store every replica would keep its own keys, and a duplicate that
    // lands on another pod would execute again.
    let deployment = kube_object("kubernetes/deployment.yaml", "Deployment");
    let replicas = at(&deployment, "spec.replicas").as_u64().expect("a number");
    assert!(replicas > 1);
    assert!(matches!(kube_config().store, StoreConfig::Redis(_)));
}

// ---- systemd ---------------------------------------------------------------------------

/// `Key=value` settings of a unit file, in order (keys such as ExecReload may repeat).
fn unit_settings(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', ';', '[']))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

#[test]
fn the_systemd_unit_runs_idemgate_reloads_on_sighup_and_outlasts_the_drain() {
    let settings = unit_settings(&read("systemd/idemgate.service"));
    let all = |key: &str| -> Vec<&str> {
        settings
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    let start = all("ExecStart");
    assert_eq!(start.len(), 1, "one ExecStart");
    let words: Vec<&str> = start[0].split_whitespace().collect();
    assert!(words[0].ends_with("/idemgate"), "ExecStart {:?}", start[0]);
    assert_eq!(words.get(1), Some(&"run"), "ExecStart {:?}", start[0]);
    assert!(
        all("ExecReload")
            .iter()
            .any(|r| r.contains("kill -HUP $MAINPID")),
        "no ExecReload sending SIGHUP"
    );
    let drain =
        parse_config("deploy/systemd/proxy.yaml", &read("systemd/proxy.yaml")).drain_timeout;
    let stop = all("TimeoutStopSec");
    let stop = parse_duration(stop.last().expect("TimeoutStopSec")).expect("a duration");
    assert!(
        stop > drain,
        "TimeoutStopSec {stop:?} <= drain_timeout {drain:?}"
    );
    assert_eq!(
        all("DynamicUser"),
        ["yes"],
        "not a dynamic, unprivileged user"
    );
}

// ---- Docker and compose ----------------------------------------------------------------

/// Dockerfile instructions with continuation lines joined, comments and blanks dropped.
fn dockerfile_instructions() -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in read("Dockerfile").lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                pending.push_str(part);
                pending.push(' ');
            }
            None => {
                pending.push_str(trimmed);
                out.push(std::mem::take(&mut pending));
            }
        }
    }
    out
}

/// The instruction's keyword (upper-cased) and its arguments.
fn split_instruction(instruction: &str) -> (String, &str) {
    let (keyword, rest) = instruction
        .split_once(char::is_whitespace)
        .unwrap_or((instruction, ""));
    (keyword.to_ascii_uppercase(), rest.trim())
}

/// Stages as (name from `AS name`, instructions after FROM).
fn dockerfile_stages() -> Vec<(String, Vec<String>)> {
    let mut stages: Vec<(String, Vec<String>)> = Vec::new();
    for instruction in dockerfile_instructions() {
        let (keyword, rest) = split_instruction(&instruction);
        if keyword == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => (*name).to_owned(),
                _ => String::new(),
            };
            stages.push((name, Vec::new()));
        } else if let Some((_, body)) = stages.last_mut() {
            body.push(instruction);
        }
    }
    stages
}

#[test]
fn the_dockerfile_image_runs_idemgate_as_a_non_root_user() {
    let stages = dockerfile_stages();
    let (_, last) = stages.last().expect("a FROM");
    let find_last = |wanted: &str| {
        last.iter()
            .rev()
            .find_map(|i| match split_instruction(i) {
                (k, rest) if k == wanted => Some(rest.to_owned()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no {wanted} in the final stage"))
    };
    let user = find_last("USER");
    let user = user.split(':').next().unwrap_or_default();
    assert!(
        !user.is_empty() && user != "root" && user != "0",
        "the final stage runs as {user:?}"
    );
    // Exec form, so idemgate is PID 1 and gets SIGTERM (drain) and SIGHUP (reload) itself.
    let entrypoint: Vec<String> =
        serde_json::from_str(&find_last("ENTRYPOINT")).expect("ENTRYPOINT in exec (JSON) form");
    assert!(
        entrypoint
            .first()
            .is_some_and(|e| e == "idemgate" || e.ends_with("/idemgate")),
        "ENTRYPOINT {entrypoint:?}"
    );
    let cmd: Vec<String> = serde_json::from_str(&find_last("CMD")).expect("CMD in exec form");
    assert_eq!(cmd.first().map(String::as_str), Some("run"), "CMD {cmd:?}");
    let expose = find_last("EXPOSE");
    for port in ["8080", "9901"] {
        assert!(
            expose.split_whitespace().any(|p| p == port),
            "EXPOSE {expose}"
        );
    }
}

/// The image is built with the flags the project is tested and measured with: the builder
/// copies `.cargo/` (its `--cfg tokio_unstable` turns on the runtime setting of
/// `batch_wakeups` in src/main.rs), and the ignore file lets it into the build context.
#[test]
fn the_image_is_built_with_the_projects_cargo_flags() {
    let root = deploy_dir().join("..");
    let flags = std::fs::read_to_string(root.join(".cargo/config.toml")).unwrap();
    assert!(flags.contains("tokio_unstable"), "{flags}");
    let stages = dockerfile_stages();
    let (_, builder) = stages
        .iter()
        .find(|(name, _)| name == "builder")
        .expect("a builder stage");
    let copy_at = builder.iter().position(|i| {
        let (keyword, rest) = split_instruction(i);
        keyword == "COPY" && rest.split_whitespace().next() == Some(".cargo/")
    });
    let build_at = builder.iter().position(|i| i.contains("cargo build"));
    assert!(
        matches!((copy_at, build_at), (Some(c), Some(b)) if c < b),
        "the builder copies .cargo/ before it builds: {builder:?}"
    );
    let ignore = read("Dockerfile.dockerignore");
    assert!(
        ignore.lines().any(|l| l.trim() == "!.cargo"),
        "the build context keeps .cargo/: {ignore}"
    );
}

/// The compose demos: each file with the idemgate config it mounts.
const COMPOSE_DEMOS: [(&str, &str); 2] = [
    ("docker-compose.yml", "compose/proxy.yaml"),
    ("docker-compose.postgres.yml", "compose/proxy.postgres.yaml"),
];

fn compose_file(file: &str) -> Value {
    documents(&read(file), file).remove(0)
}

#[test]
fn the_compose_build_targets_are_stages_of_the_dockerfile() {
    for (file, _) in COMPOSE_DEMOS {
        build_targets_are_stages(&compose_file(file));
    }
}

fn build_targets_are_stages(compose: &Value) {
    let stages: Vec<String> = dockerfile_stages().into_iter().map(|(n, _)| n).collect();
    let services = at(compose, "services").as_mapping().expect("services");
    for (name, service) in services {
        if let Some(build) = service.get("build") {
            assert_eq!(
                text_at(build, "dockerfile"),
                "deploy/Dockerfile",
                "{name:?}"
            );
            let target = text_at(build, "target");
            assert!(
                stages.iter().any(|s| s == target),
                "{name:?} builds target {target:?}, not a stage of deploy/Dockerfile"
            );
        }
    }
}

#[test]
fn the_compose_demo_exposes_only_idemgate_and_admin_on_loopback() {
    for (file, config) in COMPOSE_DEMOS {
        exposes_only_idemgate_and_admin(&compose_file(file), config);
    }
}

fn exposes_only_idemgate_and_admin(compose: &Value, config_file: &str) {
    let config = parse_config(config_file, &read(config_file));
    // The app must not be published: duplicates sent to it directly would execute.
    assert!(at(compose, "services.app").get("ports").is_none());
    let idemgate = at(compose, "services.idemgate");
    let ports: Vec<&str> = items(idemgate, "ports")
        .iter()
        .map(|p| p.as_str().expect("short port syntax"))
        .collect();
    let admin = config.admin.expect("admin").listen.port();
    let admin_ports: Vec<&&str> = ports
        .iter()
        .filter(|p| p.ends_with(&format!(":{admin}")))
        .collect();
    assert!(!admin_ports.is_empty(), "admin port {admin} not published");
    for p in admin_ports {
        assert!(
            p.starts_with("127.0.0.1:"),
            "admin published beyond loopback: {p}"
        );
    }
    assert!(
        ports
            .iter()
            .any(|p| *p == format!("{0}:{0}", config.listen.port())),
        "proxy port not published: {ports:?}"
    );
    // The mounted file is the shipped config, where the command reads it.
    let volumes = items(idemgate, "volumes");
    let mount = format!("./{config_file}:/etc/idemgate/proxy.yaml:ro");
    assert!(
        volumes.iter().any(|v| v.as_str() == Some(mount.as_str())),
        "{config_file} is not mounted at /etc/idemgate/proxy.yaml: {volumes:?}"
    );
    // Docker's default stop timeout (10s) would SIGKILL idemgate mid-drain.
    let grace = parse_duration(text_at(idemgate, "stop_grace_period")).expect("a duration");
    assert!(
        grace > config.drain_timeout,
        "stop_grace_period {grace:?} <= drain_timeout {:?}",
        config.drain_timeout
    );
}

/// The PostgreSQL demo: the database idemgate's URL names is the compose service, with the
/// user, password and database the URL carries, ready before idemgate starts, unpublished,
/// and with its data in a volume, so the stored answers outlive a restart of the container.
#[test]
fn the_postgres_compose_demo_points_idemgate_at_its_own_database() {
    let compose = compose_file("docker-compose.postgres.yml");
    let config = parse_config(
        "deploy/compose/proxy.postgres.yaml",
        &read("compose/proxy.postgres.yaml"),
    );
    let StoreConfig::Postgres(settings) = config.store else {
        panic!("compose/proxy.postgres.yaml: not a postgres store");
    };
    // postgres://USER:PASSWORD@HOST:PORT/DB
    let rest = settings
        .url
        .strip_prefix("postgres://")
        .expect("postgres://");
    let (credentials, place) = rest.split_once('@').expect("user@host");
    let (user, password) = credentials.split_once(':').expect("user:password");
    let (address, db) = place.split_once('/').expect("host/db");
    let (host, port) = address.split_once(':').expect("host:port");
    let postgres = at(&compose, "services.postgres");
    assert_eq!(host, "postgres", "the URL names the compose service");
    assert_eq!(text_at(postgres, "environment.POSTGRES_USER"), user);
    assert_eq!(text_at(postgres, "environment.POSTGRES_PASSWORD"), password);
    assert_eq!(text_at(postgres, "environment.POSTGRES_DB"), db);
    assert!(
        items(postgres, "expose")
            .iter()
            .any(|p| p.as_str() == Some(port)),
        "port {port} not exposed to idemgate"
    );
    assert!(postgres.get("ports").is_none(), "the database is published");
    assert_eq!(
        text_at(&compose, "services.idemgate.depends_on.postgres.condition"),
        "service_healthy"
    );
    assert!(
        items(postgres, "volumes")
            .iter()
            .filter_map(Value::as_str)
            .any(|v| v.ends_with(":/var/lib/postgresql/data")),
        "the database's data is not in a volume"
    );
}
