//! Fuzzing of the hand-written client's answer parsing (issue 24), bounded to run inside
//! `cargo test`: the answer-head parser and the body decoder are fed answers of the
//! grammar (`answer_grammar`), mangled, and random bytes, arriving in reads cut at
//! random. On every call they must keep their contract:
//!
//! - no panic;
//! - `parse_head` takes a whole head, exactly its bytes, or leaves the buffer as it was
//!   (incomplete or refused), and never waits with `MAX_HEAD` bytes or more buffered;
//! - `Decoder::step` only ever takes bytes off the front, hands on as data only bytes it
//!   took, takes nothing once the body is done, and never waits with more than a trailer
//!   section's limit buffered;
//! - the result is the same however the bytes were cut into reads.

use bytes::BytesMut;
use http::{Method, StatusCode, Version};
use proptest::prelude::*;
use proptest::sample::Index;

use super::answer_grammar::{self, split};
use super::decoder::{Decoder, Step, MAX_TRAILERS};
use super::head::{parse_head, Framing, Head, MAX_HEAD};

/// What a head parse gave, for comparing one way of reading with another.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Parsed {
    status: StatusCode,
    version: Version,
    fields: Vec<(String, Vec<u8>)>,
    framing: Framing,
    keep_alive: bool,
    /// Where in the bytes the head ended.
    end: usize,
}

/// How reading heads off some bytes ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Heads {
    /// The final head (after any interim ones).
    Final(Vec<Parsed>),
    /// Refused, after the interim heads taken.
    Refused(Vec<Parsed>),
    /// The bytes ended inside a head.
    Incomplete(Vec<Parsed>),
}

fn parsed(head: &Head, end: usize) -> Parsed {
    Parsed {
        status: head.parts.status,
        version: head.parts.version,
        fields: head
            .parts
            .headers
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
            .collect(),
        framing: head.framing,
        keep_alive: head.keep_alive,
        end,
    }
}

/// Reads heads off `reads` as the connection does (interim ones skipped), checking the
/// parser's contract on every call.
fn read_heads(method: &Method, reads: &[&[u8]]) -> Heads {
    let mut read = BytesMut::new();
    let mut fed = 0;
    let mut heads = Vec::new();
    for bytes in reads {
        read.extend_from_slice(bytes);
        fed += bytes.len();
        loop {
            let before = read.clone();
            match parse_head(&mut read, method) {
                Ok(None) => {
                    assert_eq!(read, before, "an incomplete head left the buffer changed");
                    assert!(read.len() < MAX_HEAD, "waiting with {} bytes", read.len());
                    break;
                }
                Err(_) => {
                    assert_eq!(read, before, "a refused head left the buffer changed");
                    return Heads::Refused(heads);
                }
                Ok(Some(head)) => {
                    let taken = before.len() - read.len();
                    assert!(taken <= MAX_HEAD, "a head of {taken} bytes");
                    assert_eq!(&before[taken..], &read[..], "bytes past the head touched");
                    // Exactly the head's bytes: parsed alone they are the same head, whole.
                    let mut alone = BytesMut::from(&before[..taken]);
                    let again = parse_head(&mut alone, method)
                        .expect("the head alone parses")
                        .expect("the head alone is whole");
                    assert!(alone.is_empty(), "the head alone was not all taken");
                    let end = fed - read.len();
                    assert_eq!(parsed(&again, end), parsed(&head, end));
                    heads.push(parsed(&head, end));
                    let status = head.parts.status;
                    if !(status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS) {
                        return Heads::Final(heads);
                    }
                }
            }
        }
    }
    Heads::Incomplete(heads)
}

/// How decoding a body off some bytes ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ending {
    /// The framing ended the body this many bytes in.
    Done(usize),
    /// The body was malformed.
    Failed,
    /// The bytes ended, and with them a body read to the close.
    Closed,
    /// The bytes ended inside the body.
    CutShort,
}

/// What decoding a body gave: its data, its trailers and how it ended.
type Decoded = (Vec<u8>, Option<Vec<(String, Vec<u8>)>>, Ending);

/// Decodes a body framed by `framing` off `reads`, checking the decoder's contract on
/// every step.
fn decode(framing: Framing, reads: &[&[u8]]) -> Decoded {
    let mut decoder = Decoder::new(framing);
    let mut read = BytesMut::new();
    let (mut fed, mut data, mut trailers) = (0, Vec::new(), None);
    for bytes in reads {
        read.extend_from_slice(bytes);
        fed += bytes.len();
        loop {
            let before = read.clone();
            let step = decoder.step(&mut read);
            assert!(
                before.ends_with(&read),
                "bytes taken from elsewhere than the front"
            );
            let taken = &before[..before.len() - read.len()];
            match step {
                Step::Frame(frame) => match frame.into_data() {
                    Ok(chunk) => {
                        assert!(taken.ends_with(&chunk), "data that was not taken");
                        data.extend_from_slice(&chunk);
                    }
                    Err(frame) => {
                        let map = frame.into_trailers().expect("data or trailers");
                        trailers = Some(
                            map.iter()
                                .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                                .collect(),
                        );
                    }
                },
                Step::Done => {
                    // It may take the last CRLF; once done, it takes nothing.
                    let after = read.clone();
                    assert!(matches!(decoder.step(&mut read), Step::Done));
                    assert_eq!(read, after, "bytes taken past the body's end");
                    return (data, trailers, Ending::Done(fed - read.len()));
                }
                Step::Failed(_) => return (data, trailers, Ending::Failed),
                Step::NeedMore => {
                    assert!(
                        read.len() < MAX_TRAILERS,
                        "waiting with {} bytes",
                        read.len()
                    );
                    break;
                }
            }
        }
    }
    if let Framing::Length(n) = framing {
        assert!(data.len() as u64 <= n, "more data than the length");
    }
    let ending = match decoder.at_eof() {
        Ok(()) if decoder.is_done() && framing == Framing::Close => Ending::Closed,
        Ok(()) => Ending::Done(fed - read.len()),
        Err(_) => Ending::CutShort,
    };
    (data, trailers, ending)
}

