//! Who is asking: the caller identity a key is scoped by when a route names no `scope`, and
//! the client address behind trusted proxies.
//!
//! The default identity is every credential the request carries: the `Authorization`
//! header when it carries one ([`carries_credential`]) and the session cookie(s) (names
//! `session_cookies` lists by name, cleared values skipped; with them every cookie named
//! like a credential, [`looks_like_credential`], since a listed name may be no one's
//! session; a name only a pattern takes, `*_session`, is no session alone),
//! both when both are sent, since one shared `Authorization` (a staging site's basic-auth
//! gate) would otherwise merge every user behind it; for the same reason an `Authorization` without a session comes with the
//! whole `Cookie` header. With neither, the whole `Cookie` header (a session cookie of a name not
//! listed still keeps two browsers apart) with the client address, else the client address.
//! The client certificate verified on the TLS connection (`tls.client_ca`) and headers in
//! `credential_headers` (`X-Api-Key`, …) are mixed in beside whichever of those applies,
//! never instead of it: one certificate or key may be a gateway's, shared by its users. Each part is hashed after its tier's name, so a caller
//! known by a cookie can never share a key with one known by an address whose bytes happen
//! to be the same.
//!
//! The client address is the TCP peer, unless the peer is in `trusted_proxies`: then it is
//! the right-most `X-Forwarded-For` entry that is not itself a trusted proxy, as nginx's
//! `real_ip_recursive` and Envoy's trusted hops read it. Entries left of that one were
//! written by the client and prove nothing. A trusted proxy whose entries, read from the
//! right, reach one that is no address (`unknown`, `_hidden`) vouches for a client it
//! cannot name: [`ClientAddress::Unnamed`], which no key may hold as an address (every
//! client behind that proxy would share it).
//!
//! ```
//! use http::HeaderMap;
//! use idemgate::key::identity::{ClientAddress, TrustedProxies};
//! let trusted: TrustedProxies = ["10.0.0.0/8"].iter().map(|c| c.parse().unwrap()).collect();
//! let mut headers = HeaderMap::new();
//! headers.insert("x-forwarded-for", "198.51.100.7, 203.0.113.9, 10.1.2.3".parse().unwrap());
//! // From the load balancer: its view of the client counts.
//! assert_eq!(trusted.client_address("10.0.0.2".parse().unwrap(), &headers), ClientAddress::Named("203.0.113.9".parse().unwrap()));
//! // From anyone else: the header is the caller's own word, and the peer counts.
//! assert_eq!(trusted.client_address("192.0.2.1".parse().unwrap(), &headers), ClientAddress::Named("192.0.2.1".parse().unwrap()));
//! // A balancer that could not name the client names no one.
//! headers.insert("x-forwarded-for", "unknown".parse().unwrap());
//! assert_eq!(trusted.client_address("10.0.0.2".parse().unwrap(), &headers), ClientAddress::Unnamed);
//! ```

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use http::header::{self, HeaderMap, HeaderName};

use crate::proxy::headers::X_FORWARDED_FOR;
use placeholder::{is_empty_basic_pair, is_placeholder};

/// Cookie names of a session by default: the session cookies of the common web frameworks
/// (Django, Flask, Express, Java servlets, Spring Session, PHP, Rails, Laravel, Rack,
/// ASP.NET). A name with a `*` is a pattern: `*` stands for any run of characters. A name
/// listed as such names its caller alone; one only a pattern takes (Rails' and Laravel's
/// app-named sessions) goes into the caller as any cookie that may hold a login does.
pub const DEFAULT_SESSION_COOKIES: &[&str] = &[
    "session",
    "sessionid",
    "session_id",
    "sid",
    "SESSION",
    "connect.sid",
    "JSESSIONID",
    "PHPSESSID",
    "_session_id",
    "laravel_session",
    "rack.session",
    "ASP.NET_SessionId",
    ".AspNetCore.Session",
    ".AspNetCore.Cookies",
    // Rails (`_<app>_session`) and Laravel (`<app>_session`) name theirs after the app.
    // A pattern only says a cookie may hold a login (hashed beside a listed session): it
    // is no session alone (see `Identity::is_named_session_cookie`).
    "*_session",
];

