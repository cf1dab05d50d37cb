//! Objects and arrays: their members and elements parsed in one pass, each value skipped,
//! extracted or kept as [`super::paths`] decides, and an object's members written out in
//! key order once it closes.

use super::*;
use crate::canonical::ascii_lowercase_lanes;

impl Parser<'_, '_> {
    /// Enters the object or array that `open` starts at `self.pos`, enclosed by `level - 1`
    /// others; says whether `close` follows at once (the empty container is then written).
    #[inline(always)]
    fn open(
        &mut self,
        out: &mut Vec<u8>,
        level: usize,
        open: u8,
        close: u8,
    ) -> Result<bool, JsonError> {
        if level > MAX_DEPTH {
            return Err(JsonError::TooDeep);
        }
        self.pos += 1;
        out.push(open);
        self.skip_ws();
        if self.input.get(self.pos) == Some(&close) {
            self.pos += 1;
            out.push(close);
            return Ok(true);
        }
        Ok(false)
    }

    /// Reads what follows a member or an element: `true` for `close`, `false` for a comma.
    #[inline(always)]
    fn closes(&mut self, close: u8) -> Result<bool, JsonError> {
        self.skip_ws();
        match self.input.get(self.pos) {
            Some(b',') => {
                self.pos += 1;
                self.skip_ws();
                Ok(false)
            }
            Some(&b) if b == close => {
                self.pos += 1;
                Ok(true)
            }
            _ => self.invalid(),
        }
    }

    #[inline(never)]
    pub(super) fn object(
        &mut self,
        out: &mut Vec<u8>,
        level: usize,
        frame: Frame,
    ) -> Result<(), JsonError> {
        if self.open(out, level, b'{', b'}')? {
            return Ok(());
        }
        // Members are only parsed here; `finish_object` writes them in key order. Until then
        // `out[body_start..]` holds just the values that had to be generated.
        let body_start = out.len();
        let members_base = self.buffers.members.len();
        let keys_base = self.buffers.keys.len();
        let check_names = self.ignore.has_names() && self.skipping == 0;
        let reporting = self.reporting();
        loop {
            if self.input.get(self.pos) != Some(&b'"') {
                return self.invalid();
            }
            let key = self.key()?;
            let compact = !key.decoded && self.input.get(self.pos) == Some(&b':');
            if !compact {
                self.skip_ws();
                if self.input.get(self.pos) != Some(&b':') {
                    return self.invalid();
                }
            }
            self.pos += 1;
            self.skip_ws();

            let live_mark = self.buffers.live.len();
            let (child, exact) = if frame.is_empty() {
                (Frame::NONE, false)
            } else {
                self.narrow(frame, level, Seg::Key(key))
            };
            let skip = (exact && self.extract.is_none()) || (check_names && self.ignores_key(key));
            if skip {
                if reporting {
                    self.report(Seg::Key(key));
                }
                self.skip_value(out, level)?;
            } else {
                if reporting {
                    self.buffers.path.push(Seg::Key(key));
                }
                // Only a member some pointer goes through has occurrences to note: most
                // bodies are fingerprinted, not extracted from.
                let occurrences = (!child.is_empty()).then(|| self.open_occurrences(child, level));
                let value = self.member_value(out, level, child)?;
                if let Some(mark) = occurrences {
                    self.close_occurrences(mark);
                }
                if reporting {
                    self.buffers.path.pop();
                }
                if exact {
                    let input = self.input;
                    let bytes = match value {
                        Value::Input { start, end } => &input[start..end],
                        Value::Generated { start, end } => &out[start..end],
                    };
                    self.store_extracted(bytes, child, level);
                }
                self.buffers.members.push(Member {
                    key,
                    compact,
                    value,
                });
            }
            self.buffers.live.truncate(live_mark);

            if self.closes(b'}')? {
                break;
            }
        }
        self.finish_object(out, level, body_start, members_base);
        self.buffers.members.truncate(members_base);
        self.buffers.keys.truncate(keys_base);
        out.push(b'}');
        Ok(())
    }

