//! `store:` compiled into a [`StoreConfig`]: exactly one backend (memory, Redis,
//! PostgreSQL or MySQL) with its bounds and connection settings, the memory store when the
//! section is absent. `store.encrypt` is read here too, by [`super::secrets`], since it
//! sits in the same section.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::error::CompileError;
use super::raw::store::{RawSql, RawStore, WhenFull};
use super::secrets;
use crate::store::redis::RedisSettings;
use crate::store::seal::KeyRing;
use crate::store::{MemoryLimits, SqlSettings};

/// Store backend choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// The embedded memory store.
    Memory(MemoryLimits),
    /// Redis, shared by several replicas.
    Redis(RedisSettings),
    /// A PostgreSQL table, shared by replicas and durable.
    Postgres(SqlSettings),
    /// A MySQL or MariaDB table, shared by replicas and durable.
    Mysql(SqlSettings),
}

/// `store:` as a backend and, when `store.encrypt` is set, the keys that seal stored
/// answers.
pub(super) fn compile_store_section(
    raw: Option<RawStore>,
    base: &Path,
) -> Result<(StoreConfig, Option<Arc<KeyRing>>), CompileError> {
    let Some(mut s) = raw else {
        return Ok((StoreConfig::Memory(MemoryLimits::default()), None));
    };
    let encrypt = s
        .encrypt
        .take()
        .map(|e| secrets::compile_encrypt(e, base))
        .transpose()?;
    let no_backend =
        s.memory.is_none() && s.redis.is_none() && s.postgres.is_none() && s.mysql.is_none();
    let store = if no_backend && encrypt.is_some() {
        // `store: { encrypt: … }` alone: the default backend, sealed.
        StoreConfig::Memory(MemoryLimits::default())
    } else {
        compile_store(s, base)?
    };
    Ok((store, encrypt))
}

fn compile_store(s: RawStore, base: &Path) -> Result<StoreConfig, CompileError> {
    match (s.memory, s.redis, s.postgres, s.mysql) {
        (Some(m), None, None, None) => {
            let defaults = MemoryLimits::default();
            let limits = MemoryLimits {
                max_entries: m.max_entries.unwrap_or(defaults.max_entries),
                max_bytes: m.max_bytes.map_or(defaults.max_bytes, |b| b.0 as usize),
                when_full: match m.when_full {
                    None | Some(WhenFull::Evict) => crate::store::WhenFull::Evict,
                    Some(WhenFull::Reject) => crate::store::WhenFull::Reject,
                },
                caller_share: m.caller_share.map_or(100, |p| p.0 .0),
                address_share: m.address_share.map_or(100, |p| p.0 .0),
                token_share: m.token_share.map_or(defaults.token_share, |p| p.0 .0),
            };
            if limits.max_entries == 0 || limits.max_bytes == 0 {
                return Err(CompileError::new(
                    "store.memory",
                    "max_entries and max_bytes must be above zero",
                ));
            }
            Ok(StoreConfig::Memory(limits))
        }
        (None, Some(r), None, None) => {
            let cluster: Vec<String> = r
                .cluster
                .unwrap_or_default()
                .into_iter()
                .map(|u| u.0 .0)
                .collect();
            let url = r.url.map(|u| u.0 .0);
            // Both given, or neither.
            if url.is_some() != cluster.is_empty() {
                return Err(CompileError::new(
                    "store.redis",
                    "give either `url` (one server) or `cluster` (seed nodes)",
                ));
            }
            let timeout = r.timeout.map_or(Duration::from_secs(1), |d| d.0);
            if timeout.is_zero() {
                return Err(CompileError::new(
                    "store.redis.timeout",
                    "must be above zero",
                ));
            }
            // What opening the store refuses, refused here, so `check` and a reload see it:
            // seeds of one scheme, and TLS roots only for `rediss://`, holding a certificate.
            let urls = || url.iter().chain(&cluster);
            let tls = |u: &String| u.starts_with("rediss://");
            if urls().any(tls) && !urls().all(tls) {
                return Err(CompileError::new(
                    "store.redis.cluster",
                    "the seeds mix redis:// and rediss://; a cluster speaks TLS to every node or none",
                ));
            }
            let ca = match &r.ca {
                Some(path) => {
                    let pem = std::fs::read(base.join(path))
                        .map_err(|e| CompileError::new("store.redis.ca", format!("{path}: {e}")))?;
                    if !urls().all(tls) {
                        return Err(CompileError::new(
                            "store.redis.ca",
                            "`ca` is for a TLS connection: write the URL as rediss://",
                        ));
                    }
                    if !crate::tls::holds_certificates(&pem) {
                        return Err(CompileError::new(
                            "store.redis.ca",
                            format!("{path}: no PEM certificate in it"),
                        ));
                    }
                    Some(pem)
                }
                None => None,
            };
            Ok(StoreConfig::Redis(RedisSettings {
                url,
                cluster,
                prefix: r.prefix.unwrap_or_else(|| "idemgate:".to_owned()),
                timeout,
                ca,
            }))
        }
        (None, None, Some(p), None) => compile_sql(p, "postgres").map(StoreConfig::Postgres),
        (None, None, None, Some(m)) => compile_sql(m, "mysql").map(StoreConfig::Mysql),
        _ => Err(CompileError::new(
            "store",
            "name exactly one backend: `memory`, `redis`, `postgres` or `mysql`",
        )),
    }
}

/// `store.postgres` or `store.mysql` (`section`).
fn compile_sql(s: RawSql, section: &str) -> Result<SqlSettings, CompileError> {
    let err =
        |key: &str, message: &str| CompileError::new(format!("store.{section}.{key}"), message);
    let url = s.url.0;
    if url.is_postgres() != (section == "postgres") {
        return Err(err(
            "url",
            &format!("a {section} store needs a {section}:// URL"),
        ));
    }
    let defaults = SqlSettings::new(url.0);
    let settings = SqlSettings {
        table: s.table.map_or(defaults.table.clone(), |t| t.0 .0),
        timeout: s.timeout.map_or(defaults.timeout, |d| d.0),
        max_connections: s.max_connections.unwrap_or(defaults.max_connections),
        ..defaults
    };
    if settings.timeout.is_zero() {
        return Err(err("timeout", "must be above zero"));
    }
    if settings.max_connections == 0 {
        return Err(err("max_connections", "must be above zero"));
    }
    Ok(settings)
}
