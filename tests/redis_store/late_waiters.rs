//! A duplicate that waited on an owner that failed, and looks again only after the
//! failure's record expired, never executes the request itself (`common::shared_store`).

use crate::common::redis_server::RedisServer;
use crate::common::relay::relay_to;
use crate::common::shared_store::a_duplicate_that_looks_after_its_owners_failure_expired_does_not_execute as scenario;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_that_looks_after_its_owners_failure_expired_does_not_execute() {
    let redis = RedisServer::start();
    let relay = relay_to(redis.port).await;
    let direct = format!("  redis: {{ url: \"{}\", prefix: \"t:\" }}\n", redis.url());
    let relayed = format!(
        "  redis: {{ url: \"redis://{}\", prefix: \"t:\", timeout: 30s }}\n",
        relay.addr
    );
    // No record is a failure any more (their first byte is the kind).
    let gone = || {
        redis
            .cli(&["KEYS", "t:*"])
            .lines()
            .filter(|key| !key.is_empty())
            .all(|key| redis.cli(&["GETRANGE", key, "0", "0"]).trim() != "F")
    };
    scenario(&direct, &relayed, &relay, gone).await;
}
