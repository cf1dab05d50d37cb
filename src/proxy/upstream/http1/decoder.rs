//! The answer body, sans IO: a [`Decoder`] for the body's [`Framing`] takes data and
//! trailer frames off the front of the bytes read from the upstream ([`Decoder::step`]),
//! and says when the body has ended, so that nothing past its end is ever taken for body
//! (RFC 9112 §6, §7.1).

use std::io;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::Frame;

use super::head::{invalid, Framing, MAX_HEADERS};
use crate::proxy::headers::is_forwardable_trailer;

/// A chunk-size line, extensions included.
pub(crate) const MAX_CHUNK_LINE: usize = 4096;
/// The chunk extensions of a body, in all, are shorter than this: hyper's limit (it counts
/// the bytes after each `;`).
pub(crate) const MAX_EXTENSIONS: u64 = 16 * 1024;
/// A chunked body's trailer section, from its first byte to its last, is shorter than
/// this: hyper's limit.
pub(crate) const MAX_TRAILERS: usize = 16 * 1024;

/// Where in a body the decoder is, and how many bytes of chunk extensions it has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decoder {
    state: State,
    extensions: u64,
}

/// Where in a body a [`Decoder`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// This many body bytes are still to come.
    Length(u64),
    /// Expecting a chunk-size line.
    ChunkSize,
    /// This many bytes of the current chunk are still to come.
    ChunkData(u64),
    /// Expecting the CRLF after a chunk's data.
    ChunkEnd,
    /// Expecting the trailer section after the last chunk.
    Trailers,
    /// Everything until the upstream closes.
    UntilClose,
    /// The body has ended.
    Done,
}

/// What one [`Decoder::step`] found.
#[derive(Debug)]
pub(crate) enum Step {
    /// A data frame, or the trailers (which end the body).
    Frame(Frame<Bytes>),
    /// The bytes there are end inside the body: read more (or [`Decoder::at_eof`]).
    NeedMore,
    /// The body has ended; what is left in the buffer is past it.
    Done,
    /// The body is malformed: the connection is out of step and must be closed.
    Failed(io::Error),
}

impl Decoder {
    /// The decoder for `framing` (`Empty` and `Upgrade` have no body).
    pub(crate) fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Upgrade | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize,
            Framing::Close => State::UntilClose,
        };
        Self {
            state,
            extensions: 0,
        }
    }

    /// Whether the body has ended.
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Bytes still to come, when the framing says.
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Length(n) => Some(n),
            State::Done => Some(0),
            _ => None,
        }
    }

    /// The upstream closed the connection with the decoder here: the end of a body read
    /// to close, and an error anywhere else (the body was cut short).
    pub(crate) fn at_eof(&mut self) -> io::Result<()> {
        match self.state {
            State::UntilClose | State::Done => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the upstream closed the connection mid-body",
            )),
        }
    }

    /// Takes the next frame off the front of `read`. Bytes are consumed only as far as
    /// the body goes: a chunk line, trailer section or CRLF that is not whole yet is left
    /// for the next step, and nothing past the body's end is touched.
    pub(crate) fn step(&mut self, read: &mut BytesMut) -> Step {
        loop {
            match self.state {
                State::Done => return Step::Done,
                State::Length(remaining) | State::ChunkData(remaining) => {
                    if read.is_empty() {
                        return Step::NeedMore;
                    }
                    let n = (read.len() as u64).min(remaining) as usize;
                    let data = read.split_to(n).freeze();
                    let left = remaining - n as u64;
                    self.state = match (self.state, left) {
                        (State::Length(_), 0) => State::Done,
                        (State::Length(_), left) => State::Length(left),
                        (_, 0) => State::ChunkEnd,
                        (_, left) => State::ChunkData(left),
                    };
                    return Step::Frame(Frame::data(data));
                }
                State::UntilClose => {
                    if read.is_empty() {
                        return Step::NeedMore;
                    }
                    return Step::Frame(Frame::data(read.split().freeze()));
                }
                State::ChunkSize => {
                    let Some(end) = find_crlf(read, MAX_CHUNK_LINE) else {
                        if read.len() > MAX_CHUNK_LINE {
                            return Step::Failed(invalid(
                                "the upstream sent an overlong chunk line",
                            ));
                        }
                        return Step::NeedMore;
                    };
                    let size = match parse_chunk_size(&read[..end]) {
                        Ok(size) => size,
                        Err(e) => return Step::Failed(e),
                    };
                    self.extensions += extension_len(&read[..end]);
                    if self.extensions >= MAX_EXTENSIONS {
                        return Step::Failed(invalid(
                            "the upstream sent overlong chunk extensions",
                        ));
                    }
                    read.advance(end + 2);
                    self.state = if size == 0 {
                        State::Trailers
                    } else {
                        State::ChunkData(size)
                    };
                }
                State::ChunkEnd => {
                    if read.len() < 2 {
                        if read.first().is_some_and(|&b| b != b'\r') {
                            return Step::Failed(invalid(
                                "the upstream sent a chunk without its CRLF",
                            ));
                        }
                        return Step::NeedMore;
                    }
                    if &read[..2] != b"\r\n" {
                        return Step::Failed(invalid("the upstream sent a chunk without its CRLF"));
                    }
                    read.advance(2);
                    self.state = State::ChunkSize;
                }
                State::Trailers => {
                    if read.len() < 2 {
                        return Step::NeedMore;
                    }
                    if &read[..2] == b"\r\n" {
                        read.advance(2);
                        self.state = State::Done;
                        continue;
                    }
                    let window = &read[..read.len().min(MAX_TRAILERS - 1)];
                    let Some(end) = window.windows(4).position(|w| w == b"\r\n\r\n") else {
                        if read.len() >= MAX_TRAILERS - 1 {
                            return Step::Failed(invalid("the upstream sent overlong trailers"));
                        }
                        return Step::NeedMore;
                    };
                    let trailers = match parse_trailers(&read[..end + 4]) {
                        Ok(trailers) => trailers,
                        Err(e) => return Step::Failed(e),
                    };
                    read.advance(end + 4);
                    self.state = State::Done;
                    return Step::Frame(Frame::trailers(trailers));
                }
            }
        }
    }
}