/// Pieces of a cookie name (any case) that say it may hold a login: beside a listed
/// session cookie, a cookie so named goes into the caller too, since the listed one may
/// not be the app's session (`ab_session` from an A/B test beside NextAuth's
/// `next-auth.session-token`, or a `*_session` copy a sibling subdomain planted). Broad on
/// purpose: a name caught wrongly only makes a retry run again if its value changed,
/// while one missed can let two users share an answer. Analytics and preference cookies
/// (`_ga`, `_gid`, `consent`, `theme`, `lang`), which scripts rewrite between a click and
/// its retry, hold none of these.
pub const CREDENTIAL_COOKIE_WORDS: &[&str] = &[
    "sess", "sid", "token", "auth", "jwt", "login", "logged", "user", "remember", "account", "uid",
    "ident", "member", "customer", "secret", "cred", "key", "sso", "saml", "pass",
];

/// Header names that carry a credential besides `Authorization`, by default: API keys and
/// access tokens as common API gateways and frameworks name them.
pub const DEFAULT_CREDENTIAL_HEADERS: &[&str] = &[
    "x-api-key",
    "api-key",
    "x-auth-token",
    "x-access-token",
    "private-token",
];

/// How callers are told apart: the proxies whose `X-Forwarded-For` is believed, the
/// cookie names that hold a session, and the headers that carry a credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Peers whose `X-Forwarded-For` names the client.
    pub trusted_proxies: TrustedProxies,
    /// Cookie names of a session (case-sensitive, as cookie names are): a name listed as
    /// such names its caller alone, one a pattern takes may hold a login
    /// ([`Identity::is_named_session_cookie`]).
    pub session_cookies: Vec<String>,
    /// Headers whose value is a credential (an API key, an access token). They are mixed
    /// into the caller when present, never instead of anything: one key shared by every
    /// user of an app (a public API key) must not merge those users.
    pub credential_headers: Vec<HeaderName>,
}

impl Default for Identity {
    fn default() -> Self {
        Self {
            trusted_proxies: TrustedProxies::default(),
            session_cookies: DEFAULT_SESSION_COOKIES
                .iter()
                .map(|&n| n.to_owned())
                .collect(),
            credential_headers: DEFAULT_CREDENTIAL_HEADERS
                .iter()
                .map(|&n| HeaderName::from_static(n))
                .collect(),
        }
    }
}

impl Identity {
    /// Whether a cookie called `name` may hold a session: a listed name, or one a listed
    /// pattern (`*_session`: one `*`, any run of characters, none too) matches.
    pub fn is_session_cookie(&self, name: &[u8]) -> bool {
        self.session_cookies.iter().any(|listed| {
            let listed = listed.as_bytes();
            match listed.iter().position(|&b| b == b'*') {
                None => listed == name,
                Some(star) => {
                    let (prefix, suffix) = (&listed[..star], &listed[star + 1..]);
                    name.len() >= prefix.len() + suffix.len()
                        && name.starts_with(prefix)
                        && name.ends_with(suffix)
                }
            }
        })
    }

    /// Whether a cookie called `name` is one `session_cookies` lists by that very name, not
    /// one only a pattern takes: such a cookie names its caller alone. A name only a
    /// pattern takes (`ab_session`, by `*_session`) may be no session at all (an A/B
    /// test's cookie many users send alike, a copy a sibling subdomain planted) while the
    /// app's own sits under a name no rule knows (CakePHP's `CAKEPHP`).
    pub fn is_named_session_cookie(&self, name: &[u8]) -> bool {
        self.session_cookies
            .iter()
            .any(|listed| !listed.contains('*') && listed.as_bytes() == name)
    }

    /// Whether a cookie called `name` could tell its sender apart: a session cookie
    /// ([`Self::is_session_cookie`]) or one whose name looks like a credential
    /// ([`looks_like_credential`]).
    pub fn could_identify(&self, name: &[u8]) -> bool {
        self.is_session_cookie(name) || looks_like_credential(name)
    }
}

