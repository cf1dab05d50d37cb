//! The wire recorder: an upstream of this test's own that parses HTTP/1.1 strictly and
//! records every request that crossed the proxy, and every one it could not read whole.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A request the recorder read whole.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Wire {
    pub(crate) conn: usize,
    pub(crate) method: String,
    pub(crate) target: String,
    pub(crate) host: Option<String>,
    pub(crate) body: Vec<u8>,
}

/// What crossed to the upstream.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    /// A whole request.
    Request(Wire),
    /// A request framed in a way a strict reader rejects (both framings, a coding besides
    /// chunked, a bad length, a bad line): what a lenient upstream could read otherwise.
    Malformed { conn: usize, why: String },
    /// The connection ended in the middle of a request: bytes went out that no one can
    /// act on.
    Partial { conn: usize, bytes: usize },
}

#[derive(Default)]
pub(crate) struct WireLog {
    pub(crate) events: Mutex<Vec<Event>>,
}

impl WireLog {
    fn push(&self, event: Event) {
        self.events.lock().unwrap().push(event);
    }
}

/// Starts the recorder on 127.0.0.1:0: every request it reads whole is logged, then
/// answered `201` with a two-byte body.
pub(crate) async fn start_wire() -> (SocketAddr, Arc<WireLog>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log: Arc<WireLog> = Arc::default();
    let events = Arc::clone(&log);
    tokio::spawn(async move {
        for conn in 1.. {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(serve_wire(stream, conn, Arc::clone(&events)));
        }
    });
    (addr, log)
}

async fn serve_wire(mut stream: TcpStream, conn: usize, log: Arc<WireLog>) {
    let mut buf = Vec::new();
    loop {
        match read_request(&mut stream, &mut buf).await {
            Ok(None) => return,
            Ok(Some((method, target, host, body))) => {
                log.push(Event::Request(Wire {
                    conn,
                    method,
                    target,
                    host,
                    body,
                }));
                let answer = b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok";
                if stream.write_all(answer).await.is_err() {
                    return;
                }
            }
            Err(Broken::Eof(bytes)) => {
                log.push(Event::Partial { conn, bytes });
                return;
            }
            Err(Broken::Malformed(why)) => {
                log.push(Event::Malformed { conn, why });
                return;
            }
        }
    }
}

enum Broken {
    /// The connection ended after this many bytes of a request.
    Eof(usize),
    Malformed(String),
}

type Parsed = (String, String, Option<String>, Vec<u8>);

/// Reads one request strictly (RFC 9112: CRLF lines, token names, no whitespace before
/// the colon, one framing); `Ok(None)` at a clean end between requests.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Option<Parsed>, Broken> {
    let bad = |why: &str| Broken::Malformed(why.to_owned());
    let mut taken = 0;
    let head_end = loop {
        if let Some(at) = find(buf, b"\r\n\r\n") {
            break at;
        }
        if !fill(stream, buf).await {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(Broken::Eof(buf.len()))
            };
        }
    };
    let head = buf[..head_end].to_vec();
    taken += head_end + 4;
    if head.contains(&b'\0') {
        return Err(bad("NUL in the head"));
    }
    let mut lines = split_crlf(&head).map_err(|e| bad(&e))?.into_iter();
    let line = lines.next().unwrap_or_default();
    let parts: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let [method, target, b"HTTP/1.1"] = parts[..] else {
        return Err(bad(&format!(
            "request line {:?}",
            String::from_utf8_lossy(&line)
        )));
    };
    let (mut lengths, mut codings, mut host) = (Vec::new(), Vec::new(), None);
    for line in lines {
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(|| bad("no colon"))?;
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if name.is_empty()
            || !name
                .iter()
                .all(|&b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
        {
            return Err(bad(&format!(
                "field name {:?}",
                String::from_utf8_lossy(name)
            )));
        }
        if value.iter().any(|&b| b < 0x20 && b != b'\t' || b == 0x7f) {
            return Err(bad("a control byte in a field value"));
        }
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        match name.as_str() {
            "content-length" => lengths.push(value.to_vec()),
            "transfer-encoding" => codings.push(value.to_vec()),
            "host" if host.is_some() => return Err(bad("two Host fields")),
            "host" => host = Some(String::from_utf8_lossy(value).into_owned()),
            _ => {}
        }
    }
    if !lengths.is_empty() && !codings.is_empty() {
        return Err(bad("both Content-Length and Transfer-Encoding"));
    }
    let body = if !codings.is_empty() {
        if codings.len() != 1 || !codings[0].eq_ignore_ascii_case(b"chunked") {
            return Err(bad("a transfer coding besides one chunked"));
        }
        let mut body = Vec::new();
        loop {
            let line = take_line(stream, buf, &mut taken).await?;
            let size = line.split(|&b| b == b';').next().unwrap_or_default();
            let size = std::str::from_utf8(size)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|s| usize::from_str_radix(s, 16).ok())
                .ok_or_else(|| bad("chunk size"))?;
            if size == 0 {
                // Trailer fields, up to the empty line.
                while !take_line(stream, buf, &mut taken).await?.is_empty() {}
                break;
            }
            while buf.len() < taken + size + 2 {
                if !fill(stream, buf).await {
                    return Err(Broken::Eof(buf.len()));
                }
            }
            body.extend_from_slice(&buf[taken..taken + size]);
            if &buf[taken + size..taken + size + 2] != b"\r\n" {
                return Err(bad("chunk data without its CRLF"));
            }
            taken += size + 2;
        }
        body
    } else if let Some(first) = lengths.first() {
        if lengths.len() != 1 || first.is_empty() || !first.iter().all(u8::is_ascii_digit) {
            return Err(bad("Content-Length"));
        }
        let n: usize = std::str::from_utf8(first)
            .unwrap()
            .parse()
            .map_err(|_| bad("Content-Length"))?;
        while buf.len() < taken + n {
            if !fill(stream, buf).await {
                return Err(Broken::Eof(buf.len()));
            }
        }
        taken += n;
        buf[taken - n..taken].to_vec()
    } else {
        Vec::new()
    };
    buf.drain(..taken);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Ok(Some((text(method), text(target), host, body)))
}

/// The next CRLF-ended line at `taken` in `buf`, reading more as needed.
async fn take_line(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    taken: &mut usize,
) -> Result<Vec<u8>, Broken> {
    loop {
        if let Some(at) = find(&buf[*taken..], b"\r\n") {
            let line = buf[*taken..*taken + at].to_vec();
            if line.contains(&b'\r') || line.contains(&b'\n') {
                return Err(Broken::Malformed(
                    "a bare CR or LF in the body framing".into(),
                ));
            }
            *taken += at + 2;
            return Ok(line);
        }
        if !fill(stream, buf).await {
            return Err(Broken::Eof(buf.len()));
        }
    }
}

/// Lines of a head split at CRLF; a bare CR or LF is an error.
fn split_crlf(head: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut lines = Vec::new();
    let mut rest = head;
    loop {
        let end = find(rest, b"\r\n").unwrap_or(rest.len());
        let line = &rest[..end];
        if line.contains(&b'\r') || line.contains(&b'\n') {
            return Err("a bare CR or LF in the head".into());
        }
        lines.push(line.to_vec());
        if end == rest.len() {
            return Ok(lines);
        }
        rest = &rest[end + 2..];
    }
}

pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads more into `buf`; false at the end of the stream (or an error).
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}
