//! The body of each file kind, both directions. Layouts are FORMAT.md §2;
//! each `put_*` here has a `get_*` beside it reading exactly what it wrote.

use bytes::Bytes;

use super::error::DecodeError;
use super::sink::{RecordList, RecordSink};
use super::types::*;
use super::validate::{ChannelChecks, ListCheck, ListRules, ListVerdict};
use super::wire::{Input, Reader, Text, Writer};
use crate::model::{ChannelKind, PublishProps, Record, UserProperty};

// The smallest encoding of each element, which every count is checked
// against before anything is allocated (FORMAT.md §2 lists the same).
pub(crate) const MIN_STR: usize = 4;
pub(crate) const MIN_OPT: usize = 1;
pub(crate) const MIN_USER_PROPERTY: usize = 2 * MIN_STR;
pub(crate) const MIN_PROPS: usize = 5 * MIN_OPT;
/// offset, message id, timestamp, qos, retain, shared_copy, topic,
/// client id, bridge, owed_to, user property count, props, payload.
pub(crate) const MIN_RECORD: usize =
    8 + 16 + 8 + 1 + 1 + 1 + MIN_STR + MIN_STR + MIN_OPT + MIN_OPT + 4 + MIN_PROPS + 4;
pub(crate) const MIN_ITEM: usize = MIN_RECORD + 4 + 8 + 8;
pub(crate) const MIN_POSITION: usize = MIN_STR + 8 + 8 + MIN_OPT;
pub(crate) const MIN_HELD: usize = MIN_STR + 2 + 8 + MIN_RECORD;
pub(crate) const MIN_MANIFEST_ENTRY: usize = MIN_STR + MIN_STR + 1;
/// kind, channel, file name, generation, written at, length, checksum, behind.
pub(crate) const MIN_GENERATION_FILE: usize = 1 + MIN_STR + MIN_STR + 8 + 8 + 8 + 4 + 1;
pub(crate) const MIN_SUBSCRIPTION: usize = MIN_STR + 1 + 1 + 1 + 1 + MIN_OPT + 8;
pub(crate) const MIN_INFLIGHT: usize = 8 + 2 + 1 + 1 + MIN_OPT;
pub(crate) const MIN_SESSION: usize = MIN_STR + MIN_OPT + 4 + 8 + 2 + 4 + MIN_OPT + 4;
pub(crate) const MIN_GROUP: usize = MIN_STR + MIN_STR + 8 + 4;

/// Channel kind bytes.
pub(crate) const KIND_APPEND: u8 = 0;
pub(crate) const KIND_LATEST: u8 = 1;
pub(crate) const KIND_QUEUE: u8 = 2;

/// In-flight phase bytes.
pub(crate) const PHASE_AWAITING_ACK: u8 = 0;
pub(crate) const PHASE_AWAITING_COMP: u8 = 1;

pub(crate) fn channel_kind_byte(kind: ChannelKind) -> u8 {
    match kind {
        ChannelKind::Append => KIND_APPEND,
        ChannelKind::Latest => KIND_LATEST,
        ChannelKind::Queue => KIND_QUEUE,
    }
}

fn get_channel_kind<'a, I: Input<'a>>(
    r: &mut Reader<'a, I>,
    field: &str,
) -> Result<ChannelKind, DecodeError> {
    let at = r.pos();
    match r.u8(field)? {
        KIND_APPEND => Ok(ChannelKind::Append),
        KIND_LATEST => Ok(ChannelKind::Latest),
        KIND_QUEUE => Ok(ChannelKind::Queue),
        other => Err(DecodeError::corrupt(
            field,
            at,
            format!("channel kind byte is {other}, not 0 (append), 1 (latest) or 2 (queue)"),
        )),
    }
}

/// Decodes `n` elements, naming the failing one in the error's field path.
#[inline]
fn get_list<'a, I: Input<'a>, T>(
    r: &mut Reader<'a, I>,
    field: &str,
    min_size: usize,
    mut get: impl FnMut(&mut Reader<'a, I>) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    let n = r.count(field, min_size)?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(get(r).map_err(|e| e.within(&format_args!("{field}[{i}]")))?);
    }
    Ok(out)
}

