//! Key rules and key derivation: how a request becomes the digest the store claims.
//!
//! A key is SHA-256 over the route name, the method, the caller's scope and the rule's
//! material (client key, chosen fields, or the canonical request). Only digests reach the
//! store, so neither client keys nor caller secrets are ever stored as keys.

pub mod client_key;
pub mod derive;
pub mod identity;

use std::fmt;

use http::HeaderName;

use crate::canonical::{IgnoreSet, JsonPointer};

pub use derive::head::refusal as head_refusal;
pub use derive::{derive_key, token_digest, Derived, DerivedKey, KeyError, RequestView, Trace};

/// How a route derives its key: one source, whether it must be present, and whose it is.
#[derive(Debug, Clone)]
pub struct KeyRule {
    /// Where the key material comes from.
    pub source: KeySource,
    /// When the material is missing: `true` answers 400, `false` lets the request pass unprotected.
    pub required: bool,
    /// Identity mixed into the key so two callers never share one.
    pub scope: Vec<ScopePart>,
    /// What the payload check of a `header` or `token` key covers: the fingerprint stored
    /// beside the client key, whose mismatch on reuse is a 422 (the route's
    /// `fingerprint:` beside `header:`, else query and body minus the default ignore list).
    pub payload: Box<FingerprintRule>,
}

/// The one source of a route's key material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A client-supplied key header (Stripe / IETF httpapi semantics).
    Header(HeaderName),
    /// JSON pointers into the body; their canonical values are the key.
    Fields(Vec<JsonPointer>),
    /// The canonical request itself: path, query and body, minus ignored fields.
    Fingerprint(Box<FingerprintRule>),
    /// A one-time token issued by idemgate (`POST /.idemgate/token`), sent in this header.
    Token(TokenRule),
}

/// A route that requires one-time tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRule {
    /// The header the token comes in.
    pub header: HeaderName,
    /// How long a token whose attempt failed (released) stays usable again.
    pub reissue_ttl: std::time::Duration,
}

impl KeySource {
    /// Short name for logs and `idemgate check`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Header(_) => "header",
            Self::Fields(_) => "fields",
            Self::Fingerprint(_) => "fingerprint",
            Self::Token(_) => "token",
        }
    }
}

/// What a fingerprint key covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FingerprintRule {
    /// Include the canonical query string.
    pub query: bool,
    /// Include the canonical body.
    pub body: bool,
    /// Fields left out (defaults plus the route's own).
    pub ignore: IgnoreSet,
}

/// One part of the caller's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopePart {
    /// The default identity: `Authorization`, else the session cookie(s), else the whole
    /// `Cookie` header with the client address, else the client address
    /// ([`identity`]); the tier used is hashed with its value.
    Caller,
    /// A request header's value (e.g. `Authorization`, `X-User-Id`).
    Header(HeaderName),
    /// A cookie's value.
    Cookie(String),
    /// The client's address: the TCP peer, or behind a trusted proxy the address its
    /// `X-Forwarded-For` names.
    ClientIp,
    /// The SHA-256 of the client's TLS certificate (mutual TLS).
    ClientCert,
}

impl ScopePart {
    /// The label as a fixed kind and a name (`header:` and `authorization`): what
    /// `Display` writes and the key derivation hashes, without formatting per request.
    pub fn label(&self) -> (&'static str, &str) {
        match self {
            Self::Header(name) => ("header:", name.as_str()),
            Self::Cookie(name) => ("cookie:", name),
            Self::Caller => ("caller", ""),
            Self::ClientIp => ("client_ip", ""),
            Self::ClientCert => ("client_cert", ""),
        }
    }
}

impl fmt::Display for ScopePart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, name) = self.label();
        f.write_str(kind)?;
        f.write_str(name)
    }
}

/// The default scope: the caller, by the first identity the request has ([`identity`]).
pub fn default_scope() -> Vec<ScopePart> {
    vec![ScopePart::Caller]
}

impl FingerprintRule {
    /// Query and body, minus the default ignore list: the default fingerprint, and the
    /// default payload check of header and token keys.
    pub fn standard() -> Self {
        Self {
            query: true,
            body: true,
            ignore: IgnoreSet::defaults(),
        }
    }
}

/// A SHA-256 digest: a store key or a request fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// All zeros: "no fingerprint to compare" (fields and fingerprint keys cannot mismatch).
    pub const NONE: Digest = Digest([0; 32]);

    /// Lower-case hex, as shown by logs, the admin API and `idemgate explain`.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits.
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(text, &mut out).ok()?;
        Some(Self(out))
    }

    /// The first 12 hex digits, enough to find a key in logs without printing all of it.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..6])
    }
}

/// Digests are uniformly random already; hashing them again with SipHash is wasted work, so
/// maps keyed by a digest take its first eight bytes as the hash.
#[derive(Default)]
pub struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8).take(1) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(word);
        }
    }
    fn write_usize(&mut self, _: usize) {}
}

/// A map keyed by [`Digest`] with [`DigestHasher`].
pub type DigestMap<V> =
    std::collections::HashMap<Digest, V, std::hash::BuildHasherDefault<DigestHasher>>;

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.short())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
