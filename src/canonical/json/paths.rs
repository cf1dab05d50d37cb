//! Which values are left out or extracted: the pointers still matching the path being
//! parsed ([`Frame`]), field names in the ignore set, and the report of each skipped path.

use std::fmt::Write as _;

use super::*;
use crate::canonical::pointer::push_escaped_token;

/// One step of the current path, kept only when skipped paths are being reported.
#[derive(Clone, Copy)]
pub(super) enum Seg {
    Key(Key),
    Index(usize),
}

/// A range of `Buffers::live`: the pointers still matching the path of the value being parsed.
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
            let p = self.buffers.live[i];
            let tokens = self.pointers[p].tokens();
            if tokens.len() < level {
                continue;
            }
            let token = tokens[level - 1].as_bytes();
            let hit = match step {
                Seg::Key(key) => token == key_bytes(self.input, &self.buffers.keys, key),
                Seg::Index(index) => token_is_index(token, index),
            };
            if hit {
                self.buffers.live.push(p);
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
    pub(super) fn store_extracted(&mut self, value: &[u8], frame: Frame, len: usize) {
        if let Some(found) = self.extract.as_deref_mut() {
            for &p in &self.buffers.live[frame.start..frame.end] {
                if self.pointers[p].tokens().len() == len {
                    match &mut found[p] {
                        Some(earlier) => {
                            earlier.push(b',');
                            earlier.extend_from_slice(value);
                        }
                        None => found[p] = Some(value.to_vec()),
                    }
                }
            }
        }
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
