//! A grammar of upstream answers for the fuzz and differential tests of the hand-written
//! client (issue 24): status lines, interim answers, framing fields in the spellings
//! parsers have been known to read differently (`+1`, `1, 2`, `chunked,`, a space before
//! the colon, bare LF line ends), chunked bodies with odd sizes, extensions and trailers,
//! and bytes after the answer. Each part is picked at random by proptest, so a failure
//! shrinks to the smallest answer that shows it.
//!
//! An answer carries the [`Stricter`] cases of the allow-list that it contains, which
//! the differential test then lets the hand-written side refuse.

use http::Method;
use proptest::prelude::*;
use proptest::sample::Index;

use super::differential_tests::Stricter;

/// An upstream answer and the request method it answers.
#[derive(Clone)]
pub(super) struct Answer {
    pub method: Method,
    pub wire: Vec<u8>,
    /// The allow-listed constructs in `wire`, each a reason the hand-written side may
    /// refuse where hyper takes the answer.
    pub stricter: Vec<Stricter>,
}

/// The bytes escaped, so that a failure (and a proptest regression file) reads as HTTP.
impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} answered \"{}\" {:?}",
            self.method,
            self.wire.escape_ascii(),
            self.stricter
        )
    }
}

/// Bytes with the allow-listed constructs among them.
type Part = (Vec<u8>, Vec<Stricter>);

fn join(parts: impl IntoIterator<Item = Part>) -> Part {
    parts
        .into_iter()
        .fold((Vec::new(), Vec::new()), |(mut wire, mut tags), (w, t)| {
            wire.extend_from_slice(&w);
            tags.extend(t);
            (wire, tags)
        })
}

fn plain(bytes: &[u8]) -> Part {
    (bytes.to_vec(), Vec::new())
}

/// A whole answer: interim answers, a head, a body, and maybe bytes after it.
pub(super) fn answer() -> impl Strategy<Value = Answer> {
    (
        method(),
        interims(),
        status_line(),
        framed(),
        prop::collection::vec(other_field(), 0..3),
        line_end(),
        after(),
    )
        .prop_map(
            |(method, interims, status, (fields, body), others, end, after)| {
                let (wire, stricter) = join(
                    [interims, plain(&status), fields]
                        .into_iter()
                        .chain(others)
                        .chain([plain(end), body, plain(after)]),
                );
                Answer {
                    method,
                    wire,
                    stricter,
                }
            },
        )
}

fn method() -> impl Strategy<Value = Method> {
    prop_oneof![
        3 => Just(Method::POST),
        2 => Just(Method::GET),
        1 => Just(Method::PATCH),
        1 => Just(Method::HEAD),
    ]
}

/// Mostly CRLF.
fn line_end() -> impl Strategy<Value = &'static [u8]> {
    prop_oneof![12 => Just(&b"\r\n"[..]), 1 => Just(&b"\n"[..])]
}

fn ows() -> impl Strategy<Value = &'static str> {
    prop_oneof![6 => Just(" "), 2 => Just(""), 1 => Just("\t"), 1 => Just("  ")]
}

fn status_line() -> BoxedStrategy<Vec<u8>> {
    (
        prop_oneof![8 => Just("HTTP/1.1"), 1 => Just("HTTP/1.0")],
        prop_oneof![
            12 => Just(200u16),
            2 => Just(201),
            1 => Just(204),
            1 => Just(304),
            1 => Just(404),
            1 => Just(101),
            1 => Just(103),
        ],
        prop_oneof![6 => Just(" X"), 1 => Just(" "), 1 => Just("")],
        line_end(),
    )
        .prop_map(|(version, status, reason, end)| {
            let mut line = format!("{version} {status}{reason}").into_bytes();
            line.extend_from_slice(end);
            line
        })
        .boxed()
}

