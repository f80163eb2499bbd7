//! The semantic pass (`FORMAT.md` §2.9): what a checksum cannot cover.
//! A checksum proves the bytes are the ones written, not that the writer
//! was right; an out-of-order record would hide every record behind it
//! from a reader that stops at the first offset past what it asked for.
//! FORMAT.md §2.9 lists every rule here.

use std::borrow::Borrow;
use std::collections::HashSet;

use super::error::DecodeError;
use super::topic_set::TopicSet;
use super::types::*;
use super::{FileKind, SnapshotFile};
use crate::channel_name;
use crate::model::{ChannelKind, PublishProps, Record};

/// The largest Subscription Identifier MQTT 5 allows (a 4-byte varint).
pub const MAX_SUBSCRIPTION_ID: u32 = 268_435_455;

/// Checks one decoded file against every rule its kind has. [`super::decode`]
/// runs it; a writer may run it before writing.
pub fn validate(file: &SnapshotFile) -> Result<(), DecodeError> {
    match file {
        SnapshotFile::Channel(c) => validate_channel(c, ChannelChecks::of(c).finish()),
        SnapshotFile::Manifest(m) => validate_manifest(m),
        SnapshotFile::Generation(g) => validate_generation(g),
        SnapshotFile::Retained(r) => {
            let mut records = ListCheck::new("records", ListRules::Retained);
            r.records
                .iter()
                .for_each(|rec| records.record(rec, Some(&rec.topic)));
            validate_retained(records.finish())
        }
        SnapshotFile::Sessions(s) => validate_sessions(s),
        SnapshotFile::Broadcast(b) => validate_broadcast_file(b),
    }
}

/// [`validate`] of a broadcast log's file, which a writer that streams
/// its messages runs on the rest of it (its messages empty).
pub fn validate_broadcast_file(b: &BroadcastFile) -> Result<(), DecodeError> {
    let mut messages = ListCheck::new("messages", ListRules::broadcast(b.next, b.floor));
    b.messages
        .iter()
        .for_each(|rec| messages.record(rec, Some(&rec.topic)));
    validate_broadcast(b, messages.finish())
}

/// The verdicts of a decoded file's streamed lists.
#[derive(Debug)]
pub(crate) enum Lists {
    Channel(ChannelVerdicts),
    /// The retained store's records or the broadcast log's messages.
    One(ListVerdict),
    /// A manifest or sessions file: no streamed list.
    None,
}

/// [`validate`] for a file the decoder streamed: its lists were checked
/// while decoding (and may have been dropped by the sink).
pub(crate) fn validate_decoded(file: &SnapshotFile, lists: Lists) -> Result<(), DecodeError> {
    match (file, lists) {
        (SnapshotFile::Channel(c), Lists::Channel(lists)) => validate_channel(c, lists),
        (SnapshotFile::Retained(_), Lists::One(records)) => validate_retained(records),
        (SnapshotFile::Broadcast(b), Lists::One(messages)) => validate_broadcast(b, messages),
        (SnapshotFile::Manifest(m), _) => validate_manifest(m),
        (SnapshotFile::Generation(g), _) => validate_generation(g),
        (SnapshotFile::Sessions(s), _) => validate_sessions(s),
        // The decoder pairs each kind with its lists; should the two ever
        // disagree, check the file as it is rather than accept it.
        (file, _) => validate(file),
    }
}

// ---- streamed lists ------------------------------------------------------
//
// The record lists (a channel's records and queue items, a dead-letter
// channel's records, the retained store, the broadcast log's messages) are
// checked one element at a time as the decoder produces them, so a caller
// that keeps no record (`snapshot verify`) runs exactly the rules the loader
// runs. A list's verdict is only given once the whole file has parsed and
// the file-level rules before it in `validate_*` have passed: the finding
// reported is the same whichever way the file was read.

/// What a streamed list must satisfy, fixed by fields decoded before it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ListRules {
    /// Records of a log (channel, dead-letter channel, broadcast log):
    /// offsets strictly ascending in `[floor, next)` and each record's own
    /// fields, in one pass; then, on a latest channel, one value per topic.
    /// A latest channel's values may lie below its floor (its floor bounds
    /// its deletion markers only: a value is never removed, and one set
    /// long ago stays current below a floor its retention raised); they
    /// are at or above the first offset, 1.
    Log {
        next: u64,
        floor: u64,
        broadcast: bool,
        /// A latest channel: one value per topic, values below the floor.
        one_per_topic: bool,
        /// An append channel (a dead-letter channel too): every offset of
        /// `[floor, next)` holds a record. It loses records from the front
        /// only, so a hole is damage (FORMAT.md §7, invariant 1). A latest
        /// channel's replaced values, a queue's resolved records and the
        /// broadcast log's released messages leave offsets with no record.
        contiguous: bool,
    },
    /// The retained store: each record's fields and its topic unique, in one pass.
    Retained,
    /// Queue items: offsets as a log's, in a first pass; then each item's
    /// record and delivery times.
    Queue { next: u64, floor: u64 },
    /// A list whose mere presence is refused by a file-level rule (records
    /// on a queue, items on an append channel); only counted.
    CountOnly,
}

