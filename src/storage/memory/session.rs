//! What the broker keeps besides channels, in memory: persistent sessions,
//! the broadcast log with each session's cursor and each shared group's,
//! and the exactly-once publishes held for their release.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock, Weak};

use saguin_format::model::{Record, UnixNanos};

use super::slots::SlotLog;
use super::{lock, read, write, MemChannel, MemoryProvider, Shared, Version};
use crate::storage::contract::{
    check_hold, check_record, BroadcastLog, HeldPublish, HeldPublishStore, Removed, Result,
    SessionEntry, SessionStore, ShareGroupEntry, ShareGroupKey, StorageError, BROADCAST_LOG_NAME,
    FIRST_OFFSET,
};
use crate::storage::kept::Kept;

/// Persistent sessions in memory.
#[derive(Debug)]
pub struct MemorySessions {
    shared: Arc<Shared>,
    broadcast: Arc<MemoryBroadcast>,
    /// Each behind an `Arc`, replaced whole by a save: a snapshot's capture,
    /// on the broker's loop, takes a handle on each rather than a copy of
    /// its strings, subscriptions and in-flight table (100,000 sessions:
    /// 65 ms of the loop a generation, copied).
    sessions: Mutex<BTreeMap<String, Arc<SessionEntry>>>,
}

impl MemorySessions {
    pub(crate) fn new(shared: Arc<Shared>, broadcast: Arc<MemoryBroadcast>) -> MemorySessions {
        MemorySessions {
            shared,
            broadcast,
            sessions: Mutex::new(BTreeMap::new()),
        }
    }

    /// Every session, in client id order, as handles on what the store
    /// holds: what a snapshot writes.
    pub(crate) fn shared_sessions(&self) -> Vec<Arc<SessionEntry>> {
        lock(&self.sessions).values().cloned().collect()
    }

    /// Every session a snapshot held, by client id, as the store's own:
    /// taken whole into an empty store, merged in one pass otherwise
    /// (`BTreeMap::append`), never searched for one at a time.
    pub(crate) fn restore(&self, mut sessions: BTreeMap<String, Arc<SessionEntry>>) -> Result<()> {
        self.shared.check_open()?;
        lock(&self.sessions).append(&mut sessions);
        self.broadcast.touch();
        Ok(())
    }
}

impl SessionStore for MemorySessions {
    fn save(&self, session: SessionEntry) -> Result<()> {
        self.shared.check_open()?;
        lock(&self.sessions).insert(session.client_id.clone(), Arc::new(session));
        self.broadcast.touch();
        Ok(())
    }

    fn get(&self, client_id: &str) -> Result<Option<SessionEntry>> {
        Ok(lock(&self.sessions)
            .get(client_id)
            .map(|s| SessionEntry::clone(s)))
    }

    fn remove(&self, client_id: &str) -> Result<bool> {
        self.shared.check_open()?;
        let had = lock(&self.sessions).remove(client_id).is_some();
        // A session's ending takes its cursor on the log with it.
        let had_cursor = lock(&self.broadcast.cursors).remove(client_id).is_some();
        if had || had_cursor {
            self.broadcast.touch();
        }
        Ok(had)
    }

    fn sessions(&self) -> Result<Vec<SessionEntry>> {
        Ok(lock(&self.sessions)
            .values()
            .map(|s| SessionEntry::clone(s))
            .collect())
    }
}

#[derive(Debug)]
struct LogState {
    log: SlotLog<Kept>,
    next: u64,
    floor: u64,
}

/// The broadcast log in memory.
#[derive(Debug)]
pub struct MemoryBroadcast {
    shared: Arc<Shared>,
    state: RwLock<LogState>,
    /// Each session's cursor, under its client id shared with the copies a
    /// snapshot's capture takes (one handle each on the broker's loop, not
    /// a copy of each id).
    cursors: Mutex<BTreeMap<Arc<str>, u64>>,
    groups: Mutex<BTreeMap<ShareGroupKey, ShareGroupEntry>>,
    /// Changes to the log, its cursors and groups, and to the sessions:
    /// the two files are written as one pair, so they share one count.
    version: Version,
}