// ---- records -------------------------------------------------------------

pub(crate) fn put_props(w: &mut Writer, p: &PublishProps) {
    w.opt_str(p.content_type.as_deref());
    w.opt_str(p.response_topic.as_deref());
    w.opt_bytes(p.correlation_data.as_deref());
    w.opt_u8(p.payload_format_indicator);
    w.opt_u32(p.message_expiry_interval);
}

fn get_props<'a, I: Input<'a>>(r: &mut Reader<'a, I>) -> Result<PublishProps, DecodeError> {
    // Most records carry no publish property: five zero tags.
    if r.skip_zeros::<5>() {
        return Ok(PublishProps::default());
    }
    Ok(PublishProps {
        content_type: r.opt_str("content_type")?,
        response_topic: r.opt_str("response_topic")?,
        correlation_data: r.opt_bytes("correlation_data")?,
        payload_format_indicator: r.opt_u8("payload_format_indicator")?,
        message_expiry_interval: r.opt_u32("message_expiry_interval")?,
    })
}

pub(crate) fn put_user_properties(w: &mut Writer, props: &[UserProperty]) {
    w.len(props.len());
    for p in props {
        w.str(&p.name);
        w.str(&p.value);
    }
}

fn get_user_properties<'a, I: Input<'a>>(
    r: &mut Reader<'a, I>,
) -> Result<Vec<UserProperty>, DecodeError> {
    get_list(r, "user_properties", MIN_USER_PROPERTY, |r| {
        Ok(UserProperty {
            name: r.str("name")?,
            value: r.str("value")?,
        })
    })
}

/// The fixed-width start of a record: offset, message id, timestamp, qos,
/// retain, shared_copy.
const RECORD_FIXED: usize = 8 + 16 + 8 + 1 + 1 + 1;

pub(crate) fn put_record(w: &mut Writer, rec: &Record) {
    // One copy for the fixed-width fields rather than six.
    let mut fixed = [0u8; RECORD_FIXED];
    fixed[0..8].copy_from_slice(&rec.offset.to_le_bytes());
    fixed[8..24].copy_from_slice(&rec.message_id);
    fixed[24..32].copy_from_slice(&rec.timestamp.to_le_bytes());
    fixed[32] = rec.qos;
    fixed[33] = u8::from(rec.retain);
    fixed[34] = u8::from(rec.shared_copy);
    w.buf.extend_from_slice(&fixed);
    w.str(&rec.topic);
    w.str(&rec.client_id);
    w.opt_str(rec.bridge.as_deref());
    w.opt_str(rec.owed_to.as_deref());
    put_user_properties(w, &rec.user_properties);
    put_props(w, &rec.props);
    w.bytes(&rec.payload);
}

fn flag(byte: u8, field: &str, at: usize) -> Result<bool, DecodeError> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(DecodeError::corrupt(
            field,
            at,
            format!("boolean byte is {other}, not 0 or 1"),
        )),
    }
}

pub(crate) fn get_record<'a, I: Input<'a>>(r: &mut Reader<'a, I>) -> Result<Record, DecodeError> {
    get_record_in_place(r).map(|(record, _)| record)
}

