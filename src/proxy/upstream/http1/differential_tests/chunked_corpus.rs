//! The corpus of the differential test, chunked bodies: chunk sizes, chunk lines and
//! their extensions, and trailer sections (RFC 9112 §7.1), each with the limits hyper
//! keeps on them.

use super::corpus::{case, chunked, Case, Expect, OK};
use super::Stricter;

/// A chunked body whose trailer section (from its first byte to its last) is `len` bytes.
fn trailers_of(len: usize) -> String {
    chunked(&format!("0\r\nx-a: {}\r\n\r\n", "a".repeat(len - 9)))
}

fn trailer_fields(n: usize) -> String {
    chunked(&format!("0\r\n{}\r\n", "x-a: 1\r\n".repeat(n)))
}

/// A `len`-byte chunk extension.
fn long_extension(len: usize) -> String {
    format!(";e={}", "x".repeat(len - 3))
}

/// A chunked body whose chunk extensions hold `total` bytes after their `;` (as hyper
/// counts them), in lines of at most 4 KiB.
fn extensions_of(mut total: usize) -> String {
    let mut body = String::new();
    while total > 0 {
        let len = total.min(4094);
        body += &format!("1{}\r\nh\r\n", long_extension(len + 1));
        total -= len;
    }
    chunked(&(body + "0\r\n\r\n"))
}

pub(super) fn cases() -> Vec<Case> {
    use Expect::{Cut, Kept, Whole};
    vec![
        // Chunk sizes and lines (RFC 9112 §7.1).
        case("chunk size bare LF", chunked("5\nhello\r\n0\r\n\r\n"), Cut),
        case("last chunk bare LFs", chunked("0\n\n"), Cut),
        case("chunk data bare LF", chunked("5\r\nhello\n0\r\n\r\n"), Cut),
        case(
            "chunk data without its CRLF",
            chunked("5\r\nhello0\r\n\r\n"),
            Cut,
        ),
        case("chunk data short", chunked("5\r\nhell\r\n0\r\n\r\n"), Cut),
        case("final CRLF missing", chunked("5\r\nhello\r\n0\r\n"), Cut),
        case(
            "final CR without LF",
            chunked("5\r\nhello\r\n0\r\n\rX"),
            Cut,
        ),
        case(
            "chunk size whitespace",
            chunked("5 \t\r\nhello\r\n0 \r\n\r\n"),
            Kept,
        ),
        case(
            "chunk size leading space",
            chunked(" 5\r\nhello\r\n0\r\n\r\n"),
            Cut,
        ),
        case("chunk size +5", chunked("+5\r\nhello\r\n0\r\n\r\n"), Cut),
        case("chunk size 0x5", chunked("0x5\r\nhello\r\n0\r\n\r\n"), Cut),
        case(
            "chunk size 15 digits",
            chunked("000000000000005\r\nhello\r\n0\r\n\r\n"),
            Kept,
        ),
        case(
            "chunk size 16 digits",
            chunked("0000000000000005\r\nhello\r\n0\r\n\r\n"),
            Kept,
        )
        .stricter(Stricter::ChunkSizeDigits),
        case("chunk size huge", chunked("fffffffffffffff\r\nhello"), Cut),
        case(
            "chunk size u64::MAX",
            chunked("ffffffffffffffff\r\nhello"),
            Cut,
        ),
        case(
            "chunk size overflow",
            chunked("1ffffffffffffffff\r\nhello\r\n0\r\n\r\n"),
            Cut,
        ),
        case(
            "chunk extensions",
            chunked("5;a;b=c;q=\"x;\\\"y\"\r\nhello\r\n0;last\r\n\r\n"),
            Kept,
        ),
        case(
            "chunk extension whitespace",
            chunked("5 ; a = b\r\nhello\r\n0\r\n\r\n"),
            Kept,
        ),
        case(
            "chunk extension 4000 bytes",
            chunked(&format!("5{}\r\nhello\r\n0\r\n\r\n", long_extension(4000))),
            Kept,
        ),
        case(
            "chunk extension 5000 bytes",
            chunked(&format!("5{}\r\nhello\r\n0\r\n\r\n", long_extension(5000))),
            Kept,
        )
        .stricter(Stricter::ChunkLineLength),
        case(
            "chunk extensions of 20 KB in all",
            extensions_of(5 * 3999),
            Cut,
        ),
        case(
            "chunk extensions of 16383 bytes in all",
            extensions_of(16383),
            Kept,
        ),
        case(
            "chunk extensions of 16384 bytes in all",
            extensions_of(16384),
            Cut,
        ),
        case(
            "chunk extension with a control character",
            chunked("5;a=\x01\r\nhello\r\n0\r\n\r\n"),
            Kept,
        )
        .stricter(Stricter::ExtensionControl),
        case(
            "chunk extension with a bare LF",
            chunked("5;a\nb\r\nhello\r\n0\r\n\r\n"),
            Cut,
        ),
        case(
            "chunk extension with a bare CR",
            chunked("5;a\rb\r\nhello\r\n0\r\n\r\n"),
            Cut,
        ),
        // Trailers (RFC 9112 §7.1.2, RFC 9110 §6.5).
        case(
            "trailers with forbidden fields",
            chunked(
                "5\r\nhello\r\n0\r\nx-sum: 42\r\ncontent-length: 5\r\nhost: evil\r\n\
                 set-cookie: a=1\r\ntransfer-encoding: chunked\r\ngrpc-status: 0\r\n\r\n",
            ),
            Kept,
        ),
        case(
            "trailers apart by a bare LF",
            chunked("0\r\nx-a: 1\nx-b: 2\r\n\r\n"),
            Cut,
        ),
        case(
            "trailer ended by a bare LF",
            chunked("0\r\nx-a: 1\n\r\n\r\n"),
            Kept,
        )
        .stricter(Stricter::TrailerLineEnd),
        case(
            "trailers after a bare LF",
            chunked(&format!("0\r\n\n{OK}content-length: 4\r\n\r\nevil")),
            Whole,
        )
        .stricter(Stricter::TrailerLineEnd),
        case("trailers of 16383 bytes", trailers_of(16383), Kept),
        case("trailers of 16384 bytes", trailers_of(16384), Cut),
        case("trailers of 16388 bytes", trailers_of(16388), Cut),
        case("100 trailers", trailer_fields(100), Kept),
        case("101 trailers", trailer_fields(101), Cut),
        case("trailer with NUL", chunked("0\r\nx-a: a\0b\r\n\r\n"), Cut),
        case(
            "trailer obs-fold",
            chunked("0\r\nx-a: a\r\n b\r\n\r\n"),
            Cut,
        ),
        case("trailer without a colon", chunked("0\r\nx-a\r\n\r\n"), Cut),
    ]
}