/// The broadcast log copied under its locks for a snapshot.
#[derive(Clone, Debug)]
pub struct BroadcastCopy {
    /// The pair's version (log and sessions) when copied.
    pub version: u64,
    pub next: u64,
    pub floor: u64,
    pub bytes: u64,
    pub messages: Vec<Kept>,
    /// Each session's cursor: client id, offset, and when it was saved
    /// (`0` from this store, which keeps no time for a cursor; a migration
    /// carries the time its source holds).
    pub cursors: Vec<(Arc<str>, u64, i64)>,
    pub groups: Vec<ShareGroupEntry>,
}

impl MemoryBroadcast {
    pub(crate) fn new(shared: Arc<Shared>) -> MemoryBroadcast {
        MemoryBroadcast {
            shared,
            state: RwLock::new(LogState {
                log: SlotLog::new(),
                next: FIRST_OFFSET,
                floor: FIRST_OFFSET,
            }),
            cursors: Mutex::new(BTreeMap::new()),
            groups: Mutex::new(BTreeMap::new()),
            version: Version::default(),
        }
    }

    /// How many times the sessions and the broadcast log have changed.
    pub fn version(&self) -> u64 {
        self.version.get()
    }

    /// Counts a change to the pair's files.
    pub(crate) fn touch(&self) {
        self.version.bump(&self.shared);
    }

    /// Replaces the log's contents with validated stored state.
    pub(crate) fn restore(
        &self,
        next: u64,
        floor: u64,
        messages: Vec<Record>,
        cursors: Vec<(String, u64)>,
        groups: Vec<ShareGroupEntry>,
    ) {
        let mut st = write(&self.state);
        st.next = next;
        st.floor = floor;
        for m in messages {
            let size = m.accounted_size();
            st.log.push(Kept::new(&m), size);
        }
        self.shared.budget.charge_relief(st.log.bytes());
        drop(st);
        // Built whole and merged in one pass, not searched for each.
        let mut cursors: BTreeMap<Arc<str>, u64> = cursors
            .into_iter()
            .map(|(c, o)| (Arc::from(c), o))
            .collect();
        lock(&self.cursors).append(&mut cursors);
        lock(&self.groups).extend(groups.into_iter().map(|g| (g.key.clone(), g)));
    }

    /// The log copied for a snapshot. The caller reads [`Self::version`]
    /// and the sessions before this, and passes the version it read.
    pub fn copy_state(&self) -> BroadcastCopy {
        self.copy_at(self.version())
    }

    pub(crate) fn copy_at(&self, version: u64) -> BroadcastCopy {
        let st = read(&self.state);
        BroadcastCopy {
            version,
            next: st.next,
            floor: st.floor,
            bytes: st.log.bytes(),
            messages: st.log.shared_records(),
            cursors: lock(&self.cursors)
                .iter()
                .map(|(c, o)| (Arc::clone(c), *o, 0))
                .collect(),
            groups: lock(&self.groups).values().cloned().collect(),
        }
    }

    pub(crate) fn append_inner(&self, mut record: Record, relief: bool) -> Result<(Record, Kept)> {
        self.shared.check_open()?;
        check_record(BROADCAST_LOG_NAME, &record, true)?;
        let size = record.accounted_size();
        let mut st = write(&self.state);
        if relief {
            self.shared.budget.charge_relief(size);
        } else {
            self.shared.budget.charge_publish(size)?;
        }
        record.offset = st.next;
        st.next += 1;
        let kept = Kept::new(&record);
        st.log.push(kept.clone(), size);
        self.touch();
        drop(st);
        Ok((record, kept))
    }
}

impl BroadcastLog for MemoryBroadcast {
    fn append(&self, record: Record) -> Result<Record> {
        self.append_inner(record, false).map(|(record, _)| record)
    }

    fn append_sharing(&self, record: Record) -> Result<(u64, Option<Kept>)> {
        self.append_inner(record, false)
            .map(|(record, kept)| (record.offset, Some(kept)))
    }

    fn read_from_n(&self, offset: u64, max: usize) -> Result<Vec<Record>> {
        let st = read(&self.state);
        if offset > st.next {
            return Err(StorageError::PastNext {
                channel: BROADCAST_LOG_NAME.to_owned(),
                offset,
                next: st.next,
            });
        }
        // Below the floor nothing is owed to anybody any more: the read
        // starts at what is still held.
        Ok(st
            .log
            .read_shared(offset.max(st.floor), max)
            .iter()
            .map(Kept::record_sharing)
            .collect())
    }