/// Whether a cookie's name holds a piece of [`CREDENTIAL_COOKIE_WORDS`], in any case.
///
/// ```
/// use idemgate::key::identity::looks_like_credential;
/// for name in ["next-auth.session-token", "XSRF-TOKEN", "remember_web_59ba", "user_id"] {
///     assert!(looks_like_credential(name.as_bytes()), "{name}");
/// }
/// for name in ["_ga", "_gid", "consent", "theme", "lang"] {
///     assert!(!looks_like_credential(name.as_bytes()), "{name}");
/// }
/// ```
pub fn looks_like_credential(name: &[u8]) -> bool {
    CREDENTIAL_COOKIE_WORDS.iter().any(|word| {
        name.windows(word.len())
            .any(|piece| piece.eq_ignore_ascii_case(word.as_bytes()))
    })
}

/// One part of the default identity. Its name is hashed into the key before its value;
/// `idemgate explain` shows which parts named the caller (never their values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The `Authorization` header.
    Authorization,
    /// One or more cookies `session_cookies` lists by name (not only by a pattern).
    SessionCookie,
    /// The whole `Cookie` header: cookies were sent, none of a session name listed as such
    /// (one only a pattern takes counts as any other cookie).
    CookieHeader,
    /// The client address (TCP peer, or `X-Forwarded-For` behind trusted proxies).
    ClientAddress,
    /// A header named in `credential_headers`: mixed in beside the others, never alone.
    CredentialHeader,
    /// The client certificate verified on the connection (mutual TLS): mixed in beside the
    /// others, never alone (a gateway may present one certificate for all its users).
    ClientCertificate,
}

impl Tier {
    /// Stable label, hashed into keys and shown by `idemgate explain`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Authorization => "authorization",
            Self::SessionCookie => "session_cookie",
            Self::CookieHeader => "cookie_header",
            Self::ClientAddress => "client_address",
            Self::CredentialHeader => "credential_header",
            Self::ClientCertificate => "client_certificate",
        }
    }
}

/// Authentication schemes that, sent alone, carry nothing: `Bearer ` with the token left
/// out reaches us as `Bearer` (trailing whitespace is not part of a field value).
const SCHEMES: &[&[u8]] = &[
    b"basic",
    b"bearer",
    b"digest",
    b"negotiate",
    b"ntlm",
    b"token",
    b"jwt",
    b"apikey",
    b"dpop",
];

/// Whether an `Authorization` value names someone: it is not empty, and neither it nor
/// the credentials after its scheme are missing, a script's placeholder (`null`,
/// `undefined`, `""`; any case, in quotes or not) or a template nobody filled in
/// (`{{token}}`, `${token}`, `<token>`, `%s`), nor a `Basic` pair of an empty user and
/// password (`Og==`). A value that names no one is shared by every anonymous caller that
/// sends it, so the default identity passes over it as if it were absent.
///
/// ```
/// use idemgate::key::identity::carries_credential;
/// assert!(carries_credential(b"Bearer eyJhbGciOi"));
/// assert!(carries_credential(b"s3cr3t-api-key"));
/// for anonymous in ["", "  ", "Bearer", "Bearer null", "bearer Undefined", "Bearer \"\"", "null",
///                   "Basic Og==", "Bearer {{token}}", "Bearer 'undefined'"] {
///     assert!(!carries_credential(anonymous.as_bytes()), "{anonymous:?}");
/// }
/// ```
pub fn carries_credential(value: &[u8]) -> bool {
    let value = value.trim_ascii();
    if is_placeholder(value) {
        return false;
    }
    match value.iter().position(|b| b.is_ascii_whitespace()) {
        Some(end) => {
            let (scheme, credentials) = (&value[..end], value[end..].trim_ascii());
            let empty_basic =
                || scheme.eq_ignore_ascii_case(b"basic") && is_empty_basic_pair(credentials);
            !(is_placeholder(credentials) || empty_basic())
        }
        None => !SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(value)),
    }
}

/// Whether a session cookie's value names a session: it names someone ([`names_someone`])
/// and is not `deleted`, the value servers (PHP among them) write when they clear one.
/// Such values are shared by every logged-out browser that sends them.
pub fn names_a_session(value: &[u8]) -> bool {
    names_someone(value) && !value.trim_ascii().eq_ignore_ascii_case(b"deleted")
}