impl ListRules {
    pub(crate) fn broadcast(next: u64, floor: u64) -> ListRules {
        ListRules::Log {
            next,
            floor,
            broadcast: true,
            one_per_topic: false,
            contiguous: false,
        }
    }

    /// The rules of a channel's `records` list.
    pub(crate) fn channel_records(kind: ChannelKind, next: u64, floor: u64) -> ListRules {
        match kind {
            ChannelKind::Append | ChannelKind::Latest => ListRules::Log {
                next,
                floor,
                broadcast: false,
                one_per_topic: kind == ChannelKind::Latest,
                contiguous: kind == ChannelKind::Append,
            },
            ChannelKind::Queue => ListRules::CountOnly,
        }
    }

    /// The rules of a channel's `items` list.
    pub(crate) fn channel_items(kind: ChannelKind, next: u64, floor: u64) -> ListRules {
        match kind {
            ChannelKind::Queue => ListRules::Queue { next, floor },
            ChannelKind::Append | ChannelKind::Latest => ListRules::CountOnly,
        }
    }

    /// The rules of a dead-letter channel's records (the file-level rule
    /// refusing a dead-letter channel outside a queue is checked first).
    pub(crate) fn dead_letter(next: u64, floor: u64) -> ListRules {
        ListRules::Log {
            next,
            floor,
            broadcast: false,
            one_per_topic: false,
            contiguous: true,
        }
    }
}

/// The most topics a list's set makes room for before they are read: a
/// million, about 46 MB of address space (the table's slots, and where
/// each topic is) and 2 MB touched.
const TOPICS_RESERVED_AT_MOST: usize = 1 << 20;

/// The running state of one streamed list's checks: a few words and, for a
/// latest channel or the retained store, the set of topics seen.
#[derive(Debug)]
pub(crate) struct ListCheck<'a> {
    field: &'static str,
    rules: ListRules,
    count: usize,
    previous: Option<u64>,
    /// The first finding of the list's first pass.
    first: Option<DecodeError>,
    /// The first finding of its second pass, reported only when the first
    /// pass found nothing (the order the rules are listed in FORMAT.md §2.9).
    second: Option<DecodeError>,
    /// Each topic where it lies in a whole input, or copied when the
    /// file is read as a stream (`topic_set`).
    topics: TopicSet<'a>,
}

/// A streamed list's element count and verdict.
#[derive(Debug)]
pub(crate) struct ListVerdict {
    pub(crate) count: usize,
    pub(crate) result: Result<(), DecodeError>,
}

