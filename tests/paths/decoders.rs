//! Spellings only some decoders read: overlong UTF-8 forms (old Java and IIS decoders),
//! escapes escaped twice (an upstream that decodes twice). A dot segment spelled so is a
//! 400; a slash or letter spelled so is routed both ways; legacy multibyte characters and
//! Jenkins' twice-escaped slashes whose readings agree pass as sent.

use http::StatusCode;

use crate::common::{post, raw_exchange, start_proxy, start_recorder, ProxyHandle, Recorder};
use crate::{not_normalizable, OVERRIDDEN, REQUIRED};

/// A dot segment spelled so that only some decoders read it: overlong UTF-8 dots
/// (`%C0%AE`, which old Java and IIS decoders took for `.`), dots escaped twice (`%252E`,
/// for an upstream that decodes twice), or dots cut out of a name by a slash only those
/// read (`x%C0%AF..%C0%AF`). Read so, `/api/x/%C0%AE%C0%AE/orders` is `/api/orders`,
/// which its route must not miss: a 400 before anything runs. The same bytes in a name
/// are legacy characters (EUC-KR `유` is `%C0%AF`) and pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dot_segment_only_some_decoders_read_is_a_400() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, REQUIRED).await;
    for path in [
        "/api/x/%C0%AE%C0%AE/orders",
        "/api/x/%c0%ae%c0%ae/orders",
        "/api/x/%E0%80%AE%E0%80%AE/orders",
        "/api/x/%F0%80%80%AE%F0%80%80%AE/orders",
        "/api/x%C0%AF..%C0%AForders",
        "/api/x%C1%9C..%C1%9Corders",
        "/api/x%252F..%252Forders",
        "/api/x/%C0%AE./orders",
        "/api/x/%252E%252E/orders",
        "/api/x/%252e%252e/orders",
        "/api/x/.%252E/orders",
        "/api/x/%252E%252E;x/orders",
    ] {
        let answer = post(proxy.addr, path, &[], "{}").await;
        not_normalizable(&answer, path);
    }
    // The raw bytes are no UTF-8: hyper refuses such a target itself (a bare 400).
    let raw = raw_exchange(
        proxy.addr,
        b"POST /api/x/\xC0\xAE\xC0\xAE/orders HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
    assert_eq!(upstream.executed(), 0, "an overlong or double escape ran");
    // Escapes that are one character however they are decoded still pass, and so do a
    // legacy multibyte character (EUC-KR, GBK) and a slash or dot escaped twice in a name.
    for path in [
        "/api/caf%C3%A9",
        "/api/caf%E9",
        "/api/100%25",
        "/api/%25C3",
        "/api/%C0%BA",
        "/api/%C0%AF%C0%AF",
        "/api/a%C1%9Cb",
        "/api/%C1%AA%C1%AC",
        "/api/%C0%A5%B0%B3",
        "/api/feature%252Fbar",
        "/api/a%255Cb",
        "/api/v1%252E2",
    ] {
        let answer = post(proxy.addr, path, &[], "{}").await;
        assert_eq!(answer.status, StatusCode::CREATED, "{path}");
    }
}

const LEGACY: &str = r#"
routes:
  - name: board
    match: { methods: [POST], path: "/board/{post}" }
    key: { header: Idempotency-Key, required: true }
  - name: build
    match: { methods: [POST], path: "/job/*" }
    key: { header: Idempotency-Key, required: true }
  - name: write
    match: { methods: [POST], path: "/forum/{name}/write" }
    key: { header: Idempotency-Key, required: true }
  - name: trigger
    match: { methods: [POST], path: "/ci/{name}/build" }
    key: { header: Idempotency-Key, required: true }
"#;

/// Posts each of `paths` twice with a key of its own: it runs once, as sent, and its
/// repeat is replayed.
async fn each_runs_once_and_replays(proxy: &ProxyHandle, upstream: &Recorder, paths: &[&str]) {
    let before = upstream.executed();
    for (n, path) in paths.iter().enumerate() {
        let key = format!("k{n}");
        let first = post(proxy.addr, path, &[("idempotency-key", &key)], "{}").await;
        assert_eq!(first.status, StatusCode::CREATED, "{path}");
        let again = post(proxy.addr, path, &[("idempotency-key", &key)], "{}").await;
        assert!(again.replayed(), "{path}: {:?}", again.status);
        assert_eq!(upstream.executed(), before + n + 1, "{path}");
        assert_eq!(upstream.seen()[before + n].target, *path);
    }
}

/// A path a legacy app really has, an EUC-KR word (`은`, `%C0%BA`; `자유가`, whose `유` is
/// `%C0%AF`) or a Jenkins branch whose slash is escaped twice to stay in its segment
/// (`feature%252Fbar`), is protected like any other: it reaches the upstream once, as
/// sent, and its retry gets the stored answer. Also under a route with a segment after
/// the name, where the reading that splits the name names no route: the route's own rule
/// holds, and no other route's is stepped around.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_multibyte_word_or_a_twice_escaped_slash_runs_once_and_replays() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, LEGACY).await;
    let paths = [
        "/board/%C0%BA",
        "/job/x/job/feature%252Fbar/build",
        "/forum/%C0%DA%C0%AF%B0%A1/write",
        "/ci/feature%252Fbar/build",
    ];
    each_runs_once_and_replays(&proxy, &upstream, &paths).await;
}

