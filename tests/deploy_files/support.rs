//! Reading the files under `deploy/`: YAML documents and the values at a path in them,
//! Kubernetes objects and containers, the idemgate configs shipped in them (with secrets
//! pointed at local files), and the hang guard.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idemgate::config::Config;
use serde::Deserialize as _;
use serde_yaml_ng::Value;

/// Upper bound for anything that waits; only a hang guard, never what decides a result.
pub(crate) const HANG_GUARD: Duration = Duration::from_secs(30);

pub(crate) fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

pub(crate) fn read(relative: &str) -> String {
    fs::read_to_string(deploy_dir().join(relative))
        .unwrap_or_else(|e| panic!("deploy/{relative}: {e}"))
}

/// Every document of a YAML stream (Kubernetes files hold several, separated by `---`).
pub(crate) fn documents(text: &str, name: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .enumerate()
        .map(|(i, doc)| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{name}, document {i}: {e}"))
        })
        .collect()
}

/// The value at a dotted path (`spec.template.spec`), or a panic naming the missing step.
pub(crate) fn at<'a>(value: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(value, |v, step| {
        v.get(step)
            .unwrap_or_else(|| panic!("`{path}`: no `{step}` in {v:?}"))
    })
}

pub(crate) fn text_at<'a>(value: &'a Value, path: &str) -> &'a str {
    at(value, path)
        .as_str()
        .unwrap_or_else(|| panic!("`{path}` is not a string"))
}

pub(crate) fn items<'a>(value: &'a Value, path: &str) -> &'a [Value] {
    at(value, path)
        .as_sequence()
        .unwrap_or_else(|| panic!("`{path}` is not a list"))
}

/// The one document of `kind` in a Kubernetes file.
pub(crate) fn kube_object(file: &str, kind: &str) -> Value {
    let mut found: Vec<Value> = documents(&read(file), file)
        .into_iter()
        .filter(|d| d.get("kind").and_then(Value::as_str) == Some(kind))
        .collect();
    assert_eq!(found.len(), 1, "deploy/{file}: expected one {kind}");
    found.remove(0)
}

/// The container named `name` of a pod spec.
pub(crate) fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    items(pod, "containers")
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
        .unwrap_or_else(|| panic!("no container {name:?} in the pod"))
}

/// A probe's or Service's port: a number, or the name of one of the container's ports.
pub(crate) fn port_number(port: &Value, container: &Value) -> u16 {
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
pub(crate) fn configmap_proxy_yaml() -> String {
    let map = kube_object("kubernetes/configmap.yaml", "ConfigMap");
    // Not `text_at(.., "data.proxy.yaml")`: the key itself contains a dot.
    at(&map, "data")
        .get("proxy.yaml")
        .and_then(Value::as_str)
        .expect("data[\"proxy.yaml\"] in the ConfigMap")
        .to_owned()
}

/// Every idemgate config that `deploy/` ships, with a name for messages.
pub(crate) fn shipped_configs() -> Vec<(&'static str, String)> {
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
pub(crate) fn parse_config(name: &str, text: &str) -> Config {
    let dir = tempfile::tempdir().expect("a temp dir");
    let text = with_local_secrets(text, dir.path());
    Config::parse(&text, name).unwrap_or_else(|e| panic!("{e}"))
}

/// The token the stand-in admin token files hold.
pub(crate) const TEST_ADMIN_TOKEN: &str = "deploy-test-token";

/// `text` with `admin.token_file` and `store.encrypt.key_file` pointed at files written in
/// `dir` (a token, a key), everything else as shipped.
pub(crate) fn with_local_secrets(text: &str, dir: &Path) -> String {
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
pub(crate) fn admin_token_file(name: &str, text: &str) -> String {
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

pub(crate) fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
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