impl<'a> ListCheck<'a> {
    pub(crate) fn new(field: &'static str, rules: ListRules) -> ListCheck<'a> {
        ListCheck {
            field,
            rules,
            count: 0,
            previous: None,
            first: None,
            second: None,
            topics: TopicSet::default(),
        }
    }

    /// Makes room for the topics of a list of `count` records before they
    /// are read, so the set is not rebuilt as it doubles. `count` has been
    /// checked against the bytes left, but a damaged file's count is
    /// believed only up to [`TOPICS_RESERVED_AT_MOST`]: past it the set
    /// grows with the records actually read.
    pub(crate) fn expect(&mut self, count: usize) {
        let keeps_topics = match self.rules {
            ListRules::Log { one_per_topic, .. } => one_per_topic,
            ListRules::Retained => true,
            ListRules::Queue { .. } | ListRules::CountOnly => false,
        };
        if keeps_topics {
            self.topics.reserve(count.min(TOPICS_RESERVED_AT_MOST));
        }
    }

    fn element(&self, i: usize) -> Element {
        Element {
            list: self.field,
            index: i,
        }
    }

    /// One record of a `Log`, `Retained` or `CountOnly` list; `in_place`
    /// is its topic where it lies in a whole input.
    #[inline]
    pub(crate) fn record(&mut self, rec: &Record, in_place: Option<&'a str>) {
        let i = self.count;
        self.count += 1;
        if self.first.is_some() {
            return; // the list's verdict is decided
        }
        match self.rules {
            ListRules::Log {
                next,
                floor,
                broadcast,
                one_per_topic,
                contiguous,
            } => {
                // A latest channel's value is held whatever the floor; its
                // deletion markers are held at or above it.
                let lowest = if one_per_topic && !rec.payload.is_empty() {
                    1
                } else {
                    floor
                };
                let checked = check_offset(
                    format_args!("{}[{i}].offset", self.field),
                    rec.offset,
                    self.previous,
                    next,
                    lowest,
                )
                .and_then(|()| {
                    check_record(rec, broadcast).map_err(|e| e.within(&self.element(i)))
                });
                let previous = self.previous.replace(rec.offset);
                if let Err(e) = checked {
                    self.first = Some(e);
                    return;
                }
                // Second: a record that went backwards further on is the
                // finding, not the jump before it that it explains.
                if contiguous && self.second.is_none() {
                    self.second = check_no_hole(
                        format_args!("{}[{i}].offset", self.field),
                        rec.offset,
                        previous,
                        next,
                        floor,
                    )
                    .err();
                }
                if one_per_topic
                    && self.second.is_none()
                    && !self.topics.insert(&rec.topic, in_place)
                {
                    self.second = Some(DecodeError::invalid(
                        format!("{}.topic", self.element(i)),
                        format!(
                            "{:?} has a second value on a latest channel, which keeps one per topic",
                            rec.topic
                        ),
                    ));
                }
            }
            ListRules::Retained => {
                if let Err(e) = check_record(rec, false) {
                    self.first = Some(e.within(&self.element(i)));
                } else if !self.topics.insert(&rec.topic, in_place) {
                    self.first = Some(DecodeError::invalid(
                        format!("{}.topic", self.element(i)),
                        format!("{:?} has a second retained message", rec.topic),
                    ));
                }
            }
            ListRules::Queue { .. } | ListRules::CountOnly => {}
        }
    }

    /// One queue item of a `Queue` or `CountOnly` list.
    #[inline]
    pub(crate) fn item(&mut self, item: &QueueItem) {
        let i = self.count;
        self.count += 1;
        let ListRules::Queue { next, floor } = self.rules else {
            return;
        };
        if self.first.is_some() {
            return;
        }
        let offset = item.record.offset;
        // An item's offset is its record's: the path names the field where
        // it is stored, as every other field of the item's record is named.
        let path = format_args!("{}[{i}].record.offset", self.field);
        if let Err(e) = check_offset(path, offset, self.previous, next, floor) {
            self.first = Some(e);
            return;
        }
        self.previous = Some(offset);
        if self.second.is_some() {
            return;
        }
        if let Err(e) = check_record(&item.record, false) {
            self.second = Some(e.within(&format_args!("{}.record", self.element(i))));
        } else if item.first_delivered == 0 && item.last_delivered != 0 {
            self.second = Some(DecodeError::invalid(
                format!("{}.first_delivered", self.element(i)),
                "is unset while last_delivered is set",
            ));
        }
    }

    pub(crate) fn finish(mut self) -> ListVerdict {
        if let ListRules::Log {
            next,
            floor,
            contiguous: true,
            ..
        } = self.rules
        {
            // The records after the last one, up to next, are missing too.
            let expected = self.previous.map_or(floor, |p| p.saturating_add(1));
            if self.first.is_none() && self.second.is_none() && expected < next {
                self.second = Some(DecodeError::invalid(
                    self.field,
                    hole(expected, next - 1, floor, next),
                ));
            }
        }
        ListVerdict {
            count: self.count,
            result: match self.first.or(self.second) {
                Some(e) => Err(e),
                None => Ok(()),
            },
        }
    }
}

/// An element's field path, `records[17]`, formatted only when an error
/// names it.
#[derive(Clone, Copy)]
struct Element {
    list: &'static str,
    index: usize,
}

impl std::fmt::Display for Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.list, self.index)
    }
}

/// The streamed lists of one channel file.
#[derive(Debug)]
pub(crate) struct ChannelChecks<'a> {
    pub(crate) records: ListCheck<'a>,
    pub(crate) items: ListCheck<'a>,
    pub(crate) dead_letter_records: Option<ListCheck<'a>>,
}

/// Their verdicts.
#[derive(Debug)]
pub(crate) struct ChannelVerdicts {
    records: ListVerdict,
    items: ListVerdict,
    dead_letter_records: Option<ListVerdict>,
}

