//! A stored upstream response, kept compact: one reference-counted allocation holding the
//! payload fingerprint, status, every header and the body, copied out of the socket buffer
//! so a cached entry never pins a read buffer.
//!
//! One allocation rather than a record pointing at a buffer: a replay of a key among
//! millions misses the CPU caches on every pointer it follows, and this leaves one.
//!
//! The answer's trailers (a gRPC call's `grpc-status`) are kept between headers and body,
//! in records of their own version: a record without trailers is laid out as it always was,
//! so every record stored before still reads and a replay without trailers reads nothing
//! more.
//!
//! With `store.encrypt`, the record the store keeps is sealed ([`StoredResponse::seal`]):
//! the payload fingerprint (which the store compares), the time it was stored and a copy of
//! the status stay in clear, authenticated with the store key as associated data; status,
//! headers, trailers and body are AES-256-GCM ciphertext until [`StoredResponse::open`].

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::seal::{self, ClearRecords, KeyRing, SealError};
use super::unix_ms;
use crate::key::Digest;

/// A response to replay: status, every header (repeated ones such as `Set-Cookie` intact and
/// in order), body and trailers. Cloning it is a reference count.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// `[fingerprint 32][1][u16 status][u64 stored ms][u32 head len][head][body]`, the head
    /// being `[u16 name len][name][u32 value len][value]` per header in the order received;
    /// with trailers, `[fingerprint 32][4][u16 status][u64 stored ms][u32 head len][head]
    /// [u32 trailers len][trailers][body]`, the trailers laid out as the head.
    /// Sealed, `[fingerprint 32][3][u16 status][u64 stored ms][key id 4][nonce 12][ciphertext
    /// of status, head len, head and body][tag 16]`, or version 5 with trailers (the
    /// ciphertext holding the trailers length and trailers after the head); version 2, as 3,
    /// was written by earlier builds, whose seal left the fingerprint and the status copy
    /// unbound. Everything after the fingerprint is [`StoredResponse::encode`].
    record: Arc<[u8]>,
}

const FINGERPRINT_LEN: usize = 32;
const VERSION_AT: usize = FINGERPRINT_LEN;
const STATUS_AT: usize = VERSION_AT + 1;
const STORED_AT: usize = STATUS_AT + 2;
const HEAD_LEN_AT: usize = STORED_AT + 8;
const HEAD_AT: usize = HEAD_LEN_AT + 4;
const VERSION: u8 = 1;
/// The version byte of a record sealed by earlier builds, bound to its store key and time
/// stored only: a store writer could change its fingerprint.
const SEALED_UNBOUND: u8 = 2;
/// The version byte of a sealed record, bound to its store key and all it keeps in clear.
const SEALED: u8 = 3;
/// The version byte of a record with trailers: [`VERSION`]'s layout, the trailers' length
/// and the trailers between head and body. Builds before it refuse it as unreadable.
const TRAILED: u8 = 4;
/// The version byte of a sealed record with trailers, sealed as [`SEALED`].
const SEALED_TRAILED: u8 = 5;

// A done record in the memory store holds this, so every byte is paid per stored key.
const _: () = assert!(std::mem::size_of::<StoredResponse>() == 16);

/// Fixed cost charged per stored response beyond its headers and body: the map slot with
/// the table's slack, the expiry queue entry, the record's own fields. It matches the
/// memory a key really costs (what `cargo bench --bench memory_store` reports as RSS growth
/// per key, taken where the tables sit just past a doubling), so `max_bytes` bounds real
/// memory.
pub const ENTRY_OVERHEAD: usize = 272;

impl std::fmt::Debug for StoredResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredResponse")
            .field("status", &self.status())
            .field("head_bytes", &self.head_len())
            .field("body_bytes", &(self.record.len() - self.body_at()))
            .finish()
    }
}

