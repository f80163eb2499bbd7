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
//! cannot make afresh: 112 B) in a slot of the lot (16 B), and its
//! socket in the lot's poll set, which the kernel keeps; the waker its
//! link holds is a word naming the slot, not an allocation.
//!
//! How. The keep-alive timer tells a connection to park
//! ([`super::link::ConnectionLink::tell_park`]) once its client has been
//! quiet a while. Its task, finding nothing to do, reserves a slot,
//! hands its link a waker for that slot (in the lock in which the link
//! finds nothing queued, so a packet the state queues from then on wakes
//! the slot and is never stranded), moves what it needs into the slot and
//! ends; the socket goes into the lot's poll set. Whatever comes first
//! resumes it: the socket readable or hung up, or a wake of the link (a
//! packet, a pause, the timer's word that the client went silent, the
//! state letting go at a takeover or a shutdown). The lot's one task does
//! the resuming, so whoever wakes a link (the broker's state, fanning a
//! message out to thousands of parked subscribers) only queues the slot:
//! it takes the slot, takes the socket out of the poll set and spawns a
//! task that serves the connection from where it left. A wake that comes
//! while the slot is reserved and not yet filled is kept, and the
//! connection resumes as soon as it is filled. Should the poll set fail,
//! every parked connection is served by a task again and nothing parks.
//!
//! A connection its socket resumed takes its read order's stamp as the
//! lot sees it readable ([`super::read_order::Stamped::readable`]), in the
//! order the poll set gives; a connection with a task woken by the
//! runtime in the same moment may have taken an earlier one, so a parked
//! client's first packet can come after a packet another client sent a
//! few microseconds later (MQTT promises no order across connections).
//!
//! The lot is generic over what it parks ([`Parkable`]): the connection
//! module says what a parked connection is and how it resumes; this one
//! keeps the slots, the poll set and the wake-ups.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{RawWaker, RawWakerVTable, Waker};
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
    /// Serve it again, off the lot's lock, on the lot's task. `readable`:
    /// its socket had something (bytes, or the client hung up).
    fn resume(self: Box<Self>, readable: bool);
}

/// The lot of a broker: its slots and its poll set.
pub struct Lot<P> {
    /// The poll set's registry; `None` when it could not be made (the
    /// broker then parks nothing).
    registry: Option<Registry>,
    /// The lot's task watches the poll set: cleared when it stopped, and
    /// nothing parks from then on.
    watching: AtomicBool,
    slots: Mutex<Slots<P>>,
    doorbell: Arc<Doorbell>,
    /// The lot's number among the process's ([`DOORBELLS`]); `None` when
    /// every number is taken (the lot then parks nothing).
    number: Option<usize>,
    metrics: Arc<Metrics>,
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
    /// Bumped each time the slot is given back, so a waker (or an event of
    /// the poll set) of an earlier occupant wakes nobody.
    generation: u32,
    stage: Stage,
    /// The connection, while the slot is [`Stage::Parked`]. Beside the
    /// stage rather than in it: a slot is 16 bytes, not 24, and the lot
    /// holds one for every connection it ever held at once.
    parked: Option<Box<P>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Free,
    /// Taken by a connection on its way in.
    Reserved,
    /// Taken by a connection on its way in, and a wake-up came before it
    /// was filled.
    ReservedWoken,
    Parked,
}

/// A slot taken for a connection on its way in.
#[must_use]
pub struct Reservation {
    index: u32,
    generation: u32,
}

/// What a wake of a parked link rings: the slots woken since the lot's
/// task last looked, and the task's bell. A wake comes from whoever
/// queued the connection a packet (the broker's state among them), which
/// is not made to wait for a resume.
#[derive(Default)]
struct Doorbell {
    woken: Mutex<Vec<(u32, u32)>>,
    /// Rings the lot's task: a slot woken, or the lot dropped.
    ring: Notify,
}

