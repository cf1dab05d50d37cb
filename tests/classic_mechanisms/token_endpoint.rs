//! The token endpoint beyond one route's tokens: served for `defaults.key`, and limited per
//! client address, whoever the callers at it claim to be.

use super::*;

/// `defaults.key` may key on tokens too (every POST and PATCH matching no route): the
/// token endpoint is served for it, and an attempt that never reached the upstream hands
/// its token back for `tokens.ttl`, as on a route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_default_key_gets_the_endpoint_and_its_tokens_handed_back() {
    // Connect refused, nothing sent.
    let (dead_addr, _held) = common::refusing_addr();
    let proxy = start_proxy(
        dead_addr,
        "tokens: { ttl: 5m }\ndefaults:\n  key: { token: {} }\n",
    )
    .await;
    let token = token_for(&proxy, "Bearer alice").await;
    let headers = [
        ("authorization", "Bearer alice"),
        ("idempotency-token", token.as_str()),
    ];
    let unsent = post(proxy.addr, "/orders/x", &headers, "{}").await;
    assert_eq!(
        unsent.json()["type"],
        "urn:idemgate:problem:upstream-unreachable"
    );
    // The token's record as the store holds it: kept for `tokens.ttl`, to be used again,
    // not for the seconds a failure lingers for its waiters.
    let mut map = http::HeaderMap::new();
    map.insert("authorization", "Bearer alice".parse().unwrap());
    map.insert("idempotency-token", token.parse().unwrap());
    let request = idemgate::explain::Request {
        method: http::Method::POST,
        uri: "/orders/x".parse().unwrap(),
        headers: map,
        body: b"{}".to_vec(),
        client_ip: Some([127, 0, 0, 1].into()),
        client_cert: None,
    };
    let (_, key) = idemgate::explain::explain_key(&proxy.proxy.config(), &request).unwrap();
    let info = proxy
        .store
        .inspect(key.unwrap())
        .await
        .unwrap()
        .expect("the token's record");
    let lives = info.expires.duration_since(info.created).unwrap();
    assert!(
        lives >= Duration::from_secs(299),
        "the token is handed back for {lives:?}, not tokens.ttl (5m)"
    );
}

/// Behind a trusted proxy, token requests are limited per client address as its
/// `X-Forwarded-For` names it (`tokens.rate_per_address`), whoever each claims to be; an
/// IPv6 client by its /64, since one host holds a whole /64 to pick addresses from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_requests_are_limited_per_client_address_and_ipv6_per_64() {
    let upstream = start_upstream().await;
    let config = "trusted_proxies: [127.0.0.0/8]\ntokens: { rate: 5, rate_per_address: 2 }\n";
    let proxy = start_proxy(upstream.addr, config).await;
    let ask = |client: &'static str, caller: &'static str| {
        let addr = proxy.addr;
        async move {
            let who = ("authorization", caller);
            let answer = post(
                addr,
                "/.idemgate/token",
                &[("x-forwarded-for", client), who],
                "",
            )
            .await;
            answer
        }
    };
    assert_eq!(
        ask("2001:db8:1:2::1", "Bearer a").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        ask("2001:db8:1:2:ffff::9", "Bearer b").await.status,
        StatusCode::CREATED
    );
    let third = ask("2001:db8:1:2::3", "Bearer c").await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS, "one /64");
    assert_eq!(third.headers["retry-after"], "60");
    assert_eq!(third.json()["type"], "urn:idemgate:problem:rate-limited");
    assert_eq!(
        ask("2001:db8:1:3::1", "Bearer d").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        ask("198.51.100.7", "Bearer e").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        ask("198.51.100.7", "Bearer f").await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        ask("198.51.100.7", "Bearer g").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        ask("198.51.100.8", "Bearer h").await.status,
        StatusCode::CREATED
    );
}

/// Behind a balancer nobody listed in `trusted_proxies`, every client shares its address's
/// `tokens.rate_per_address`: the first token request it relays (it sends
/// `X-Forwarded-For` or `Forwarded`) logs one warning naming it, and no later one does. A
/// request that names no one relayed logs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_request_relayed_by_an_unlisted_peer_warns_once() {
    let upstream = start_upstream().await;
    let proxy = common::ProxyProcess::start_logging(upstream.addr, ROUTES, "warn");
    let warning = "share one address's token limit";
    let ask = |relayed: &'static [(&'static str, &'static str)]| {
        let addr = proxy.addr;
        async move {
            let mut headers = vec![("authorization", "Bearer alice")];
            headers.extend_from_slice(relayed);
            post(addr, "/.idemgate/token", &headers, "").await.status
        }
    };
    // Logged before its answer is written (to stderr, unbuffered): no wait is needed.
    assert_eq!(ask(&[]).await, StatusCode::CREATED);
    assert!(!proxy.log().contains(warning), "{}", proxy.log());
    assert_eq!(
        ask(&[("forwarded", "for=198.51.100.7")]).await,
        StatusCode::CREATED
    );
    assert_eq!(
        ask(&[("x-forwarded-for", "198.51.100.8")]).await,
        StatusCode::CREATED
    );
    let log = proxy.log();
    assert_eq!(log.matches(warning).count(), 1, "{log}");
    let line = log.lines().find(|l| l.contains(warning)).unwrap();
    assert!(line.contains("127.0.0.1"), "names the peer: {line}");
    assert!(line.contains("trusted_proxies"), "{line}");
}
