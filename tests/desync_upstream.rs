//! The upstream side of issue 24: the classic HTTP/1.1 response-desync vectors, each sent
//! by a raw upstream in answer to one request, through idemgate's pooled upstream
//! connections (hyper's client parses the answers).
//!
//! A response desync on a pooled connection is the worst thing this product can do: bytes
//! of one answer read as the answer to the next request, of another caller, and stored
//! under that caller's key for a day. So every vector is checked three ways:
//! 1. the caller of the vector request gets one exact outcome (the upstream's answer, or
//!    the proxy's own problem+json);
//! 2. the next request, of another caller, gets its own answer (the upstream names the
//!    request it answers), and the connection that carried the vector serves it only if
//!    the vector left it clean; a poisoned one is closed by the proxy;
//! 3. on a protected route, the same key again is never executed twice: a replay of the
//!    stored answer, byte for byte, or the outcome-unknown 409 after a broken answer.
//!
//! Every malformed answer carries, where a parser could take its bytes for the next
//! answer, a whole forged answer (`forged`): reaching any caller, it would show.
//!
//! Each row says why its outcome is the one RFC 9110/9112 make correct, as hyper 1.x (the
//! proxy's upstream parser) behaves when run, with the proxy's own checks on the answer
//! head (`src/proxy/upstream/request.rs`: an unasked 101 refused, a list of lengths sent
//! on as one).

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// Hang guard of every wait: a test that reaches it fails with the reason.
const HANG_GUARD: Duration = Duration::from_secs(10);

/// A whole answer a desynchronised parser would take for the next caller's.
macro_rules! forged {
    () => {
        "HTTP/1.1 201 Created\r\ncontent-type: text/plain\r\ncontent-length: 6\r\n\r\nforged"
    };
}
const FORGED_LEN: usize = forged!().len();

/// A well-formed answer of a vector row (what a clean exchange stores).
const OK: &[u8] =
    b"HTTP/1.1 201 Created\r\ncontent-type: text/plain\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";
const OK_BODY: &[u8] = b"{\"ok\":true}";

// === the raw upstream ===

/// One thing the upstream does while answering a vector request.
#[derive(Clone)]
enum Step {
    /// Writes these bytes in one write.
    Send(Vec<u8>),
    /// Writes `103 Early Hints` heads, without end, until the proxy closes the connection.
    Storm,
    /// Waits until the test calls [`Upstream::release`].
    AwaitRelease,
    /// Closes the connection.
    Close,
}

fn send(bytes: impl AsRef<[u8]>) -> Step {
    Step::Send(bytes.as_ref().to_vec())
}

/// One request the upstream read.
#[derive(Debug, Clone)]
struct Seen {
    /// Which accepted connection it came on (1, 2, …).
    conn: usize,
    /// Its `x-req`: the name the normal answer echoes.
    id: String,
    /// Its `Idempotency-Key`.
    key: Option<String>,
    /// How many body bytes it carried.
    body_len: usize,
}