    fn release(&self, offsets: &[u64]) -> Result<Removed> {
        self.shared.check_open()?;
        let mut st = write(&self.state);
        let mut removed = Removed::default();
        for &o in offsets {
            if let Some(size) = st.log.clear_at(o) {
                removed.records += 1;
                removed.bytes += size;
            }
        }
        let floor = st.log.first_offset().unwrap_or(st.next).max(st.floor);
        if removed.records > 0 || floor != st.floor {
            self.touch();
        }
        st.floor = floor;
        self.shared.budget.give_back(removed.bytes);
        Ok(removed)
    }

    fn next(&self) -> u64 {
        read(&self.state).next
    }

    fn floor(&self) -> u64 {
        read(&self.state).floor
    }

    fn bytes(&self) -> u64 {
        read(&self.state).log.bytes()
    }

    fn record_count(&self) -> u64 {
        read(&self.state).log.live()
    }

    fn cursor(&self, client_id: &str) -> Result<Option<u64>> {
        Ok(lock(&self.cursors).get(client_id).copied())
    }

    fn save_cursor(&self, client_id: &str, offset: u64) -> Result<()> {
        self.shared.check_open()?;
        let next = self.next();
        if offset > next {
            return Err(StorageError::Invalid {
                what: format!("broadcast log: cursor of {client_id}"),
                detail: format!("offset {offset} is past the next offset {next}"),
            });
        }
        let previous = {
            let mut cursors = lock(&self.cursors);
            match cursors.get_mut(client_id) {
                Some(at) => Some(std::mem::replace(at, offset)),
                None => cursors.insert(Arc::from(client_id), offset),
            }
        };
        if previous != Some(offset) {
            self.touch();
        }
        Ok(())
    }

    fn drop_cursor(&self, client_id: &str) -> Result<bool> {
        self.shared.check_open()?;
        let dropped = lock(&self.cursors).remove(client_id).is_some();
        if dropped {
            self.touch();
        }
        Ok(dropped)
    }

    fn cursors(&self) -> Result<Vec<(String, u64)>> {
        Ok(lock(&self.cursors)
            .iter()
            .map(|(c, o)| (c.to_string(), *o))
            .collect())
    }

    fn share_group(&self, key: &ShareGroupKey) -> Result<Option<ShareGroupEntry>> {
        Ok(lock(&self.groups).get(key).cloned())
    }

    fn save_share_group(&self, entry: ShareGroupEntry) -> Result<()> {
        self.shared.check_open()?;
        lock(&self.groups).insert(entry.key.clone(), entry);
        self.touch();
        Ok(())
    }

    fn drop_share_group(&self, key: &ShareGroupKey) -> Result<bool> {
        self.shared.check_open()?;
        let dropped = lock(&self.groups).remove(key).is_some();
        if dropped {
            self.touch();
        }
        Ok(dropped)
    }

    fn share_groups(&self) -> Result<Vec<ShareGroupEntry>> {
        Ok(lock(&self.groups).values().cloned().collect())
    }
}

type HeldKey = (String, String, u16);

/// Exactly-once publishes held for their release, for every channel of the
/// provider. A hold counts against the provider's bound like the record it
/// will become.
pub struct MemoryHeld {
    shared: Arc<Shared>,
    provider: Weak<MemoryProvider>,
    held: Mutex<BTreeMap<HeldKey, HeldPublish>>,
}

impl std::fmt::Debug for MemoryHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryHeld")
            .field("held", &lock(&self.held).len())
            .finish()
    }
}

impl MemoryHeld {
    pub(crate) fn new(shared: Arc<Shared>, provider: Weak<MemoryProvider>) -> MemoryHeld {
        MemoryHeld {
            shared,
            provider,
            held: Mutex::new(BTreeMap::new()),
        }
    }

    /// Puts back a hold read from a snapshot, charged without asking.
    pub(crate) fn restore(&self, held: HeldPublish) {
        self.shared
            .budget
            .charge_relief(held.record.accounted_size());
        let key = (held.channel.clone(), held.client_id.clone(), held.packet_id);
        lock(&self.held).insert(key, held);
    }

    /// The holds of one channel, for its snapshot file.
    pub fn held_for(&self, channel: &str) -> Vec<HeldPublish> {
        lock(&self.held)
            .values()
            .filter(|h| h.channel == channel)
            .cloned()
            .collect()
    }

