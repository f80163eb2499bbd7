//! A record as a memory store keeps it: its fields, a count of its
//! handles, and its topic, client id and payload in one allocation, behind
//! a handle of one pointer (an append channel's log, a latest channel's
//! and the retained store's values, a queue's items, the broadcast log's
//! messages). The broker's retained index holds the retained store's own
//! handle on a value rather than a copy of it (`LatestStore::set_sharing`),
//! and a message owed to persistent sessions is routed with its topic and
//! payload lent from the broadcast log's entry
//! (`BroadcastLog::append_sharing`), so either is held once on memory.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::fmt;
use std::ops::Deref;
use std::ptr::{self, NonNull};
use std::sync::atomic::{fence, AtomicU32, Ordering};

use bytes::Bytes;
use saguin_format::model::{Record, UnixNanos};

/// What the store keeps of one value or marker: the record's fields, its
/// topic, client id and payload, and a count of the handles on it, in one
/// allocation; the parts most records lack out of line. A [`Record`] is
/// about 200 bytes before its strings, and a store of a million retained
/// messages held one for each; this is 56 before the bytes, rebuilt into
/// a record when read (reads are the rare side: a snapshot, a restart, a
/// subscription's retained messages; writes come with every retained
/// publish).
///
/// One allocation rather than an `Arc` of the fields and a box of the
/// bytes: that was 16 bytes of counts (a weak count no handle used), 16
/// of the box's pointer and length, and two allocations each rounded up
/// to its size class, 192 bytes for a 64-byte payload on a 20-byte topic
/// where this is 160.
#[repr(C)]
pub struct KeptRecord<B: ?Sized = [u8]> {
    pub(crate) offset: u64,
    pub(crate) timestamp: UnixNanos,
    pub(crate) message_id: [u8; 16],
    /// A record holding only what the fields here do not: its User
    /// Properties, publish properties, bridge and broadcast-only fields.
    /// Its topic, client id and payload are empty but for one too long
    /// for its length field here, which is kept there instead. `None`
    /// when it would be [`Record::new`]'s empty one.
    pub(crate) rare: Option<Box<Record>>,
    /// The handles on it ([`Kept`]); the last one frees it.
    count: AtomicU32,
    /// The length of `bytes`.
    len: u32,
    /// Where the topic and the client id end in `bytes`. An MQTT string
    /// is at most 65,535 bytes; a longer one (a record another writer
    /// made) is kept in `rare`, and its length here is 0.
    topic_len: u16,
    client_len: u16,
    /// Where the topic's last level starts in it: what the broker's
    /// retained index orders a message it shares by, read at every
    /// comparison (0 for a topic too long for `topic_len`, whose last
    /// level is looked for instead).
    last_level_at: u16,
    pub(crate) qos: u8,
    pub(crate) retain: bool,
    /// The topic, then the client id, then the payload. A copy, not a
    /// share of the record's: a share of a payload a restart decoded into
    /// its own buffer gave it a shared header (24 bytes a value), and a
    /// share of a publish's payload kept the connection's whole read of
    /// many packets resident. Copied out again when read.
    pub(crate) bytes: B,
}

/// The fields before the bytes, as read through a handle's thin pointer
/// to find how many bytes follow.
type Head = KeptRecord<[u8; 0]>;

/// More handles than this on one record is a count about to wrap: the
/// process stops, as `Arc` does, rather than free a record still held.
const MAX_COUNT: u32 = i32::MAX as u32;

/// A handle on a [`KeptRecord`]: one pointer, cloned and dropped as an
/// `Arc` is. The broker's retained index holds it by that pointer with
/// its lowest bit set ([`Kept::into_raw`]), which the record's alignment
/// leaves free.
pub struct Kept(NonNull<Head>);

// SAFETY: what a handle reaches is never changed once shared (the count
// is atomic, and `set_offset` writes only through the one handle there
// is), and every field is `Send + Sync`.
unsafe impl Send for Kept {}
// SAFETY: as above.
unsafe impl Sync for Kept {}

impl Kept {
    pub(crate) fn new(record: &Record) -> Kept {
        Kept::new_within(record, u32::MAX)
    }

