//! Key paths placed in YAML documents, pinned: block and flow styles, quoted keys, items,
//! keys the document does not write, text looked for inside a value, comments after one.

use super::*;

const DOC: &str = "\
listen: 127.0.0.1:8080   # the proxy
defaults:
  ttl: 24h
  key: { fingerprint: {}, scope: [caller, client_cert] }
routes:
  - name: order-v2
    match: { path: /v2 }
  - \"name\": 'order'
    match:
      path: /orders
    ttl: 0s
  - { name: flow, match: { path: /f },
      ttl: 1s }
store:
  redis: { url: \"redis://x\", timeout: 0s }
";

#[test]
fn a_path_is_read_as_its_steps() {
    use Step::{Index, Key};
    assert_eq!(steps("(top)"), []);
    assert_eq!(
        steps("routes[1].ttl"),
        [Key("routes"), Index(1), Key("ttl")]
    );
    assert_eq!(
        steps("routes[0].match.methods[2]"),
        [
            Key("routes"),
            Index(0),
            Key("match"),
            Key("methods"),
            Index(2)
        ]
    );
    assert_eq!(steps("a[x].b"), [Key("a")]);
}

#[test]
fn a_key_is_placed_at_its_own_key_in_block_and_flow_style() {
    assert_eq!(locate(DOC, "listen", None), (1, 1));
    assert_eq!(locate(DOC, "defaults.ttl", None), (3, 3));
    assert_eq!(locate(DOC, "defaults.key.scope", None), (4, 27));
    assert_eq!(locate(DOC, "routes[1].ttl", None), (11, 5));
    assert_eq!(locate(DOC, "routes[1].match.path", None), (10, 7));
    assert_eq!(locate(DOC, "routes[2].ttl", None), (13, 7));
    assert_eq!(locate(DOC, "store.redis.timeout", None), (15, 30));
}

#[test]
fn an_item_is_placed_at_its_start() {
    assert_eq!(locate(DOC, "routes[0]", None), (6, 5));
    assert_eq!(locate(DOC, "routes[1]", None), (8, 5));
    assert_eq!(locate(DOC, "routes[2]", None), (12, 5));
    assert_eq!(locate(DOC, "defaults.key.scope[1]", None), (4, 43));
}

#[test]
fn an_unwritten_key_is_placed_at_its_nearest_written_ancestor() {
    assert_eq!(locate(DOC, "routes[0].ttl", None), (6, 5));
    assert_eq!(locate(DOC, "routes[7].ttl", None), (5, 1));
    assert_eq!(locate(DOC, "defaults.fresh.skew", None), (2, 1));
    assert_eq!(locate(DOC, "listen.port", None), (1, 1));
    assert_eq!(locate(DOC, "tokens.path", None), (1, 1));
    assert_eq!(locate(DOC, "(top)", None), (1, 1));
    assert_eq!(locate("", "routes[0]", None), (1, 1));
    assert_eq!(locate("# only a comment\n", "routes[0]", None), (1, 1));
}

#[test]
fn a_value_is_found_inside_its_key_only_when_the_whole_path_is_written() {
    let client_cert = Some("client_cert");
    assert_eq!(locate(DOC, "defaults.key.scope", client_cert), (4, 43));
    // Not past the node: the text is looked for in the value alone.
    assert_eq!(locate(DOC, "defaults.ttl", client_cert), (3, 3));
    assert_eq!(locate(DOC, "routes[0].key.scope", client_cert), (6, 5));
    assert_eq!(locate(DOC, "routes[1].ttl", Some("name")), (11, 5));
}

#[test]
fn a_document_the_parser_gives_up_on_keeps_what_it_read() {
    let broken = "defaults:\n  ttl: 1s\n  lease: [1s\n";
    assert_eq!(locate(broken, "defaults.ttl", None), (2, 3));
}

#[test]
fn columns_count_characters() {
    let text = "a: { é: 1, b: 2 }\n";
    assert_eq!(locate(text, "a.b", None), (1, 12));
    assert_eq!(locate(text, "a", Some("2")), (1, 15));
}

#[test]
fn a_comment_after_a_block_value_is_not_part_of_it() {
    let text =
        "defaults:\n  key:\n    scope:\n      - caller\n  # client_cert, some day\nroutes: []\n";
    assert_eq!(locate(text, "defaults.key", Some("client_cert")), (2, 3));
    assert_eq!(locate(text, "defaults", Some("client_cert")), (1, 1));
}
