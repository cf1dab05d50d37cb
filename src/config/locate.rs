//! Where a key path (`routes[1].ttl`, `defaults.key.scope`, `store.redis.url`) is written
//! in a YAML document, for errors found after parsing. The document is read again with a
//! parser that keeps positions (saphyr-parser) and walked by mapping key and sequence
//! index, so block and flow styles, quoted keys and comments are all read as YAML reads
//! them, and a route is told from another whose name merely starts alike.

use saphyr_parser::{Event, Marker, Parser};

/// A 1-based line and column.
pub(super) type Place = (usize, usize);

/// Where the error about `path` belongs: the key of its last step (the item, for an index),
/// else of the deepest step the document writes (an error about a value inherited or left
/// at its default is placed at the nearest section written), else 1:1. `within`, when
/// given and the whole path is written, is looked for inside the value: the place of one
/// item of a list, say, rather than of the list's key.
pub(super) fn locate(text: &str, path: &str, within: Option<&str>) -> Place {
    let root = parse(text);
    let Some(mut node) = root.as_ref() else {
        return (1, 1);
    };
    let mut place = None;
    let steps = steps(path);
    for (i, step) in steps.iter().enumerate() {
        let Some((at, next)) = node.child(step) else {
            break;
        };
        place = Some(at);
        node = next;
        if i + 1 == steps.len() {
            let refined = within.and_then(|needle| node.find(text, needle));
            return refined.or(place).map_or((1, 1), position);
        }
    }
    place.map_or((1, 1), position)
}

/// One step of a key path.
#[derive(Debug, PartialEq, Eq)]
enum Step<'p> {
    /// A mapping key: `ttl`.
    Key(&'p str),
    /// A sequence index: `[1]`.
    Index(usize),
}

/// `routes[1].key.scope` as its steps; `(top)` (the whole file) has none. A step that does
/// not read as one ends the path there.
fn steps(path: &str) -> Vec<Step<'_>> {
    let mut steps = Vec::new();
    if path == "(top)" {
        return steps;
    }
    for part in path.split('.') {
        let (key, mut rest) = part.split_at(part.find('[').unwrap_or(part.len()));
        if !key.is_empty() {
            steps.push(Step::Key(key));
        }
        while let Some(index) = rest.strip_prefix('[').and_then(|r| r.split_once(']')) {
            let Ok(i) = index.0.parse() else {
                return steps;
            };
            steps.push(Step::Index(i));
            rest = index.1;
        }
        if !rest.is_empty() {
            return steps;
        }
    }
    steps
}

/// A node of the document, with where it starts and ends.
#[derive(Debug)]
struct Node {
    start: Marker,
    end: Marker,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// A scalar's value (quotes and escapes resolved).
    Scalar(String),
    /// An alias (`*name`): not followed, a path stops at it.
    Alias,
    Sequence(Vec<Node>),
    Mapping(Vec<(Node, Node)>),
}

impl Node {
    /// The child `step` names, and the place an error about it is reported at: its key
    /// for a mapping entry (the last, as YAML's duplicate keys are read), its own start
    /// for a sequence item.
    fn child(&self, step: &Step<'_>) -> Option<(Marker, &Node)> {
        match (&self.kind, step) {
            (Kind::Mapping(entries), Step::Key(name)) => entries
                .iter()
                .rev()
                .find(|(k, _)| matches!(&k.kind, Kind::Scalar(s) if s == name))
                .map(|(k, v)| (k.start, v)),
            (Kind::Sequence(items), Step::Index(i)) => items.get(*i).map(|n| (n.start, n)),
            _ => None,
        }
    }

    /// Where `needle` first appears in this node's text.
    fn find(&self, text: &str, needle: &str) -> Option<Marker> {
        if needle.is_empty() {
            return None;
        }
        let start = byte_offset(text, self.start.index())?;
        let end = byte_offset(text, self.end.index()).unwrap_or(text.len());
        let found = start + text.get(start..end)?.find(needle)?;
        let line_start = text[..found].rfind('\n').map_or(0, |i| i + 1);
        Some(Marker::new(
            self.start.index() + text[start..found].chars().count(),
            text[..found].matches('\n').count() + 1,
            text[line_start..found].chars().count(),
        ))
    }
}

/// A marker's 1-based line and column.
fn position(m: Marker) -> Place {
    (m.line(), m.col() + 1)
}

/// The byte offset of the `chars`th character of `text`.
fn byte_offset(text: &str, chars: usize) -> Option<usize> {
    text.char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(text.len()))
        .nth(chars)
}

/// The first document of `text` as a tree of nodes; `None` if it holds none. A document
/// the parser gives up on part way (serde read it, so that is rare) keeps what was read
/// before.
fn parse(text: &str) -> Option<Node> {
    // Collections being read, innermost last, each with the key read for its next value.
    let mut open: Vec<(Node, Option<Node>)> = Vec::new();
    let mut root = None;
    for event in Parser::new_from_str(text) {
        let Ok((event, span)) = event else { break };
        let node = match event {
            Event::Scalar(value, ..) => Node {
                start: span.start,
                end: span.end,
                kind: Kind::Scalar(value.into_owned()),
            },
            Event::Alias(_) => Node {
                start: span.start,
                end: span.end,
                kind: Kind::Alias,
            },
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                let kind = match event {
                    Event::SequenceStart(..) => Kind::Sequence(Vec::new()),
                    _ => Kind::Mapping(Vec::new()),
                };
                let node = Node {
                    start: span.start,
                    end: span.end,
                    kind,
                };
                open.push((node, None));
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let Some((mut node, _)) = open.pop() else {
                    break;
                };
                // A flow collection ends at its bracket; a block one, whose end the parser
                // marks where the next token starts (after any comment), at its last child.
                if span.end.index() > span.start.index() {
                    node.end = span.end;
                }
                node
            }
            Event::DocumentEnd | Event::StreamEnd => break,
            _ => continue,
        };
        match open.last_mut() {
            Some(parent) => attach(parent, node),
            None => {
                root = Some(node);
                break;
            }
        }
    }
    // What a parser that gave up left open, closed where it was.
    while let Some((node, _)) = open.pop() {
        match open.last_mut() {
            Some(parent) => attach(parent, node),
            None => root = Some(node),
        }
    }
    root
}

/// `node` added to the collection being read: an item, a key, or the value of the key
/// read before it.
fn attach((parent, key): &mut (Node, Option<Node>), node: Node) {
    if node.end.index() > parent.end.index() {
        parent.end = node.end;
    }
    match &mut parent.kind {
        Kind::Sequence(items) => items.push(node),
        Kind::Mapping(entries) => match key.take() {
            Some(k) => entries.push((k, node)),
            None => *key = Some(node),
        },
        Kind::Scalar(_) | Kind::Alias => {}
    }
}

#[cfg(test)]
mod tests;
