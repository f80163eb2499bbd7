//! A retained message as the index holds it: one pointer, to bytes of its
//! own or to the retained store's own copy of the message.
//!
//! The bytes of its own are exactly a length, a head, the topic's last
//! level and the payload, in one allocation: on a database provider that
//! is the message's only copy in memory. A memory provider's retained
//! store holds each message itself ([`Kept`]); the index then holds the
//! store's handle on it instead of a second copy, so a retained message on
//! memory is held once. The pointer's lowest bit tells the two apart:
//! both are allocated at an alignment of at least 2, so it is free.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::ptr::NonNull;

use crate::storage::kept::{Kept, KeptRecord};

/// What a leaf's own bytes start with, after their length, in
/// [`Head::LEN`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Head {
    /// The length of the last level, which follows the head; the payload
    /// follows it.
    name_len: u16,
    qos: u8,
    /// The message is kept whole beside the index, by its topic; the
    /// bytes after the head are its last level only.
    whole: bool,
}

impl Head {
    const LEN: usize = 4;

    fn to_bytes(self) -> [u8; Head::LEN] {
        let [low, high] = self.name_len.to_le_bytes();
        [low, high, self.qos, u8::from(self.whole)]
    }

    fn from_bytes(bytes: &[u8]) -> Head {
        Head {
            name_len: u16::from_le_bytes([bytes[0], bytes[1]]),
            qos: bytes[2],
            whole: bytes[3] != 0,
        }
    }
}

/// The lowest bit of a leaf's pointer: set, it is a [`Kept`]'s.
const KEPT: usize = 1;

/// The alignment of a leaf's own bytes: enough to leave [`KEPT`] clear.
const ALIGN: usize = 2;

/// A retained message in its level's set, ordered (and found) by the last
/// level of its topic. A delivery waiting to be sent holds a clone: a copy
/// of its own bytes, or another count on the store's handle.
pub struct Leaf(NonNull<u8>);

// SAFETY: a leaf owns its bytes, which are never changed after they are
// written, or a count on a `Kept`, which is `Send + Sync`.
unsafe impl Send for Leaf {}
// SAFETY: as above: nothing is changed through a shared leaf.
unsafe impl Sync for Leaf {}

/// What a leaf's pointer is, decoded once for every use of it.
enum Raw {
    /// `Kept::into_raw`'s pointer, untagged.
    Kept(NonNull<u8>),
    /// Its own allocation: the length's bytes, then the body's.
    Own { prefix: usize, body: usize },
}

