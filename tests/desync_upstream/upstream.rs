//! The raw upstream: an HTTP/1.1 peer on 127.0.0.1:0 that answers a vector request with
//! the vector's script, byte for byte, and any other request with a clean keep-alive answer
//! naming it, and records every request and every connection the proxy closed.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::corpus::Vector;
use crate::HANG_GUARD;

/// One thing the upstream does while answering a vector request.
#[derive(Clone)]
pub(crate) enum Step {
    /// Writes these bytes in one write.
    Send(Vec<u8>),
    /// Writes `103 Early Hints` heads, without end, until the proxy closes the connection.
    Storm,
    /// Waits until the test calls [`Upstream::release`].
    AwaitRelease,
    /// Closes the connection.
    Close,
}

pub(crate) fn send(bytes: impl AsRef<[u8]>) -> Step {
    Step::Send(bytes.as_ref().to_vec())
}

/// One request the upstream read.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// Which accepted connection it came on (1, 2, …).
    pub(crate) conn: usize,
    /// Its `x-req`: the name the normal answer echoes.
    id: String,
    /// Its `Idempotency-Key`.
    key: Option<String>,
    /// How many body bytes it carried.
    pub(crate) body_len: usize,
}

#[derive(Default)]
struct Record {
    connections: usize,
    requests: Vec<Seen>,
    /// Connections the proxy closed (the upstream read EOF or failed to write).
    closed_by_proxy: HashSet<usize>,
    /// The bodies of early-answered requests, read after their answer: connection, bytes.
    early_bodies: Vec<(usize, usize)>,
}

#[derive(Default)]
struct Shared {
    record: Mutex<Record>,
    changed: Notify,
    release: Notify,
}

/// A raw HTTP/1.1 upstream on 127.0.0.1:0. Each connection serves requests in turn: a
/// request with `x-vector` gets the vector's script, any other a well-formed keep-alive
/// answer naming the request (`answer to <x-req>`).
pub(crate) struct Upstream {
    pub(crate) addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Upstream {
    pub(crate) async fn start(vector: &'static Vector) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared: Arc<Shared> = Arc::default();
        let serving = Arc::clone(&shared);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let conn = {
                    let mut record = serving.record.lock().unwrap();
                    record.connections += 1;
                    record.connections
                };
                tokio::spawn(serve_connection(stream, conn, vector, Arc::clone(&serving)));
            }
        });
        Self { addr, shared }
    }

    fn requests(&self) -> Vec<Seen> {
        self.shared.record.lock().unwrap().requests.clone()
    }

    pub(crate) fn connections(&self) -> usize {
        self.shared.record.lock().unwrap().connections
    }

    /// The request named `id` (exactly one).
    pub(crate) fn request(&self, id: &str) -> Seen {
        let all: Vec<Seen> = self.requests().into_iter().filter(|s| s.id == id).collect();
        assert_eq!(
            all.len(),
            1,
            "request {id} reached the upstream once: {all:?}"
        );
        all[0].clone()
    }

    /// How many requests carrying `key` reached the upstream.
    pub(crate) fn executed_for(&self, key: &str) -> usize {
        self.requests()
            .iter()
            .filter(|s| s.key.as_deref() == Some(key))
            .count()
    }

    pub(crate) fn release(&self) {
        self.shared.release.notify_one();
    }

    /// Waits until `done` holds of the record (hang guard: [`HANG_GUARD`]).
    async fn until(&self, what: &str, done: impl Fn(&Record) -> bool) {
        let shared = &self.shared;
        tokio::time::timeout(HANG_GUARD, async {
            loop {
                let changed = shared.changed.notified();
                if done(&shared.record.lock().unwrap()) {
                    return;
                }
                changed.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("hang guard: {what}"));
    }

    /// Waits until the body of the request answered early on `conn` was read whole, `len`
    /// bytes: the proxy has written all of it, so that connection is free for another.
    pub(crate) async fn early_body_read(&self, conn: usize, len: usize) {
        self.until(
            &format!("the early-answered body on connection {conn} never went out whole"),
            |r| r.early_bodies.contains(&(conn, len)),
        )
        .await;
    }

    /// Waits until the proxy closed connection `conn`.
    pub(crate) async fn closed_by_proxy(&self, conn: usize) {
        self.until(
            &format!("the proxy never closed upstream connection {conn}"),
            |r| r.closed_by_proxy.contains(&conn),
        )
        .await;
    }
}

fn note(shared: &Shared, change: impl FnOnce(&mut Record)) {
    change(&mut shared.record.lock().unwrap());
    shared.changed.notify_waiters();
}

/// A request's head as the upstream needs it.
struct Head {
    id: String,
    vector: bool,
    key: Option<String>,
    method: String,
    length: usize,
    chunked: bool,
}

/// Reads one request head; `None` at EOF (or a broken connection).
async fn read_head(read: &mut BufReader<OwnedReadHalf>) -> Option<Head> {
    let mut line = String::new();
    if read.read_line(&mut line).await.unwrap_or(0) == 0 {
        return None;
    }
    let method = line.split(' ').next().unwrap_or("").to_owned();
    let mut head = Head {
        id: String::new(),
        vector: false,
        key: None,
        method,
        length: 0,
        chunked: false,
    };
    loop {
        let mut field = String::new();
        if read.read_line(&mut field).await.unwrap_or(0) == 0 {
            return None;
        }
        let field = field.trim_end();
        if field.is_empty() {
            return Some(head);
        }
        let (name, value) = field.split_once(':').expect("a field line");
        let value = value.trim().to_owned();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => head.length = value.parse().unwrap(),
            "transfer-encoding" => head.chunked = value.eq_ignore_ascii_case("chunked"),
            "x-req" => head.id = value,
            "x-vector" => head.vector = true,
            "idempotency-key" => head.key = Some(value),
            _ => {}
        }
    }
}

