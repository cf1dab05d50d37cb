//! Running a vector and classifying what happened: a fresh proxy in front of a fresh
//! recorder, the bytes written (whole, in pieces, or paced by the answers), and the
//! [`Verdict`] judged from the client's answers and the recorder's events.

use std::fmt;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::build::{Route, CONFIG};
use crate::common;
use crate::corpus::{Expect, Fwd};
use crate::wire::{find, start_wire, Event, Wire};

/// What a run showed: the answers the client got and what the upstream received.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    Refused(u16),
    /// A refusal, then forwarded requests: no vector expects it (a refusal ends the
    /// connection), so it shows a request pipelined behind a refusal that got through.
    RefusedThenForwarded(u16, Vec<Wire>),
    Forwarded(Vec<Wire>),
    Closed,
    /// Anything else, said in words.
    Other(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Refused(status) => write!(f, "refused {status}"),
            Verdict::RefusedThenForwarded(status, requests) => {
                write!(f, "refused {status}, then ")?;
                Verdict::Forwarded(requests.clone()).fmt(f)
            }
            Verdict::Closed => write!(f, "closed"),
            Verdict::Other(what) => write!(f, "{what}"),
            Verdict::Forwarded(requests) => {
                write!(f, "forwarded [")?;
                for (i, r) in requests.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(
                        f,
                        "{sep}{} {} host={:?} body={:?} conn={}",
                        r.method,
                        r.target,
                        r.host,
                        String::from_utf8_lossy(&r.body),
                        r.conn
                    )?;
                }
                write!(f, "]")
            }
        }
    }
}

/// `expect` for `route`, as a [`Verdict`] to compare with; the upstream connection of a
/// forwarded request is not part of it (set from what was seen).
pub(crate) fn expected(expect: Expect, route: Route, seen: &Verdict) -> Verdict {
    match expect {
        Expect::Refused(status) => Verdict::Refused(status),
        Expect::Closed => Verdict::Closed,
        Expect::Forwarded(list) => Verdict::Forwarded(wires(list, route, seen)),
    }
}

/// The requests `list` names, on `route`, on the upstream connections they were seen on.
fn wires(list: &[Fwd], route: Route, seen: &Verdict) -> Vec<Wire> {
    let conns: Vec<usize> = match seen {
        Verdict::Forwarded(got) | Verdict::RefusedThenForwarded(_, got) => {
            got.iter().map(|w| w.conn).collect()
        }
        _ => vec![],
    };
    list.iter()
        .enumerate()
        .map(|(i, f)| Wire {
            conn: conns.get(i).copied().unwrap_or(0),
            method: f.method.into(),
            target: f.target.replace("$P", route.path()),
            host: Some(f.host.into()),
            body: f.body.to_vec(),
        })
        .collect()
}

/// How long a client connection may stay open with nothing to do (the proxy's idle and
/// body-read timeouts here): only bounds a run whose request never ends; each vector's
/// last request says `Connection: close`, so a run normally ends on the proxy's close.
const QUIET: Duration = Duration::from_secs(1);

/// Hang guard for one run.
pub(crate) const HANG: Duration = Duration::from_secs(10);

/// Runs `bytes` on a fresh proxy in front of a fresh recorder, written in pieces cut at
/// `cuts` (sorted offsets), and says what happened.
pub(crate) async fn run(bytes: &[u8], route: Route, cuts: &[usize]) -> Verdict {
    run_paced(bytes, route, cuts, false).await
}

/// [`run`]; with `after_an_answer`, each piece after the first is written only once the
/// client has read a whole answer (the signal that the proxy answered before the rest
/// arrived).
pub(crate) async fn run_paced(
    bytes: &[u8],
    route: Route,
    cuts: &[usize],
    after_an_answer: bool,
) -> Verdict {
    let (wire, log) = start_wire().await;
    let text = format!("listen: 127.0.0.1:0\nupstream: http://{wire}\n{CONFIG}");
    let proxy = common::start_proxy_tuned(&text, None, |p| {
        p.with_idle_timeout(QUIET).with_body_read_timeout(QUIET)
    })
    .await;
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let mut pieces = Vec::new();
    let mut from = 0;
    for &cut in cuts.iter().chain([&bytes.len()]) {
        pieces.push(bytes[from..cut].to_vec());
        from = cut;
    }
    // How many whole answers the client has read so far.
    let (answered_tx, mut answered) = tokio::sync::watch::channel(0usize);
    // Written from its own task, so a proxy that answers before reading everything
    // cannot stall the run; a write the proxy no longer reads may fail, which is fine.
    let writing = tokio::spawn(async move {
        for (i, piece) in pieces.into_iter().enumerate() {
            if after_an_answer && i > 0 && answered.wait_for(|&n| n > 0).await.is_err() {
                return writer;
            }
            if writer.write_all(&piece).await.is_err() || writer.flush().await.is_err() {
                return writer;
            }
        }
        writer
    });
    let mut answer = Vec::new();
    let started = Instant::now();
    let read = tokio::time::timeout(HANG, async {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    answer.extend_from_slice(&chunk[..n]);
                    // A partial answer behind whole ones reads as an error: counts only rise.
                    let whole = statuses(&answer).map_or(0, |s| s.len());
                    answered_tx.send_if_modified(|n| std::mem::replace(n, whole.max(*n)) < whole);
                }
            }
        }
    })
    .await;
    if read.is_err() {
        return Verdict::Other(format!(
            "hang guard: the proxy neither answered nor closed within {HANG:?}"
        ));
    }
    // Kept until the proxy closed: dropping it would close our side first.
    let _writer = writing.await;
    // Protected owners outlive their client connection (SPEC: a client that leaves does
    // not cancel the upstream call): wait until none runs before looking at the upstream.
    proxy.proxy.owners().finished(started + HANG).await;
    if !proxy.proxy.owners().is_empty() {
        return Verdict::Other("hang guard: an owner still runs".into());
    }
    let events = log.events.lock().unwrap().clone();
    judge(&answer, &events, route)
}

