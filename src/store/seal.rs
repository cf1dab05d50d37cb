//! Stored answers sealed at rest (`store.encrypt`): AES-256-GCM under a key ring whose first
//! key seals and whose every key opens, so keys rotate without losing records written
//! under the old one.
//!
//! Each sealed record names its key by a 4-byte id derived from the key itself (so the config
//! lists key files, not ids), carries a random 96-bit nonce, and is bound to its store key and
//! to what it keeps in clear (the payload fingerprint, the time stored) as associated data: a
//! record copied under another key, or given another fingerprint, does not open. Stores keep
//! sealed records as opaque bytes; the proxy seals before completion and opens after a replay
//! is found ([`crate::store::StoredResponse::seal`], [`crate::store::StoredResponse::open`]).
//!
//! A record in clear (stored before `store.encrypt` was turned on) is read as it is, the
//! migration path, unless the ring refuses it ([`ClearRecords::Refuse`]): whoever can write
//! to the store could otherwise plant an answer of their choosing in clear.
//!
//! ```
//! use idemgate::store::seal::KeyRing;
//! let old = KeyRing::new(vec![[1; 32]]).unwrap();
//! let mut sealed = Vec::new();
//! old.seal(b"store key", b"Set-Cookie: session=s3cr3t", &mut sealed);
//! assert!(!sealed.windows(6).any(|w| w == b"s3cr3t"));
//! // Rotated: a new key writes, the old one still reads.
//! let rotated = KeyRing::new(vec![[2; 32], [1; 32]]).unwrap();
//! assert_eq!(rotated.open(b"store key", &sealed).unwrap(), b"Set-Cookie: session=s3cr3t");
//! assert!(rotated.open(b"another key", &sealed).is_err());
//! ```

use std::fmt;

use aes_gcm::aead::AeadInPlace;
use aes_gcm::{Aes256Gcm, KeyInit, Nonce, Tag};
use sha2::{Digest as _, Sha256};

/// Bytes of a key id.
pub const KEY_ID_LEN: usize = 4;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// What sealing adds to the plaintext: key id, nonce and tag.
pub const SEAL_OVERHEAD: usize = KEY_ID_LEN + NONCE_LEN + TAG_LEN;

/// Why a sealed record could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The record is sealed and no `store.encrypt` is configured.
    #[error("a stored answer is encrypted and no store.encrypt key is configured")]
    NoKeys,
    /// The record's key is not in the ring (removed too early in a rotation).
    #[error("a stored answer is encrypted under key id {0}, which store.encrypt does not list")]
    UnknownKey(String),
    /// The record does not authenticate: damaged, truncated, not this key's, or its clear
    /// fields (payload fingerprint, time stored) changed.
    #[error("a stored answer does not decrypt: damaged, or not written for this key")]
    Corrupt,
    /// The record is in clear and the ring refuses such records (`clear_records: refuse`).
    #[error(
        "a stored answer is in clear, and store.encrypt refuses records in clear (clear_records: refuse)"
    )]
    InClear,
    /// The record was sealed by an earlier idemgate that left its payload fingerprint
    /// outside the seal, and the ring refuses such records (`clear_records: refuse`).
    #[error(
        "a stored answer is sealed without its payload fingerprint bound (by an earlier idemgate), \
         and store.encrypt refuses such records (clear_records: refuse)"
    )]
    FingerprintUnbound,
}

/// What `store.encrypt` does with a stored answer that is not sealed whole: one in clear
/// (stored before encryption was turned on), or one sealed by an earlier idemgate that left
/// its payload fingerprint unbound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ClearRecords {
    /// Replays it: the migration path while answers from before encryption live.
    #[default]
    Accept,
    /// Refuses it as unreadable (500, never replayed, never run again): once the longest
    /// `ttl` has passed since encryption was turned on, no such record is legitimate.
    Refuse,
}

impl ClearRecords {
    /// The setting as written (`accept` or `refuse`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accept => "accept",
            Self::Refuse => "refuse",
        }
    }
}

/// One AES-256 key and its id.
struct SealKey {
    id: [u8; KEY_ID_LEN],
    cipher: Aes256Gcm,
}

/// The keys of `store.encrypt`: the first seals, all open; and whether records not sealed
/// whole are still read ([`ClearRecords`]).
pub struct KeyRing {
    keys: Vec<SealKey>,
    clear_records: ClearRecords,
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Ids only: never key material.
        f.debug_list()
            .entries(self.keys.iter().map(|k| hex::encode(k.id)))
            .finish()
    }
}

/// The id of a key: the first bytes of a hash of it, so records name their key without the
/// config naming it and without revealing anything of it.
pub fn key_id(key: &[u8; 32]) -> [u8; KEY_ID_LEN] {
    let digest = Sha256::new()
        .chain_update(b"idemgate:key-id:v1")
        .chain_update(key)
        .finalize();
    let mut id = [0; KEY_ID_LEN];
    id.copy_from_slice(&digest[..KEY_ID_LEN]);
    id
}

/// Reads a key: 64 hex digits (`openssl rand -hex 32`), surrounding whitespace allowed, or
/// exactly 32 raw bytes.
pub fn parse_key(data: &[u8]) -> Result<[u8; 32], String> {
    let mut key = [0u8; 32];
    let text = data.trim_ascii();
    if text.len() == 64 && hex::decode_to_slice(text, &mut key).is_ok() {
        return Ok(key);
    }
    if data.len() == 32 {
        key.copy_from_slice(data);
        return Ok(key);
    }
    Err("a key is 32 bytes: 64 hex digits (openssl rand -hex 32) or 32 raw bytes".into())
}

