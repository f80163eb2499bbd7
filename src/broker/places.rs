//! Places for connections under the broker's cap: each accepted connection
//! holds one until it ends, parked or not, and shutdown's drain ends when
//! the last is given back.

use std::sync::Arc;

use tokio::sync::{mpsc, Semaphore};

/// Places for connections: under `limits.max_connections`, or among the
/// few refusals. Shutdown waits for every pointer to them to go (the drain
/// sender goes with the last): the acceptors' and the connections'.
pub struct Places {
    free: Semaphore,
    _drain: mpsc::Sender<()>,
}

impl Places {
    pub fn new(places: usize, drain: &mpsc::Sender<()>) -> Arc<Places> {
        Arc::new(Places {
            free: Semaphore::new(places),
            _drain: drain.clone(),
        })
    }

    /// A place, once one is free.
    pub async fn take(self: &Arc<Self>) -> Option<Held> {
        let permit = self.free.acquire().await.ok()?;
        permit.forget();
        Some(Held(self.clone()))
    }

    /// A place if one is free now.
    pub fn try_take(self: &Arc<Self>) -> Option<Held> {
        let permit = self.free.try_acquire().ok()?;
        permit.forget();
        Some(Held(self.clone()))
    }
}

/// A connection's place, held by its task until the connection ends and
/// by the connection while it is parked: one pointer, which keeps the
/// task within 128 bytes ([`super::connection::ConnectionTask`]) and a
/// parked connection within 96.
pub struct Held(Arc<Places>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.free.add_permits(1);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A place of its own, under a cap of one.
    pub(crate) fn held() -> Held {
        let (drain, _) = mpsc::channel(1);
        Places::new(1, &drain).try_take().unwrap()
    }

    #[test]
    fn a_place_given_back_can_be_taken_again() {
        let (drain, mut drained) = mpsc::channel(1);
        let places = Places::new(1, &drain);
        drop(drain);
        let held = places.try_take().expect("one place is free");
        assert!(places.try_take().is_none(), "the cap is one");
        drop(held);
        let held = places.try_take().expect("given back");
        drop((held, places));
        // The last pointer to the places went: the drain is complete.
        assert!(drained.try_recv().is_err());
        assert!(drained.is_closed());
    }
}