impl<'a> ChannelChecks<'a> {
    /// Runs the list checks over an already decoded channel.
    fn of(c: &'a ChannelFile) -> ChannelChecks<'a> {
        let mut records = ListCheck::new(
            "records",
            ListRules::channel_records(c.kind, c.next, c.floor),
        );
        c.records
            .iter()
            .for_each(|rec| records.record(rec, Some(&rec.topic)));
        let mut items = ListCheck::new("items", ListRules::channel_items(c.kind, c.next, c.floor));
        c.items.iter().for_each(|item| items.item(item));
        let dead_letter_records = c.dead_letter.as_ref().map(|d| {
            let mut check = ListCheck::new(
                "dead_letter.records",
                ListRules::dead_letter(d.next, d.floor),
            );
            d.records
                .iter()
                .for_each(|rec| check.record(rec, Some(&rec.topic)));
            check
        });
        ChannelChecks {
            records,
            items,
            dead_letter_records,
        }
    }

    pub(crate) fn finish(self) -> ChannelVerdicts {
        ChannelVerdicts {
            records: self.records.finish(),
            items: self.items.finish(),
            dead_letter_records: self.dead_letter_records.map(ListCheck::finish),
        }
    }
}

fn err<T>(field: impl Into<String>, reason: impl Into<String>) -> Result<T, DecodeError> {
    Err(DecodeError::invalid(field, reason))
}

fn check_counters(field_prefix: &str, next: u64, floor: u64) -> Result<(), DecodeError> {
    if floor == 0 {
        return err(
            format!("{field_prefix}floor"),
            "is 0; offsets start at 1 and 0 means \"no offset\"",
        );
    }
    if floor > next {
        return err(
            format!("{field_prefix}floor"),
            format!("{floor} is above next {next}"),
        );
    }
    Ok(())
}

/// The fields every stored record must get right wherever it is kept.
fn check_record(rec: &Record, broadcast: bool) -> Result<(), DecodeError> {
    check_topic_name("topic", &rec.topic)?;
    check_identifier("client_id", &rec.client_id)?;
    if rec.qos > 2 {
        return err("qos", format!("{} is not 0, 1 or 2", rec.qos));
    }
    check_props(&rec.props)?;
    if !broadcast {
        if rec.shared_copy {
            return err("shared_copy", "is set outside the broadcast log");
        }
        if rec.owed_to.is_some() {
            return err("owed_to", "is set outside the broadcast log");
        }
    }
    Ok(())
}

/// The longest identifier: an MQTT UTF-8 string's 65,535 bytes.
pub const MAX_IDENTIFIER_BYTES: usize = 65_535;

/// The one rule for an identifier wherever a file holds one - a session's,
/// a held publish's or a record's client id, a position's reader id, a
/// shared group's name: at most 65,535 bytes and no NUL. An MQTT UTF-8
/// string can hold neither more nor a U+0000 (MQTT-1.5.4-2), so an
/// identifier that does came from damage, not from a client. (Whether it
/// may be empty is each field's own rule.)
pub fn check_identifier(field: &str, id: &str) -> Result<(), DecodeError> {
    check_identifier_at(|| field.to_owned(), id)
}

/// [`check_identifier`], the field named only when the identifier is
/// refused: a file's every position and session name theirs, and making
/// each name took a fifth of checking 100,000 sessions and their cursors.
fn check_identifier_at(field: impl FnOnce() -> String, id: &str) -> Result<(), DecodeError> {
    if id.len() > MAX_IDENTIFIER_BYTES {
        return err(
            field(),
            format!(
                "is {} bytes, longer than the {MAX_IDENTIFIER_BYTES} an MQTT string can hold",
                id.len()
            ),
        );
    }
    if id.contains('\0') {
        return err(
            field(),
            format!("{id:?} holds a NUL character, which an MQTT string never does"),
        );
    }
    Ok(())
}

/// A topic a message was published to: MQTT's rules for a topic name
/// (non-empty, no wildcard characters; UTF-8 and no NUL are the string
/// rules already checked). A record that could never have been published
/// is damage, and the legacy reader refuses it too.
fn check_topic_name(field: &str, topic: &str) -> Result<(), DecodeError> {
    if topic.is_empty() {
        return err(field, "is empty; every message is published to a topic");
    }
    if topic.contains(['+', '#']) {
        return err(
            field,
            format!("{topic:?} holds a wildcard, which a published topic never does"),
        );
    }
    if topic.contains('\0') {
        return err(field, format!("{topic:?} holds a NUL character"));
    }
    Ok(())
}

fn check_props(props: &PublishProps) -> Result<(), DecodeError> {
    if let Some(p) = props.payload_format_indicator {
        if p > 1 {
            return err(
                "payload_format_indicator",
                format!("{p} is not 0 (bytes) or 1 (UTF-8)"),
            );
        }
    }
    Ok(())
}

#[inline]
fn check_offset(
    path: std::fmt::Arguments<'_>,
    offset: u64,
    previous: Option<u64>,
    next: u64,
    floor: u64,
) -> Result<(), DecodeError> {
    if offset < floor {
        return err(
            path.to_string(),
            format!("{offset} is below the floor {floor}"),
        );
    }
    if offset >= next {
        return err(
            path.to_string(),
            format!("{offset} is not below next {next}"),
        );
    }
    if let Some(p) = previous {
        if offset <= p {
            return err(
                path.to_string(),
                format!("{offset} does not ascend from the previous offset {p}"),
            );
        }
    }
    Ok(())
}

/// An append channel's record must be the one after the previous (the
/// first: at the floor). Checked once the offset is known to ascend inside
/// `[floor, next)`; reported only when every offset of the list does.
fn check_no_hole(
    path: std::fmt::Arguments<'_>,
    offset: u64,
    previous: Option<u64>,
    next: u64,
    floor: u64,
) -> Result<(), DecodeError> {
    let expected = previous.map_or(floor, |p| p.saturating_add(1));
    if offset > expected {
        return err(path.to_string(), hole(expected, offset - 1, floor, next));
    }
    Ok(())
}

/// The sentence naming a hole in an append channel (records `from..=to`
/// missing): one rule, in the same words wherever it is found - a
/// snapshot file here, a database's rows in `saguin sqlite verify`.
pub fn hole(from: u64, to: u64, floor: u64, next: u64) -> String {
    format!(
        "records {from}..{to} are missing between the floor {floor} and next {next}; an append channel loses records from the front only, so a hole is damage"
    )
}

/// Where a position's reader belongs, which fixes what it must carry.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PositionsOf {
    /// A channel: `mqtt:` readers carry their session's expiry, `bridge:` ones none.
    Channel,
    /// The broadcast log: session cursors only, not swept, so no expiry.
    BroadcastLog,
}

