//! The corpus of the differential test: upstream answers built around the constructs that
//! HTTP/1.1 parsers have read differently, each with what hyper's client (the reference)
//! makes of it, so that the corpus also says, in one place, what the proxy does with each.
//! Heads, framing fields and connections here; chunked bodies in `chunked_corpus`.

use http::Method;

use super::harness::{Next, Outcome};
use super::Stricter;

/// One answer of the corpus.
pub(super) struct Case {
    pub name: &'static str,
    pub method: Method,
    pub wire: Vec<u8>,
    /// What hyper's client makes of it.
    pub expect: Expect,
    /// Why the hand-written side may refuse it although hyper takes it.
    pub stricter: Vec<Stricter>,
}

/// What hyper's client makes of an answer.
#[derive(Debug, Clone, Copy)]
pub(super) enum Expect {
    /// The answer whole, and the connection carries the next request.
    Kept,
    /// The answer whole, and the connection is not used again.
    Whole,
    /// The head taken, the body failed.
    Cut,
    /// No answer.
    Refused,
}

impl Expect {
    /// Whether `outcome` is this; else what it is.
    pub(super) fn holds(self, outcome: &Outcome) -> Result<(), &'static str> {
        let found = match outcome {
            Outcome::Refused => Self::Refused,
            Outcome::Answer(answer) => match (&answer.body, &answer.next) {
                (None, _) => Self::Cut,
                (Some(_), Next::Answered(..)) => Self::Kept,
                (Some(_), Next::Closed) => Self::Whole,
            },
        };
        if std::mem::discriminant(&found) == std::mem::discriminant(&self) {
            Ok(())
        } else {
            Err(match found {
                Self::Kept => "kept the connection",
                Self::Whole => "took the answer and closed",
                Self::Cut => "failed the body",
                Self::Refused => "refused the answer",
            })
        }
    }
}

pub(super) fn case(name: &'static str, wire: impl AsRef<[u8]>, expect: Expect) -> Case {
    Case {
        name,
        method: Method::GET,
        wire: wire.as_ref().to_vec(),
        expect,
        stricter: Vec::new(),
    }
}

impl Case {
    fn to(mut self, method: Method) -> Self {
        self.method = method;
        self
    }

    pub(super) fn stricter(mut self, why: Stricter) -> Self {
        self.stricter.push(why);
        self
    }
}

pub(super) const OK: &str = "HTTP/1.1 200 OK\r\n";
const CHUNKED: &str = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";

pub(super) fn chunked(body: &str) -> String {
    format!("{CHUNKED}{body}")
}

/// `n` interim answers, cycling through 100, 102 and 103, before `last`.
fn interims(n: usize, last: &str) -> String {
    let mut wire = String::new();
    for i in 0..n {
        wire += [
            "HTTP/1.1 100 Continue\r\n\r\n",
            "HTTP/1.1 102 Processing\r\n\r\n",
        ][i % 2];
        if i % 3 == 0 {
            wire += "HTTP/1.1 103 Early Hints\nlink: </s.css>; rel=preload\n\n";
        }
    }
    wire + last
}

/// A head whose one field is `len` bytes long.
fn long_head(len: usize) -> Vec<u8> {
    let mut wire = format!("{OK}x-long: ").into_bytes();
    wire.resize(wire.len() + len, b'a');
    wire.extend_from_slice(b"\r\ncontent-length: 0\r\n\r\n");
    wire
}

fn fields(n: usize) -> String {
    let mut wire = OK.to_owned();
    for i in 0..n - 1 {
        wire += &format!("x-{i}: {i}\r\n");
    }
    wire + "content-length: 0\r\n\r\n"
}

