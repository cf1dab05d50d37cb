//! The raw client: one request per connection to the proxy, everything it sends read until
//! it closes, and parsed by its own framing (so a cut body or bytes after the answer show).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::HANG_GUARD;

/// What a caller got from the proxy on a connection it asked to close.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    /// The head as text (status line and fields).
    head: String,
    /// The body, decoded by its framing.
    pub(crate) body: Vec<u8>,
    /// Whether the body was whole by its framing before the connection closed.
    pub(crate) whole: bool,
    /// Bytes after the end of the answer (none may follow on a closed connection).
    pub(crate) after: Vec<u8>,
}

impl Reply {
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        self.head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    }

    pub(crate) fn replayed(&self) -> bool {
        self.field("idempotent-replayed") == Some("true")
    }

    /// The `type` of a problem+json answer.
    pub(crate) fn problem(&self) -> String {
        assert_eq!(
            self.field("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        let json: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        json["type"].as_str().unwrap().to_owned()
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub(crate) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
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
pub(crate) async fn exchange(
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