fn check_positions(
    field: &str,
    positions: &[Position],
    next: u64,
    of: PositionsOf,
) -> Result<(), DecodeError> {
    let mut readers = HashSet::with_capacity(positions.len());
    for (i, p) in positions.iter().enumerate() {
        let at = || format!("{field}[{i}]");
        let (scheme, id) = if let Some(id) = p.reader.strip_prefix(READER_MQTT) {
            (READER_MQTT, id)
        } else if let Some(id) = p.reader.strip_prefix(READER_BRIDGE) {
            (READER_BRIDGE, id)
        } else {
            return err(
                format!("{}.reader", at()),
                format!(
                    "{:?} is neither mqtt:<client id> nor bridge:<name>",
                    p.reader
                ),
            );
        };
        if id.is_empty() {
            return err(
                format!("{}.reader", at()),
                format!("{:?} names no reader after its scheme", p.reader),
            );
        }
        check_identifier_at(|| format!("{}.reader", at()), id)?;
        if !readers.insert(p.reader.as_str()) {
            return err(
                format!("{}.reader", at()),
                format!("{:?} holds a second position", p.reader),
            );
        }
        if p.offset > next {
            return err(
                format!("{}.offset", at()),
                format!("{} is past next {next}", p.offset),
            );
        }
        match (of, scheme, p.session_expiry) {
            (PositionsOf::Channel, READER_MQTT, None) => {
                return err(
                    format!("{}.session_expiry", at()),
                    "is absent on an mqtt: reader, which needs it to be swept",
                )
            }
            (PositionsOf::Channel, READER_BRIDGE, Some(_)) => {
                return err(
                    format!("{}.session_expiry", at()),
                    "is present on a bridge: reader, which has no session",
                )
            }
            (PositionsOf::BroadcastLog, READER_BRIDGE, _) => {
                return err(
                    format!("{}.reader", at()),
                    "a bridge: reader on the broadcast log, which only sessions read",
                )
            }
            (PositionsOf::BroadcastLog, _, Some(_)) => {
                return err(
                    format!("{}.session_expiry", at()),
                    "is present on a broadcast log cursor, which lives as long as its session",
                )
            }
            _ => {}
        }
    }
    Ok(())
}

