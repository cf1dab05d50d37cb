//! What a claim names: the key and its payload fingerprint ([`ClaimArgs`]), which records it
//! may start from ([`ClaimMode`]), what a lapsed claim of the key means ([`Lapse`]), and the
//! ownership a successful claim creates ([`OwnerToken`], [`Ownership`]). Plain values every
//! backend reads; none of them knows a backend.
//!
//! Add a field here when every backend must honour it; a backend-only knob belongs in that
//! backend's settings.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use crate::key::Digest;

/// Identifies one ownership of a key; settling must present it (fencing), so an owner
/// whose claim was taken over cannot touch the new owner's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(pub u128);

impl OwnerToken {
    /// A fresh random token.
    pub fn random() -> Self {
        Self(rand::random())
    }
}

/// Which records a claim may start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimMode {
    /// A free key becomes owned (client keys, fields, fingerprints).
    Any,
    /// Only a key issued beforehand (a one-time token) becomes owned, consuming the issue
    /// record in the same atomic step.
    IssuedOnly,
}

/// What a lapsed claim (its owner stopped renewing it for a whole lease) means. The dead
/// owner's request may have reached the upstream, so it is never simply free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lapse {
    /// The key is held as "outcome unknown" for `ttl` after the lapse (until an operator
    /// purges it): no retry executes it again (`on_unknown_outcome: hold`).
    Hold {
        /// How long the unknown state lasts.
        ttl: Duration,
    },
    /// A retry takes the key over, but only `grace` after the lapse, when the dead owner's
    /// upstream call cannot still be running (`on_unknown_outcome: release`).
    Release {
        /// The longest the dead owner's call could still run after its last renewal.
        grace: Duration,
    },
}

impl Lapse {
    /// How long a lapsed claim stays in its store after its lease ran out.
    pub fn span(self) -> Duration {
        match self {
            Self::Hold { ttl } => ttl,
            Self::Release { grace } => grace,
        }
    }
}

/// One claim attempt.
#[derive(Debug, Clone, Copy)]
pub struct ClaimArgs {
    /// The key to claim.
    pub key: Digest,
    /// The request's payload fingerprint ([`Digest::NONE`]: nothing to compare).
    pub fingerprint: Digest,
    /// How long the claim outlives an owner that stops renewing it.
    pub lease: Duration,
    /// What a lapsed claim of this key means.
    pub lapse: Lapse,
    /// Whether only an issued key may be owned.
    pub mode: ClaimMode,
    /// For a one-time token ([`ClaimMode::IssuedOnly`]): until when it goes back to
    /// issued when its claim ends without the request having run, so the caller can retry
    /// with it (`None`: the key is simply freed): its expiry as issued, so failing attempts
    /// never keeps a token alive longer. The owner's [`Lease`](super::Lease) keeps it for
    /// the settlement it writes, or its drop does ([`token_left`](super::settlement::token_left)).
    pub reissue: Option<SystemTime>,
    /// Whether a duplicate that finds the key in flight will wait for it (on Redis a
    /// waiter subscribes and marks the record; one that will not gets a waiter that
    /// returns at once).
    pub waits: bool,
    /// The owner a duplicate waited on: if that owner failed and released the key, this
    /// claim gets its failure ([`Claim::Failed`](super::Claim::Failed)) instead of a turn
    /// of its own.
    pub after: Option<OwnerToken>,
    /// With [`ClaimArgs::after`]: the waiter's last look found that owner's claim lapsed
    /// on a route that releases lapsed claims ([`Lapse::Release`]), so a key found free
    /// now was freed by the lapse's end and this claim may take it over
    /// ([`Waiter::owner_lapsed`](super::Waiter::owner_lapsed)). Otherwise a waiter never
    /// takes a free key: its owner settled it (released it, or its failure's record
    /// expired before the waiter looked), and only a later request executes again.
    pub takes_over: bool,
    /// The route's tag for the store's own metrics (evictions by route).
    pub route: RouteTag,
    /// Whose request it is, for a store that limits what one caller may hold
    /// ([`CallerTag::NONE`]: not counted).
    pub caller: CallerTag,
    /// The client address it came from, for a store that limits what one address may
    /// hold ([`AddressTag::NONE`]: not counted).
    pub address: AddressTag,
}