/// [`get_record`], and its topic where it lies in a whole input (`None`
/// when streaming: the record's own is the only copy).
fn get_record_in_place<'a, I: Input<'a>>(
    r: &mut Reader<'a, I>,
) -> Result<(Record, Option<&'a str>), DecodeError> {
    let at = r.pos();
    let fixed = r.fixed::<RECORD_FIXED>("offset")?;
    let (offset, rest) = fixed.split_at(8);
    let (message_id, rest) = rest.split_at(16);
    let (timestamp, flags) = rest.split_at(8);
    let offset = u64::from_le_bytes(offset.try_into().unwrap_or_default());
    let message_id: [u8; 16] = message_id.try_into().unwrap_or_default();
    let timestamp = i64::from_le_bytes(timestamp.try_into().unwrap_or_default());
    let [qos, retain, shared_copy] = <[u8; 3]>::try_from(flags).unwrap_or_default();
    let retain = flag(retain, "retain", at + 33)?;
    let shared_copy = flag(shared_copy, "shared_copy", at + 34)?;
    let (topic, topic_in_place) = match r.text("topic")? {
        Text::InPlace(topic) => (topic.to_owned(), Some(topic)),
        Text::Copied(topic) => (topic, None),
    };
    let client_id = r.str("client_id")?;
    let bridge = r.opt_str("bridge")?;
    let owed_to = r.opt_str("owed_to")?;
    let user_properties = get_user_properties(r)?;
    let props = get_props(r)?;
    let payload: Bytes = r.bytes("payload")?;
    let record = Record {
        offset,
        message_id,
        topic,
        timestamp,
        user_properties,
        payload,
        props: props.into(),
        retain,
        bridge,
        client_id,
        qos,
        shared_copy,
        owed_to,
    };
    Ok((record, topic_in_place))
}

fn put_records(w: &mut Writer, records: &[Record]) {
    w.len(records.len());
    for rec in records {
        put_record(w, rec);
    }
}

/// Decodes a record list, each record checked by `check` and handed to
/// `sink`, which keeps it or drops it.
fn get_records<'a, I: Input<'a>, S: RecordSink>(
    r: &mut Reader<'a, I>,
    field: &str,
    list: RecordList,
    check: &mut ListCheck<'a>,
    sink: &mut S,
) -> Result<Vec<Record>, DecodeError> {
    let n = r.count(field, MIN_RECORD)?;
    check.expect(n);
    let mut kept = Vec::with_capacity(sink.capacity(list, n));
    for i in 0..n {
        let (rec, topic) =
            get_record_in_place(r).map_err(|e| e.within(&format_args!("{field}[{i}]")))?;
        check.record(&rec, topic);
        sink.record(list, rec, &mut kept);
    }
    Ok(kept)
}

// ---- channel parts -------------------------------------------------------

fn put_positions(w: &mut Writer, positions: &[Position]) {
    w.len(positions.len());
    for p in positions {
        w.str(&p.reader);
        w.u64(p.offset);
        w.i64(p.saved_at);
        w.opt_u32(p.session_expiry);
    }
}

fn get_positions<'a, I: Input<'a>>(
    r: &mut Reader<'a, I>,
    field: &str,
) -> Result<Vec<Position>, DecodeError> {
    get_list(r, field, MIN_POSITION, |r| {
        Ok(Position {
            reader: r.str("reader")?,
            offset: r.u64("offset")?,
            saved_at: r.i64("saved_at")?,
            session_expiry: r.opt_u32("session_expiry")?,
        })
    })
}

fn put_held(w: &mut Writer, held: &[HeldPublish]) {
    w.len(held.len());
    for h in held {
        w.str(&h.client_id);
        w.u16(h.packet_id);
        w.i64(h.held_at);
        put_record(w, &h.record);
    }
}

fn get_held<'a, I: Input<'a>>(r: &mut Reader<'a, I>) -> Result<Vec<HeldPublish>, DecodeError> {
    get_list(r, "held", MIN_HELD, |r| {
        Ok(HeldPublish {
            client_id: r.str("client_id")?,
            packet_id: r.u16("packet_id")?,
            held_at: r.i64("held_at")?,
            record: get_record(r).map_err(|e| e.within(&"record"))?,
        })
    })
}

fn put_items(w: &mut Writer, items: &[QueueItem]) {
    w.len(items.len());
    for item in items {
        put_record(w, &item.record);
        w.u32(item.attempts);
        w.i64(item.first_delivered);
        w.i64(item.last_delivered);
    }
}

fn get_item<'a, I: Input<'a>>(r: &mut Reader<'a, I>) -> Result<QueueItem, DecodeError> {
    Ok(QueueItem {
        record: get_record(r).map_err(|e| e.within(&"record"))?,
        attempts: r.u32("attempts")?,
        first_delivered: r.i64("first_delivered")?,
        last_delivered: r.i64("last_delivered")?,
    })
}

