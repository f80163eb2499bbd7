//! The memory provider: stores in memory behind fine-grained locks, one
//! provider-wide byte counter, and a snapshot directory written as
//! generations (`format/FORMAT.md` §4): each store counts its changes
//! ([`Version`]), so a generation writes only the stores that changed.
//!
//! Locks: the provider's channel map is taken only to find or create a
//! store. Each store has its own lock for records and counters and another
//! for positions. A queue's lock is taken before its dead-letter channel's
//! and nothing takes them in the other order, so the dead-letter move is
//! atomic without a cycle to deadlock on.

mod append;
mod budget;
mod kept;
mod latest;
mod load;
mod positions;
mod queue;
mod session;
mod slots;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use saguin_format::model::ChannelKind;

pub use append::{AppendCopy, MemoryAppend};
pub use budget::Budget;
pub use kept::KeptRecords;
pub use latest::{LatestCopy, MemoryLatest};
pub use load::{LoadError, LoadOptions, LoadProblem, LoadReport, LoadedChannel};
pub use queue::{MemoryQueue, QueueCopy};
pub use session::{BroadcastCopy, MemoryBroadcast, MemoryHeld, MemorySessions};

/// One channel's state copied for a snapshot.
#[derive(Clone, Debug)]
pub enum MemChannelCopy {
    Append(AppendCopy),
    Latest(LatestCopy),
    /// A queue with its dead-letter channel, copied together.
    Queue(QueueCopy, AppendCopy),
}

use super::contract::{
    self, dead_letter_name, BroadcastLog, ChannelStore, HeldPublishStore, LatestStore, OffsetStore,
    Provider, ProviderKind, Result, SessionStore, StorageError, BROADCAST_LOG_NAME,
    RETAINED_STORE_NAME,
};

/// How a memory provider is configured.
#[derive(Clone, Debug)]
pub struct MemoryConfig {
    /// The provider's name in the configuration.
    pub name: String,
    /// The provider's bound; `None` is unbounded.
    pub max_bytes: Option<u64>,
    /// One largest record with its headers (limits.max_message_size +
    /// limits.max_header_bytes), held back from publishes.
    pub reserve: u64,
}

/// One store of the provider, by kind.
#[derive(Clone)]
pub(crate) enum MemChannel {
    Append(Arc<MemoryAppend>),
    Latest(Arc<MemoryLatest>),
    Queue(Arc<MemoryQueue>),
}

impl MemChannel {
    /// Whether it is a store of its own: a queue's dead-letter channel is
    /// copied and written with its queue.
    fn stored_alone(&self) -> bool {
        !matches!(self, MemChannel::Append(a) if a.is_dead_letter())
    }

    fn kind(&self) -> ChannelKind {
        match self {
            MemChannel::Append(_) => ChannelKind::Append,
            MemChannel::Latest(_) => ChannelKind::Latest,
            MemChannel::Queue(_) => ChannelKind::Queue,
        }
    }

    /// How many times what its file holds has changed.
    fn version(&self) -> u64 {
        match self {
            MemChannel::Append(s) => s.version(),
            MemChannel::Latest(s) => s.version(),
            MemChannel::Queue(s) => s.version(),
        }
    }

    fn to_store(&self) -> ChannelStore {
        match self {
            MemChannel::Append(s) => ChannelStore::Append(s.clone()),
            MemChannel::Latest(s) => ChannelStore::Latest(s.clone()),
            MemChannel::Queue(s) => ChannelStore::Queue(s.clone()),
        }
    }
}

/// A channel as a walk over the provider's channels meets it, in name
/// order (a queue's dead-letter channel is met with its queue).
pub struct MetChannel<'a> {
    pub name: &'a str,
    channel: &'a MemChannel,
}