pub(super) fn cases() -> Vec<Case> {
    use Expect::{Cut, Kept, Refused, Whole};
    let mut cases = vec![
        // Content-Length (RFC 9112 §6.3 rule 5, RFC 9110 §8.6).
        case(
            "length",
            format!("{OK}Content-Length: 5\r\n\r\nhello"),
            Kept,
        ),
        case("length 0", format!("{OK}Content-Length: 0\r\n\r\n"), Kept),
        case(
            "length 01",
            format!("{OK}Content-Length: 01\r\n\r\nh"),
            Kept,
        ),
        case(
            "length +1",
            format!("{OK}Content-Length: +1\r\n\r\nh"),
            Refused,
        ),
        case(
            "length -1",
            format!("{OK}Content-Length: -1\r\n\r\nh"),
            Refused,
        ),
        case(
            "length 0x1",
            format!("{OK}Content-Length: 0x1\r\n\r\nh"),
            Refused,
        ),
        case(
            "length 1,1",
            format!("{OK}Content-Length: 1,1\r\n\r\nh"),
            Kept,
        ),
        case(
            "length 1, 1",
            format!("{OK}Content-Length: 1, 1\r\n\r\nh"),
            Kept,
        ),
        case(
            "length 1, 2",
            format!("{OK}Content-Length: 1, 2\r\n\r\nhi"),
            Refused,
        ),
        case(
            "length 1,",
            format!("{OK}Content-Length: 1,\r\n\r\nh"),
            Refused,
        ),
        case(
            "length 1 1",
            format!("{OK}Content-Length: 1 1\r\n\r\nh"),
            Refused,
        ),
        case(
            "length empty",
            format!("{OK}Content-Length:\r\n\r\nh"),
            Refused,
        ),
        case(
            "length tabs",
            format!("{OK}Content-Length:\t1\t\r\n\r\nh"),
            Kept,
        ),
        case(
            "length and a no-break space",
            [
                format!("{OK}Content-Length: 1").as_bytes(),
                b"\xc2\xa0\r\n\r\nh",
            ]
            .concat(),
            Refused,
        ),
        case(
            "length after a next-line character",
            [
                format!("{OK}Content-Length: ").as_bytes(),
                b"\xc2\x851\r\n\r\nh",
            ]
            .concat(),
            Refused,
        ),
        case(
            "length after an em space",
            [
                format!("{OK}Content-Length: ").as_bytes(),
                b"\xe2\x80\x831\r\n\r\nh",
            ]
            .concat(),
            Refused,
        ),
        case(
            "length twice equal",
            format!("{OK}Content-Length: 1\r\nContent-Length: 1\r\n\r\nh"),
            Kept,
        ),
        case(
            "length twice different",
            format!("{OK}Content-Length: 1\r\nContent-Length: 2\r\n\r\nhi"),
            Refused,
        ),
        case(
            "length beyond u64",
            format!("{OK}Content-Length: 18446744073709551616\r\n\r\nh"),
            Refused,
        ),
        case(
            "length u64::MAX",
            format!("{OK}Content-Length: 18446744073709551615\r\n\r\nh"),
            Refused,
        ),
        case(
            "length the largest hyper takes, cut short",
            format!("{OK}Content-Length: 18446744073709551613\r\n\r\nh"),
            Cut,
        ),
        case(
            "length space before the colon",
            format!("{OK}Content-Length : 1\r\n\r\nh"),
            Refused,
        ),
        case(
            "length cut short",
            format!("{OK}Content-Length: 10\r\n\r\nhello"),
            Cut,
        ),
        // Transfer-Encoding (RFC 9112 §6.1, §6.3 rules 3 and 4).
        case("chunked", chunked("5\r\nhello\r\n0\r\n\r\n"), Kept),
        case("chunked empty", chunked("0\r\n\r\n"), Kept),
        case(
            "Chunked upper case",
            format!("{OK}Transfer-Encoding: CHUNKED\r\n\r\n1\r\nh\r\n0\r\n\r\n"),
            Kept,
        ),
        case(
            "coding space before the colon",
            format!("{OK}Transfer-Encoding : chunked\r\n\r\n1\r\nh\r\n0\r\n\r\n"),
            Refused,
        ),
        case(
            "coding after a vertical tab",
            format!("{OK}Transfer-Encoding: \x0bchunked\r\n\r\n1\r\nh\r\n0\r\n\r\n"),
            Refused,
        ),
        case(
            "coding xchunked",
            format!("{OK}Transfer-Encoding: xchunked\r\n\r\n1\r\nh\r\n0\r\n\r\n"),
            Refused,
        ),
        case(
            "codings chunked, identity",
            format!("{OK}Transfer-Encoding: chunked, identity\r\n\r\n1\r\nh\r\n0\r\n\r\n"),
            Refused,
        ),
        case(
            "codings identity, chunked",
            format!("{OK}Transfer-Encoding: identity, chunked\r\n\r\n1\r\nh\r\n0\r\n\r\n"),
            Refused,
        ),
        case(
            "codings chunked, (an empty last item)",
            format!("{OK}Transfer-Encoding: chunked,\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            Refused,
        ),
        case(
            "coding fields chunked then empty",
            format!(
                "{OK}Transfer-Encoding: chunked\r\nTransfer-Encoding:\r\n\r\n\
                 5\r\nhello\r\n0\r\n\r\n"
            ),
            Refused,
        ),
        case(
            "codings , chunked",
            format!("{OK}Transfer-Encoding: , chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            Kept,
        ),
        case(
            "coding fields gzip then chunked",
            format!(
                "{OK}Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n\
                 1\r\nh\r\n0\r\n\r\n"
            ),
            Refused,
        ),
        case(
            "coding fields chunked twice",
            format!(
                "{OK}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n\
                 1\r\nh\r\n0\r\n\r\n"
            ),
            Refused,
        ),
        case(
            "chunked then a length",
            format!(
                "{OK}Transfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n1\r\nh\r\n0\r\n\r\n"
            ),
            Refused,
        ),
        case(
            "a length then chunked",
            format!(
                "{OK}Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nh\r\n0\r\n\r\n"
            ),
            Refused,
        ),
        case(
            "chunked in HTTP/1.0",
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nh\r\n0\r\n\r\n",
            Refused,
        ),
        // Line ends and field values (RFC 9112 §2.2, §5).
        case(
            "bare LF head",
            "HTTP/1.1 200 OK\nContent-Length: 2\n\nhi",
            Kept,
        ),
        case(
            "NUL in a value",
            format!("{OK}x-a: a\0b\r\ncontent-length: 0\r\n\r\n"),
            Refused,
        ),
        case(
            "CTL in a value",
            format!("{OK}x-a: a\x01b\r\ncontent-length: 0\r\n\r\n"),
            Refused,
        ),
        case(
            "DEL in a value",
            format!("{OK}x-a: a\x7fb\r\ncontent-length: 0\r\n\r\n"),
            Refused,
        ),
        case(
            "obs-text in a value",
            [
                format!("{OK}x-a: caf").as_bytes(),
                b"\xe9 \xff\r\ncontent-length: 0\r\n\r\n",
            ]
            .concat(),
            Kept,
        ),
        case(
            "obs-fold",
            format!("{OK}x-a: a\r\n b\r\ncontent-length: 0\r\n\r\n"),
            Refused,
        ),
        case(
            "bare CR in the head",
            format!("{OK}x-a: a\rb\r\n\r\n"),
            Refused,
        ),
        // Interim answers (RFC 9110 §15.2).
        case(
            "100 then the answer",
            interims(1, &format!("{OK}content-length: 1\r\n\r\nh")),
            Kept,
        ),
        case(
            "1xx storm",
            interims(300, &format!("{OK}content-length: 1\r\n\r\nh")),
            Kept,
        ),
        case(
            "199",
            format!("HTTP/1.1 199 X\r\n\r\n{OK}content-length: 1\r\n\r\nh"),
            Kept,
        ),
        case("1xx then a close", interims(3, ""), Refused),
        case(
            "101 unasked",
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
            Refused,
        ),
        // Bodiless answers (RFC 9112 §6.3 rule 1).
        case(
            "HEAD with a length",
            format!("{OK}content-length: 5\r\n\r\n"),
            Kept,
        )
        .to(Method::HEAD),
        case(
            "HEAD with a length and a body",
            format!("{OK}content-length: 5\r\n\r\nhello"),
            Whole,
        )
        .to(Method::HEAD),
        case("HEAD chunked", CHUNKED, Kept).to(Method::HEAD),
        case(
            "204 with a length and a body",
            "HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello",
            Whole,
        ),
        case(
            "204 chunked with a body",
            "HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            Whole,
        ),
        case(
            "304 with a length",
            "HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n",
            Kept,
        ),
        case(
            "304 with a length that is no number",
            "HTTP/1.1 304 Not Modified\r\ncontent-length: x\r\n\r\n",
            Kept,
        ),
        // Bodies read to the close (rule 8) and connections (RFC 9112 §9.3).
        case(
            "no length, ends by close",
            format!("{OK}\r\nall of it"),
            Whole,
        ),
        case(
            "HTTP/1.0 to the close",
            "HTTP/1.0 200 OK\r\n\r\nall of it",
            Whole,
        ),
        case(
            "HTTP/1.0 keep-alive",
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\nh",
            Kept,
        ),
        case(
            "HTTP/1.0 keep-alive beside obs-text",
            &b"HTTP/1.0 200 OK\r\nconnection: keep-alive, caf\xe9\r\ncontent-length: 1\r\n\r\nh"[..],
            Whole,
        ),
        case(
            "close beside obs-text",
            &b"HTTP/1.1 200 OK\r\nconnection: close, caf\xe9\r\ncontent-length: 1\r\n\r\nh"[..],
            Whole,
        ),
        case(
            "HTTP/1.0 length",
            "HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\nh",
            Whole,
        ),
        case(
            "connection: close",
            format!("{OK}connection: close\r\ncontent-length: 1\r\n\r\nh"),
            Whole,
        ),
        case(
            "connection: keep-alive, close",
            format!(
                "{OK}connection: keep-alive\r\nconnection: close\r\ncontent-length: 1\r\n\r\nh"
            ),
            Whole,
        ),
        // Bytes past the answer (a desynchronised connection).
        case(
            "pipelined answer after a length",
            format!("{OK}content-length: 1\r\n\r\nh{OK}content-length: 4\r\n\r\nevil"),
            Whole,
        ),
        case(
            "pipelined answer after chunks",
            chunked(&format!(
                "1\r\nh\r\n0\r\n\r\n{OK}content-length: 4\r\n\r\nevil"
            )),
            Whole,
        ),
        case(
            "a CRLF after the answer",
            format!("{OK}content-length: 1\r\n\r\nh\r\n"),
            Whole,
        ),
        case(
            "one byte too many",
            format!("{OK}content-length: 1\r\n\r\nhi"),
            Whole,
        ),
        // Status lines and heads (RFC 9112 §4) and the limits hyper keeps.
        case("no answer", "", Refused),
        case("status 2000", "HTTP/1.1 2000 OK\r\n\r\n", Refused),
        case(
            "status 099",
            "HTTP/1.1 099 X\r\ncontent-length: 0\r\n\r\n",
            Refused,
        ),
        case(
            "HTTP/2 status line",
            "HTTP/2 200 OK\r\ncontent-length: 0\r\n\r\n",
            Refused,
        ),
        case("HTTP/0.9", "hello", Refused),
        case(
            "status without a reason",
            "HTTP/1.1 200\r\ncontent-length: 0\r\n\r\n",
            Kept,
        ),
        case("100 fields", fields(100), Kept),
        case("101 fields", fields(101), Refused),
        case("a head of 400 KB", long_head(400 * 1024), Kept),
        case(
            "a head past hyper's buffer in one read",
            long_head(420 * 1024),
            Kept,
        )
        .stricter(Stricter::HeadSize),
    ];
    cases.extend(super::chunked_corpus::cases());
    cases
}
