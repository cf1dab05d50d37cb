//! Route matching, pinned: path and host patterns, what they match and cover.

use super::*;

#[test]
fn literal_paths_match_exactly_and_ignore_one_trailing_slash() {
    let p = PathPattern::parse("/api/orders").unwrap();
    assert!(p.matches("/api/orders"));
    assert!(p.matches("/api/orders/"));
    assert!(!p.matches("/api/orders/1"));
    assert!(!p.matches("/api/order"));
    assert!(!p.matches("/api"));
}

#[test]
fn literal_segments_match_in_any_ascii_case() {
    let p = PathPattern::parse("/api/orders/{id}/cancel").unwrap();
    assert!(p.matches("/API/Orders/7/CANCEL"));
    assert!(p.matches("/api/orders;x/7/Cancel/"));
    assert!(!p.matches("/api/ordersx/7/cancel"));
    assert!(!p.matches("/api/order/7/cancel"));
}

#[test]
fn params_match_one_nonempty_segment() {
    let p = PathPattern::parse("/api/polls/{poll}/votes").unwrap();
    assert!(p.matches("/api/polls/42/votes"));
    assert!(!p.matches("/api/polls//votes"));
    assert!(!p.matches("/api/polls/42/43/votes"));
}

#[test]
fn rest_wildcard_matches_any_suffix() {
    let p = PathPattern::parse("/files/*").unwrap();
    assert!(p.matches("/files"));
    assert!(p.matches("/files/a/b/c"));
    assert!(!p.matches("/other"));
    let root = PathPattern::parse("/{*all}").unwrap();
    assert!(root.matches("/"));
    assert!(root.matches("/x/y"));
}

