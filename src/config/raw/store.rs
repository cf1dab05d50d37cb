//! `store:` as written: one backend section (`memory`, `redis`, `postgres`, `mysql`) and
//! `encrypt`. URLs, table names and percentages are checked while parsing, so a typo is
//! reported at its line.

use std::str::FromStr;

use serde::Deserialize;

use super::Parsed;
use crate::config::units::{ByteSize, ConfigDuration};

/// `store:` — exactly one backend.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub memory: Option<RawMemory>,
    pub redis: Option<RawRedis>,
    pub encrypt: Option<RawEncrypt>,
    pub postgres: Option<RawSql>,
    pub mysql: Option<RawSql>,
}

/// `store.encrypt` — keys that seal stored answers: `key_file` or `key_env` for one, or
/// `keys: [{file} | {env}, …]` for a rotation (the first key written seals); and
/// `clear_records`, whether answers stored in clear are still read.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEncrypt {
    pub key_file: Option<String>,
    pub key_env: Option<String>,
    pub keys: Option<Vec<RawKeySource>>,
    pub clear_records: Option<ClearRecords>,
}

/// `store.encrypt.clear_records`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClearRecords {
    /// Replay answers stored before encryption was turned on (the migration path).
    Accept,
    /// Answer them `500 stored-answer-unreadable`, never replayed, never run again.
    Refuse,
}

/// One key of `store.encrypt.keys`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKeySource {
    pub file: Option<String>,
    pub env: Option<String>,
}

/// `store.postgres` and `store.mysql`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSql {
    pub url: Parsed<SqlUrl>,
    pub table: Option<Parsed<TableName>>,
    pub timeout: Option<ConfigDuration>,
    pub max_connections: Option<u32>,
}

/// A `postgres://` or `mysql://` URL, checked when the config is read (which section it
/// belongs in is checked after).
#[derive(Debug, Clone)]
pub struct SqlUrl(pub String);

impl SqlUrl {
    /// Whether it names PostgreSQL (else MySQL).
    pub fn is_postgres(&self) -> bool {
        self.0.starts_with("postgres")
    }
}

impl FromStr for SqlUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once("://").map(|(scheme, _)| scheme) {
            Some("postgres" | "postgresql") => crate::store::sql::postgres::check_url(s)?,
            Some("mysql" | "mariadb") => crate::store::sql::mysql::check_url(s)?,
            _ => return Err("expected a postgres:// or mysql:// URL".into()),
        }
        Ok(Self(s.to_owned()))
    }
}

/// A table name idemgate can write into its SQL as it is.
#[derive(Debug, Clone)]
pub struct TableName(pub String);

impl FromStr for TableName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        crate::store::sql::valid_table(s)?;
        Ok(Self(s.to_owned()))
    }
}

/// `store.redis`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedis {
    pub url: Option<Parsed<RedisUrl>>,
    pub cluster: Option<Vec<Parsed<RedisUrl>>>,
    pub prefix: Option<String>,
    pub timeout: Option<ConfigDuration>,
    pub ca: Option<String>,
}

/// A `redis://` or `rediss://` URL, checked when the config is read.
#[derive(Debug, Clone)]
pub struct RedisUrl(pub String);

impl FromStr for RedisUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let scheme = s.split_once("://").map(|(scheme, _)| scheme);
        if !matches!(scheme, Some("redis" | "rediss")) {
            return Err("expected a redis:// or rediss:// URL".into());
        }
        redis::IntoConnectionInfo::into_connection_info(s).map_err(|e| e.to_string())?;
        Ok(Self(s.to_owned()))
    }
}

/// `store.memory`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMemory {
    pub max_entries: Option<usize>,
    pub max_bytes: Option<ByteSize>,
    pub when_full: Option<WhenFull>,
    pub caller_share: Option<Parsed<Percent>>,
    pub address_share: Option<Parsed<Percent>>,
    pub token_share: Option<Parsed<Percent>>,
}

/// A share written as a percentage: `25%`.
#[derive(Debug, Clone, Copy)]
pub struct Percent(pub u8);

impl FromStr for Percent {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected a percentage from 1% to 100%");
        let n: u8 = s
            .trim()
            .strip_suffix('%')
            .ok_or_else(bad)?
            .trim()
            .parse()
            .map_err(|_| bad())?;
        if (1..=100).contains(&n) {
            Ok(Self(n))
        } else {
            Err(bad())
        }
    }
}

/// `store.memory.when_full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenFull {
    /// Evict the live record closest to expiry (counted).
    Evict,
    /// Refuse new claims with 503.
    Reject,
}