    /// Runs `copy` with every hold in hand and the holds' lock held, so no
    /// release can move a record between the holds and its channel while
    /// the two are copied: a release takes this lock before the channel's,
    /// and so does the copy.
    pub fn with_holds<T>(&self, copy: impl FnOnce(&[HeldPublish]) -> T) -> T {
        let map = lock(&self.held);
        let holds: Vec<HeldPublish> = map.values().cloned().collect();
        copy(&holds)
    }

    fn write_released(&self, channel: &str, mut record: Record) -> Result<Record> {
        record.offset = 0;
        if channel == BROADCAST_LOG_NAME {
            let provider = self.provider()?;
            return provider
                .broadcast()
                .append_inner(record, true)
                .map(|(record, _)| record);
        }
        let provider = self.provider()?;
        match provider.mem_channel(channel) {
            Some(MemChannel::Append(a)) => a.append_relief(record),
            Some(MemChannel::Queue(q)) => q.enqueue_inner(record, true),
            Some(MemChannel::Latest(l)) => {
                let topic = record.topic.clone();
                Ok(l.set_inner(record, true)?
                    .unwrap_or_else(|| Record::new(topic, bytes::Bytes::new())))
            }
            None => Err(StorageError::Invalid {
                what: format!("held publish for channel {channel}"),
                detail: "the provider holds no such channel".into(),
            }),
        }
    }

    fn provider(&self) -> Result<Arc<MemoryProvider>> {
        self.provider.upgrade().ok_or_else(|| StorageError::Closed {
            provider: self.shared.name.clone(),
        })
    }

    /// Counts a change of `channel`'s holds in the file they are kept in
    /// (under the holds' lock, which a snapshot's copy takes first).
    fn touch(&self, channel: &str) {
        if let Some(provider) = self.provider.upgrade() {
            provider.touch_channel(channel);
        }
    }
}

impl HeldPublishStore for MemoryHeld {
    fn hold(&self, mut held: HeldPublish) -> Result<()> {
        self.shared.check_open()?;
        check_hold(&held)?;
        // A held publish takes its offset at its release, never before.
        held.record.offset = 0;
        let size = held.record.accounted_size();
        let key = (held.channel.clone(), held.client_id.clone(), held.packet_id);
        let mut map = lock(&self.held);
        let old = map.get(&key).map_or(0, |h| h.record.accounted_size());
        if size > old {
            self.shared.budget.charge_publish(size - old)?;
        } else {
            self.shared.budget.give_back(old - size);
        }
        let channel = held.channel.clone();
        map.insert(key, held);
        self.touch(&channel);
        Ok(())
    }

    fn release(&self, channel: &str, client_id: &str, packet_id: u16) -> Result<Option<Record>> {
        self.shared.check_open()?;
        let key = (channel.to_owned(), client_id.to_owned(), packet_id);
        // The hold's lock is kept across the write, so the record is written
        // once and the hold goes with it: never both, never neither.
        let mut map = lock(&self.held);
        let Some(held) = map.get(&key) else {
            return Ok(None);
        };
        let stored = self.write_released(channel, held.record.clone())?;
        if let Some(h) = map.remove(&key) {
            self.shared.budget.give_back(h.record.accounted_size());
        }
        self.touch(channel);
        Ok(Some(stored))
    }

    fn drop_hold(&self, channel: &str, client_id: &str, packet_id: u16) -> Result<bool> {
        self.shared.check_open()?;
        let key = (channel.to_owned(), client_id.to_owned(), packet_id);
        let mut map = lock(&self.held);
        let removed = map.remove(&key);
        if let Some(h) = &removed {
            self.shared.budget.give_back(h.record.accounted_size());
            self.touch(channel);
        }
        Ok(removed.is_some())
    }

    fn expire_older_than(&self, cutoff: UnixNanos) -> Result<u64> {
        self.shared.check_open()?;
        let mut map = lock(&self.held);
        let before = map.len();
        let mut freed = 0;
        let mut touched = std::collections::BTreeSet::new();
        map.retain(|_, h| {
            let keep = h.held_at == 0 || h.held_at >= cutoff;
            if !keep {
                freed += h.record.accounted_size();
                touched.insert(h.channel.clone());
            }
            keep
        });
        self.shared.budget.give_back(freed);
        for channel in &touched {
            self.touch(channel);
        }
        Ok((before - map.len()) as u64)
    }

