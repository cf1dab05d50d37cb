//! The recording upstream: keeps every request it gets and answers each with a body and
//! cookie that belong to one caller.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderMap, Method, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::upstream::{full, header_u64, serve};

/// One request a [`Recorder`] received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    /// The request target as it arrived: path and query.
    pub target: String,
    pub headers: HeaderMap,
}

/// A real upstream that records every request it gets (method, target, headers) and
/// answers each with `201`, `x-test-status` if given, a JSON body `{"n", "path",
/// "session"}` and `Set-Cookie: session=<the caller's sessionid cookie>-renewed`: an
/// answer that belongs to one caller, as a login or cart answer does.
pub struct Recorder {
    pub addr: SocketAddr,
    seen: Arc<std::sync::Mutex<Vec<Seen>>>,
}

impl Recorder {
    /// Everything received so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests it executed.
    pub fn executed(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// Starts a [`Recorder`] on 127.0.0.1:0.
pub async fn start_recorder() -> Recorder {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<std::sync::Mutex<Vec<Seen>>> = Arc::default();
    let log = Arc::clone(&seen);
    serve(listener, move |req: Request<Incoming>| {
        let log = Arc::clone(&log);
        async move {
            let (parts, body) = req.into_parts();
            let _ = body.collect().await;
            let target = parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            let session = parts
                .headers
                .get_all("cookie")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(';'))
                .find_map(|c| c.trim().strip_prefix("sessionid="))
                .unwrap_or("none")
                .to_owned();
            let status = header_u64(&parts.headers, "x-test-status").unwrap_or(201);
            let n = {
                let mut seen = log.lock().unwrap();
                seen.push(Seen {
                    method: parts.method.clone(),
                    target: target.clone(),
                    headers: parts.headers.clone(),
                });
                seen.len()
            };
            let path = target.split('?').next().unwrap_or("").to_owned();
            let answer = serde_json::json!({ "n": n, "path": path, "session": session });
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status as u16)
                    .header("content-type", "application/json")
                    .header("set-cookie", format!("session={session}-renewed"))
                    .body(full(answer.to_string()))
                    .unwrap(),
            )
        }
    });
    Recorder { addr, seen }
}
