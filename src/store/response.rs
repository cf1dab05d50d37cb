//! A stored upstream response, kept compact: status and one buffer holding every header
//! followed by the body, copied out of the socket buffer so a cached entry never pins a
//! read buffer, and made with a single allocation.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::unix_ms;

/// A response to replay: status, every header (repeated ones such as `Set-Cookie` intact and
/// in order) and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    status: StatusCode,
    /// `[u16 name len][name][u32 value len][value]` per header, in the order received,
    /// then the body.
    data: Bytes,
    head_len: u32,
    /// Unix milliseconds (8 bytes where a `SystemTime` takes 16: a store holds millions).
    stored_ms: u64,
}

// With the reference count this is a 64-byte allocation per stored answer.
const _: () = assert!(std::mem::size_of::<StoredResponse>() <= 48);

/// Fixed cost charged per stored response beyond its headers and body: the map slot with
/// the table's slack, the expiry queue entry, the allocations. Measured with `cargo bench
/// --bench memory_store` (RSS growth over 1M keys, where the tables sit just past a
/// doubling: about 325 bytes), so `max_bytes` bounds real memory.
pub const ENTRY_OVERHEAD: usize = 336;

impl StoredResponse {
    /// Copies status, headers and body into one compact record.
    pub fn new(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Self {
        let head_len: usize = headers
            .iter()
            .map(|(n, v)| 6 + n.as_str().len() + v.len())
            .sum();
        let mut buf = BytesMut::with_capacity(head_len + body.len());
        for (name, value) in headers {
            buf.put_u16(name.as_str().len() as u16);
            buf.put_slice(name.as_str().as_bytes());
            buf.put_u32(value.len() as u32);
            buf.put_slice(value.as_bytes());
        }
        buf.put_slice(body);
        Self {
            status,
            data: buf.freeze(),
            // Headers beyond 4 GiB cannot arrive: hyper's header limits are far below.
            head_len: head_len as u32,
            stored_ms: unix_ms(SystemTime::now()),
        }
    }

    /// The stored status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stored body (cheap: a reference-counted slice).
    pub fn body(&self) -> Bytes {
        self.data.slice(self.head_len as usize..)
    }

    /// When the response was stored.
    pub fn stored_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.stored_ms)
    }

    /// The stored headers, rebuilt without copying their values.
    pub fn headers(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(8);
        let mut rest = self.data.slice(..self.head_len as usize);
        while rest.len() >= 6 {
            let name_len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
            let value_at = 2 + name_len;
            let Some(len_bytes) = rest.get(value_at..value_at + 4) else {
                break;
            };
            let value_len = u32::from_be_bytes(len_bytes.try_into().expect("four bytes")) as usize;
            let end = value_at + 4 + value_len;
            if end > rest.len() {
                break;
            }
            // Both were valid when stored; a failure here would mean a corrupted record,
            // and dropping that one header beats failing the replay.
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(&rest[2..value_at]),
                HeaderValue::from_maybe_shared(rest.slice(value_at + 4..end)),
            ) {
                map.append(n, v);
            }
            rest = rest.slice(end..);
        }
        map
    }

    /// Bytes charged against `max_bytes`.
    pub fn cost(&self) -> usize {
        self.data.len() + ENTRY_OVERHEAD
    }

    /// Binary encoding for stores outside the process: no base64, no JSON.
    /// `[1][u16 status][u64 stored_at ms][u32 headers len][headers][body]`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(15 + self.data.len());
        out.push(1);
        out.extend_from_slice(&self.status.as_u16().to_be_bytes());
        out.extend_from_slice(&self.stored_ms.to_be_bytes());
        out.extend_from_slice(&self.head_len.to_be_bytes());
        out.extend_from_slice(&self.data);
        out
    }

    /// Reverses [`StoredResponse::encode`] without copying; `None` for anything malformed.
    pub fn decode(data: Bytes) -> Option<Self> {
        if data.len() < 15 || data[0] != 1 {
            return None;
        }
        let status = StatusCode::from_u16(u16::from_be_bytes([data[1], data[2]])).ok()?;
        let ms = u64::from_be_bytes(data[3..11].try_into().ok()?);
        let head_len = u32::from_be_bytes(data[11..15].try_into().ok()?);
        if data.len() < 15 + head_len as usize {
            return None;
        }
        Some(Self {
            status,
            data: data.slice(15..),
            head_len,
            stored_ms: ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_headers_survive_in_order() {
        let mut h = HeaderMap::new();
        h.append("set-cookie", HeaderValue::from_static("a=1"));
        h.append("set-cookie", HeaderValue::from_static("b=2"));
        h.insert("content-type", HeaderValue::from_static("application/json"));
        let r = StoredResponse::new(StatusCode::CREATED, &h, b"{}");
        let back = r.headers();
        let cookies: Vec<_> = back.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(back["content-type"], "application/json");
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(&r.body()[..], b"{}");
    }

    #[test]
    fn encoding_round_trips_binary_bodies() {
        let mut h = HeaderMap::new();
        h.insert("x-a", HeaderValue::from_static("1"));
        let body: Vec<u8> = (0..=255).collect();
        let r = StoredResponse::new(StatusCode::OK, &h, &body);
        let back = StoredResponse::decode(Bytes::from(r.encode())).unwrap();
        assert_eq!(back.status(), r.status());
        assert_eq!(back.body(), r.body());
        assert_eq!(back.headers(), r.headers());
        assert!(StoredResponse::decode(Bytes::from_static(b"\x02junk")).is_none());
    }

    #[test]
    fn the_stored_body_does_not_share_the_source_buffer() {
        let socket_buffer = Bytes::from(vec![7u8; 64 * 1024]);
        let r = StoredResponse::new(StatusCode::OK, &HeaderMap::new(), &socket_buffer[..10]);
        assert_eq!(r.cost(), 10 + ENTRY_OVERHEAD);
        drop(socket_buffer);
        assert_eq!(&r.body()[..], &[7u8; 10]);
    }
}
