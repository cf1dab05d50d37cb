//! The default caller ([`ScopePart::Caller`](crate::key::ScopePart::Caller)): every
//! credential a request carries, each hashed after its tier's name, and what `explain`
//! says of them (never their values). The rules are in [`crate::key::identity`].

use std::net::IpAddr;

use http::{header, HeaderMap};

use super::{header_value, KeyHasher, RequestView};
use crate::key::identity::{
    carries_credential, cookies, names_a_session, parse_entry, ClientAddress, Tier, X_REAL_IP,
};
use crate::proxy::headers::X_FORWARDED_FOR;

/// The parts of the default identity a request was told apart by.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Caller {
    authorization: bool,
    client_certificate: bool,
    /// Session cookies of a listed name ([`Identity::is_named_session_cookie`]), with the
    /// cookies named like a credential or a session beside them.
    ///
    /// [`Identity::is_named_session_cookie`]: crate::key::identity::Identity::is_named_session_cookie
    session: bool,
    credential_headers: bool,
    /// Beside an `Authorization` credential without a session: the whole `Cookie` header.
    cookie_jar: bool,
    /// Neither an `Authorization` credential nor a session: the client address, with the
    /// whole `Cookie` header when cookies were sent ([`Tier::CookieHeader`]).
    fallback: Option<Tier>,
    /// The client address it holds is one a trusted proxy could not name.
    unnamed: bool,
}

impl Caller {
    /// Whether the client address is part of it (no `Authorization` credential, no session).
    pub(super) fn by_address(&self) -> bool {
        self.fallback.is_some()
    }

    /// Whether it holds the address of a client a trusted proxy could not name, and so
    /// cannot be told from any other such client.
    pub(super) fn unnamed(&self) -> bool {
        self.unnamed
    }
}

/// The default identity ([`ScopePart::Caller`](crate::key::ScopePart::Caller)): every
/// credential the request carries, each part's name hashed before its value so parts never
/// collide. See [`crate::key::identity`].
pub(super) fn hash_caller(hasher: &mut KeyHasher, req: &RequestView<'_>) -> Caller {
    let headers = req.headers;
    let mut caller = Caller::default();
    // An empty or placeholder value (`Bearer null` from a logged-out page) is sent alike by
    // every anonymous caller: it names no one, so it is left out.
    if has_credential(headers) {
        if let Some(auth) = header_value(headers, &header::AUTHORIZATION) {
            hasher.field(Tier::Authorization.as_str().as_bytes());
            hasher.field(&auth);
            caller.authorization = true;
        }
    }
    // Beside the others, never instead of them: a gateway or a mesh sidecar may present
    // one certificate for every user it relays.
    if let Some(certificate) = req.client_cert {
        hasher.field(Tier::ClientCertificate.as_str().as_bytes());
        hasher.field(certificate);
        caller.client_certificate = true;
    }
    // Beside an `Authorization` too: one shared credential (a basic-auth gate) in front of
    // per-user sessions must not merge the users. A cleared session (empty, `deleted`, a
    // placeholder) is shared by every logged-out browser. Only a listed name makes a
    // session: a cookie only a pattern takes (`ab_session` by `*_session`) may be an A/B
    // test's, sent alike by many users whose own session has a name no rule knows
    // (`CAKEPHP`), so it goes with the whole jar and the address, as unlisted ones do.
    caller.session = cookies(headers)
        .any(|(name, value)| req.identity.is_named_session_cookie(name) && names_a_session(value));
    if caller.session {
        hasher.field(Tier::SessionCookie.as_str().as_bytes());
        // In the order sent (a browser sends its jar in one order), with every cookie named
        // like a credential or a session: a listed name may not be the app's session (a
        // copy a sibling subdomain planted), and the app's own, under a name not listed,
        // must still keep its users apart. Pairs as the listed ones are
        // hashed, so a request of listed sessions alone keeps the key it always had.
        for (name, value) in identifying_cookies(req) {
            hasher.field(name);
            hasher.field(value);
        }
    }
    // Most requests carry none: one pass over the names sent before any lookup, which
    // then goes in the configured order, whatever order the request has.
    let credentials = &req.identity.credential_headers;
    let any_credential = headers.keys().any(|sent| credentials.contains(sent));
    for name in credentials.iter().filter(|_| any_credential) {
        if let Some(value) = header_value(headers, name) {
            hasher.field(Tier::CredentialHeader.as_str().as_bytes());
            hasher.field(name.as_str().as_bytes());
            hasher.field(&value);
            caller.credential_headers = true;
        }
    }
    if caller.session {
        return caller;
    }
    if caller.authorization {
        // One `Authorization` may be every user's (a staging site's basic-auth gate, a
        // gateway's own token) while the app tells them apart by a cookie of a name not
        // listed (`next-auth.session-token`): the cookies go in beside it, as they go in
        // beside the address below.
        if headers.contains_key(header::COOKIE) {
            hasher.field(Tier::CookieHeader.as_str().as_bytes());
            hash_cookie_jar(hasher, headers);
            caller.cookie_jar = true;
        }
        return caller;
    }
    // A credential header alone may be one key for every user of an app: the address
    // still tells them apart.
    if headers.contains_key(header::COOKIE) {
        // Cookies of no listed name may be a session under another name, or may be the
        // same consent or theme cookie many people send: with the address, a session
        // keeps two browsers apart and a shared cookie cannot merge two people.
        hasher.field(Tier::CookieHeader.as_str().as_bytes());
        hash_cookie_jar(hasher, headers);
        caller.unnamed = hash_address(hasher, req) == Some(ClientAddress::Unnamed);
        caller.fallback = Some(Tier::CookieHeader);
        return caller;
    }
    hasher.field(Tier::ClientAddress.as_str().as_bytes());
    caller.unnamed = hash_address(hasher, req) == Some(ClientAddress::Unnamed);
    caller.fallback = Some(Tier::ClientAddress);
    caller
}