/// `wire` with up to three bytes replaced, inserted or removed.
fn mangled(wire: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let edit = (
        0u8..3,
        any::<Index>(),
        prop::sample::select(&b"\r\n\0 \t:;,0a\x7f\xff"[..]),
    );
    (wire, prop::collection::vec(edit, 0..4)).prop_map(|(mut wire, edits)| {
        for (kind, at, byte) in edits {
            let at = at.index(wire.len() + 1);
            match kind {
                0 if at < wire.len() => wire[at] = byte,
                1 => wire.insert(at, byte),
                _ if at < wire.len() => drop(wire.remove(at)),
                _ => {}
            }
        }
        wire
    })
}

fn heads_input() -> impl Strategy<Value = (Method, Vec<u8>)> {
    prop_oneof![
        4 => answer_grammar::answer().prop_flat_map(|a| (Just(a.method), mangled(Just(a.wire)))),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| (Method::GET, b)),
        1 => prop::collection::vec(any::<u8>(), 0..64)
            .prop_map(|b| (Method::GET, [&b"HTTP/1.1 200 OK\r\n"[..], &b].concat())),
    ]
}

fn body_input() -> impl Strategy<Value = (Framing, Vec<u8>)> {
    let junk = prop::collection::vec(any::<u8>(), 0..8);
    prop_oneof![
        4 => (mangled(answer_grammar::chunked().prop_map(|(wire, _)| wire)), junk)
            .prop_map(|(body, junk)| (Framing::Chunked, [body, junk].concat())),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| (Framing::Chunked, b)),
        1 => (0u64..40, prop::collection::vec(any::<u8>(), 0..48))
            .prop_map(|(n, b)| (Framing::Length(n), b)),
        1 => prop::collection::vec(any::<u8>(), 0..48).prop_map(|b| (Framing::Close, b)),
    ]
}

/// The reads to try: whole, byte by byte, and cut at random.
fn readings<'a>(wire: &'a [u8], cuts: &[Vec<Index>]) -> Vec<Vec<&'a [u8]>> {
    let mut readings = vec![vec![wire], wire.chunks(1).collect()];
    readings.extend(cuts.iter().map(|cuts| split(wire, cuts)));
    readings
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1024,
        ..ProptestConfig::default()
    })]

    #[test]
    fn heads_parse_the_same_however_the_bytes_arrive(
        (method, wire) in heads_input(),
        cuts in prop::collection::vec(answer_grammar::cuts(8), 4),
    ) {
        let readings = readings(&wire, &cuts);
        let whole = read_heads(&method, &readings[0]);
        for reads in &readings[1..] {
            prop_assert_eq!(&read_heads(&method, reads), &whole, "in {} reads", reads.len());
        }
    }

    #[test]
    fn bodies_decode_the_same_however_the_bytes_arrive(
        (framing, wire) in body_input(),
        cuts in prop::collection::vec(answer_grammar::cuts(8), 4),
    ) {
        let readings = readings(&wire, &cuts);
        let whole = decode(framing, &readings[0]);
        for reads in &readings[1..] {
            prop_assert_eq!(&decode(framing, reads), &whole, "in {} reads", reads.len());
        }
    }
}

#[test]
fn a_head_growing_past_the_limit_is_refused_before_it_is_whole() {
    // An upstream that never ends its head: at most MAX_HEAD bytes are ever held.
    let mut read = BytesMut::from(&b"HTTP/1.1 200 OK\r\nx-long: "[..]);
    let result = loop {
        match parse_head(&mut read, &Method::GET) {
            Ok(None) => read.extend_from_slice(&[b'a'; 4096]),
            other => break other,
        }
    };
    assert!(result.is_err());
    assert!(read.len() < MAX_HEAD + 4096);
}

#[test]
fn a_chunk_line_or_trailers_growing_past_the_limit_fail_before_they_are_whole() {
    for start in [&b"5;"[..], b"0\r\nx-a: "] {
        let mut decoder = Decoder::new(Framing::Chunked);
        let mut read = BytesMut::from(start);
        let step = loop {
            match decoder.step(&mut read) {
                Step::NeedMore => read.extend_from_slice(&[b'a'; 512]),
                other => break other,
            }
        };
        assert!(matches!(step, Step::Failed(_)), "{step:?}");
        assert!(read.len() < MAX_TRAILERS + 512);
    }
}
