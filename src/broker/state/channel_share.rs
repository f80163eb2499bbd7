//! Shared subscriptions over an append channel (`$share/G/telemetry/#`):
//! one group, one place in the channel, each record to one member.
//!
//! The group is keyed by its raw filter, as MQTT keys a shared
//! subscription. It has one `next` and the offsets it handed out and has
//! not had acknowledged, each with the member holding it. A record
//! matching the group's filter goes to the next member, in turn, that is
//! connected and has room; when none has, the group waits at that record
//! (and reads it again later), so a record is never skipped for want of a
//! member. A member whose session ends returns what it held: the group
//! moves back to the lowest offset returned and hands out again from
//! there (at least once: records after it still out with other members
//! may come twice). The group's position - the lowest offset out, or
//! `next` - is stored under the reader `mqtt:<raw filter>` (a name no MQTT
//! client id of a session consuming alone takes, as it starts with
//! `$share/`), every `ack_commit_interval` and at shutdown; it is kept for
//! `limits.max_session_expiry` after the last member went away.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio::time::Instant;

use super::ids::IdMap;
use super::intent::{Role, Write};
use super::reads::{ChannelRead, ReadWindow, Seek};
use super::session::{InflightEntry, QueuedMessage};
use super::BrokerState;
use crate::broker::metrics::DropReason;
use crate::broker::subscriptions::SessionKey;
use crate::storage::contract::{LentRecord, Position, Reader};
use crate::topic;
use saguin_format::model::ChannelKind;

/// Most records one read of a group asks for.
const GROUP_READ_MAX: usize = 256;

/// The shared groups over channels, and what they have asked of them.
#[derive(Debug, Default)]
pub(super) struct Groups {
    pub all: Vec<ChannelGroup>,
    /// Groups to let read on once the current event is handled.
    pub due: Vec<usize>,
    /// Reads out for groups: ticket to the group, its generation, and
    /// whether the read resolves where the group starts.
    pub reads_out: IdMap<u64, (usize, u64, bool)>,
    /// Stored places of groups nobody has joined yet since the start.
    pub positions: HashMap<(u16, String), u64>,
}

impl Groups {
    /// The group `$share/G/<filter>` named `raw`, by index.
    fn index_of(&self, raw: &str) -> Option<usize> {
        self.all.iter().position(|g| g.raw == raw)
    }

    /// Every group session `key` belongs to, by raw filter.
    pub(super) fn joined_by(&self, key: SessionKey) -> Vec<String> {
        self.all
            .iter()
            .filter(|g| g.members.contains(&key))
            .map(|g| g.raw.clone())
            .collect()
    }

    /// An exchange of `key` over `channel` ended: true when it was a
    /// group's delivery (then the group lets it go).
    pub(super) fn acknowledged(&mut self, key: SessionKey, channel: u16, offset: u64) -> bool {
        for group in &mut self.all {
            if group.channel == channel && group.out.get(&offset) == Some(&key) {
                group.out.remove(&offset);
                return true;
            }
        }
        false
    }
}

/// A shared group over one channel.
#[derive(Debug)]
pub(super) struct ChannelGroup {
    pub channel: u16,
    /// `$share/G/<filter>`: the group's name and its reader's id.
    pub raw: String,
    filter: String,
    members: Vec<SessionKey>,
    /// Whose turn is next.
    turn: usize,
    next: u64,
    /// Offsets out with a member, not acknowledged yet.
    out: BTreeMap<u64, SessionKey>,
    reading: bool,
    generation: u64,
    /// A gap to announce on the next delivery.
    gap: Option<(u64, u64)>,
    /// Over a latest channel: the floor that sent the group back to read
    /// every row again from the first offset, until it passes it (as a
    /// consumer's, `consumer::Consumer`).
    resync: Option<u64>,
    stored: Option<u64>,
}

impl ChannelGroup {
    pub fn has_member(&self, key: SessionKey) -> bool {
        self.members.contains(&key)
    }

    fn position(&self) -> u64 {
        self.out.keys().next().copied().unwrap_or(self.next)
    }
}

