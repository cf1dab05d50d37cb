//! The Redis record layouts and names: each value parses back to what was written.

use super::*;
use http::{HeaderMap, StatusCode};

#[test]
fn record_and_channel_names_share_the_hash_tag() {
    let key = Digest([0xab; 32]);
    let hex = "ab".repeat(32);
    let names = [
        Name::new("idem:", "", &key),
        Name::new("idem:", "done:", &key),
    ];
    assert_eq!(names[0].to_string(), format!("idem:{{{hex}}}"));
    assert_eq!(names[1].to_string(), format!("idem:done:{{{hex}}}"));
    for name in names {
        // What a command carries is what the name shows, and `len` sizes it.
        assert_eq!(name.to_redis_args(), vec![name.to_string().into_bytes()]);
        assert_eq!(name.len(), name.to_string().len());
    }
}

/// Every record a settlement writes reads back as what it says.
#[test]
fn settled_values_parse_back() {
    let (token, fp) = (OwnerToken(7 << 48 | 42), Digest([3; 32]));
    let answer = StoredResponse::new(StatusCode::BAD_GATEWAY, &HeaderMap::new(), b"down");
    let hour = Duration::from_secs(3600);
    let value = |s: Settlement| settled_value(token, fp, &s).0.expect("a value");
    match Record::parse(&value(Settlement::Unknown { ttl: hour })).unwrap() {
        Record::Unknown { fingerprint, .. } => assert_eq!(fingerprint, fp),
        _ => panic!("not an unknown outcome"),
    }
    match Record::parse(&value(Settlement::NotStored {
        status: StatusCode::OK,
        ttl: hour,
    }))
    .unwrap()
    {
        Record::NotStored {
            status,
            fingerprint,
            ..
        } => assert_eq!((status, fingerprint), (StatusCode::OK, fp)),
        _ => panic!("not a not-stored record"),
    }
    let failed = Settlement::Failed {
        response: answer.clone(),
        linger: hour,
        reissue: Some(std::time::SystemTime::now() + hour),
    };
    let failed = value(failed);
    // The issued flag the claim script reads, right after kind, token and fingerprint.
    assert_eq!(failed[49], b'1');
    match Record::parse(&failed).unwrap() {
        Record::Failed {
            token: t, response, ..
        } => {
            assert_eq!(t, token);
            assert_eq!(response.body(), answer.body());
            assert_eq!(response.fingerprint(), fp);
        }
        _ => panic!("not a failure"),
    }
    let claim = claim_value(token, fp, Lapse::Release { grace: hour });
    match Record::parse(&claim).unwrap() {
        Record::InFlight {
            token: t, lapse, ..
        } => {
            assert_eq!((t, lapse), (token, Lapse::Release { grace: hour }))
        }
        _ => panic!("not a claim"),
    }
    assert_eq!(
        settled_value(token, fp, &Settlement::Release { reissue: None }).0,
        None
    );
}