/// Whether a value names someone: not empty, not a script's placeholder (`null`,
/// `undefined`, `""`; any case, in quotes or not) nor an unfilled template (`{{id}}`),
/// which every anonymous caller sends alike.
pub fn names_someone(value: &[u8]) -> bool {
    !is_placeholder(value)
}

/// The cookies of a request as `(name, value)` pairs, over every `Cookie` field.
pub fn cookies(headers: &HeaderMap) -> impl Iterator<Item = (&[u8], &[u8])> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .filter_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            Some((&pair[..eq], &pair[eq + 1..]))
        })
}

/// Every copy of the cookie called `name`, in the order sent, joined by `; ` (which no one
/// value holds, so a join is never one value), when any copy names a session
/// ([`names_a_session`]). A browser sends a name twice when a copy was set for a narrower
/// path or by a sibling subdomain, and that copy comes first (RFC 6265 §5.4): an
/// application may read either, so the caller is all of them, and a copy an attacker
/// planted does not make its planter the caller.
///
/// ```
/// use http::HeaderMap;
/// use idemgate::key::identity::session_cookie;
/// let mut headers = HeaderMap::new();
/// headers.append("cookie", "sid=planted; theme=dark".parse().unwrap());
/// headers.append("cookie", "sid=mine".parse().unwrap());
/// assert_eq!(session_cookie(&headers, "sid").as_deref(), Some(&b"planted; mine"[..]));
/// assert_eq!(session_cookie(&headers, "theme").as_deref(), Some(&b"dark"[..]));
/// headers.insert("cookie", "sid=deleted".parse().unwrap());
/// assert_eq!(session_cookie(&headers, "sid"), None);
/// ```
pub fn session_cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<Cow<'h, [u8]>> {
    let mut copies = cookies(headers).filter(|(n, _)| *n == name.as_bytes());
    let (_, first) = copies.next()?;
    let mut named = names_a_session(first);
    let mut joined: Option<Vec<u8>> = None;
    for (_, value) in copies {
        named |= names_a_session(value);
        let all = joined.get_or_insert_with(|| first.to_vec());
        all.extend_from_slice(b"; ");
        all.extend_from_slice(value);
    }
    named.then(|| joined.map_or(Cow::Borrowed(first), Cow::Owned))
}