/// The verdict from the client's bytes and the upstream's events.
fn judge(answer: &[u8], events: &[Event], route: Route) -> Verdict {
    let statuses = match statuses(answer) {
        Ok(statuses) => statuses,
        Err(e) => return Verdict::Other(format!("unreadable answer: {e}")),
    };
    let mut requests = Vec::new();
    let mut noise = Vec::new();
    let mut partial = Vec::new();
    for event in events {
        match event {
            Event::Request(w) => requests.push(w.clone()),
            Event::Malformed { conn, why } => {
                noise.push(format!("malformed on conn {conn}: {why}"))
            }
            Event::Partial { conn, bytes } => {
                partial.push(format!("partial request ({bytes} bytes) on conn {conn}"))
            }
        }
    }
    // The streamed route sends the head on as soon as it is read (whether it has by the
    // time the body turns out broken is a matter of timing): a refused request may leave
    // the upstream one cut off mid-body, which no upstream can take for a whole one (the
    // strict reader checked it was a valid beginning). Nowhere else: the protected route
    // buffers the body first, and a run that forwarded anything must have nothing cut.
    if route != Route::Open || !requests.is_empty() {
        noise.extend(partial);
    }
    if !noise.is_empty() {
        return Verdict::Other(format!(
            "upstream saw {noise:?}; answers {statuses:?}; requests {}",
            Verdict::Forwarded(requests)
        ));
    }
    match (&statuses[..], requests.is_empty()) {
        ([], true) => Verdict::Closed,
        ([status], true) if *status >= 400 => Verdict::Refused(*status),
        (s, false) if s.len() == requests.len() && s.iter().all(|&s| s == 201) => {
            Verdict::Forwarded(requests)
        }
        ([first, rest @ ..], false)
            if *first >= 400 && rest.len() == requests.len() && rest.iter().all(|&s| s == 201) =>
        {
            Verdict::RefusedThenForwarded(*first, requests)
        }
        _ => Verdict::Other(format!(
            "answers {statuses:?}, upstream {}",
            Verdict::Forwarded(requests)
        )),
    }
}

/// The statuses of the answers in `raw`, in order, each read to its end by its framing.
fn statuses(raw: &[u8]) -> Result<Vec<u16>, String> {
    let mut out = Vec::new();
    let mut rest = raw;
    while !rest.is_empty() {
        let end = find(rest, b"\r\n\r\n").ok_or("a head without its end")?;
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        rest = &rest[end + 4..];
        let status: u16 = head
            .strip_prefix("HTTP/1.1 ")
            .and_then(|s| s.get(..3))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("status line of {head:?}"))?;
        out.push(status);
        let field = |name: &str| {
            head.lines().skip(1).find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
        };
        if let Some(len) = field("content-length") {
            let len: usize = len.parse().map_err(|_| format!("length in {head:?}"))?;
            rest = rest.get(len..).ok_or("a body cut short")?;
        } else if field("transfer-encoding").is_some() {
            loop {
                let at = find(rest, b"\r\n").ok_or("a chunk cut short")?;
                let size = std::str::from_utf8(&rest[..at]).unwrap_or("");
                let size = usize::from_str_radix(size.split(';').next().unwrap_or(""), 16)
                    .map_err(|_| "a chunk size")?;
                rest = &rest[at + 2..];
                if size == 0 {
                    let end = find(rest, b"\r\n").ok_or("a trailer cut short")?;
                    rest = &rest[end + 2..];
                    break;
                }
                rest = rest.get(size + 2..).ok_or("a chunk cut short")?;
            }
        }
    }
    Ok(out)
}
