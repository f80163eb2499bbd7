//! Quiet connections parked off the runtime, in a poll set of the
//! broker's own, until their client speaks, the state queues them a
//! packet, or the keep-alive timer has a word for them.
//!
//! Why. A connection served by a task holds the task (128 B), its state
//! with the transport (256 B), the runtime's registration of its socket
//! (256 B) and the read order's stamp (80 B) whether its client speaks or
//! not, and most of an edge broker's clients are devices that say
//! nothing for minutes. A parked connection holds what it needs to be
//! served again (its socket, the state's link, the few fields its task
//! cannot make afresh: about 120 B) in a slot of the lot, one waker (32
//! B) in its link, and its socket in the lot's poll set, which the kernel
//! keeps.
//!
//! How. The keep-alive timer tells a connection to park
//! ([`super::link::ConnectionLink::tell_park`]) once its client has been
//! quiet a while. Its task, finding nothing to do, reserves a slot,
//! hands its link a waker for that slot (in the lock in which the link
//! finds nothing queued, so a packet the state queues from then on wakes
//! the slot and is never stranded), moves what it needs into the slot and
//! ends; the socket goes into the lot's poll set. Whatever comes first
//! resumes it: the socket readable or hung up (read by the lot's one
//! task), or a wake of the link (a packet, a pause, the timer's word that
//! the client went silent, the state letting go at a takeover or a
//! shutdown). Resuming takes the slot, takes the socket out of the poll
//! set and spawns a task that serves the connection from where it left.
//! A wake that comes while the slot is reserved and not yet filled is
//! kept, and the connection resumes as soon as it is filled.
//!
//! The lot is generic over what it parks ([`Parkable`]): the connection
//! module says what a parked connection is and how it resumes; this one
//! keeps the slots, the poll set and the wake-ups.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Wake, Waker};
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use super::metrics::Metrics;

/// What the lot parks.
pub trait Parkable: Send + 'static {
    /// The socket watched while it is parked.
    fn socket(&self) -> BorrowedFd<'_>;
    /// Serve it again, off the lot's lock (on any thread: it enters
    /// [`Lot::runtime`] itself).
    fn resume(self: Box<Self>);
}

/// The lot of a broker: its slots and its poll set.
pub struct Lot<P> {
    /// The poll set's registry; `None` when it could not be made (the
    /// broker then parks nothing).
    registry: Option<Registry>,
    slots: Mutex<Slots<P>>,
    metrics: Arc<Metrics>,
    /// Ends the lot's task when the lot is dropped.
    closed: Arc<Notify>,
    /// The runtime the lot was started on, which resumed connections are
    /// served on.
    runtime: tokio::runtime::Handle,
}

struct Slots<P> {
    slots: Vec<Slot<P>>,
    /// Free slots, by index.
    free: Vec<u32>,
}

struct Slot<P> {
    /// Bumped each time the slot is given back, so a waker of an earlier
    /// occupant wakes nobody.
    generation: u32,
    held: Held<P>,
}

enum Held<P> {
    Free,
    /// Taken by a connection on its way in; `woken` when a wake-up came
    /// before it was filled.
    Reserved {
        woken: bool,
    },
    Parked(Box<P>),
}

/// A slot taken for a connection on its way in.
#[must_use]
pub struct Reservation {
    index: u32,
    generation: u32,
}

/// The waker a parked connection's link holds in place of its task's.
struct SlotWaker<P> {
    lot: Weak<Lot<P>>,
    index: u32,
    generation: u32,
}

impl<P: Parkable> Wake for SlotWaker<P> {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(lot) = self.lot.upgrade() {
            lot.resume(self.index, Some(self.generation));
        }
    }
}