/// A leaf's two forms, as read.
enum Form<'a> {
    /// Its own bytes after the length: the head, the last level, the
    /// payload.
    Own(&'a [u8]),
    Kept(&'a KeptRecord),
}

impl Leaf {
    /// The leaf of a message with no properties, from its parts; `None`
    /// for a last level too long to count in the head.
    pub(super) fn plain(name: &str, qos: u8, payload: &[u8]) -> Option<Leaf> {
        let head = Head {
            name_len: u16::try_from(name.len()).ok()?,
            qos,
            whole: false,
        };
        Some(Leaf::own(head, name, payload))
    }

    /// The leaf of a message kept whole: its last level only.
    pub(super) fn whole(name: &str, qos: u8) -> Leaf {
        let head = Head {
            name_len: u16::try_from(name.len()).unwrap_or(u16::MAX),
            qos,
            whole: true,
        };
        Leaf::own(head, name, &[])
    }

    /// The leaf of a message with no properties the retained store keeps
    /// as `kept`: the store's handle, shared.
    pub(super) fn kept(kept: Kept) -> Leaf {
        Leaf(kept.into_raw().map_addr(|addr| addr | KEPT))
    }

    /// One allocation of the body's length (LEB128), the head, `name` and
    /// `payload`.
    fn own(head: Head, name: &str, payload: &[u8]) -> Leaf {
        let body = Head::LEN + name.len() + payload.len();
        let mut length = [0u8; 10];
        let prefix = leb128(body, &mut length);
        let bytes = [
            &length[..prefix],
            &head.to_bytes(),
            name.as_bytes(),
            payload,
        ];
        let size = prefix + body;
        let layout = own_layout(size);
        // SAFETY: `layout` has a nonzero size (the head alone is 4 bytes).
        let start = unsafe { alloc(layout) };
        let Some(start) = NonNull::new(start) else {
            handle_alloc_error(layout)
        };
        let mut at = 0;
        for part in bytes {
            // SAFETY: the parts' lengths sum to `size`, the allocation's.
            unsafe {
                start
                    .as_ptr()
                    .add(at)
                    .copy_from_nonoverlapping(part.as_ptr(), part.len())
            };
            at += part.len();
        }
        Leaf(start)
    }

    fn raw(&self) -> Raw {
        let tagged = self.0.as_ptr();
        if tagged.addr() & KEPT != 0 {
            let untagged = tagged.map_addr(|addr| addr & !KEPT);
            // SAFETY: `Kept::into_raw`'s pointer with its lowest bit set
            // (`Leaf::kept`); cleared, it is that pointer again, not null.
            return Raw::Kept(unsafe { NonNull::new_unchecked(untagged) });
        }
        // SAFETY: an untagged pointer is `Leaf::own`'s: its allocation
        // starts with the body's length.
        let (body, prefix) = unsafe { read_leb128(tagged) };
        Raw::Own { prefix, body }
    }

    fn form(&self) -> Form<'_> {
        match self.raw() {
            // SAFETY: a tagged pointer is `Kept::into_raw`'s (`Leaf::kept`),
            // and this leaf holds its count until it is dropped.
            Raw::Kept(kept) => Form::Kept(unsafe { Kept::record_at(kept) }),
            // SAFETY: the body follows its length, whole, in `Leaf::own`'s
            // allocation.
            Raw::Own { prefix, body } => {
                Form::Own(unsafe { std::slice::from_raw_parts(self.0.as_ptr().add(prefix), body) })
            }
        }
    }

    /// The last level of its topic.
    pub fn name(&self) -> &str {
        match self.form() {
            Form::Own(body) => {
                let head = Head::from_bytes(body);
                let end = if head.whole {
                    body.len()
                } else {
                    Head::LEN + usize::from(head.name_len)
                };
                // SAFETY: the bytes after the head begin with a topic's
                // last level, copied whole from a `&str` split at a `/`
                // (`Leaf::plain`, `Leaf::whole`), and are never changed.
                unsafe { std::str::from_utf8_unchecked(&body[Head::LEN..end]) }
            }
            Form::Kept(kept) => kept.last_level(),
        }
    }

    pub fn payload(&self) -> &[u8] {
        match self.form() {
            Form::Own(body) => {
                let head = Head::from_bytes(body);
                if head.whole {
                    &[]
                } else {
                    &body[Head::LEN + usize::from(head.name_len)..]
                }
            }
            Form::Kept(kept) => kept.payload(),
        }
    }

    pub fn qos(&self) -> u8 {
        match self.form() {
            Form::Own(body) => Head::from_bytes(body).qos,
            Form::Kept(kept) => kept.qos,
        }
    }

    /// The message is kept whole beside the index, by its topic.
    pub(super) fn is_whole(&self) -> bool {
        match self.form() {
            Form::Own(body) => Head::from_bytes(body).whole,
            Form::Kept(_) => false,
        }
    }

    /// The store's handle it shares, if it is one.
    #[cfg(test)]
    pub(super) fn shared(&self) -> Option<&KeptRecord> {
        match self.form() {
            Form::Own(_) => None,
            Form::Kept(kept) => Some(kept),
        }
    }

    /// How many bytes of its own it holds (0 for the store's handle).
    #[cfg(test)]
    pub(super) fn own_len(&self) -> usize {
        match self.form() {
            Form::Own(body) => body.len(),
            Form::Kept(_) => 0,
        }
    }
}

impl Clone for Leaf {
    fn clone(&self) -> Leaf {
        match self.raw() {
            Raw::Kept(kept) => {
                // SAFETY: the pointer is `Kept::into_raw`'s and this leaf
                // holds its count, which stays with it: the handle taken
                // back is forgotten once cloned, and the clone's count goes
                // with the copied pointer, whose own drop gives it back.
                let held = std::mem::ManuallyDrop::new(unsafe { Kept::from_raw(kept) });
                Leaf::kept(Kept::clone(&held))
            }
            Raw::Own { prefix, body } => {
                let layout = own_layout(prefix + body);
                // SAFETY: a copy of the whole of `Leaf::own`'s allocation
                // into one of the same layout, which is not empty.
                unsafe {
                    let Some(copy) = NonNull::new(alloc(layout)) else {
                        handle_alloc_error(layout)
                    };
                    copy.as_ptr()
                        .copy_from_nonoverlapping(self.0.as_ptr(), layout.size());
                    Leaf(copy)
                }
            }
        }
    }
}

impl Drop for Leaf {
    fn drop(&mut self) {
        match self.raw() {
            // SAFETY: the pointer is `Kept::into_raw`'s, and this leaf gives
            // back the one count it holds.
            Raw::Kept(kept) => drop(unsafe { Kept::from_raw(kept) }),
            // SAFETY: `Leaf::own`'s allocation, of this layout.
            Raw::Own { prefix, body } => unsafe {
                dealloc(self.0.as_ptr(), own_layout(prefix + body))
            },
        }
    }
}