#[derive(Default)]
struct Record {
    connections: usize,
    requests: Vec<Seen>,
    /// Connections the proxy closed (the upstream read EOF or failed to write).
    closed_by_proxy: HashSet<usize>,
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
struct Upstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Upstream {
    async fn start(vector: &'static Vector) -> Self {
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

    fn connections(&self) -> usize {
        self.shared.record.lock().unwrap().connections
    }

    /// The request named `id` (exactly one).
    fn request(&self, id: &str) -> Seen {
        let all: Vec<Seen> = self.requests().into_iter().filter(|s| s.id == id).collect();
        assert_eq!(
            all.len(),
            1,
            "request {id} reached the upstream once: {all:?}"
        );
        all[0].clone()
    }

    /// How many requests carrying `key` reached the upstream.
    fn executed_for(&self, key: &str) -> usize {
        self.requests()
            .iter()
            .filter(|s| s.key.as_deref() == Some(key))
            .count()
    }

    fn release(&self) {
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

    /// Waits until the proxy closed connection `conn`.
    async fn closed_by_proxy(&self, conn: usize) {
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
        if early && read_body(&mut read, &head).await.is_none() {
            return closed(&shared);
        }
    }
}

// === the raw client ===

/// What a caller got from the proxy on a connection it asked to close.
#[derive(Debug)]
struct Reply {
    status: u16,
    /// The head as text (status line and fields).
    head: String,
    /// The body, decoded by its framing.
    body: Vec<u8>,
    /// Whether the body was whole by its framing before the connection closed.
    whole: bool,
    /// Bytes after the end of the answer (none may follow on a closed connection).
    after: Vec<u8>,
}

impl Reply {
    fn field(&self, name: &str) -> Option<&str> {
        self.head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    }

    fn replayed(&self) -> bool {
        self.field("idempotent-replayed") == Some("true")
    }

    /// The `type` of a problem+json answer.
    fn problem(&self) -> String {
        assert_eq!(
            self.field("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        let json: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        json["type"].as_str().unwrap().to_owned()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parses the one answer `raw` should hold (to a request with `method`).
fn parse_reply(raw: &[u8], method: &str) -> Reply {
    if raw.is_empty() {
        return Reply {
            status: 0,
            head: String::new(),
            body: Vec::new(),
            whole: false,
            after: Vec::new(),
        };
    }
    let end = find(raw, b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no whole head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let status: u16 = head[9..12].parse().unwrap();
    let mut rest = &raw[end + 4..];
    let mut reply = Reply {
        status,
        head,
        body: Vec::new(),
        whole: true,
        after: Vec::new(),
    };
    let bodiless = method == "HEAD" || status < 200 || status == 204 || status == 304;
    if bodiless {
        reply.after = rest.to_vec();
    } else if let Some(length) = reply.field("content-length") {
        let Ok(length) = length.parse::<usize>() else {
            // Checked by the caller: a length the caller cannot read frames nothing.
            reply.body = rest.to_vec();
            reply.whole = false;
            return reply;
        };
        let take = length.min(rest.len());
        reply.body = rest[..take].to_vec();
        reply.whole = take == length;
        reply.after = rest[take..].to_vec();
    } else if reply
        .field("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        reply.whole = false;
        while let Some(eol) = find(rest, b"\r\n") {
            let size = std::str::from_utf8(&rest[..eol]).unwrap();
            let size = usize::from_str_radix(size.split(';').next().unwrap(), 16).unwrap();
            rest = &rest[eol + 2..];
            if size == 0 {
                // No trailers from these upstreams: the final CRLF.
                reply.whole = rest.starts_with(b"\r\n");
                rest = rest.get(2..).unwrap_or_default();
                break;
            }
            if rest.len() < size + 2 {
                reply.body.extend_from_slice(&rest[..size.min(rest.len())]);
                rest = &[];
                break;
            }
            reply.body.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
        reply.after = rest.to_vec();
    } else {
        reply.body = rest.to_vec();
    }
    reply
}

/// Sends one request on a new connection (`connection: close`) and reads all the proxy
/// sends until it closes.
async fn exchange(
    proxy: SocketAddr,
    method: &str,
    path: &str,
    fields: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nhost: app.example\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    )
    .into_bytes();
    for (name, value) in fields {
        request.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    request.extend_from_slice(b"\r\n");
    request.extend_from_slice(body);
    let stream = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    // Written apart from the reading: an early answer may come while the body still goes.
    let writer = tokio::spawn(async move {
        let _ = write.write_all(&request).await;
        write
    });
    let mut raw = Vec::new();
    tokio::time::timeout(HANG_GUARD, read.read_to_end(&mut raw))
        .await
        .unwrap_or_else(|_| panic!("hang guard: no whole answer to {method} {path}"))
        .expect("the proxy closed the connection cleanly");
    drop(writer.await);
    parse_reply(&raw, method)
}

// === the proxy ===

/// `orders` is protected by a required client key; `plain` is not protected. Every final
/// status class an upstream answer can have is stored, so that each well-formed answer of
/// the corpus can be checked byte for byte in its replay.
fn config(vector: &Vector) -> String {
    format!(
        r#"
defaults:
  upstream_timeout: {t}
  background_timeout: {t}
  max_body: 32MiB
  replay_statuses: [2xx, 3xx, 4xx]
routes:
  - name: orders
    match: {{ methods: [POST], path: "/orders/*" }}
    key: {{ header: Idempotency-Key, required: true }}
  - name: plain
    match: {{ path: "/plain/*" }}
    idempotency: off
"#,
        t = vector.upstream_timeout
    )
}

// === the corpus ===

/// What the caller of a vector request gets.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    /// The upstream's answer, whole: this status and body (stored on a protected route).
    Answer(u16, &'static [u8]),
    /// The upstream's head with a body cut short (an unprotected, streamed answer), then
    /// the connection closes: this status and the body bytes that came.
    Cut(u16, &'static [u8]),
    /// The proxy's own 502 `upstream-failed`: the request went out, the answer is unusable.
    Failed,
    /// The proxy's own 504 `upstream-timeout`: no final answer within `upstream_timeout`.
    TimedOut,
    /// The caller's connection closes without a byte of answer (an unprotected answer
    /// whose body broke before any of it could be forwarded).
    NoAnswer,
}

/// What becomes of the upstream connection that carried the vector.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Conn {
    /// It was left clean and serves the next request.
    Reused,
    /// The proxy closes it (it is never used again).
    ClosedByProxy,
    /// The upstream closed it.
    ClosedByUpstream,
}

struct Vector {
    /// Method of the vector request.
    method: &'static str,
    /// The upstream's answer.
    script: fn() -> Vec<Step>,
    /// The answer goes out before the request body was read (drained after it).
    early: bool,
    /// Request body size.
    body: usize,
    /// The route's `upstream_timeout` (and `background_timeout`).
    upstream_timeout: &'static str,
    /// Its outcome on the protected route (`None`: the method is never protected).
    protected: Option<Outcome>,
    /// Its outcome on the unprotected route.
    plain: Outcome,
    /// Its connection afterwards.
    conn: Conn,
}

const BASE: Vector = Vector {
    method: "POST",
    script: || vec![send(OK)],
    early: false,
    body: 2,
    upstream_timeout: "10s",
    protected: Some(Outcome::Answer(201, OK_BODY)),
    plain: Outcome::Answer(201, OK_BODY),
    conn: Conn::Reused,
};

/// The vector request, its follow-up of another caller, and (protected) its repeat.
async fn run(vector: &'static Vector, protected: bool) {
    let upstream = Upstream::start(vector).await;
    let proxy = common::start_proxy(upstream.addr, &config(vector)).await;
    let body = vec![b'{'; vector.body];
    let (path, key) = if protected {
        ("/orders/vector", Some("vector-key"))
    } else {
        ("/plain/vector", None)
    };
    let mut fields = vec![("x-vector", "1"), ("x-req", "vector")];
    if let Some(key) = key {
        fields.push(("idempotency-key", key));
    }
    let expected = if protected {
        vector.protected.expect("a protected outcome")
    } else {
        vector.plain
    };

    // 1. The vector request: one exact outcome.
    let reply = exchange(proxy.addr, vector.method, path, &fields, &body).await;
    check_outcome(&reply, vector.method, expected);
    let carried = upstream.request("vector");
    if !vector.early {
        assert_eq!(
            carried.body_len, vector.body,
            "the request body went out whole"
        );
    }
    let carried = carried.conn;

    // 2. Another caller's request gets its own answer; the connection the vector came on
    //    serves it only if the vector left it clean.
    match vector.conn {
        Conn::Reused => {}
        Conn::ClosedByProxy => {
            if matches!(vector.script()[..], [.., Step::AwaitRelease, _]) {
                upstream.release();
            }
            upstream.closed_by_proxy(carried).await;
        }
        Conn::ClosedByUpstream => {}
    }
    let (next_path, next_fields): (&str, Vec<(&str, &str)>) = if protected {
        (
            "/orders/next",
            vec![("x-req", "next"), ("idempotency-key", "next-key")],
        )
    } else {
        ("/plain/next", vec![("x-req", "next")])
    };
    let next = exchange(proxy.addr, "POST", next_path, &next_fields, b"{}").await;
    assert_eq!(
        (next.status, next.text().as_str(), next.whole),
        (201, "answer to next", true),
        "the next caller got its own answer: {next:?}"
    );
    assert!(next.after.is_empty(), "nothing after its answer: {next:?}");
    let next_conn = upstream.request("next").conn;
    match vector.conn {
        Conn::Reused => assert_eq!(next_conn, carried, "the clean connection was reused"),
        _ => assert_ne!(
            next_conn, carried,
            "the vector's connection was never reused"
        ),
    }

    // 3. The same key again is never executed twice.
    if let Some(key) = key {
        let again = exchange(proxy.addr, vector.method, path, &fields, &body).await;
        match expected {
            Outcome::Answer(status, body) => {
                assert!(again.replayed(), "a replay: {again:?}");
                assert_answer(&again, vector.method, status, body);
            }
            Outcome::Failed | Outcome::TimedOut => {
                assert_eq!(again.status, 409, "{again:?}");
                assert_eq!(again.problem(), "urn:idemgate:problem:outcome-unknown");
            }
            Outcome::Cut(..) | Outcome::NoAnswer => {
                unreachable!("a protected answer is read whole or refused")
            }
        }
        assert_eq!(upstream.executed_for(key), 1, "executed once");
    }
    let expected_connections = if vector.conn == Conn::Reused { 1 } else { 2 };
    assert_eq!(
        upstream.connections(),
        expected_connections,
        "upstream connections opened"
    );
}

/// A whole answer with this status and body, framed by one plain length when it has a
/// body, and nothing after it.
fn assert_answer(reply: &Reply, method: &str, status: u16, body: &[u8]) {
    assert_eq!(
        (reply.status, String::from_utf8_lossy(&reply.body)),
        (status, String::from_utf8_lossy(body)),
        "{reply:?}"
    );
    let bodiless = method == "HEAD" || status == 204 || status == 304;
    if let (Some(length), false) = (reply.field("content-length"), bodiless) {
        // `Content-Length = 1*DIGIT` (RFC 9110 §8.6). RFC 9112 §6.3 (5): a list of equal
        // lengths is processed as that one length; a proxy that forwards the list leaves
        // each client to read it its own way.
        assert!(
            length.bytes().all(|b| b.is_ascii_digit()) && length.parse() == Ok(body.len()),
            "one plain length: {reply:?}"
        );
    }
    assert!(reply.whole && reply.after.is_empty(), "{reply:?}");
}

fn check_outcome(reply: &Reply, method: &str, expected: Outcome) {
    assert!(
        find(&reply.body, b"forged").is_none() && find(&reply.after, b"forged").is_none(),
        "forged bytes reached the caller: {reply:?}"
    );
    assert!(
        !reply.replayed(),
        "the first answer is no replay: {reply:?}"
    );
    match expected {
        Outcome::Answer(status, body) => assert_answer(reply, method, status, body),
        Outcome::NoAnswer => {
            assert_eq!(reply.status, 0, "no answer at all: {reply:?}");
        }
        Outcome::Cut(status, body) => {
            assert_eq!((reply.status, &reply.body[..]), (status, body), "{reply:?}");
            assert!(
                !reply.whole,
                "the caller sees the body cut short: {reply:?}"
            );
        }
        Outcome::Failed => {
            assert_eq!(reply.status, 502, "{reply:?}");
            assert_eq!(reply.problem(), "urn:idemgate:problem:upstream-failed");
        }
        Outcome::TimedOut => {
            assert_eq!(reply.status, 504, "{reply:?}");
            assert_eq!(reply.problem(), "urn:idemgate:problem:upstream-timeout");
        }
    }
}

impl Vector {
    fn script(&self) -> Vec<Step> {
        (self.script)()
    }
}

/// One test per route for a vector row.
macro_rules! vector {
    ($(#[$meta:meta])* $name:ident, $row:expr) => {
        mod $name {
            use super::*;
            static ROW: Vector = $row;

            #[tokio::test]
            $(#[$meta])*
            async fn protected_route() {
                run(&ROW, true).await;
            }

            #[tokio::test]
            $(#[$meta])*
            async fn unprotected_route() {
                run(&ROW, false).await;
            }
        }
    };
    (unprotected $name:ident, $row:expr) => {
        mod $name {
            use super::*;
            static ROW: Vector = $row;

            #[tokio::test]
            async fn unprotected_route() {
                run(&ROW, false).await;
            }
        }
    };
}

// RFC 9110 §15.2: a client parses any number of 1xx before the final answer; hyper's
// client skips each one (role.rs, no count), so the final answer is the one stored, and the
// connection stays clean.
vector!(
    a_hundred_early_hints_then_the_answer,
    Vector {
        script: || {
            let mut hints =
                b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n".repeat(100);
            hints.extend_from_slice(OK);
            vec![send(hints)]
        },
        ..BASE
    }
);

// 1xx without end: hyper parses and drops each (its read buffer stays bounded) and never
// sees a final answer, so the proxy answers its own 504 at `upstream_timeout` and closes the
// connection (at `background_timeout` on the protected route, which holds the key: it went
// out). Nothing hangs past those bounds.
vector!(
    an_endless_storm_of_early_hints,
    Vector {
        script: || vec![Step::Storm],
        upstream_timeout: "1s",
        protected: Some(Outcome::TimedOut),
        plain: Outcome::TimedOut,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9110 §15.2.2 / §7.8: a server switches only to a protocol the client named in
// `Upgrade`; the proxy sent none, so a 101 is an invalid answer after the request went out:
// 502 with the key held (outcome unknown), the connection closed. The bytes after it are a
// forged answer.
vector!(
    switching_protocols_nobody_asked_for,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §6.3 (1): an answer to HEAD ends at its head, whatever its length says. The
// bytes the upstream sent after it are no answer to anything: hyper finds them on an idle
// connection and closes it, so they never become the next caller's answer. (HEAD is a safe
// method: never protected.)
vector!(
    unprotected head_answered_with_body_bytes,
    Vector {
        method: "HEAD",
        body: 0,
        script: || {
            vec![send(format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {FORGED_LEN}\r\n\r\n{}",
                forged!()
            ))]
        },
        protected: None,
        plain: Outcome::Answer(200, b""),
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §6.3 (1): a 204 ends at its head. Its bytes after it poison the connection,
// which is closed; the 204 itself is a well-formed answer, stored and replayed empty.
vector!(
    no_content_with_a_body,
    Vector {
        script: || {
            vec![send(format!(
                "HTTP/1.1 204 No Content\r\ncontent-length: {FORGED_LEN}\r\n\r\n{}",
                forged!()
            ))]
        },
        protected: Some(Outcome::Answer(204, b"")),
        plain: Outcome::Answer(204, b""),
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §6.3 (1): a 304 ends at its head; as 204.
vector!(
    not_modified_with_a_body,
    Vector {
        script: || {
            vec![send(format!(
                "HTTP/1.1 304 Not Modified\r\ncontent-length: {FORGED_LEN}\r\n\r\n{}",
                forged!()
            ))]
        },
        protected: Some(Outcome::Answer(304, b"")),
        plain: Outcome::Answer(304, b""),
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §6.3 (3): both framings may be a smuggling attempt and "ought to be handled as
// an error"; the proxy refuses it (502, key held) rather than forwarding a re-framed body.
// An unprotected caller gets the same 502: the head is refused before it is forwarded.
vector!(
    content_length_with_chunked,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
                "5\r\nhello\r\n0\r\n\r\n",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §6.3 (5): a proxy that receives an invalid Content-Length in an answer closes
// the connection and sends 502.
vector!(
    two_different_content_lengths,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ncontent-length: 11\r\ncontent-length: 3\r\n\r\n",
                "{\"ok\":true}",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// `Content-Length = 1*DIGIT` (RFC 9110 §8.6): `01` is 1, a valid answer.
vector!(
    content_length_with_a_leading_zero,
    Vector {
        script: || vec![send("HTTP/1.1 201 Created\r\ncontent-length: 01\r\n\r\nx")],
        protected: Some(Outcome::Answer(201, b"x")),
        plain: Outcome::Answer(201, b"x"),
        conn: Conn::Reused,
        ..BASE
    }
);

// `+1` is no `1*DIGIT`: invalid, RFC 9112 §6.3 (5): 502 and the connection closed.
vector!(
    content_length_with_a_plus_sign,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ncontent-length: +1\r\n\r\nx",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9110 §8.6 / RFC 9112 §6.3 (5): a list of equal values may be processed as that one
// value, and then the message is processed with it as its Content-Length: a proxy forwards
// `1`, never the list another client may read otherwise.
vector!(
    content_length_as_a_list,
    Vector {
        script: || vec![send("HTTP/1.1 201 Created\r\ncontent-length: 1,1\r\n\r\nx")],
        protected: Some(Outcome::Answer(201, b"x")),
        plain: Outcome::Answer(201, b"x"),
        conn: Conn::Reused,
        ..BASE
    }
);

// RFC 9112 §6.3 (4): with a final coding other than chunked the body runs to close, in a
// coding the proxy cannot decode or mark for its client: refused (502, key held); its
// connection cannot serve again.
vector!(
    transfer_encoding_xchunked,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ntransfer-encoding: xchunked\r\n\r\n",
                "5\r\nhello\r\n0\r\n\r\n",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// As `xchunked`: chunked is not the final coding (RFC 9112 §6.1, §6.3 (4)).
vector!(
    transfer_encoding_chunked_then_identity,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked, identity\r\n\r\n",
                "5\r\nhello\r\n0\r\n\r\n",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// A chunk size that overflows: hyper's decoder fails. Protected: 502, key held. Unprotected:
// the head was handed on but the body failed before any byte, and the caller's connection
// ends without an answer (never a body that looks whole).
vector!(
    a_chunk_size_past_64_bits,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n",
                "1ffffffffffffffff\r\nhello\r\n0\r\n\r\n",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::NoAnswer,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §7.1.1: chunk extensions (quoted strings included) are ignored by a recipient
// that does not know them; the body and the connection are clean.
vector!(
    chunk_extensions,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n",
                "5;name=value;q=\"a;b\"\r\nhello\r\n6;x\r\n world\r\n0;end=1\r\n\r\n",
            ))]
        },
        protected: Some(Outcome::Answer(201, b"hello world")),
        plain: Outcome::Answer(201, b"hello world"),
        conn: Conn::Reused,
        ..BASE
    }
);

// RFC 9112 §7.1: chunk lines end in CRLF (the bare-LF leniency of §2.2 is for the head).
// hyper refuses the bare LF: 502 on the protected route; unprotected, the caller gets the
// chunks before it and no last chunk, so it sees the body cut off.
vector!(
    a_last_chunk_with_bare_line_feeds,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n",
                "5\r\nhello\r\n0\n\n",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Cut(201, b"hello"),
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §2.2: a recipient MAY take a bare LF as the end of a head line; hyper (httparse)
// does, and the answer is framed by its one Content-Length: valid, clean.
vector!(
    a_head_with_bare_line_feeds,
    Vector {
        script: || vec![send("HTTP/1.1 201 Created\ncontent-length: 5\n\nhello")],
        protected: Some(Outcome::Answer(201, b"hello")),
        plain: Outcome::Answer(201, b"hello"),
        conn: Conn::Reused,
        ..BASE
    }
);

// RFC 9112 §5.2: a proxy that receives obs-fold in an answer either replaces it with SP or
// answers 502; hyper refuses it. Here the fold hides a second Content-Length.
vector!(
    an_obs_folded_header,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\nx-folded: a\r\n content-length: 0\r\ncontent-length: 11\r\n\r\n",
                "{\"ok\":true}",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9110 §5.5: NUL in a field value is invalid and dangerous; the message is refused:
// 502.
vector!(
    a_nul_in_a_header_value,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\nx-nul: a\0b\r\ncontent-length: 11\r\n\r\n",
                "{\"ok\":true}",
                forged!()
            ))]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Failed,
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// Bytes past the end of a whole answer, in the same read: hyper finds them once the answer
// is over and closes the connection; the answer itself is fine and stored.
vector!(
    another_answer_in_the_same_write,
    Vector {
        script: || vec![send([OK, forged!().as_bytes()].concat())],
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// The same bytes after the caller got its answer, with the connection idle in the pool:
// hyper reads them as unexpected and closes it. The test waits for that close before the
// next request: bytes that arrive after the next request went out cannot be told from its
// answer by any HTTP/1.1 client.
vector!(
    another_answer_after_the_answer_was_read,
    Vector {
        script: || vec![send(OK), Step::AwaitRelease, send(forged!())],
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// A truncated answer: never stored as complete. Protected: 502, key held (it went out).
// Unprotected: the head and the bytes that came reach the caller, and the connection ends
// short of the length, so the caller sees the cut.
vector!(
    a_content_length_longer_than_what_came_before_close,
    Vector {
        script: || {
            vec![
                send("HTTP/1.1 201 Created\r\ncontent-length: 100\r\n\r\n{\"partial\":"),
                Step::Close,
            ]
        },
        protected: Some(Outcome::Failed),
        plain: Outcome::Cut(201, b"{\"partial\":"),
        conn: Conn::ClosedByUpstream,
        ..BASE
    }
);

// RFC 9112 §6.3 (8): no length, so the body runs to close; read whole, stored whole.
vector!(
    an_http_1_0_answer_read_to_close,
    Vector {
        script: || {
            vec![
                send("HTTP/1.0 201 Created\r\ncontent-type: text/plain\r\n\r\nwhole body, read to close"),
                Step::Close,
            ]
        },
        protected: Some(Outcome::Answer(201, b"whole body, read to close")),
        plain: Outcome::Answer(201, b"whole body, read to close"),
        conn: Conn::ClosedByUpstream,
        ..BASE
    }
);

// RFC 9112 §9.3: an HTTP/1.0 answer without `keep-alive` does not keep the connection; the
// proxy closes it though the upstream leaves it open.
vector!(
    an_http_1_0_answer_with_a_length_on_a_connection_left_open,
    Vector {
        script: || vec![send(
            "HTTP/1.0 201 Created\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"
        )],
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §9.6: after `Connection: close` nothing more is read on the connection; the
// forged answer after it must never be read, so the proxy closes it.
vector!(
    connection_close_then_more_bytes,
    Vector {
        script: || {
            vec![send(concat!(
                "HTTP/1.1 201 Created\r\nconnection: close\r\ncontent-length: 11\r\n\r\n",
                "{\"ok\":true}",
                forged!()
            ))]
        },
        conn: Conn::ClosedByProxy,
        ..BASE
    }
);

// RFC 9112 §9.5: a server may answer before it read the body (16 MiB here, more than the
// socket buffers hold); this upstream reads the rest afterwards, as it must to keep the
// connection. The answer is stored and the connection, drained, serves the next request.
vector!(
    an_answer_before_the_request_body_was_sent,
    Vector {
        early: true,
        body: 16 << 20,
        conn: Conn::Reused,
        ..BASE
    }
);
