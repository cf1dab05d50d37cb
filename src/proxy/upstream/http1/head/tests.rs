use super::*;

fn head(raw: &str, method: Method) -> io::Result<Option<Head>> {
    parse_head(&mut BytesMut::from(raw.as_bytes()), &method)
}

fn framing_of(raw: &str, method: Method) -> Framing {
    head(raw, method).unwrap().unwrap().framing
}

#[test]
fn framing_follows_rfc_9112() {
    let ok = "HTTP/1.1 200 OK\r\n";
    assert_eq!(
        framing_of(&format!("{ok}content-length: 5\r\n\r\n"), Method::POST),
        Framing::Length(5)
    );
    assert_eq!(
        framing_of(&format!("{ok}content-length: 5\r\n\r\n"), Method::HEAD),
        Framing::Empty
    );
    assert_eq!(
        framing_of(&format!("{ok}content-length: 0\r\n\r\n"), Method::GET),
        Framing::Empty
    );
    assert_eq!(
        framing_of(
            &format!("{ok}transfer-encoding: chunked\r\n\r\n"),
            Method::GET
        ),
        Framing::Chunked
    );
    assert_eq!(
        framing_of(&format!("{ok}\r\n"), Method::GET),
        Framing::Close
    );
    assert_eq!(
        framing_of("HTTP/1.1 204 No Content\r\n\r\n", Method::GET),
        Framing::Empty
    );
    assert_eq!(
        framing_of("HTTP/1.1 103 Early Hints\r\n\r\n", Method::GET),
        Framing::Empty
    );
    assert_eq!(
        framing_of("HTTP/1.1 101 Switching Protocols\r\n\r\n", Method::GET),
        Framing::Upgrade
    );
}

#[test]
fn only_well_delimited_answers_keep_the_connection() {
    let keep = |raw: &str| head(raw, Method::POST).unwrap().unwrap().keep_alive;
    assert!(keep("HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n"));
    assert!(!keep(
        "HTTP/1.1 201 Created\r\nconnection: close\r\ncontent-length: 2\r\n\r\n"
    ));
    assert!(!keep("HTTP/1.0 201 Created\r\ncontent-length: 2\r\n\r\n"));
    assert!(keep(
        "HTTP/1.0 201 Created\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\n"
    ));
    assert!(!keep("HTTP/1.1 200 OK\r\n\r\n"));
    // Bodiless answers end at their head whatever their framing fields say (RFC 9112
    // §6.3 rule 1), as hyper reads them: neither refused nor read past.
    let both = "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n";
    let parsed = head(both, Method::HEAD).unwrap().unwrap();
    assert_eq!(parsed.framing, Framing::Empty);
    let parsed = head(
        "HTTP/1.1 304 Not Modified\r\ncontent-length: x\r\n\r\n",
        Method::GET,
    )
    .unwrap()
    .unwrap();
    assert_eq!(parsed.framing, Framing::Empty);
}

#[test]
fn ambiguous_or_malformed_heads_are_refused() {
    let refused = |raw: &str| head(raw, Method::GET).is_err();
    assert!(refused(
        "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n"
    ));
    assert!(refused("HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n"));
    assert!(refused("HTTP/1.1 200 OK\r\ncontent-length: +1\r\n\r\n"));
    assert!(refused("HTTP/1.1 200 OK\r\ncontent-length: 3x\r\n\r\n"));
    assert!(refused("HTTP/1.1 200 OK\r\ncontent-length: 1,\r\n\r\n"));
    assert!(refused("HTTP/1.1 2000 OK\r\n\r\n"));
    assert!(refused("NOTHTTP\r\n\r\n"));
    assert!(refused("HTTP/1.1 200 OK\r\nx-nul: a\0b\r\n\r\n"));
    assert!(refused(
        "HTTP/1.1 200 OK\r\nx-folded: a\r\n content-length: 0\r\n\r\n"
    ));
    // Both framings (RFC 9112 §6.3: "ought to be handled as an error").
    assert!(refused(
        "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n"
    ));
    assert!(refused(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n"
    ));
    // HTTP/1.0 has no transfer codings.
    assert!(refused(
        "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    ));
    // Codings this proxy does not decode would reach the client unmarked.
    for coding in [
        "gzip, chunked",
        "gzip",
        "chunked, chunked",
        "chunked, identity",
        "identity",
        "xchunked",
    ] {
        assert!(
            refused(&format!(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: {coding}\r\n\r\n"
            )),
            "{coding}"
        );
    }
    assert!(refused(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n"
    ));
    // Repeated equal lengths are one length, `01` is 1.
    let same = "HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\ncontent-length: 3\r\n\r\n";
    assert_eq!(framing_of(same, Method::GET), Framing::Length(3));
    assert_eq!(
        framing_of("HTTP/1.1 200 OK\r\ncontent-length: 01\r\n\r\n", Method::GET),
        Framing::Length(1)
    );
}

#[test]
fn an_incomplete_head_leaves_the_bytes_untouched() {
    let raw = b"HTTP/1.1 200 OK\r\ncontent-le";
    let mut read = BytesMut::from(&raw[..]);
    assert!(parse_head(&mut read, &Method::GET).unwrap().is_none());
    assert_eq!(&read[..], raw);
    let refused = b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\nab";
    let mut bad = BytesMut::from(&refused[..]);
    assert!(parse_head(&mut bad, &Method::GET).is_err());
    assert_eq!(&bad[..], refused, "a refused head is not consumed either");
}

#[test]
fn a_head_too_large_is_refused_rather_than_waited_for() {
    let mut read = BytesMut::from(&b"HTTP/1.1 200 OK\r\n"[..]);
    read.extend_from_slice(&b"x-long: "[..]);
    read.extend_from_slice(&vec![b'a'; MAX_HEAD]);
    assert!(parse_head(&mut read, &Method::GET).is_err());
}

#[test]
fn every_field_is_kept_for_the_caller_to_clean() {
    let raw = "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\
               Transfer-Encoding: chunked\r\nX-App: 1\r\nX-App: 2\r\n\r\n";
    let parsed = head(raw, Method::GET).unwrap().unwrap();
    assert_eq!(parsed.framing, Framing::Chunked);
    assert!(parsed.keep_alive);
    assert_eq!(parsed.parts.headers.len(), 5);
    let apps: Vec<_> = parsed.parts.headers.get_all("x-app").iter().collect();
    assert_eq!(apps, ["1", "2"]);
    // A bare LF ends a head line (RFC 9112 §2.2 allows it; hyper's httparse does too).
    let bare = head("HTTP/1.1 201 Created\ncontent-length: 5\n\n", Method::POST)
        .unwrap()
        .unwrap();
    assert_eq!(bare.framing, Framing::Length(5));
}

#[test]
fn a_head_leaves_the_body_bytes_behind() {
    let mut read =
        BytesMut::from(&b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\nhiHTTP"[..]);
    let parsed = parse_head(&mut read, &Method::GET).unwrap().unwrap();
    assert_eq!(parsed.parts.headers["x-a"], "b");
    assert_eq!(&read[..], b"hiHTTP");
}