    /// [`Kept::new`], with a payload that would take the bytes past
    /// `max_len` kept out of line (`u32::MAX`, which the tests lower).
    fn new_within(record: &Record, max_len: u32) -> Kept {
        // Named field by field: a field added to `Record` is a compile error
        // here until it is kept.
        let Record {
            offset,
            message_id,
            topic,
            timestamp,
            user_properties,
            payload,
            props,
            retain,
            bridge,
            client_id,
            qos,
            shared_copy,
            owed_to,
        } = record;
        // A string too long for its length field goes out of line, and so
        // does a payload that would take the bytes past `u32::MAX`.
        let fits = |text: &str| u16::try_from(text.len()).ok();
        let (topic_len, rare_topic) = match fits(topic) {
            Some(len) => (len, String::new()),
            None => (0, topic.clone()),
        };
        let (client_len, rare_client) = match fits(client_id) {
            Some(len) => (len, String::new()),
            None => (0, client_id.clone()),
        };
        let strings = usize::from(topic_len) + usize::from(client_len);
        let (len, inline_payload, rare_payload) = match u32::try_from(strings + payload.len()) {
            Ok(len) if len <= max_len => (len, &payload[..], Bytes::new()),
            _ => (strings as u32, &[][..], Bytes::copy_from_slice(payload)),
        };
        let rare = (!rare_topic.is_empty()
            || !rare_client.is_empty()
            || !rare_payload.is_empty()
            || !user_properties.is_empty()
            || props.is_allocated()
            || bridge.is_some()
            || *shared_copy
            || owed_to.is_some())
        .then(|| {
            // Its correlation data copied like the payload: a share of it
            // kept what it was read from resident, a restart's whole file.
            let mut props = props.clone();
            if let Some(data) = props.correlation_data.as_mut() {
                *data = Bytes::copy_from_slice(data);
            }
            Box::new(Record {
                user_properties: user_properties.clone(),
                props,
                bridge: bridge.clone(),
                shared_copy: *shared_copy,
                owed_to: owed_to.clone(),
                client_id: rare_client,
                ..Record::new(rare_topic, rare_payload)
            })
        });
        let head = Head {
            offset: *offset,
            timestamp: *timestamp,
            message_id: *message_id,
            rare,
            count: AtomicU32::new(1),
            len,
            topic_len,
            client_len,
            last_level_at: match topic_len {
                0 => 0,
                _ => topic.rfind('/').map_or(0, |slash| slash + 1) as u16,
            },
            qos: *qos,
            retain: *retain,
            bytes: [],
        };
        let layout = layout_for(len);
        // SAFETY: the layout is at least the head's 56 bytes.
        let start = unsafe { alloc(layout) };
        let Some(start) = NonNull::new(start.cast::<Head>()) else {
            handle_alloc_error(layout)
        };
        let parts = [
            &topic.as_bytes()[..usize::from(topic_len)],
            &client_id.as_bytes()[..usize::from(client_len)],
            inline_payload,
        ];
        // SAFETY: the allocation holds the head, then `len` bytes, which
        // are the three parts' lengths summed; it is the allocator's, so
        // nothing else reaches it yet.
        unsafe {
            start.as_ptr().write(head);
            let mut at = start.as_ptr().cast::<u8>().add(size_of::<Head>());
            for part in parts {
                at.copy_from_nonoverlapping(part.as_ptr(), part.len());
                at = at.add(part.len());
            }
        }
        Kept(start)
    }

    /// Numbers the record, before it is shared: the store makes it outside
    /// its lock, and takes the offset under it. A handle that is not the
    /// only one is replaced by a copy of its own.
    pub(crate) fn set_offset(&mut self, offset: u64) {
        if self.count.load(Ordering::Acquire) == 1 {
            // SAFETY: this is the only handle (and `&mut` to it): nothing
            // else reads the record while its offset is written.
            unsafe { (*self.0.as_ptr()).offset = offset };
        } else {
            let mut record = self.record();
            record.offset = offset;
            *self = Kept::new(&record);
        }
    }

    /// The record it keeps, whole again, its payload a share of this
    /// allocation rather than a copy: what a read hands the broker, which
    /// lets it go once the record is sent, so a consumer catching up does
    /// not copy every payload it is sent.
    pub(crate) fn record_sharing(&self) -> Record {
        self.record_with(self.payload_shared())
    }