fn get_items<'a, I: Input<'a>, S: RecordSink>(
    r: &mut Reader<'a, I>,
    check: &mut ListCheck<'_>,
    sink: &mut S,
) -> Result<Vec<QueueItem>, DecodeError> {
    let n = r.count("items", MIN_ITEM)?;
    let mut kept = Vec::with_capacity(sink.capacity(RecordList::QueueItems, n));
    for i in 0..n {
        let item = get_item(r).map_err(|e| e.within(&format_args!("items[{i}]")))?;
        check.item(&item);
        sink.item(item, &mut kept);
    }
    Ok(kept)
}

/// An upper bound on a record's encoding, to size the output buffer once.
fn record_size_hint(rec: &Record) -> usize {
    let mut n = MIN_RECORD + rec.topic.len() + rec.client_id.len() + rec.payload.len();
    n += rec.bridge.as_ref().map_or(0, |s| 4 + s.len());
    n += rec.owed_to.as_ref().map_or(0, |s| 4 + s.len());
    for p in &rec.user_properties {
        n += 8 + p.name.len() + p.value.len();
    }
    n += rec.props.content_type.as_ref().map_or(0, |s| 4 + s.len());
    n += rec.props.response_topic.as_ref().map_or(0, |s| 4 + s.len());
    n += rec
        .props
        .correlation_data
        .as_ref()
        .map_or(0, |s| 4 + s.len());
    n + 2 + 4
}

pub(crate) fn channel_size_hint(c: &ChannelFile) -> usize {
    let mut n = 256 + c.name.len();
    n += c.records.iter().map(record_size_hint).sum::<usize>();
    n += c
        .items
        .iter()
        .map(|i| record_size_hint(&i.record) + 20)
        .sum::<usize>();
    n += c
        .held
        .iter()
        .map(|h| record_size_hint(&h.record) + 14 + h.client_id.len())
        .sum::<usize>();
    n += c
        .positions
        .iter()
        .map(|p| MIN_POSITION + 4 + p.reader.len())
        .sum::<usize>();
    if let Some(d) = &c.dead_letter {
        n += d.records.iter().map(record_size_hint).sum::<usize>();
        n += d
            .positions
            .iter()
            .map(|p| MIN_POSITION + 4 + p.reader.len())
            .sum::<usize>();
    }
    n
}

pub(crate) fn put_channel(w: &mut Writer, c: &ChannelFile) {
    w.str(&c.name);
    w.u8(channel_kind_byte(c.kind));
    w.u64(c.next);
    w.u64(c.floor);
    w.u64(c.bytes);
    put_records(w, &c.records);
    put_items(w, &c.items);
    put_positions(w, &c.positions);
    put_held(w, &c.held);
    match &c.dead_letter {
        None => w.u8(0),
        Some(d) => {
            w.u8(1);
            w.str(&d.name);
            w.u64(d.next);
            w.u64(d.floor);
            w.u64(d.bytes);
            put_records(w, &d.records);
            put_positions(w, &d.positions);
        }
    }
}