/// An address block: `10.0.0.0/8`, `fd00::/8`, or one address (`/32`, `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether every address of the block is one no public client can have: private,
    /// loopback, link-local, shared (CGNAT) or unique-local. A trusted block holding public
    /// addresses lets any client there write its own `X-Forwarded-For`.
    pub fn is_private(&self) -> bool {
        let private_v4 = |ip: Ipv4Addr| {
            ip.is_private()
                || ip.is_loopback()
                || ip.is_link_local()
                // 100.64.0.0/10, shared address space (RFC 6598).
                || (ip.octets()[0] == 100 && (ip.octets()[1] & 0xc0) == 64)
        };
        let private_v6 = |ip: Ipv6Addr| {
            let first = ip.segments()[0];
            ip.is_loopback() || (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80
        };
        match self.network {
            IpAddr::V4(net) => {
                let last =
                    u32::from(net) | u32::MAX.checked_shr(u32::from(self.prefix)).unwrap_or(0);
                private_v4(net) && private_v4(Ipv4Addr::from(last))
            }
            IpAddr::V6(net) => {
                let last =
                    u128::from(net) | u128::MAX.checked_shr(u32::from(self.prefix)).unwrap_or(0);
                private_v6(net) && private_v6(Ipv6Addr::from(last))
            }
        }
    }

    /// Whether `ip` is inside the block (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(ip) & mask == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(ip) & mask == u128::from(net)
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IP address"))?;
        let network = network.to_canonical();
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("prefix length {p:?} must be 0 to {max}"))?,
        };
        let cidr = Self { network, prefix };
        let masked = match network {
            IpAddr::V4(ip) => IpAddr::V4(std::net::Ipv4Addr::from(
                u32::from(ip) & u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0),
            )),
            IpAddr::V6(ip) => IpAddr::V6(std::net::Ipv6Addr::from(
                u128::from(ip) & u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0),
            )),
        };
        if masked != network {
            return Err(format!(
                "{s} has bits set past its prefix; write {masked}/{prefix}"
            ));
        }
        Ok(cidr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// The `trusted_proxies` list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<Cidr>);

impl FromIterator<Cidr> for TrustedProxies {
    fn from_iter<I: IntoIterator<Item = Cidr>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl TrustedProxies {
    /// Whether no proxy is trusted (then the client address is always the TCP peer).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The blocks, as configured.
    pub fn blocks(&self) -> &[Cidr] {
        &self.0
    }

    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(ip))
    }

    /// The client's address: `peer`, or behind a trusted peer the right-most
    /// `X-Forwarded-For` entry that is not trusted (the left-most when all are). A trusted
    /// peer that sends no `X-Forwarded-For` is itself the client (a call from inside the
    /// trusted network), unless it sends `Forwarded` (RFC 7239) or `X-Real-IP` (nginx's
    /// `proxy_set_header X-Real-IP $remote_addr`), neither read here: a
    /// proxy that names its client only there, one whose header reaches a malformed entry
    /// before an untrusted one, or one whose header holds no entry at all forwards a client
    /// this cannot name: taking the peer instead would make every such client behind it
    /// one caller.
    pub fn client_address(&self, peer: IpAddr, headers: &HeaderMap) -> ClientAddress {
        let peer = peer.to_canonical();
        if self.0.is_empty() || !self.contains(peer) {
            return ClientAddress::Named(peer);
        }
        let mut fields = headers.get_all(&X_FORWARDED_FOR).iter().rev().peekable();
        if fields.peek().is_none() {
            return if headers.contains_key(http::header::FORWARDED)
                || headers.contains_key(&X_REAL_IP)
            {
                ClientAddress::Unnamed
            } else {
                ClientAddress::Named(peer)
            };
        }
        let mut client = None;
        for value in fields {
            for entry in value.as_bytes().rsplit(|&b| b == b',') {
                let entry = entry.trim_ascii();
                if entry.is_empty() {
                    continue;
                }
                let Some(ip) = parse_entry(entry) else {
                    return ClientAddress::Unnamed;
                };
                if !self.contains(ip) {
                    return ClientAddress::Named(ip);
                }
                client = Some(ip);
            }
        }
        client.map_or(ClientAddress::Unnamed, ClientAddress::Named)
    }
}

/// nginx's one-address client field: a sign that a trusted peer forwards someone else.
pub(crate) const X_REAL_IP: http::HeaderName = http::HeaderName::from_static("x-real-ip");

/// Who the client is, as far as its address tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAddress {
    /// The TCP peer, or the address a trusted proxy's `X-Forwarded-For` names.
    Named(IpAddr),
    /// A trusted proxy forwarded a client it could not name (`X-Forwarded-For: unknown`,
    /// an obfuscated name, an empty header): it cannot be told from any other client
    /// behind that proxy.
    Unnamed,
}

/// One `X-Forwarded-For` entry: an IPv4 or IPv6 address, the latter bracketed or not, with
/// or without a port (`203.0.113.9:51234`, `[2001:db8::1]:443`: Azure Application Gateway
/// and some others write the client's port). `unknown` and obfuscated names are not
/// addresses.
pub(crate) fn parse_entry(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?;
    let is_port = |p: &str| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit());
    let ip = if let Ok(ip) = text.parse::<IpAddr>() {
        ip
    } else if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !after.is_empty() && !after.strip_prefix(':').is_some_and(is_port) {
            return None;
        }
        inside.parse::<IpAddr>().ok()?
    } else {
        // Only IPv4 takes an unbracketed port: in `2001:db8::1:443` the port cannot be told
        // from the address.
        let (addr, port) = text.split_once(':')?;
        if !is_port(port) {
            return None;
        }
        IpAddr::V4(addr.parse::<Ipv4Addr>().ok()?)
    };
    Some(ip.to_canonical())
}

mod placeholder;
#[cfg(test)]
mod tests;
