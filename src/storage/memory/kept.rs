//! A memory store's records as a copy for a snapshot takes them.

use std::collections::VecDeque;

use saguin_format::model::Record;

use crate::storage::contract::RecordParts;
use crate::storage::kept::Kept;

/// An append channel's records as a copy for a snapshot takes them: handles
/// on what the store keeps, in offset order, so a copy costs a walk of
/// pointers where it is taken, and each record is rebuilt where it is
/// written.
#[derive(Clone, Debug, Default)]
pub struct KeptRecords(VecDeque<Kept>);

impl KeptRecords {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each record's parts, lent, in offset order.
    pub fn parts(&self) -> impl Iterator<Item = RecordParts<'_>> {
        self.0.iter().map(|k| k.parts())
    }

    /// Every record, rebuilt, in offset order.
    pub fn to_vec(&self) -> Vec<Record> {
        self.0.iter().map(|k| k.record()).collect()
    }

    /// Lets go of the records below `floor`.
    pub(crate) fn drop_below(&mut self, floor: u64) {
        while self.0.front().is_some_and(|k| k.offset < floor) {
            self.0.pop_front();
        }
    }

    /// Moves `later`'s records, which follow these, to the end of these.
    pub(crate) fn append(&mut self, later: &mut KeptRecords) {
        self.0.append(&mut later.0);
    }
}

impl From<Vec<Kept>> for KeptRecords {
    fn from(handles: Vec<Kept>) -> Self {
        KeptRecords(handles.into())
    }
}

impl From<Vec<Record>> for KeptRecords {
    fn from(records: Vec<Record>) -> Self {
        KeptRecords(kept_all(records))
    }
}

/// Each record kept compact, each let go once its copy is made.
pub(crate) fn kept_all<C: FromIterator<Kept>>(records: Vec<Record>) -> C {
    records.into_iter().map(|r| Kept::new(&r)).collect()
}