/// Decodes a channel body, streaming its record lists through `sink` and
/// their checks; the verdicts go to `validate_channel`.
pub(crate) fn get_channel<'a, I: Input<'a>, S: RecordSink>(
    r: &mut Reader<'a, I>,
    sink: &mut S,
) -> Result<(ChannelFile, ChannelChecks<'a>), DecodeError> {
    let name = r.str("name")?;
    let kind = get_channel_kind(r, "kind")?;
    let next = r.u64("next")?;
    let floor = r.u64("floor")?;
    let bytes = r.u64("bytes")?;
    let mut checks = ChannelChecks {
        records: ListCheck::new("records", ListRules::channel_records(kind, next, floor)),
        items: ListCheck::new("items", ListRules::channel_items(kind, next, floor)),
        dead_letter_records: None,
    };
    let records = get_records(
        r,
        "records",
        RecordList::ChannelRecords,
        &mut checks.records,
        sink,
    )?;
    let items = get_items(r, &mut checks.items, sink)?;
    let positions = get_positions(r, "positions")?;
    let held = get_held(r)?;
    let dead_letter = if r.present("dead_letter")? {
        let mut get = |r: &mut Reader<'a, I>| -> Result<DeadLetter, DecodeError> {
            let name = r.str("name")?;
            let next = r.u64("next")?;
            let floor = r.u64("floor")?;
            let bytes = r.u64("bytes")?;
            let check = checks.dead_letter_records.insert(ListCheck::new(
                "dead_letter.records",
                ListRules::dead_letter(next, floor),
            ));
            Ok(DeadLetter {
                name,
                next,
                floor,
                bytes,
                records: get_records(r, "records", RecordList::DeadLetterRecords, check, sink)?,
                positions: get_positions(r, "positions")?,
            })
        };
        Some(get(r).map_err(|e| e.within(&"dead_letter"))?)
    } else {
        None
    };
    let file = ChannelFile {
        name,
        kind,
        next,
        floor,
        bytes,
        records,
        items,
        positions,
        held,
        dead_letter,
    };
    Ok((file, checks))
}

// ---- manifest ------------------------------------------------------------

pub(crate) fn put_manifest(w: &mut Writer, m: &Manifest) {
    w.i64(m.began_at);
    w.bool(m.retained);
    w.bool(m.sessions);
    w.bool(m.broadcast);
    w.len(m.channels.len());
    for e in &m.channels {
        w.str(&e.channel);
        w.str(&e.file_name);
        w.u8(channel_kind_byte(e.kind));
    }
}

pub(crate) fn get_manifest<'a, I: Input<'a>>(
    r: &mut Reader<'a, I>,
) -> Result<Manifest, DecodeError> {
    let began_at = r.i64("began_at")?;
    let retained = r.bool("retained")?;
    let sessions = r.bool("sessions")?;
    let broadcast = r.bool("broadcast")?;
    let channels = get_list(r, "channels", MIN_MANIFEST_ENTRY, |r| {
        Ok(ManifestEntry {
            channel: r.str("channel")?,
            file_name: r.str("file_name")?,
            kind: get_channel_kind(r, "kind")?,
        })
    })?;
    Ok(Manifest {
        began_at,
        channels,
        retained,
        sessions,
        broadcast,
    })
}

// ---- generation manifest -------------------------------------------------

pub(crate) fn put_generation(w: &mut Writer, g: &Generation) {
    w.u64(g.generation);
    w.i64(g.captured_at);
    w.len(g.files.len());
    for f in &g.files {
        w.u8(f.kind.as_byte());
        w.str(&f.channel);
        w.str(&f.file_name);
        w.u64(f.generation);
        w.i64(f.written_at);
        w.u64(f.length);
        w.u32(f.checksum);
        w.bool(f.behind);
    }
}

pub(crate) fn generation_size_hint(g: &Generation) -> usize {
    8 + 8
        + 4
        + g.files
            .iter()
            .map(|f| MIN_GENERATION_FILE + f.channel.len() + f.file_name.len())
            .sum::<usize>()
}

pub(crate) fn get_generation<'a, I: Input<'a>>(
    r: &mut Reader<'a, I>,
) -> Result<Generation, DecodeError> {
    let generation = r.u64("generation")?;
    let captured_at = r.i64("captured_at")?;
    let files = get_list(r, "files", MIN_GENERATION_FILE, |r| {
        let at = r.pos();
        let kind = match super::FileKind::from_byte(r.u8("kind")?) {
            Some(
                kind @ (super::FileKind::Channel
                | super::FileKind::Retained
                | super::FileKind::Sessions
                | super::FileKind::Broadcast),
            ) => kind,
            _ => {
                return Err(DecodeError::corrupt(
                    "kind",
                    at,
                    "not 1 (channel), 3 (retained), 4 (sessions) or 5 (broadcast)",
                ))
            }
        };
        Ok(GenerationFile {
            kind,
            channel: r.str("channel")?,
            file_name: r.str("file_name")?,
            generation: r.u64("generation")?,
            written_at: r.i64("written_at")?,
            length: r.u64("length")?,
            checksum: r.u32("checksum")?,
            behind: r.bool("behind")?,
        })
    })?;
    Ok(Generation {
        generation,
        captured_at,
        files,
    })
}