fn check_held(field: &str, held: &[HeldPublish], broadcast: bool) -> Result<(), DecodeError> {
    let mut exchanges = HashSet::with_capacity(held.len());
    for (i, h) in held.iter().enumerate() {
        let at = || format!("{field}[{i}]");
        if h.client_id.is_empty() {
            return err(format!("{}.client_id", at()), "is empty");
        }
        check_identifier_at(|| format!("{}.client_id", at()), &h.client_id)?;
        if h.packet_id == 0 {
            return err(format!("{}.packet_id", at()), "is 0, which MQTT never uses");
        }
        if !exchanges.insert((h.client_id.as_str(), h.packet_id)) {
            return err(
                format!("{}.packet_id", at()),
                format!("{} is held twice for client {:?}", h.packet_id, h.client_id),
            );
        }
        if h.record.offset != 0 {
            return err(
                format!("{}.record.offset", at()),
                format!(
                    "{} is set; a held publish takes its offset at release",
                    h.record.offset
                ),
            );
        }
        if h.record.qos != 2 {
            return err(
                format!("{}.record.qos", at()),
                format!("{}; only QoS 2 publishes are held", h.record.qos),
            );
        }
        check_record(&h.record, broadcast)
            .map_err(|e| e.within(&format_args!("{}.record", at())))?;
    }
    Ok(())
}

/// A channel's file-level rules, with its streamed lists' verdicts given
/// where their checks stand in the order of FORMAT.md §2.9.
fn validate_channel(c: &ChannelFile, lists: ChannelVerdicts) -> Result<(), DecodeError> {
    if c.name.is_empty() {
        return err("name", "is empty");
    }
    check_counters("", c.next, c.floor)?;
    match c.kind {
        ChannelKind::Append | ChannelKind::Latest => {
            if lists.items.count != 0 {
                return err(
                    "items",
                    format!(
                        "{} queue items on a channel of kind {}, which keeps records",
                        lists.items.count, c.kind
                    ),
                );
            }
            if c.dead_letter.is_some() {
                return err(
                    "dead_letter",
                    format!(
                        "is present on a channel of kind {}; only a queue has one",
                        c.kind
                    ),
                );
            }
            lists.records.result?;
        }
        ChannelKind::Queue => {
            if lists.records.count != 0 {
                return err(
                    "records",
                    format!(
                        "{} records on a queue, which keeps items",
                        lists.records.count
                    ),
                );
            }
            lists.items.result?;
            if let Some(d) = &c.dead_letter {
                let expected = DeadLetter::name_for(&c.name);
                if d.name != expected {
                    return err(
                        "dead_letter.name",
                        format!("{:?} is not {expected:?}", d.name),
                    );
                }
                check_counters("dead_letter.", d.next, d.floor)?;
                if let Some(v) = lists.dead_letter_records {
                    v.result?;
                }
                check_positions(
                    "dead_letter.positions",
                    &d.positions,
                    d.next,
                    PositionsOf::Channel,
                )?;
            }
        }
    }
    check_positions("positions", &c.positions, c.next, PositionsOf::Channel)?;
    check_held("held", &c.held, false)
}

fn validate_manifest(m: &Manifest) -> Result<(), DecodeError> {
    let mut names = HashSet::with_capacity(m.channels.len());
    for (i, e) in m.channels.iter().enumerate() {
        if e.channel.is_empty() {
            return err(format!("channels[{i}].channel"), "is empty");
        }
        let expected = channel_name::encode_file_name(&e.channel);
        if e.file_name != expected {
            return err(
                format!("channels[{i}].file_name"),
                format!(
                    "{:?} is not the file name of channel {:?}, which is {expected:?}",
                    e.file_name, e.channel
                ),
            );
        }
        if !names.insert(e.channel.as_str()) {
            return err(
                format!("channels[{i}].channel"),
                format!("{:?} is listed twice", e.channel),
            );
        }
    }
    Ok(())
}

fn validate_generation(g: &Generation) -> Result<(), DecodeError> {
    if g.generation == 0 {
        return err("generation", "is 0; generations are numbered from 1");
    }
    let mut channels = HashSet::with_capacity(g.files.len());
    let mut stores = HashSet::new();
    let mut names = HashSet::with_capacity(g.files.len());
    for (i, f) in g.files.iter().enumerate() {
        let field = |name: &str| format!("files[{i}].{name}");
        let base = match f.kind {
            FileKind::Channel => {
                if f.channel.is_empty() {
                    return err(field("channel"), "is empty for a channel file");
                }
                if !channels.insert(f.channel.as_str()) {
                    return err(field("channel"), format!("{:?} is listed twice", f.channel));
                }
                channel_name::encode_file_name(&f.channel)
            }
            kind => {
                if !f.channel.is_empty() {
                    return err(
                        field("channel"),
                        format!("names {:?}; only a channel file names a channel", f.channel),
                    );
                }
                if !stores.insert(kind) {
                    return err(field("kind"), format!("a second {kind} file"));
                }
                match kind {
                    FileKind::Retained => channel_name::RETAINED_FILE,
                    FileKind::Sessions => channel_name::SESSIONS_FILE,
                    _ => channel_name::BROADCAST_FILE,
                }
                .to_owned()
            }
        };
        if f.generation > g.generation {
            return err(
                field("generation"),
                format!(
                    "{} is past the manifest's own generation {}",
                    f.generation, g.generation
                ),
            );
        }
        let expected = if f.generation == 0 {
            base
        } else {
            channel_name::generation_file_name(&base, f.generation)
        };
        if f.file_name != expected {
            return err(
                field("file_name"),
                format!(
                    "{:?} is not the name generation {} gives this file, which is {expected:?}",
                    f.file_name, f.generation
                ),
            );
        }
        if !names.insert(f.file_name.as_str()) {
            return err(
                field("file_name"),
                format!("{:?} is listed twice", f.file_name),
            );
        }
        if f.length < super::MIN_FILE_LEN as u64 {
            return err(
                field("length"),
                format!(
                    "{} bytes is shorter than any format 21 file ({})",
                    f.length,
                    super::MIN_FILE_LEN
                ),
            );
        }
    }
    if stores.contains(&FileKind::Sessions) != stores.contains(&FileKind::Broadcast) {
        return err(
            "files",
            "lists the sessions without the broadcast log or the log without the sessions; the two are one pair",
        );
    }
    Ok(())
}

