//! The semantic pass (RFC 0004 "Loading"): what a checksum cannot cover.
//! A checksum proves the bytes are the ones written, not that the writer
//! was right; an out-of-order record would hide every record behind it
//! from a reader that stops at the first offset past what it asked for.
//! FORMAT.md §2.9 lists every rule here.

use std::collections::HashSet;

use super::error::DecodeError;
use super::types::*;
use super::SnapshotFile;
use crate::channel_name;
use crate::model::{ChannelKind, PublishProps, Record};

/// The largest Subscription Identifier MQTT 5 allows (a 4-byte varint).
pub const MAX_SUBSCRIPTION_ID: u32 = 268_435_455;

/// Checks one decoded file against every rule its kind has. [`super::decode`]
/// runs it; a writer may run it before writing.
pub fn validate(file: &SnapshotFile) -> Result<(), DecodeError> {
    match file {
        SnapshotFile::Channel(c) => validate_channel(c),
        SnapshotFile::Manifest(m) => validate_manifest(m),
        SnapshotFile::Retained(r) => validate_retained(r),
        SnapshotFile::Sessions(s) => validate_sessions(s),
        SnapshotFile::Broadcast(b) => validate_broadcast(b),
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

/// Offsets strictly ascending, each in `[floor, next)`.
fn check_log(
    field: &str,
    offsets: impl Iterator<Item = u64>,
    next: u64,
    floor: u64,
) -> Result<(), DecodeError> {
    let mut previous: Option<u64> = None;
    for (i, offset) in offsets.enumerate() {
        check_offset(field, i, offset, previous, next, floor)?;
        previous = Some(offset);
    }
    Ok(())
}

#[inline]
fn check_offset(
    field: &str,
    i: usize,
    offset: u64,
    previous: Option<u64>,
    next: u64,
    floor: u64,
) -> Result<(), DecodeError> {
    if offset < floor {
        return err(
            format!("{field}[{i}].offset"),
            format!("{offset} is below the floor {floor}"),
        );
    }
    if offset >= next {
        return err(
            format!("{field}[{i}].offset"),
            format!("{offset} is not below next {next}"),
        );
    }
    if let Some(p) = previous {
        if offset <= p {
            return err(
                format!("{field}[{i}].offset"),
                format!("{offset} does not ascend from the previous offset {p}"),
            );
        }
    }
    Ok(())
}

fn check_records(
    field: &str,
    records: &[Record],
    next: u64,
    floor: u64,
    broadcast: bool,
) -> Result<(), DecodeError> {
    // One pass: a million records are read once, not once per rule.
    let mut previous: Option<u64> = None;
    for (i, rec) in records.iter().enumerate() {
        check_offset(field, i, rec.offset, previous, next, floor)?;
        previous = Some(rec.offset);
        check_record(rec, broadcast).map_err(|e| e.within(&format_args!("{field}[{i}]")))?;
    }
    Ok(())
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

fn validate_channel(c: &ChannelFile) -> Result<(), DecodeError> {
    if c.name.is_empty() {
        return err("name", "is empty");
    }
    check_counters("", c.next, c.floor)?;
    match c.kind {
        ChannelKind::Append | ChannelKind::Latest => {
            if !c.items.is_empty() {
                return err(
                    "items",
                    format!(
                        "{} queue items on a channel of kind {}, which keeps records",
                        c.items.len(),
                        c.kind
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
            check_records("records", &c.records, c.next, c.floor, false)?;
            if c.kind == ChannelKind::Latest {
                let mut topics = HashSet::with_capacity(c.records.len());
                for (i, rec) in c.records.iter().enumerate() {
                    if !topics.insert(rec.topic.as_str()) {
                        return err(
                            format!("records[{i}].topic"),
                            format!(
                                "{:?} has a second value on a latest channel, which keeps one per topic",
                                rec.topic
                            ),
                        );
                    }
                }
            }
        }
        ChannelKind::Queue => {
            if !c.records.is_empty() {
                return err(
                    "records",
                    format!("{} records on a queue, which keeps items", c.records.len()),
                );
            }
            check_log(
                "items",
                c.items.iter().map(|i| i.record.offset),
                c.next,
                c.floor,
            )?;
            for (i, item) in c.items.iter().enumerate() {
                check_record(&item.record, false)
                    .map_err(|e| e.within(&format_args!("items[{i}].record")))?;
                if item.first_delivered == 0 && item.last_delivered != 0 {
                    return err(
                        format!("items[{i}].first_delivered"),
                        "is unset while last_delivered is set",
                    );
                }
            }
            if let Some(d) = &c.dead_letter {
                let expected = DeadLetter::name_for(&c.name);
                if d.name != expected {
                    return err(
                        "dead_letter.name",
                        format!("{:?} is not {expected:?}", d.name),
                    );
                }
                check_counters("dead_letter.", d.next, d.floor)?;
                check_records("dead_letter.records", &d.records, d.next, d.floor, false)?;
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

fn validate_retained(f: &RetainedFile) -> Result<(), DecodeError> {
    let mut topics = HashSet::with_capacity(f.records.len());
    for (i, rec) in f.records.iter().enumerate() {
        check_record(rec, false).map_err(|e| e.within(&format_args!("records[{i}]")))?;
        if !topics.insert(rec.topic.as_str()) {
            return err(
                format!("records[{i}].topic"),
                format!("{:?} has a second retained message", rec.topic),
            );
        }
    }
    Ok(())
}

fn validate_sessions(f: &SessionsFile) -> Result<(), DecodeError> {
    let mut groups = HashSet::with_capacity(f.shared_groups.len());
    for (i, g) in f.shared_groups.iter().enumerate() {
        if g.key.group.is_empty() || g.key.filter.is_empty() {
            return err(
                format!("shared_groups[{i}]"),
                "has an empty group name or filter",
            );
        }
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
    let mut clients = HashSet::with_capacity(f.sessions.len());
    for (i, s) in f.sessions.iter().enumerate() {
        if s.client_id.is_empty() {
            return err(format!("sessions[{i}].client_id"), "is empty");
        }
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

fn validate_broadcast(f: &BroadcastFile) -> Result<(), DecodeError> {
    check_counters("", f.next, f.floor)?;
    check_records("messages", &f.messages, f.next, f.floor, true)?;
    check_positions("cursors", &f.cursors, f.next, PositionsOf::BroadcastLog)?;
    check_held("held", &f.held, true)
}

/// The rules that need `saguin.sessions` and `saguin.broadcast` together
/// (RFC 0004: "one at or past the log's next offset ... is refused"): every
/// in-flight entry, subscription mark, group cursor and returned delivery
/// points into the log, none at or past its next offset (a cursor or
/// subscription mark may equal it: it names the next message to come).
pub fn validate_pair(sessions: &SessionsFile, log: &BroadcastFile) -> Result<(), DecodeError> {
    let next = log.next;
    for (i, s) in sessions.sessions.iter().enumerate() {
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
    for (i, g) in sessions.shared_groups.iter().enumerate() {
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