#[test]
fn malformed_patterns_are_rejected() {
    for bad in ["api", "/a/*/b", "/a/x{id}", "/a/{id-x}"] {
        assert!(PathPattern::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_pattern_covers_every_path_it_matches_of_another() {
    let p = |s: &str| PathPattern::parse(s).unwrap();
    for (wide, narrow) in [
        ("/a/*", "/a/b/{c}"),
        ("/a/*", "/a"),
        ("/a/*", "/a/*"),
        ("/{*all}", "/"),
        ("/a/{x}", "/A/b/"),
        ("/a/{x}/c", "/a/{y}/C"),
        ("/a/{x}/*", "/a/b/*"),
    ] {
        assert!(p(wide).covers(&p(narrow)), "{wide} over {narrow}");
    }
    for (wide, narrow) in [
        ("/a/b", "/a/{x}"),
        ("/a/{x}", "/a/*"),
        ("/a/{x}", "/a"),
        ("/a/{x}", "/a/b/c"),
        ("/a/b/*", "/a"),
        ("/a", "/a/b"),
        ("/a/*", "/b/c"),
    ] {
        assert!(!p(wide).covers(&p(narrow)), "{wide} over {narrow}");
    }
    let h = |s: &str| HostPattern::parse(s).unwrap();
    assert!(h("*.example.com").covers(&h("pay.Example.com")));
    assert!(h("*.example.com").covers(&h("*.pay.example.com")));
    assert!(h("pay.example.com").covers(&h("PAY.example.com.")));
    assert!(!h("*.example.com").covers(&h("example.com")));
    assert!(!h("*.example.com").covers(&h("*.xexample.com")));
    assert!(!h("pay.example.com").covers(&h("*.example.com")));
}

/// A host no admitted request names (an empty label, a character a `Host` may not
/// have) would never match: the route's requests would pass it by, unseen.
#[test]
fn host_patterns_no_admitted_host_has_are_refused() {
    for bad in [
        "pay.example..",
        ".pay.example",
        "pay..example",
        "*..example",
        "*.",
        "pay!example",
        "pay%2eexample",
        "pay,example",
        "café.example",
    ] {
        assert!(HostPattern::parse(bad).is_err(), "{bad}");
    }
    for good in [
        "pay.example",
        "pay.example.",
        "*.pay.example",
        "10.0.0.1",
        "a_b.example",
    ] {
        assert!(HostPattern::parse(good).is_ok(), "{good}");
    }
}

#[test]
fn host_patterns_ignore_case_and_port() {
    let h = HostPattern::parse("API.example.com").unwrap();
    assert!(h.matches("api.example.com:8443"));
    assert!(!h.matches("example.com"));
    let w = HostPattern::parse("*.example.com").unwrap();
    assert!(w.matches("a.Example.com"));
    assert!(!w.matches("example.com"));
    assert!(HostPattern::parse("[::1]").is_err());
    assert_eq!(strip_port("[::1]:80"), "[::1]");
}

#[test]
fn a_trailing_dot_names_the_same_host() {
    let h = HostPattern::parse("pay.example").unwrap();
    assert!(h.matches("pay.example."));
    assert!(h.matches("PAY.example.:443"));
    assert!(!h.matches("pay.example.."));
    let w = HostPattern::parse("*.example.com").unwrap();
    assert!(w.matches("a.example.com."));
}

#[test]
fn params_of_a_segment_are_not_part_of_its_name() {
    let p = PathPattern::parse("/api/orders").unwrap();
    for path in [
        "/api/orders;jsessionid=ABC",
        "/api/orders;x=1;y=2",
        "/api/orders;x=1/",
        "/api;v=2/orders",
        "/api/;x/orders",
        "/api/orders/;x",
        "/;x/api/orders",
        "/api/orders;",
    ] {
        assert!(p.matches(path), "{path}");
    }
    for path in [
        "/api/orders;x/1",
        "/api/ordersx;y",
        "/api/order;s",
        "/api/orders%3Bx",
    ] {
        assert!(!p.matches(path), "{path}");
    }
    let param = PathPattern::parse("/api/polls/{poll}/votes").unwrap();
    assert!(param.matches("/api/polls/42;x/votes;y"));
    assert!(!param.matches("/api/polls/;x/votes"));
    let root = PathPattern::parse("/").unwrap();
    assert!(root.matches("/;jsessionid=ABC"));
    assert!(!root.matches("/x;jsessionid=ABC"));
}

#[test]
fn a_literal_no_request_path_has_is_rejected() {
    for bad in [
        "/a//b",
        "/a/./b",
        "/a/../b",
        "/a/%6F",
        "/a/%2F",
        "/a/%zz",
        "/a b",
        "/caf\u{e9}",
        "/a?b",
        "/a#b",
    ] {
        assert!(PathPattern::parse(bad).is_err(), "{bad}");
    }
    for good in [
        "/caf%C3%A9",
        "/a:b@c!$&'()+,=",
        "/a-b_c~d.e",
        "/a/",
        "/{x}/b",
    ] {
        assert!(PathPattern::parse(good).is_ok(), "{good}");
    }
}

#[test]
fn a_pattern_with_params_is_rejected() {
    assert!(PathPattern::parse("/api/orders;v=2").is_err());
}

/// The piece-by-piece walk agrees with splitting the path on '/', dropping each piece's
/// parameters and the pieces that are parameters alone, for every pattern and path
/// shape, empty pieces included.
#[test]
fn matching_agrees_with_splitting_on_slashes() {
    fn by_split(p: &PathPattern, path: &str) -> bool {
        let path = trim_trailing_slash(path);
        if path == "/" || path.is_empty() {
            return p.segments.is_empty();
        }
        let mut pieces = path
            .strip_prefix('/')
            .unwrap_or(path)
            .split('/')
            .filter(|piece| !piece.starts_with(';'))
            .map(|piece| piece.split(';').next().unwrap_or(piece));
        for segment in &p.segments {
            let Some(piece) = pieces.next() else {
                return false;
            };
            match segment {
                Segment::Literal(text) if !text.eq_ignore_ascii_case(piece) => return false,
                Segment::Param if piece.is_empty() => return false,
                _ => {}
            }
        }
        p.rest || pieces.next().is_none()
    }
    let patterns = [
        "/",
        "/a",
        "/a/",
        "/a/b",
        "/a/*",
        "/a/{x}",
        "/a/{x}/b",
        "/{x}",
        "/*",
        "/ab/{x}/*",
    ];
    let paths = [
        "",
        "/",
        "//",
        "/a",
        "/a/",
        "/a//",
        "/ab",
        "/a/b",
        "/a/bc",
        "/a/b/",
        "/a/b/c",
        "/a//b",
        "/ab/x",
        "/ab/x/y/z",
        "/ab//y",
        "a",
        "a/b",
        "/b/a",
        "/;x",
        "/a;x",
        "/a;x/",
        "/;x/a",
        "/a/;x",
        "/a/;x/b",
        "/a;/b;x=1;y",
        "/a/b;x/c",
        "/ab;x/y;z/z",
        "/a//b;x",
        "/a/;x/;y/b",
        "/a/x;",
        "/A/B",
        "/Ab;x/Y",
    ];
    for pattern in patterns {
        let p = PathPattern::parse(pattern).unwrap();
        for path in paths {
            assert_eq!(p.matches(path), by_split(&p, path), "{pattern} on {path:?}");
        }
    }
}