impl Doorbell {
    fn woken(&self) -> MutexGuard<'_, Vec<(u32, u32)>> {
        self.woken.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The doorbells of the process's lots, by the lot's number. A parked
/// link's waker is its lot's number and its slot packed in the one word a
/// waker holds ([`SlotWake`]): parking makes no allocation for it, where a
/// waker of its own was 32 bytes a parked connection.
static DOORBELLS: Mutex<Vec<Option<Arc<Doorbell>>>> = Mutex::new(Vec::new());

fn doorbells() -> MutexGuard<'static, Vec<Option<Arc<Doorbell>>>> {
    DOORBELLS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A slot's wake, as its waker's word holds it: the lot's number, the
/// slot's index, and the low bits of its generation. On a 64-bit target
/// 16, 32 and 16 bits; on a 32-bit one 8, 20 and 4 (a slot past a million
/// is not parked there). A stale waker whose low bits come round again
/// resumes a connection that had nothing to do, which parks again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotWake {
    lot: usize,
    index: u32,
    generation: u32,
}

impl SlotWake {
    const INDEX_BITS: u32 = if usize::BITS >= 64 { 32 } else { 20 };
    const LOT_BITS: u32 = if usize::BITS >= 64 { 16 } else { 8 };
    const GENERATION_BITS: u32 = usize::BITS - Self::INDEX_BITS - Self::LOT_BITS;
    const LOTS: usize = 1 << Self::LOT_BITS;
    const GENERATION_MASK: u32 = (1 << Self::GENERATION_BITS) - 1;

    /// The wake of slot `index` of lot `lot`; `None` past what a word
    /// holds.
    fn new(lot: usize, index: u32, generation: u32) -> Option<Self> {
        (lot < Self::LOTS && u64::from(index) < 1u64 << Self::INDEX_BITS).then_some(SlotWake {
            lot,
            index,
            generation: Self::low_bits(generation),
        })
    }

    fn word(self) -> usize {
        self.index as usize
            | (self.generation as usize) << Self::INDEX_BITS
            | self.lot << (Self::INDEX_BITS + Self::GENERATION_BITS)
    }

    fn of_word(word: usize) -> Self {
        let low = |bits: u32, at: u32| (word >> at) & ((1usize << bits) - 1);
        SlotWake {
            index: low(Self::INDEX_BITS, 0) as u32,
            generation: low(Self::GENERATION_BITS, Self::INDEX_BITS) as u32,
            lot: low(Self::LOT_BITS, Self::INDEX_BITS + Self::GENERATION_BITS),
        }
    }

    /// The bits of a slot's generation a wake keeps.
    fn low_bits(generation: u32) -> u32 {
        generation & Self::GENERATION_MASK
    }

    fn waker(self) -> Waker {
        // SAFETY: the waker's data is a number, never read through: its
        // functions only unpack it, and clone and drop have nothing to
        // count. They touch nothing but the doorbells' lock, from any
        // thread, as a waker's functions must.
        unsafe {
            Waker::from_raw(RawWaker::new(
                std::ptr::without_provenance(self.word()),
                &WAKE_VTABLE,
            ))
        }
    }

    /// Queue the slot on its lot's doorbell, if the lot is still there.
    fn ring(self) {
        let doorbell = doorbells().get(self.lot).cloned().flatten();
        if let Some(doorbell) = doorbell {
            doorbell.woken().push((self.index, self.generation));
            doorbell.ring.notify_one();
        }
    }
}

static WAKE_VTABLE: RawWakerVTable = RawWakerVTable::new(
    |data| RawWaker::new(data, &WAKE_VTABLE),
    |data| SlotWake::of_word(data.addr()).ring(),
    |data| SlotWake::of_word(data.addr()).ring(),
    |_| {},
);

/// The poll set's token for a slot: its index, and its generation where a
/// token holds both.
fn token(index: u32, generation: u32) -> Token {
    match usize::BITS >= 64 {
        true => Token(((u64::from(generation) << 32) | u64::from(index)) as usize),
        false => Token(index as usize),
    }
}

/// The slot and generation (when the token holds it) of a token.
fn slot_of(token: Token) -> (u32, Option<u32>) {
    let token = token.0 as u64;
    let index = (token & u64::from(u32::MAX)) as u32;
    match usize::BITS >= 64 {
        true => (index, Some((token >> 32) as u32)),
        false => (index, None),
    }
}