/// Reads (and drops) a request body framed by `head`; its length, `None` at EOF.
async fn read_body(read: &mut BufReader<OwnedReadHalf>, head: &Head) -> Option<usize> {
    if !head.chunked {
        let mut left = head.length;
        let mut buf = vec![0u8; 64 * 1024];
        while left > 0 {
            let n = read.read(&mut buf[..left.min(64 * 1024)]).await.ok()?;
            if n == 0 {
                return None;
            }
            left -= n;
        }
        return Some(head.length);
    }
    let mut total = 0;
    loop {
        let mut size = String::new();
        if read.read_line(&mut size).await.ok()? == 0 {
            return None;
        }
        let size = usize::from_str_radix(size.trim().split(';').next().unwrap(), 16).ok()?;
        let mut chunk = vec![0u8; size + 2];
        read.read_exact(&mut chunk).await.ok()?;
        total += size;
        if size == 0 {
            return Some(total);
        }
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    conn: usize,
    vector: &'static Vector,
    shared: Arc<Shared>,
) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let closed = |shared: &Shared| {
        note(shared, |r| {
            r.closed_by_proxy.insert(conn);
        })
    };
    loop {
        let Some(head) = read_head(&mut read).await else {
            return closed(&shared);
        };
        // An early answer goes out before the body is read; every other after.
        let early = head.vector && vector.early;
        let body_len = if early {
            0
        } else {
            match read_body(&mut read, &head).await {
                Some(n) => n,
                None => return closed(&shared),
            }
        };
        note(&shared, |r| {
            r.requests.push(Seen {
                conn,
                id: head.id.clone(),
                key: head.key.clone(),
                body_len,
            })
        });
        let script = if head.vector {
            (vector.script)()
        } else {
            let status = if head.method == "POST" {
                "201 Created"
            } else {
                "200 OK"
            };
            let body = format!("answer to {}", head.id);
            vec![send(format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            ))]
        };
        for step in script {
            match step {
                Step::Send(bytes) => {
                    if write.write_all(&bytes).await.is_err() {
                        return closed(&shared);
                    }
                }
                Step::Storm => {
                    let hint =
                        b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n"
                            .repeat(64);
                    while write.write_all(&hint).await.is_ok() {}
                    return closed(&shared);
                }
                Step::AwaitRelease => shared.release.notified().await,
                Step::Close => {
                    let _ = write.shutdown().await;
                    return;
                }
            }
        }
        if early {
            let Some(n) = read_body(&mut read, &head).await else {
                return closed(&shared);
            };
            note(&shared, |r| r.early_bodies.push((conn, n)));
        }
    }
}
