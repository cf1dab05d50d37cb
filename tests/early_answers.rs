//! An answer sent before the request was read whole reaches a client that writes its whole
//! request before it reads (Python's http.client, Java's HttpURLConnection, many SDKs):
//! the proxy closes lingering, reading and dropping the rest, instead of resetting the
//! connection under the answer. A client that never stops sending is still cut off.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{start_proxy, start_upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ROUTES: &str = r#"
defaults: { max_body: 1MiB }
routes:
  - name: orders
    match: { methods: [POST], path: /orders }
    key: { header: Idempotency-Key, required: true }
  - name: notes
    match: { methods: [POST], path: /notes }
    key: { fingerprint: { body: true } }
  - name: large
    match: { methods: [POST], path: /large }
    key: { header: Idempotency-Key, required: true }
    max_body: 4MiB
"#;

/// Writes `head` and a body of `body_len` bytes in full, only then reads, until the proxy
/// closes (the requests say `Connection: close`): what such a client sees. A write error (a reset) is what it would see instead
/// of the answer. The 60 s bound is a hang guard only.
async fn write_all_then_read(addr: SocketAddr, head: &str, body_len: usize) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = vec![b'x'; body_len];
    let written = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&body).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(60), written)
        .await
        .expect("hang guard")
        .unwrap_or_else(|e| panic!("the client lost its answer: {e}"));
    String::from_utf8_lossy(&answer).into_owned()
}

fn post(path: &str, fields: &str, body_len: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n{fields}content-length: {body_len}\r\n\r\n"
    )
}

const TWO_MIB: usize = 2 << 20;
const REPETITIONS: usize = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2_mib_body_over_max_body_gets_its_413_every_time() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    for (path, fields) in [("/orders", "idempotency-key: big\r\n"), ("/notes", "")] {
        for i in 0..REPETITIONS {
            let answer =
                write_all_then_read(proxy.addr, &post(path, fields, TWO_MIB), TWO_MIB).await;
            assert!(answer.starts_with("HTTP/1.1 413"), "{path} #{i}: {answer}");
            assert!(
                answer.contains("urn:idemgate:problem:payload-too-large"),
                "{path} #{i}: {answer}"
            );
        }
    }
    assert_eq!(upstream.executed(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400_with_a_2_mib_body_arrives_every_time() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream.addr, ROUTES).await;
    for i in 0..REPETITIONS {
        // A required key missing, on a route whose max_body takes the body.
        let missing = write_all_then_read(proxy.addr, &post("/large", "", TWO_MIB), TWO_MIB).await;
        assert!(missing.starts_with("HTTP/1.1 400"), "#{i}: {missing}");
        assert!(missing.contains("urn:idemgate:problem:key-invalid"), "#{i}");
        // Refused before the body is looked at: two Host fields.
        let hosts = write_all_then_read(
            proxy.addr,
            &post("/large", "host: y\r\nidempotency-key: k\r\n", TWO_MIB),
            TWO_MIB,
        )
        .await;
        assert!(hosts.starts_with("HTTP/1.1 400"), "#{i}: {hosts}");
        assert!(hosts.contains("urn:idemgate:problem:bad-request"), "#{i}");
    }
    assert_eq!(upstream.executed(), 0);
}

/// Lingering is bounded: a client that announces a huge body and keeps sending after its
/// 413 is cut off once `lingering_time` has passed, however much it still sends, and the
/// cut is counted. (The bound is 1 s; the 60 s limit is a hang guard only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_stops_sending_is_cut_off_after_the_lingering_bounds() {
    let upstream = start_upstream().await;
    let routes = format!(
        "connections: {{ lingering_time: 1s, lingering_timeout: 1s, lingering_bytes: 1000GiB }}\n{ROUTES}"
    );
    let proxy = start_proxy(upstream.addr, &routes).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = post("/orders", "idempotency-key: endless\r\n", 1 << 40);
    stream.write_all(head.as_bytes()).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let writer = tokio::spawn(async move {
        let chunk = vec![b'x'; 64 * 1024];
        // Until the proxy closes the connection under it.
        while write.write_all(&chunk).await.is_ok() {}
    });
    // The answer, then the end of the proxy's side (it half-closed and lingers).
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), read.read_to_end(&mut answer))
        .await
        .expect("hang guard")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // The proxy reads on for its lingering time, then closes under the writer.
    tokio::time::timeout(Duration::from_secs(60), writer)
        .await
        .expect("the proxy kept the connection past its lingering bounds")
        .unwrap();
    let metrics = common::metrics_text(proxy.admin).await;
    assert!(
        metrics.contains("idemgate_lingering_cut_total 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("idemgate_lingering_connections 0\n"),
        "{metrics}"
    );
}
