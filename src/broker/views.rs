//! What the stores show the broker's components that neither write them
//! nor read their records: a channel's kind, counters and the positions
//! its readers stored ([`ChannelView`]), a provider's kind, bytes, bound
//! and health ([`ProviderView`]), read-only.
//!
//! Who holds a live store handle, and why (`docs/design.md`, "Who touches
//! storage"):
//!
//! - `providers.rs` opens every store, recovers it and closes it: the
//!   owner.
//! - `persister/` makes every write the state asks for, in the state's
//!   order (`docs/design.md` storage rule 1), and the startup's one write
//!   (a queue's spent attempts dead-lettered).
//! - `retention.rs` removes from the front of append channels: the one
//!   writer beside the persisters (storage rule 6).
//! - `reader.rs` reads records off the broker task; `snapshots.rs`
//!   captures a memory provider's stores for its background generations.
//!
//! Everything else - the metrics' gauges and `/readyz`, the bridges'
//! stored positions and lag, the startup's restore of positions - sees a
//! view, which can do nothing but read a counter, a position or a health:
//! a component holding one cannot write by mistake, and a component that
//! needs more than a view gives is a design decision, not an import.

use saguin_format::model::ChannelKind;

use std::sync::{Arc, Weak};

use crate::storage::contract::{
    ChannelStore, Health, Position, Provider, ProviderKind, Reader, Result,
};

/// A read-only look at one served channel's store.
#[derive(Clone)]
pub struct ChannelView {
    store: ChannelStore,
}

/// An append or a latest channel's counters at one reading: the
/// `saguin_channel_*` gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelCounters {
    /// Records held; on a latest channel, topics holding a value.
    pub records: u64,
    pub bytes: u64,
    pub next: u64,
    pub floor: u64,
}

impl ChannelView {
    pub fn of(store: &ChannelStore) -> ChannelView {
        ChannelView {
            store: store.clone(),
        }
    }

    pub fn name(&self) -> &str {
        self.store.name()
    }

    pub fn kind(&self) -> ChannelKind {
        self.store.kind()
    }

    /// The offset the channel's next record takes.
    pub fn next(&self) -> u64 {
        self.store.next()
    }

    /// `next` and `floor`; `None` for a queue, whose records leave from
    /// anywhere and which no reader follows.
    pub fn bounds(&self) -> Option<(u64, u64)> {
        let offsets = self.store.offsets()?;
        Some((offsets.next(), offsets.floor()))
    }

    /// The counters of an append or a latest channel; `None` for a queue.
    pub fn counters(&self) -> Option<ChannelCounters> {
        let offsets = self.store.offsets()?;
        Some(ChannelCounters {
            records: offsets.record_count(),
            bytes: offsets.bytes(),
            next: offsets.next(),
            floor: offsets.floor(),
        })
    }

    /// A queue's unresolved records; `None` for the other kinds.
    pub fn queue_depth(&self) -> Option<u64> {
        self.store.as_queue().map(|q| q.depth())
    }

    /// The position `reader` stored; none in a queue.
    pub fn position(&self, reader: &Reader) -> Result<Option<Position>> {
        match self.store.offsets() {
            Some(offsets) => offsets.position(reader),
            None => Ok(None),
        }
    }

    /// Every stored position, ordered by reader; none in a queue.
    pub fn positions(&self) -> Result<Vec<Position>> {
        match self.store.offsets() {
            Some(offsets) => offsets.positions(),
            None => Ok(Vec::new()),
        }
    }
}

impl std::fmt::Debug for ChannelView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChannelView({:?})", self.store)
    }
}

/// A read-only look at one provider, held weakly: a provider closed and
/// dropped reads as gone, never kept alive by its metrics.
#[derive(Clone)]
pub struct ProviderView {
    provider: Weak<dyn Provider>,
}

/// A provider's gauges at one reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderGauges {
    pub kind: ProviderKind,
    /// Bytes counted against its bound (`saguin_provider_bytes`).
    pub bytes: u64,
    /// Its bound; `None` is unbounded.
    pub max_bytes: Option<u64>,
    /// Whether the disk under it takes writes.
    pub health: Health,
    /// The checkpoint's room it holds; `None` when it keeps none.
    pub checkpoint_room: Option<crate::storage::contract::CheckpointRoom>,
}

