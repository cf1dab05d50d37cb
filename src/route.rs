//! Route matching: which configured route (if any) a request belongs to, by host, method and
//! path pattern. Patterns are compiled once at config load; matching allocates nothing.
//! Paths are matched in their [`normalize`]d form, escaped sub-delimiters, `:` and `@`
//! decoded ([`NormalForms::decoded`](normalize::NormalForms::decoded)), without each
//! segment's `;` parameters:
//! Java servers (Tomcat, Jetty, Spring) drop them before they route, so
//! `/api/orders;jsessionid=1` is `/api/orders` to them and must be to the routes too.
//! Literal segments match in any ASCII case, as case-insensitive upstreams route them.
//! A `POST` is routed by the method its override headers ([`METHOD_OVERRIDES`]) name, too.

pub mod normalize;
mod overrides;

use std::fmt;

use http::Method;

pub use overrides::{Overrides, METHOD_OVERRIDES};

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

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// Refuses a literal segment that no normalised request path has, which would never match
/// ([`normalize`]): an empty or dot segment, an escape the normal form decodes or refuses,
/// an escape routes read decoded (`%3A`: [`NormalForms::decoded`](normalize::NormalForms::decoded)),
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
    let path = format!("/{piece}");
    let forms = match normalize::normal_forms(&path) {
        Ok(forms) => forms,
        Err(e) => return never(format!("{e}, which requests are refused for")),
    };
    // An escaped `:` (or other sub-delimiter) is routed decoded: written escaped, the
    // literal would match only the reading Express has, which is checked, not routed by.
    match (forms.decoded, forms.strict) {
        (None, std::borrow::Cow::Borrowed(_)) => Ok(()),
        (Some(normal), _) | (None, std::borrow::Cow::Owned(normal)) => never(format!(
            "routes read {piece:?} as {:?}; write {:?}",
            &normal[1..],
            source.replacen(piece, &normal[1..], 1)
        )),
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

impl std::str::FromStr for HostPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
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
mod tests;