    /// Its payload as `Bytes` that share this allocation.
    pub(crate) fn payload_shared(&self) -> Bytes {
        Bytes::from_owner(PayloadOf(self.clone()))
    }

    /// Its topic and payload as `Bytes` that share this allocation through
    /// one owner between them, for a message the broker routes to be held
    /// once with the record rather than beside it; `None` where either is
    /// kept out of line.
    pub(crate) fn topic_and_payload_shared(&self) -> Option<(Bytes, Bytes)> {
        let inline = self
            .rare
            .as_ref()
            .is_none_or(|rare| rare.topic.is_empty() && rare.payload.is_empty());
        if !inline || self.topic_len == 0 {
            return None;
        }
        // Slices of one owner take its count; they allocate nothing more.
        let whole = Bytes::from_owner(BytesOf(self.clone()));
        let topic_end = usize::from(self.topic_len);
        let payload_from = topic_end + usize::from(self.client_len);
        Some((whole.slice(..topic_end), whole.slice(payload_from..)))
    }

    /// The handle as a thin pointer, aligned to 8: the count it held is
    /// held by the pointer until [`Kept::from_raw`] takes it back.
    pub(crate) fn into_raw(self) -> NonNull<u8> {
        let raw = self.0.cast::<u8>();
        std::mem::forget(self);
        raw
    }

    /// The handle [`Kept::into_raw`] gave as `raw`.
    ///
    /// # Safety
    /// `raw` is [`Kept::into_raw`]'s, and its count is taken back once.
    pub(crate) unsafe fn from_raw(raw: NonNull<u8>) -> Kept {
        Kept(raw.cast::<Head>())
    }

    /// The record behind [`Kept::into_raw`]'s pointer, for as long as the
    /// caller holds the pointer's count.
    ///
    /// # Safety
    /// `raw` is [`Kept::into_raw`]'s, and its count is not given back for
    /// `'a`.
    pub(crate) unsafe fn record_at<'a>(raw: NonNull<u8>) -> &'a KeptRecord {
        // SAFETY: as the caller promises, the record is alive for 'a.
        unsafe { &*whole(raw.cast::<Head>()) }
    }

    /// How many handles there are on the record.
    #[cfg(test)]
    pub(crate) fn count(this: &Kept) -> u32 {
        this.count.load(Ordering::Acquire)
    }

    /// The two handles are on one record.
    #[cfg(test)]
    pub(crate) fn ptr_eq(this: &Kept, other: &Kept) -> bool {
        this.0 == other.0
    }
}

/// The layout of a record with `len` bytes: the head's, then the bytes,
/// padded to the head's alignment, as `KeptRecord<[u8]>` is laid out.
fn layout_for(len: u32) -> Layout {
    // A length of at most `u32::MAX` cannot overflow a layout on a 64-bit
    // target; on a 32-bit one, a length near it is an allocation failure.
    Layout::from_size_align(size_of::<Head>() + len as usize, align_of::<Head>())
        .map(|layout| layout.pad_to_align())
        .unwrap_or_else(|_| handle_alloc_error(Layout::new::<Head>()))
}

/// The record a thin pointer starts, with its bytes: a slice pointer of
/// the bytes' length made the record's, which is what `KeptRecord<[u8]>`
/// takes as its length.
fn whole(head: NonNull<Head>) -> *const KeptRecord {
    // SAFETY: the head is alive (a handle or a held pointer is), and its
    // length is never changed after it is written.
    let len = unsafe { (*head.as_ptr()).len };
    ptr::slice_from_raw_parts(head.as_ptr().cast::<u8>(), len as usize) as *const KeptRecord
}

impl Deref for Kept {
    type Target = KeptRecord;

    fn deref(&self) -> &KeptRecord {
        // SAFETY: the handle holds a count, so the record is alive for as
        // long as the handle is borrowed.
        unsafe { &*whole(self.0) }
    }
}

