//! A client certificate in the scope: mixed in beside the caller, never instead of it,
//! and the caller alone where there is none.
use super::*;

fn cert_key(peer: [u8; 4], cert: Option<&[u8]>) -> Digest {
    let rule = KeyRule {
        scope: vec![ScopePart::ClientCert],
        ..fingerprint_rule()
    };
    let h = HeaderMap::new();
    let v = RequestView {
        peer: Some(IpAddr::from(peer)),
        client_cert: cert,
        ..view(&h, b"{}")
    };
    derive_key(&rule, &v, None).unwrap().key().unwrap().key
}

/// A `client_cert` scope on a request without a certificate falls back to the caller, so
/// requests without one never share a key; a certificate names its holder from anywhere.
#[test]
fn without_a_certificate_a_client_cert_scope_is_the_caller() {
    let (a, b) = ([192, 0, 2, 1], [192, 0, 2, 2]);
    assert_ne!(cert_key(a, None), cert_key(b, None));
    assert_eq!(cert_key(a, None), cert_key(a, None));
    let alice = [7u8; 32];
    assert_eq!(cert_key(a, Some(&alice)), cert_key(b, Some(&alice)));
    assert_ne!(cert_key(a, Some(&alice)), cert_key(a, Some(&[8u8; 32])));
    assert_ne!(cert_key(a, Some(&alice)), cert_key(a, None));
}

/// A certificate is mixed into the caller beside what else the request carries, never
/// instead of it: a gateway that presents one certificate for every user it relays does
/// not merge those users, and two services with their own certificates at one address
/// stay apart.
#[test]
fn a_client_certificate_is_mixed_in_beside_the_rest_of_the_caller() {
    let key = |peer: [u8; 4], cert: &[u8]| {
        let h = HeaderMap::new();
        fingerprint_key(&RequestView {
            peer: Some(IpAddr::from(peer)),
            client_cert: Some(cert),
            ..view(&h, b"{}")
        })
    };
    let gateway = [1u8; 32];
    assert_ne!(key([192, 0, 2, 1], &gateway), key([192, 0, 2, 2], &gateway));
    assert_ne!(
        key([192, 0, 2, 1], &[2u8; 32]),
        key([192, 0, 2, 1], &[3u8; 32])
    );
    assert_eq!(key([192, 0, 2, 1], &gateway), key([192, 0, 2, 1], &gateway));
}