/// Mostly none; else a few `100`, `102` or `103` heads before the final one.
fn interims() -> BoxedStrategy<Part> {
    let interim = (
        prop_oneof![Just(100u16), Just(102), Just(103)],
        prop_oneof![
            Just(""),
            Just("link: </a>\r\n"),
            Just("content-length: 5\r\n")
        ],
    )
        .prop_map(|(status, field)| format!("HTTP/1.1 {status} X\r\n{field}\r\n").into_bytes());
    prop_oneof![
        6 => Just(Vec::new()),
        1 => prop::collection::vec(interim, 1..4).prop_map(|heads| heads.concat()),
    ]
    .prop_map(|wire| (wire, Vec::new()))
    .boxed()
}

/// The framing fields and a body meant to match them: a length, chunks, both, or
/// neither (a body to the close). Spellings and bodies are mostly right.
fn framed() -> BoxedStrategy<(Part, Part)> {
    let raw = |n: usize| (0..n).map(|i| b'a' + (i % 26) as u8).collect::<Vec<u8>>();
    let length = (
        0usize..12,
        length_value(),
        prop_oneof![8 => Just(0i8), 1 => Just(-1), 1 => Just(1)],
    )
        .prop_flat_map(move |(n, spelling, off)| {
            let body = raw((n as i64 + i64::from(off)).max(0) as usize);
            (length_field(spelling(n)), Just(body))
        })
        .prop_map(|(field, body)| (plain(&field), plain(&body)));
    let chunks = (coding_field(), chunked()).prop_map(|(field, body)| (plain(&field), body));
    let both = (length_field("5".to_owned()), coding_field(), chunked())
        .prop_map(|(cl, te, body)| (plain(&[cl, te].concat()), body));
    let neither = prop::collection::vec(prop::sample::select(&b"ab0\r\n;"[..]), 0..16)
        .prop_map(|raw| (plain(b""), plain(&raw)));
    prop_oneof![4 => length, 4 => chunks, 1 => both, 1 => neither].boxed()
}

fn length_field(value: String) -> BoxedStrategy<Vec<u8>> {
    (
        length_name(),
        ows(),
        ows(),
        line_end(),
        prop_oneof![8 => Just(false), 1 => Just(true)],
    )
        .prop_map(move |(name, before, after, end, twice)| {
            let mut line = format!("{name}:{before}{value}{after}").into_bytes();
            line.extend_from_slice(end);
            if twice {
                line = line.repeat(2);
            }
            line
        })
        .boxed()
}

fn coding_field() -> BoxedStrategy<Vec<u8>> {
    (coding_name(), ows(), coding_value(), ows(), line_end())
        .prop_map(|(name, before, value, after, end)| {
            let mut line = format!("{name}:{before}{value}{after}").into_bytes();
            line.extend_from_slice(end);
            line
        })
        .boxed()
}

const OTHER_FIELDS: &[&[u8]] = &[
    b"connection: close",
    b"Connection: keep-alive",
    b"connection: Keep-Alive, x",
    b"connection: keep-alive, caf\xe9",
    b"connection: close, caf\xe9",
    b"connection: keep-alive\r\nconnection: close",
    b"x-obs: caf\xe9 \xff",
    b"x-nul: a\0b",
    b"x-ctl: a\x01b",
    b"x-del: a\x7fb",
    b"x-fold: a\r\n b",
    b"x-empty:",
    b"trailer: x-sum",
];

/// A field besides the framing ones: mostly a plain one.
fn other_field() -> BoxedStrategy<Part> {
    (
        prop_oneof![
            8 => Just(&b"x-app: 1"[..]),
            2 => prop::sample::select(OTHER_FIELDS),
        ],
        line_end(),
    )
        .prop_map(|(line, end)| ([line, end].concat(), Vec::new()))
        .boxed()
}

fn length_name() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        12 => Just("Content-Length"),
        4 => Just("content-length"),
        1 => Just("CONTENT-LENGTH"),
        1 => Just("Content-Length "),
        1 => Just("Content_Length"),
    ]
}

