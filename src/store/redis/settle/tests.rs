//! The reading of Redis' refusals of an answer, and the memo of the length refused.

use std::time::{Duration, Instant};

use super::{refuses_value, RefusedLen, REFUSED_LEN_KEPT};

/// Redis' error answer `line` (without its `-`), as the client reads it.
fn server_error(line: &str) -> redis::RedisError {
    let reply = format!("-{line}\r\n");
    redis::parse_redis_value(reply.as_bytes())
        .and_then(redis::Value::extract_error)
        .expect_err("an error answer")
}

#[test]
fn only_a_bulk_over_the_servers_limit_is_a_refused_value() {
    assert!(refuses_value(&server_error(
        "ERR Protocol error: invalid bulk length"
    )));
    for other in [
        // Any value over 16 KiB on a connection not yet authenticated (Redis 7.2+): a
        // repeat once authenticated lands.
        "ERR Protocol error: unauthenticated bulk length",
        "ERR Protocol error: invalid multibulk length",
        "ERR Protocol error: unauthenticated multibulk length",
        "ERR Protocol error: too big inline request",
        "ERR Protocol error: expected '$', got ' '",
        "OOM command not allowed when used memory > 'maxmemory'.",
        "READONLY You can't write against a read only replica.",
        "NOAUTH Authentication required.",
    ] {
        assert!(!refuses_value(&server_error(other)), "{other}");
    }
}

#[test]
fn the_refused_length_is_the_shortest_refused_and_forgotten_in_time() {
    let memo = RefusedLen::default();
    let start = Instant::now();
    assert!(!memo.refuses(u64::MAX, start), "nothing refused yet");
    memo.note(1000, start);
    memo.note(2000, start);
    assert!(memo.refuses(1000, start));
    assert!(memo.refuses(5000, start));
    assert!(!memo.refuses(999, start));
    let late = start + REFUSED_LEN_KEPT - Duration::from_secs(1);
    assert!(memo.refuses(1000, late), "still remembered");
    // A raised `proto-max-bulk-len`, or a failover to a server with a higher one, is
    // found out by sending the answer again.
    let past = start + REFUSED_LEN_KEPT;
    assert!(!memo.refuses(1000, past), "forgotten");
    memo.note(3000, past);
    assert!(!memo.refuses(2000, past), "a new refusal starts over");
    assert!(memo.refuses(3000, past));
}
