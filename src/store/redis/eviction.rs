//! Whether Redis may evict records: with a `maxmemory` and any `maxmemory-policy` but
//! `noeviction`, memory pressure deletes keys, a claim in flight or a stored answer among
//! them, and the request it recorded runs again. So a claim first asks (`INFO memory`,
//! which managed services that forbid `CONFIG` still answer) and is refused while the
//! server may evict ([`StoreError::Evicting`]: a `503` whatever `on_store_error` says, as
//! the server is reachable and forwarding would run every retry again). A server that will not say (`INFO` renamed or denied by an
//! ACL) is used unchecked, with a warning. A verdict is kept a while and then asked again:
//! the policy can change at runtime (`CONFIG SET`), or a failover land on another server.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::Value;

use super::RedisStore;
use crate::store::StoreError;
use crate::sync::lock;

/// How long a server found not to evict is trusted before it is asked again.
const TRUSTED_FOR: Duration = Duration::from_secs(60);
/// How long a refusal stands before the server is asked again (claims meanwhile fail at
/// once, without a round trip).
const REFUSED_FOR: Duration = Duration::from_secs(2);

/// What the store last learnt about eviction.
#[derive(Debug)]
pub(super) struct Eviction {
    /// Measured from here.
    start: Instant,
    /// Until when (ms after `start`) the server is trusted not to evict; 0: never checked.
    trusted_until: AtomicU64,
    /// The last refusal: when it stops standing, and why.
    refused: Mutex<Option<(Instant, String)>>,
}

impl Default for Eviction {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            trusted_until: AtomicU64::new(0),
            refused: Mutex::new(None),
        }
    }
}

impl Eviction {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn trust(&self) {
        let until = self.now_ms() + TRUSTED_FOR.as_millis() as u64;
        self.trusted_until.store(until.max(1), Relaxed);
        *lock(&self.refused) = None;
    }
}

impl RedisStore {
    /// `Ok` unless the server may evict records (see the module docs). A server that
    /// cannot be reached fails as any operation would.
    pub(super) async fn refuse_if_evicting(&self) -> Result<(), StoreError> {
        let eviction = &self.eviction;
        if eviction.now_ms() < eviction.trusted_until.load(Relaxed) {
            return Ok(());
        }
        if let Some((until, why)) = lock(&eviction.refused).as_ref() {
            if Instant::now() < *until {
                return Err(StoreError::Evicting(why.clone()));
            }
        }
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        match self.query_raw(&info).await? {
            Ok(answer) => match evicting(&answer) {
                None => {
                    eviction.trust();
                    Ok(())
                }
                Some(why) => {
                    tracing::error!("{why}; claims are refused until it is set");
                    *lock(&eviction.refused) = Some((Instant::now() + REFUSED_FOR, why.clone()));
                    Err(StoreError::Evicting(why))
                }
            },
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot learn whether redis evicts keys; run it with maxmemory-policy noeviction"
                );
                eviction.trust();
                Ok(())
            }
        }
    }
}

/// Why a server whose `INFO memory` answer is `answer` may evict records, or `None`. A
/// cluster answers per node: any node that may evict counts.
fn evicting(answer: &Value) -> Option<String> {
    let mut texts = Vec::new();
    texts_of(answer, &mut texts);
    texts.iter().find_map(|text| {
        let field = |name: &str| {
            text.lines()
                .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
        };
        let maxmemory = field("maxmemory")?;
        let policy = field("maxmemory_policy")?;
        (maxmemory != "0" && policy != "noeviction").then(|| {
            format!(
                "redis may evict idemgate's records (maxmemory {maxmemory} bytes, \
                 maxmemory-policy {policy}): set maxmemory-policy noeviction"
            )
        })
    })
}

fn texts_of(value: &Value, texts: &mut Vec<String>) {
    match value {
        Value::BulkString(bytes) => texts.push(String::from_utf8_lossy(bytes).into_owned()),
        Value::VerbatimString { text, .. } | Value::SimpleString(text) => texts.push(text.clone()),
        Value::Array(items) | Value::Set(items) => {
            items.iter().for_each(|item| texts_of(item, texts));
        }
        Value::Map(pairs) => pairs.iter().for_each(|(_, item)| texts_of(item, texts)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(maxmemory: &str, policy: &str) -> Value {
        Value::BulkString(
            format!("# Memory\r\nused_memory:1000\r\nmaxmemory:{maxmemory}\r\nmaxmemory_human:1M\r\nmaxmemory_policy:{policy}\r\n")
                .into_bytes(),
        )
    }

    #[test]
    fn only_a_memory_limit_with_an_evicting_policy_may_evict() {
        assert!(evicting(&info("0", "allkeys-lru")).is_none(), "no limit");
        assert!(evicting(&info("1048576", "noeviction")).is_none());
        for policy in [
            "allkeys-lru",
            "volatile-ttl",
            "volatile-lru",
            "allkeys-random",
        ] {
            let why = evicting(&info("1048576", policy)).expect(policy);
            assert!(why.contains(policy), "{why}");
        }
    }

    #[test]
    fn one_evicting_node_of_a_cluster_is_enough() {
        let cluster = Value::Map(vec![
            (
                Value::SimpleString("a:1".into()),
                info("1048576", "noeviction"),
            ),
            (
                Value::SimpleString("b:2".into()),
                info("1048576", "volatile-lru"),
            ),
        ]);
        assert!(evicting(&cluster).is_some());
    }

    #[test]
    fn an_answer_without_the_fields_is_no_evidence() {
        assert!(evicting(&Value::BulkString(b"# Memory\r\n".to_vec())).is_none());
    }
}
