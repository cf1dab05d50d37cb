//! Connection-bound authentication (NTLM, Negotiate: IIS's Windows authentication, common
//! in front of the legacy apps idemgate protects) authenticates the TCP connection, not
//! the request: after the handshake the upstream runs every later request on that
//! connection as the user who authenticated it, whoever sent it. A pooled connection that
//! carried such a credential must never carry another caller's request.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::common::{raw_exchange_from, raw_post, start_proxy};
use crate::{read_request_headers, KEEP_IDLE, ROUTES};

/// A raw upstream that authenticates connections as IIS does: a request with
/// `Authorization: NTLM <user>` (or `Negotiate <user>`) makes its connection `<user>`'s,
/// and every request on an authenticated connection runs as that user (answer `200
/// user=<name>`); on any other connection a request without a credential gets `401` with
/// the challenge. Returns the address and the users requests ran as, in order.
async fn connection_auth_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ran_as: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = Arc::clone(&ran_as);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let record = Arc::clone(&record);
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                let mut user: Option<String> = None;
                while let Some((_, headers)) = read_request_headers(&mut read).await {
                    for (name, value) in &headers {
                        if name != "authorization" {
                            continue;
                        }
                        let (scheme, who) = value.split_once(' ').unwrap();
                        if ["ntlm", "negotiate"].contains(&&*scheme.to_lowercase()) {
                            user = Some(who.to_owned());
                        }
                    }
                    let answer = match &user {
                        Some(name) => {
                            record.lock().unwrap().push(name.clone());
                            let text = format!("user={name}");
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{text}",
                                text.len()
                            )
                        }
                        None => "HTTP/1.1 401 Unauthorized\r\nwww-authenticate: NTLM\r\ncontent-length: 9\r\n\r\nanonymous".to_owned(),
                    };
                    write.write_all(answer.as_bytes()).await.unwrap();
                }
            });
        }
    });
    (addr, ran_as)
}

/// Alice authenticates with NTLM through the proxy; then Bob, another caller without a
/// credential, sends a plain request and a protected one. Were the connection Alice's
/// request authenticated pooled, both of Bob's would run upstream as Alice and Bob would
/// read Alice's answers.
#[tokio::test]
async fn a_connection_the_upstream_authenticated_never_carries_another_callers_request() {
    let (upstream, ran_as) = connection_auth_upstream().await;
    let proxy = start_proxy(upstream, &format!("{KEEP_IDLE}{ROUTES}")).await;
    for scheme in ["NTLM", "Negotiate"] {
        let alice = raw_exchange_from(
            "127.0.0.1",
            proxy.addr,
            format!("GET /plain/me HTTP/1.1\r\nhost: app\r\nauthorization: {scheme} alice\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(alice.starts_with("HTTP/1.1 200"), "{alice}");
        assert!(alice.ends_with("user=alice"), "{alice}");

        let bob_plain = raw_exchange_from(
            "127.0.0.2",
            proxy.addr,
            b"GET /plain/me HTTP/1.1\r\nhost: app\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(
            bob_plain.starts_with("HTTP/1.1 401"),
            "{scheme}: Bob's request ran on Alice's connection: {bob_plain}"
        );
        let key = format!("bob-{scheme}");
        let bob_protected = raw_exchange_from(
            "127.0.0.2",
            proxy.addr,
            &raw_post("/orders/1", &[&format!("idempotency-key: {key}")], "{}"),
        )
        .await;
        assert!(
            bob_protected.starts_with("HTTP/1.1 401"),
            "{scheme}: Bob's protected request ran on Alice's connection: {bob_protected}"
        );
    }
    assert_eq!(*ran_as.lock().unwrap(), ["alice", "alice"]);
}