impl MetChannel<'_> {
    /// How many times what its file holds has changed (a queue's counts
    /// its dead-letter channel's changes).
    pub fn version(&self) -> u64 {
        self.channel.version()
    }

    /// Whether it is the channel `known` holds: one comparison of
    /// pointers, where its name is a string in memory a walk over 10,000
    /// channels would touch for each.
    pub fn is(&self, known: &KnownChannel) -> bool {
        match (self.channel, &known.0) {
            (MemChannel::Append(a), MemChannel::Append(b)) => Arc::ptr_eq(a, b),
            (MemChannel::Latest(a), MemChannel::Latest(b)) => Arc::ptr_eq(a, b),
            (MemChannel::Queue(a), MemChannel::Queue(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// It, held to be known again by a later walk.
    pub fn known(&self) -> KnownChannel {
        KnownChannel(self.channel.clone())
    }
}

/// A channel held to be known again ([`MetChannel::is`]). Held, its
/// store is never freed and another made in its place; and the provider
/// removes no channel, so the one it holds is the one its name names.
#[derive(Clone)]
pub struct KnownChannel(MemChannel);

impl fmt::Debug for KnownChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("KnownChannel").field(&self.0.kind()).finish()
    }
}

/// Admits a record of `size` bytes to channel `channel`, which holds
/// `held` under its own bound `max_bytes`: a publish must fit that bound
/// and is asked of the provider's budget; a relief write (a dead-letter
/// move, a held publish's release) is charged, not asked, and no channel
/// bound applies to it.
pub(crate) fn admit(
    shared: &Shared,
    channel: &str,
    held: u64,
    max_bytes: Option<u64>,
    size: u64,
    relief: bool,
) -> Result<()> {
    if relief {
        shared.budget.charge_relief(size);
        return Ok(());
    }
    contract::check_room(channel, held, max_bytes, size)?;
    shared.budget.charge_publish(size)
}

/// What every store of one provider shares: its name, its byte counter,
/// whether it was closed and how many changes its stores have had.
#[derive(Debug)]
pub(crate) struct Shared {
    pub name: String,
    pub budget: Budget,
    pub closed: AtomicBool,
    /// Every change of every store, counted: a snapshot writer looking at
    /// it learns that something changed without looking at each store.
    pub changes: AtomicU64,
}

/// How many times one store's kept state has changed. A snapshot
/// generation rewrites a store's file only when its version moved since
/// the file was written.
///
/// Ordering: a change is made, then the version bumped; a copy reads the
/// version, then the state. So a copy holds at least every change the
/// version it read counts: at worst it holds more, and the store is
/// written once more at the next generation, never once less.
#[derive(Debug, Default)]
pub(crate) struct Version(AtomicU64);

impl Version {
    /// One more change, of the store and of its provider.
    pub fn bump(&self, shared: &Shared) {
        self.0.fetch_add(1, Ordering::Release);
        shared.changes.fetch_add(1, Ordering::Release);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

impl Shared {
    /// Refuses a write once the provider was closed.
    pub fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StorageError::Closed {
                provider: self.name.clone(),
            });
        }
        Ok(())
    }
}

/// The memory provider.
pub struct MemoryProvider {
    shared: Arc<Shared>,
    /// Channels by name, sorted (the snapshot writes them in this order).
    channels: RwLock<BTreeMap<String, MemChannel>>,
    retained: Arc<MemoryLatest>,
    sessions: Arc<MemorySessions>,
    broadcast: Arc<MemoryBroadcast>,
    held: Arc<MemoryHeld>,
}