impl Clone for Kept {
    fn clone(&self) -> Kept {
        let before = self.count.fetch_add(1, Ordering::Relaxed);
        if before > MAX_COUNT {
            std::process::abort();
        }
        Kept(self.0)
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        if self.count.fetch_sub(1, Ordering::Release) != 1 {
            return;
        }
        // Every other handle's use of the record happens before it is freed.
        fence(Ordering::Acquire);
        let head = self.0.as_ptr();
        // SAFETY: this was the last handle: nothing else reaches the record.
        // Its out-of-line part is dropped in place, then its allocation,
        // of the layout it was made with, freed.
        unsafe {
            let len = (*head).len;
            ptr::drop_in_place(&raw mut (*head).rare);
            dealloc(head.cast::<u8>(), layout_for(len));
        }
    }
}

impl fmt::Debug for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        KeptRecord::fmt(self, f)
    }
}

impl fmt::Debug for KeptRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeptRecord")
            .field("offset", &self.offset)
            .field("topic", &self.topic())
            .field("client_id", &self.client_id())
            .field("payload_len", &self.payload().len())
            .field("qos", &self.qos)
            .field("retain", &self.retain)
            .field("rare", &self.rare)
            .finish()
    }
}

impl KeptRecord {
    /// `bytes[from..to]`, which [`Kept::new`] copied from a `str` cut at
    /// its ends.
    fn text(&self, from: usize, to: usize) -> &str {
        // SAFETY: `new` copied the topic, then the client id, whole from
        // `str`s, and the lengths it kept are theirs: both are cut from
        // `bytes` at the boundaries of what was copied.
        unsafe { std::str::from_utf8_unchecked(&self.bytes[from..to]) }
    }

    pub fn topic(&self) -> &str {
        match &self.rare {
            Some(rare) if !rare.topic.is_empty() => &rare.topic,
            _ => self.text(0, usize::from(self.topic_len)),
        }
    }

    /// The topic's last level: all of it after its last `/`.
    pub fn last_level(&self) -> &str {
        match self.last_level_at {
            0 => {
                let topic = self.topic();
                topic.rsplit_once('/').map_or(topic, |(_, last)| last)
            }
            at => self.text(usize::from(at), usize::from(self.topic_len)),
        }
    }

    pub fn client_id(&self) -> &str {
        match &self.rare {
            Some(rare) if !rare.client_id.is_empty() => &rare.client_id,
            _ => {
                let from = usize::from(self.topic_len);
                self.text(from, from + usize::from(self.client_len))
            }
        }
    }

    /// The bridge it arrived over, if it did.
    pub fn bridge(&self) -> Option<&str> {
        self.rare.as_ref().and_then(|r| r.bridge.as_deref())
    }

    /// The payload where it is kept in `bytes` (all of it but for one
    /// too long, kept in `rare`).
    fn inline_payload(&self) -> &[u8] {
        &self.bytes[usize::from(self.topic_len) + usize::from(self.client_len)..]
    }

    pub fn payload(&self) -> &[u8] {
        match &self.rare {
            Some(rare) if !rare.payload.is_empty() => &rare.payload,
            _ => self.inline_payload(),
        }
    }

    /// A deletion marker.
    pub fn is_marker(&self) -> bool {
        self.payload().is_empty()
    }

    /// [`Record::accounted_size`] of the record it keeps: `rare` counts
    /// what it holds (its topic and payload only where they are kept
    /// there).
    pub fn accounted_size(&self) -> u64 {
        let rare = self.rare.as_ref().map_or(0, |r| r.accounted_size());
        u64::from(self.topic_len) + self.inline_payload().len() as u64 + rare
    }

    /// The record it keeps, whole again.
    pub fn record(&self) -> Record {
        self.record_with(Bytes::copy_from_slice(self.payload()))
    }

    fn record_with(&self, payload: Bytes) -> Record {
        let base = match &self.rare {
            Some(rare) => Record::clone(rare),
            None => Record::new(String::new(), Bytes::new()),
        };
        Record {
            offset: self.offset,
            message_id: self.message_id,
            topic: self.topic().to_owned(),
            timestamp: self.timestamp,
            payload,
            retain: self.retain,
            client_id: self.client_id().to_owned(),
            qos: self.qos,
            ..base
        }
    }
}

/// A kept record's payload, as the owner of the bytes a read lends.
struct PayloadOf(Kept);