    fn held(&self) -> Result<Vec<HeldPublish>> {
        Ok(lock(&self.held).values().cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::contract::Provider;
    use saguin_format::model::ChannelKind;

    fn provider() -> Arc<MemoryProvider> {
        MemoryProvider::unbounded()
    }

    #[test]
    fn the_broadcast_log_lets_go_from_the_middle_and_never_reuses_an_offset() {
        let p = provider();
        let log = p.broadcast_log().unwrap();
        for i in 0..6 {
            log.append(Record::new("b", format!("{i}"))).unwrap();
        }
        let freed = log.release(&[2, 4, 4, 99]).unwrap();
        assert_eq!(freed.records, 2);
        let offsets: Vec<u64> = log
            .read_from_n(1, 10)
            .unwrap()
            .iter()
            .map(|r| r.offset)
            .collect();
        assert_eq!(offsets, [1, 3, 5, 6]);
        log.release(&[1, 3]).unwrap();
        assert_eq!(log.floor(), 5, "the floor is the lowest offset still held");
        assert_eq!(log.read_from_n(1, 10).unwrap()[0].offset, 5);
        log.release(&[5, 6]).unwrap();
        assert_eq!((log.floor(), log.next(), log.bytes()), (7, 7, 0));
        assert_eq!(log.append(Record::new("b", "x")).unwrap().offset, 7);
        assert!(
            log.save_cursor("c", 9).is_err(),
            "a cursor never leads the log"
        );
    }

    #[test]
    fn ending_a_session_takes_its_cursor() {
        let p = provider();
        let sessions = p.sessions().unwrap();
        let log = p.broadcast_log().unwrap();
        sessions
            .save(SessionEntry {
                client_id: "c".into(),
                principal: None,
                expiry_interval: 10,
                detached_at: 0,
                subscriptions: Vec::new(),
                will: None,
                window: 10,
                inflight: Vec::new(),
            })
            .unwrap();
        log.save_cursor("c", 1).unwrap();
        assert!(sessions.remove("c").unwrap());
        assert_eq!(log.cursor("c").unwrap(), None);
    }

    #[test]
    fn a_release_writes_the_record_once_at_the_next_offset() {
        let p = provider();
        let latest = p.open_channel("l", ChannelKind::Latest).unwrap();
        let latest = latest.as_latest().unwrap();
        let log = p.open_channel("a", ChannelKind::Append).unwrap();
        let log = log.as_append().unwrap();
        log.append(Record::new("a", "first")).unwrap();
        let held = p.held_publishes().unwrap();
        for (channel, topic) in [("a", "a/x"), ("l", "l/x")] {
            let mut r = Record::new(topic, "q2");
            r.qos = 2;
            r.offset = 42; // ignored: a hold carries no offset
            held.hold(HeldPublish {
                channel: channel.into(),
                client_id: "c".into(),
                packet_id: 3,
                held_at: 1,
                record: r,
            })
            .unwrap();
        }
        assert_eq!(held.held().unwrap()[0].record.offset, 0);
        let bytes_held = p.bytes();
        assert_eq!(held.release("a", "c", 3).unwrap().unwrap().offset, 2);
        assert_eq!(held.release("l", "c", 3).unwrap().unwrap().offset, 1);
        assert_eq!(
            p.bytes(),
            bytes_held,
            "the hold's bytes moved to the channel"
        );
        assert_eq!(latest.get("l/x").unwrap().unwrap().payload, "q2");
        assert!(held.release("a", "c", 3).unwrap().is_none());
        assert_eq!(log.next(), 3);
        let mut r = Record::new("x", "q2");
        r.qos = 2;
        held.hold(HeldPublish {
            channel: "missing".into(),
            client_id: "c".into(),
            packet_id: 1,
            held_at: 1,
            record: r,
        })
        .unwrap();
        assert!(held.release("missing", "c", 1).is_err());
        assert_eq!(
            held.held().unwrap().len(),
            1,
            "a failed release keeps the hold"
        );
    }

    #[test]
    fn the_retained_store_keeps_no_deletion_markers() {
        let p = provider();
        let retained = p.retained().unwrap();
        retained.set(Record::new("r/1", "v")).unwrap();
        retained.delete("r/1").unwrap();
        assert_eq!(retained.bytes(), 0);
        assert!(retained.match_with_deletions("#", 1).unwrap().is_empty());
    }
}
