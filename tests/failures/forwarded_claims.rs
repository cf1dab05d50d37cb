//! A claim whose reply came only after the store timeout on a route that fails open: the
//! request was forwarded unprotected, and the claim, which Redis ran all the same, now
//! stands for a request that went out. It is never released (nor its token issued
//! again): a retry is never run a second time, it gets the in-flight 409 while the claim's
//! lease runs and the outcome-unknown 409 once it lapsed.

use http::StatusCode;

use crate::claims_left_behind::{warm_token_route, TOKEN_ROUTE};
use crate::common::redis_server::RedisServer;
use crate::common::{self, post, ProxyHandle};
use crate::held_replies::*;
use crate::route;

/// The policy keys of these tests' routes: they fail open, a duplicate found in flight is
/// answered at once, and a claim left alone lapses (into an unknown outcome) after 1 s.
const FAILING_OPEN: [&str; 3] = [
    "on_store_error: fail_open",
    "in_flight: reject",
    "lease: 1s",
];

/// Sends `headers` to `path` while Redis's replies are held past the store timeout: the
/// claim times out, the request is forwarded unprotected and answered (`201`), and Redis
/// has run the claim all the same (its reply reached the relay). Then the replies flow.
async fn forwarded_after_an_unanswered_claim(
    relay: &Relay,
    upstream: &common::Upstream,
    proxy: &ProxyHandle,
    path: &str,
    headers: &[(&str, &str)],
) {
    let (before, executed) = (relay.received(), upstream.executed());
    relay.hold.send_replace(true);
    let forwarded = post(proxy.addr, path, headers, "{}").await;
    assert_eq!(
        forwarded.status,
        StatusCode::CREATED,
        "forwarded unprotected"
    );
    assert_eq!(upstream.executed(), executed + 1);
    until(|| relay.received() > before, "Redis to run the claim").await;
    relay.hold.send_replace(false);
}

/// Retries `headers` until the retry gets the outcome-unknown 409 (the forwarded request's
/// claim lapsed), never reaching the upstream: before that, each gets the in-flight 409.
/// The record stays in Redis throughout, a claim (`I`) and never `kinds_freed`.
async fn retries_never_run_again(
    redis: &RedisServer,
    upstream: &common::Upstream,
    proxy: &ProxyHandle,
    path: &str,
    headers: &[(&str, &str)],
    kinds_freed: &[&str],
) {
    let executed = upstream.executed();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let retry = post(proxy.addr, path, headers, "{}").await;
        assert_eq!(
            upstream.executed(),
            executed,
            "a retry of a forwarded request ran again: {} {}",
            retry.status,
            String::from_utf8_lossy(&retry.body)
        );
        assert_eq!(retry.status, StatusCode::CONFLICT);
        assert_ne!(record_kinds(redis), kinds_freed, "the claim was released");
        match retry.problem().as_str() {
            "urn:idemgate:problem:outcome-unknown" => return,
            "urn:idemgate:problem:in-flight" => {}
            other => panic!("unexpected problem {other}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "hang guard: the claim never lapsed"
        );
        // Polled until the lease runs out; no race rides on this pause.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `fail_open` forwards a request whose claim got no reply within the store timeout; Redis
/// had run the claim (a stall past the timeout, a fork). The claim must not be released as
/// one under which nothing was sent: its retry would find the key free and run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_landed_while_its_reply_was_late_is_not_released_after_a_fail_open_forward() {
    let (redis, relay, upstream, proxy) =
        timing_out_behind_held_replies(&route(&FAILING_OPEN.join("\n    "))).await;
    warm_up(&proxy).await;
    let landed = [("idempotency-key", "landed")];
    forwarded_after_an_unanswered_claim(&relay, &upstream, &proxy, "/orders", &landed).await;
    retries_never_run_again(&redis, &upstream, &proxy, "/orders", &landed, &["D"]).await;
    assert_eq!(upstream.executed_for("landed"), 1);
}

/// Observe mode forwards whatever the store answers; a claim whose reply came late, which
/// Redis ran all the same, stands for the request it forwarded, as with `fail_open`. Once
/// the route is switched to `on`, a retry finds it (in flight, then an unknown outcome)
/// and is never run a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observed_claim_that_landed_while_its_reply_was_late_is_kept_for_enforcement() {
    let policy = ["in_flight: reject", "lease: 1s"].join("\n    ");
    let observed = route(&format!("idempotency: observe\n    {policy}"));
    let (redis, relay, upstream, proxy) = timing_out_behind_held_replies(&observed).await;
    warm_up(&proxy).await;
    let landed = [("idempotency-key", "observed")];
    forwarded_after_an_unanswered_claim(&relay, &upstream, &proxy, "/orders", &landed).await;
    let store = format!(
        "store:\n  redis: {{ url: \"redis://{}\", timeout: 200ms }}\n",
        relay.addr
    );
    common::reload(&proxy, upstream.addr, &format!("{store}{}", route(&policy)));
    retries_never_run_again(&redis, &upstream, &proxy, "/orders", &landed, &["D"]).await;
    assert_eq!(upstream.executed_for("observed"), 1);
}