    /// Parses a member's value, leaving it in the input when it is canonical there already.
    #[inline(always)]
    pub(super) fn member_value(
        &mut self,
        out: &mut Vec<u8>,
        level: usize,
        frame: Frame,
    ) -> Result<Value, JsonError> {
        let input = self.input;
        let start = self.pos;
        let literal = match input.get(start) {
            Some(b'"') => {
                let stop = scan_plain(input, start + 1)?;
                if input[stop] == b'"' {
                    // Without escapes the input spelling is already canonical: quotes,
                    // backslashes and control characters cannot appear raw.
                    self.pos = stop + 1;
                    return Ok(Value::Input {
                        start,
                        end: self.pos,
                    });
                }
                None
            }
            // Fixed-length comparisons compile to one load each, unlike `starts_with`.
            Some(b't') => Some(input[start..].first_chunk() == Some(b"true")),
            Some(b'f') => Some(input[start..].first_chunk() == Some(b"false")),
            Some(b'n') => Some(input[start..].first_chunk() == Some(b"null")),
            _ => None,
        };
        if let Some(valid) = literal {
            if !valid {
                return self.invalid();
            }
            self.pos += if input[start] == b'f' { 5 } else { 4 };
            return Ok(Value::Input {
                start,
                end: self.pos,
            });
        }
        let generated = out.len();
        self.value(out, level, frame)?;
        Ok(Value::Generated {
            start: generated,
            end: out.len(),
        })
    }

    /// Writes the members `members[base..]` to `out` in key order, comma-separated, in place of
    /// the generated values held at `out[body_start..]`.
    pub(super) fn finish_object(
        &mut self,
        out: &mut Vec<u8>,
        level: usize,
        body_start: usize,
        base: usize,
    ) {
        let Buffers {
            keys,
            members,
            scratch,
            order,
            wide,
            shapes,
            ..
        } = &mut self.buffers;
        let input = self.input;
        let members = &members[base..];
        if shapes.len() <= level {
            shapes.resize_with(level + 1, Shape::default);
        }
        let name = |i: usize| key_bytes(input, keys, members[i].key);
        // An ASCII prefix is its own signature, lower-cased: no need to find the name.
        let signature = |i: usize| match members[i].key.prefix {
            prefix if prefix & 0x8080_8080_8080_8080 == 0 => ascii_lowercase_lanes(prefix),
            prefix => fold_signature(name(i), prefix),
        };
        // Names equal but for case are one member to case-insensitive parsers, the last one
        // winning: their order is data, kept with the rest of the object's, after a space
        // that marks the object as unsorted (canonical JSON has no whitespace otherwise).
        let as_sent = any_case_variants(members.len(), name, signature, wide);
        let in_order = as_sent || key_order(input, keys, members, order, wide, &mut shapes[level]);
        scratch.clear();
        if out.len() > body_start {
            scratch.extend_from_slice(&out[body_start..]);
            // Padding lets `append` copy every short value with a fixed-size window.
            scratch.extend_from_slice(&[0; WINDOW]);
            out.truncate(body_start);
        }
        let generated = Generated {
            bytes: scratch,
            offset: body_start,
        };
        if as_sent {
            out.push(b' ');
        }
        if in_order {
            for (i, m) in members.iter().enumerate() {
                emit_member(out, input, keys, &generated, i, m);
            }
        } else {
            for (i, &m) in order.iter().enumerate() {
                emit_member(out, input, keys, &generated, i, &members[m as usize]);
            }
        }
    }

    #[inline(never)]
    pub(super) fn array(
        &mut self,
        out: &mut Vec<u8>,
        level: usize,
        frame: Frame,
    ) -> Result<(), JsonError> {
        if self.open(out, level, b'[', b']')? {
            return Ok(());
        }
        let mut index = 0;
        let mut emitted = false;
        loop {
            let live_mark = self.buffers.live.len();
            let (child, exact) = if frame.is_empty() {
                (Frame::NONE, false)
            } else {
                self.narrow(frame, level, Seg::Index(index))
            };
            if exact && self.extract.is_none() && self.skipping == 0 {
                if self.reporting() {
                    self.report(Seg::Index(index));
                }
                self.skip_value(out, level)?;
            } else {
                if emitted {
                    out.push(b',');
                }
                emitted = true;
                let start = out.len();
                let reporting = self.reporting();
                if reporting {
                    self.buffers.path.push(Seg::Index(index));
                }
                let occurrences = (!child.is_empty()).then(|| self.open_occurrences(child, level));
                self.value(out, level, child)?;
                if let Some(mark) = occurrences {
                    self.close_occurrences(mark);
                }
                if reporting {
                    self.buffers.path.pop();
                }
                if exact {
                    self.store_extracted(&out[start..], child, level);
                }
            }
            self.buffers.live.truncate(live_mark);
            index += 1;

            if self.closes(b']')? {
                break;
            }
        }
        out.push(b']');
        Ok(())
    }
}