impl<P: Parkable> Lot<P> {
    /// A lot, its task spawned on the current runtime. A poll set that
    /// cannot be made is logged, and the broker parks nothing.
    pub fn start(metrics: Arc<Metrics>) -> Arc<Lot<P>> {
        let doorbell = Arc::new(Doorbell::default());
        let number = {
            let mut doorbells = doorbells();
            let free = doorbells.iter().position(Option::is_none);
            match free {
                Some(number) => Some(number),
                None if doorbells.len() < SlotWake::LOTS => {
                    doorbells.push(None);
                    Some(doorbells.len() - 1)
                }
                None => None,
            }
            .inspect(|&number| doorbells[number] = Some(doorbell.clone()))
        };
        if number.is_none() {
            tracing::warn!("every lot number is taken; this lot parks nothing");
        }
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
            watching: AtomicBool::new(registry.is_some() && number.is_some()),
            registry,
            slots: Mutex::new(Slots {
                slots: Vec::new(),
                free: Vec::new(),
            }),
            doorbell: doorbell.clone(),
            number,
            metrics,
            runtime: tokio::runtime::Handle::current(),
        });
        if let Some(poll) = poll {
            tokio::spawn(run(Arc::downgrade(&lot), poll, doorbell));
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

    fn woken(&self) -> MutexGuard<'_, Vec<(u32, u32)>> {
        self.doorbell.woken()
    }

    /// A slot for a connection on its way in, and the waker its link is
    /// to hold; `None` when the broker parks nothing.
    pub fn reserve(&self) -> Option<(Reservation, Waker)> {
        let number = self.number?;
        if !self.watching.load(Acquire) {
            return None;
        }
        let mut slots = self.slots();
        let index = match slots.free.pop() {
            Some(index) => index,
            None => {
                let index = u32::try_from(slots.slots.len()).ok()?;
                slots.slots.push(Slot {
                    generation: 0,
                    stage: Stage::Free,
                    parked: None,
                });
                index
            }
        };
        let slot = &mut slots.slots[index as usize];
        let Some(wake) = SlotWake::new(number, index, slot.generation) else {
            // Past what a waker's word names (a 32-bit target's millionth
            // slot): not parked.
            free(&mut slots, index);
            return None;
        };
        slot.stage = Stage::Reserved;
        let reservation = Reservation {
            index,
            generation: slot.generation,
        };
        Some((reservation, wake.waker()))
    }

    /// Give back a slot no connection came into.
    pub fn release(&self, reservation: Reservation) {
        let mut slots = self.slots();
        free(&mut slots, reservation.index);
    }

    /// Park `parked` in its slot and watch its socket; resumed at once
    /// when it was woken on its way in, its socket cannot be watched, or
    /// the lot's task no longer watches.
    pub fn fill(&self, reservation: Reservation, parked: Box<P>) {
        let index = reservation.index;
        let mut slots = self.slots();
        // Watched in the lock: a wake-up that takes it from here on finds
        // it watched, and takes it out of the set.
        let watched = match &self.registry {
            Some(registry)
                if slots.slots[index as usize].stage == Stage::Reserved
                    && self.watching.load(Acquire) =>
            {
                let fd = parked.socket().as_raw_fd();
                let token = token(index, reservation.generation);
                registry
                    .register(&mut SourceFd(&fd), token, Interest::READABLE)
                    .inspect_err(|err| {
                        tracing::warn!(error = %err, "a quiet connection could not be parked; it keeps its task");
                    })
                    .is_ok()
            }
            _ => false,
        };
        if !watched {
            free(&mut slots, index);
            drop(slots);
            return parked.resume(false);
        }
        let slot = &mut slots.slots[index as usize];
        slot.stage = Stage::Parked;
        slot.parked = Some(parked);
        self.metrics.connections_parked.fetch_add(1, Relaxed);
    }

    /// Take the connection in slot `index` out (only if `is_meant` by the
    /// slot's generation: it is still the one that was meant), its socket
    /// out of the poll set. A slot still on its way in is marked woken
    /// instead.
    fn take(&self, index: u32, is_meant: impl FnOnce(u32) -> bool) -> Option<Box<P>> {
        let parked = {
            let mut slots = self.slots();
            let slot = slots.slots.get_mut(index as usize)?;
            if !is_meant(slot.generation) {
                return None;
            }
            match slot.stage {
                Stage::Reserved | Stage::ReservedWoken => {
                    slot.stage = Stage::ReservedWoken;
                    return None;
                }
                Stage::Free => return None,
                Stage::Parked => {}
            }
            let parked = slot.parked.take()?;
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
        Some(parked)
    }

    /// Resume every slot a link woke since the last look.
    fn resume_woken(&self) {
        let woken = std::mem::take(&mut *self.woken());
        for (index, generation) in woken {
            if let Some(parked) = self.take(index, |g| SlotWake::low_bits(g) == generation) {
                parked.resume(false);
            }
        }
    }

    /// Every parked connection, taken out.
    fn take_all(&self) -> Vec<Box<P>> {
        let occupied: Vec<(u32, u32)> = self
            .slots()
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.stage == Stage::Parked)
            .map(|(index, s)| (index as u32, s.generation))
            .collect();
        occupied
            .into_iter()
            .filter_map(|(index, generation)| self.take(index, |g| g == generation))
            .collect()
    }

    /// The lot's task can no longer watch the poll set: nothing parks from
    /// now on, and every parked connection is served by a task again.
    fn stop_watching(&self, why: &std::io::Error) {
        tracing::warn!(error = %why, "the poll set of quiet connections failed; they are served by tasks again, and nothing parks");
        self.watching.store(false, Release);
        for parked in self.take_all() {
            parked.resume(false);
        }
    }

    /// The broker stopped: whatever is still parked (the drain's timeout
    /// passed it by) is closed with its socket, and nothing parks again.
    pub fn close(&self) {
        self.watching.store(false, Release);
        drop(self.take_all());
    }

    /// Connections parked now.
    #[cfg(test)]
    fn parked(&self) -> usize {
        self.slots()
            .slots
            .iter()
            .filter(|s| s.stage == Stage::Parked)
            .count()
    }
}