/// The same on a token route: the token the claim consumed is not issued again, so a retry
/// with it is never run a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_claim_that_landed_while_its_reply_was_late_is_not_reissued_after_a_fail_open_forward(
) {
    let routes = format!("defaults: {{ {} }}\n{TOKEN_ROUTE}", FAILING_OPEN.join(", "));
    let (redis, relay, upstream, proxy) = timing_out_behind_held_replies(&routes).await;
    let token = warm_token_route(&proxy).await;
    assert_eq!(record_kinds(&redis), ["D", "T"]);
    let headers = [
        ("authorization", "Bearer alice"),
        ("idempotency-token", token.as_str()),
    ];
    forwarded_after_an_unanswered_claim(&relay, &upstream, &proxy, "/orders/pay", &headers).await;
    retries_never_run_again(
        &redis,
        &upstream,
        &proxy,
        "/orders/pay",
        &headers,
        &["D", "T"],
    )
    .await;
    assert_eq!(
        upstream.executed(),
        2,
        "the warm-up and the forwarded request"
    );
}

/// A request forwarded unprotected after its claim's reply came late, whose forward never
/// went out (the upstream refused the connection: `502`), leaves its key free once the
/// store answers: nothing ran under the claim that landed, so a retry runs, once, rather
/// than meeting the in-flight `409` and then the outcome-unknown one for the whole ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_kept_for_a_forward_that_never_went_out_is_released() {
    let (refusing, _socket) = common::refusing_addr();
    an_unsent_forward_releases_its_claim(&route(&FAILING_OPEN.join("\n    ")), refusing).await;
}

/// The same over HTTP/2 with an upstream that takes the connection and refuses every
/// stream (GOAWAY below it, the one resend refused too): the client's `502` says nothing
/// went out, and the claim is released as for a refused connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_kept_for_a_forward_whose_every_stream_was_refused_is_released() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let refusing = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(common::go_away_below_every_stream(stream, || {}));
        }
    });
    let routes = format!(
        "connections: {{ upstream_protocol: http2 }}\n{}",
        route(&FAILING_OPEN.join("\n    "))
    );
    an_unsent_forward_releases_its_claim(&routes, refusing).await;
}

/// Forwards a request on `routes` while Redis's replies are held past the store timeout,
/// to `unsent`, an upstream that takes nothing (`502`); then checks the claim that landed
/// was released and a retry against the real upstream runs once.
async fn an_unsent_forward_releases_its_claim(routes: &str, unsent: std::net::SocketAddr) {
    let (redis, relay, upstream, proxy) = timing_out_behind_held_replies(routes).await;
    warm_up(&proxy).await;
    // The same config, its upstream taking nothing, then the real one again.
    let store = format!(
        "store:\n  redis: {{ url: \"redis://{}\", timeout: 200ms }}\n",
        relay.addr
    );
    common::reload(&proxy, unsent, &format!("{store}{routes}"));
    let key = [("idempotency-key", "unsent")];
    let before = relay.received();
    relay.hold.send_replace(true);
    let refused = post(proxy.addr, "/orders", &key, "{}").await;
    assert_eq!(refused.status, StatusCode::BAD_GATEWAY, "nothing was sent");
    until(|| relay.received() > before, "Redis to run the claim").await;
    relay.hold.send_replace(false);
    // Released in the background once Redis answers: the warm-up's answer is all that is
    // left (kept, the claim would stay in flight, then be held as an unknown outcome).
    until(
        || record_kinds(&redis) == ["D"],
        "the unsent claim to be released",
    )
    .await;
    common::reload(&proxy, upstream.addr, &format!("{store}{routes}"));
    let retry = post(proxy.addr, "/orders", &key, "{}").await;
    assert_eq!(
        retry.status,
        StatusCode::CREATED,
        "the retry of a request never sent was refused: {}",
        String::from_utf8_lossy(&retry.body)
    );
    assert_eq!(upstream.executed_for("unsent"), 1);
}