/// A slash only an upstream that decodes twice (`%252F`, `%255C`) or an old lenient UTF-8
/// decoder (`%C0%AF`, `%C1%9C`) reads makes `/api%252Forders` the path `/api/orders` to
/// it, and so does a letter escaped twice or overlong (`/api/%256Frders`): such a path is
/// routed as read both ways, and where the two readings are other
/// routes (or other protection) it is a 400 before anything runs, never the fallback's
/// key (or, under `defaults.key: off`, no key) while the upstream runs the route's path.
/// A POST that names another method is routed by it both ways too. Where both readings
/// are one route, a Jenkins branch (`feature%252Fbar`) or an EUC-KR word (`%C0%AF` is
/// `유`) runs once and replays, sent as it came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_character_only_some_decoders_read_cannot_move_a_request_off_its_route() {
    for config in [REQUIRED, OVERRIDDEN] {
        let upstream = start_recorder().await;
        let proxy = start_proxy(upstream.addr, config).await;
        for path in [
            "/api%252Forders",
            "/api%252forders",
            "/api%C0%AForders",
            "/api%c0%afORDERS",
            "/api%E0%80%AForders",
            "/api%C1%9Corders",
            "/api%255Corders",
            "/api%25C0%25AForders",
            "/api%252F%252Forders/",
            "/x/../api%252Forders",
            "/ap%2569%252Forders",
            "/api/%256Frders",
            "/api/%C1%AFrders",
            "/api/orders%253Bx",
            "/api/orders%C0%BBx",
        ] {
            let answer = post(proxy.addr, path, &[], r#"{"amount":5}"#).await;
            not_normalizable(&answer, path);
            let detail = answer.json()["detail"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(detail.contains("another route's"), "{path}: {detail}");
        }
        assert_eq!(
            upstream.executed(),
            0,
            "a hidden slash stepped around a route"
        );
    }
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, OVERRIDDEN).await;
    let delete = [("x-http-method-override", "DELETE")];
    let answer = post(proxy.addr, "/api%252Fusers/7", &delete, "{}").await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer.json()["type"],
        "urn:idemgate:problem:path-not-normalizable"
    );
    assert_eq!(upstream.executed(), 0, "an overridden POST stepped around");
    // Both readings unprotected (the fallback is off here): it passes, as sent.
    let answer = post(proxy.addr, "/api%252Fusers/7", &[], "{}").await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(upstream.seen()[0].target, "/api%252Fusers/7");

    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, LEGACY).await;
    let paths = ["/job/x/job/feature%252Fbar/build", "/board/%C0%AF%C0%BA"];
    each_runs_once_and_replays(&proxy, &upstream, &paths).await;
}

/// A `;` only a second decode (`%253B`) or a lenient UTF-8 decoder (`%C0%BB`) reads, after
/// plain dots, is `..;x` to such a reader and `..` to a Java server that then drops the
/// parameter; an overlong dot escaped twice (`%25C0%25AE`) is a dot to an upstream that
/// does both. Each is a 400 before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dot_segment_only_a_second_or_lenient_decode_gives_params_is_a_400() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, REQUIRED).await;
    for path in [
        "/api/x/..%253Bx/orders",
        "/api/x/..%C0%BBx/orders",
        "/api/x/.%253b/orders",
        "/api/x/%25C0%25AE%25C0%25AE/orders",
    ] {
        let answer = post(proxy.addr, path, &[("idempotency-key", "k")], "{}").await;
        not_normalizable(&answer, path);
    }
    assert_eq!(upstream.executed(), 0);
}

const UNPROTECTED_FILES: &str = r#"
routes:
  - name: files
    match: { methods: [POST], path: "/files/{name}" }
    idempotency: off
  - name: users
    match: { methods: [PUT], path: "/api/users/{id}" }
    key: { header: Idempotency-Key, required: true }
"#;

/// The fallback is the operator's rule too: a path that an unprotected route takes as one
/// name (`/files/7%252Fpublish`) but a second decode reads as a path the fallback's key
/// protects (`/files/7/publish`) is a 400, not run unprotected, so its double submit
/// cannot run twice there. A lenient reading no rule would enforce anything on (a PUT
/// that no route lists) refuses nothing: the strict reading's required key holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lenient_reading_the_fallback_protects_is_not_run_under_an_unprotected_route() {
    let upstream = start_recorder().await;
    let proxy = start_proxy(upstream.addr, UNPROTECTED_FILES).await;
    let answer = post(proxy.addr, "/files/7%252Fpublish", &[], "{}").await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let detail = answer.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(detail.contains("another route's"), "{detail}");
    assert_eq!(upstream.executed(), 0, "it ran unprotected");
    // One name both ways: unprotected, as its route says.
    let answer = post(proxy.addr, "/files/7", &[], "{}").await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let put = crate::common::send(
        proxy.addr,
        http::Method::PUT,
        "/api/users/feature%252Fbar",
        &[("idempotency-key", "u1")],
        "{}".to_owned(),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED);
    assert_eq!(upstream.executed(), 2);
}