impl MemoryProvider {
    /// A provider holding nothing. A bound below twice the reserve is
    /// refused naming both numbers.
    pub fn new(config: MemoryConfig) -> Result<Arc<MemoryProvider>> {
        if let Some(max) = config.max_bytes {
            if max < config.reserve.saturating_mul(2) {
                return Err(StorageError::Invalid {
                    what: format!("provider {}: max_bytes", config.name),
                    detail: format!(
                        "{max} bytes is below twice the reserve of {} bytes (one largest record with its headers); give it at least {}",
                        config.reserve,
                        config.reserve.saturating_mul(2)
                    ),
                });
            }
        }
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            budget: Budget::new(config.name.clone(), config.max_bytes, config.reserve),
            closed: AtomicBool::new(false),
            changes: AtomicU64::new(0),
        });
        let broadcast = Arc::new(MemoryBroadcast::new(shared.clone()));
        let sessions = Arc::new(MemorySessions::new(shared.clone(), broadcast.clone()));
        Ok(Arc::new_cyclic(|weak| MemoryProvider {
            retained: Arc::new(MemoryLatest::new(RETAINED_STORE_NAME, shared.clone())),
            held: Arc::new(MemoryHeld::new(shared.clone(), weak.clone())),
            shared,
            channels: RwLock::new(BTreeMap::new()),
            sessions,
            broadcast,
        }))
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The provider's byte counter.
    pub fn budget(&self) -> &Budget {
        &self.shared.budget
    }

    /// How many changes its stores have had since it was made: a snapshot
    /// writer compares two readings to learn whether anything changed.
    pub fn changes(&self) -> u64 {
        self.shared.changes.load(Ordering::Acquire)
    }

    /// Marks the file of `channel` (a channel, or the broadcast log's
    /// reserved name) changed: what a held publish's hold or drop does to
    /// the file it is written in.
    pub(crate) fn touch_channel(&self, channel: &str) {
        if channel == BROADCAST_LOG_NAME {
            self.broadcast.touch();
            return;
        }
        match self.mem_channel(channel) {
            Some(MemChannel::Append(a)) => a.touch(),
            Some(MemChannel::Latest(l)) => l.touch(),
            Some(MemChannel::Queue(q)) => q.touch(),
            // A hold for a channel this provider does not hold is in no
            // file of its own; the count still moves, so a generation runs.
            None => {
                self.shared.changes.fetch_add(1, Ordering::Release);
            }
        }
    }

    /// Copies the channels `wanted` says yes to, asked of each as the walk
    /// over them in name order meets it, each under its own lock
    /// (counters, positions and shared record handles, no record copied:
    /// the first phase of a snapshot): `Some(from)` copies an append
    /// channel's records from offset `from` only (0: all of them; the
    /// other kinds are copied whole), `None` leaves the channel out. The
    /// copies are in the order `wanted` chose them.
    pub fn copy_channels_where(
        &self,
        mut wanted: impl FnMut(MetChannel<'_>) -> Option<u64>,
    ) -> Vec<MemChannelCopy> {
        // Asked under the map's lock, each name borrowed: a generation
        // looks at every channel, and copies the few that changed.
        let chosen: Vec<(u64, MemChannel)> = read(&self.channels)
            .iter()
            .filter(|(_, c)| c.stored_alone())
            .filter_map(|(name, channel)| {
                wanted(MetChannel { name, channel }).map(|from| (from, channel.clone()))
            })
            .collect();
        chosen
            .into_iter()
            .map(|(from, c)| match c {
                MemChannel::Append(a) if from > 0 => MemChannelCopy::Append(a.copy_since(from)),
                MemChannel::Append(a) => MemChannelCopy::Append(a.copy_state()),
                MemChannel::Latest(l) => MemChannelCopy::Latest(l.copy_state()),
                MemChannel::Queue(q) => {
                    let (copy, dlq) = q.copy_with_dead_letter();
                    MemChannelCopy::Queue(copy, dlq)
                }
            })
            .collect()
    }

    /// Meets every channel, in name order, under the map's lock.
    pub fn meet_channels(&self, mut met: impl FnMut(MetChannel<'_>)) {
        for (name, channel) in read(&self.channels).iter() {
            if channel.stored_alone() {
                met(MetChannel { name, channel });
            }
        }
    }

    pub(crate) fn mem_channel(&self, name: &str) -> Option<MemChannel> {
        read(&self.channels).get(name).cloned()
    }

    pub fn retained_store(&self) -> &Arc<MemoryLatest> {
        &self.retained
    }

    pub fn session_store(&self) -> &Arc<MemorySessions> {
        &self.sessions
    }

    pub fn broadcast(&self) -> &Arc<MemoryBroadcast> {
        &self.broadcast
    }

    pub fn held(&self) -> &Arc<MemoryHeld> {
        &self.held
    }

    /// Installs a store built by a loader. Refused if the name is taken.
    pub(crate) fn install(&self, name: &str, channel: MemChannel) -> Result<()> {
        let mut map = write(&self.channels);
        if map.contains_key(name) {
            return Err(StorageError::Invalid {
                what: format!("channel {name}"),
                detail: "loaded twice".into(),
            });
        }
        if let MemChannel::Queue(q) = &channel {
            map.insert(
                q.dead_letter_store().name().to_owned(),
                MemChannel::Append(q.dead_letter_store().clone()),
            );
        }
        map.insert(name.to_owned(), channel);
        Ok(())
    }

    fn open_mem(&self, name: &str, kind: ChannelKind) -> Result<MemChannel> {
        if let Some(existing) = read(&self.channels).get(name) {
            return check_kind(name, kind, existing.clone());
        }
        if name == RETAINED_STORE_NAME || name == BROADCAST_LOG_NAME {
            return Err(StorageError::Invalid {
                what: format!("channel {name}"),
                detail: "the name is reserved for the provider's own stores".into(),
            });
        }
        let mut map = write(&self.channels);
        // Another caller may have created it between the two locks.
        if let Some(existing) = map.get(name) {
            return check_kind(name, kind, existing.clone());
        }
        let channel = match kind {
            ChannelKind::Append => {
                MemChannel::Append(Arc::new(MemoryAppend::new(name, self.shared.clone())))
            }
            ChannelKind::Latest => {
                MemChannel::Latest(Arc::new(MemoryLatest::new(name, self.shared.clone())))
            }
            ChannelKind::Queue => {
                let dlq_name = dead_letter_name(name);
                let dlq = match map.get(&dlq_name) {
                    Some(MemChannel::Append(a)) if a.is_dead_letter() => a.clone(),
                    Some(MemChannel::Append(_)) => {
                        return Err(StorageError::Invalid {
                            what: format!("queue {name}"),
                            detail: format!(
                                "{dlq_name} is already an append channel of its own; a queue's dead-letter channel is kept with its queue"
                            ),
                        })
                    }
                    Some(other) => {
                        return Err(StorageError::KindMismatch {
                            channel: dlq_name,
                            configured: ChannelKind::Append,
                            stored: other.kind(),
                        })
                    }
                    None => {
                        let a = Arc::new(MemoryAppend::new_dead_letter(
                            &dlq_name,
                            self.shared.clone(),
                        ));
                        map.insert(dlq_name, MemChannel::Append(a.clone()));
                        a
                    }
                };
                MemChannel::Queue(Arc::new(MemoryQueue::new(name, self.shared.clone(), dlq)))
            }
        };
        map.insert(name.to_owned(), channel.clone());
        Ok(channel)
    }
}

fn check_kind(name: &str, kind: ChannelKind, existing: MemChannel) -> Result<MemChannel> {
    if existing.kind() != kind {
        return Err(StorageError::KindMismatch {
            channel: name.to_owned(),
            configured: kind,
            stored: existing.kind(),
        });
    }
    Ok(existing)
}

impl Provider for MemoryProvider {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn kind(&self) -> ProviderKind {
        ProviderKind::Memory
    }

    fn open_channel(&self, name: &str, kind: ChannelKind) -> Result<ChannelStore> {
        self.shared.check_open()?;
        Ok(self.open_mem(name, kind)?.to_store())
    }

    fn channels(&self) -> Vec<(String, ChannelKind)> {
        read(&self.channels)
            .iter()
            .map(|(n, c)| (n.clone(), c.kind()))
            .collect()
    }

    fn bytes(&self) -> u64 {
        self.shared.budget.used()
    }

    fn max_bytes(&self) -> Option<u64> {
        self.shared.budget.max()
    }

    fn reserve(&self) -> u64 {
        self.shared.budget.reserve()
    }

    fn retained(&self) -> Result<Arc<dyn LatestStore>> {
        Ok(self.retained.clone())
    }

    fn sessions(&self) -> Result<Arc<dyn SessionStore>> {
        Ok(self.sessions.clone())
    }

    fn broadcast_log(&self) -> Result<Arc<dyn BroadcastLog>> {
        Ok(self.broadcast.clone())
    }

    fn held_publishes(&self) -> Result<Arc<dyn HeldPublishStore>> {
        Ok(self.held.clone())
    }

    fn close(&self) -> Result<()> {
        self.shared.closed.store(true, Ordering::Release);
        Ok(())
    }
}

// A lock poisoned by a panic elsewhere still guards consistent data: every
// mutation here completes its bookkeeping before anything that can panic,
// so the guard is taken back rather than turning one panic into many.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
impl MemoryProvider {
    /// An unbounded provider named `mem`: what most tests store into.
    pub(crate) fn unbounded() -> Arc<MemoryProvider> {
        MemoryProvider::new(MemoryConfig {
            name: "mem".into(),
            max_bytes: None,
            reserve: 0,
        })
        .unwrap_or_else(|e| panic!("an unbounded provider: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use saguin_format::model::Record;

    use super::*;
    use crate::storage::contract::HeldPublish;

    fn bounded(max: u64, reserve: u64) -> Arc<MemoryProvider> {
        MemoryProvider::new(MemoryConfig {
            name: "mem".into(),
            max_bytes: Some(max),
            reserve,
        })
        .unwrap()
    }

    #[test]
    fn a_bound_below_twice_the_reserve_is_refused_naming_both() {
        let e = MemoryProvider::new(MemoryConfig {
            name: "mem".into(),
            max_bytes: Some(100),
            reserve: 60,
        })
        .err()
        .unwrap();
        let text = e.to_string();
        assert!(text.contains("100") && text.contains("60"), "{text}");
    }

    #[test]
    fn channels_share_one_counter_and_removal_gives_bytes_back() {
        let p = bounded(100, 20);
        let a = p.open_channel("a", ChannelKind::Append).unwrap();
        let b = p.open_channel("b", ChannelKind::Latest).unwrap();
        let a = a.as_append().unwrap();
        let b = b.as_latest().unwrap();
        a.append(Record::new("a", vec![0; 39])).unwrap(); // 40 bytes
        b.set(Record::new("b", vec![0; 39])).unwrap(); // 40 bytes
        assert_eq!(p.bytes(), 80);
        let e = a.append(Record::new("a", vec![0; 0])).unwrap_err();
        assert!(e.is_full() && e.mqtt_reason_code() == 0x97, "{e}");
        // Replacing a value charges only the difference.
        b.set(Record::new("b", vec![0; 9])).unwrap();
        assert_eq!(p.bytes(), 50);
        a.trim(a.next(), None).unwrap();
        assert_eq!(p.bytes(), 10);
        assert_eq!(a.bytes(), 0);
    }

    #[test]
    fn relief_goes_into_the_reserve_and_publishes_do_not() {
        let p = bounded(1000, 400);
        let q = p.open_channel("jobs", ChannelKind::Queue).unwrap();
        let q = q.as_queue().unwrap();
        q.set_max_attempts(1);
        q.enqueue(Record::new("jobs", vec![0; 550])).unwrap(); // 554 bytes
        assert!(q.enqueue(Record::new("jobs", vec![0; 50])).is_err());
        let lease = q.lease(1, "w", 10, 1).unwrap();
        // The dead-letter move adds headers: it is charged, never refused,
        // and lands in the reserve, inside the operator's figure.
        let moved = q
            .release(lease.delivery_id, lease.epoch, 2, "nack")
            .unwrap();
        assert!(matches!(
            moved,
            crate::storage::contract::Released::DeadLettered { .. }
        ));
        assert!(p.bytes() > 600 && p.bytes() <= 1000, "{}", p.bytes());
        assert_eq!(q.depth(), 0);
    }

    #[test]
    fn a_closed_provider_refuses_writes() {
        let p = bounded(1000, 10);
        let a = p.open_channel("a", ChannelKind::Append).unwrap();
        p.close().unwrap();
        let e = a
            .as_append()
            .unwrap()
            .append(Record::new("a", "x"))
            .unwrap_err();
        assert!(matches!(e, StorageError::Closed { .. }), "{e}");
        assert!(p.open_channel("b", ChannelKind::Append).is_err());
        let mut rec = Record::new("a", "x");
        rec.qos = 2;
        let hold = HeldPublish {
            channel: "a".into(),
            client_id: "c".into(),
            packet_id: 1,
            held_at: 1,
            record: rec,
        };
        assert!(p.held_publishes().unwrap().hold(hold).is_err());
    }

    #[test]
    fn removed_records_stop_being_reachable() {
        let p = bounded(10_000, 10);
        let a = p.open_channel("a", ChannelKind::Append).unwrap();
        let a = a.as_append().unwrap();
        let payload = bytes::Bytes::from(vec![1u8; 100]);
        for _ in 0..10 {
            a.append(Record::new("a", payload.clone())).unwrap();
        }
        assert_eq!(payload.len(), 100);
        a.trim(11, None).unwrap();
        // Every stored copy was cleared as it was removed: only the test's
        // own handle on the bytes is left.
        let copy = payload.clone();
        drop(payload);
        assert!(copy.is_unique(), "a removed record is still held");
    }

    #[test]
    fn two_channels_racing_for_the_last_room_are_not_both_told_yes() {
        // Room for exactly 100 records of 10 bytes below the reserve.
        let p = bounded(1000 + 100, 100);
        let stores: Vec<_> = ["a", "b"]
            .iter()
            .map(|n| p.open_channel(n, ChannelKind::Append).unwrap())
            .collect();
        let threads: Vec<_> = stores
            .into_iter()
            .map(|s| {
                std::thread::spawn(move || {
                    let a = s.as_append().unwrap();
                    (0..100)
                        .filter(|_| a.append(Record::new("x", vec![0; 9])).is_ok())
                        .count()
                })
            })
            .collect();
        let stored: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(stored, 100);
        assert_eq!(p.bytes(), 1000);
    }
}