// ---- retained ------------------------------------------------------------

pub(crate) fn put_retained(w: &mut Writer, f: &RetainedFile) {
    put_records(w, &f.records);
}

pub(crate) fn get_retained<'a, I: Input<'a>, S: RecordSink>(
    r: &mut Reader<'a, I>,
    sink: &mut S,
) -> Result<(RetainedFile, ListVerdict), DecodeError> {
    let mut check = ListCheck::new("records", ListRules::Retained);
    let records = get_records(r, "records", RecordList::Retained, &mut check, sink)?;
    Ok((RetainedFile { records }, check.finish()))
}

// ---- sessions ------------------------------------------------------------

fn put_group_key(w: &mut Writer, k: &SharedGroupKey) {
    w.str(&k.group);
    w.str(&k.filter);
}

fn get_group_key<'a, I: Input<'a>>(r: &mut Reader<'a, I>) -> Result<SharedGroupKey, DecodeError> {
    Ok(SharedGroupKey {
        group: r.str("group")?,
        filter: r.str("filter")?,
    })
}

fn put_session(w: &mut Writer, s: &Session) {
    w.str(&s.client_id);
    w.opt_str(s.principal.as_deref());
    w.u32(s.expiry_interval);
    w.i64(s.detached_at);
    w.u16(s.window);
    w.len(s.subscriptions.len());
    for sub in &s.subscriptions {
        w.str(&sub.filter);
        w.u8(sub.qos);
        w.bool(sub.no_local);
        w.bool(sub.retain_as_published);
        w.u8(sub.retain_handling);
        w.opt_u32(sub.subscription_id);
        w.u64(sub.log_offset);
    }
    match &s.will {
        None => w.u8(0),
        Some(will) => {
            w.u8(1);
            w.str(&will.topic);
            w.bytes(&will.payload);
            w.u8(will.qos);
            w.bool(will.retain);
            w.u32(will.delay_interval);
            put_props(w, &will.props);
            put_user_properties(w, &will.user_properties);
        }
    }
    w.len(s.inflight.len());
    for e in &s.inflight {
        w.u64(e.log_offset);
        w.u16(e.packet_id);
        w.u8(e.qos);
        w.u8(match e.phase {
            InflightPhase::AwaitingAck => PHASE_AWAITING_ACK,
            InflightPhase::AwaitingComp => PHASE_AWAITING_COMP,
        });
        match &e.shared_group {
            None => w.u8(0),
            Some(k) => {
                w.u8(1);
                put_group_key(w, k);
            }
        }
    }
}

fn get_will<'a, I: Input<'a>>(r: &mut Reader<'a, I>) -> Result<Will, DecodeError> {
    Ok(Will {
        topic: r.str("topic")?,
        payload: r.bytes("payload")?,
        qos: r.u8("qos")?,
        retain: r.bool("retain")?,
        delay_interval: r.u32("delay_interval")?,
        props: get_props(r)?,
        user_properties: get_user_properties(r)?,
    })
}

fn get_inflight<'a, I: Input<'a>>(r: &mut Reader<'a, I>) -> Result<InflightEntry, DecodeError> {
    let log_offset = r.u64("log_offset")?;
    let packet_id = r.u16("packet_id")?;
    let qos = r.u8("qos")?;
    let phase_at = r.pos();
    let phase = match r.u8("phase")? {
        PHASE_AWAITING_ACK => InflightPhase::AwaitingAck,
        PHASE_AWAITING_COMP => InflightPhase::AwaitingComp,
        other => {
            return Err(DecodeError::corrupt(
                "phase",
                phase_at,
                format!(
                    "phase byte is {other}, not 0 (awaiting PUBACK/PUBREC) or 1 (awaiting PUBCOMP)"
                ),
            ))
        }
    };
    let shared_group = if r.present("shared_group")? {
        Some(get_group_key(r).map_err(|e| e.within(&"shared_group"))?)
    } else {
        None
    };
    Ok(InflightEntry {
        log_offset,
        packet_id,
        qos,
        phase,
        shared_group,
    })
}

