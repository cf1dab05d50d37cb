//! Route matching: which configured route (if any) a request belongs to, by host, method and
//! path pattern. Patterns are compiled once at config load; matching allocates nothing.
//! Paths are matched in their [`normalize`]d form, without each segment's `;` parameters:
//! Java servers (Tomcat, Jetty, Spring) drop them before they route, so
//! `/api/orders;jsessionid=1` is `/api/orders` to them and must be to the routes too.
//! Literal segments match in any ASCII case, as case-insensitive upstreams route them.

pub mod normalize;

use std::fmt;

use http::{HeaderMap, HeaderName, Method};

/// A compiled path pattern: literal segments, `{name}` for exactly one segment, and a final
/// `*` or `{*name}` for the rest of the path (zero or more segments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    source: String,
    segments: Vec<Segment>,
    rest: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
}

impl PathPattern {
    /// Compiles a pattern such as `/api/polls/{poll}/votes`.
    pub fn parse(source: &str) -> Result<Self, String> {
        if !source.starts_with('/') {
            return Err(format!("path pattern {source:?} must start with '/'"));
        }
        let mut segments = Vec::new();
        let mut rest = false;
        let body = trim_trailing_slash(source);
        let pieces: Vec<&str> = if body == "/" {
            Vec::new()
        } else {
            body[1..].split('/').collect()
        };
        for (i, piece) in pieces.iter().enumerate() {
            let last = i + 1 == pieces.len();
            if *piece == "*" || (piece.starts_with("{*") && piece.ends_with('}')) {
                if !last {
                    return Err(format!(
                        "path pattern {source:?}: a rest wildcard ({piece}) must be the last segment"
                    ));
                }
                rest = true;
            } else if piece.starts_with('{') && piece.ends_with('}') && piece.len() > 2 {
                let name = &piece[1..piece.len() - 1];
                if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(format!(
                        "path pattern {source:?}: parameter name {name:?} must be alphanumeric"
                    ));
                }
                segments.push(Segment::Param);
            } else if piece.contains(';') {
                return Err(format!(
                    "path pattern {source:?}: segment {piece:?} has a ';', which starts path \
                     parameters; paths are matched without them"
                ));
            } else if piece.contains(['{', '}', '*']) {
                return Err(format!(
                    "path pattern {source:?}: segment {piece:?} mixes text and a placeholder"
                ));
            } else {
                check_literal(source, piece)?;
                segments.push(Segment::Literal((*piece).to_owned()));
            }
        }
        Ok(Self {
            source: source.to_owned(),
            segments,
            rest,
        })
    }

    /// Whether `path` (the request path, without query) matches. One trailing slash is not
    /// significant, so `/api/orders/` cannot slip past a rule written for `/api/orders`.
    /// Nor is the ASCII case of a literal segment: Express, ASP.NET Core and IIS route
    /// `/API/Orders` where `/api/orders` goes, so a rule written for one covers the other
    /// (the path as sent stays part of the payload fingerprint).
    /// Nor are a segment's `;` parameters (from its first `;`): `/api/orders;x=1` is
    /// `/api/orders`, and a segment of parameters alone (`/api/;x/orders`) is no segment,
    /// as a server that drops them and then merges the empty segment reads it.
    pub fn matches(&self, path: &str) -> bool {
        let path = trim_trailing_slash(path);
        if path == "/" || path.is_empty() {
            return self.segments.is_empty();
        }
        // The path's '/'-separated pieces, walked by hand: every request is matched
        // against every route until one fits, and `str::split` costs a searcher per call.
        // `None`: no pieces left.
        let mut rest = Some(path.strip_prefix('/').unwrap_or(path).as_bytes());
        for segment in &self.segments {
            let Some(left) = skip_bare_params(rest) else {
                return false;
            };
            let end = match segment {
                // A literal holds no '/' nor ';': the piece is it if the path goes on with
                // it and then ends, has a '/' or has the piece's parameters.
                Segment::Literal(text) => {
                    let text = text.as_bytes();
                    if !left
                        .get(..text.len())
                        .is_some_and(|piece| piece.eq_ignore_ascii_case(text))
                    {
                        return false;
                    }
                    match left.get(text.len()) {
                        None | Some(b'/') => text.len(),
                        Some(b';') => piece_end(left),
                        Some(_) => return false,
                    }
                }
                // Not empty: a piece of parameters alone was skipped above.
                Segment::Param => {
                    let end = piece_end(left);
                    if end == 0 {
                        return false;
                    }
                    end
                }
            };
            rest = left.get(end + 1..);
        }
        self.rest || skip_bare_params(rest).is_none()
    }

    /// Whether every path `other` matches, this pattern matches too: segment by segment a
    /// parameter covers any segment and a literal the same literal (in any case), and a
    /// rest wildcard covers whatever is left, even nothing; without one, `other` must end
    /// where this pattern does. (Matching ignores `;` parameters and a trailing slash
    /// alike on both sides, so the segments say it all.)
    pub fn covers(&self, other: &PathPattern) -> bool {
        if self.segments.len() > other.segments.len()
            || (!self.rest && (other.rest || other.segments.len() > self.segments.len()))
        {
            return false;
        }
        self.segments
            .iter()
            .zip(&other.segments)
            .all(|(mine, theirs)| match (mine, theirs) {
                (Segment::Param, _) => true,
                (Segment::Literal(a), Segment::Literal(b)) => a.eq_ignore_ascii_case(b),
                (Segment::Literal(_), Segment::Param) => false,
            })
    }

    /// Whether the pattern is literal segments only: one path (in any case, with or
    /// without a trailing slash), not a family of them.
    pub fn is_literal(&self) -> bool {
        !self.rest
            && self
                .segments
                .iter()
                .all(|s| matches!(s, Segment::Literal(_)))
    }

    /// The pattern as written in the config.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