impl<P> std::fmt::Debug for Lot<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lot")
            .field("watching", &self.watching.load(Relaxed))
            .field("parked", &self.metrics.connections_parked.load(Relaxed))
            .finish_non_exhaustive()
    }
}

/// Give slot `index` back, its wakers made for nobody.
fn free<P>(slots: &mut Slots<P>, index: u32) {
    let slot = &mut slots.slots[index as usize];
    slot.stage = Stage::Free;
    slot.parked = None;
    slot.generation = slot.generation.wrapping_add(1);
    slots.free.push(index);
}

impl<P> Drop for Lot<P> {
    fn drop(&mut self) {
        if let Some(number) = self.number {
            // Its number is free for the next lot: a waker still naming
            // it finds that lot's slot stale, or resumes a connection with
            // nothing to do.
            doorbells()[number] = None;
        }
        self.doorbell.ring.notify_one();
    }
}

/// The lot's task: resumes each connection whose link woke it, and each
/// whose socket the poll set finds readable (or hung up); ends once the
/// lot is dropped.
async fn run<P: Parkable>(lot: Weak<Lot<P>>, poll: Poll, doorbell: Arc<Doorbell>) {
    // SAFETY: the poll set owns its descriptor from its making to its
    // drop, and gives that same descriptor each time it is asked; the
    // `AsyncFd` owns the poll set, so the descriptor outlives the
    // registration.
    let registered =
        unsafe { AsyncFd::register_with_interest(poll, tokio::io::Interest::READABLE) };
    let mut set = match registered {
        Ok(set) => set,
        Err(err) => {
            if let Some(lot) = lot.upgrade() {
                lot.stop_watching(&std::io::Error::other(err.to_string()));
            }
            return;
        }
    };
    let mut events = Events::with_capacity(256);
    loop {
        // Listening before looking: a wake queued after the look rings it.
        let rung = doorbell.ring.notified();
        tokio::pin!(rung);
        rung.as_mut().enable();
        match lot.upgrade() {
            Some(lot) => lot.resume_woken(),
            None => return,
        }
        tokio::select! {
            ready = set.readable_mut() => {
                let Some(lot) = lot.upgrade() else {
                    return;
                };
                let mut ready = match ready {
                    Ok(ready) => ready,
                    Err(err) => return lot.stop_watching(&err),
                };
                loop {
                    match ready.get_inner_mut().poll(&mut events, Some(Duration::ZERO)) {
                        Ok(()) => {}
                        Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(err) => return lot.stop_watching(&err),
                    }
                    if events.is_empty() {
                        ready.clear_ready();
                        break;
                    }
                    for event in events.iter() {
                        let (index, generation) = slot_of(event.token());
                        let is_meant = |g| generation.is_none_or(|want| want == g);
                        if let Some(parked) = lot.take(index, is_meant) {
                            parked.resume(true);
                        }
                    }
                }
            }
            () = &mut rung => {}
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
        seen: Arc<Seen>,
    }

    #[derive(Default)]
    struct Seen {
        resumed: AtomicUsize,
        readable: AtomicUsize,
        notify: Notify,
    }

    impl Parkable for Counted {
        fn socket(&self) -> BorrowedFd<'_> {
            self.socket.as_fd()
        }

        fn resume(self: Box<Self>, readable: bool) {
            self.seen.resumed.fetch_add(1, Relaxed);
            if readable {
                self.seen.readable.fetch_add(1, Relaxed);
            }
            self.seen.notify.notify_one();
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

    fn counted(socket: TcpStream) -> (Box<Counted>, Arc<Seen>) {
        let seen = Arc::new(Seen::default());
        let parked = Box::new(Counted {
            socket,
            seen: seen.clone(),
        });
        (parked, seen)
    }

    /// Park `socket`: what it saw, and its link's waker.
    fn park(lot: &Arc<Lot<Counted>>, socket: TcpStream) -> (Arc<Seen>, Waker) {
        let (parked, seen) = counted(socket);
        let (reservation, waker) = lot.reserve().unwrap();
        lot.fill(reservation, parked);
        (seen, waker)
    }

    /// The lot keeps a slot for every connection it held at once.
    #[test]
    fn a_slot_stays_small() {
        assert!(std::mem::size_of::<Slot<[u8; 112]>>() <= 16);
    }

    #[tokio::test]
    async fn a_parked_socket_resumes_when_its_client_speaks() {
        use std::io::Write;
        let lot = lot();
        let (mut client, server) = pair();
        let (seen, _waker) = park(&lot, server);
        assert_eq!(lot.parked(), 1);
        assert_eq!(lot.metrics.connections_parked.load(Relaxed), 1);
        client.write_all(b"x").unwrap();
        seen.notify.notified().await;
        assert_eq!(seen.resumed.load(Relaxed), 1);
        assert_eq!(seen.readable.load(Relaxed), 1);
        assert_eq!(lot.parked(), 0);
        assert_eq!(lot.metrics.connections_parked.load(Relaxed), 0);
    }

    #[tokio::test]
    async fn a_parked_socket_resumes_when_its_client_hangs_up() {
        let lot = lot();
        let (client, server) = pair();
        let (seen, _waker) = park(&lot, server);
        drop(client);
        seen.notify.notified().await;
        assert_eq!(seen.readable.load(Relaxed), 1);
    }

    /// A wake of its link resumes it on the lot's task, once; its waker
    /// wakes nobody once the slot holds another.
    #[tokio::test]
    async fn a_parked_socket_resumes_once_when_woken_and_its_waker_then_wakes_nobody() {
        let lot = lot();
        let (_client, server) = pair();
        let (seen, waker) = park(&lot, server);
        waker.wake_by_ref();
        seen.notify.notified().await;
        assert_eq!(seen.resumed.load(Relaxed), 1);
        assert_eq!(seen.readable.load(Relaxed), 0);
        // The slot goes to another; the first's waker is stale.
        let (_client2, server2) = pair();
        let (parked2, seen2) = counted(server2);
        let (reservation2, _waker2) = lot.reserve().unwrap();
        assert_eq!(reservation2.index, 0, "the slot is reused");
        lot.fill(reservation2, parked2);
        waker.wake();
        // Another slot's wake, after the stale one: once it is seen, the
        // stale one was looked at too.
        let (_client3, server3) = pair();
        let (seen3, waker3) = park(&lot, server3);
        waker3.wake();
        seen3.notify.notified().await;
        assert_eq!(seen.resumed.load(Relaxed), 1);
        assert_eq!(seen2.resumed.load(Relaxed), 0);
        assert_eq!(lot.parked(), 1);
    }

    /// A wake-up between the reservation and the filling is kept: the
    /// connection resumes as it is filled, and is not left parked.
    #[tokio::test]
    async fn a_wake_up_on_the_way_in_resumes_it_as_it_is_filled() {
        let lot = lot();
        let (_client, server) = pair();
        let (parked, seen) = counted(server);
        let (reservation, waker) = lot.reserve().unwrap();
        waker.wake();
        // The lot's task marks the reserved slot woken.
        while lot.woken().len() == 1 {
            tokio::task::yield_now().await;
        }
        assert_eq!(seen.resumed.load(Relaxed), 0);
        lot.fill(reservation, parked);
        assert_eq!(seen.resumed.load(Relaxed), 1);
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
        let (seen, _waker) = park(&lot, server);
        seen.notify.notified().await;
        assert_eq!(seen.readable.load(Relaxed), 1);
    }

    /// A lot that no longer watches resumes what it held and parks
    /// nothing more; one closed drops what it held.
    #[tokio::test]
    async fn a_lot_that_stops_watching_parks_nothing_and_gives_back_what_it_held() {
        let lot = lot();
        let (_client, server) = pair();
        let (seen, _waker) = park(&lot, server);
        lot.stop_watching(&std::io::Error::other("gone"));
        assert_eq!(seen.resumed.load(Relaxed), 1);
        assert!(lot.reserve().is_none());
        assert_eq!(lot.metrics.connections_parked.load(Relaxed), 0);

        let lot = self::lot();
        let (_client, server) = pair();
        let (seen, _waker) = park(&lot, server);
        lot.close();
        assert_eq!(seen.resumed.load(Relaxed), 0);
        assert_eq!(Arc::strong_count(&seen), 1, "what was parked is dropped");
        assert!(lot.reserve().is_none());
    }

    #[test]
    fn a_token_names_its_slot_and_generation() {
        let (index, generation) = slot_of(token(7, 3));
        assert_eq!(index, 7);
        if usize::BITS >= 64 {
            assert_eq!(generation, Some(3));
        }
        assert_eq!(slot_of(token(u32::MAX, u32::MAX)).0, u32::MAX);
    }

    #[test]
    fn a_wakes_word_names_its_lot_slot_and_generation() {
        let last_index = u32::try_from((1u64 << SlotWake::INDEX_BITS) - 1).unwrap();
        for (lot, index, generation) in [
            (0, 0, 0),
            (3, 7, 5),
            (SlotWake::LOTS - 1, last_index, u32::MAX),
        ] {
            let wake = SlotWake::new(lot, index, generation).unwrap();
            assert_eq!(SlotWake::of_word(wake.word()), wake);
            assert_eq!((wake.lot, wake.index), (lot, index));
            assert_eq!(wake.generation, SlotWake::low_bits(generation));
            assert_ne!(
                wake.generation,
                SlotWake::low_bits(generation.wrapping_add(1))
            );
        }
        assert!(SlotWake::new(SlotWake::LOTS, 0, 0).is_none());
        if usize::BITS < 64 {
            assert!(SlotWake::new(0, last_index + 1, 0).is_none());
        }
    }

    /// A dropped lot gives back its number; a waker it handed out then
    /// wakes nothing of it.
    #[tokio::test]
    async fn a_dropped_lots_wakers_wake_nothing() {
        let lot = lot();
        let number = lot.number.unwrap();
        let doorbell = lot.doorbell.clone();
        let (_client, server) = pair();
        let (seen, waker) = park(&lot, server);
        lot.close();
        drop(lot);
        waker.wake_by_ref();
        assert!(doorbell.woken().is_empty());
        assert_eq!(seen.resumed.load(Relaxed), 0);
        // Another test's lot may have taken the number since.
        assert!(doorbells()[number]
            .as_ref()
            .is_none_or(|d| !Arc::ptr_eq(d, &doorbell)));
    }

    #[tokio::test]
    async fn the_lots_task_ends_with_the_lot() {
        let lot = lot();
        let ring = Arc::downgrade(&lot.doorbell);
        drop(lot);
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        assert!(ring.upgrade().is_none());
    }
}
