//! Whose a record is, for the memory store's shares: its caller (`caller_share`) and its
//! client address (`address_share`), packed into the 32 bits a record has room for
//! ([`Tags`]). A done record is the map value itself and must stay 32 bytes (see
//! `record`), which leaves 4 bytes beside its answer, expiry and route. A share not set
//! counts nothing, so the other gets all 32 bits; with both set each gets 16, folded from
//! its 32: two callers (addresses) whose tags collide only share a limit, never a key.

use super::MemoryLimits;
use crate::store::{AddressTag, CallerTag};

/// The caller and the client address a record counts against, as its store's [`Layout`]
/// packed them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Tags(u32);

/// How a store packs [`Tags`]: fixed by its limits for its whole life, so each record is
/// unpacked (its counts taken back) as it was packed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Layout {
    /// No share set: nothing counted.
    #[default]
    Neither,
    /// `caller_share` alone: the caller's tag, whole.
    Callers,
    /// `address_share` alone: the address's tag, whole.
    Addresses,
    /// Both: the caller's 16 bits above the address's.
    Both,
}

impl Layout {
    pub fn of(limits: &MemoryLimits) -> Self {
        match (limits.counts_callers(), limits.counts_addresses()) {
            (false, false) => Self::Neither,
            (true, false) => Self::Callers,
            (false, true) => Self::Addresses,
            (true, true) => Self::Both,
        }
    }

    /// The tags of a record claimed by `caller` from `address`, each kept only where its
    /// share is counted.
    pub fn pack(self, caller: CallerTag, address: AddressTag) -> Tags {
        Tags(match self {
            Self::Neither => 0,
            Self::Callers => caller.0,
            Self::Addresses => address.0,
            Self::Both => fold(caller.0) << 16 | fold(address.0),
        })
    }

    /// The caller `tags` count against ([`CallerTag::NONE`]: none).
    pub fn caller(self, tags: Tags) -> CallerTag {
        CallerTag(match self {
            Self::Callers => tags.0,
            Self::Both => tags.0 >> 16,
            Self::Neither | Self::Addresses => 0,
        })
    }

    /// The client address `tags` count against ([`AddressTag::NONE`]: none).
    pub fn address(self, tags: Tags) -> AddressTag {
        AddressTag(match self {
            Self::Addresses => tags.0,
            Self::Both => tags.0 & 0xffff,
            Self::Neither | Self::Callers => 0,
        })
    }
}

/// A tag in 16 bits, both halves mixed in; 0 ("not counted") only from 0.
fn fold(tag: u32) -> u32 {
    if tag == 0 {
        0
    } else {
        ((tag ^ tag >> 16) & 0xffff).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With both shares, each tag comes back as its 16 bits, never as "not counted", and
    /// a tag not given stays not counted; with one share, that tag comes back whole.
    #[test]
    fn tags_unpack_as_packed() {
        for (caller, address) in [(0x0001_0001, 7), (u32::MAX, 0), (0, 0xdead_beef)] {
            let tags = Layout::Both.pack(CallerTag(caller), AddressTag(address));
            let (c, a) = (Layout::Both.caller(tags), Layout::Both.address(tags));
            assert_eq!((c.0 == 0, a.0 == 0), (caller == 0, address == 0));
            assert!(c.0 <= 0xffff && a.0 <= 0xffff);
        }
        let tags = Layout::Callers.pack(CallerTag(u32::MAX), AddressTag(9));
        assert_eq!(Layout::Callers.caller(tags), CallerTag(u32::MAX));
        assert_eq!(Layout::Callers.address(tags), AddressTag::NONE);
        let tags = Layout::Addresses.pack(CallerTag(9), AddressTag(u32::MAX));
        assert_eq!(Layout::Addresses.address(tags), AddressTag(u32::MAX));
        assert_eq!(Layout::Addresses.caller(tags), CallerTag::NONE);
    }
}