impl ClaimArgs {
    /// A plain claim: any key, a duplicate waits, a lapsed claim is held as unknown for a
    /// day.
    pub fn new(key: Digest, fingerprint: Digest, lease: Duration) -> Self {
        Self {
            key,
            fingerprint,
            lease,
            lapse: Lapse::Hold {
                ttl: Duration::from_secs(24 * 3600),
            },
            mode: ClaimMode::Any,
            reissue: None,
            waits: true,
            after: None,
            takes_over: false,
            route: RouteTag::default(),
            caller: CallerTag::NONE,
            address: AddressTag::NONE,
        }
    }
}

/// A caller (one scope) as a store that limits its share knows it: 32 bits keyed from the
/// scope's digest ([`counted_tag`]). Two callers that collide only share a limit, never a key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CallerTag(pub u32);

impl CallerTag {
    /// Not counted.
    pub const NONE: CallerTag = CallerTag(0);

    /// The tag of a caller whose scope digest is `scope`.
    pub fn of(scope: &Digest) -> Self {
        Self(counted_tag(scope))
    }
}

/// A client address (as the token endpoint's per-address rate takes it) as a store that
/// limits its share knows it: 32 bits keyed from the address's digest ([`counted_tag`]).
/// Callers name themselves (any made-up credential is a new one), addresses do not: this
/// is what bounds a flood of made-up callers. Two addresses that collide only share a limit, never a key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AddressTag(pub u32);

impl AddressTag {
    /// Not counted.
    pub const NONE: AddressTag = AddressTag(0);

    /// The tag of a client address whose digest is `address`.
    pub fn of(address: &Digest) -> Self {
        Self(counted_tag(address))
    }
}

/// 32 bits of `digest` under a key drawn once per process, never 0: zero means "not
/// counted". Keyed, since the digests are public (a hash of what the client sends): a
/// client could otherwise pick addresses (an IPv6 /48 holds 65,536 /64s) or credentials
/// whose tags fall on a victim's, above all in the 16 bits a tag keeps beside another, and
/// spend its share for it.
fn counted_tag(digest: &Digest) -> u32 {
    static KEY: OnceLock<RandomState> = OnceLock::new();
    let hashed = KEY.get_or_init(RandomState::new).hash_one(digest.0);
    ((hashed ^ hashed >> 32) as u32).max(1)
}

/// A route as the store knows it: a small number, which the proxy's metrics map back to
/// the route's name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteTag(pub u16);

/// One ownership of a key, as its settlement names it: the key, the owner's token, and
/// what its claim wrote (the payload fingerprint and the lapse rule), which the Redis store
/// rebuilds the in-flight record from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    /// The owned key.
    pub key: Digest,
    /// The fencing token.
    pub token: OwnerToken,
    /// The claim's payload fingerprint.
    pub fingerprint: Digest,
    /// The claim's lapse rule.
    pub lapse: Lapse,
}

/// Whether two payload fingerprints disagree; [`Digest::NONE`] on either side never does.
pub(crate) fn mismatched(stored: &Digest, offered: &Digest) -> bool {
    stored != offered && *stored != Digest::NONE && *offered != Digest::NONE
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tag is not a function of the public digest alone: were it the digest's first bits
    ///, a client could compute which addresses or credentials share a
    /// victim's tag. Sixteen digests all giving their own first 32 bits would take a
    /// 2^-512 chance.
    #[test]
    fn tags_are_keyed_so_clients_cannot_aim_them_at_another() {
        let digests: Vec<Digest> = (0..16u8).map(|i| Digest([i; 32])).collect();
        let unkeyed = |d: &Digest| u32::from_le_bytes([d.0[0], d.0[1], d.0[2], d.0[3]]).max(1);
        assert!(digests.iter().any(|d| AddressTag::of(d).0 != unkeyed(d)));
        assert!(digests.iter().any(|d| CallerTag::of(d).0 != unkeyed(d)));
        for d in &digests {
            assert_ne!(AddressTag::of(d), AddressTag::NONE);
            assert_eq!(AddressTag::of(d), AddressTag::of(d), "one process, one tag");
        }
    }
}