fn validate_retained(records: ListVerdict) -> Result<(), DecodeError> {
    records.result
}

fn validate_sessions(f: &SessionsFile) -> Result<(), DecodeError> {
    validate_sessions_of(&f.sessions, &f.shared_groups)
}

/// What [`validate`] checks of a sessions file, for its parts as a writer
/// holds them (each session behind a handle of its own).
pub fn validate_sessions_of<S: Borrow<Session>>(
    sessions: &[S],
    shared_groups: &[SharedGroup],
) -> Result<(), DecodeError> {
    let mut groups = HashSet::with_capacity(shared_groups.len());
    for (i, g) in shared_groups.iter().enumerate() {
        if g.key.group.is_empty() || g.key.filter.is_empty() {
            return err(
                format!("shared_groups[{i}]"),
                "has an empty group name or filter",
            );
        }
        check_identifier_at(|| format!("shared_groups[{i}].key.group"), &g.key.group)?;
        if !groups.insert(&g.key) {
            return err(
                format!("shared_groups[{i}]"),
                format!(
                    "group {:?} over {:?} is listed twice",
                    g.key.group, g.key.filter
                ),
            );
        }
        let mut returned = HashSet::with_capacity(g.returned.len());
        for (j, o) in g.returned.iter().enumerate() {
            if !returned.insert(*o) {
                return err(
                    format!("shared_groups[{i}].returned[{j}]"),
                    format!("log offset {o} is returned twice"),
                );
            }
        }
    }
    let mut clients = HashSet::with_capacity(sessions.len());
    for (i, s) in sessions.iter().map(Borrow::borrow).enumerate() {
        if s.client_id.is_empty() {
            return err(format!("sessions[{i}].client_id"), "is empty");
        }
        check_identifier_at(|| format!("sessions[{i}].client_id"), &s.client_id)?;
        if !clients.insert(s.client_id.as_str()) {
            return err(
                format!("sessions[{i}].client_id"),
                format!("{:?} has a second session", s.client_id),
            );
        }
        validate_session(s, &groups).map_err(|e| e.within(&format_args!("sessions[{i}]")))?;
    }
    Ok(())
}