impl<P: Parkable> Lot<P> {
    /// A lot, its task spawned on the current runtime. A poll set that
    /// cannot be made is logged, and the broker parks nothing.
    pub fn start(metrics: Arc<Metrics>) -> Arc<Lot<P>> {
        let closed = Arc::new(Notify::new());
        let made = Poll::new().and_then(|poll| {
            let registry = poll.registry().try_clone()?;
            Ok((poll, registry))
        });
        let (poll, registry) = match made {
            Ok((poll, registry)) => (Some(poll), Some(registry)),
            Err(err) => {
                tracing::warn!(error = %err, "no poll set for quiet connections; every connection keeps its task");
                (None, None)
            }
        };
        let lot = Arc::new(Lot {
            registry,
            slots: Mutex::new(Slots {
                slots: Vec::new(),
                free: Vec::new(),
            }),
            metrics,
            closed: closed.clone(),
            runtime: tokio::runtime::Handle::current(),
        });
        if let Some(poll) = poll {
            tokio::spawn(run(Arc::downgrade(&lot), poll, closed));
        }
        lot
    }

    /// The runtime resumed connections are served on.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    fn slots(&self) -> MutexGuard<'_, Slots<P>> {
        // Nothing under the lock panics but an allocation failure; the
        // slots stay consistent in any case.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a connection on its way in, and the waker its link is
    /// to hold; `None` when the broker parks nothing.
    pub fn reserve(self: &Arc<Self>) -> Option<(Reservation, Waker)> {
        self.registry.as_ref()?;
        let mut slots = self.slots();
        let index = match slots.free.pop() {
            Some(index) => index,
            None => {
                let index = u32::try_from(slots.slots.len()).ok()?;
                slots.slots.push(Slot {
                    generation: 0,
                    held: Held::Free,
                });
                index
            }
        };
        let slot = &mut slots.slots[index as usize];
        slot.held = Held::Reserved { woken: false };
        let reservation = Reservation {
            index,
            generation: slot.generation,
        };
        drop(slots);
        let waker = Waker::from(Arc::new(SlotWaker {
            lot: Arc::downgrade(self),
            index,
            generation: reservation.generation,
        }));
        Some((reservation, waker))
    }

    /// Give back a slot no connection came into.
    pub fn release(&self, reservation: Reservation) {
        let mut slots = self.slots();
        free(&mut slots, reservation.index);
    }

    /// Park `parked` in its slot and watch its socket; resumed at once
    /// when it was woken on its way in, or its socket cannot be watched.
    pub fn fill(&self, reservation: Reservation, parked: Box<P>) {
        let Some(registry) = &self.registry else {
            return parked.resume();
        };
        let mut slots = self.slots();
        let slot = &mut slots.slots[reservation.index as usize];
        if !matches!(slot.held, Held::Reserved { woken: false }) {
            free(&mut slots, reservation.index);
            drop(slots);
            return parked.resume();
        }
        // Watched in the lock: a wake-up that takes it from here on finds
        // it watched, and takes it out of the set.
        let fd = parked.socket().as_raw_fd();
        let token = Token(reservation.index as usize);
        if let Err(err) = registry.register(&mut SourceFd(&fd), token, Interest::READABLE) {
            free(&mut slots, reservation.index);
            drop(slots);
            tracing::warn!(error = %err, "a quiet connection could not be parked; it keeps its task");
            return parked.resume();
        }
        slot.held = Held::Parked(parked);
        self.metrics.connections_parked.fetch_add(1, Relaxed);
    }

    /// Resume the connection in slot `index` (`generation`: only if it is
    /// still the one the waker was made for).
    fn resume(&self, index: u32, generation: Option<u32>) {
        let parked = {
            let mut slots = self.slots();
            let Some(slot) = slots.slots.get_mut(index as usize) else {
                return;
            };
            if generation.is_some_and(|g| g != slot.generation) {
                return;
            }
            match &mut slot.held {
                Held::Reserved { woken } => {
                    *woken = true;
                    return;
                }
                Held::Free => return,
                Held::Parked(_) => {}
            }
            let Held::Parked(parked) = std::mem::replace(&mut slot.held, Held::Free) else {
                return;
            };
            free(&mut slots, index);
            parked
        };
        self.metrics.connections_parked.fetch_sub(1, Relaxed);
        if let Some(registry) = &self.registry {
            let fd: RawFd = parked.socket().as_raw_fd();
            // It was watched; the set lets go of it before the runtime
            // takes it.
            let _ = registry.deregister(&mut SourceFd(&fd));
        }
        parked.resume();
    }

