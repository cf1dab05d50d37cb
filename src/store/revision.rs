//! Which record a key holds, in which state ([`Revision`]): what the admin API's `ETag`
//! names, so an operator's `DELETE` with `If-Match` removes only the record they looked at.
//!
//! A key's record is replaced under an operator's eyes: an unknown outcome expires and a
//! retry stores a new answer, a failure record is taken by its retry, an issued token is
//! used and given back, a claim in flight settles. A purge meant for the old record must
//! not remove the new one (the next retry would run the request once more), so each
//! backend names a record by what it already keeps and never moves while the record
//! stands: the claim's owner token where it keeps one (every claim has its own), and a time
//! (when the record was made, or on the memory store when it expires), with the state
//! shown. The purge compares that name in the same atomic step as its delete.

use super::OwnerToken;

/// One record of a key in one state, as the admin API shows it (`ETag`) and a conditional
/// purge ([`Store::purge`](super::Store::purge)) compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revision {
    /// The state shown, as a letter: `T` issued, `I` in flight, `D` done, `F` failed, `N`
    /// not stored, `U` outcome unknown (a lapsed claim held as one included).
    state: u8,
    /// A time the backend keeps for this record and never moves, in its own unit: when it
    /// was made (Unix ms), or on the memory store when it expires (or, in flight, when it
    /// was claimed), in nanoseconds of the store's clock; 0 where the backend keeps none.
    at: u64,
    /// The owner token of the claim that wrote the record, where the backend keeps it.
    token: Option<OwnerToken>,
}

impl Revision {
    /// The revision of a record shown as `state` (one of [`KeyInfo::state`]'s names).
    ///
    /// [`KeyInfo::state`]: super::KeyInfo::state
    pub fn new(state: &str, at: u64, token: Option<OwnerToken>) -> Self {
        let state = match state {
            "issued" => b'T',
            "in_flight" => b'I',
            "done" => b'D',
            "failed" => b'F',
            "not_stored" => b'N',
            "outcome_unknown" => b'U',
            // No backend shows another state; a letter none matches keeps it apart.
            _ => b'?',
        };
        Self { state, at, token }
    }

    /// The state's letter (see the field).
    pub(crate) fn state(&self) -> u8 {
        self.state
    }

    /// The time it names (see the field).
    pub(crate) fn at(&self) -> u64 {
        self.at
    }

    /// The owner token it names, if the backend keeps one for the record.
    pub(crate) fn token(&self) -> Option<OwnerToken> {
        self.token
    }

    /// As the `ETag` field value: a strong entity tag, `"` state letter, 16 hex digits of
    /// the time, then 32 of the token when there is one, `"`.
    pub fn etag(&self) -> String {
        let mut tag = format!("\"{}{:016x}", char::from(self.state), self.at);
        if let Some(token) = self.token {
            tag.push_str(&format!("{:032x}", token.0));
        }
        tag.push('"');
        tag
    }

    /// The revision an entity tag names, if it is one [`Revision::etag`] wrote (a weak
    /// tag never is: `If-Match` compares strongly, RFC 9110 §13.1.1).
    pub fn from_etag(tag: &str) -> Option<Self> {
        let inner = tag.strip_prefix('"')?.strip_suffix('"')?;
        let state = *inner.as_bytes().first()?;
        if !b"TIDFNU".contains(&state) {
            return None;
        }
        let hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let (at, token) = inner[1..].split_at_checked(16)?;
        if !hex(at) || !hex(token) {
            return None;
        }
        let at = u64::from_str_radix(at, 16).ok()?;
        let token = match token.len() {
            0 => None,
            32 => Some(OwnerToken(u128::from_str_radix(token, 16).ok()?)),
            _ => return None,
        };
        Some(Self { state, at, token })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etag_reads_back_as_its_revision() {
        let revisions = [
            Revision::new("done", 1_717_000_000_123, None),
            Revision::new("outcome_unknown", 7, Some(OwnerToken(u128::MAX - 5))),
            Revision::new("issued", 0, Some(OwnerToken(1))),
        ];
        for revision in revisions {
            assert_eq!(Revision::from_etag(&revision.etag()), Some(revision));
        }
        assert_eq!(revisions[0].etag(), "\"D0000018fc52cd27b\"");
    }

    #[test]
    fn only_the_tags_it_writes_name_a_revision() {
        let good = Revision::new("failed", 42, Some(OwnerToken(9))).etag();
        let weak = format!("W/{good}");
        let unquoted = good.trim_matches('"').to_owned();
        let upper = good.to_uppercase();
        let cut = format!("{}\"", &good[..good.len() - 2]);
        for bad in [
            weak.as_str(),
            &unquoted,
            &upper,
            &cut,
            "\"\"",
            "\"X0000000000000000\"",
            "\"D000000000000000\"",
            "*",
        ] {
            assert_eq!(Revision::from_etag(bad), None, "{bad}");
        }
    }
}
