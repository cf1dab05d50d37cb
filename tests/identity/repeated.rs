//! A credential sent more than once, or beside one that is shared: a cookie named twice
//! (one planted for a narrower path by a sibling subdomain comes first, RFC 6265 §5.4)
//! and cookies behind one `Authorization` every user sends (a staging or intranet gate) or
//! beside a listed cookie every visitor sends (an A/B test's `ab_session`).
//! An application may read either copy of a cookie, and may tell its users apart by a
//! cookie of any name: keyed by less than all of them, two users share an answer.

use super::common::{post, raw_exchange_from, raw_post, start_proxy, start_upstream};
use super::http2::h2_post;
use super::{json_body, replayed};

/// `scope: [cookie: sid]`, and a victim whose browser sends `sid` twice: a copy an attacker
/// planted for the path (so sent first) and the victim's own, split over two HTTP/2
/// `cookie` fields. Keyed by the first copy alone, the attacker's request with only the
/// planted copy got the victim's answer; keyed by every copy, it runs on its own, and the
/// victim's retry over HTTP/1.1 with one `Cookie` field still replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_cookie_sent_twice_is_keyed_by_both_copies() {
    let upstream = start_upstream().await;
    let routes = r#"
routes:
  - name: transfers
    match: { path: /orders/transfers }
    key: { fingerprint: { body: true }, scope: [cookie: sid] }
"#;
    let proxy = start_proxy(upstream.addr, routes).await;
    let body = r#"{"to":"landlord","amount":900}"#;

    let victim = h2_post(
        proxy.addr,
        "/orders/transfers",
        &["sid=planted", "sid=victim"],
        body,
    )
    .await;
    assert!(!victim.replayed());
    let victim_n = victim.json()["n"].clone();
    assert_eq!(upstream.executed(), 1);

    let raw = raw_post("/orders/transfers", &["cookie: sid=planted"], body);
    let attacker = raw_exchange_from("127.0.0.2", proxy.addr, &raw).await;
    assert!(
        !replayed(&attacker),
        "the planted copy alone got the victim's answer: {attacker}"
    );
    assert_eq!(upstream.executed(), 2);

    let raw = raw_post(
        "/orders/transfers",
        &["cookie: sid=planted; sid=victim"],
        body,
    );
    let retry = raw_exchange_from("127.0.0.1", proxy.addr, &raw).await;
    assert!(
        replayed(&retry),
        "the victim's own retry ran again: {retry}"
    );
    assert_eq!(json_body(&retry)["n"], victim_n);
    assert_eq!(upstream.executed(), 2);
}

/// One basic-auth password every user of a staging site sends, and an app that keeps its
/// users apart by a cookie of a name `session_cookies` does not list (NextAuth's
/// `next-auth.session-token`): keyed by the shared `Authorization` alone, bob got alice's
/// answer. The cookies go in beside it, as they do beside the address of a caller without
/// an `Authorization`; alice's retry still replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_authorization_does_not_merge_users_of_an_unlisted_session_cookie() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let gate = ("authorization", "Basic c3RhZmY6c3RhZmYtcGFzc3dvcmQ=");
    let as_user = |token: &'static str| [gate, ("cookie", token)];
    let alice_cookie = "next-auth.session-token=alice";
    let alice = post(proxy.addr, "/orders/pay", &as_user(alice_cookie), "{}").await;
    let bob = post(
        proxy.addr,
        "/orders/pay",
        &as_user("next-auth.session-token=bob"),
        "{}",
    )
    .await;
    assert!(!alice.replayed());
    assert!(!bob.replayed(), "bob got alice's answer");
    assert_eq!(upstream.executed(), 2);
    let retry = post(proxy.addr, "/orders/pay", &as_user(alice_cookie), "{}").await;
    assert!(retry.replayed(), "alice's own retry ran again");
    assert_eq!(retry.body, alice.body);
    assert_eq!(upstream.executed(), 2);
}

/// A listed session cookie every visitor sends alike (a copy a sibling subdomain planted,
/// a listed name the app does not use) beside the app's own session under a name not
/// listed: keyed by the listed cookie alone, bob, from the same address, got alice's
/// answer. Beside a listed session a cookie named like a credential goes in too, the
/// address and the analytics cookies do not: alice's retry from another address, with
/// `_ga` rewritten, replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_listed_cookie_does_not_merge_users_of_an_unlisted_session_cookie() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let body = r#"{"to":"landlord","amount":900}"#;
    let as_user = |cookie: &str| raw_post("/orders/pay", &[&format!("cookie: {cookie}")], body);
    let alice = as_user("next-auth.session-token=alice; sessionid=x; _ga=GA1.1.1");
    let first = raw_exchange_from("127.0.0.2", proxy.addr, &alice).await;
    assert!(!replayed(&first));
    let bob = as_user("next-auth.session-token=bob; sessionid=x; _ga=GA1.1.1");
    let bob = raw_exchange_from("127.0.0.2", proxy.addr, &bob).await;
    assert!(!replayed(&bob), "bob got alice's answer: {bob}");
    assert_eq!(upstream.executed(), 2);
    let retry = as_user("next-auth.session-token=alice; sessionid=x; _ga=GA1.1.2");
    let retry = raw_exchange_from("127.0.0.3", proxy.addr, &retry).await;
    assert!(replayed(&retry), "alice's own retry ran again: {retry}");
    assert_eq!(json_body(&retry)["n"], json_body(&first)["n"]);
    assert_eq!(upstream.executed(), 2);
}

/// Two users of an app whose session has a name no rule knows (CakePHP's `CAKEPHP`), both
/// sending a cookie only the pattern `*_session` takes (`ab_session=x`, an A/B test's),
/// from two addresses: keyed by `ab_session` alone, bob got alice's answer. Both execute;
/// alice's retry replays. A name the operator lists in `session_cookies` is the session
/// alone, so its retry from another address still replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_only_a_pattern_names_does_not_merge_two_callers() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, "").await;
    let body = r#"{"to":"landlord","amount":900}"#;
    let as_user = |cookie: &str| raw_post("/orders/pay", &[&format!("cookie: {cookie}")], body);
    let alice = as_user("ab_session=x; CAKEPHP=alice");
    let first = raw_exchange_from("127.0.0.2", proxy.addr, &alice).await;
    assert!(!replayed(&first));
    let bob = as_user("ab_session=x; CAKEPHP=bob");
    let bob = raw_exchange_from("127.0.0.3", proxy.addr, &bob).await;
    assert!(!replayed(&bob), "bob got alice's answer: {bob}");
    assert_eq!(upstream.executed(), 2);
    let retry = raw_exchange_from("127.0.0.2", proxy.addr, &alice).await;
    assert!(replayed(&retry), "alice's own retry ran again: {retry}");
    assert_eq!(json_body(&retry)["n"], json_body(&first)["n"]);
    assert_eq!(upstream.executed(), 2);

    let proxy = start_proxy(upstream.addr, "session_cookies: [_myapp_session]\n").await;
    let rails = as_user("_myapp_session=s1; ab_session=x");
    let first = raw_exchange_from("127.0.0.2", proxy.addr, &rails).await;
    assert!(!replayed(&first));
    let elsewhere = raw_exchange_from("127.0.0.3", proxy.addr, &rails).await;
    assert!(
        replayed(&elsewhere),
        "a listed session is one caller: {elsewhere}"
    );
    assert_eq!(json_body(&elsewhere)["n"], json_body(&first)["n"]);
    assert_eq!(upstream.executed(), 3);
}