/// The cookies that could tell their sender apart ([`Identity::could_identify`]), in the
/// order sent, without those whose value names no session ([`names_a_session`]): beside a
/// session, what the default caller hashes; for a `header: Cookie` part, whether the jar
/// names anyone (a jar of preferences alone, `lang=en`, is what many anonymous callers
/// send alike; a piece without `=` names nothing).
///
/// [`Identity::could_identify`]: crate::key::identity::Identity::could_identify
pub(super) fn identifying_cookies<'r>(
    req: &RequestView<'r>,
) -> impl Iterator<Item = (&'r [u8], &'r [u8])> {
    let identity = req.identity;
    cookies(req.headers).filter(move |(n, v)| identity.could_identify(n) && names_a_session(v))
}

/// Every cookie sent, as one field in one spelling: one `Cookie` field (`a=1; b=2`,
/// HTTP/1.1) and the same cookies as separate fields (HTTP/2 may send each on its own, RFC
/// 9113 §8.2.3) are one jar, and a retry over the other protocol is the same caller.
pub(super) fn hash_cookie_jar(hasher: &mut KeyHasher, headers: &HeaderMap) {
    hasher.field(&cookie_jar(headers));
}

/// The cookies sent, in the one spelling `a=1; b=2` whatever fields carried them.
pub(super) fn cookie_jar(headers: &HeaderMap) -> Vec<u8> {
    let crumbs = headers
        .get_all(header::COOKIE)
        .iter()
        .flat_map(|field| field.as_bytes().split(|&b| b == b';'))
        .map(<[u8]>::trim_ascii)
        .filter(|crumb| !crumb.is_empty());
    let mut jar = Vec::new();
    for crumb in crumbs {
        if !jar.is_empty() {
            jar.extend_from_slice(b"; ");
        }
        jar.extend_from_slice(crumb);
    }
    jar
}

/// Whether any `Authorization` field carries a credential ([`carries_credential`]).
pub(super) fn has_credential(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .any(|v| carries_credential(v.as_bytes()))
}

/// What an unnamed client's address is hashed as, before the proxy's: no address is 7
/// bytes long, so it is never an address's octets.
const UNNAMED: &[u8] = b"unnamed";

/// Hashes the client address ([`RequestView::client_address`]), and returns it: its
/// octets (no formatting per request); the absent marker when none was given; for a client
/// a trusted proxy could not name, [`UNNAMED`] and the proxy's octets, so a token issued
/// to such a client is not the proxy's own and their rate-limit bucket is the proxy's.
pub(super) fn hash_address(hasher: &mut KeyHasher, req: &RequestView<'_>) -> Option<ClientAddress> {
    let address = req.client_address();
    match address {
        Some(ClientAddress::Named(ip)) => match relayed(req) {
            Some(relayed) => {
                hasher.field(RELAYED);
                hash_ip(hasher, ip);
                hasher.field(&relayed);
            }
            None => hash_ip(hasher, ip),
        },
        Some(ClientAddress::Unnamed) => {
            hasher.field(UNNAMED);
            // A trusted proxy is only ever unnamed behind a peer.
            if let Some(peer) = req.peer {
                hash_ip(hasher, peer);
            }
        }
        None => hasher.absent(),
    }
    address
}

/// What the address of a peer relaying others is hashed as, before the peer's: no
/// address is 7 bytes long, and it is not [`UNNAMED`].
const RELAYED: &[u8] = b"relayed";

