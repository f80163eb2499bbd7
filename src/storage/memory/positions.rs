//! A channel's stored reader positions in memory: what append and latest
//! channels keep alike.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{lock, Shared, Version};
use crate::storage::contract::{check_position, Position, Reader, Result};

#[derive(Debug, Default)]
pub(crate) struct PositionBook {
    by_reader: Mutex<BTreeMap<Reader, Position>>,
}

impl PositionBook {
    /// A book holding `positions` as they were restored.
    pub fn restored(positions: Vec<Position>) -> PositionBook {
        PositionBook {
            by_reader: Mutex::new(
                positions
                    .into_iter()
                    .map(|p| (p.reader.clone(), p))
                    .collect(),
            ),
        }
    }

    pub fn get(&self, reader: &Reader) -> Result<Option<Position>> {
        Ok(lock(&self.by_reader).get(reader).cloned())
    }

    /// Stores `position` of channel `channel`, whose next offset is `next`,
    /// counting the change in the channel's `version`.
    pub fn save(
        &self,
        shared: &Shared,
        version: &Version,
        channel: &str,
        position: Position,
        next: u64,
    ) -> Result<()> {
        shared.check_open()?;
        check_position(channel, &position, next)?;
        let mut by_reader = lock(&self.by_reader);
        let previous = by_reader.insert(position.reader.clone(), position.clone());
        // Saving the same place again changes nothing a file holds.
        if previous.as_ref() != Some(&position) {
            version.bump(shared);
        }
        Ok(())
    }

    pub fn drop_reader(&self, shared: &Shared, version: &Version, reader: &Reader) -> Result<bool> {
        shared.check_open()?;
        let dropped = lock(&self.by_reader).remove(reader).is_some();
        if dropped {
            version.bump(shared);
        }
        Ok(dropped)
    }

    pub fn all(&self) -> Result<Vec<Position>> {
        Ok(lock(&self.by_reader).values().cloned().collect())
    }

    /// Every position, for a snapshot's copy.
    pub fn copy(&self) -> Vec<Position> {
        lock(&self.by_reader).values().cloned().collect()
    }

    pub fn lowest(&self) -> Option<u64> {
        lock(&self.by_reader).values().map(|p| p.offset).min()
    }
}
