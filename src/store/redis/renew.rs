//! The Redis side of renewing a live claim: the store's renewing task (shared by the
//! backends, `store::renewals`) calls [`Renew::renew`], which extends the owner's record by
//! its lease plus lapse span, or writes it back when the record is gone (a Redis restarted
//! empty, or failed over without it), fenced by the owner token either way.

use redis::Value;

use super::records::claim_value;
use super::{unexpected, RedisStore};
use crate::store::renewals::{HeldClaim, Renew, Renewed};
use crate::store::{OwnerToken, StoreError};

impl RedisStore {
    /// `I` and the owner token: what fences a renewal.
    fn fence(token: OwnerToken) -> [u8; 17] {
        let mut fence = [0; 17];
        fence[0] = b'I';
        fence[1..].copy_from_slice(&token.0.to_be_bytes());
        fence
    }

    /// Renews (or restores, see the module doc) a claim for its lease plus lapse span from
    /// now.
    async fn renew_claim(&self, claim: &HeldClaim) -> Result<Renewed, StoreError> {
        let px = (claim.lease + claim.lapse.span()).as_millis().max(1) as u64;
        let mut invocation = self.scripts.renew.prepare_invoke();
        invocation
            .key(self.record(&claim.key))
            .key(self.seen_counter(&claim.key))
            .arg(&Self::fence(claim.token)[..])
            .arg(px)
            .arg(&claim_value(claim.token, claim.fingerprint, claim.lapse)[..]);
        match self.run(invocation).await? {
            Value::Int(1) => Ok(Renewed::Extended),
            Value::Int(2) => Ok(Renewed::Restored),
            Value::Int(0) => Ok(Renewed::Lost),
            other => Err(unexpected(&other)),
        }
    }
}

impl Renew for RedisStore {
    async fn renew(&self, claim: &HeldClaim) -> Result<Renewed, StoreError> {
        self.renew_claim(claim).await
    }
}
