//! Which values are left out or extracted: the pointers still matching the path being
//! parsed ([`Frame`]), field names in the ignore set, and the report of each skipped path.

use std::fmt::Write as _;

use super::*;
use crate::canonical::fold::case_variants;
use crate::canonical::pointer::push_escaped_token;

/// One step of the current path, kept only when skipped paths are being reported.
#[derive(Clone, Copy)]
pub(super) enum Seg {
    Key(Key),
    Index(usize),
}

/// A range of `Buffers::live`: the pointers still matching the path of the value being parsed,
/// each as `index << 1 | variant`, `variant` set when a name on the path matched only
/// equal but for case (extraction only).
#[derive(Clone, Copy)]
pub(super) struct Frame {
    pub(super) start: usize,
    pub(super) end: usize,
}

impl Frame {
    pub(super) const NONE: Frame = Frame { start: 0, end: 0 };

    pub(super) fn is_empty(self) -> bool {
        self.start == self.end
    }
}

impl Parser<'_, '_> {
    #[inline]
    pub(super) fn ignores_key(&self, key: Key) -> bool {
        let len = key.end - key.start;
        if len <= 8 {
            // The prefix holds the whole key; no need to look at the bytes again.
            self.ignore.ignores_short(len, key.prefix)
        } else {
            self.ignore
                .ignores_name(key_bytes(self.input, &self.buffers.keys, key))
        }
    }

    /// Narrows `frame` to the pointers that continue through step `level - 1` of the path, pushing
    /// them as a new frame; also says whether one of them ends exactly there.
    pub(super) fn narrow(&mut self, frame: Frame, level: usize, step: Seg) -> (Frame, bool) {
        let start = self.buffers.live.len();
        let mut exact = false;
        for i in frame.start..frame.end {
            let entry = self.buffers.live[i];
            let tokens = self.pointers[entry >> 1].tokens();
            if tokens.len() < level {
                continue;
            }
            let token = tokens[level - 1].as_bytes();
            let hit = match step {
                Seg::Key(key) => {
                    let name = key_bytes(self.input, &self.buffers.keys, key);
                    if token == name {
                        Some(entry)
                    } else if self.extract.is_some() && case_variants(token, name) {
                        // Skipping stays exact: leaving out more could merge two requests.
                        Some(entry | 1)
                    } else {
                        None
                    }
                }
                Seg::Index(index) => token_is_index(token, index).then_some(entry),
            };
            if let Some(entry) = hit {
                self.buffers.live.push(entry);
                exact |= tokens.len() == level;
            }
        }
        (
            Frame {
                start,
                end: self.buffers.live.len(),
            },
            exact,
        )
    }

    /// Stores the canonical `value` for every pointer of `frame` that ends at path length `len`.
    /// A pointer a duplicate key matches again gets every occurrence, in input order, joined
    /// by `,`: an app may read any of them, so none may be left out of a key. Each is one
    /// whole canonical value, which has no `,` outside its brackets and strings, so the
    /// list reads back one way only and never equals a single value.
    ///
    /// An occurrence reached through a name equal but for case is marked by a leading `~`,
    /// which starts no canonical value.
    pub(super) fn store_extracted(&mut self, value: &[u8], frame: Frame, len: usize) {
        if let Some(found) = self.extract.as_deref_mut() {
            for &entry in &self.buffers.live[frame.start..frame.end] {
                let (p, variant) = (entry >> 1, entry & 1 == 1);
                if self.pointers[p].tokens().len() != len {
                    continue;
                }
                let result = match &mut found[p] {
                    Some(earlier) => {
                        earlier.push(b',');
                        earlier
                    }
                    None => found[p].insert(Vec::with_capacity(value.len() + 1)),
                };
                if variant {
                    result.push(b'~');
                } else {
                    self.exact_found[p] = true;
                }
                result.extend_from_slice(value);
            }
        }
    }

    /// Before the value of a member or element that `frame` continues through: notes, for
    /// each pointer going deeper, what its result was. Returns the mark to pass to
    /// [`Self::close_occurrences`].
    #[inline]
    pub(super) fn open_occurrences(&mut self, frame: Frame, level: usize) -> usize {
        let mark = self.pending.len();
        if let Some(found) = self.extract.as_deref() {
            for &entry in &self.buffers.live[frame.start..frame.end] {
                let p = entry >> 1;
                if self.pointers[p].tokens().len() > level {
                    let before = found[p].as_ref().map(Vec::len);
                    self.pending
                        .push((entry, before.is_some(), before.unwrap_or(0)));
                }
            }
        }
        mark
    }

    /// After that value: a pointer it added nothing to gets an empty entry, so an
    /// occurrence of a repeated parent without the field is not left out (a last-wins
    /// parser reads `{"o":{"id":1},"o":{}}` as an `o` without `id`); one reached through a
    /// name equal but for case keeps its `~` (`{"o":{"id":1},"O":{}}` is another request
    /// to a case-sensitive parser, and to a case-insensitive one).
    #[inline]
    pub(super) fn close_occurrences(&mut self, mark: usize) {
        if let Some(found) = self.extract.as_deref_mut() {
            for &(entry, was_some, len) in &self.pending[mark..] {
                let (p, variant) = (entry >> 1, entry & 1 == 1);
                let result = match &mut found[p] {
                    Some(result) if !was_some || result.len() != len => continue,
                    Some(result) => {
                        result.push(b',');
                        result
                    }
                    None => found[p].insert(Vec::new()),
                };
                if variant {
                    result.push(b'~');
                }
            }
        }
        self.pending.truncate(mark);
    }

    /// Whether skipped paths must be reported at this position.
    #[inline]
    pub(super) fn reporting(&self) -> bool {
        self.ignored.is_some() && self.skipping == 0
    }

    /// Reports the path of the current container followed by `last` as skipped.
    #[cold]
    pub(super) fn report(&mut self, last: Seg) {
        let mut path = String::new();
        for seg in self.buffers.path.iter().chain(std::iter::once(&last)) {
            path.push('/');
            match *seg {
                Seg::Key(key) => push_escaped_token(
                    &mut path,
                    &String::from_utf8_lossy(key_bytes(self.input, &self.buffers.keys, key)),
                ),
                Seg::Index(index) => {
                    let _ = write!(path, "{index}");
                }
            }
        }
        if let Some(ignored) = self.ignored.as_deref_mut() {
            ignored.push(path);
        }
    }

    /// Validates the value at `self.pos` and discards its output.
    pub(super) fn skip_value(&mut self, out: &mut Vec<u8>, level: usize) -> Result<(), JsonError> {
        let mark = out.len();
        self.skipping += 1;
        self.value(out, level, Frame::NONE)?;
        self.skipping -= 1;
        out.truncate(mark);
        Ok(())
    }
}