/// The headers naming a client that a peer outside `trusted_proxies` sent, each after its
/// name, when it sent any: such a peer is a load balancer or proxy nobody listed, relaying
/// many clients from one address, which without them would be one caller. A client that
/// writes them itself only sets itself apart; one relayed client's retries carry the same
/// ones. Never for a trusted peer, whose header already named the client.
fn relayed(req: &RequestView<'_>) -> Option<Vec<u8>> {
    let names = [&X_FORWARDED_FOR, &header::FORWARDED, &X_REAL_IP];
    // One pass over the names sent costs less than three hashed lookups.
    if !req.headers.keys().any(|sent| names.contains(&sent)) {
        return None;
    }
    if req
        .peer
        .is_some_and(|peer| req.identity.trusted_proxies.contains(peer.to_canonical()))
    {
        return None;
    }
    let mut out = Vec::new();
    for name in names {
        if let Some(value) = header_value(req.headers, name) {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            if name == header::FORWARDED {
                out.extend_from_slice(&value);
            } else {
                write_addresses(&value, &mut out);
            }
            out.push(b'\r');
        }
    }
    Some(out)
}

/// `X-Forwarded-For` or `X-Real-IP` entries, each an address without the port some
/// balancers add (Azure Application Gateway's `ip:port`, new on every connection, so a
/// retry on another would be another client), anything else as sent.
fn write_addresses(value: &[u8], out: &mut Vec<u8>) {
    use std::io::Write as _;
    for entry in value.split(|&b| b == b',' || b == b'\n') {
        let entry = entry.trim_ascii();
        match parse_entry(entry) {
            Some(ip) => {
                let _ = write!(out, "{ip}");
            }
            None => out.extend_from_slice(entry),
        }
        out.push(b',');
    }
}

/// An address as its octets.
fn hash_ip(hasher: &mut KeyHasher, ip: IpAddr) {
    match ip.to_canonical() {
        IpAddr::V4(v4) => hasher.field(&v4.octets()),
        IpAddr::V6(v6) => hasher.field(&v6.octets()),
    }
}

/// What `idemgate explain` says of the parts that named the caller, without their values.
pub(super) fn describe_caller(caller: Caller, req: &RequestView<'_>) -> String {
    let address = if req.peer.is_none() {
        "client address (not known here: give --client-ip)"
    } else if caller.unnamed {
        "client address (unnamed: a trusted proxy's X-Forwarded-For names no client)"
    } else if relayed(req).is_some() {
        "client address with what it relays (a peer outside trusted_proxies sent \
         X-Forwarded-For, Forwarded or X-Real-IP: list it if it is your load balancer)"
    } else {
        "client address"
    };
    let mut parts = Vec::new();
    if caller.authorization {
        parts.push("Authorization header".to_owned());
    }
    if caller.client_certificate {
        parts.push("client certificate".to_owned());
    }
    if caller.session {
        let (listed, named): (Vec<_>, Vec<_>) = identifying_cookies(req)
            .map(|(n, _)| {
                (
                    req.identity.is_named_session_cookie(n),
                    String::from_utf8_lossy(n),
                )
            })
            .partition(|(listed, _)| *listed);
        let names = |list: Vec<(bool, std::borrow::Cow<'_, str>)>| {
            list.into_iter()
                .map(|(_, n)| n)
                .collect::<Vec<_>>()
                .join(", ")
        };
        parts.push(format!("session cookie ({})", names(listed)));
        if !named.is_empty() {
            parts.push(format!(
                "cookie named like a credential or a session ({})",
                names(named)
            ));
        }
    }
    let no_session = no_listed_session(req);
    if caller.cookie_jar {
        parts.push(format!("whole Cookie header ({no_session})"));
    }
    match caller.fallback {
        Some(Tier::CookieHeader) => {
            parts.push(format!("whole Cookie header and {address} ({no_session})"))
        }
        Some(_) => parts.push(address.to_owned()),
        None => {}
    }
    if caller.credential_headers {
        let names: Vec<&str> = req
            .identity
            .credential_headers
            .iter()
            .filter(|n| req.headers.contains_key(*n))
            .map(http::HeaderName::as_str)
            .collect();
        parts.push(format!("credential header ({})", names.join(", ")));
    }
    let mut described = format!("caller by {}", parts.join(" + "));
    if !caller.authorization && req.headers.contains_key(header::AUTHORIZATION) {
        described.push_str(" (the Authorization header carries no credential)");
    }
    described
}

/// Why the whole `Cookie` header was hashed: no session cookie of a listed name was sent,
/// and which cookies only a pattern takes, which named no session alone.
fn no_listed_session(req: &RequestView<'_>) -> String {
    let mut by_pattern: Vec<std::borrow::Cow<'_, str>> = Vec::new();
    let identity = req.identity;
    for (name, value) in cookies(req.headers) {
        let name = String::from_utf8_lossy(name);
        if identity.is_session_cookie(name.as_bytes())
            && names_a_session(value)
            && !by_pattern.contains(&name)
        {
            by_pattern.push(name);
        }
    }
    let mut why = "no session cookie of a listed name".to_owned();
    match by_pattern.len() {
        0 => {}
        1 => why.push_str(&format!("; {} matches only a pattern", by_pattern[0])),
        _ => why.push_str(&format!("; {} match only a pattern", by_pattern.join(", "))),
    }
    why
}