fn validate_session(s: &Session, groups: &HashSet<&SharedGroupKey>) -> Result<(), DecodeError> {
    if s.window == 0 {
        return err("window", "is 0; a Receive Maximum is at least 1");
    }
    if s.inflight.len() > usize::from(s.window) {
        return err(
            "inflight",
            format!(
                "{} messages on the wire exceed the window of {}",
                s.inflight.len(),
                s.window
            ),
        );
    }
    let mut filters = HashSet::with_capacity(s.subscriptions.len());
    for (i, sub) in s.subscriptions.iter().enumerate() {
        let at = || format!("subscriptions[{i}]");
        if sub.filter.is_empty() {
            return err(format!("{}.filter", at()), "is empty");
        }
        if !filters.insert(sub.filter.as_str()) {
            return err(
                format!("{}.filter", at()),
                format!("{:?} is subscribed twice", sub.filter),
            );
        }
        if sub.qos > 2 {
            return err(
                format!("{}.qos", at()),
                format!("{} is not 0, 1 or 2", sub.qos),
            );
        }
        if sub.retain_handling > 2 {
            return err(
                format!("{}.retain_handling", at()),
                format!("{} is not 0, 1 or 2", sub.retain_handling),
            );
        }
        if let Some(id) = sub.subscription_id {
            if id == 0 || id > MAX_SUBSCRIPTION_ID {
                return err(
                    format!("{}.subscription_id", at()),
                    format!("{id} is outside 1..={MAX_SUBSCRIPTION_ID}"),
                );
            }
        }
    }
    if let Some(w) = &s.will {
        check_topic_name("will.topic", &w.topic)?;
        if w.qos > 2 {
            return err("will.qos", format!("{} is not 0, 1 or 2", w.qos));
        }
        check_props(&w.props).map_err(|e| e.within(&"will"))?;
    }
    let mut packet_ids = HashSet::with_capacity(s.inflight.len());
    let mut offsets = HashSet::with_capacity(s.inflight.len());
    for (i, e) in s.inflight.iter().enumerate() {
        let at = || format!("inflight[{i}]");
        if e.packet_id == 0 {
            return err(format!("{}.packet_id", at()), "is 0, which MQTT never uses");
        }
        if !packet_ids.insert(e.packet_id) {
            return err(
                format!("{}.packet_id", at()),
                format!("{} is on the wire twice", e.packet_id),
            );
        }
        if !offsets.insert(e.log_offset) {
            return err(
                format!("{}.log_offset", at()),
                format!("{} is on the wire twice", e.log_offset),
            );
        }
        if e.qos != 1 && e.qos != 2 {
            return err(
                format!("{}.qos", at()),
                format!("{}; only QoS 1 and 2 messages are in flight", e.qos),
            );
        }
        if e.phase == InflightPhase::AwaitingComp && e.qos != 2 {
            return err(
                format!("{}.phase", at()),
                format!(
                    "{} on a QoS {} message; only QoS 2 has a PUBCOMP",
                    e.phase.as_str(),
                    e.qos
                ),
            );
        }
        if let Some(k) = &e.shared_group {
            if !groups.contains(k) {
                return err(
                    format!("{}.shared_group", at()),
                    format!(
                        "group {:?} over {:?} is not among the file's shared groups",
                        k.group, k.filter
                    ),
                );
            }
        }
    }
    Ok(())
}

fn validate_broadcast(f: &BroadcastFile, messages: ListVerdict) -> Result<(), DecodeError> {
    check_counters("", f.next, f.floor)?;
    messages.result?;
    check_positions("cursors", &f.cursors, f.next, PositionsOf::BroadcastLog)?;
    // A held publish is held as in a channel: it is not yet a log message,
    // so it carries neither a shared copy's mark nor a session it is owed to.
    check_held("held", &f.held, false)
}

/// The rules that need `saguin.sessions` and `saguin.broadcast` together
/// (one at or past the log's next offset is refused): every
/// in-flight entry, subscription mark, group cursor and returned delivery
/// points into the log, none at or past its next offset (a cursor or
/// subscription mark may equal it: it names the next message to come).
pub fn validate_pair(sessions: &SessionsFile, log: &BroadcastFile) -> Result<(), DecodeError> {
    validate_pair_of(&sessions.sessions, &sessions.shared_groups, log.next)
}

/// [`validate_pair`] for a sessions file's parts as a writer holds them
/// (each session behind a handle of its own), against a log whose next
/// offset is `next`.
pub fn validate_pair_of<S: Borrow<Session>>(
    sessions: &[S],
    shared_groups: &[SharedGroup],
    next: u64,
) -> Result<(), DecodeError> {
    for (i, s) in sessions.iter().map(Borrow::borrow).enumerate() {
        for (j, e) in s.inflight.iter().enumerate() {
            if e.log_offset >= next {
                return err(
                    format!("sessions[{i}].inflight[{j}].log_offset"),
                    format!(
                        "{} is at or past the broadcast log's next offset {next}",
                        e.log_offset
                    ),
                );
            }
        }
        for (j, sub) in s.subscriptions.iter().enumerate() {
            if sub.log_offset > next {
                return err(
                    format!("sessions[{i}].subscriptions[{j}].log_offset"),
                    format!(
                        "{} is past the broadcast log's next offset {next}",
                        sub.log_offset
                    ),
                );
            }
        }
    }
    for (i, g) in shared_groups.iter().enumerate() {
        if g.cursor > next {
            return err(
                format!("shared_groups[{i}].cursor"),
                format!(
                    "{} is past the broadcast log's next offset {next}",
                    g.cursor
                ),
            );
        }
        for (j, o) in g.returned.iter().enumerate() {
            if *o >= next {
                return err(
                    format!("shared_groups[{i}].returned[{j}]"),
                    format!("{o} is at or past the broadcast log's next offset {next}"),
                );
            }
        }
    }
    Ok(())
}