impl AsRef<[u8]> for PayloadOf {
    fn as_ref(&self) -> &[u8] {
        self.0.payload()
    }
}

/// A kept record's topic, client id and payload, as the owner of the
/// bytes [`Kept::topic_and_payload_shared`] lends.
struct BytesOf(Kept);

impl AsRef<[u8]> for BytesOf {
    fn as_ref(&self) -> &[u8] {
        &self.0.bytes
    }
}

#[cfg(test)]
mod tests {
    use saguin_format::model::UserProperty;

    use super::*;

    /// Every field of a record comes back as it went in, and counts the
    /// same against the bounds, whatever is set.
    #[test]
    fn a_kept_value_reads_back_as_its_record() {
        let plain = Record {
            offset: 7,
            message_id: [3; 16],
            timestamp: 1_700_000_000_000_000_000,
            retain: true,
            client_id: "dev-7".into(),
            qos: 1,
            ..Record::new("site/1/device/7", vec![1u8; 64])
        };
        let mut every = Record {
            user_properties: vec![UserProperty {
                name: "unit".into(),
                value: "C".into(),
            }],
            bridge: Some("uplink".into()),
            shared_copy: true,
            owed_to: Some("session-1".into()),
            ..plain.clone()
        };
        every.props.content_type = Some("text/plain".into());
        every.props.response_topic = Some("reply/7".into());
        every.props.correlation_data = Some(Bytes::from_static(b"c-1"));
        every.props.payload_format_indicator = Some(1);
        every.props.message_expiry_interval = Some(60);
        let marker = Record {
            offset: 9,
            ..Record::new("site/1/device/8", Bytes::new())
        };
        let empty = Record::new("", Bytes::new());
        // Longer than an MQTT string: another writer's record.
        let long = Record {
            client_id: "c".repeat(70_000),
            ..Record::new("t/".repeat(35_000), "v")
        };
        let mut expiring = Record::new("t/e", "v");
        expiring.props.message_expiry_interval = Some(30);
        let mut correlated = Record::new("t/c", "v");
        correlated.props.correlation_data = Some(Bytes::from_static(b"c-2"));
        // Each of what goes out of line, alone.
        let alone = [
            Record {
                shared_copy: true,
                ..Record::new("t/s", "v")
            },
            Record {
                owed_to: Some("session-2".into()),
                ..Record::new("t/o", "v")
            },
            expiring,
            correlated,
            Record {
                client_id: "c".repeat(70_000),
                ..Record::new("t/long-client", "v")
            },
        ];
        for record in [plain, every, marker, empty, long].into_iter().chain(alone) {
            let kept = Kept::new(&record);
            assert_eq!(kept.record(), record);
            assert_eq!(kept.record_sharing(), record);
            assert_eq!(Kept::count(&kept), 1, "the shared payload let go");
            // The bytes follow the head, and the record's own layout is the
            // one it is freed with.
            let head = kept.0.as_ptr().addr();
            assert_eq!(kept.bytes.as_ptr().addr() - head, size_of::<Head>());
            assert_eq!(
                Layout::for_value::<KeptRecord>(&kept),
                layout_for(kept.bytes.len() as u32)
            );
            assert_eq!(kept.topic(), record.topic);
            let last = record
                .topic
                .rsplit_once('/')
                .map_or(&*record.topic, |(_, l)| l);
            assert_eq!(kept.last_level(), last);
            assert_eq!(kept.accounted_size(), record.accounted_size());
            assert_eq!(kept.is_marker(), record.payload.is_empty());
            let rare = !record.user_properties.is_empty()
                || record.bridge.is_some()
                || record.shared_copy
                || record.owed_to.is_some()
                || record.props.is_allocated()
                || record.topic.len() > 65_535
                || record.client_id.len() > 65_535;
            assert_eq!(kept.rare.is_some(), rare, "{record:?}");
        }
    }