impl KeyRing {
    /// A ring of `keys`, the first sealing, that accepts records in clear; refuses none, and
    /// two keys that are the same.
    pub fn new(keys: Vec<[u8; 32]>) -> Result<Self, String> {
        if keys.is_empty() {
            return Err("store.encrypt needs at least one key".into());
        }
        let mut ring: Vec<SealKey> = Vec::with_capacity(keys.len());
        for key in keys {
            let id = key_id(&key);
            if ring.iter().any(|k| k.id == id) {
                return Err(format!("store.encrypt lists key {} twice", hex::encode(id)));
            }
            let cipher = Aes256Gcm::new_from_slice(&key).map_err(|e| e.to_string())?;
            ring.push(SealKey { id, cipher });
        }
        Ok(Self {
            keys: ring,
            clear_records: ClearRecords::default(),
        })
    }

    /// This ring, accepting or refusing records not sealed whole.
    pub fn with_clear_records(mut self, clear_records: ClearRecords) -> Self {
        self.clear_records = clear_records;
        self
    }

    /// What it does with records not sealed whole.
    pub fn clear_records(&self) -> ClearRecords {
        self.clear_records
    }

    /// The id of the key that seals, in hex.
    pub fn sealing_key_id(&self) -> String {
        hex::encode(self.keys[0].id)
    }

    /// The ids of all keys, in hex, the sealing one first.
    pub fn key_ids(&self) -> Vec<String> {
        self.keys.iter().map(|k| hex::encode(k.id)).collect()
    }

    /// Appends `[key id][nonce][ciphertext][tag]` of `plaintext`, bound to `aad`.
    pub fn seal(&self, aad: &[u8], plaintext: &[u8], out: &mut Vec<u8>) {
        let key = &self.keys[0];
        let nonce: [u8; NONCE_LEN] = rand::random();
        out.reserve(SEAL_OVERHEAD + plaintext.len());
        out.extend_from_slice(&key.id);
        out.extend_from_slice(&nonce);
        let start = out.len();
        out.extend_from_slice(plaintext);
        // Fails only past GCM's length limit (64 GiB), far above any stored answer.
        let tag = key
            .cipher
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), aad, &mut out[start..])
            .expect("an answer within AES-GCM's length limit");
        out.extend_from_slice(&tag);
    }

    /// The plaintext of what [`KeyRing::seal`] wrote, if it opens under `aad`.
    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        if sealed.len() < SEAL_OVERHEAD {
            return Err(SealError::Corrupt);
        }
        let (id, rest) = sealed.split_at(KEY_ID_LEN);
        let (nonce, rest) = rest.split_at(NONCE_LEN);
        let (ciphertext, tag) = rest.split_at(rest.len() - TAG_LEN);
        let key = self
            .keys
            .iter()
            .find(|k| k.id == id)
            .ok_or_else(|| SealError::UnknownKey(hex::encode(id)))?;
        let mut plaintext = ciphertext.to_vec();
        key.cipher
            .decrypt_in_place_detached(
                Nonce::from_slice(nonce),
                aad,
                &mut plaintext,
                Tag::from_slice(tag),
            )
            .map_err(|_| SealError::Corrupt)?;
        Ok(plaintext)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_read_as_hex_or_raw_bytes() {
        let hex_text = format!("{}\n", "ab".repeat(32));
        assert_eq!(parse_key(hex_text.as_bytes()).unwrap(), [0xab; 32]);
        assert_eq!(parse_key(&[7; 32]).unwrap(), [7; 32]);
        assert!(parse_key(b"short").is_err());
        assert!(parse_key("zz".repeat(32).as_bytes()).is_err());
    }

    #[test]
    fn a_ring_refuses_no_keys_and_the_same_key_twice() {
        assert!(KeyRing::new(vec![]).is_err());
        assert!(KeyRing::new(vec![[1; 32], [1; 32]]).is_err());
        let ring = KeyRing::new(vec![[1; 32], [2; 32]]).unwrap();
        assert_eq!(ring.key_ids().len(), 2);
        assert_eq!(ring.sealing_key_id(), hex::encode(key_id(&[1; 32])));
        assert!(!format!("{ring:?}").contains("0101"));
    }

    #[test]
    fn tampering_or_a_missing_key_fails_to_open() {
        let ring = KeyRing::new(vec![[1; 32]]).unwrap();
        let mut sealed = Vec::new();
        ring.seal(b"k", b"secret", &mut sealed);
        assert_eq!(sealed.len(), 6 + SEAL_OVERHEAD);
        let mut flipped = sealed.clone();
        flipped[KEY_ID_LEN + NONCE_LEN] ^= 1;
        assert_eq!(ring.open(b"k", &flipped), Err(SealError::Corrupt));
        assert_eq!(ring.open(b"k", &sealed[..10]), Err(SealError::Corrupt));
        let other = KeyRing::new(vec![[2; 32]]).unwrap();
        assert!(matches!(
            other.open(b"k", &sealed),
            Err(SealError::UnknownKey(_))
        ));
        // Two seals of one answer differ (fresh nonces).
        let mut again = Vec::new();
        ring.seal(b"k", b"secret", &mut again);
        assert_ne!(sealed, again);
    }
}
