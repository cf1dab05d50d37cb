//! The Dockerfile and the compose demos: a non-root image built with the project's cargo
//! flags, compose build targets that are stages of the Dockerfile, only idemgate and its
//! admin port exposed on loopback, the PostgreSQL demo on its own database.

use idemgate::config::units::parse_duration;
use idemgate::config::StoreConfig;
use serde_yaml_ng::Value;

use crate::support::*;

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
pub(crate) const COMPOSE_DEMOS: [(&str, &str); 2] = [
    ("docker-compose.yml", "compose/proxy.yaml"),
    ("docker-compose.postgres.yml", "compose/proxy.postgres.yaml"),
];

pub(crate) fn compose_file(file: &str) -> Value {
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
