//! The Kubernetes files: the sidecar probed on the admin port, a pod that outlasts the
//! drain and runs unprivileged, the service sending traffic through the sidecar, the
//! config map mounted where idemgate reads it, replicas sharing a Redis store.

use std::path::Path;

use idemgate::config::{Config, StoreConfig};
use serde_yaml_ng::Value;

use crate::support::*;

fn kube_config() -> Config {
    parse_config("configmap.yaml (data.proxy.yaml)", &configmap_proxy_yaml())
}

pub(crate) fn pod_spec() -> Value {
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