impl std::str::FromStr for PathPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

impl std::str::FromStr for HostPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// Refuses a literal segment that no normalised request path has, which would never match
/// ([`normalize`]): an empty or dot segment, an escape the normal form decodes or refuses,
/// or a character a path carries only percent-encoded (a space, `?`, non-ASCII).
fn check_literal(source: &str, piece: &str) -> Result<(), String> {
    let never = |why: String| Err(format!("path pattern {source:?} never matches: {why}"));
    if piece.is_empty() {
        return never("it has an empty segment, and repeated slashes are merged".into());
    }
    if piece == "." || piece == ".." {
        return never(format!(
            "{piece:?} is a dot segment, removed from request paths"
        ));
    }
    if let Some(c) = piece.chars().find(|&c| !is_path_char(c)) {
        let encoded = percent_encoding::utf8_percent_encode(source, NOT_PATH).to_string();
        return never(format!(
            "{c:?} reaches it only percent-encoded; write {encoded:?}"
        ));
    }
    match normalize::normalize_path(&format!("/{piece}")) {
        Ok(std::borrow::Cow::Borrowed(_)) => Ok(()),
        Ok(std::borrow::Cow::Owned(normal)) => never(format!(
            "requests spell {piece:?} as {:?}; write {:?}",
            &normal[1..],
            source.replacen(piece, &normal[1..], 1)
        )),
        Err(e) => never(format!("{e}, which requests are refused for")),
    }
}

/// Whether `c` may stand for itself in a path segment (RFC 3986 `pchar`, or the `%` of an
/// escape).
fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@%".contains(c)
}

/// What [`check_literal`] suggests escaping: all but `pchar`, `%` and `/`.
const NOT_PATH: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'!')
    .remove(b'$')
    .remove(b'&')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')')
    .remove(b'*')
    .remove(b'+')
    .remove(b',')
    .remove(b';')
    .remove(b'=')
    .remove(b':')
    .remove(b'@')
    .remove(b'%')
    .remove(b'/')
    .remove(b'{')
    .remove(b'}');

/// Where the first piece of `path` ends (its '/', or the end).
fn piece_end(path: &[u8]) -> usize {
    path.iter().position(|&b| b == b'/').unwrap_or(path.len())
}

/// `rest` past its leading pieces that are parameters alone (`;x`): the segment a server
/// reads there is empty, and merged away like `//`.
fn skip_bare_params(mut rest: Option<&[u8]>) -> Option<&[u8]> {
    while let Some(left) = rest {
        if left.first() != Some(&b';') {
            break;
        }
        rest = left.get(piece_end(left) + 1..);
    }
    rest
}

fn trim_trailing_slash(path: &str) -> &str {
    if path.len() > 1 && path.ends_with('/') {
        &path[..path.len() - 1]
    } else {
        path
    }
}

/// A host to match: exact (`api.example.com`) or a subdomain wildcard (`*.example.com`).
/// Compared case-insensitively, without the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    source: String,
    suffix: Option<String>,
}