fn coding_name() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        12 => Just("Transfer-Encoding"),
        4 => Just("transfer-encoding"),
        1 => Just("Transfer-Encoding "),
        1 => Just("Transfer-Encoding\t"),
    ]
}

/// Spellings of a length `n`.
const LENGTHS: &[fn(usize) -> String] = &[
    |n| n.to_string(),
    |n| format!("0{n}"),
    |n| format!("+{n}"),
    |n| format!("-{n}"),
    |n| format!("{n},{n}"),
    |n| format!("{n}, {n}"),
    |n| format!("{n}, {}", n + 1),
    |n| format!("{n},"),
    |n| format!("{n} {n}"),
    |n| format!("0x{n}"),
    |n| format!("{n}\u{a0}"),
    |n| format!("\u{85}{n}"),
    |_| String::new(),
    |_| u64::MAX.to_string(),
    |_| (u64::MAX - 2).to_string(),
    |_| "18446744073709551616".to_owned(),
];

/// A spelling of the length `n`: mostly plain.
fn length_value() -> impl Strategy<Value = fn(usize) -> String> {
    prop_oneof![
        12 => Just(LENGTHS[0]),
        3 => prop::sample::select(&LENGTHS[1..]),
    ]
}

fn coding_value() -> impl Strategy<Value = String> {
    prop_oneof![
        40 => Just("chunked"),
        1 => Just("Chunked"),
        1 => Just("CHUNKED"),
        1 => Just("chunked,"),
        1 => Just(",chunked"),
        1 => Just("chunked , "),
        1 => Just("chunked, identity"),
        1 => Just("identity, chunked"),
        1 => Just("gzip, chunked"),
        1 => Just("chunked, chunked"),
        1 => Just("xchunked"),
        1 => Just("chunked\x0b"),
        1 => Just("\x0bchunked"),
        1 => Just("identity"),
        1 => Just(""),
    ]
    .prop_map(str::to_owned)
}

/// A chunked body: chunks, the last chunk, trailers and the final line end, each mostly
/// well formed.
pub(super) fn chunked() -> BoxedStrategy<Part> {
    (
        prop::collection::vec(chunk(), 0..4),
        last_chunk(),
        prop::collection::vec(trailer(), 0..3),
        prop_oneof![16 => Just(&b"\r\n"[..]), 1 => Just(&b"\n"[..]), 1 => Just(&b""[..])],
    )
        .prop_map(|(chunks, last, trailers, end)| {
            join(
                chunks
                    .into_iter()
                    .chain([last])
                    .chain(trailers)
                    .chain([trailer_line_end(end)]),
            )
        })
        .boxed()
}

fn chunk() -> BoxedStrategy<Part> {
    (
        1usize..20,
        size_spelling(),
        extension(),
        line_end(),
        prop_oneof![16 => Just(0i8), 1 => Just(-1), 1 => Just(1)],
        prop_oneof![
            20 => Just(&b"\r\n"[..]),
            1 => Just(&b"\n"[..]),
            1 => Just(&b""[..]),
            1 => Just(&b"\rx"[..]),
        ],
    )
        .prop_map(
            |(len, (zeros, upper, space), (ext, tags), end, off, data_end)| {
                let (mut line, mut tags2) = spell_size(len as u64, zeros, upper, space);
                line.extend_from_slice(&ext);
                line.extend_from_slice(end);
                let sent = (len as i64 + i64::from(off)).max(0) as usize;
                line.extend((0..sent).map(|i| b'a' + (i % 26) as u8));
                line.extend_from_slice(data_end);
                tags2.extend(tags);
                (line, tags2)
            },
        )
        .boxed()
}

/// Leading zeros, upper-case hex, whitespace after the size.
fn size_spelling() -> impl Strategy<Value = (usize, bool, &'static str)> {
    (
        prop_oneof![16 => 0usize..3, 1 => 13usize..17],
        any::<bool>(),
        prop_oneof![12 => Just(""), 1 => Just(" "), 1 => Just("\t"), 1 => Just(" \t ")],
    )
}

