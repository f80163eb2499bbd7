//! The topics of one record list seen so far, to refuse a second value for
//! one (a latest channel's, the retained store's).
//!
//! A million retained topics held about 74 MB here as a set of strings: a
//! 24-byte entry in each of the table's two million slots, and a copy of
//! each topic when the file is read as a stream. The set now numbers the
//! topics and keeps only the numbers in its table (8 bytes a slot). A topic
//! read from a whole input is kept as where it lies there; one read as a
//! stream is copied into buffers of 1 MiB, each filled and never grown, so
//! a topic has no allocation of its own and no buffer is copied as the
//! set grows. Every lookup compares the topics themselves: nothing is
//! taken as seen on its hash alone.

use std::hash::BuildHasher;

use hashbrown::HashTable;

/// A number's lowest bit: set for a copied topic, clear for one in place.
const COPIED: usize = 1;

/// The size of a buffer of copied topics; a longer topic has one of its
/// own.
const CHUNK: usize = 1 << 20;

/// Where a copied topic is: a buffer, and its bytes there. An MQTT topic
/// in a file is at most `u32::MAX` bytes (its length prefix), and so is a
/// buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    chunk: u32,
    start: u32,
    len: u32,
}

#[derive(Debug, Default)]
pub(crate) struct TopicSet<'a> {
    /// Seeded afresh in every process, so no file can be made to collide.
    hasher: foldhash::fast::RandomState,
    /// Each topic's number: its index among `in_place` or `spans`,
    /// shifted left once, with [`COPIED`] telling which.
    table: HashTable<usize>,
    /// Topics where they lie in a whole input.
    in_place: Vec<&'a str>,
    /// Copied topics, one after another, in buffers of [`CHUNK`] bytes.
    chunks: Vec<String>,
    /// Where each copied topic is.
    spans: Vec<Span>,
}

impl<'a> TopicSet<'a> {
    /// Room for `count` topics before they are read, in the table and
    /// in the list of where they are: nothing is copied as the set grows
    /// to that (a list's room is address space until it is written).
    pub(crate) fn reserve(&mut self, count: usize) {
        let TopicSet {
            hasher,
            table,
            in_place,
            chunks,
            spans,
        } = self;
        table.reserve(count, |&number| {
            hasher.hash_one(topic(in_place, chunks, spans, number))
        });
        in_place.reserve(count);
        spans.reserve(count);
    }

    /// Adds `topic`, kept as `in_place` where it lies in a whole input or
    /// copied otherwise. Returns false, adding nothing, when it was there.
    pub(crate) fn insert(&mut self, topic_text: &str, in_place: Option<&'a str>) -> bool {
        let TopicSet {
            hasher,
            table,
            in_place: placed,
            chunks,
            spans,
        } = self;
        let hash = hasher.hash_one(topic_text);
        let seen = |&number: &usize| topic(placed, chunks, spans, number) == topic_text;
        if table.find(hash, seen).is_some() {
            return false;
        }
        let number = match in_place {
            Some(text) => {
                placed.push(text);
                (placed.len() - 1) << 1
            }
            None => {
                spans.push(copy(chunks, topic_text));
                ((spans.len() - 1) << 1) | COPIED
            }
        };
        table.insert_unique(hash, number, |&number| {
            hasher.hash_one(topic(placed, chunks, spans, number))
        });
        true
    }
}

/// Copies `text` to the end of the last buffer, or of a new one where it
/// does not fit.
fn copy(chunks: &mut Vec<String>, text: &str) -> Span {
    let fits = chunks
        .last()
        .is_some_and(|chunk| chunk.capacity() - chunk.len() >= text.len());
    if !fits {
        chunks.push(String::with_capacity(CHUNK.max(text.len())));
    }
    let chunk = chunks.last_mut().expect("a buffer was just made");
    let start = chunk.len();
    chunk.push_str(text);
    // A buffer is at most `CHUNK` or one topic long, and a topic's length
    // came from a `u32` prefix.
    let narrow = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    Span {
        chunk: narrow(chunks.len() - 1),
        start: narrow(start),
        len: narrow(text.len()),
    }
}

/// The topic numbered `number`.
fn topic<'s>(in_place: &'s [&str], chunks: &'s [String], spans: &[Span], number: usize) -> &'s str {
    let index = number >> 1;
    if number & COPIED == 0 {
        return in_place[index];
    }
    let Span { chunk, start, len } = spans[index];
    let start = start as usize;
    &chunks[chunk as usize][start..start + len as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A topic is seen once whichever way it came, whole or copied, and
    /// neighbours that share bytes are told apart.
    #[test]
    fn each_topic_is_seen_once_however_it_was_kept() {
        let input = String::from("a/b a/bc a");
        let mut set = TopicSet::default();
        set.reserve(4);
        assert!(set.insert("a/b", Some(&input[0..3])));
        assert!(set.insert("a/bc", None));
        assert!(set.insert("a", None));
        assert!(set.insert("", None));
        assert!(set.insert("a/b/", None));
        assert!(!set.insert("a/b", None), "seen in place");
        assert!(!set.insert("a/bc", Some(&input[4..8])), "seen as a copy");
        assert!(!set.insert("a", None));
        assert!(!set.insert("", Some(&input[0..0])));
        assert_eq!(set.chunks, ["a/bcaa/b/"]);
        assert_eq!(set.spans.len(), 4);
    }

    /// Many topics over several buffers, one longer than a buffer, the
    /// table grown past what was reserved: every one is found again, and
    /// none is taken for another.
    #[test]
    fn a_grown_set_finds_every_topic() {
        let mut set = TopicSet::default();
        set.reserve(10);
        let mut topics: Vec<String> = (0..100_000)
            .map(|i| format!("site/{}/d/{i}", i % 7))
            .collect();
        topics.insert(50_000, "x".repeat(CHUNK + 1));
        for t in &topics {
            assert!(set.insert(t, None));
        }
        for t in &topics {
            assert!(!set.insert(t, None), "{t}");
        }
        assert!(set.insert("site/0/d/100000", None));
        assert!(set.chunks.len() > 2, "{} buffers", set.chunks.len());
        assert!(set
            .chunks
            .iter()
            .all(|c| c.capacity() == CHUNK || c.len() == CHUNK + 1));
    }
}