impl BrokerState {
    /// Session `key` joined the shared group `raw` over `channel` (its
    /// SUBACK is sent). A new group starts at its stored position, else
    /// at `seek`, else at `next`.
    pub(super) fn join_group(
        &mut self,
        key: SessionKey,
        channel: u16,
        raw: &str,
        filter: &str,
        seek: Option<Seek>,
    ) {
        let index = match self.groups.index_of(raw) {
            Some(i) => i,
            None => {
                let stored = self.groups.positions.remove(&(channel, raw.to_owned()));
                let next = self.channels.all[channel as usize].next;
                let generation = self.reads.number();
                let mut group = ChannelGroup {
                    channel,
                    raw: raw.to_owned(),
                    filter: filter.to_owned(),
                    members: Vec::new(),
                    turn: 0,
                    next: stored.unwrap_or(next),
                    out: BTreeMap::new(),
                    reading: false,
                    generation,
                    gap: None,
                    resync: None,
                    stored,
                };
                if stored.is_none() {
                    if let Some(Seek::Offset(offset)) = seek {
                        group.next = offset;
                    }
                }
                self.groups.all.push(group);
                let index = self.groups.all.len() - 1;
                if stored.is_none() && matches!(seek, Some(Seek::Earliest | Seek::Time(_))) {
                    self.read_group(index, seek);
                }
                index
            }
        };
        let group = &mut self.groups.all[index];
        if !group.members.contains(&key) {
            group.members.push(key);
        }
        self.groups.due.push(index);
    }

    /// Session `key` left group `raw` (unsubscribed, or its session ended):
    /// what it held goes back to the group.
    pub(super) fn leave_group(&mut self, key: SessionKey, raw: &str) {
        let Some(index) = self.groups.index_of(raw) else {
            return;
        };
        let group = &mut self.groups.all[index];
        group.members.retain(|k| *k != key);
        let returned: Vec<u64> = group
            .out
            .iter()
            .filter(|(_, k)| **k == key)
            .map(|(o, _)| *o)
            .collect();
        for offset in &returned {
            group.out.remove(offset);
        }
        if let Some(&lowest) = returned.first() {
            group.next = group.next.min(lowest);
            // Answers of reads made before the return are for the old place.
            group.generation = self.reads.number();
            group.reading = false;
        }
        self.groups.due.push(index);
    }

    /// A committed record of `channel`: to each caught-up group's next
    /// member with room; the others catch up by reading.
    pub(super) fn groups_committed(&mut self, channel: u16, record: &LentRecord, now: Instant) {
        for index in 0..self.groups.all.len() {
            let group = &self.groups.all[index];
            if group.channel != channel {
                continue;
            }
            if group.next == record.offset() && !group.reading && group.gap.is_none() {
                self.offer_to_group(index, record, now);
            } else {
                self.groups.due.push(index);
            }
        }
    }

    /// Hand `record` (at the group's `next`) to a member: true when it was
    /// sent or passed over, false when no member had room.
    fn offer_to_group(&mut self, index: usize, record: &LentRecord, now: Instant) -> bool {
        let group = &self.groups.all[index];
        if !topic::filter_matches(&group.filter, record.topic()) {
            self.groups.all[index].next = record.offset() + 1;
            return true;
        }
        let members = group.members.len();
        let turn = group.turn;
        for step in 0..members {
            let at = (turn + step) % members;
            let key = self.groups.all[index].members[at];
            if self.send_to_member(index, key, record, now) {
                let group = &mut self.groups.all[index];
                group.turn = (at + 1) % members.max(1);
                group.next = record.offset() + 1;
                group.gap = None;
                return true;
            }
        }
        false
    }

    /// Send a group's record to member `key` when it is connected and has
    /// room.
    fn send_to_member(
        &mut self,
        index: usize,
        key: SessionKey,
        record: &LentRecord,
        now: Instant,
    ) -> bool {
        let group = &self.groups.all[index];
        let raw = group.raw.clone();
        let channel = group.channel;
        let gap = group.gap;
        let Some(session) = self.sessions.by_key.get(&key) else {
            return false;
        };
        let Some(connection) = session.connection() else {
            return false;
        };
        let Some(sub) = session.subscriptions.get(&raw) else {
            return false;
        };
        let qos = sub.options.qos.min(record.qos());
        let subscription_ids: Vec<u32> = sub.options.subscription_id.into_iter().collect();
        let window = self.connections.get(&connection).map_or(0, |c| c.window());
        let room = if qos == 0 {
            self.has_room(connection)
        } else {
            self.queues.window_taken(key, &session.inflight) < window && self.has_room(connection)
        };
        if !room {
            return false;
        }
        let message = Arc::new(self.consumer_message(record, gap, now));
        if message.expiry_left(now).is_err() {
            self.metrics.dropped(DropReason::Expired);
            return true;
        }
        let queued = QueuedMessage {
            message,
            qos,
            retain: false,
            subscription_ids: subscription_ids.into(),
            logged: None,
        };
        if qos == 0 {
            self.transmit(connection, queued, 0, false, now);
            return true;
        }
        let session = self.sessions.by_key.get_mut(&key).expect("looked up");
        let Some(packet_id) = session.inflight.allocate_id() else {
            return false;
        };
        session.inflight.push(InflightEntry::sent(
            packet_id,
            queued.clone(),
            Some((channel, record.offset())),
        ));
        self.groups.all[index].out.insert(record.offset(), key);
        self.transmit(connection, queued, packet_id, false, now);
        true
    }

