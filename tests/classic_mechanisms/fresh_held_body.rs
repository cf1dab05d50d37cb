//! A timestamp header whose body comes late: the head is checked before `100 Continue`,
//! and the stamp again just before the claim, so a body held back until the original's
//! key has expired finds the stamp stale, not the key free.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

mod memory {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_body_is_refused_once_its_stamp_is_stale() {
        super::a_held_body_is_refused_once_its_stamp_is_stale(false).await;
    }
}

mod redis {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_body_is_refused_once_its_stamp_is_stale() {
        super::a_held_body_is_refused_once_its_stamp_is_stale(true).await;
    }
}

/// A captured request re-sent with `Expect: 100-continue` while its stamp is just inside
/// the bound (under 2s: the key is kept 3s, 1s of skew) gets `100 Continue`; its body,
/// held until the original's key has expired (each gap well under the 60 s body timeout),
/// is refused `stale-request` and never runs.
async fn a_held_body_is_refused_once_its_stamp_is_stale(redis: bool) {
    let (upstream, proxy, _server) = setup(redis, "").await;
    let stamp = unix_now_ms().to_string();
    let fields = [
        ("idempotency-key", "held-1"),
        ("x-timestamp", stamp.as_str()),
    ];
    let path = "/orders/fresh-short-header";
    let first = post(proxy.addr, path, &fields, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    // Time passing is the subject: the stamp is about 1.2s old when the head is checked.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         idempotency-key: held-1\r\nx-timestamp: {stamp}\r\nexpect: 100-continue\r\n\
         content-length: 2\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut interim = Vec::new();
    let mut byte = [0u8; 1];
    // A hang guard only: the head passes, so `100 Continue` comes at once.
    tokio::time::timeout(Duration::from_secs(10), async {
        while !interim.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).await.unwrap();
            interim.push(byte[0]);
        }
    })
    .await
    .expect("hang guard: no answer to the head");
    let interim = String::from_utf8_lossy(&interim).into_owned();
    assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");
    // The original's answer is kept 3s from its completion: the body comes after that.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    stream.write_all(b"{}").await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("hang guard: no answer to the body")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("urn:idemgate:problem:stale-request"),
        "{answer}"
    );
    assert_eq!(upstream.executed(), 1, "the held request ran again");
}