impl HostPattern {
    /// Compiles a host pattern.
    pub fn parse(source: &str) -> Result<Self, String> {
        let lower = source.trim().to_ascii_lowercase();
        // A fully qualified name's trailing dot, as `matches` leaves it off the request's
        // host: kept, the pattern would match no request at all.
        let lower = lower.strip_suffix('.').unwrap_or(&lower).to_owned();
        if lower.is_empty() || lower.contains(['/', ' ', ':']) {
            return Err(format!(
                "host pattern {source:?} must be a host name without port or scheme"
            ));
        }
        // What no admitted `Host` has (an empty label, a character besides a name's) would
        // never match, and the route's requests would pass it by.
        let name = lower.strip_prefix("*.").unwrap_or(&lower);
        if let Some(c) = name
            .chars()
            .find(|&c| !(c.is_ascii_alphanumeric() || "-._~*".contains(c)))
        {
            return Err(format!(
                "host pattern {source:?} never matches: requests with {c:?} in their host are refused"
            ));
        }
        if name.split('.').any(str::is_empty) {
            return Err(format!(
                "host pattern {source:?} never matches: it has an empty label, and requests with one are refused"
            ));
        }
        let suffix = match lower.strip_prefix("*.") {
            Some(rest) if !rest.contains('*') => Some(format!(".{rest}")),
            Some(_) => return Err(format!("host pattern {source:?}: one leading '*.' at most")),
            None if lower.contains('*') => {
                return Err(format!(
                    "host pattern {source:?}: '*' only as a leading '*.'"
                ))
            }
            None => None,
        };
        Ok(Self {
            source: lower,
            suffix,
        })
    }

    /// Whether the request's host (a `Host` header value or URI authority, port allowed) matches.
    /// A fully qualified name's trailing dot (`pay.example.`) names the same host, so it
    /// cannot step around a route scoped to it.
    pub fn matches(&self, host: &str) -> bool {
        let host = host_name(host);
        match &self.suffix {
            Some(suffix) => {
                host.len() > suffix.len()
                    && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
            }
            None => host.eq_ignore_ascii_case(&self.source),
        }
    }
}

impl HostPattern {
    /// Whether every host `other` matches, this pattern matches too: the same host, or a
    /// subdomain wildcard over `other`'s host or its own wildcard's domain.
    pub fn covers(&self, other: &HostPattern) -> bool {
        match (&self.suffix, &other.suffix) {
            (None, None) => self.source == other.source,
            (None, Some(_)) => false,
            (Some(_), None) => self.matches(&other.source),
            (Some(mine), Some(theirs)) => {
                theirs.len() >= mine.len() && theirs.ends_with(mine.as_str())
            }
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// The host a `Host` value names, as routes match it: without its port, nor a fully
/// qualified name's trailing dot (any case; callers compare ignoring it).
pub fn host_name(host: &str) -> &str {
    let host = strip_port(host);
    host.strip_suffix('.').unwrap_or(host)
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // IPv6 literal: "[::1]:8080"
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

/// The matching part of a route: all given conditions must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteMatch {
    /// Host condition; any host when absent.
    pub host: Option<HostPattern>,
    /// Methods this route covers.
    pub methods: Vec<Method>,
    /// Path condition.
    pub path: PathPattern,
}

impl RouteMatch {
    /// Whether a request with this host, method and path belongs to the route.
    pub fn matches(&self, host: Option<&str>, method: &Method, path: &str) -> bool {
        self.methods.iter().any(|m| m == method)
            && self.path.matches(path)
            && match &self.host {
                Some(pattern) => host.is_some_and(|h| pattern.matches(h)),
                None => true,
            }
    }
}

/// The headers frameworks read as the method to run a request as (Rack, Express's
/// `method-override`, Symfony and ASP.NET run `POST` with `X-HTTP-Method-Override: DELETE`
/// as a DELETE): part of every key's operation, and what a POST is routed by too.
pub static METHOD_OVERRIDES: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// The methods a `POST` names in its override headers ([`METHOD_OVERRIDES`]), upper-cased
/// as the frameworks read them, in the order sent; none for another method (frameworks
/// honour overrides on POST only), nor for a value that is no method or a safe one.
pub fn overridden_methods<'h>(
    method: &Method,
    headers: &'h HeaderMap,
) -> impl Iterator<Item = Method> + 'h {
    // One pass over the names sent (a handful) costs less than three hashed look-ups.
    let post =
        *method == Method::POST && headers.keys().any(|sent| METHOD_OVERRIDES.contains(sent));
    METHOD_OVERRIDES
        .iter()
        .filter(move |_| post)
        .flat_map(|name| headers.get_all(name))
        .filter_map(|value| {
            let upper = value.as_bytes().trim_ascii().to_ascii_uppercase();
            Method::from_bytes(&upper).ok()
        })
        .filter(|m| !is_safe(m) && *m != Method::POST)
}

impl RouteMatch {
    /// Whether every request `other` matches, this one matches too: each of its methods,
    /// any host it may have, and every path it does. A route after one that covers it is
    /// never reached.
    pub fn covers(&self, other: &RouteMatch) -> bool {
        other.methods.iter().all(|m| self.methods.contains(m))
            && match (&self.host, &other.host) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(mine), Some(theirs)) => mine.covers(theirs),
            }
            && self.path.covers(&other.path)
    }
}

/// Safe methods (RFC 9110 §9.2.1) always pass through, whatever the config says.
pub fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

#[cfg(test)]
mod tests {
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
}
