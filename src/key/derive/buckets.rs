//! The buckets the token endpoint counts requests in: the caller's (its scope, as the
//! token is bound to it), the client address's, and one for every caller at once. A
//! made-up `Authorization` is a new caller, so only the address and the total bound what
//! one client, or many, can make the store hold.

use std::net::IpAddr;

use super::{hash_scope, KeyHasher, RequestView};
use crate::key::identity::ClientAddress;
use crate::key::{Digest, ScopePart};

/// The rate-limit bucket of a caller. The clients a trusted proxy could not name share
/// one bucket per proxy: merged buckets are only stricter.
pub fn scope_digest(scope: &[ScopePart], req: &RequestView<'_>) -> Digest {
    hashed_scope(scope, req).0
}

/// [`scope_digest`], or `None` when the scope holds the address of a client a trusted
/// proxy could not name: a token bound to it could not be told from another such
/// client's, so its every use would be forwarded unprotected, and none is issued.
pub fn named_scope_digest(scope: &[ScopePart], req: &RequestView<'_>) -> Option<Digest> {
    let (digest, unnamed) = hashed_scope(scope, req);
    (!unnamed).then_some(digest)
}

/// The caller's bucket, and whether its scope holds an unnamed client's address.
fn hashed_scope(scope: &[ScopePart], req: &RequestView<'_>) -> (Digest, bool) {
    let mut hasher = KeyHasher::new(b"idemgate:scope:v1");
    let unnamed = hash_scope(&mut hasher, scope, req, None);
    (hasher.finish(), unnamed)
}

/// The rate-limit bucket of the client address (nginx's `$binary_remote_addr`): the peer,
/// or behind a trusted proxy the client its `X-Forwarded-For` names, as `client_ip`
/// scopes take it. An IPv6 client counts by its /64: one host is given a whole /64 and
/// may send from any address in it. A client a trusted proxy could not name counts as
/// that proxy (merged buckets are only stricter); the headers an unlisted balancer sends
/// are not read here, since its clients could write any, so its clients share its
/// address until it is listed in `trusted_proxies`. `None` without a peer.
pub fn address_digest(req: &RequestView<'_>) -> Option<Digest> {
    let ip = match req.client_address()? {
        ClientAddress::Named(ip) => ip,
        ClientAddress::Unnamed => req.peer?,
    };
    let mut hasher = KeyHasher::new(b"idemgate:address:v1");
    match ip.to_canonical() {
        IpAddr::V4(v4) => hasher.field(&v4.octets()),
        IpAddr::V6(v6) => hasher.field(&v6.octets()[..8]),
    }
    Some(hasher.finish())
}

/// The one bucket every token issued counts in, on every replica sharing the store: what
/// bounds the unspent tokens a shared store holds, whatever addresses ask.
pub fn token_budget_digest() -> Digest {
    KeyHasher::new(b"idemgate:token-budget:v1").finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::identity::Identity;
    use crate::route::Overrides;

    fn from(peer: &str, xff: Option<&str>, identity: &Identity) -> Option<Digest> {
        let mut headers = http::HeaderMap::new();
        if let Some(xff) = xff {
            headers.insert("x-forwarded-for", xff.parse().unwrap());
        }
        let view = RequestView {
            route: "",
            method: &http::Method::POST,
            path: "/",
            query: None,
            headers: &headers,
            overrides: Overrides::find(&headers),
            peer: Some(peer.parse().unwrap()),
            identity,
            client_cert: None,
            body: &[],
        };
        address_digest(&view)
    }

    #[test]
    fn an_ipv6_client_counts_by_its_64_and_an_ipv4_one_by_its_address() {
        let identity = Identity::default();
        let at = |peer| from(peer, None, &identity);
        assert_eq!(
            at("2001:db8:1:2::1"),
            at("2001:db8:1:2:ffff:ffff:ffff:ffff")
        );
        assert_ne!(at("2001:db8:1:2::1"), at("2001:db8:1:3::1"));
        assert_ne!(at("198.51.100.7"), at("198.51.100.8"));
        assert_eq!(at("::ffff:198.51.100.7"), at("198.51.100.7"));
        // An IPv4 address is never the first half of an IPv6 one.
        assert_ne!(at("0.0.0.0"), at("::"));
    }

    #[test]
    fn an_unlisted_balancers_headers_name_no_other_address() {
        let identity = Identity::default();
        assert_eq!(
            from("192.0.2.1", Some("203.0.113.9"), &identity),
            from("192.0.2.1", None, &identity)
        );
    }
}