    /// Groups whose members made room, or that fell behind, read on.
    pub(super) fn run_group_reads(&mut self) {
        let mut due = std::mem::take(&mut self.groups.due);
        due.sort_unstable();
        due.dedup();
        for index in due {
            self.read_group(index, None);
        }
    }

    /// A read for group `index` from its `next` (or `seek`), when it is
    /// behind and a member has room.
    fn read_group(&mut self, index: usize, seek: Option<Seek>) {
        let Some(group) = self.groups.all.get(index) else {
            return;
        };
        if group.reading {
            return;
        }
        let channel = group.channel;
        if seek.is_none()
            && group.next >= self.channels.all[channel as usize].next
            && group.gap.is_none()
        {
            return;
        }
        let room: usize = group
            .members
            .iter()
            .filter_map(|k| {
                let session = self.sessions.by_key.get(k)?;
                let connection = session.connection()?;
                let window = self.connections.get(&connection)?.window();
                self.has_room(connection)
                    .then(|| window.saturating_sub(self.queues.window_taken(*k, &session.inflight)))
            })
            .sum();
        if room == 0 && seek.is_none() {
            return;
        }
        let ticket = self.reads.number();
        let generation = group.generation;
        let from = match (seek, group.resync) {
            (Some(seek), _) => seek,
            (None, Some(floor)) if group.next < floor => Seek::Resync {
                from: group.next,
                floor,
            },
            (None, _) => Seek::Offset(group.next),
        };
        self.groups.all[index].reading = true;
        self.groups
            .reads_out
            .insert(ticket, (index, generation, seek.is_some()));
        self.reads.waiting.push(ChannelRead {
            ticket,
            channel,
            from,
            max: room.clamp(1, GROUP_READ_MAX),
            filters: Vec::new(),
        });
    }

    /// A group's read came back (`None`: the ticket was not a group's).
    pub(super) fn on_group_read(
        &mut self,
        ticket: u64,
        result: &Result<ReadWindow, super::StorageFailure>,
        now: Instant,
    ) -> bool {
        let Some((index, generation, seeking)) = self.groups.reads_out.remove(&ticket) else {
            return false;
        };
        let Some(group) = self.groups.all.get_mut(index) else {
            return true;
        };
        if group.generation != generation {
            return true;
        }
        group.reading = false;
        let Ok(window) = result else {
            return true;
        };
        if seeking {
            group.next = window.start;
        }
        let latest = self.channels.all[group.channel as usize].kind == ChannelKind::Latest;
        if let Some(floor) = window.floor {
            if latest {
                // Deletions the group was owed were forgotten: it reads
                // every row again from where the window starts.
                group.gap = Some((group.next, floor - 1));
                group.next = window.start;
                group.resync = Some(floor);
                let name = self.channels.all[group.channel as usize].name.clone();
                self.metrics.consumer_gap(&name);
            } else if floor > group.next {
                group.gap = Some((group.next, floor - 1));
                group.next = floor;
                let name = self.channels.all[group.channel as usize].name.clone();
                self.metrics.consumer_gap(&name);
            }
        }
        let group = &mut self.groups.all[index];
        if group.resync.is_some_and(|floor| group.next >= floor) {
            group.resync = None;
        }
        for record in &window.records {
            if record.offset() < self.groups.all[index].next {
                continue;
            }
            if !self.offer_to_group(index, record, now) {
                break;
            }
        }
        if !window.records.is_empty() {
            self.groups.due.push(index);
        }
        true
    }

    /// Stage every group position that moved.
    pub(super) fn stage_group_positions(&mut self, now: Instant) {
        let saved_at = self.receipt_time(now).max(1);
        let expiry = self.limits.max_session_expiry;
        let mut writes = Vec::new();
        for group in &mut self.groups.all {
            let offset = group
                .position()
                .min(self.channels.all[group.channel as usize].next);
            if group.stored == Some(offset) {
                continue;
            }
            let Ok(reader) = Reader::mqtt(&group.raw) else {
                continue;
            };
            group.stored = Some(offset);
            writes.push((
                group.channel,
                Write::SavePosition(Position {
                    reader,
                    offset,
                    saved_at,
                    session_expiry: Some(expiry),
                }),
            ));
        }
        for (channel, write) in writes {
            self.persist.stage(Role::Channel(channel), write);
        }
    }
}