impl StoredResponse {
    /// Copies status, headers and body into one compact record, with no payload
    /// fingerprint (the store adds the one it recorded at the claim).
    pub fn new(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Self {
        Self::with_trailers(status, headers, body, None)
    }

    /// [`StoredResponse::new`] with the answer's `trailers`, sent after the body when it is
    /// replayed (none, or an empty map, leaves the record as [`StoredResponse::new`] makes it).
    pub fn with_trailers(
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        trailers: Option<&HeaderMap>,
    ) -> Self {
        let trailers = trailers.filter(|t| !t.is_empty());
        let head_len = fields_len(headers);
        let trailers_len = trailers.map_or(0, |t| 4 + fields_len(t));
        let mut record = Vec::with_capacity(HEAD_AT + head_len + trailers_len + body.len());
        record.extend_from_slice(&Digest::NONE.0);
        record.push(if trailers.is_some() { TRAILED } else { VERSION });
        record.extend_from_slice(&status.as_u16().to_be_bytes());
        record.extend_from_slice(&unix_ms(SystemTime::now()).to_be_bytes());
        // Headers beyond 4 GiB cannot arrive: hyper's header limits are far below.
        record.extend_from_slice(&(head_len as u32).to_be_bytes());
        put_fields(&mut record, headers);
        if let Some(trailers) = trailers {
            record.extend_from_slice(&((trailers_len - 4) as u32).to_be_bytes());
            put_fields(&mut record, trailers);
        }
        record.extend_from_slice(body);
        Self {
            record: Arc::from(record),
        }
    }

    /// The payload fingerprint of the request that produced it ([`Digest::NONE`]: none to
    /// compare).
    pub fn fingerprint(&self) -> Digest {
        let mut digest = Digest::NONE;
        digest.0.copy_from_slice(&self.record[..FINGERPRINT_LEN]);
        digest
    }

    /// This response recorded for a request with payload fingerprint `fingerprint`
    /// (written in place while no one else holds the record, copied otherwise). A sealed
    /// record is bound to its fingerprint: stamp it before [`StoredResponse::seal`], as
    /// another fingerprint stamped after makes it unopenable.
    pub fn with_fingerprint(mut self, fingerprint: Digest) -> Self {
        if self.record[..FINGERPRINT_LEN] == fingerprint.0 {
            return self;
        }
        match Arc::get_mut(&mut self.record) {
            Some(record) => record[..FINGERPRINT_LEN].copy_from_slice(&fingerprint.0),
            None => {
                let mut record = self.record.to_vec();
                record[..FINGERPRINT_LEN].copy_from_slice(&fingerprint.0);
                self.record = Arc::from(record);
            }
        }
        self
    }

    /// The stored status.
    pub fn status(&self) -> StatusCode {
        let code = u16::from_be_bytes([self.record[STATUS_AT], self.record[STATUS_AT + 1]]);
        // Checked when the record was made or decoded.
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// When the response was stored.
    pub fn stored_at(&self) -> SystemTime {
        let ms = self.record[STORED_AT..HEAD_LEN_AT]
            .try_into()
            .map_or(0, u64::from_be_bytes);
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn head_len(&self) -> usize {
        self.record[HEAD_LEN_AT..HEAD_AT]
            .try_into()
            .map_or(0, u32::from_be_bytes) as usize
    }

    /// Where the head ends. Within the record whatever it holds (a sealed one holds no
    /// head length, only ciphertext), so no accessor slices past its end.
    fn head_end(&self) -> usize {
        (HEAD_AT + self.head_len()).min(self.record.len())
    }

    fn body_at(&self) -> usize {
        let head_end = self.head_end();
        if self.record[VERSION_AT] != TRAILED {
            return head_end;
        }
        let trailers_len = read_u32(&self.record, head_end).unwrap_or(0);
        (head_end + 4 + trailers_len).min(self.record.len())
    }

    /// The stored trailers, if the answer had any (rebuilt without copying their values).
    pub fn trailers(&self) -> Option<HeaderMap> {
        if self.record[VERSION_AT] != TRAILED {
            return None;
        }
        let at = self.head_end() + 4;
        Some(fields_of(&self.shared(), at, self.body_at()))
    }

    /// The stored body (cheap: shares the record).
    pub fn body(&self) -> Bytes {
        self.shared().slice(self.body_at()..)
    }

    /// The stored headers, rebuilt without copying their values.
    pub fn headers(&self) -> HeaderMap {
        fields_of(&self.shared(), HEAD_AT, self.head_end())
    }

    /// Status, headers and body for a replay, sharing one handle on the record.
    pub fn parts(&self) -> (StatusCode, HeaderMap, Bytes) {
        let shared = self.shared();
        (
            self.status(),
            fields_of(&shared, HEAD_AT, self.head_end()),
            shared.slice(self.body_at()..),
        )
    }

    /// The record as [`Bytes`], for slices that keep it alive.
    fn shared(&self) -> Bytes {
        Bytes::from_owner(Arc::clone(&self.record))
    }

    /// The bytes of the record, sealed or not: what opening a sealed one copies at most,
    /// and what a replay or an owner's answer holding it is charged.
    pub fn size(&self) -> usize {
        self.record.len()
    }

    /// Bytes charged against `max_bytes`.
    pub fn cost(&self) -> usize {
        self.record.len() - HEAD_AT + ENTRY_OVERHEAD
    }

    /// Binary encoding for stores outside the process (which keep the fingerprint
    /// themselves): no base64, no JSON, no copy.
    /// `[1][u16 status][u64 stored_at ms][u32 headers len][headers][body]` (with trailers,
    /// `[4]…[headers][u32 trailers len][trailers][body]`; sealed, version 3 or 5).
    pub fn encode(&self) -> &[u8] {
        &self.record[VERSION_AT..]
    }

    /// Reverses [`StoredResponse::encode`] for a request with payload fingerprint
    /// `fingerprint`; `None` for anything malformed.
    pub fn decode(fingerprint: Digest, data: &[u8]) -> Option<Self> {
        let mut record = Vec::with_capacity(FINGERPRINT_LEN + data.len());
        record.extend_from_slice(&fingerprint.0);
        record.extend_from_slice(data);
        Self::checked(record)
    }

    /// A whole record (fingerprint first), if its version and lengths hold together.
    fn checked(record: Vec<u8>) -> Option<Self> {
        let header = record.get(VERSION_AT..HEAD_AT)?;
        match header[0] {
            version @ (VERSION | TRAILED) => {
                StatusCode::from_u16(u16::from_be_bytes([header[1], header[2]])).ok()?;
                let head_end = HEAD_AT.checked_add(read_u32(&record, HEAD_LEN_AT)?)?;
                if record.len() < head_end {
                    return None;
                }
                if version == TRAILED {
                    let trailers_len = read_u32(&record, head_end)?;
                    let body_at = (head_end + 4).checked_add(trailers_len)?;
                    if record.len() < body_at {
                        return None;
                    }
                }
            }
            SEALED | SEALED_UNBOUND | SEALED_TRAILED
                if record.len() >= HEAD_LEN_AT + seal::SEAL_OVERHEAD => {}
            _ => return None,
        }
        Some(Self {
            record: Arc::from(record),
        })
    }

    /// Whether status, headers and body are sealed (see [`StoredResponse::open`]).
    pub fn is_sealed(&self) -> bool {
        matches!(
            self.record[VERSION_AT],
            SEALED | SEALED_UNBOUND | SEALED_TRAILED
        )
    }

    /// This response sealed under `ring` for the store key `key` (the fingerprint, the time
    /// stored and a copy of the status left in clear). The record is bound to `key` and to
    /// what it keeps in clear: it opens under no other key, nor with another fingerprint.
    pub fn seal(&self, ring: &KeyRing, key: Digest) -> Self {
        if self.is_sealed() {
            return self.clone();
        }
        let mut record = Vec::with_capacity(self.record.len() + seal::SEAL_OVERHEAD);
        record.extend_from_slice(&self.record[..VERSION_AT]);
        record.push(if self.record[VERSION_AT] == TRAILED {
            SEALED_TRAILED
        } else {
            SEALED
        });
        // The status stays readable outside the seal (for "executed, answer not stored"
        // and the admin view); the one a replay uses is the sealed copy.
        record.extend_from_slice(&self.record[STATUS_AT..STORED_AT]);
        record.extend_from_slice(&self.record[STORED_AT..HEAD_LEN_AT]);
        let aad = associated::<BOUND_AAD>(key, &record[..HEAD_LEN_AT]);
        // Status, head length, head, trailers and body: what follows the stored time, and
        // the status.
        let mut plaintext = Vec::with_capacity(self.record.len() - STORED_AT);
        plaintext.extend_from_slice(&self.record[STATUS_AT..STORED_AT]);
        plaintext.extend_from_slice(&self.record[HEAD_LEN_AT..]);
        ring.seal(&aad, &plaintext, &mut record);
        Self {
            record: Arc::from(record),
        }
    }

    /// The response with status, headers and body readable, for the store key `key`:
    /// opened with the key its record names, or itself when it was never sealed (records
    /// from before `store.encrypt` was turned on stay readable, unless the ring refuses
    /// them: [`ClearRecords::Refuse`], which refuses records of earlier builds whose seal
    /// left the fingerprint unbound too).
    pub fn open(self, ring: Option<&KeyRing>, key: Digest) -> Result<Self, SealError> {
        let refuses = ring.is_some_and(|r| r.clear_records() == ClearRecords::Refuse);
        let (bound, unbound);
        let version = self.record[VERSION_AT];
        let aad: &[u8] = match version {
            SEALED | SEALED_TRAILED => {
                bound = associated::<BOUND_AAD>(key, &self.record[..HEAD_LEN_AT]);
                &bound
            }
            SEALED_UNBOUND if refuses => return Err(SealError::FingerprintUnbound),
            SEALED_UNBOUND => {
                unbound = associated::<UNBOUND_AAD>(key, &self.record[STORED_AT..HEAD_LEN_AT]);
                &unbound
            }
            _ if refuses => return Err(SealError::InClear),
            _ => return Ok(self),
        };
        let ring = ring.ok_or(SealError::NoKeys)?;
        let plaintext = ring.open(aad, &self.record[HEAD_LEN_AT..])?;
        if plaintext.len() < 6 {
            return Err(SealError::Corrupt);
        }
        let mut record = Vec::with_capacity(STORED_AT + plaintext.len() + 8);
        record.extend_from_slice(&self.record[..VERSION_AT]);
        record.push(if version == SEALED_TRAILED {
            TRAILED
        } else {
            VERSION
        });
        record.extend_from_slice(&plaintext[..2]);
        record.extend_from_slice(&self.record[STORED_AT..HEAD_LEN_AT]);
        record.extend_from_slice(&plaintext[2..]);
        Self::checked(record).ok_or(SealError::Corrupt)
    }
}

/// The associated data a record is sealed with: its store key and `bound`, the part of
/// its clear header the seal covers, so a store writer can change none of it. A record of
/// this build ([`SEALED`], [`BOUND_AAD`]) binds everything it keeps in clear (fingerprint,
/// version, status copy and time stored; above all the fingerprint, which decides between
/// a 422 and a replay); one of earlier builds ([`SEALED_UNBOUND`], [`UNBOUND_AAD`]) only
/// the time it was stored.
fn associated<const N: usize>(key: Digest, bound: &[u8]) -> [u8; N] {
    let mut aad = [0u8; N];
    aad[..8].copy_from_slice(b"idemgate");
    aad[8..40].copy_from_slice(&key.0);
    aad[40..].copy_from_slice(bound);
    aad
}

/// The length of a [`SEALED`] record's associated data.
const BOUND_AAD: usize = 40 + HEAD_LEN_AT;
/// The length of a [`SEALED_UNBOUND`] record's associated data.
const UNBOUND_AAD: usize = 40 + 8;

/// The bytes `fields` take in a record.
fn fields_len(fields: &HeaderMap) -> usize {
    fields
        .iter()
        .map(|(n, v)| 6 + n.as_str().len() + v.len())
        .sum()
}

/// Appends `fields` to `record`, each as `[u16 name len][name][u32 value len][value]`.
fn put_fields(record: &mut Vec<u8>, fields: &HeaderMap) {
    for (name, value) in fields {
        record.extend_from_slice(&(name.as_str().len() as u16).to_be_bytes());
        record.extend_from_slice(name.as_str().as_bytes());
        record.extend_from_slice(&(value.len() as u32).to_be_bytes());
        record.extend_from_slice(value.as_bytes());
    }
}

/// The big-endian `u32` at `at`, if the record holds it.
fn read_u32(record: &[u8], at: usize) -> Option<usize> {
    let bytes = record.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes(bytes.try_into().ok()?) as usize)
}

/// The fields stored in `record` from `at` to `end` (headers or trailers).
fn fields_of(record: &Bytes, mut at: usize, end: usize) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(8);
    while at + 6 <= end {
        let name_len = u16::from_be_bytes([record[at], record[at + 1]]) as usize;
        let value_at = at + 2 + name_len;
        let Some(len_bytes) = record.get(value_at..value_at + 4) else {
            break;
        };
        let value_len = u32::from_be_bytes(len_bytes.try_into().expect("four bytes")) as usize;
        let field_end = value_at + 4 + value_len;
        if field_end > end {
            break;
        }
        // Both were valid when stored; a failure here would mean a corrupted record,
        // and dropping that one header beats failing the replay.
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(&record[at + 2..value_at]),
            HeaderValue::from_maybe_shared(record.slice(value_at + 4..field_end)),
        ) {
            // A corrupted record may name more fields than a map holds.
            if map.try_append(n, v).is_err() {
                break;
            }
        }
        at = field_end;
    }
    map
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod trailer_tests;