    /// A payload that would take the bytes past their length field is
    /// kept out of line, and reads back, counts and is shared as one kept
    /// in line.
    #[test]
    fn a_payload_too_long_for_the_length_is_kept_out_of_line() {
        let record = Record {
            client_id: "dev-1".into(),
            ..Record::new("a/b", vec![7u8; 100])
        };
        let kept = Kept::new_within(&record, 50);
        assert!(kept.rare.is_some());
        assert_eq!(
            kept.bytes.len(),
            "a/bdev-1".len(),
            "topic and client id only"
        );
        assert_eq!(kept.payload(), &record.payload[..]);
        assert_eq!(kept.record(), record);
        assert_eq!(kept.record_sharing(), record);
        assert_eq!(kept.accounted_size(), record.accounted_size());
        assert!(!kept.is_marker());
        let fits = Kept::new_within(&record, 108);
        assert!(fits.rare.is_none(), "exactly at the limit: in line");
        assert_eq!(fits.record(), record);
    }

    /// A routed message's topic and payload lent from the record are its
    /// own bytes, in the record's allocation, held by one count between
    /// them; a record keeping either out of line lends neither.
    #[test]
    fn topic_and_payload_are_lent_together_from_the_record() {
        let record = Record {
            client_id: "dev-1".into(),
            ..Record::new("site/1/device/7", vec![7u8; 64])
        };
        let kept = Kept::new(&record);
        let (topic, payload) = kept.topic_and_payload_shared().expect("kept in line");
        assert_eq!(&topic[..], b"site/1/device/7");
        assert_eq!(payload, record.payload);
        assert_eq!(Kept::count(&kept), 2, "one count for both");
        let within = kept.bytes.as_ptr_range();
        assert!(within.contains(&topic.as_ptr()) && within.contains(&payload.as_ptr()));
        drop(topic);
        assert_eq!(Kept::count(&kept), 2, "the payload still holds it");
        drop(payload);
        assert_eq!(Kept::count(&kept), 1);

        let empty = Kept::new(&Record::new("t/e", Bytes::new()));
        let (topic, payload) = empty.topic_and_payload_shared().expect("kept in line");
        assert_eq!((&topic[..], payload.is_empty()), (&b"t/e"[..], true));

        let out_of_line = [
            Kept::new_within(&record, 50),
            Kept::new(&Record::new("t/".repeat(35_000), "v")),
        ];
        for kept in out_of_line {
            assert!(kept.topic_and_payload_shared().is_none());
            assert_eq!(Kept::count(&kept), 1);
        }
    }

    /// A handle counts its clones, across threads, and a pointer taken out
    /// and back in holds its count the while.
    #[test]
    fn a_handle_counts_its_clones() {
        let kept = Kept::new(&Record::new("a/b", "v"));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        let clones: Vec<Kept> = (0..3).map(|_| kept.clone()).collect();
                        assert!(clones.iter().all(|c| Kept::ptr_eq(c, &kept)));
                    }
                });
            }
        });
        assert_eq!(Kept::count(&kept), 1);
        let raw = kept.clone().into_raw();
        assert_eq!(raw.addr().get() % 8, 0, "the lowest bits are free");
        assert_eq!(Kept::count(&kept), 2);
        // SAFETY: `into_raw`'s pointer, whose count is held until taken back.
        assert_eq!(unsafe { Kept::record_at(raw) }.topic(), "a/b");
        // SAFETY: as above, taken back once.
        drop(unsafe { Kept::from_raw(raw) });
        assert_eq!(Kept::count(&kept), 1);
    }

    /// The offset is written in place through the only handle, and a
    /// handle with others gets a copy of its own: the others keep theirs.
    #[test]
    fn an_offset_set_on_a_shared_record_leaves_the_others_as_they_were() {
        let record = Record {
            user_properties: vec![UserProperty {
                name: "unit".into(),
                value: "C".into(),
            }],
            ..Record::new("a/b", "v")
        };
        let mut only = Kept::new(&record);
        let before = only.0;
        only.set_offset(5);
        assert_eq!(only.offset, 5);
        assert_eq!(only.0, before, "in place");
        let other = only.clone();
        only.set_offset(6);
        assert!(!Kept::ptr_eq(&only, &other));
        assert_eq!((only.offset, other.offset), (6, 5));
        assert_eq!(Kept::count(&other), 1);
        assert_eq!(
            only.record(),
            Record {
                offset: 6,
                ..record
            }
        );
    }
}