/// Where the first CRLF is, looking at most `limit` bytes in.
fn find_crlf(read: &[u8], limit: usize) -> Option<usize> {
    let window = &read[..read.len().min(limit + 2)];
    window.windows(2).position(|w| w == b"\r\n")
}

/// `chunk-size [ chunk-ext ]` (RFC 9112 §7.1): hex digits, then optionally whitespace and
/// extensions, which are ignored but may not hold a control character (a bare LF there
/// would be a line end to another parser).
pub(crate) fn parse_chunk_size(line: &[u8]) -> io::Result<u64> {
    let bad = || invalid("the upstream sent an invalid chunk size");
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return Err(bad());
    }
    let rest = &line[digits..];
    let rest_ok = match rest.iter().position(|&b| b != b' ' && b != b'\t') {
        None => true,
        Some(i) => {
            rest[i] == b';'
                && rest[i..]
                    .iter()
                    .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
        }
    };
    if !rest_ok {
        return Err(bad());
    }
    let digits = std::str::from_utf8(&line[..digits]).map_err(|_| bad())?;
    u64::from_str_radix(digits, 16).map_err(|_| bad())
}

/// The bytes of a valid chunk line's extensions after their first `;`, as hyper counts
/// them.
fn extension_len(line: &[u8]) -> u64 {
    line.iter()
        .position(|&b| b == b';')
        .map_or(0, |semicolon| (line.len() - semicolon - 1) as u64)
}

/// A trailer section (its final empty line included), less the fields only a header
/// section may carry ([`is_forwardable_trailer`]). Its lines end in CRLF, as chunk lines
/// do: hyper counts trailer lines by their CRLF and refuses more fields than that, so a
/// bare LF between two fields would have the section read two ways.
fn parse_trailers(section: &[u8]) -> io::Result<HeaderMap> {
    let bare_lf = section
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || section[i - 1] != b'\r'));
    if bare_lf {
        return Err(invalid("the upstream ended a trailer line with a bare LF"));
    }
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match httparse::parse_headers(section, &mut fields) {
        Ok(httparse::Status::Complete((_, fields))) => {
            let mut trailers = HeaderMap::with_capacity(fields.len());
            for field in fields {
                let name = HeaderName::from_bytes(field.name.as_bytes())
                    .map_err(|_| invalid("the upstream sent an invalid trailer name"))?;
                let value = HeaderValue::from_bytes(field.value)
                    .map_err(|_| invalid("the upstream sent an invalid trailer value"))?;
                if is_forwardable_trailer(&name) {
                    trailers.append(name, value);
                }
            }
            Ok(trailers)
        }
        _ => Err(invalid("the upstream sent malformed trailers")),
    }
}

#[cfg(test)]
#[path = "decoder/tests.rs"]
mod tests;
