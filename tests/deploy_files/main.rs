//! The files under `deploy/` work as shipped: every YAML file parses, every idemgate config
//! in them is accepted by the real config loader, the real binary starts and answers its
//! health probe with each of them (with Redis down, as on a fresh cluster), and the
//! Kubernetes, systemd, compose and Docker files keep the settings that a graceful drain, a
//! non-root run and "all traffic through idemgate" depend on.
//!
//! Nothing here needs Docker, a cluster or the network. What only those could check (an
//! image actually building, a pod actually starting) is listed in `deploy/README.md`.
//!
//! The checks of every file are here; `support.rs` reads and navigates the files,
//! `binary.rs` runs the real binary with each shipped config, and `kubernetes.rs`,
//! `systemd.rs` and `docker.rs` check the files of each deployment.

mod binary;
mod docker;
mod kubernetes;
mod support;
mod systemd;

use std::fs;
use std::path::Path;

use serde_yaml_ng::Value;

use docker::{compose_file, COMPOSE_DEMOS};
use kubernetes::pod_spec;
use support::*;
use systemd::unit_settings;

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