/// The layout of a leaf's own allocation of `size` bytes.
fn own_layout(size: usize) -> Layout {
    Layout::from_size_align(size, ALIGN).unwrap_or_else(|_| {
        // Only a body near `isize::MAX` bytes, which no message reaches.
        handle_alloc_error(Layout::new::<u8>())
    })
}

impl fmt::Debug for Leaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leaf")
            .field("name", &self.name())
            .field("payload_len", &self.payload().len())
            .field("qos", &self.qos())
            .field("whole", &self.is_whole())
            .field("shared", &matches!(self.form(), Form::Kept(_)))
            .finish()
    }
}

impl Borrow<str> for Leaf {
    fn borrow(&self) -> &str {
        self.name()
    }
}

impl PartialEq for Leaf {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Leaf {}

impl PartialOrd for Leaf {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Leaf {
    fn cmp(&self, other: &Self) -> Ordering {
        self.name().cmp(other.name())
    }
}

/// `value` in LEB128 into `out`; returns how many bytes it took.
fn leb128(mut value: usize, out: &mut [u8; 10]) -> usize {
    let mut len = 0;
    loop {
        let low = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out[len] = low;
            return len + 1;
        }
        out[len] = low | 0x80;
        len += 1;
    }
}

/// The LEB128 value at `at`, and how many bytes it took.
///
/// # Safety
/// `at` starts a complete value [`leb128`] wrote.
unsafe fn read_leb128(at: *const u8) -> (usize, usize) {
    let mut value = 0usize;
    let mut len = 0;
    loop {
        // SAFETY: the caller's: every byte up to the last one is there.
        let byte = unsafe { at.add(len).read() };
        value |= usize::from(byte & 0x7f) << (7 * len);
        len += 1;
        if byte & 0x80 == 0 {
            return (value, len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use saguin_format::model::Record;

    #[test]
    fn a_leaf_is_one_pointer_in_either_form() {
        assert_eq!(std::mem::size_of::<Leaf>(), std::mem::size_of::<usize>());
        assert_eq!(
            std::mem::size_of::<Option<Leaf>>(),
            std::mem::size_of::<usize>()
        );
    }

    /// Its own bytes read back as written, at every length the prefix
    /// takes one, two and three bytes for, and a clone is a copy.
    #[test]
    fn own_bytes_read_back_as_written() {
        for payload_len in [0, 1, 100, 123, 124, 200, 16_380, 16_400, 70_000] {
            let payload: Vec<u8> = (0..payload_len).map(|i| i as u8).collect();
            let leaf = Leaf::plain("dev-1", 2, &payload).unwrap();
            for leaf in [leaf.clone(), leaf] {
                assert_eq!(leaf.name(), "dev-1");
                assert_eq!(leaf.payload(), payload.as_slice());
                assert_eq!((leaf.qos(), leaf.is_whole()), (2, false));
                assert_eq!(leaf.own_len(), Head::LEN + 5 + payload_len);
                assert!(leaf.shared().is_none());
            }
        }
        let long = "x".repeat(70_000);
        assert!(Leaf::plain(&long, 0, b"v").is_none(), "too long to count");
        let whole = Leaf::whole(&long, 1);
        for whole in [whole.clone(), whole] {
            assert_eq!((whole.name(), whole.payload()), (long.as_str(), &[][..]));
            assert_eq!((whole.qos(), whole.is_whole()), (1, true));
        }
    }

    /// The store's handle is shared, not copied: the leaf reads through it
    /// and holds one count, as each clone does, given back on drop.
    #[test]
    fn a_kept_leaf_shares_the_stores_handle() {
        let record = Record {
            qos: 1,
            retain: true,
            client_id: "dev-7".into(),
            ..Record::new("site/1/device/7", vec![5u8; 64])
        };
        let kept = Kept::new(&record);
        let leaf = Leaf::kept(kept.clone());
        assert_eq!(Kept::count(&kept), 2);
        let clone = leaf.clone();
        assert_eq!(Kept::count(&kept), 3);
        for leaf in [&leaf, &clone] {
            assert_eq!(leaf.name(), "7");
            assert_eq!(leaf.payload(), &[5u8; 64][..]);
            assert_eq!(leaf.payload().as_ptr(), kept.payload().as_ptr());
            assert_eq!((leaf.qos(), leaf.is_whole()), (1, false));
            assert!(std::ptr::eq(leaf.shared().unwrap(), &*kept));
        }
        drop(leaf);
        drop(clone);
        assert_eq!(Kept::count(&kept), 1);

        // A last level too long for an own leaf's head (another writer's
        // record) is read from the record all the same.
        let long = format!("a/{}", "x".repeat(70_000));
        let leaf = Leaf::kept(Kept::new(&Record::new(&*long, "v")));
        assert_eq!((leaf.name(), leaf.payload()), (&long[2..], &b"v"[..]));
    }
}