fn get_session<'a, I: Input<'a>>(r: &mut Reader<'a, I>) -> Result<Session, DecodeError> {
    let client_id = r.str("client_id")?;
    let principal = r.opt_str("principal")?;
    let expiry_interval = r.u32("expiry_interval")?;
    let detached_at = r.i64("detached_at")?;
    let window = r.u16("window")?;
    let subscriptions = get_list(r, "subscriptions", MIN_SUBSCRIPTION, |r| {
        Ok(Subscription {
            filter: r.str("filter")?,
            qos: r.u8("qos")?,
            no_local: r.bool("no_local")?,
            retain_as_published: r.bool("retain_as_published")?,
            retain_handling: r.u8("retain_handling")?,
            subscription_id: r.opt_u32("subscription_id")?,
            log_offset: r.u64("log_offset")?,
        })
    })?;
    let will = if r.present("will")? {
        Some(get_will(r).map_err(|e| e.within(&"will"))?)
    } else {
        None
    };
    let inflight = get_list(r, "inflight", MIN_INFLIGHT, get_inflight)?;
    Ok(Session {
        client_id,
        principal,
        expiry_interval,
        detached_at,
        subscriptions,
        will,
        window,
        inflight,
    })
}

pub(crate) fn put_sessions(w: &mut Writer, f: &SessionsFile) {
    put_sessions_of(w, &f.sessions, &f.shared_groups);
}

/// [`put_sessions`] from a file's parts as a writer holds them.
pub(crate) fn put_sessions_of<S: std::borrow::Borrow<Session>>(
    w: &mut Writer,
    sessions: &[S],
    shared_groups: &[SharedGroup],
) {
    w.len(sessions.len());
    for s in sessions {
        put_session(w, s.borrow());
    }
    w.len(shared_groups.len());
    for g in shared_groups {
        put_group_key(w, &g.key);
        w.u64(g.cursor);
        w.len(g.returned.len());
        for o in &g.returned {
            w.u64(*o);
        }
    }
}

pub(crate) fn get_sessions<'a, I: Input<'a>>(
    r: &mut Reader<'a, I>,
) -> Result<SessionsFile, DecodeError> {
    let sessions = get_list(r, "sessions", MIN_SESSION, get_session)?;
    let shared_groups = get_list(r, "shared_groups", MIN_GROUP, |r| {
        Ok(SharedGroup {
            key: get_group_key(r)?,
            cursor: r.u64("cursor")?,
            returned: get_list(r, "returned", 8, |r| r.u64("log_offset"))?,
        })
    })?;
    Ok(SessionsFile {
        sessions,
        shared_groups,
    })
}

// ---- broadcast -----------------------------------------------------------

pub(crate) fn put_broadcast(w: &mut Writer, f: &BroadcastFile) {
    w.u64(f.next);
    w.u64(f.floor);
    w.u64(f.bytes);
    put_records(w, &f.messages);
    put_positions(w, &f.cursors);
    put_held(w, &f.held);
}

pub(crate) fn get_broadcast<'a, I: Input<'a>, S: RecordSink>(
    r: &mut Reader<'a, I>,
    sink: &mut S,
) -> Result<(BroadcastFile, ListVerdict), DecodeError> {
    let next = r.u64("next")?;
    let floor = r.u64("floor")?;
    let bytes = r.u64("bytes")?;
    let mut check = ListCheck::new("messages", ListRules::broadcast(next, floor));
    let messages = get_records(
        r,
        "messages",
        RecordList::BroadcastMessages,
        &mut check,
        sink,
    )?;
    let file = BroadcastFile {
        next,
        floor,
        bytes,
        messages,
        cursors: get_positions(r, "cursors")?,
        held: get_held(r)?,
    };
    Ok((file, check.finish()))
}

pub(crate) fn records_size_hint(records: &[Record]) -> usize {
    64 + records.iter().map(record_size_hint).sum::<usize>()
}
