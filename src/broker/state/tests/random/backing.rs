//! What a random run keeps its channels, sessions and retained messages
//! in: a small memory provider that fills, or a sqlite file whose disk
//! fails as the run plans. A provider's life is from its open to the
//! broker's next start; a sqlite file is closed and opened again at each.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use saguin_format::model::ChannelKind;

use crate::broker::metrics::Metrics;
use crate::broker::persister::Persisters;
use crate::broker::providers::ServedChannel;
use crate::storage::contract::{ChannelStore, Provider};
use crate::storage::memory::{MemoryConfig, MemoryProvider};
use crate::storage::sqlite::vfs::{self, FileRole, Op as FileOp};
use crate::storage::sqlite::{SqliteOptions, SqliteProvider};

/// One planned failure of a sqlite file: the `nth` call of `op` on
/// `role`, and with `and_after` every call after it, fails with `errno`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fault {
    pub(super) role: FileRole,
    pub(super) op: FileOp,
    pub(super) nth: u64,
    pub(super) and_after: bool,
    pub(super) errno: i32,
}

/// A disk that fails: writes of the log that find no room (a write is
/// refused, the next may pass) or meet an I/O error (the provider fails
/// until a restart), and reads of the database that meet one. Counted
/// from each start of the broker, so each life of the file meets the same
/// plan.
pub(super) fn faults() -> impl Strategy<Value = Vec<Fault>> {
    let fault = (
        prop_oneof![
            3 => prop_oneof![Just(libc::ENOSPC), Just(libc::EIO)]
                .prop_map(|errno| (FileRole::Wal, FileOp::Write, errno)),
            1 => Just((FileRole::Db, FileOp::Read, libc::EIO)),
        ],
        1..20u64,
        proptest::bool::weighted(0.3),
    )
        .prop_map(|((role, op, errno), nth, and_after)| Fault {
            role,
            op,
            nth,
            and_after,
            errno,
        });
    proptest::collection::vec(fault, 0..3)
}

/// Where the run keeps what the broker stores.
pub(super) enum Backing {
    /// A memory provider bounded at 6 KiB, so that writes fail "full"
    /// too; what it holds survives a restart whole.
    Memory,
    /// A sqlite file in a directory of its own. Its persisters run on the
    /// run's own thread ([`Persisters::stepped`]), so that a run is the
    /// same run every time: the run decides which writes share a group,
    /// and so which call of the disk fails, not how a thread happened to
    /// gather them.
    Sqlite {
        dir: tempfile::TempDir,
        faults: Vec<Fault>,
    },
}

impl Backing {
    pub(super) fn sqlite(faults: Vec<Fault>) -> Backing {
        Backing::Sqlite {
            dir: tempfile::tempdir().expect("a temporary directory"),
            faults,
        }
    }

    /// Whether a restart opens the provider again (a sqlite file), rather
    /// than going on with the one that holds everything (memory).
    pub(super) fn reopens(&self) -> bool {
        matches!(self, Backing::Sqlite { .. })
    }

    fn file(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("saguin.db")
    }
}

/// One life of the provider: what the broker's start opened.
pub(super) struct Life {
    pub(super) provider: Arc<dyn Provider>,
    /// The append channel "telemetry", the latest channel "devices", the
    /// queue "jobs" and its dead letters, in that order.
    pub(super) stores: Vec<ChannelStore>,
    pub(super) served: Vec<ServedChannel>,
    pub(super) persisters: Persisters,
    /// The disk's plan for this life, counting once the broker has
    /// started (a start that meets a failing disk is not served).
    faults: Option<Arc<vfs::Faults>>,
}

impl Life {
    pub(super) fn open(backing: &Backing, metrics: &Arc<Metrics>) -> Life {
        let (provider, faults): (Arc<dyn Provider>, _) = match backing {
            Backing::Memory => {
                let provider = MemoryProvider::new(MemoryConfig {
                    name: "mem".into(),
                    max_bytes: Some(6 * 1024),
                    reserve: 0,
                })
                .expect("a memory provider");
                (provider, None)
            }
            Backing::Sqlite { dir, faults } => {
                let path = Backing::file(dir);
                // A plan is armed by the file's path, which must exist.
                if !path.exists() {
                    std::fs::File::create(&path).expect("the database file");
                }
                let plan = faults.iter().fold(vfs::Faults::new(), |plan, f| {
                    plan.fail(f.role, f.op, f.nth, f.and_after, f.errno)
                });
                let plan = Arc::new(plan.paused());
                vfs::register().expect("the file wrapper");
                vfs::arm(&path, Arc::clone(&plan));
                let mut options = SqliteOptions::new("db", &path);
                // The flusher's fsync and checkpoint run on a timer of
                // their own, at most once a second: the plan fails no call
                // they make (an fsync, a read of the log), which would make
                // a run different from one time to the next.
                options.flush_interval = crate::storage::sqlite::FLUSH_INTERVAL_MAX;
                options.read_connections = 1;
                options.checkpoint_room = 0;
                let provider = SqliteProvider::open(options).expect("the sqlite provider");
                (Arc::new(provider), Some(plan))
            }
        };
        let mut stores = Vec::new();
        for (name, kind) in [
            ("telemetry", ChannelKind::Append),
            ("devices", ChannelKind::Latest),
            ("jobs", ChannelKind::Queue),
        ] {
            let store = provider.open_channel(name, kind).expect("a channel");
            let dead_letter = store.as_queue().map(|q| q.dead_letter());
            stores.push(store);
            if let Some(d) = dead_letter {
                stores.push(ChannelStore::Append(d));
            }
        }
        let served: Vec<ServedChannel> = stores
            .iter()
            .map(|store| ServedChannel {
                name: store.name().into(),
                provider: provider.clone(),
                store: store.clone(),
                retention: Default::default(),
                queue: store.as_queue().map(|_| crate::config::QueueSettings {
                    lease: Duration::from_secs(30),
                    max_attempts: 3,
                    backoff: vec![Duration::from_secs(1)],
                    dlq_retention_bytes: None,
                    max_held_per_worker: 2,
                }),
            })
            .collect();
        let persisters =
            Persisters::stepped(provider.clone(), provider.clone(), &served, metrics.clone())
                .expect("the persisters");
        Life {
            provider,
            stores,
            served,
            persisters,
            faults,
        }
    }

    /// The broker has started: the disk's plan counts from here.
    pub(super) fn serving(&self) {
        if let Some(plan) = &self.faults {
            plan.start_counting();
        }
    }

    /// `look`'s answer, with the disk's plan counting none of the calls it
    /// makes: a check of the run must not change which call fails.
    pub(super) fn unplanned<T>(&self, look: impl FnOnce() -> T) -> T {
        let Some(plan) = &self.faults else {
            return look();
        };
        plan.stop_counting();
        let seen = look();
        plan.start_counting();
        seen
    }

    /// The process ends and lets go of the file. Every write handed to a
    /// persister was answered, so the file holds what a kill would leave.
    pub(super) fn close(&self) {
        if let Err(e) = self.provider.close() {
            tracing::debug!(error = %e, "closing the provider");
        }
    }
}
