//! The working memory of one parse ([`Buffers`]): the stacks of open objects, paths and
//! pointer matches, recycled per thread so that canonicalizing a typical body allocates
//! nothing beyond the caller's output buffer.

use super::*;

/// Working memory of one parse. It is recycled per thread so that canonicalizing a typical body
/// allocates nothing beyond the caller's output buffer.
#[derive(Default)]
pub(super) struct Buffers {
    /// Stack of pointer indexes; each nesting level owns one `Frame` of it.
    pub(super) live: Vec<usize>,
    /// Stack of path steps, maintained only while skipped paths are being reported.
    pub(super) path: Vec<Seg>,
    /// Stack of members of all objects currently open; each object owns a tail of it.
    pub(super) members: Vec<Member>,
    /// Decoded keys that contained escapes, stacked like `members`.
    pub(super) keys: Vec<u8>,
    /// Holds one object's generated values while its members are written out in key order.
    pub(super) scratch: Vec<u8>,
    /// One object's member indexes, sorted into key order.
    pub(super) order: Vec<u64>,
    /// Members of objects too large for `order`'s packing, as `prefix << 64 | index`.
    pub(super) wide: Vec<u128>,
    /// The last out-of-order key sequence seen at each nesting level, with its sorted order.
    /// Arrays of like objects, and successive bodies sent to one endpoint, repeat their key
    /// sequences, and reusing the order skips the sort. Kept across parses on purpose; its size
    /// is bounded by `MAX_DEPTH` × `MAX_SHAPE`.
    pub(super) shapes: Vec<Shape>,
}

/// A key sequence, as key prefixes, and the order that sorts it.
#[derive(Default)]
pub(super) struct Shape {
    pub(super) prefixes: Vec<u64>,
    pub(super) order: Vec<u64>,
}

/// Objects with more members than this are not remembered as shapes.
pub(super) const MAX_SHAPE: usize = 64;

/// Buffers grown beyond this many bytes by an unusually large body are freed rather than kept
/// for the next parse.
pub(super) const MAX_RETAINED_BYTES: usize = 256 * 1024;

thread_local! {
    static RECYCLED: std::cell::Cell<Buffers> = std::cell::Cell::new(Buffers::default());
}

impl Buffers {
    pub(super) fn take() -> Self {
        let mut buffers = RECYCLED.with(std::cell::Cell::take);
        // A parse that failed midway leaves its stacks as they were.
        buffers.live.clear();
        buffers.path.clear();
        buffers.members.clear();
        buffers.keys.clear();
        buffers.scratch.clear();
        buffers.order.clear();
        buffers.wide.clear();
        buffers
    }

    /// Hands the buffers back to this thread for the next parse.
    pub(super) fn recycle(&mut self) {
        fn bounded<T>(vec: &mut Vec<T>) {
            if vec.capacity() * std::mem::size_of::<T>() > MAX_RETAINED_BYTES {
                *vec = Vec::new();
            }
        }
        let mut buffers = std::mem::take(self);
        bounded(&mut buffers.live);
        bounded(&mut buffers.path);
        bounded(&mut buffers.members);
        bounded(&mut buffers.keys);
        bounded(&mut buffers.scratch);
        bounded(&mut buffers.order);
        bounded(&mut buffers.wide);
        RECYCLED.with(|cell| cell.set(buffers));
    }
}