impl ProviderView {
    pub fn of(provider: &Arc<dyn Provider>) -> ProviderView {
        ProviderView {
            provider: Arc::downgrade(provider),
        }
    }

    /// Its gauges now; `None` once the provider is gone.
    pub fn read(&self) -> Option<ProviderGauges> {
        let provider = self.provider.upgrade()?;
        Some(ProviderGauges {
            kind: provider.kind(),
            bytes: provider.bytes(),
            max_bytes: provider.max_bytes(),
            health: provider.health(),
            checkpoint_room: provider.checkpoint_room(),
        })
    }

    /// Its health now; a provider that is gone writes nothing and fails
    /// nothing, and reads as writing.
    pub fn health(&self) -> Health {
        self.provider
            .upgrade()
            .map_or(Health::Writing, |p| p.health())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::contract::{Provider, ReaderScheme};
    use crate::storage::memory::{MemoryConfig, MemoryProvider};
    use saguin_format::model::Record;

    fn provider() -> Arc<MemoryProvider> {
        MemoryProvider::unbounded()
    }

    #[test]
    fn an_append_channel_shows_its_counters_and_positions() {
        let provider = provider();
        let store = provider
            .open_channel("telemetry", ChannelKind::Append)
            .expect("open");
        let append = store.as_append().expect("append");
        for i in 0..3 {
            append
                .append(Record::new("telemetry/a", format!("r{i}")))
                .expect("append");
        }
        append.trim(2, None).expect("trim");
        let reader = Reader::bridge("cloud").expect("reader");
        append
            .save_position(Position {
                reader: reader.clone(),
                offset: 3,
                saved_at: 1,
                session_expiry: None,
            })
            .expect("save");
        let view = ChannelView::of(&store);
        assert_eq!(view.kind(), ChannelKind::Append);
        assert_eq!(view.name(), "telemetry");
        assert_eq!(view.bounds(), Some((4, 2)));
        let counters = view.counters().expect("counters");
        assert_eq!((counters.records, counters.next, counters.floor), (2, 4, 2));
        assert_eq!(counters.bytes, append.bytes());
        assert_eq!(view.queue_depth(), None);
        let stored = view.position(&reader).expect("read").expect("stored");
        assert_eq!(stored.offset, 3);
        assert_eq!(stored.reader.scheme(), ReaderScheme::Bridge);
        assert_eq!(view.positions().expect("read").len(), 1);
    }

    #[test]
    fn a_provider_shows_its_gauges_while_it_lives() {
        let provider: Arc<dyn Provider> = MemoryProvider::new(MemoryConfig {
            name: "mem".into(),
            max_bytes: Some(1 << 20),
            reserve: 1024,
        })
        .expect("a memory provider");
        provider
            .open_channel("telemetry", ChannelKind::Append)
            .expect("open")
            .as_append()
            .expect("append")
            .append(Record::new("telemetry/a", "x"))
            .expect("append");
        let view = ProviderView::of(&provider);
        let gauges = view.read().expect("alive");
        assert_eq!(gauges.kind, ProviderKind::Memory);
        assert_eq!(gauges.bytes, provider.bytes());
        assert!(gauges.bytes > 0);
        assert_eq!(gauges.max_bytes, Some(1 << 20));
        assert_eq!(gauges.health, Health::Writing);
        drop(provider);
        assert_eq!(view.read(), None, "a view keeps no provider alive");
        assert_eq!(view.health(), Health::Writing);
    }

    #[test]
    fn a_queue_shows_its_depth_and_no_positions() {
        let provider = provider();
        let store = provider
            .open_channel("jobs", ChannelKind::Queue)
            .expect("open");
        store
            .as_queue()
            .expect("queue")
            .enqueue(Record::new("jobs/a", "x"))
            .expect("enqueue");
        let view = ChannelView::of(&store);
        assert_eq!(view.kind(), ChannelKind::Queue);
        assert_eq!(view.next(), 2);
        assert_eq!(view.queue_depth(), Some(1));
        assert_eq!(view.bounds(), None);
        assert_eq!(view.counters(), None);
        let reader = Reader::mqtt("worker").expect("reader");
        assert_eq!(view.position(&reader).expect("read"), None);
        assert!(view.positions().expect("read").is_empty());
    }
}
