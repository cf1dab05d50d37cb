use super::*;

/// Decodes what `wire` holds: the body, the trailers, the decoder after, the bytes left.
fn decode(framing: Framing, wire: &[u8]) -> (Vec<u8>, Option<HeaderMap>, Decoder, usize) {
    let mut read = BytesMut::from(wire);
    let mut decoder = Decoder::new(framing);
    let (mut body, mut trailers) = (Vec::new(), None);
    loop {
        match decoder.step(&mut read) {
            Step::Frame(frame) => match frame.into_data() {
                Ok(data) => body.extend_from_slice(&data),
                Err(frame) => trailers = frame.into_trailers().ok(),
            },
            Step::NeedMore | Step::Done => break,
            Step::Failed(e) => panic!("{e}"),
        }
    }
    (body, trailers, decoder, read.len())
}

/// Whether decoding `wire` as a chunked body fails.
fn fails(wire: &[u8]) -> bool {
    let mut read = BytesMut::from(wire);
    let mut decoder = Decoder::new(Framing::Chunked);
    loop {
        match decoder.step(&mut read) {
            Step::Frame(_) => continue,
            Step::Failed(_) => return true,
            Step::NeedMore | Step::Done => return false,
        }
    }
}

#[test]
fn a_sized_body_ends_at_its_length_and_leaves_the_rest() {
    let (body, _, decoder, left) = decode(Framing::Length(2), b"hiHTTP");
    assert_eq!(body, b"hi");
    assert!(decoder.is_done());
    assert_eq!(
        left, 4,
        "bytes past the body stay unread (and the connection unused)"
    );
    let (body, _, decoder, _) = decode(Framing::Length(5), b"hi");
    assert_eq!(body, b"hi");
    assert_eq!(decoder.remaining(), Some(3));
    assert!(Decoder::new(Framing::Length(5)).at_eof().is_err());
}

#[test]
fn a_body_read_to_close_ends_at_the_close_only() {
    let mut decoder = Decoder::new(Framing::Close);
    let (body, _, after, _) = decode(Framing::Close, b"all of it");
    assert_eq!(body, b"all of it");
    assert!(!after.is_done());
    decoder.at_eof().unwrap();
    assert!(decoder.is_done());
}

#[test]
fn answer_trailers_lose_the_fields_only_a_header_section_may_carry() {
    let wire = b"2\r\nhi\r\n0\r\nx-sum: 42\r\ncontent-length: 0\r\nhost: evil\r\n\
                 connection: close\r\nset-cookie: a=1\r\ngrpc-status: 0\r\n\r\n";
    let (body, trailers, decoder, _) = decode(Framing::Chunked, wire);
    assert_eq!(body, b"hi");
    assert!(decoder.is_done());
    let trailers = trailers.unwrap();
    let mut names: Vec<_> = trailers.keys().map(|n| n.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["grpc-status", "x-sum"]);
}

#[test]
fn chunked_bodies_decode_with_extensions_and_trailers() {
    let wire = b"5;name=x\r\nhello\r\n6;q=\"a;b\"\r\n world\r\n0\r\nx-sum: 42\r\n\r\nNEXT";
    let (body, trailers, decoder, left) = decode(Framing::Chunked, wire);
    assert_eq!(body, b"hello world");
    assert_eq!(trailers.unwrap()["x-sum"], "42");
    assert!(decoder.is_done());
    assert_eq!(left, 4, "nothing past the last chunk is taken");
    // Byte by byte gives the same.
    let mut read = BytesMut::new();
    let mut decoder = Decoder::new(Framing::Chunked);
    let mut body = Vec::new();
    for &b in wire.iter() {
        read.extend_from_slice(&[b]);
        while let Step::Frame(frame) = decoder.step(&mut read) {
            if let Ok(data) = frame.into_data() {
                body.extend_from_slice(&data);
            }
        }
    }
    assert_eq!(body, b"hello world");
    assert!(decoder.is_done());
    assert_eq!(&read[..], b"NEXT");
}

#[test]
fn malformed_chunks_fail() {
    for wire in [
        &b"zz\r\n"[..],
        b"5\r\nhelloXX",
        b"5\r\nhelloX",
        b"5 x\r\nhello\r\n",
        b"1234567890abcdef0\r\n",
        b"1ffffffffffffffff\r\nhello\r\n",
        // Bare line feeds (RFC 9112 §7.1: chunk lines end in CRLF).
        b"5\r\nhello\r\n0\n\nHTTP/1.1 200 OK\r\n",
        b"5;a\nb\r\nhello\r\n",
        b"5;\0\r\nhello\r\n",
        b"+5\r\nhello\r\n",
    ] {
        assert!(
            fails(wire),
            "{:?} was accepted",
            String::from_utf8_lossy(wire)
        );
    }
}

#[test]
fn overlong_chunk_lines_and_trailers_fail_rather_than_grow() {
    let mut line = b"5;".to_vec();
    line.extend_from_slice(&vec![b'a'; MAX_CHUNK_LINE + 1]);
    assert!(fails(&line));
    let mut trailers = b"0\r\nx-a: ".to_vec();
    trailers.extend_from_slice(&vec![b'a'; MAX_TRAILERS + 1]);
    assert!(fails(&trailers));
}