    /// Connections parked now.
    #[cfg(test)]
    fn parked(&self) -> usize {
        self.slots()
            .slots
            .iter()
            .filter(|s| matches!(s.held, Held::Parked(_)))
            .count()
    }
}

impl<P> std::fmt::Debug for Lot<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lot")
            .field("watching", &self.registry.is_some())
            .field("parked", &self.metrics.connections_parked.load(Relaxed))
            .finish_non_exhaustive()
    }
}

/// Give slot `index` back, its wakers made for nobody.
fn free<P>(slots: &mut Slots<P>, index: u32) {
    let slot = &mut slots.slots[index as usize];
    slot.held = Held::Free;
    slot.generation = slot.generation.wrapping_add(1);
    slots.free.push(index);
}

impl<P> Drop for Lot<P> {
    fn drop(&mut self) {
        self.closed.notify_one();
    }
}

/// The lot's task: resumes each connection whose socket the poll set
/// finds readable (or hung up), and ends once the lot is dropped.
async fn run<P: Parkable>(lot: Weak<Lot<P>>, poll: Poll, closed: Arc<Notify>) {
    // SAFETY: the poll set owns its descriptor from its making to its
    // drop, and gives that same descriptor each time it is asked; the
    // `AsyncFd` owns the poll set, so the descriptor outlives the
    // registration.
    let registered =
        unsafe { AsyncFd::register_with_interest(poll, tokio::io::Interest::READABLE) };
    let mut set = match registered {
        Ok(set) => set,
        Err(err) => {
            tracing::warn!(error = %err, "the poll set of quiet connections cannot be watched; parked connections resume only when woken");
            return;
        }
    };
    let mut events = Events::with_capacity(256);
    loop {
        let mut ready = tokio::select! {
            ready = set.readable_mut() => match ready {
                Ok(ready) => ready,
                Err(_) => return,
            },
            () = closed.notified() => return,
        };
        let Some(lot) = lot.upgrade() else {
            return;
        };
        loop {
            match ready
                .get_inner_mut()
                .poll(&mut events, Some(Duration::ZERO))
            {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(err) => {
                    tracing::warn!(error = %err, "the poll set of quiet connections failed");
                    return;
                }
            }
            if events.is_empty() {
                ready.clear_ready();
                break;
            }
            for event in events.iter() {
                // A slot given back after this event was taken from the
                // set may hold another connection by now: it resumes
                // early and parks again later, which costs it nothing.
                if let Ok(index) = u32::try_from(event.token().0) {
                    lot.resume(index, None);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::sync::atomic::AtomicUsize;

    /// A parked socket that counts its resumes.
    struct Counted {
        socket: TcpStream,
        resumed: Arc<AtomicUsize>,
        notify: Arc<Notify>,
    }

    impl Parkable for Counted {
        fn socket(&self) -> BorrowedFd<'_> {
            self.socket.as_fd()
        }

        fn resume(self: Box<Self>) {
            self.resumed.fetch_add(1, Relaxed);
            self.notify.notify_one();
        }
    }

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        (client, server)
    }

    fn lot() -> Arc<Lot<Counted>> {
        Lot::start(Arc::new(Metrics::default()))
    }

    fn counted(socket: TcpStream) -> (Box<Counted>, Arc<AtomicUsize>, Arc<Notify>) {
        let resumed = Arc::new(AtomicUsize::new(0));
        let notify = Arc::new(Notify::new());
        let parked = Box::new(Counted {
            socket,
            resumed: resumed.clone(),
            notify: notify.clone(),
        });
        (parked, resumed, notify)
    }

    #[tokio::test]
    async fn a_parked_socket_resumes_when_its_client_speaks() {
        use std::io::Write;
        let lot = lot();
        let (mut client, server) = pair();
        let (parked, resumed, notify) = counted(server);
        let (reservation, _waker) = lot.reserve().unwrap();
        lot.fill(reservation, parked);
        assert_eq!(lot.parked(), 1);
        assert_eq!(lot.metrics.connections_parked.load(Relaxed), 1);
        let resumed_now = notify.notified();
        client.write_all(b"x").unwrap();
        resumed_now.await;
        assert_eq!(resumed.load(Relaxed), 1);
        assert_eq!(lot.parked(), 0);
        assert_eq!(lot.metrics.connections_parked.load(Relaxed), 0);
    }

    #[tokio::test]
    async fn a_parked_socket_resumes_when_its_client_hangs_up() {
        let lot = lot();
        let (client, server) = pair();
        let (parked, resumed, notify) = counted(server);
        let (reservation, _waker) = lot.reserve().unwrap();
        lot.fill(reservation, parked);
        let resumed_now = notify.notified();
        drop(client);
        resumed_now.await;
        assert_eq!(resumed.load(Relaxed), 1);
    }

    #[tokio::test]
    async fn a_parked_socket_resumes_once_when_woken_and_its_waker_then_wakes_nobody() {
        let lot = lot();
        let (_client, server) = pair();
        let (parked, resumed, _) = counted(server);
        let (reservation, waker) = lot.reserve().unwrap();
        lot.fill(reservation, parked);
        waker.wake_by_ref();
        assert_eq!(resumed.load(Relaxed), 1);
        // The slot goes to another; the first's waker is stale.
        let (_client2, server2) = pair();
        let (parked2, resumed2, _) = counted(server2);
        let (reservation2, _waker2) = lot.reserve().unwrap();
        assert_eq!(reservation2.index, 0, "the slot is reused");
        lot.fill(reservation2, parked2);
        waker.wake();
        assert_eq!(resumed.load(Relaxed), 1);
        assert_eq!(resumed2.load(Relaxed), 0);
        assert_eq!(lot.parked(), 1);
    }

    /// A wake-up between the reservation and the filling is kept: the
    /// connection resumes as it is filled, and is not left parked.
    #[tokio::test]
    async fn a_wake_up_on_the_way_in_resumes_it_as_it_is_filled() {
        let lot = lot();
        let (_client, server) = pair();
        let (parked, resumed, _) = counted(server);
        let (reservation, waker) = lot.reserve().unwrap();
        waker.wake();
        assert_eq!(resumed.load(Relaxed), 0);
        lot.fill(reservation, parked);
        assert_eq!(resumed.load(Relaxed), 1);
        assert_eq!(lot.parked(), 0);
        assert_eq!(lot.metrics.connections_parked.load(Relaxed), 0);
    }

    /// Bytes that came before the socket was watched resume it: the set
    /// reports what is readable when a socket joins it.
    #[tokio::test]
    async fn bytes_that_came_before_it_parked_resume_it() {
        use std::io::Write;
        let lot = lot();
        let (mut client, server) = pair();
        client.write_all(b"x").unwrap();
        let (parked, resumed, notify) = counted(server);
        let (reservation, _waker) = lot.reserve().unwrap();
        let resumed_now = notify.notified();
        lot.fill(reservation, parked);
        resumed_now.await;
        assert_eq!(resumed.load(Relaxed), 1);
    }

    #[tokio::test]
    async fn the_lots_task_ends_with_the_lot() {
        let lot = lot();
        let closed = Arc::downgrade(&lot.closed);
        drop(lot);
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        assert!(closed.upgrade().is_none());
    }
}
