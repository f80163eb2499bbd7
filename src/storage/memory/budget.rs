//! The memory provider's bound: one counter shared by its channels.
//!
//! Reserving and checking are one compare-and-swap, so two channels cannot
//! both be told yes for the last of the room. A publish may use the bound
//! less the reserve; a relief operation (an acknowledgement, a stored
//! position, the dead-letter move, a held publish's release) charges the
//! counter without asking, and the reserve keeps that overshoot inside the
//! operator's figure. Every removal gives its bytes back.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::storage::contract::{Result, StorageError};

#[derive(Debug)]
pub struct Budget {
    provider: String,
    used: AtomicU64,
    max: Option<u64>,
    reserve: u64,
}

impl Budget {
    pub fn new(provider: String, max: Option<u64>, reserve: u64) -> Budget {
        Budget {
            provider,
            used: AtomicU64::new(0),
            max,
            reserve,
        }
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    pub fn max(&self) -> Option<u64> {
        self.max
    }

    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// The most a publish may bring the counter to.
    pub fn publish_limit(&self) -> Option<u64> {
        self.max.map(|m| m.saturating_sub(self.reserve))
    }

    /// Takes `size` bytes for a publish, or refuses with
    /// [`StorageError::ProviderFull`] and takes nothing.
    pub fn charge_publish(&self, size: u64) -> Result<()> {
        let Some(limit) = self.publish_limit() else {
            self.used.fetch_add(size, Ordering::AcqRel);
            return Ok(());
        };
        let mut current = self.used.load(Ordering::Acquire);
        loop {
            let wanted = current.saturating_add(size);
            if wanted > limit {
                return Err(StorageError::ProviderFull {
                    provider: self.provider.clone(),
                    size,
                    used: current,
                    limit,
                });
            }
            match self.used.compare_exchange_weak(
                current,
                wanted,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(seen) => current = seen,
            }
        }
    }

    /// Takes `size` bytes for a relief operation, which is never refused.
    pub fn charge_relief(&self, size: u64) {
        self.used.fetch_add(size, Ordering::AcqRel);
    }

    /// Gives `size` bytes back.
    pub fn give_back(&self, size: u64) {
        let mut current = self.used.load(Ordering::Acquire);
        loop {
            let wanted = current.saturating_sub(size);
            match self.used.compare_exchange_weak(
                current,
                wanted,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn publishes_stop_at_the_reserve_and_relief_goes_past_it() {
        let b = Budget::new("mem".into(), Some(100), 30);
        b.charge_publish(70).unwrap();
        let e = b.charge_publish(1).unwrap_err();
        assert!(e.is_full(), "{e}");
        b.charge_relief(20);
        assert_eq!(b.used(), 90);
        b.give_back(50);
        b.charge_publish(30).unwrap();
        assert_eq!(b.used(), 70);
    }

    #[test]
    fn the_last_room_is_given_once() {
        // Many threads race for room that fits exactly half of them.
        let b = Arc::new(Budget::new("mem".into(), Some(1000 + 10), 10));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || (0..50).filter(|_| b.charge_publish(5).is_ok()).count())
            })
            .collect();
        let granted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(granted, 200);
        assert_eq!(b.used(), 1000);
    }
}