fn spell_size(size: u64, zeros: usize, upper: bool, space: &str) -> Part {
    let hex = if upper {
        format!("{size:X}")
    } else {
        format!("{size:x}")
    };
    let digits = "0".repeat(zeros) + &hex;
    let tags = if digits.len() > 15 {
        vec![Stricter::ChunkSizeDigits]
    } else {
        Vec::new()
    };
    ((digits + space).into_bytes(), tags)
}

fn extension() -> BoxedStrategy<Part> {
    let long = |n: usize| {
        let mut ext = b";e=".to_vec();
        ext.resize(n, b'x');
        ext
    };
    prop_oneof![
        24 => Just(plain(b"")),
        2 => Just(plain(b";a")),
        2 => Just(plain(b";a=b")),
        1 => Just(plain(b";a=\"q;\\\"x\"")),
        1 => Just(plain(b" ; a = b")),
        1 => Just(plain(b";")),
        1 => Just((b";a=\x01".to_vec(), vec![Stricter::ExtensionControl])),
        1 => Just((b";a=\x7f".to_vec(), vec![Stricter::ExtensionControl])),
        1 => Just((b";a=\rb".to_vec(), Vec::new())),
        1 => Just((long(5000), vec![Stricter::ChunkLineLength])),
        1 => Just(plain(&long(4000))),
    ]
    .boxed()
}

fn last_chunk() -> BoxedStrategy<Part> {
    (
        prop_oneof![16 => 0usize..3, 1 => 13usize..17],
        extension(),
        line_end(),
    )
        .prop_map(|(zeros, (ext, ext_tags), end)| {
            let (mut line, mut tags) = spell_size(0, zeros, false, "");
            line.extend_from_slice(&ext);
            line.extend_from_slice(end);
            tags.extend(ext_tags);
            (line, tags)
        })
        .boxed()
}

const TRAILERS: &[&[u8]] = &[
    b"x-sum: 42",
    b"x-sum: 42",
    b"grpc-status: 0",
    b"content-length: 5",
    b"transfer-encoding: chunked",
    b"host: evil",
    b"set-cookie: a=1",
    b"x-nul: a\0b",
    b"x-fold: a\r\n b",
];

fn trailer() -> BoxedStrategy<Part> {
    (prop::sample::select(TRAILERS), line_end())
        .prop_map(|(line, end)| {
            let (end, tags) = trailer_line_end(end);
            ([line, &end].concat(), tags)
        })
        .boxed()
}

/// The end of a trailer line (or of the trailer section), which the hand-written side
/// may refuse if it is a bare LF.
fn trailer_line_end(end: &[u8]) -> Part {
    let tags = if end == b"\n" {
        vec![Stricter::TrailerLineEnd]
    } else {
        Vec::new()
    };
    (end.to_vec(), tags)
}

/// Bytes the upstream sends after the answer: mostly none.
fn after() -> impl Strategy<Value = &'static [u8]> {
    prop_oneof![
        12 => Just(&b""[..]),
        3 => prop::sample::select(AFTER),
    ]
}

const AFTER: &[&[u8]] = &[
    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    b"X",
    b"\r\n",
];

/// Where bytes arriving in several reads are cut: up to `max` cuts, in order, inside
/// `0..len`.
pub(super) fn cuts(max: usize) -> impl Strategy<Value = Vec<Index>> {
    prop::collection::vec(any::<Index>(), 0..=max)
}

/// `wire` cut at `cuts` into the reads it arrives in.
pub(super) fn split<'a>(wire: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c.index(wire.len() + 1)).collect();
    at.sort_unstable();
    at.dedup();
    let mut pieces = Vec::with_capacity(at.len() + 1);
    let mut start = 0;
    for cut in at {
        pieces.push(&wire[start..cut]);
        start = cut;
    }
    pieces.push(&wire[start..]);
    pieces.retain(|piece| !piece.is_empty());
    pieces
}
